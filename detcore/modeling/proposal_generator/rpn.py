"""Region Proposal Network (Ren et al., 2015), with FPN levels (Lin et al., 2017).

Flow: anchors per level → head (objectness logits + deltas per anchor) →
  training: match anchors to ground truth (IoU), sample 256 per image, BCE + box regression loss;
  always: decode deltas, keep the top-k per level, clip, drop tiny boxes, NMS per level, keep
  the top-k per image. Proposals carry no gradient: the ROI heads treat them as fixed inputs.
"""
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn

from detcore.layers import batched_nms, trusted_inputs
from detcore.layers.shape_spec import ShapeSpec
from detcore.structures import Boxes, ImageList, Instances, pairwise_iou
from detcore.config.choices import BOX_REG_LOSS_TYPES, RPN_LOSS_NORMALIZERS, RPN_PROPOSAL_RANKINGS

from ..anchor_generator import build_anchor_generator
from ..box_regression import Box2BoxTransform, box_loss
from ..matcher import Matcher
from ..sampling import subsample_labels
from .build import PROPOSAL_GENERATOR_REGISTRY
from .rpn_head import build_rpn_head

__all__ = ["RPN", "find_top_rpn_proposals"]


def find_top_rpn_proposals(
    proposals: List[torch.Tensor],
    pred_objectness_logits: List[torch.Tensor],
    image_sizes: Sequence[Tuple[int, int]],
    nms_thresh: float,
    pre_nms_topk: int,
    post_nms_topk: int,
    min_box_size: float = 0.0,
    training: bool = False,
    ranking: str = "logit",
    legacy_plus_one: bool = False,
) -> List[Instances]:
    """Select each image's proposals.

    Args:
        proposals: per level, ``[B, Ri, 4]`` decoded boxes.
        pred_objectness_logits: per level, ``[B, Ri]``.
        image_sizes: ``(h, w)`` per image, for clipping.
        nms_thresh: IoU threshold of the NMS (run per level: levels never suppress each other).
        pre_nms_topk: boxes kept per level and image before NMS.
        post_nms_topk: boxes kept per image after NMS.
        min_box_size: boxes whose width or height is not above this are dropped.
        training: non-finite predictions raise in training (the model diverged) and are dropped
            at inference.
        ranking: what orders the boxes for the NMS and ``post_nms_topk``: "logit",
            "sigmoid" (the float32 probability: saturated logits tie, ties stay in level order) or
            "torchvision" (the probability, ties ordered as torchvision's batched_nms leaves them;
            see `_torchvision_order`). The per-level top-k always takes the largest logits.
        legacy_plus_one: clip as Detectron does (`detcore.structures.clip_limits`).

    Returns:
        one ``Instances`` per image with ``proposal_boxes`` (Boxes) and ``objectness_logits``,
        by decreasing rank.
    """
    if ranking not in RPN_PROPOSAL_RANKINGS:
        raise ValueError(f"find_top_rpn_proposals: ranking must be one of {list(RPN_PROPOSAL_RANKINGS)}, got {ranking!r}")
    num_images = len(image_sizes)
    if len(proposals) != len(pred_objectness_logits):
        raise ValueError(
            f"find_top_rpn_proposals: {len(proposals)} levels of proposals but "
            f"{len(pred_objectness_logits)} levels of logits"
        )
    device = proposals[0].device
    batch_idx = torch.arange(num_images, device=device)[:, None]

    # Top-k per level, for all images at once.
    top_boxes, top_scores, level_ids = [], [], []
    for level, (boxes_i, logits_i) in enumerate(zip(proposals, pred_objectness_logits)):
        k = min(pre_nms_topk, logits_i.shape[1])
        scores_i, idx = logits_i.topk(k, dim=1)  # sorted, [B, k]
        top_boxes.append(boxes_i[batch_idx, idx])
        top_scores.append(scores_i)
        level_ids.append(torch.full((k,), level, dtype=torch.int64, device=device))
    top_boxes = torch.cat(top_boxes, dim=1)
    top_scores = torch.cat(top_scores, dim=1)
    level_ids = torch.cat(level_ids, dim=0)

    results = []
    for n, image_size in enumerate(image_sizes):
        boxes, scores, lvl = top_boxes[n], top_scores[n], level_ids
        finite = torch.isfinite(boxes).all(dim=1) & torch.isfinite(scores)
        if training and not bool(finite.all()):
            raise FloatingPointError("RPN predicted non-finite boxes or objectness logits: training diverged")
        # Masked unconditionally (no data-dependent branch), so the path traces into one graph.
        boxes = Boxes(boxes).clip(image_size, legacy_plus_one)
        keep = finite & boxes.nonempty(threshold=min_box_size)
        boxes, scores, lvl = boxes[keep], scores[keep], lvl[keep]

        rank = scores if ranking == "logit" else torch.sigmoid(scores)
        with trusted_inputs():  # integer level ids: no value checks to skip, only its size sync
            keep = batched_nms(boxes.tensor, rank, lvl, nms_thresh)
        if ranking == "torchvision":
            keep = _torchvision_order(keep, rank, boxes.tensor)
        keep = keep[:post_nms_topk]
        results.append(Instances(image_size, proposal_boxes=boxes[keep], objectness_logits=scores[keep]))
    return results


def _torchvision_order(keep: torch.Tensor, scores: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
    """``keep`` (by decreasing score, ties by index) reordered as torchvision's batched_nms
    returns its survivors. For more than 4000 box coordinates on the CPU (100k on a GPU) it runs
    one NMS per level and sorts the survivors, taken in index order, with an unstable sort: boxes
    whose probabilities tie (saturated at 1.0) then come in the order that sort leaves them, which
    decides who passes the per-image top-k. The same sort call on the same values reproduces it;
    below the threshold (and when traced or exported) it runs one stable NMS, as ``keep`` already
    is: an exported graph keeps that order (no branch on a data-dependent count)."""
    if torch.jit.is_tracing() or torch.compiler.is_compiling():
        return keep
    if boxes.numel() <= (4000 if boxes.device.type == "cpu" else 100_000):
        return keep
    keep = keep.sort().values
    return keep[scores[keep].sort(descending=True)[1]]


@PROPOSAL_GENERATOR_REGISTRY.register()
class RPN(nn.Module):
    """Args:
        in_features: names of the feature maps the RPN reads (e.g. p2 ... p6).
        head: maps a list of feature maps to (objectness logits ``[B, A, H, W]``, deltas
            ``[B, A*4, H, W]``) per level.
        anchor_generator: gives per level ``Boxes`` of ``H * W * A`` anchors, location-major.
        anchor_matcher: labels anchors against ground truth (1 / 0 / -1).
        box2box_transform: anchor <-> box delta coding.
        batch_size_per_image: anchors sampled per image for the losses.
        positive_fraction: largest share of positives in that sample.
        pre_nms_topk: ``(train, test)`` boxes kept per level before NMS.
        post_nms_topk: ``(train, test)`` boxes kept per image after NMS.
        nms_thresh: IoU threshold of the proposal NMS.
        min_box_size: proposals with a side not above this (pixels) are dropped.
        anchor_boundary_thresh: anchors reaching more than this many pixels outside the image are
            ignored by the losses; negative keeps all.
        loss_weight: multiplier of both losses, or a dict with "loss_rpn_cls" / "loss_rpn_loc".
        box_reg_loss_type: "smooth_l1", "l1" or "giou".
        smooth_l1_beta: smooth L1 transition point (0 means L1).
        loss_normalizer: what both losses are divided by: "batch_size" (``batch_size_per_image *
            num_images``, Detectron) or "num_sampled" (the anchors actually sampled, torchvision).
        proposal_ranking: "logit", "sigmoid" or "torchvision" (see `find_top_rpn_proposals`).
        legacy_plus_one: clip proposals as Detectron does (MODEL.BOX_LEGACY_PLUS_ONE).
    """

    def __init__(
        self,
        *,
        in_features: Sequence[str],
        head: nn.Module,
        anchor_generator: nn.Module,
        anchor_matcher: Matcher,
        box2box_transform: Box2BoxTransform,
        batch_size_per_image: int,
        positive_fraction: float,
        pre_nms_topk: Tuple[int, int],
        post_nms_topk: Tuple[int, int],
        nms_thresh: float = 0.7,
        min_box_size: float = 0.0,
        anchor_boundary_thresh: float = -1.0,
        loss_weight: Union[float, Dict[str, float]] = 1.0,
        box_reg_loss_type: str = "smooth_l1",
        smooth_l1_beta: float = 0.0,
        loss_normalizer: str = "batch_size",
        proposal_ranking: str = "logit",
        legacy_plus_one: bool = False,
    ):
        super().__init__()
        self.in_features = list(in_features)
        self.rpn_head = head
        self.anchor_generator = anchor_generator
        self.anchor_matcher = anchor_matcher
        self.box2box_transform = box2box_transform
        self.batch_size_per_image = int(batch_size_per_image)
        self.positive_fraction = float(positive_fraction)
        if len(pre_nms_topk) != 2 or len(post_nms_topk) != 2:
            raise ValueError(
                f"RPN: pre_nms_topk and post_nms_topk must be (train, test) pairs, got {pre_nms_topk}, {post_nms_topk}"
            )
        # Keyed by self.training.
        self.pre_nms_topk = {True: int(pre_nms_topk[0]), False: int(pre_nms_topk[1])}
        self.post_nms_topk = {True: int(post_nms_topk[0]), False: int(post_nms_topk[1])}
        self.nms_thresh = float(nms_thresh)
        self.min_box_size = float(min_box_size)
        self.anchor_boundary_thresh = float(anchor_boundary_thresh)
        if isinstance(loss_weight, (int, float)):
            loss_weight = {"loss_rpn_cls": float(loss_weight), "loss_rpn_loc": float(loss_weight)}
        if set(loss_weight) != {"loss_rpn_cls", "loss_rpn_loc"}:
            raise ValueError(
                f"RPN: loss_weight dict needs keys loss_rpn_cls and loss_rpn_loc, got {sorted(loss_weight)}"
            )
        self.loss_weight = dict(loss_weight)
        if box_reg_loss_type not in BOX_REG_LOSS_TYPES:
            raise ValueError(f"RPN: box_reg_loss_type must be one of {list(BOX_REG_LOSS_TYPES)}, got {box_reg_loss_type!r}")
        self.box_reg_loss_type = box_reg_loss_type
        self.smooth_l1_beta = float(smooth_l1_beta)
        if loss_normalizer not in RPN_LOSS_NORMALIZERS:
            raise ValueError(f"RPN: loss_normalizer must be one of {list(RPN_LOSS_NORMALIZERS)}, got {loss_normalizer!r}")
        self.loss_normalizer = loss_normalizer
        if proposal_ranking not in RPN_PROPOSAL_RANKINGS:
            raise ValueError(
                f"RPN: proposal_ranking must be one of {list(RPN_PROPOSAL_RANKINGS)}, got {proposal_ranking!r}"
            )
        self.proposal_ranking = proposal_ranking
        self.legacy_plus_one = bool(legacy_plus_one)

    @classmethod
    def from_config(cls, cfg, input_shape: Dict[str, ShapeSpec]):
        rpn = cfg.MODEL.RPN
        missing = [f for f in rpn.IN_FEATURES if f not in input_shape]
        if missing:
            raise ValueError(
                f"RPN: MODEL.RPN.IN_FEATURES names {missing}, which the backbone does not output "
                f"(it has {sorted(input_shape)})"
            )
        shapes = [input_shape[f] for f in rpn.IN_FEATURES]
        return {
            "in_features": rpn.IN_FEATURES,
            "head": build_rpn_head(cfg, shapes),
            "anchor_generator": build_anchor_generator(cfg, shapes),
            "anchor_matcher": Matcher(
                rpn.IOU_THRESHOLDS, rpn.IOU_LABELS, allow_low_quality_matches=rpn.ALLOW_LOW_QUALITY_MATCHES
            ),
            "box2box_transform": Box2BoxTransform(weights=rpn.BBOX_REG_WEIGHTS),
            "batch_size_per_image": rpn.BATCH_SIZE_PER_IMAGE,
            "positive_fraction": rpn.POSITIVE_FRACTION,
            "pre_nms_topk": (rpn.PRE_NMS_TOPK_TRAIN, rpn.PRE_NMS_TOPK_TEST),
            "post_nms_topk": (rpn.POST_NMS_TOPK_TRAIN, rpn.POST_NMS_TOPK_TEST),
            "nms_thresh": rpn.NMS_THRESH,
            "min_box_size": rpn.MIN_SIZE,
            "anchor_boundary_thresh": rpn.BOUNDARY_THRESH,
            "loss_weight": rpn.LOSS_WEIGHT,
            "box_reg_loss_type": rpn.BBOX_REG_LOSS_TYPE,
            "smooth_l1_beta": rpn.SMOOTH_L1_BETA,
            "loss_normalizer": rpn.LOSS_NORMALIZER,
            "proposal_ranking": rpn.PROPOSAL_RANKING,
            "legacy_plus_one": cfg.MODEL.BOX_LEGACY_PLUS_ONE,
        }

    # --- training targets ---------------------------------------------------------------------
    @torch.no_grad()
    def label_and_sample_anchors(
        self, anchors: List[Boxes], gt_instances: List[Instances]
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """Returns ``gt_labels [B, R]`` (1 sampled positive, 0 sampled negative, -1 not used) and
        ``matched_gt_boxes [B, R, 4]`` over the R anchors of all levels concatenated."""
        anchors = Boxes.cat(anchors)
        gt_labels, matched_gt_boxes = [], []
        for inst in gt_instances:
            gt_boxes = inst.gt_boxes.to(anchors.device)
            iou = pairwise_iou(gt_boxes, anchors)
            if self.anchor_boundary_thresh >= 0:
                # Anchors far outside the image take no part, not even as some ground truth's
                # best anchor (so a box at the border still gets an inside anchor).
                inside = anchors.inside_box(inst.image_size, self.anchor_boundary_thresh)
                iou = torch.where(inside[None, :], iou, iou.new_full((), -1.0))
            matched_idxs, labels = self.anchor_matcher(iou)
            labels = labels.to(torch.int64)
            if self.anchor_boundary_thresh >= 0:
                labels[~inside] = -1
            labels = self._subsample(labels)
            gt_labels.append(labels)
            if len(gt_boxes) == 0:
                matched_gt_boxes.append(torch.zeros_like(anchors.tensor))
            else:
                matched_gt_boxes.append(gt_boxes.tensor[matched_idxs])
        return torch.stack(gt_labels), torch.stack(matched_gt_boxes)

    def _subsample(self, labels: torch.Tensor) -> torch.Tensor:
        pos_idx, neg_idx = subsample_labels(labels, self.batch_size_per_image, self.positive_fraction, 0)
        out = torch.full_like(labels, -1)
        out[pos_idx] = 1
        out[neg_idx] = 0
        return out

    def losses(
        self,
        anchors: List[Boxes],
        pred_objectness_logits: List[torch.Tensor],
        gt_labels: torch.Tensor,
        pred_anchor_deltas: List[torch.Tensor],
        matched_gt_boxes: torch.Tensor,
    ) -> Dict[str, torch.Tensor]:
        """Objectness BCE over sampled anchors and box regression over positive ones, both summed
        and divided by ``batch_size_per_image * num_images`` (as Detectron: a steady normalizer
        however many positives an image happens to have), or by the number of sampled anchors
        with ``loss_normalizer="num_sampled"`` (torchvision)."""
        num_images = gt_labels.shape[0]
        anchors = Boxes.cat(anchors).tensor
        logits = torch.cat(pred_objectness_logits, dim=1)  # [B, R]
        deltas = torch.cat(pred_anchor_deltas, dim=1)  # [B, R, 4]

        positive = gt_labels == 1
        valid = gt_labels >= 0
        pos_anchors = anchors[None].expand(num_images, -1, -1)[positive]
        pos_deltas = deltas[positive]
        pos_gt = matched_gt_boxes[positive]
        loss_loc = box_loss(
            self.box2box_transform, pos_anchors, pos_deltas, pos_gt, self.box_reg_loss_type, self.smooth_l1_beta
        )

        loss_cls = F.binary_cross_entropy_with_logits(
            logits[valid], gt_labels[valid].to(logits.dtype), reduction="sum"
        )
        if self.loss_normalizer == "num_sampled":
            normalizer = valid.sum().clamp(min=1).to(logits.dtype)  # a tensor: no host sync
        else:
            normalizer = self.batch_size_per_image * num_images
        return {
            "loss_rpn_cls": loss_cls / normalizer * self.loss_weight["loss_rpn_cls"],
            "loss_rpn_loc": loss_loc / normalizer * self.loss_weight["loss_rpn_loc"],
        }

    # --- forward ------------------------------------------------------------------------------
    def forward(
        self,
        images: ImageList,
        features: Dict[str, torch.Tensor],
        gt_instances: Optional[List[Instances]] = None,
    ) -> Tuple[List[Instances], Dict[str, torch.Tensor]]:
        """Returns per-image proposals (``proposal_boxes``, ``objectness_logits``, sorted by
        objectness, detached) and a dict of losses (empty unless training)."""
        missing = [f for f in self.in_features if f not in features]
        if missing:
            raise KeyError(f"RPN: features lacks {missing}; got {sorted(features)}")
        feats = [features[f] for f in self.in_features]
        num_images = len(images)
        for name, f in zip(self.in_features, feats):
            if f.dim() != 4 or f.shape[0] != num_images:
                raise ValueError(f"RPN: features['{name}'] must be [{num_images}, C, H, W], got {tuple(f.shape)}")

        if getattr(self.anchor_generator, "strides_from_image_size", False):
            anchors = self.anchor_generator(feats, image_size=tuple(images.tensor.shape[-2:]))
        else:
            anchors = self.anchor_generator(feats)
        logits, deltas = self.rpn_head(feats)
        # [B, A, H, W] -> [B, H*W*A]: location-major, matching the anchors' order. float32 so that
        # losses, box decoding and NMS stay in full precision under AMP.
        logits = [x.permute(0, 2, 3, 1).flatten(1).float() for x in logits]
        # [B, A*4, H, W] -> [B, H*W*A, 4].
        deltas = [
            x.view(x.shape[0], -1, 4, x.shape[-2], x.shape[-1]).permute(0, 3, 4, 1, 2).flatten(1, -2).float()
            for x in deltas
        ]

        losses = {}
        if self.training:
            if gt_instances is None:
                raise ValueError("RPN: gt_instances is required in training mode")
            if len(gt_instances) != num_images:
                raise ValueError(f"RPN: got {len(gt_instances)} gt_instances for {num_images} images")
            gt_labels, matched_gt_boxes = self.label_and_sample_anchors(anchors, gt_instances)
            losses = self.losses(anchors, logits, gt_labels, deltas, matched_gt_boxes)

        proposals = self.predict_proposals(anchors, logits, deltas, images.image_sizes)
        return proposals, losses

    @torch.no_grad()
    def predict_proposals(
        self,
        anchors: List[Boxes],
        pred_objectness_logits: List[torch.Tensor],
        pred_anchor_deltas: List[torch.Tensor],
        image_sizes: Sequence[Tuple[int, int]],
    ) -> List[Instances]:
        # no_grad: proposals are fixed inputs of the ROI heads (approximate joint training).
        proposals = self._decode_proposals(anchors, pred_anchor_deltas)
        return find_top_rpn_proposals(
            proposals,
            pred_objectness_logits,
            image_sizes,
            self.nms_thresh,
            self.pre_nms_topk[self.training],
            self.post_nms_topk[self.training],
            self.min_box_size,
            self.training,
            self.proposal_ranking,
            self.legacy_plus_one,
        )

    def _decode_proposals(self, anchors: List[Boxes], pred_anchor_deltas: List[torch.Tensor]) -> List[torch.Tensor]:
        """Per level ``[B, Ri, 4]`` boxes from ``[B, Ri, 4]`` deltas."""
        out = []
        for anchors_i, deltas_i in zip(anchors, pred_anchor_deltas):
            num_images = deltas_i.shape[0]
            a = anchors_i.tensor[None].expand(num_images, -1, -1).reshape(-1, 4)
            boxes = self.box2box_transform.apply_deltas(deltas_i.reshape(-1, 4), a)
            out.append(boxes.view(num_images, -1, 4))
        return out
