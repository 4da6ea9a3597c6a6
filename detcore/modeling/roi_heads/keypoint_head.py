"""The Keypoint R-CNN head: per ROI, one S×S heatmap of logits for each of K keypoints.

Training: each keypoint is a classification over the S×S heatmap cells (softmax cross entropy),
its label the cell of the matched ground-truth point (``keypoints_to_heatmap``); only labeled
points inside the ROI count. Inference: the heatmaps go onto the detections as
``pred_keypoint_heatmaps``; ``detector_postprocess`` decodes them into ``pred_keypoints`` in the
output image (a per-box bicubic resize that cannot be one exportable graph, so it happens after
the model's tensor part, as mask pasting does).
"""
from typing import Dict, List, Optional, Sequence, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from detcore.layers import Conv2d, ShapeSpec, c2_msra_fill
from detcore.structures import Instances, keypoints_to_heatmap
from detcore.utils.registry import Registry

__all__ = [
    "ROI_KEYPOINT_HEAD_REGISTRY",
    "KRCNNConvDeconvUpsampleHead",
    "build_keypoint_head",
    "keypoint_rcnn_loss",
    "keypoint_rcnn_inference",
]

# Keypoint heads: `from_config(cfg, input_shape)` returns the constructor arguments (the one rule
# of detcore.utils.registry). forward(x, instances) returns {"loss_keypoint": ...} in training and
# the instances with `pred_keypoint_heatmaps` in eval.
ROI_KEYPOINT_HEAD_REGISTRY = Registry("ROI_KEYPOINT_HEAD", "MODEL.ROI_KEYPOINT_HEAD.NAME")


def keypoint_rcnn_loss(pred_keypoint_logits: Tensor, instances: List[Instances], normalizer: Optional[float] = None) -> Tensor:
    """Softmax cross entropy over the heatmap cells of every labeled keypoint inside its ROI.

    Args:
        pred_keypoint_logits: ``[R, K, S, S]`` for the R ROIs of ``instances``, in order.
        instances: per image, the ROIs with ``proposal_boxes`` and ``gt_keypoints`` (Keypoints of
            the matched ground truth, one per ROI).
        normalizer: the loss is the sum over the counted keypoints divided by this; None divides
            by their number (a mean over the visible keypoints of the batch).
    """
    if pred_keypoint_logits.dim() != 4 or pred_keypoint_logits.shape[2] != pred_keypoint_logits.shape[3]:
        raise ValueError(
            f"keypoint_rcnn_loss: pred_keypoint_logits must be [R, K, S, S], got {tuple(pred_keypoint_logits.shape)}"
        )
    num_rois = sum(len(x) for x in instances)
    if num_rois != pred_keypoint_logits.shape[0]:
        raise ValueError(f"keypoint_rcnn_loss: {pred_keypoint_logits.shape[0]} heatmap sets for {num_rois} ROIs")
    num_keypoints, side = pred_keypoint_logits.shape[1], pred_keypoint_logits.shape[2]
    targets, valid = [], []
    for inst in instances:
        if len(inst) == 0:
            continue
        gt = inst.gt_keypoints
        if gt.num_keypoints != num_keypoints:
            raise ValueError(
                f"keypoint_rcnn_loss: the head predicts {num_keypoints} keypoints (MODEL.ROI_KEYPOINT_HEAD."
                f"NUM_KEYPOINTS) but the ground truth has {gt.num_keypoints}"
            )
        t, v = gt.to_heatmap(inst.proposal_boxes.tensor, side)
        targets.append(t.reshape(-1))
        valid.append(v.reshape(-1))
    if not targets or not torch.cat(valid).any():
        # Nothing to learn from in this batch: a zero that still reaches the head's parameters.
        return pred_keypoint_logits.sum() * 0.0
    targets = torch.cat(targets).to(pred_keypoint_logits.device)
    valid = torch.cat(valid).to(pred_keypoint_logits.device)
    logits = pred_keypoint_logits.reshape(num_rois * num_keypoints, side * side)[valid]
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # AMP: loss in float32
    loss = F.cross_entropy(logits, targets[valid], reduction="sum")
    return loss / (valid.sum() if normalizer is None else normalizer)


def keypoint_rcnn_inference(pred_keypoint_logits: Tensor, pred_instances: List[Instances]) -> None:
    """Sets ``pred_keypoint_heatmaps`` ``[N_i, K, S, S]`` (float32 logits) on each image's detections."""
    num_per_image = [x.num_instances() for x in pred_instances]
    if sum(num_per_image) != pred_keypoint_logits.shape[0]:
        raise ValueError(
            f"keypoint_rcnn_inference: {pred_keypoint_logits.shape[0]} heatmap sets for {sum(num_per_image)} detections"
        )
    logits = pred_keypoint_logits.to(torch.promote_types(pred_keypoint_logits.dtype, torch.float32))
    for maps, inst in zip(logits.split(num_per_image), pred_instances):
        inst.pred_keypoint_heatmaps = maps


@ROI_KEYPOINT_HEAD_REGISTRY.register()
class KRCNNConvDeconvUpsampleHead(nn.Module):
    """3×3 convs (each + ReLU), a stride-2 4×4 ConvTranspose2d to K maps, and a 2× bilinear
    upsampling: 14×14 pooled features → 56×56 heatmaps (Mask R-CNN paper, section 5).

    Args:
        input_shape: channels of the pooled features.
        num_keypoints: K, heatmaps per ROI.
        conv_dims: output channels of each 3×3 conv (at least one).
        loss_weight: multiplier of the loss.
        loss_normalizer: "visible" divides the loss by the number of labeled keypoints inside
            their ROIs in the batch (the mean); a number n divides it by n × images instead, the
            published Detectron rule (n = K × sampled ROIs per image × foreground fraction: the
            keypoints a full batch could have), which does not up-weight batches with few points.
    """

    def __init__(
        self,
        input_shape: ShapeSpec,
        *,
        num_keypoints: int,
        conv_dims: Sequence[int],
        loss_weight: float = 1.0,
        loss_normalizer: Union[str, float] = "visible",
    ):
        super().__init__()
        if num_keypoints < 1:
            raise ValueError(f"KRCNNConvDeconvUpsampleHead: num_keypoints must be >= 1, got {num_keypoints}")
        if len(conv_dims) < 1:
            raise ValueError("KRCNNConvDeconvUpsampleHead: conv_dims needs at least one entry")
        if loss_normalizer != "visible" and not (
            isinstance(loss_normalizer, (int, float)) and not isinstance(loss_normalizer, bool) and loss_normalizer > 0
        ):
            raise ValueError(
                f"KRCNNConvDeconvUpsampleHead: loss_normalizer must be 'visible' or a positive number, got {loss_normalizer!r}"
            )
        self.num_keypoints = int(num_keypoints)
        self.loss_weight = float(loss_weight)
        self.loss_normalizer = loss_normalizer
        channels = input_shape.channels
        self.convs = []
        for k, dim in enumerate(conv_dims, start=1):
            conv = Conv2d(channels, dim, kernel_size=3, padding=1, activation=F.relu_)
            self.add_module(f"conv_fcn{k}", conv)
            self.convs.append(conv)
            channels = dim
        # Kernel 4, stride 2, padding 1: exactly doubles the side (14 -> 28).
        self.score_lowres = nn.ConvTranspose2d(channels, self.num_keypoints, kernel_size=4, stride=2, padding=1)
        for layer in self.convs + [self.score_lowres]:
            c2_msra_fill(layer)

    @classmethod
    def from_config(cls, cfg, input_shape: ShapeSpec):
        head = cfg.MODEL.ROI_KEYPOINT_HEAD
        if head.NORMALIZE_LOSS_BY_VISIBLE_KEYPOINTS:
            normalizer = "visible"
        else:
            roi = cfg.MODEL.ROI_HEADS
            normalizer = float(head.NUM_KEYPOINTS * roi.BATCH_SIZE_PER_IMAGE * roi.POSITIVE_FRACTION)
        return {
            "input_shape": input_shape,
            "num_keypoints": head.NUM_KEYPOINTS,
            "conv_dims": list(head.CONV_DIMS),
            "loss_weight": head.LOSS_WEIGHT,
            "loss_normalizer": normalizer,
        }

    def layers(self, x: Tensor) -> Tensor:
        """Heatmap logits ``[R, K, 4S, 4S]`` of the pooled features ``[R, C, S, S]``."""
        for conv in self.convs:
            x = conv(x)
        x = self.score_lowres(x)
        return F.interpolate(x, scale_factor=2.0, mode="bilinear", align_corners=False)

    def forward(self, x: Tensor, instances: List[Instances]) -> Union[Dict[str, Tensor], List[Instances]]:
        """
        Args:
            x: pooled features of the ROIs of `instances`, in order.
            instances: training: the foreground proposals (with `gt_keypoints`); eval: the detections.
        """
        if x.dim() != 4:
            raise ValueError(f"KRCNNConvDeconvUpsampleHead: expected pooled features [R, C, S, S], got {tuple(x.shape)}")
        logits = self.layers(x)
        if self.training:
            normalizer = None if self.loss_normalizer == "visible" else len(instances) * self.loss_normalizer
            return {"loss_keypoint": keypoint_rcnn_loss(logits, instances, normalizer) * self.loss_weight}
        keypoint_rcnn_inference(logits, instances)
        return instances


def build_keypoint_head(cfg, input_shape: ShapeSpec) -> nn.Module:
    """Build the keypoint head named by cfg.MODEL.ROI_KEYPOINT_HEAD.NAME for pooled features of `input_shape`."""
    return ROI_KEYPOINT_HEAD_REGISTRY.build(cfg, input_shape)
