"""RetinaNet (Lin et al., "Focal Loss for Dense Object Detection", 2017): one stage, no proposals.

Flow: backbone (ResNet + FPN P3-P7) → anchors per level (3 sizes × 3 ratios) and the shared
head (K class logits and 4 deltas per anchor) →
  training: match anchors to ground truth (IoU < 0.4 background, >= 0.5 foreground, in between
  ignored), sigmoid focal loss over all non-ignored anchors and classes, box loss over the
  foreground ones, both divided by the number of foreground anchors;
  inference: per level the top-k (anchor, class) scores above the threshold, decoded; then a
  per-class NMS over all levels and the best detections per image.

Every anchor and every class takes part in the loss (no sampling): the focal loss's
``(1 - p_t) ** gamma`` is what keeps the ~100k easy background anchors from swamping it.
"""
from typing import Dict, List, Sequence, Tuple

import torch
from torch import Tensor, nn

from detcore.config.choices import BOX_REG_LOSS_TYPES, RETINANET_LOSS_NORMALIZERS
from detcore import layers
from detcore.layers import batched_nms, trusted_inputs
from detcore.structures import Boxes, ImageList, Instances, pairwise_iou
from detcore.utils.registry import build_from_config

from ..anchor_generator import build_anchor_generator
from ..backbone import Backbone, build_backbone
from ..box_regression import Box2BoxTransform, box_loss
from ..matcher import Matcher
from ..dense_heads import RetinaNetHead
from .base import DetectorBase
from .build import META_ARCH_REGISTRY

__all__ = ["RetinaNet"]

# detectron2's moving average of the loss normalizer: its start and momentum.
_NORMALIZER_START = 100.0
_NORMALIZER_MOMENTUM = 0.9


@META_ARCH_REGISTRY.register()
class RetinaNet(DetectorBase):
    """Args:
        backbone: a Backbone whose outputs include ``head_in_features``.
        head: maps the list of those feature maps to (class logits ``[B, A*K, H, W]``, deltas
            ``[B, A*4, H, W]``) per level.
        head_in_features: names of the feature maps the head and the anchors use, finest first.
        anchor_generator: per level ``Boxes`` of ``H * W * A`` anchors, location-major.
        box2box_transform: anchor <-> box delta coding.
        anchor_matcher: labels anchors against ground truth (1 / 0 / -1).
        num_classes: K.
        focal_loss_alpha, focal_loss_gamma: the focal loss's alpha and gamma.
        box_reg_loss_type: "smooth_l1", "l1" or "giou".
        smooth_l1_beta: smooth L1 transition point (0 means L1).
        loss_normalizer: "num_foreground" (the paper), "moving_average" (detectron2) or
            "per_image" (torchvision); see MODEL.RETINANET.LOSS_NORMALIZER.
        test_score_thresh: (anchor, class) pairs scoring above this are candidates at test.
        test_topk_candidates: candidates kept per level (the best scores).
        test_nms_thresh: IoU threshold of the per-class NMS.
        max_detections_per_image: detections kept per image after the NMS.
        clip_before_nms: clip boxes to the image before the NMS (torchvision) instead of after
            (detectron2). Results are clipped either way.
        pixel_mean, pixel_std, input_format, size_divisibility, channels_last: see DetectorBase.
    """

    def __init__(
        self,
        *,
        backbone: Backbone,
        head: nn.Module,
        head_in_features: Sequence[str],
        anchor_generator: nn.Module,
        box2box_transform: Box2BoxTransform,
        anchor_matcher: Matcher,
        num_classes: int,
        pixel_mean: Sequence[float],
        pixel_std: Sequence[float],
        focal_loss_alpha: float = 0.25,
        focal_loss_gamma: float = 2.0,
        box_reg_loss_type: str = "smooth_l1",
        smooth_l1_beta: float = 0.0,
        loss_normalizer: str = "num_foreground",
        test_score_thresh: float = 0.05,
        test_topk_candidates: int = 1000,
        test_nms_thresh: float = 0.5,
        max_detections_per_image: int = 100,
        clip_before_nms: bool = False,
        input_format: str = "BGR",
        size_divisibility: int = 0,
        channels_last: bool = False,
    ):
        super().__init__(
            backbone=backbone,
            pixel_mean=pixel_mean,
            pixel_std=pixel_std,
            input_format=input_format,
            size_divisibility=size_divisibility,
            channels_last=channels_last,
            head=head,
            anchor_generator=anchor_generator,
        )
        self.head_in_features = list(head_in_features)
        missing = [f for f in self.head_in_features if f not in backbone.output_shape()]
        if not self.head_in_features or missing:
            raise ValueError(
                f"RetinaNet: head_in_features {self.head_in_features} must be outputs of the backbone "
                f"{list(backbone.output_shape())}"
            )
        self.box2box_transform = box2box_transform
        self.anchor_matcher = anchor_matcher
        if num_classes < 1:
            raise ValueError(f"RetinaNet: num_classes must be >= 1, got {num_classes}")
        self.num_classes = int(num_classes)
        self.focal_loss_alpha = float(focal_loss_alpha)
        self.focal_loss_gamma = float(focal_loss_gamma)
        if box_reg_loss_type not in BOX_REG_LOSS_TYPES:
            raise ValueError(
                f"RetinaNet: box_reg_loss_type must be one of {list(BOX_REG_LOSS_TYPES)}, got {box_reg_loss_type!r}"
            )
        self.box_reg_loss_type = box_reg_loss_type
        self.smooth_l1_beta = float(smooth_l1_beta)
        if loss_normalizer not in RETINANET_LOSS_NORMALIZERS:
            raise ValueError(
                f"RetinaNet: loss_normalizer must be one of {list(RETINANET_LOSS_NORMALIZERS)}, got {loss_normalizer!r}"
            )
        self.loss_normalizer = loss_normalizer
        # The moving average (a float, as in detectron2: it restarts from 100 with the process).
        self.moving_normalizer = _NORMALIZER_START
        self.test_score_thresh = float(test_score_thresh)
        self.test_topk_candidates = int(test_topk_candidates)
        self.test_nms_thresh = float(test_nms_thresh)
        self.max_detections_per_image = int(max_detections_per_image)
        self.clip_before_nms = bool(clip_before_nms)

    @classmethod
    def from_config(cls, cfg):
        r = cfg.MODEL.RETINANET
        if cfg.MODEL.MASK_ON:
            raise ValueError("RetinaNet predicts boxes only: set MODEL.MASK_ON False")
        backbone = build_backbone(cfg)
        shapes = backbone.output_shape()
        missing = [f for f in r.IN_FEATURES if f not in shapes]
        if missing:
            raise ValueError(
                f"RetinaNet: MODEL.RETINANET.IN_FEATURES names {missing}, which the backbone does not output "
                f"(it has {sorted(shapes)}; MODEL.FPN.TOP_BLOCK 'p6p7' adds p6 and p7)"
            )
        feature_shapes = [shapes[f] for f in r.IN_FEATURES]
        return {
            "backbone": backbone,
            "head": build_from_config(RetinaNetHead, cfg, feature_shapes),
            "head_in_features": r.IN_FEATURES,
            "anchor_generator": build_anchor_generator(cfg, feature_shapes),
            "box2box_transform": Box2BoxTransform(weights=r.BBOX_REG_WEIGHTS),
            "anchor_matcher": Matcher(r.IOU_THRESHOLDS, r.IOU_LABELS, allow_low_quality_matches=r.ALLOW_LOW_QUALITY_MATCHES),
            "num_classes": r.NUM_CLASSES,
            "focal_loss_alpha": r.FOCAL_LOSS_ALPHA,
            "focal_loss_gamma": r.FOCAL_LOSS_GAMMA,
            "box_reg_loss_type": r.BBOX_REG_LOSS_TYPE,
            "smooth_l1_beta": r.SMOOTH_L1_LOSS_BETA,
            "loss_normalizer": r.LOSS_NORMALIZER,
            "test_score_thresh": r.SCORE_THRESH_TEST,
            "test_topk_candidates": r.TOPK_CANDIDATES_TEST,
            "test_nms_thresh": r.NMS_THRESH_TEST,
            "max_detections_per_image": cfg.TEST.DETECTIONS_PER_IMAGE,
            "clip_before_nms": r.CLIP_BEFORE_NMS,
            **cls.input_settings(cfg),
        }

    # --- the network ------------------------------------------------------------------------------
    def predict(self, images: ImageList, features: Dict[str, Tensor]) -> Tuple[List[Boxes], List[Tensor], List[Tensor]]:
        """Anchors per level, and per level the class logits ``[B, Hi*Wi*A, K]`` and deltas
        ``[B, Hi*Wi*A, 4]`` in the anchors' (location-major) order, in float32 at least."""
        feats = [features[f] for f in self.head_in_features]
        if getattr(self.anchor_generator, "strides_from_image_size", False):
            anchors = self.anchor_generator(feats, image_size=tuple(images.tensor.shape[-2:]))
        else:
            anchors = self.anchor_generator(feats)
        logits, deltas = self.head(feats)
        # [B, A*K, H, W] -> [B, H, W, A*K] -> [B, H*W*A, K]: a free view for channels-last maps.
        # float32 so that the losses, decoding and NMS stay in full precision under AMP.
        logits = [_to_rows(x, self.num_classes) for x in logits]
        deltas = [_to_rows(x, 4) for x in deltas]
        return anchors, logits, deltas

    def forward(self, batched_inputs: List[Dict]):
        if not self.training:
            return self.inference(batched_inputs)
        gt_instances = self.gt_instances(batched_inputs)
        images = self.preprocess_image(batched_inputs)
        anchors, logits, deltas = self.predict(images, self.backbone(images.tensor))
        gt_labels, gt_boxes = self.label_anchors(anchors, gt_instances)
        return self.losses(anchors, logits, gt_labels, deltas, gt_boxes)

    # --- training ---------------------------------------------------------------------------------
    @torch.no_grad()
    def label_anchors(self, anchors: List[Boxes], gt_instances: List[Instances]) -> Tuple[Tensor, Tensor]:
        """Returns ``gt_labels [B, R]`` (a class in ``[0, K)`` for foreground, K for background,
        -1 for ignored) and ``gt_boxes [B, R, 4]`` (each anchor's matched box) over the R anchors
        of all levels."""
        anchors = Boxes.cat(anchors)
        labels, boxes = [], []
        for i, inst in enumerate(gt_instances):
            if not inst.has("gt_boxes") or not inst.has("gt_classes"):
                raise ValueError(f"RetinaNet: gt_instances[{i}] needs gt_boxes and gt_classes")
            gt_boxes = inst.gt_boxes.to(anchors.device)
            gt_classes = inst.gt_classes.to(anchors.device)
            if len(gt_boxes) and not (0 <= int(gt_classes.min()) and int(gt_classes.max()) < self.num_classes):
                raise ValueError(
                    f"RetinaNet: gt_instances[{i}].gt_classes must lie in [0, {self.num_classes}) "
                    f"(MODEL.RETINANET.NUM_CLASSES), got {gt_classes.tolist()}"
                )
            matched_idxs, match_labels = self.anchor_matcher(pairwise_iou(gt_boxes, anchors))
            if len(gt_boxes) == 0:
                labels.append(torch.full_like(matched_idxs, self.num_classes))
                boxes.append(torch.zeros_like(anchors.tensor))
                continue
            image_labels = gt_classes[matched_idxs]
            image_labels[match_labels == 0] = self.num_classes
            image_labels[match_labels == -1] = -1
            labels.append(image_labels)
            boxes.append(gt_boxes.tensor[matched_idxs])
        return torch.stack(labels), torch.stack(boxes)

    def losses(
        self,
        anchors: List[Boxes],
        pred_logits: List[Tensor],
        gt_labels: Tensor,
        pred_deltas: List[Tensor],
        gt_boxes: Tensor,
    ) -> Dict[str, Tensor]:
        """Sigmoid focal loss over every non-ignored anchor and class, box loss over the
        foreground anchors, both summed and divided as ``loss_normalizer`` says."""
        num_images = gt_labels.shape[0]
        anchors = Boxes.cat(anchors).tensor
        deltas = torch.cat(pred_deltas, dim=1)  # [B, R, 4]
        foreground = (gt_labels >= 0) & (gt_labels != self.num_classes)
        # The class loss reads each level's logits in place: concatenating, gathering the
        # non-ignored anchors and one-hot targets would each copy [B, R, K] (70 MB per image).
        with trusted_inputs():  # labels from the matcher: no value checks of targets on a GPU
            cls_losses = layers.sigmoid_focal_loss_per_image(
                pred_logits, gt_labels, self.focal_loss_alpha, self.focal_loss_gamma
            )  # [B]
        box_losses = []
        for i in range(num_images):
            fg = foreground[i]
            box_losses.append(
                box_loss(
                    self.box2box_transform, anchors[fg], deltas[i][fg], gt_boxes[i][fg],
                    self.box_reg_loss_type, self.smooth_l1_beta,
                )
            )
        num_foreground = foreground.sum(dim=1)  # [B]
        if self.loss_normalizer == "per_image":
            weights = 1.0 / (num_foreground.clamp(min=1).to(cls_losses.dtype) * num_images)
            loss_cls = (cls_losses * weights).sum()
            loss_box = (torch.stack(box_losses) * weights).sum()
        else:
            if self.loss_normalizer == "moving_average":
                if self.training:
                    count = max(int(num_foreground.sum()), 1)
                    self.moving_normalizer = (
                        _NORMALIZER_MOMENTUM * self.moving_normalizer + (1 - _NORMALIZER_MOMENTUM) * count
                    )
                normalizer = self.moving_normalizer
            else:
                normalizer = num_foreground.sum().clamp(min=1).to(cls_losses.dtype)  # a tensor: no host sync
            loss_cls = cls_losses.sum() / normalizer
            loss_box = torch.stack(box_losses).sum() / normalizer
        return {"loss_cls": loss_cls, "loss_box_reg": loss_box}

    # --- inference --------------------------------------------------------------------------------
    def _inference_batch(self, batched_inputs: List[Dict], do_postprocess: bool) -> List:
        images = self.preprocess_image(batched_inputs)
        anchors, logits, deltas = self.predict(images, self.backbone(images.tensor))
        results = self.detect(images, anchors, logits, deltas)
        if not do_postprocess:
            return results
        return self.postprocess(results, batched_inputs)

    def detect(self, images: ImageList, anchors: List[Boxes], logits: List[Tensor], deltas: List[Tensor]) -> List[Instances]:
        """Per image of the batch, its detections (see ``inference_single_image``)."""
        return [
            self.inference_single_image(anchors, [x[i] for x in logits], [x[i] for x in deltas], image_size)
            for i, image_size in enumerate(images.image_sizes)
        ]

    def inference_single_image(
        self,
        anchors: List[Boxes],
        logits: List[Tensor],
        deltas: List[Tensor],
        image_size: Tuple[int, int],
    ) -> Instances:
        """One image's detections from per level ``logits [Ri, K]`` and ``deltas [Ri, 4]``:
        ``pred_boxes`` (clipped to ``image_size``), ``scores``, ``pred_classes``, by decreasing
        score."""
        boxes_all, scores_all, classes_all = [], [], []
        for anchors_i, logits_i, deltas_i in zip(anchors, logits, deltas):
            scores = logits_i.flatten().sigmoid()
            # The top k of all scores, then those above the threshold: the same set as the top k
            # of the scores above the threshold (detectron2, torchvision), with a size that does
            # not depend on the data, so the path traces into one graph.
            k = min(self.test_topk_candidates, scores.shape[0])
            scores, indices = scores.topk(k)
            keep = scores > self.test_score_thresh
            scores, indices = scores[keep], indices[keep]
            anchor_idx = torch.div(indices, self.num_classes, rounding_mode="floor")
            boxes = self.box2box_transform.apply_deltas(deltas_i[anchor_idx], anchors_i.tensor[anchor_idx])
            boxes_all.append(boxes)
            scores_all.append(scores)
            classes_all.append(indices % self.num_classes)
        boxes, scores, classes = torch.cat(boxes_all), torch.cat(scores_all), torch.cat(classes_all)
        # A diverged model can decode non-finite boxes; NMS must not see them (masked always: one graph).
        finite = torch.isfinite(boxes).all(dim=1)
        boxes, scores, classes = boxes[finite], scores[finite], classes[finite]
        if self.clip_before_nms:
            boxes = Boxes(boxes).clip(image_size).tensor
        with trusted_inputs():  # integer class ids: no value checks to skip, only its size sync
            keep = batched_nms(boxes, scores, classes, self.test_nms_thresh)[: self.max_detections_per_image]
        boxes = Boxes(boxes[keep])
        if not self.clip_before_nms:
            boxes.clip(image_size)
        return Instances(image_size, pred_boxes=boxes, scores=scores[keep], pred_classes=classes[keep])


def _to_rows(x: Tensor, width: int) -> Tensor:
    """``[B, A*width, H, W]`` → ``[B, H*W*A, width]``, in float32 at least."""
    x = x.permute(0, 2, 3, 1).reshape(x.shape[0], -1, width)
    return x.to(torch.promote_types(x.dtype, torch.float32))
