"""``DatasetMapper``: one record -> one model input dict.

Output (the model's input format)::

    {"image": uint8 Tensor[3, H, W] in image_format order, resized,
     "height": int, "width": int,          # the ORIGINAL size (eval outputs are rescaled to it)
     "file_name": str, "image_id": int,
     "instances": Instances((H, W), gt_boxes, gt_classes[, gt_masks][, gt_keypoints])}   # training only

Crowd annotations are not training targets and are dropped; so are instances whose box is empty
after clipping to the image (degenerate boxes in the json, boxes outside the image).
"""
from typing import List, Optional, Sequence

import numpy as np
import torch

from detcore.config.choices import FLIP_DIRECTIONS, IMAGE_FORMATS, MASK_FORMATS

from . import detection_utils as utils
from .transforms import Augmentation, RandomFlip, ResizeShortestEdge, apply_augmentations

__all__ = ["DatasetMapper", "build_augmentation"]


def build_augmentation(cfg, is_train: bool) -> List[Augmentation]:
    """Resize (multi-scale in training) and, in training, the flip of ``INPUT.RANDOM_FLIP``."""
    if is_train:
        augs: List[Augmentation] = [
            ResizeShortestEdge(cfg.INPUT.MIN_SIZE_TRAIN, cfg.INPUT.MAX_SIZE_TRAIN, cfg.INPUT.MIN_SIZE_TRAIN_SAMPLING)
        ]
        flip = cfg.INPUT.RANDOM_FLIP
        if flip not in FLIP_DIRECTIONS:
            raise ValueError(f"INPUT.RANDOM_FLIP must be one of {list(FLIP_DIRECTIONS)}, got {flip!r}")
        if flip != "none":
            augs.append(RandomFlip(0.5, horizontal=flip == "horizontal", vertical=flip == "vertical"))
        return augs
    return [ResizeShortestEdge(cfg.INPUT.MIN_SIZE_TEST, cfg.INPUT.MAX_SIZE_TEST, "choice")]


class DatasetMapper:
    """Reads the image, applies the augmentations to it and to the annotations, and packs the
    model input dict (see the module docstring). Callable; stateless apart from its settings."""

    def __init__(
        self,
        is_train: bool,
        augmentations: Sequence[Augmentation],
        image_format: str = "BGR",
        use_instance_mask: bool = False,
        instance_mask_format: str = "polygon",
        use_keypoint: bool = False,
        keypoint_flip_indices: Optional[Sequence[int]] = None,
    ):
        if hasattr(is_train, "INPUT"):  # DatasetMapper(cfg, ...), detectron2's spelling
            raise TypeError(
                "DatasetMapper: to build one from a config, use "
                "detcore.utils.registry.build_from_config(DatasetMapper, cfg, is_train)"
            )
        if image_format not in IMAGE_FORMATS:
            raise ValueError(f"DatasetMapper: image_format must be one of {list(IMAGE_FORMATS)}, got {image_format!r}")
        if instance_mask_format not in MASK_FORMATS:
            raise ValueError(
                f"DatasetMapper: instance_mask_format must be one of {list(MASK_FORMATS)}, got {instance_mask_format!r}"
            )
        self.is_train = bool(is_train)
        self.augmentations = list(augmentations)
        self.image_format = image_format
        self.use_instance_mask = bool(use_instance_mask)
        self.instance_mask_format = instance_mask_format
        self.use_keypoint = bool(use_keypoint)
        self.keypoint_flip_indices = None if keypoint_flip_indices is None else list(keypoint_flip_indices)

    @classmethod
    def from_config(cls, cfg, is_train: bool = True):
        use_keypoint = bool(cfg.MODEL.KEYPOINT_ON) and is_train
        return {
            "is_train": is_train,
            "augmentations": build_augmentation(cfg, is_train),
            "image_format": cfg.INPUT.FORMAT,
            "use_instance_mask": cfg.MODEL.MASK_ON,
            "instance_mask_format": cfg.INPUT.MASK_FORMAT,
            "use_keypoint": use_keypoint,
            # Left/right pairs of the training datasets' metadata, for flips.
            "keypoint_flip_indices": (
                utils.keypoint_flip_indices(cfg.DATASETS.TRAIN, cfg.MODEL.ROI_KEYPOINT_HEAD.NUM_KEYPOINTS)
                if use_keypoint
                else None
            ),
        }

    def __call__(self, record: dict) -> dict:
        image = utils.read_image(record["file_name"], self.image_format)
        utils.check_image_size(record, image)
        orig_h, orig_w = image.shape[:2]
        image, transforms = apply_augmentations(self.augmentations, image)
        h, w = image.shape[:2]
        out = {
            "file_name": record["file_name"],
            "image_id": record.get("image_id"),
            "height": int(record.get("height", orig_h)),
            "width": int(record.get("width", orig_w)),
            # HWC -> CHW; the copy makes it contiguous and owned (no negative strides after flips).
            "image": torch.from_numpy(np.ascontiguousarray(image.transpose(2, 0, 1))),
        }
        if not self.is_train:
            return out
        annos = []
        for anno in record.get("annotations", []):
            if anno.get("iscrowd", 0):
                continue
            if not self.use_instance_mask and "segmentation" in anno:
                anno = {k: v for k, v in anno.items() if k != "segmentation"}
            if not self.use_keypoint and "keypoints" in anno:
                anno = {k: v for k, v in anno.items() if k != "keypoints"}
            try:
                annos.append(
                    utils.transform_instance_annotations(anno, transforms, (h, w), self.keypoint_flip_indices)
                )
            except (ValueError, TypeError, KeyError, IndexError) as e:
                raise ValueError(f"{record['file_name']}, annotation {anno.get('id', '?')}: malformed ({e!r})") from e
        try:
            instances = utils.annotations_to_instances(
                annos,
                (h, w),
                self.instance_mask_format,
                with_masks=self.use_instance_mask,
                with_keypoints=self.use_keypoint,
                num_keypoints=len(self.keypoint_flip_indices or []),
            )
        except ValueError as e:
            raise ValueError(f"{record['file_name']}: {e}") from e
        out["instances"] = utils.filter_empty_instances(instances)
        return out

    def __repr__(self):
        return (
            f"DatasetMapper(is_train={self.is_train}, augmentations={self.augmentations}, "
            f"image_format='{self.image_format}', use_instance_mask={self.use_instance_mask}, "
            f"instance_mask_format='{self.instance_mask_format}', use_keypoint={self.use_keypoint})"
        )
