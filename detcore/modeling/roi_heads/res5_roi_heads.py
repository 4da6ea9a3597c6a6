"""The ROI heads of a C4 detector (He et al., ResNet paper, appendix A; Faster / Mask R-CNN "C4"):
the backbone stops at res4 (stride 16), and the res5 stage runs per ROI as the box head.

Each ROI is pooled by ROIAlign from res4 (14×14 by default), res5 (stride 2 on its first block)
turns it into a 7×7 map, its average is the box predictor's input, and the mask head (a deconv
and a 1×1 conv, MODEL.ROI_MASK_HEAD.NUM_CONV 0) predicts masks from the same 7×7 map, at twice
its size (14×14), as detectron2's and maskrcnn-benchmark's C4 models do. Boxes and masks share
the pooling and res5: in training the mask branch takes the foreground rows of the box branch's
features; at test, the detections are pooled and run through res5 once more.

Module names follow detectron2 (`pooler`, `res5`, `box_predictor`, `mask_head`), so its C4
checkpoints load with the ResNet renaming of resnet.py.
"""
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor, nn

from detcore.layers import ShapeSpec
from detcore.structures import Boxes, ImageList, Instances

from ..backbone.resnet import init_resnet_weights, make_stage
from ..poolers import ROIPooler
from .fast_rcnn import build_box_predictor
from .mask_head import build_mask_head
from .roi_heads import ROI_HEADS_REGISTRY, ROIHeads

__all__ = ["Res5ROIHeads"]

_RES5 = 3  # stage index of res5 in make_stage (res2 is 0)


@ROI_HEADS_REGISTRY.register()
class Res5ROIHeads(ROIHeads):
    """Args:
        in_features: the one feature map the ROIs are pooled from (res4).
        pooler: single-level ROIPooler on it.
        res5: the per-ROI stage; maps pooled [R, C, S, S] to [R, D, S/2, S/2].
        box_predictor: takes the [R, D] average of res5's output.
        mask_head: None, or a mask head taking res5's [R, D, S/2, S/2] output.
        num_classes, batch_size_per_image, positive_fraction, proposal_matcher,
            proposal_append_gt: the sampling of training ROIs (see ROIHeads).
    """

    def __init__(
        self,
        *,
        in_features: Sequence[str],
        pooler: ROIPooler,
        res5: nn.Module,
        box_predictor: nn.Module,
        num_classes: int,
        batch_size_per_image: int,
        positive_fraction: float,
        proposal_matcher,
        proposal_append_gt: bool = True,
        mask_head: Optional[nn.Module] = None,
    ):
        super().__init__(
            num_classes=num_classes,
            batch_size_per_image=batch_size_per_image,
            positive_fraction=positive_fraction,
            proposal_matcher=proposal_matcher,
            proposal_append_gt=proposal_append_gt,
        )
        in_features = list(in_features)
        if len(in_features) != 1:
            raise ValueError(f"Res5ROIHeads: pools from one feature map (res4), got in_features {in_features}")
        if len(pooler.scales) != 1:
            raise ValueError(f"Res5ROIHeads: the pooler must have one scale (1/stride of res4), got {pooler.scales}")
        self.in_features = in_features
        self.pooler = pooler
        self.res5 = res5
        self.box_predictor = box_predictor
        self.mask_on = mask_head is not None
        if self.mask_on:
            self.mask_head = mask_head

    @classmethod
    def from_config(cls, cfg, input_shape: Dict[str, ShapeSpec]):
        in_features = list(cfg.MODEL.ROI_HEADS.IN_FEATURES)
        if len(in_features) != 1 or in_features[0] not in input_shape:
            raise ValueError(
                f"Res5ROIHeads: MODEL.ROI_HEADS.IN_FEATURES must name one backbone output (res4 for a C4 "
                f"model), got {in_features}; the backbone has {sorted(input_shape)}"
            )
        feature = input_shape[in_features[0]]
        if cfg.MODEL.KEYPOINT_ON:
            # As in detectron2: the keypoint head pools its own 14 x 14 maps from FPN levels.
            raise ValueError(
                "Res5ROIHeads: MODEL.KEYPOINT_ON has no C4 keypoint branch; use StandardROIHeads on an "
                "FPN backbone (MODEL.ROI_HEADS.NAME: StandardROIHeads)"
            )
        box, mask, r = cfg.MODEL.ROI_BOX_HEAD, cfg.MODEL.ROI_MASK_HEAD, cfg.MODEL.RESNETS
        if r.RES5_DILATION != 1:
            raise ValueError(
                "Res5ROIHeads: the res5 head downsamples by 2 on its first block; MODEL.RESNETS.RES5_DILATION "
                f"must be 1, got {r.RES5_DILATION}"
            )
        if cfg.MODEL.MASK_ON:
            # One pooling serves both branches: a mask pooler of its own would be ignored.
            for key in ("POOLER_RESOLUTION", "POOLER_SAMPLING_RATIO", "POOLER_ALIGNED"):
                if mask[key] != box[key]:
                    raise ValueError(
                        f"Res5ROIHeads: boxes and masks share one pooling, so MODEL.ROI_MASK_HEAD.{key} "
                        f"({mask[key]}) must equal MODEL.ROI_BOX_HEAD.{key} ({box[key]})"
                    )
        res = box.POOLER_RESOLUTION
        if res % 2:
            raise ValueError(
                f"Res5ROIHeads: res5 halves the pooled grid, so MODEL.ROI_BOX_HEAD.POOLER_RESOLUTION must be "
                f"even, got {res}"
            )
        res5, out_channels = make_stage(
            r.DEPTH,
            _RES5,
            feature.channels,
            first_stride=2,
            num_groups=r.NUM_GROUPS,
            width_per_group=r.WIDTH_PER_GROUP,
            res2_out_channels=r.RES2_OUT_CHANNELS,
            stride_in_1x1=r.STRIDE_IN_1X1,
            norm=r.NORM,
            deform=r.DEFORM_ON_PER_STAGE[_RES5],
            deform_modulated=r.DEFORM_MODULATED,
            deform_num_groups=r.DEFORM_NUM_GROUPS,
        )
        init_resnet_weights(res5)
        kwargs = super().from_config(cfg, input_shape)
        kwargs.update({
            "in_features": in_features,
            "pooler": ROIPooler(
                output_size=res,
                scales=(1.0 / feature.stride,),
                sampling_ratio=box.POOLER_SAMPLING_RATIO,
                aligned=box.POOLER_ALIGNED,
                legacy_plus_one=cfg.MODEL.BOX_LEGACY_PLUS_ONE,
            ),
            "res5": res5,
            "box_predictor": build_box_predictor(cfg, ShapeSpec(channels=out_channels)),
        })
        if cfg.MODEL.MASK_ON:
            kwargs["mask_head"] = build_mask_head(cfg, ShapeSpec(channels=out_channels, height=res // 2, width=res // 2))
        return kwargs

    def _shared_roi_transform(self, features: Dict[str, Tensor], boxes: List[Boxes]) -> Tensor:
        """Pooled ROIs through res5: [R, D, S/2, S/2]."""
        return self.res5(self.pooler([features[f] for f in self.in_features], boxes))

    def forward(
        self,
        images: ImageList,
        features: Dict[str, Tensor],
        proposals: List[Instances],
        targets: Optional[List[Instances]] = None,
    ) -> Tuple[List[Instances], Dict[str, Tensor]]:
        """As StandardROIHeads.forward: training returns (sampled proposals, losses loss_cls,
        loss_box_reg[, loss_mask]); eval returns (detections with pred_boxes, scores,
        pred_classes[, pred_masks [N, 1, M, M] probabilities], {})."""
        self._check_inputs(images, features, self.in_features, proposals, targets)
        if self.training:
            proposals = self.label_and_sample_proposals(proposals, targets)
        box_features = self._shared_roi_transform(features, [p.proposal_boxes for p in proposals])
        predictions = self.box_predictor(box_features.mean(dim=(2, 3)))
        if not self.training:
            detections, _ = self.box_predictor.inference(predictions, proposals)
            return self.forward_with_given_boxes(features, detections), {}

        losses = self.box_predictor.losses(predictions, proposals)
        if self.mask_on:
            # Masks are learned on the foreground ROIs, whose res5 features are already computed.
            foreground = [(p.gt_classes >= 0) & (p.gt_classes != self.num_classes) for p in proposals]
            mask_features = box_features[torch.cat(foreground)]
            losses.update(self.mask_head(mask_features, [p[fg] for p, fg in zip(proposals, foreground)]))
        return proposals, losses

    def forward_with_given_boxes(self, features: Dict[str, Tensor], instances: List[Instances]) -> List[Instances]:
        """Eval only: add the mask branch's `pred_masks` to detections that have boxes and classes."""
        if self.training:
            raise RuntimeError("Res5ROIHeads.forward_with_given_boxes is for eval mode only")
        if not self.mask_on:
            return instances
        return self.mask_head(self._shared_roi_transform(features, [x.pred_boxes for x in instances]), instances)
