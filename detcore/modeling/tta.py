"""Test-time augmentation (TTA) of a GeneralizedRCNN: several scales and flips of each image.

For every image: each short side of ``min_sizes`` (long side capped at ``max_size``), and with
``flip`` each of those mirrored too, is run through the body, the RPN and the box branch; the
detections are mapped back to the original image (each augmentation's ``TransformList``,
inverted: the same geometry the data pipeline uses) and merged by per-class NMS, optionally
followed by box voting. With a mask head, the mask branch then runs once more per augmentation
on the *merged* boxes (mapped into that augmentation's frame, on the features already computed)
and the ``M x M`` mask probabilities are averaged (un-flipped first) before pasting, as
detectron2's GeneralizedRCNNWithTTA does.

What is merged are the detections of each augmentation (after its own NMS and top-k), as in
detectron2; maskrcnn-benchmark merges the candidates before NMS. Box voting (Detectron's
TEST.BBOX_VOTE, Gidaris & Komodakis 2015) replaces each kept box by the score-weighted mean of
all same-class detections that overlap it by at least ``box_voting_iou``; scores are kept.

Each scale is resized as the test loader resizes (``resize_mode``: INPUT.RESIZE_MODE), so a preset
that reproduces another library's preprocessing keeps doing so under TTA. With the model's
``legacy_plus_one`` (MODEL.BOX_LEGACY_PLUS_ONE) boxes are mapped between frames, clipped and
pasted on their inclusive corners, as maskrcnn-benchmark's BoxList.resize does.

The features of every augmentation are kept until the mask pass (no second pass through the
body, which detectron2 makes): memory grows with the number of augmentations, as it does for
detectron2's single batch of them.
"""
from contextlib import contextmanager
from typing import Dict, List, Sequence, Tuple

import numpy as np
import torch
from torch import Tensor, nn

from detcore.config.choices import RESIZE_MODES, TTA_MERGE_MODES
from detcore.data.transforms import HFlipTransform, NoOpTransform, ResizeShortestEdge, ResizeTransform, Transform, TransformList
from detcore.structures import Boxes, Instances, from_legacy_plus_one, pairwise_iou, to_legacy_plus_one
from detcore.layers.autocast import full_precision

from .postprocessing import detector_postprocess
from .roi_heads.fast_rcnn import fast_rcnn_inference_single_image

__all__ = ["GeneralizedRCNNWithTTA", "merge_detections", "box_voting"]


def box_voting(
    kept_boxes: Tensor, kept_classes: Tensor, boxes: Tensor, scores: Tensor, classes: Tensor, iou_thresh: float
) -> Tensor:
    """``[K, 4]``: each kept box replaced by the mean of ``boxes`` of its class with IoU >=
    ``iou_thresh`` to it, weighted by ``scores``. A kept box that is itself among ``boxes`` (with
    a positive score) always votes for itself, so every kept box has a voter."""
    if len(kept_boxes) == 0:
        return kept_boxes
    iou = pairwise_iou(kept_boxes, boxes)  # [K, N]
    voters = (iou >= iou_thresh) & (kept_classes[:, None] == classes[None, :])
    weights = voters.to(boxes.dtype) * scores[None, :]
    total = weights.sum(dim=1, keepdim=True)
    # A matmul: float32 even under bfloat16 autocast (TEST.PRECISION), whose rounding moves
    # corners by up to 4 px at 1000 px.
    with full_precision(boxes.device):
        voted = (weights @ boxes) / total.clamp(min=torch.finfo(boxes.dtype).tiny)
    return torch.where(total > 0, voted, kept_boxes)


def merge_detections(
    boxes: Tensor,
    scores: Tensor,
    classes: Tensor,
    image_size: Tuple[int, int],
    num_classes: int,
    nms_thresh: float,
    detections_per_image: int,
    legacy_plus_one: bool = False,
) -> Instances:
    """Per-class NMS over detections pooled from several augmentations (all in the frame of
    ``image_size``, boxes clipped to it), best ``detections_per_image`` kept, by decreasing score.

    The pooled detections go through the box branch's own inference (one-hot class scores,
    class-agnostic boxes), so the NMS and the top-k are exactly those of plain inference."""
    one_hot = torch.zeros((len(scores), num_classes + 1), dtype=scores.dtype, device=scores.device)
    one_hot[torch.arange(len(scores), device=scores.device), classes] = scores
    # Threshold 0: every pooled detection already passed the model's score threshold (scores > it).
    merged, _ = fast_rcnn_inference_single_image(
        boxes, one_hot, image_size, 0.0, nms_thresh, detections_per_image, legacy_plus_one=legacy_plus_one
    )
    return merged


@contextmanager
def _mask_branch_off(roi_heads: nn.Module):
    """The ROI heads without their mask branch inside the block (the first pass only needs boxes)."""
    mask_on = getattr(roi_heads, "mask_on", False)
    roi_heads.mask_on = False
    try:
        yield
    finally:
        roi_heads.mask_on = mask_on


def _map_boxes(boxes: Tensor, transform: Transform, legacy_plus_one: bool = False) -> Tensor:
    """``[N, 4]`` boxes moved by ``transform`` (float64 numpy geometry), back on their device;
    with ``legacy_plus_one`` their inclusive corners are moved (a flip maps both the same way)."""
    device, dtype = boxes.device, boxes.dtype
    boxes = boxes.detach().cpu().double()
    if legacy_plus_one:
        boxes = to_legacy_plus_one(boxes)
    mapped = torch.from_numpy(transform.apply_box(boxes.numpy()))
    if legacy_plus_one:
        mapped = from_legacy_plus_one(mapped)
    return mapped.to(device=device, dtype=dtype)


class GeneralizedRCNNWithTTA(nn.Module):
    """Wraps a GeneralizedRCNN (in eval mode) with test-time augmentation; see the module docstring.

    Input: the model's list of dicts; ``"image"`` is best the original image (the test loader
    gives it unresized when TEST.AUG.ENABLED). An image already resized from ``height x width``
    is accepted too: the detections still come back in ``height x width``.
    Output: ``[{"instances": Instances}]`` in each image's ``height x width``, as the model's.

    Args:
        model: the detector; it needs ``preprocess_image``, ``backbone``, ``proposal_generator``
            and ``roi_heads`` (with ``num_classes``, ``mask_on``, ``forward_with_given_boxes``),
            ``mask_threshold`` and ``paste_mode`` -- as GeneralizedRCNN has.
        min_sizes: short sides to run; 0 runs the image at its given size.
        max_size: the long side cap of every scale.
        flip: also run each scale flipped horizontally.
        nms_thresh, detections_per_image: the merge's per-class NMS IoU and top-k.
        merge: "nms" or "box_voting".
        box_voting_iou: IoU at or above which a detection votes for a kept box.
        resize_mode: how each scale is resized (one of RESIZE_MODES, see ResizeTransform).
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        min_sizes: Sequence[int],
        max_size: int,
        flip: bool = True,
        nms_thresh: float = 0.5,
        detections_per_image: int = 100,
        merge: str = "nms",
        box_voting_iou: float = 0.8,
        resize_mode: str = "opencv",
    ):
        super().__init__()
        missing = [a for a in ("preprocess_image", "backbone", "proposal_generator", "roi_heads") if not hasattr(model, a)]
        if missing:
            raise TypeError(
                f"GeneralizedRCNNWithTTA (TEST.AUG.ENABLED): the model must be a two-stage detector like GeneralizedRCNN; "
                f"{type(model).__name__} has no {missing}"
            )
        if getattr(model.roi_heads, "keypoint_on", False):
            # Averaging keypoints over flips needs the dataset's left/right pairs; not done yet.
            raise ValueError(
                "GeneralizedRCNNWithTTA: test-time augmentation of keypoints is not supported; set "
                "TEST.AUG.ENABLED False or MODEL.KEYPOINT_ON False"
            )
        min_sizes = (min_sizes,) if isinstance(min_sizes, (int, np.integer)) else tuple(int(s) for s in min_sizes)
        if not min_sizes or any(s < 0 for s in min_sizes):
            raise ValueError(f"GeneralizedRCNNWithTTA: min_sizes must be one or more sizes >= 0, got {min_sizes!r}")
        if int(max_size) <= 0:
            raise ValueError(f"GeneralizedRCNNWithTTA: max_size must be positive, got {max_size}")
        if merge not in TTA_MERGE_MODES:
            raise ValueError(f"GeneralizedRCNNWithTTA: merge must be one of {list(TTA_MERGE_MODES)}, got {merge!r}")
        if not 0.0 <= box_voting_iou <= 1.0:
            raise ValueError(f"GeneralizedRCNNWithTTA: box_voting_iou must lie in [0, 1], got {box_voting_iou}")
        if resize_mode not in RESIZE_MODES:
            raise ValueError(f"GeneralizedRCNNWithTTA: resize_mode must be one of {list(RESIZE_MODES)}, got {resize_mode!r}")
        self.model = model
        self.resize_mode = resize_mode
        self.legacy_plus_one = bool(getattr(model, "legacy_plus_one", False))
        self.min_sizes, self.max_size, self.flip = min_sizes, int(max_size), bool(flip)
        self.nms_thresh, self.detections_per_image = float(nms_thresh), int(detections_per_image)
        self.merge, self.box_voting_iou = merge, float(box_voting_iou)
        self.train(model.training)  # a fresh module is in training mode; follow the model's

    @classmethod
    def from_config(cls, cfg, model: nn.Module):
        aug = cfg.TEST.AUG
        return {
            "model": model,
            "min_sizes": tuple(aug.MIN_SIZES),
            "max_size": aug.MAX_SIZE,
            "flip": aug.FLIP,
            "nms_thresh": cfg.MODEL.ROI_HEADS.NMS_THRESH_TEST,
            "detections_per_image": cfg.TEST.DETECTIONS_PER_IMAGE,
            "merge": aug.MERGE,
            "box_voting_iou": aug.BOX_VOTING_IOU,
            "resize_mode": cfg.INPUT.RESIZE_MODE,
        }

    def augment(self, image: np.ndarray, orig_size: Tuple[int, int]) -> List[Tuple[np.ndarray, TransformList]]:
        """The augmented copies of an ``[H, W, C]`` image, each with the transform that maps the
        original ``orig_size`` frame onto it."""
        h, w = image.shape[:2]
        orig_h, orig_w = orig_size
        given = NoOpTransform() if (h, w) == (orig_h, orig_w) else ResizeTransform(orig_h, orig_w, h, w)
        out = []
        for size in self.min_sizes:
            resize = ResizeShortestEdge.test_transform(h, w, size, self.max_size, self.resize_mode)
            resized = resize.apply_image(image)
            out.append((resized, TransformList([given, resize])))
            if self.flip:
                flip = HFlipTransform(resized.shape[1])
                out.append((flip.apply_image(resized), TransformList([given, resize, flip])))
        return out

    def forward(self, batched_inputs: List[Dict]) -> List[Dict]:
        if self.training:
            raise RuntimeError("GeneralizedRCNNWithTTA is for inference: call .eval() first")
        with torch.no_grad():
            return [self._inference_one(i, x) for i, x in enumerate(batched_inputs)]

    def _inference_one(self, index: int, x: Dict) -> Dict:
        image = x.get("image")
        if not isinstance(image, torch.Tensor) or image.dim() != 3:
            shape = tuple(image.shape) if isinstance(image, torch.Tensor) else type(image).__name__
            raise ValueError(f"GeneralizedRCNNWithTTA: batched_inputs[{index}]['image'] must be a Tensor[C, H, W], got {shape}")
        h, w = image.shape[-2:]
        orig_size = (int(x.get("height", h)), int(x.get("width", w)))
        model, roi_heads = self.model, self.model.roi_heads
        augmented = self.augment(image.permute(1, 2, 0).cpu().numpy(), orig_size)
        mask_on = bool(getattr(roi_heads, "mask_on", False))

        boxes, scores, classes, kept_features = [], [], [], []
        with _mask_branch_off(roi_heads):
            for aug_image, transform in augmented:
                tensor = torch.from_numpy(np.ascontiguousarray(aug_image.transpose(2, 0, 1)))
                images = model.preprocess_image([{"image": tensor}])
                features = model.backbone(images.tensor)
                proposals, _ = model.proposal_generator(images, features, None)
                detections = roi_heads(images, features, proposals, None)[0][0]
                boxes.append(_map_boxes(detections.pred_boxes.tensor, transform.inverse(), self.legacy_plus_one))
                scores.append(detections.scores)
                classes.append(detections.pred_classes)
                if mask_on:
                    kept_features.append((features, images.image_sizes[0]))

        boxes, scores, classes = torch.cat(boxes), torch.cat(scores), torch.cat(classes)
        merged = merge_detections(
            boxes,
            scores,
            classes,
            orig_size,
            roi_heads.num_classes,
            self.nms_thresh,
            self.detections_per_image,
            self.legacy_plus_one,
        )
        if self.merge == "box_voting":
            merged.pred_boxes = Boxes(
                box_voting(merged.pred_boxes.tensor, merged.pred_classes, boxes, scores, classes, self.box_voting_iou)
            )
        if mask_on:
            merged.pred_masks = self._average_masks(merged, augmented, kept_features)
        return {
            "instances": detector_postprocess(
                merged, *orig_size, model.mask_threshold, model.paste_mode, self.legacy_plus_one
            )
        }

    def _average_masks(self, merged: Instances, augmented, kept_features) -> Tensor:
        """``[N, 1, M, M]``: the mask branch run on the merged boxes in every augmentation's frame,
        flipped back where the augmentation flipped, averaged."""
        roi_heads = self.model.roi_heads
        probs = []
        for (_, transform), (features, image_size) in zip(augmented, kept_features):
            instances = Instances(tuple(image_size))
            instances.pred_boxes = Boxes(_map_boxes(merged.pred_boxes.tensor, transform, self.legacy_plus_one))
            instances.pred_classes = merged.pred_classes
            masks = roi_heads.forward_with_given_boxes(features, [instances])[0].pred_masks
            # Mask cell j of a box spans the same part of the object as cell M - 1 - j of its mirror.
            flipped = any(isinstance(t, HFlipTransform) for t in transform.transforms)
            probs.append(masks.flip(-1) if flipped else masks)
        return torch.stack(probs).mean(dim=0)
