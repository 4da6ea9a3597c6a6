"""ROI heads: per-ROI box classification/regression, masks and keypoints (the second stage of
Mask / Keypoint R-CNN)."""
from .box_head import ROI_BOX_HEAD_REGISTRY, FastRCNNConvFCHead, build_box_head
from .fast_rcnn import (
    ROI_BOX_PREDICTOR_REGISTRY,
    FastRCNNOutputLayers,
    build_box_predictor,
    fast_rcnn_inference,
)
from .keypoint_head import (
    ROI_KEYPOINT_HEAD_REGISTRY,
    KRCNNConvDeconvUpsampleHead,
    build_keypoint_head,
    keypoint_rcnn_inference,
    keypoint_rcnn_loss,
)
from .mask_head import (
    ROI_MASK_HEAD_REGISTRY,
    MaskRCNNConvUpsampleHead,
    build_mask_head,
    mask_rcnn_inference,
    mask_rcnn_loss,
)
from .res5_roi_heads import Res5ROIHeads
from .roi_heads import (
    ROI_HEADS_REGISTRY,
    ROIHeads,
    StandardROIHeads,
    add_ground_truth_to_proposals,
    build_roi_heads,
    select_foreground_proposals,
    select_proposals_with_visible_keypoints,
)

__all__ = [
    "ROI_HEADS_REGISTRY",
    "ROI_BOX_HEAD_REGISTRY",
    "ROI_BOX_PREDICTOR_REGISTRY",
    "ROI_MASK_HEAD_REGISTRY",
    "ROI_KEYPOINT_HEAD_REGISTRY",
    "ROIHeads",
    "Res5ROIHeads",
    "StandardROIHeads",
    "FastRCNNConvFCHead",
    "FastRCNNOutputLayers",
    "MaskRCNNConvUpsampleHead",
    "KRCNNConvDeconvUpsampleHead",
    "build_roi_heads",
    "build_box_head",
    "build_box_predictor",
    "build_mask_head",
    "build_keypoint_head",
    "fast_rcnn_inference",
    "mask_rcnn_loss",
    "mask_rcnn_inference",
    "keypoint_rcnn_loss",
    "keypoint_rcnn_inference",
    "add_ground_truth_to_proposals",
    "select_foreground_proposals",
    "select_proposals_with_visible_keypoints",
]
