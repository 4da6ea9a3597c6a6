"""The Fast R-CNN predictor: per-ROI class scores and box deltas, their losses, and inference.

Class scores have NUM_CLASSES + 1 entries per ROI; the LAST one is background. Box deltas are
class-specific (NUM_CLASSES * 4 per ROI) unless class-agnostic (4), encoded relative to the
proposal by a Box2BoxTransform with weights (10, 10, 5, 5).
"""
from typing import Dict, List, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from detcore.config.choices import BOX_REG_LOSS_TYPES
from detcore.layers import ShapeSpec, batched_nms, trusted_inputs
from detcore.structures import Boxes, Instances, clip_limits
from detcore.utils.registry import Registry

from ..box_regression import Box2BoxTransform, box_loss

__all__ = [
    "ROI_BOX_PREDICTOR_REGISTRY",
    "FastRCNNOutputLayers",
    "build_box_predictor",
    "fast_rcnn_inference",
    "fast_rcnn_inference_single_image",
]

# Box predictors: `from_config(cfg, input_shape)` returns the constructor arguments (the one rule
# of detcore.utils.registry). They map box-head features to (scores, deltas) and own the losses
# and inference of the box branch.
ROI_BOX_PREDICTOR_REGISTRY = Registry("ROI_BOX_PREDICTOR", "MODEL.ROI_BOX_HEAD.PREDICTOR_NAME")


def fast_rcnn_inference(
    boxes: Sequence[Tensor],
    scores: Sequence[Tensor],
    image_shapes: Sequence[Tuple[int, int]],
    score_thresh: float,
    nms_thresh: float,
    topk_per_image: int,
    min_box_size: float = 0.0,
    legacy_plus_one: bool = False,
) -> Tuple[List[Instances], List[Tensor]]:
    """Per-image detections from per-class boxes and class probabilities.

    Args:
        boxes: per image, Tensor[R_i, K * 4] (class-specific) or [R_i, 4] (class-agnostic).
        scores: per image, Tensor[R_i, K + 1] probabilities, background last.
        image_shapes: per image (height, width) to clip the boxes to.
        score_thresh: keep (ROI, class) pairs scoring strictly above this.
        nms_thresh: IoU threshold of the per-class NMS.
        topk_per_image: keep this many detections per image (all of them if < 0).
        min_box_size: if > 0, (clipped) boxes with a side below this are dropped before the NMS
            (torchvision drops sides under 0.01 px).
        legacy_plus_one: clip as Detectron does (`detcore.structures.clip_limits`).

    Returns:
        Instances (pred_boxes, scores, pred_classes) per image, by decreasing score, and per image
        the index of the ROI each detection came from.
    """
    if not len(boxes) == len(scores) == len(image_shapes):
        raise ValueError(
            f"fast_rcnn_inference: got {len(boxes)} box tensors, {len(scores)} score tensors and "
            f"{len(image_shapes)} image shapes; need one of each per image"
        )
    results = [
        fast_rcnn_inference_single_image(
            b, s, shape, score_thresh, nms_thresh, topk_per_image, min_box_size, legacy_plus_one
        )
        for b, s, shape in zip(boxes, scores, image_shapes)
    ]
    return [r[0] for r in results], [r[1] for r in results]


def fast_rcnn_inference_single_image(
    boxes: Tensor,
    scores: Tensor,
    image_shape: Tuple[int, int],
    score_thresh: float,
    nms_thresh: float,
    topk_per_image: int,
    min_box_size: float = 0.0,
    legacy_plus_one: bool = False,
) -> Tuple[Instances, Tensor]:
    """One image of `fast_rcnn_inference`."""
    if scores.dim() != 2 or boxes.dim() != 2 or boxes.shape[0] != scores.shape[0]:
        raise ValueError(
            f"fast_rcnn_inference: boxes [R, K*4] and scores [R, K+1] must have as many rows, got "
            f"{tuple(boxes.shape)} and {tuple(scores.shape)}"
        )
    num_classes = scores.shape[1] - 1
    if boxes.shape[1] not in (4, num_classes * 4):
        raise ValueError(
            f"fast_rcnn_inference: boxes must have 4 or {num_classes * 4} columns for {num_classes} "
            f"classes, got {boxes.shape[1]}"
        )
    # A diverged model can emit inf/NaN; drop those ROIs rather than let NMS see them.
    # (Masked unconditionally: no data-dependent branch, so inference traces into one graph.)
    valid = torch.isfinite(boxes).all(dim=1) & torch.isfinite(scores).all(dim=1)
    boxes, scores = boxes[valid], scores[valid]
    roi_index = torch.nonzero(valid).squeeze(1)

    scores = scores[:, :-1]
    num_reg_classes = boxes.shape[1] // 4
    boxes = _clip(boxes.reshape(-1, num_reg_classes, 4), image_shape, legacy_plus_one)

    keep_mask = scores > score_thresh  # [R, K]
    pairs = keep_mask.nonzero()  # (roi, class) pairs, [P, 2]
    if num_reg_classes == 1:
        boxes = boxes[pairs[:, 0], 0]
    else:
        boxes = boxes[keep_mask]
    scores = scores[keep_mask]
    if min_box_size > 0:
        big = ((boxes[:, 2] - boxes[:, 0]) >= min_box_size) & ((boxes[:, 3] - boxes[:, 1]) >= min_box_size)
        boxes, scores, pairs = boxes[big], scores[big], pairs[big]

    with trusted_inputs():  # integer class ids: no value checks to skip, only its size sync
        keep = batched_nms(boxes, scores, pairs[:, 1], nms_thresh)
    if topk_per_image >= 0:
        keep = keep[:topk_per_image]
    boxes, scores, pairs = boxes[keep], scores[keep], pairs[keep]

    result = Instances(image_shape)
    result.pred_boxes = Boxes(boxes)
    result.scores = scores
    result.pred_classes = pairs[:, 1]
    return result, roi_index[pairs[:, 0]]


def _clip(boxes: Tensor, image_shape: Tuple[int, int], legacy_plus_one: bool = False) -> Tensor:
    # Out of place (Boxes.clip works in place): the boxes may be the caller's, or views in the graph.
    limits = clip_limits(image_shape, legacy_plus_one)
    return torch.stack([boxes[..., i].clamp(min=lo, max=hi) for i, (lo, hi) in enumerate(limits)], dim=-1)


@ROI_BOX_PREDICTOR_REGISTRY.register()
class FastRCNNOutputLayers(nn.Module):
    """Two linear layers on the box-head features: `cls_score` (K + 1 logits) and `bbox_pred`
    (K * 4 or 4 deltas).

    Args:
        input_shape: the box head's output (channels, or channels x height x width).
        box2box_transform: decodes/encodes the deltas.
        num_classes: K, the number of foreground classes.
        test_score_thresh, test_nms_thresh, test_topk_per_image, test_min_box_size,
            legacy_plus_one: inference settings (see `fast_rcnn_inference`).
        cls_agnostic_bbox_reg: one box per ROI instead of one per class.
        smooth_l1_beta: beta of the smooth-L1 box loss (0: L1).
        box_reg_loss_type: "smooth_l1" or "l1" (on the deltas), or "giou" (on the decoded boxes).
        loss_weight: a float for both losses, or a dict {"loss_cls": w, "loss_box_reg": w}.
    """

    def __init__(
        self,
        input_shape: ShapeSpec,
        *,
        box2box_transform: Box2BoxTransform,
        num_classes: int,
        test_score_thresh: float = 0.0,
        test_nms_thresh: float = 0.5,
        test_topk_per_image: int = 100,
        test_min_box_size: float = 0.0,
        legacy_plus_one: bool = False,
        cls_agnostic_bbox_reg: bool = False,
        smooth_l1_beta: float = 0.0,
        box_reg_loss_type: str = "smooth_l1",
        loss_weight=1.0,
    ):
        super().__init__()
        if isinstance(input_shape, int):
            input_shape = ShapeSpec(channels=input_shape)
        if num_classes < 1:
            raise ValueError(f"FastRCNNOutputLayers: num_classes must be >= 1, got {num_classes}")
        if box_reg_loss_type not in BOX_REG_LOSS_TYPES:
            raise ValueError(
                f"FastRCNNOutputLayers: box_reg_loss_type must be one of {list(BOX_REG_LOSS_TYPES)}, "
                f"got {box_reg_loss_type!r}"
            )
        input_size = input_shape.channels * (input_shape.height or 1) * (input_shape.width or 1)
        self.num_classes = int(num_classes)
        self.cls_score = nn.Linear(input_size, num_classes + 1)
        num_reg_classes = 1 if cls_agnostic_bbox_reg else num_classes
        self.bbox_pred = nn.Linear(input_size, num_reg_classes * 4)
        # Small initial outputs: near-uniform class scores, boxes close to the proposals.
        nn.init.normal_(self.cls_score.weight, std=0.01)
        nn.init.normal_(self.bbox_pred.weight, std=0.001)
        nn.init.zeros_(self.cls_score.bias)
        nn.init.zeros_(self.bbox_pred.bias)

        self.box2box_transform = box2box_transform
        self.test_score_thresh = float(test_score_thresh)
        self.test_nms_thresh = float(test_nms_thresh)
        self.test_topk_per_image = int(test_topk_per_image)
        self.test_min_box_size = float(test_min_box_size)
        self.legacy_plus_one = bool(legacy_plus_one)
        self.smooth_l1_beta = float(smooth_l1_beta)
        self.box_reg_loss_type = box_reg_loss_type
        if not isinstance(loss_weight, dict):
            loss_weight = {"loss_cls": float(loss_weight), "loss_box_reg": float(loss_weight)}
        self.loss_weight = loss_weight

    @classmethod
    def from_config(cls, cfg, input_shape: ShapeSpec):
        box = cfg.MODEL.ROI_BOX_HEAD
        return {
            "input_shape": input_shape,
            "box2box_transform": Box2BoxTransform(weights=box.BBOX_REG_WEIGHTS),
            "num_classes": cfg.MODEL.ROI_HEADS.NUM_CLASSES,
            "test_score_thresh": cfg.MODEL.ROI_HEADS.SCORE_THRESH_TEST,
            "test_nms_thresh": cfg.MODEL.ROI_HEADS.NMS_THRESH_TEST,
            "test_topk_per_image": cfg.TEST.DETECTIONS_PER_IMAGE,
            "test_min_box_size": cfg.MODEL.ROI_HEADS.MIN_BOX_SIZE_TEST,
            "legacy_plus_one": cfg.MODEL.BOX_LEGACY_PLUS_ONE,
            "cls_agnostic_bbox_reg": box.CLS_AGNOSTIC_BBOX_REG,
            "smooth_l1_beta": box.SMOOTH_L1_BETA,
            "box_reg_loss_type": box.BBOX_REG_LOSS_TYPE,
        }

    def forward(self, x: Tensor) -> Tuple[Tensor, Tensor]:
        """x: [R, D] (or [R, C, H, W], flattened) → (scores [R, K + 1], deltas [R, K * 4 or 4])."""
        if x.dim() > 2:
            x = torch.flatten(x, start_dim=1)
        return self.cls_score(x), self.bbox_pred(x)

    # --- training ---------------------------------------------------------------------------------
    def losses(self, predictions: Tuple[Tensor, Tensor], proposals: List[Instances]) -> Dict[str, Tensor]:
        """Cross entropy over all sampled ROIs, and the box loss over the foreground ones divided
        by the number of sampled ROIs (so each ROI weighs the same, whatever the fg/bg mix).

        Args:
            predictions: this module's output on the ROIs of `proposals`, in order.
            proposals: per image, the sampled ROIs with `proposal_boxes`, `gt_classes` (K for
                background) and, for images with ground truth, `gt_boxes`.
        """
        scores, deltas = predictions
        if len(proposals) == 0:
            zero = scores.sum() * 0.0 + deltas.sum() * 0.0
            return {"loss_cls": zero, "loss_box_reg": zero}
        for i, p in enumerate(proposals):
            if not p.has("gt_classes"):
                raise ValueError(f"FastRCNNOutputLayers.losses: proposals[{i}] has no 'gt_classes' (label them first)")
        gt_classes = torch.cat([p.gt_classes for p in proposals]).to(scores.device)
        if gt_classes.numel() != scores.shape[0]:
            raise ValueError(
                f"FastRCNNOutputLayers.losses: {scores.shape[0]} predictions for {gt_classes.numel()} proposals"
            )
        proposal_boxes = torch.cat([p.proposal_boxes.tensor for p in proposals])
        # Images without ground truth have no gt_boxes; their ROIs are all background anyway.
        gt_boxes = torch.cat([(p.gt_boxes if p.has("gt_boxes") else p.proposal_boxes).tensor for p in proposals])

        if gt_classes.numel() == 0:
            loss_cls = scores.sum() * 0.0
        else:
            loss_cls = F.cross_entropy(scores, gt_classes, reduction="mean")
        loss_box_reg = self.box_reg_loss(proposal_boxes, gt_boxes, deltas, gt_classes)
        return {
            "loss_cls": loss_cls * self.loss_weight.get("loss_cls", 1.0),
            "loss_box_reg": loss_box_reg * self.loss_weight.get("loss_box_reg", 1.0),
        }

    def box_reg_loss(self, proposal_boxes: Tensor, gt_boxes: Tensor, pred_deltas: Tensor, gt_classes: Tensor) -> Tensor:
        """Regression loss of the foreground ROIs' deltas for their GT class, / number of ROIs."""
        fg = torch.nonzero((gt_classes >= 0) & (gt_classes < self.num_classes)).squeeze(1)
        if pred_deltas.shape[1] == 4:  # class-agnostic
            fg_deltas = pred_deltas[fg]
        else:
            fg_deltas = pred_deltas.view(-1, self.num_classes, 4)[fg, gt_classes[fg]]
        loss = box_loss(
            self.box2box_transform, proposal_boxes[fg], fg_deltas, gt_boxes[fg], self.box_reg_loss_type, self.smooth_l1_beta
        )
        # sum() * 0 of the deltas keeps the graph (and DDP) intact when there is no foreground.
        return loss / max(gt_classes.numel(), 1) + pred_deltas.sum() * 0.0

    # --- inference --------------------------------------------------------------------------------
    def predict_boxes(self, predictions: Tuple[Tensor, Tensor], proposals: List[Instances]) -> List[Tensor]:
        """Per image, the decoded boxes [R_i, K * 4] (or [R_i, 4] if class-agnostic)."""
        _, deltas = predictions
        if len(proposals) == 0:
            return []
        num_per_image = [p.num_instances() for p in proposals]
        proposal_boxes = torch.cat([p.proposal_boxes.tensor for p in proposals]).to(deltas.device)
        # Decode in float32 at least: half-precision image coordinates are off by pixels (AMP).
        deltas = deltas.to(torch.promote_types(deltas.dtype, torch.float32))
        boxes = self.box2box_transform.apply_deltas(deltas, proposal_boxes)
        return list(boxes.split(num_per_image))

    def predict_probs(self, predictions: Tuple[Tensor, Tensor], proposals: List[Instances]) -> List[Tensor]:
        """Per image, the class probabilities [R_i, K + 1] (softmax; background last)."""
        scores, _ = predictions
        num_per_image = [p.num_instances() for p in proposals]
        probs = F.softmax(scores.to(torch.promote_types(scores.dtype, torch.float32)), dim=-1)
        return list(probs.split(num_per_image))

    def inference(self, predictions: Tuple[Tensor, Tensor], proposals: List[Instances]) -> Tuple[List[Instances], List[Tensor]]:
        """Detections per image (see `fast_rcnn_inference`) and the ROI index of each."""
        boxes = self.predict_boxes(predictions, proposals)
        scores = self.predict_probs(predictions, proposals)
        image_shapes = [p.image_size for p in proposals]
        return fast_rcnn_inference(
            boxes,
            scores,
            image_shapes,
            self.test_score_thresh,
            self.test_nms_thresh,
            self.test_topk_per_image,
            self.test_min_box_size,
            self.legacy_plus_one,
        )


def build_box_predictor(cfg, input_shape: ShapeSpec) -> nn.Module:
    """Build the predictor named by cfg.MODEL.ROI_BOX_HEAD.PREDICTOR_NAME on the box head's output."""
    return ROI_BOX_PREDICTOR_REGISTRY.build(cfg, input_shape)
