"""ROI heads: the second stage of a two-stage detector.

Training: proposals (plus the GT boxes themselves) are matched to the ground truth, a balanced
batch of them is sampled, and the box branch (pooler → box head → predictor), the mask branch
and the keypoint branch (both on the foreground ROIs only) compute their losses. Inference: the
box branch turns proposals into detections (per-class NMS), and the mask and keypoint branches
predict a mask and keypoint heatmaps for each detection.
"""
import math
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor, nn

from detcore.layers import ShapeSpec
from detcore.structures import Boxes, ImageList, Instances, pairwise_iou
from detcore.utils.registry import Registry

from ..matcher import Matcher
from ..poolers import ROIPooler
from ..sampling import subsample_labels
from .box_head import build_box_head
from .fast_rcnn import build_box_predictor
from .keypoint_head import build_keypoint_head
from .mask_head import build_mask_head

__all__ = [
    "ROI_HEADS_REGISTRY",
    "ROIHeads",
    "StandardROIHeads",
    "build_roi_heads",
    "add_ground_truth_to_proposals",
    "select_foreground_proposals",
    "select_proposals_with_visible_keypoints",
]

# ROI heads: `from_config(cfg, input_shape)` returns the constructor arguments (the one rule of
# detcore.utils.registry); `input_shape` maps feature names to ShapeSpec.
ROI_HEADS_REGISTRY = Registry("ROI_HEADS", "MODEL.ROI_HEADS.NAME")

# The objectness logit given to GT boxes added as proposals: sigmoid(logit) = 1 - 1e-10, i.e. "as
# sure as a proposal can be", and finite.
_GT_PROPOSAL_LOGIT = math.log((1.0 - 1e-10) / 1e-10)


def add_ground_truth_to_proposals(targets: List[Instances], proposals: List[Instances]) -> List[Instances]:
    """Append each image's GT boxes to its proposals, so every GT has at least one perfect ROI
    (early in training the RPN proposes little that overlaps the objects)."""
    if len(targets) != len(proposals):
        raise ValueError(f"add_ground_truth_to_proposals: {len(targets)} targets for {len(proposals)} images")
    out = []
    for gt, props in zip(targets, proposals):
        gt_boxes = gt.gt_boxes.tensor.to(props.proposal_boxes.device)
        extra = Instances(props.image_size)
        extra.proposal_boxes = Boxes(gt_boxes)
        if props.has("objectness_logits"):
            logits = props.objectness_logits
            extra.objectness_logits = torch.full(
                (len(gt_boxes),), _GT_PROPOSAL_LOGIT, dtype=logits.dtype, device=logits.device
            )
        out.append(Instances.cat([props, extra]))
    return out


def select_foreground_proposals(proposals: List[Instances], bg_label: int) -> List[Instances]:
    """Per image, the proposals whose `gt_classes` is a foreground class (not -1, not bg_label)."""
    fg = []
    for props in proposals:
        classes = props.gt_classes
        fg.append(props[(classes != -1) & (classes != bg_label)])
    return fg


def select_proposals_with_visible_keypoints(proposals: List[Instances]) -> List[Instances]:
    """Per image, the proposals whose box holds at least one labeled point of their matched GT's
    `gt_keypoints`: the others add nothing to the keypoint loss, only its cost."""
    selected = []
    for props in proposals:
        if len(props) == 0:
            selected.append(props)
            continue
        kp = props.gt_keypoints.tensor
        boxes = props.proposal_boxes.tensor.to(kp)[:, None]  # [R, 1, 4]
        xs, ys = kp[..., 0], kp[..., 1]
        inside = (xs >= boxes[..., 0]) & (xs <= boxes[..., 2]) & (ys >= boxes[..., 1]) & (ys <= boxes[..., 3])
        selected.append(props[(inside & (kp[..., 2] > 0)).any(dim=1).to(props.proposal_boxes.device)])
    return selected


def _pooler_from_config(head_cfg, scales, roi_heads_cfg, legacy_plus_one: bool = False) -> ROIPooler:
    """The pooler of one head (MODEL.ROI_BOX_HEAD, ROI_MASK_HEAD or ROI_KEYPOINT_HEAD): its
    resolution, sampling and alignment, with the level mapping shared by all heads
    (MODEL.ROI_HEADS) and the box convention of the model (MODEL.BOX_LEGACY_PLUS_ONE)."""
    return ROIPooler(
        output_size=head_cfg.POOLER_RESOLUTION,
        scales=scales,
        sampling_ratio=head_cfg.POOLER_SAMPLING_RATIO,
        aligned=head_cfg.POOLER_ALIGNED,
        canonical_box_size=roi_heads_cfg.CANONICAL_BOX_SIZE,
        canonical_level=roi_heads_cfg.CANONICAL_LEVEL,
        level_mapper=roi_heads_cfg.LEVEL_MAPPER,
        legacy_plus_one=legacy_plus_one,
    )


class ROIHeads(nn.Module):
    """What every ROI head does before its branches: in training, label the proposals against the
    ground truth and sample a balanced batch of them (`label_and_sample_proposals`).

    Args:
        num_classes: K foreground classes; background is label K.
        batch_size_per_image: ROIs sampled per image in training.
        positive_fraction: the largest share of foreground ROIs in that sample.
        proposal_matcher: labels ROIs by IoU with the GT (label 1 foreground, 0 background).
        proposal_append_gt: add the GT boxes to the proposals in training.
    """

    def __init__(
        self,
        *,
        num_classes: int,
        batch_size_per_image: int,
        positive_fraction: float,
        proposal_matcher: Matcher,
        proposal_append_gt: bool = True,
    ):
        super().__init__()
        self.num_classes = int(num_classes)
        self.batch_size_per_image = int(batch_size_per_image)
        self.positive_fraction = float(positive_fraction)
        self.proposal_matcher = proposal_matcher
        self.proposal_append_gt = bool(proposal_append_gt)

    @classmethod
    def from_config(cls, cfg, input_shape: Dict[str, ShapeSpec]):
        """The sampling arguments (MODEL.ROI_HEADS); subclasses add their branches."""
        roi = cfg.MODEL.ROI_HEADS
        return {
            "num_classes": roi.NUM_CLASSES,
            "batch_size_per_image": roi.BATCH_SIZE_PER_IMAGE,
            "positive_fraction": roi.POSITIVE_FRACTION,
            "proposal_matcher": Matcher(roi.IOU_THRESHOLDS, roi.IOU_LABELS, allow_low_quality_matches=False),
            "proposal_append_gt": roi.PROPOSAL_APPEND_GT,
        }

    def _check_inputs(self, images, features, in_features, proposals, targets) -> None:
        name = type(self).__name__
        if len(proposals) != len(images):
            raise ValueError(f"{name}: {len(proposals)} proposal sets for {len(images)} images")
        missing = [f for f in in_features if f not in features]
        if missing:
            raise KeyError(f"{name}: features {missing} missing; got {sorted(features)}")
        if self.training and targets is None:
            raise ValueError(f"{name}: targets are required in training mode")

    # --- training targets -----------------------------------------------------------------------
    @torch.no_grad()
    def label_and_sample_proposals(self, proposals: List[Instances], targets: List[Instances]) -> List[Instances]:
        """Per image: match proposals (plus GT boxes) to the GT, sample a balanced batch, and
        attach `gt_classes` (K = background) and the matched GT's other `gt_*` fields.

        Returns the sampled proposals, foreground first."""
        if len(targets) != len(proposals):
            raise ValueError(f"{type(self).__name__}: {len(targets)} targets for {len(proposals)} images")
        if self.proposal_append_gt:
            proposals = add_ground_truth_to_proposals(targets, proposals)

        sampled = []
        for props, gt in zip(proposals, targets):
            has_gt = len(gt) > 0
            iou = pairwise_iou(gt.gt_boxes, props.proposal_boxes)
            matched_idxs, matched_labels = self.proposal_matcher(iou)
            sampled_idxs, gt_classes = self._sample_proposals(matched_idxs, matched_labels, gt.gt_classes)

            props = props[sampled_idxs]
            props.gt_classes = gt_classes
            if has_gt:
                gt_rows = matched_idxs[sampled_idxs]
                for name, value in gt.fields().items():
                    if name.startswith("gt_") and not props.has(name):
                        props.set(name, value[gt_rows])
            sampled.append(props)
        return sampled

    def _sample_proposals(self, matched_idxs: Tensor, matched_labels: Tensor, gt_classes: Tensor) -> Tuple[Tensor, Tensor]:
        """Indices of the sampled proposals and their class labels (K for background)."""
        if gt_classes.numel() > 0:
            labels = gt_classes.to(matched_idxs.device)[matched_idxs]
            labels[matched_labels == 0] = self.num_classes
            labels[matched_labels == -1] = -1
        else:
            labels = torch.full_like(matched_idxs, self.num_classes)
        fg, bg = subsample_labels(labels, self.batch_size_per_image, self.positive_fraction, self.num_classes)
        idxs = torch.cat([fg, bg])
        return idxs, labels[idxs]


@ROI_HEADS_REGISTRY.register()
class StandardROIHeads(ROIHeads):
    """Box branch plus optional mask and keypoint branches, each with its own pooler, on shared
    FPN features.

    Args:
        box_in_features: feature names the box pooler reads, finest first (e.g. p2..p5).
        box_pooler, box_head, box_predictor: the box branch.
        num_classes, batch_size_per_image, positive_fraction, proposal_matcher,
            proposal_append_gt: the sampling of training ROIs (see ROIHeads).
        mask_in_features, mask_pooler, mask_head: the mask branch (all None to disable it).
        keypoint_in_features, keypoint_pooler, keypoint_head: the keypoint branch (all None to
            disable it).
    """

    def __init__(
        self,
        *,
        box_in_features: Sequence[str],
        box_pooler: ROIPooler,
        box_head: nn.Module,
        box_predictor: nn.Module,
        num_classes: int,
        batch_size_per_image: int,
        positive_fraction: float,
        proposal_matcher: Matcher,
        proposal_append_gt: bool = True,
        mask_in_features: Optional[Sequence[str]] = None,
        mask_pooler: Optional[ROIPooler] = None,
        mask_head: Optional[nn.Module] = None,
        keypoint_in_features: Optional[Sequence[str]] = None,
        keypoint_pooler: Optional[ROIPooler] = None,
        keypoint_head: Optional[nn.Module] = None,
    ):
        super().__init__(
            num_classes=num_classes,
            batch_size_per_image=batch_size_per_image,
            positive_fraction=positive_fraction,
            proposal_matcher=proposal_matcher,
            proposal_append_gt=proposal_append_gt,
        )
        for branch, parts in (
            ("mask", (mask_in_features, mask_pooler, mask_head)),
            ("keypoint", (keypoint_in_features, keypoint_pooler, keypoint_head)),
        ):
            if any(p is None for p in parts) and not all(p is None for p in parts):
                raise ValueError(
                    f"StandardROIHeads: give all of {branch}_in_features, {branch}_pooler and {branch}_head, or none"
                )
        self.box_in_features = list(box_in_features)
        self.box_pooler = box_pooler
        self.box_head = box_head
        self.box_predictor = box_predictor
        self.mask_on = mask_head is not None
        if self.mask_on:
            self.mask_in_features = list(mask_in_features)
            self.mask_pooler = mask_pooler
            self.mask_head = mask_head
        self.keypoint_on = keypoint_head is not None
        if self.keypoint_on:
            self.keypoint_in_features = list(keypoint_in_features)
            self.keypoint_pooler = keypoint_pooler
            self.keypoint_head = keypoint_head

    @classmethod
    def from_config(cls, cfg, input_shape: Dict[str, ShapeSpec]):
        roi = cfg.MODEL.ROI_HEADS
        in_features = list(roi.IN_FEATURES)
        missing = [f for f in in_features if f not in input_shape]
        if missing:
            raise ValueError(
                f"StandardROIHeads: MODEL.ROI_HEADS.IN_FEATURES {missing} are not among the backbone's "
                f"outputs {sorted(input_shape)}"
            )
        scales = tuple(1.0 / input_shape[f].stride for f in in_features)
        channels = {input_shape[f].channels for f in in_features}
        if len(channels) != 1:
            raise ValueError(f"StandardROIHeads: the features {in_features} must have one channel count, got {channels}")
        in_channels = channels.pop()

        box = cfg.MODEL.ROI_BOX_HEAD
        res = box.POOLER_RESOLUTION
        box_pooler = _pooler_from_config(box, scales, roi, cfg.MODEL.BOX_LEGACY_PLUS_ONE)
        box_head = build_box_head(cfg, ShapeSpec(channels=in_channels, height=res, width=res))
        kwargs = super().from_config(cfg, input_shape)
        kwargs.update({
            "box_in_features": in_features,
            "box_pooler": box_pooler,
            "box_head": box_head,
            "box_predictor": build_box_predictor(cfg, box_head.output_shape),
        })
        if cfg.MODEL.MASK_ON:
            mask = cfg.MODEL.ROI_MASK_HEAD
            res = mask.POOLER_RESOLUTION
            kwargs["mask_in_features"] = in_features
            kwargs["mask_pooler"] = _pooler_from_config(mask, scales, roi, cfg.MODEL.BOX_LEGACY_PLUS_ONE)
            kwargs["mask_head"] = build_mask_head(cfg, ShapeSpec(channels=in_channels, height=res, width=res))
        if cfg.MODEL.KEYPOINT_ON:
            keypoint = cfg.MODEL.ROI_KEYPOINT_HEAD
            res = keypoint.POOLER_RESOLUTION
            kwargs["keypoint_in_features"] = in_features
            kwargs["keypoint_pooler"] = _pooler_from_config(keypoint, scales, roi, cfg.MODEL.BOX_LEGACY_PLUS_ONE)
            kwargs["keypoint_head"] = build_keypoint_head(cfg, ShapeSpec(channels=in_channels, height=res, width=res))
        return kwargs

    # --- forward ----------------------------------------------------------------------------------
    def forward(
        self,
        images: ImageList,
        features: Dict[str, Tensor],
        proposals: List[Instances],
        targets: Optional[List[Instances]] = None,
    ) -> Tuple[List[Instances], Dict[str, Tensor]]:
        """
        Args:
            images: the batch (only its length and sizes matter here).
            features: feature maps by name, including `box_in_features`.
            proposals: per image, `proposal_boxes` (and usually `objectness_logits`).
            targets: per image GT (`gt_boxes`, `gt_classes`, `gt_masks` with a mask head,
                `gt_keypoints` with a keypoint head); required in training.

        Returns:
            training: (the sampled proposals, losses: loss_cls, loss_box_reg[, loss_mask]
            [, loss_keypoint]).
            eval: (detections per image: pred_boxes, scores, pred_classes[, pred_masks
            [N, 1, M, M] probabilities][, pred_keypoint_heatmaps [N, K, S, S] logits], {}).
        """
        self._check_inputs(images, features, self.box_in_features, proposals, targets)
        if self.training:
            proposals = self.label_and_sample_proposals(proposals, targets)
            losses = self._forward_box(features, proposals)
            losses.update(self._forward_mask(features, proposals))
            losses.update(self._forward_keypoint(features, proposals))
            return proposals, losses
        detections = self._forward_box(features, proposals)
        return self.forward_with_given_boxes(features, detections), {}

    def forward_with_given_boxes(self, features: Dict[str, Tensor], instances: List[Instances]) -> List[Instances]:
        """Eval only: add the mask branch's `pred_masks` and the keypoint branch's
        `pred_keypoint_heatmaps` to detections that have boxes and classes."""
        if self.training:
            raise RuntimeError("StandardROIHeads.forward_with_given_boxes is for eval mode only")
        return self._forward_keypoint(features, self._forward_mask(features, instances))

    def _forward_box(self, features: Dict[str, Tensor], proposals: List[Instances]):
        x = [features[f] for f in self.box_in_features]
        box_features = self.box_pooler(x, [p.proposal_boxes for p in proposals])
        predictions = self.box_predictor(self.box_head(box_features))
        if self.training:
            return self.box_predictor.losses(predictions, proposals)
        detections, _ = self.box_predictor.inference(predictions, proposals)
        return detections

    def _forward_mask(self, features: Dict[str, Tensor], instances: List[Instances]):
        if not self.mask_on:
            return {} if self.training else instances
        if self.training:
            # Masks are learned on the foreground ROIs only (background has no mask to learn).
            instances = select_foreground_proposals(instances, self.num_classes)
            boxes = [x.proposal_boxes for x in instances]
        else:
            boxes = [x.pred_boxes for x in instances]
        x = [features[f] for f in self.mask_in_features]
        return self.mask_head(self.mask_pooler(x, boxes), instances)

    def _forward_keypoint(self, features: Dict[str, Tensor], instances: List[Instances]):
        if not self.keypoint_on:
            return {} if self.training else instances
        if self.training:
            instances = select_foreground_proposals(instances, self.num_classes)
            if any(len(x) > 0 and not x.has("gt_keypoints") for x in instances):
                raise ValueError(
                    "StandardROIHeads: MODEL.KEYPOINT_ON needs gt_keypoints in the training targets; the "
                    "dataset must have keypoint annotations"
                )
            # Foreground ROIs that hold a labeled keypoint: the others contribute no loss.
            instances = select_proposals_with_visible_keypoints(instances)
            boxes = [x.proposal_boxes for x in instances]
        else:
            boxes = [x.pred_boxes for x in instances]
        x = [features[f] for f in self.keypoint_in_features]
        return self.keypoint_head(self.keypoint_pooler(x, boxes), instances)


def build_roi_heads(cfg, input_shape: Dict[str, ShapeSpec]) -> nn.Module:
    """Build the ROI heads named by cfg.MODEL.ROI_HEADS.NAME on features described by `input_shape`."""
    return ROI_HEADS_REGISTRY.build(cfg, input_shape)
