"""``DatasetMapper``: one record -> one model input dict.

Output (the model's input format)::

    {"image": Tensor[3, H, W] in image_format order, resized (uint8; float32 with
              INPUT.RESIZE_MODE "torchvision", which keeps the interpolated values),
     "height": int, "width": int,          # the ORIGINAL size (eval outputs are rescaled to it)
     "file_name": str, "image_id": int,
     "instances": Instances((H, W), gt_boxes, gt_classes[, gt_masks][, gt_keypoints])}   # training only

Crowd annotations are not training targets and are dropped; so are instances whose box is empty
after clipping to the image (degenerate boxes in the json, boxes outside the image, instances
left outside a random crop).
"""
import logging
from contextlib import contextmanager
from typing import List, Optional, Sequence

import numpy as np
import torch

from detcore.config.choices import FLIP_DIRECTIONS, IMAGE_FORMATS, MASK_FORMATS

from . import detection_utils as utils
from .transforms import (
    Augmentation,
    FixedSizeCrop,
    RandomBrightness,
    RandomContrast,
    RandomCrop,
    RandomFlip,
    RandomLighting,
    RandomSaturation,
    ResizeScale,
    ResizeShortestEdge,
    apply_augmentations,
)

__all__ = ["DatasetMapper", "build_augmentation"]

logger = logging.getLogger(__name__)


def build_augmentation(cfg, is_train: bool) -> List[Augmentation]:
    """The augmentations of the config, in order.

    Training: the optional crop (INPUT.CROP), the resize (multi-scale INPUT.MIN_SIZE_TRAIN, or
    large-scale jitter with INPUT.LARGE_SCALE_JITTER), the flip of INPUT.RANDOM_FLIP and the
    colour jitter of INPUT.COLOR_JITTER. With the defaults of the new keys this is exactly the
    resize and flip of before, drawing the same random numbers.
    Test: the resize to INPUT.MIN_SIZE_TEST; none with TEST.AUG.ENABLED, whose wrapper resizes
    every scale itself from the original image. Every shortest-edge resize is the one of
    INPUT.RESIZE_MODE.
    """
    if not is_train:
        if cfg.TEST.AUG.ENABLED:
            return []
        return [ResizeShortestEdge(cfg.INPUT.MIN_SIZE_TEST, cfg.INPUT.MAX_SIZE_TEST, "choice", cfg.INPUT.RESIZE_MODE)]
    augs: List[Augmentation] = []
    if cfg.INPUT.CROP.ENABLED:
        with _blame("INPUT.CROP (TYPE, SIZE)"):
            augs.append(RandomCrop(cfg.INPUT.CROP.TYPE, cfg.INPUT.CROP.SIZE))
    flip = cfg.INPUT.RANDOM_FLIP
    if flip not in FLIP_DIRECTIONS:
        raise ValueError(f"INPUT.RANDOM_FLIP must be one of {list(FLIP_DIRECTIONS)}, got {flip!r}")
    flips = [RandomFlip(0.5, horizontal=flip == "horizontal", vertical=flip == "vertical")] if flip != "none" else []
    lsj = cfg.INPUT.LARGE_SCALE_JITTER
    if lsj.ENABLED:
        if cfg.INPUT.RESIZE_MODE != "opencv":
            raise ValueError(
                "INPUT.LARGE_SCALE_JITTER resizes with OpenCV: INPUT.RESIZE_MODE must be 'opencv' with it, "
                f"got {cfg.INPUT.RESIZE_MODE!r}"
            )
        if len(lsj.OUTPUT_SIZE) != 2 or len(lsj.SCALE_RANGE) != 2:
            raise ValueError(
                "INPUT.LARGE_SCALE_JITTER: OUTPUT_SIZE must be (height, width) and SCALE_RANGE (min, max), got "
                f"{tuple(lsj.OUTPUT_SIZE)} and {tuple(lsj.SCALE_RANGE)}"
            )
        out_h, out_w = lsj.OUTPUT_SIZE
        # Flipped first, so the padding stays at the bottom-right, where the model pads too.
        augs += flips
        with _blame("INPUT.LARGE_SCALE_JITTER (OUTPUT_SIZE, SCALE_RANGE)"):
            augs.append(ResizeScale(lsj.SCALE_RANGE[0], lsj.SCALE_RANGE[1], out_h, out_w))
            augs.append(FixedSizeCrop((out_h, out_w), pad_value=tuple(cfg.MODEL.PIXEL_MEAN)))
    else:
        augs.append(
            ResizeShortestEdge(
                cfg.INPUT.MIN_SIZE_TRAIN, cfg.INPUT.MAX_SIZE_TRAIN, cfg.INPUT.MIN_SIZE_TRAIN_SAMPLING, cfg.INPUT.RESIZE_MODE
            )
        )
        augs += flips
    jitter = cfg.INPUT.COLOR_JITTER
    fmt = cfg.INPUT.FORMAT
    if jitter.BRIGHTNESS > 0:
        augs.append(RandomBrightness(jitter.BRIGHTNESS, fmt))
    if jitter.CONTRAST > 0:
        augs.append(RandomContrast(jitter.CONTRAST, fmt))
    if jitter.SATURATION > 0:
        augs.append(RandomSaturation(jitter.SATURATION, fmt))
    if jitter.LIGHTING > 0:
        augs.append(RandomLighting(jitter.LIGHTING, fmt))
    return augs


@contextmanager
def _blame(keys: str):
    """An augmentation's refusal of its arguments, re-raised naming the config keys they came from."""
    try:
        yield
    except ValueError as e:
        raise ValueError(f"{keys}: {e}") from e


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
        recompute_boxes: bool = False,
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
        # After a crop, the clipped box of an instance can be far larger than what is left of it
        # (a triangle's corner cut off): its box is then taken from its clipped mask.
        if recompute_boxes and not use_instance_mask:
            raise ValueError("DatasetMapper: recompute_boxes needs the instance masks (use_instance_mask=True)")
        self.recompute_boxes = bool(recompute_boxes)
        logger.info("Augmentations of the %s data: %s", "training" if self.is_train else "test", self.augmentations)

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
            "recompute_boxes": bool(
                is_train and cfg.MODEL.MASK_ON and (cfg.INPUT.CROP.ENABLED or cfg.INPUT.LARGE_SCALE_JITTER.ENABLED)
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
        if self.recompute_boxes:
            instances.gt_boxes = instances.gt_masks.get_bounding_boxes()
        out["instances"] = utils.filter_empty_instances(instances)
        return out

    def __repr__(self):
        return (
            f"DatasetMapper(is_train={self.is_train}, augmentations={self.augmentations}, "
            f"image_format='{self.image_format}', use_instance_mask={self.use_instance_mask}, "
            f"instance_mask_format='{self.instance_mask_format}', use_keypoint={self.use_keypoint}, "
            f"recompute_boxes={self.recompute_boxes})"
        )
