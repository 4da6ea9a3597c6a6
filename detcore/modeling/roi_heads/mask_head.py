"""The Mask R-CNN mask head: a small FCN on each ROI that predicts an M×M mask per class.

Training: each foreground ROI's mask for its GT class is compared (per-pixel binary cross entropy)
with the GT mask cropped to the ROI and resized to M×M. Inference: the predicted class's mask
goes through a sigmoid into `pred_masks` [N, 1, M, M]; pasting into the image comes later.
"""
from typing import Dict, List, Sequence, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from detcore.layers import Conv2d, ShapeSpec, c2_msra_fill, get_norm, roi_align, trusted_inputs
from detcore.structures import BitMasks, Instances, PolygonMasks
from detcore.utils.registry import Registry
from detcore.config.choices import MASK_TARGET_MODES

__all__ = [
    "ROI_MASK_HEAD_REGISTRY",
    "MaskRCNNConvUpsampleHead",
    "build_mask_head",
    "mask_rcnn_loss",
    "mask_rcnn_inference",
]

# Mask heads: `from_config(cfg, input_shape)` returns the constructor arguments (the one rule of
# detcore.utils.registry). forward(x, instances) returns {"loss_mask": ...} in training and the
# instances with `pred_masks` in eval.
ROI_MASK_HEAD_REGISTRY = Registry("ROI_MASK_HEAD", "MODEL.ROI_MASK_HEAD.NAME")


_TARGET_MODES = MASK_TARGET_MODES
# ROIs whose full-image float bitmaps are made at once in "torchvision" target mode.
_TORCHVISION_TARGET_CHUNK = 16


def _torchvision_mask_targets(inst: Instances, mask_size: int) -> Tensor:
    """torchvision's targets: the GT bitmap pooled over the ROI by ROIAlign (aligned=False,
    adaptive sampling), left soft (values in [0, 1], not thresholded)."""
    gt_masks = inst.gt_masks
    if isinstance(gt_masks, PolygonMasks):
        gt_masks = BitMasks.from_polygons(gt_masks, *inst.image_size)
    if not isinstance(gt_masks, BitMasks):
        raise TypeError(f"mask_rcnn_loss: gt_masks must be PolygonMasks or BitMasks, got {type(gt_masks).__name__}")
    boxes = inst.proposal_boxes.tensor.to(torch.float32)
    out = []
    # Chunked: a float copy of every ROI's full-image bitmap at once can take gigabytes.
    for start in range(0, len(inst), _TORCHVISION_TARGET_CHUNK):
        bitmaps = gt_masks.tensor[start : start + _TORCHVISION_TARGET_CHUNK]
        bitmaps = bitmaps.to(device=boxes.device, dtype=torch.float32)[:, None]
        chunk = boxes[start : start + _TORCHVISION_TARGET_CHUNK]
        index = torch.arange(len(chunk), dtype=torch.float32, device=boxes.device)[:, None]
        rois = torch.cat([index, chunk], dim=1)
        with trusted_inputs():  # rois made here, from the proposals: no value checks
            out.append(roi_align(bitmaps, rois, (mask_size, mask_size), 1.0, 0, False)[:, 0])
    return torch.cat(out)


def mask_rcnn_loss(pred_mask_logits: Tensor, instances: List[Instances], target_mode: str = "aligned") -> Tensor:
    """Mean per-pixel binary cross entropy of each ROI's mask logits for its GT class.

    Args:
        pred_mask_logits: [R, K, M, M] (or [R, 1, M, M] class-agnostic) for the R foreground ROIs
            of `instances`, in order.
        instances: per image, the foreground ROIs with `proposal_boxes`, `gt_classes` and
            `gt_masks` (PolygonMasks or BitMasks, one per ROI: the matched GT's mask).
        target_mode: "aligned": the GT mask sampled at the M x M cell centers of the ROI and
            thresholded at 0.5 (`crop_and_resize`); "torchvision": ROIAlign with aligned=False
            over the full-image bitmap, soft targets (reproduces torchvision's mask loss).
    """
    if target_mode not in _TARGET_MODES:
        raise ValueError(f"mask_rcnn_loss: target_mode must be one of {_TARGET_MODES}, got {target_mode!r}")
    if pred_mask_logits.dim() != 4 or pred_mask_logits.shape[2] != pred_mask_logits.shape[3]:
        raise ValueError(f"mask_rcnn_loss: pred_mask_logits must be [R, K, M, M], got {tuple(pred_mask_logits.shape)}")
    num_rois = sum(len(x) for x in instances)
    if num_rois != pred_mask_logits.shape[0]:
        raise ValueError(f"mask_rcnn_loss: {pred_mask_logits.shape[0]} mask predictions for {num_rois} ROIs")
    mask_size = pred_mask_logits.shape[2]
    class_agnostic = pred_mask_logits.shape[1] == 1

    gt_classes, gt_masks = [], []
    for inst in instances:
        if len(inst) == 0:
            continue
        if not class_agnostic:
            gt_classes.append(inst.gt_classes)
        if target_mode == "torchvision":
            targets_i = _torchvision_mask_targets(inst, mask_size)
        else:
            targets_i = inst.gt_masks.crop_and_resize(inst.proposal_boxes.tensor, mask_size)
        gt_masks.append(targets_i.to(pred_mask_logits.device))
    if len(gt_masks) == 0:
        # No foreground ROI in the batch: a zero that still reaches the head's parameters.
        return pred_mask_logits.sum() * 0.0

    if class_agnostic:
        logits = pred_mask_logits[:, 0]
    else:
        classes = torch.cat(gt_classes).to(pred_mask_logits.device)
        logits = pred_mask_logits[torch.arange(num_rois, device=classes.device), classes]
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # AMP: loss in float32
    targets = torch.cat(gt_masks).to(logits.dtype)
    return F.binary_cross_entropy_with_logits(logits, targets, reduction="mean")


def mask_rcnn_inference(pred_mask_logits: Tensor, pred_instances: List[Instances]) -> None:
    """Sets `pred_masks` [N_i, 1, M, M] (probabilities of the predicted class) on each image's
    detections; `pred_instances` must carry `pred_classes` unless the head is class-agnostic."""
    num_per_image = [x.num_instances() for x in pred_instances]
    if sum(num_per_image) != pred_mask_logits.shape[0]:
        raise ValueError(
            f"mask_rcnn_inference: {pred_mask_logits.shape[0]} mask predictions for {sum(num_per_image)} detections"
        )
    if pred_mask_logits.shape[1] == 1:
        logits = pred_mask_logits
    else:
        classes = torch.cat([x.pred_classes for x in pred_instances]).to(pred_mask_logits.device)
        index = torch.arange(classes.numel(), device=classes.device)
        logits = pred_mask_logits[index, classes][:, None]
    probs = logits.to(torch.promote_types(logits.dtype, torch.float32)).sigmoid()
    for probs_i, inst in zip(probs.split(num_per_image), pred_instances):
        inst.pred_masks = probs_i


@ROI_MASK_HEAD_REGISTRY.register()
class MaskRCNNConvUpsampleHead(nn.Sequential):
    """`len(conv_dims) - 1` 3×3 convs (+norm, ReLU), a 2× ConvTranspose2d (+ReLU) with
    `conv_dims[-1]` channels, and a 1×1 conv predicting one mask per class (14×14 ROIs → 28×28).

    Args:
        input_shape: channels of the pooled features.
        num_classes: masks per ROI (1 for class-agnostic masks).
        conv_dims: output channels of each 3×3 conv, then of the deconv (at least one entry).
        conv_norm: normalization of the 3×3 convs ("" for none).
        loss_weight: multiplier of the mask loss.
        target_mode: how training targets are made (see `mask_rcnn_loss`).
    """

    def __init__(
        self,
        input_shape: ShapeSpec,
        *,
        num_classes: int,
        conv_dims: Sequence[int],
        conv_norm="",
        loss_weight: float = 1.0,
        target_mode: str = "aligned",
    ):
        super().__init__()
        if target_mode not in _TARGET_MODES:
            raise ValueError(
                f"MaskRCNNConvUpsampleHead: target_mode must be one of {_TARGET_MODES}, got {target_mode!r}"
            )
        self.target_mode = target_mode
        if len(conv_dims) < 1:
            raise ValueError("MaskRCNNConvUpsampleHead: conv_dims needs at least one entry (the deconv's channels)")
        if num_classes < 1:
            raise ValueError(f"MaskRCNNConvUpsampleHead: num_classes must be >= 1, got {num_classes}")
        self.loss_weight = float(loss_weight)
        channels = input_shape.channels

        self.conv_norm_relus = []
        for k, dim in enumerate(conv_dims[:-1]):
            conv = Conv2d(
                channels,
                dim,
                kernel_size=3,
                padding=1,
                bias=not conv_norm,
                norm=get_norm(conv_norm, dim),
                activation=F.relu_,  # in place: the conv (or norm) output is not needed again
            )
            self.add_module(f"mask_fcn{k + 1}", conv)
            self.conv_norm_relus.append(conv)
            channels = dim

        self.deconv = nn.ConvTranspose2d(channels, conv_dims[-1], kernel_size=2, stride=2)
        self.add_module("deconv_relu", nn.ReLU(inplace=True))
        self.predictor = nn.Conv2d(conv_dims[-1], num_classes, kernel_size=1)

        for layer in self.conv_norm_relus + [self.deconv]:
            c2_msra_fill(layer)
        # Near-zero initial logits: every mask starts at probability ~0.5.
        nn.init.normal_(self.predictor.weight, std=0.001)
        nn.init.zeros_(self.predictor.bias)

    @classmethod
    def from_config(cls, cfg, input_shape: ShapeSpec):
        head = cfg.MODEL.ROI_MASK_HEAD
        return {
            "input_shape": input_shape,
            "num_classes": 1 if head.CLS_AGNOSTIC_MASK else cfg.MODEL.ROI_HEADS.NUM_CLASSES,
            # NUM_CONV convs of CONV_DIM, and the deconv of CONV_DIM.
            "conv_dims": [head.CONV_DIM] * (head.NUM_CONV + 1),
            "conv_norm": head.NORM,
            "target_mode": head.TARGET_MODE,
        }

    def layers(self, x: Tensor) -> Tensor:
        """Mask logits [R, num_classes, 2S, 2S] of the pooled features [R, C, S, S]."""
        return super().forward(x)

    def forward(self, x: Tensor, instances: List[Instances]) -> Union[Dict[str, Tensor], List[Instances]]:
        """
        Args:
            x: pooled features of the ROIs of `instances`, in order.
            instances: training: the foreground proposals (with gt fields); eval: the detections.
        """
        if x.dim() != 4:
            raise ValueError(f"MaskRCNNConvUpsampleHead: expected pooled features [R, C, S, S], got {tuple(x.shape)}")
        logits = self.layers(x)
        if self.training:
            return {"loss_mask": mask_rcnn_loss(logits, instances, self.target_mode) * self.loss_weight}
        mask_rcnn_inference(logits, instances)
        return instances


def build_mask_head(cfg, input_shape: ShapeSpec) -> nn.Module:
    """Build the mask head named by cfg.MODEL.ROI_MASK_HEAD.NAME for pooled features of `input_shape`."""
    return ROI_MASK_HEAD_REGISTRY.build(cfg, input_shape)
