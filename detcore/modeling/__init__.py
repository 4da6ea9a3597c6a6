"""Model components, each kind behind a registry, and the builder of the whole model."""
from .anchor_generator import ANCHOR_GENERATOR_REGISTRY, build_anchor_generator
from .backbone import BACKBONE_REGISTRY, build_backbone
from .box_regression import Box2BoxTransform
from .matcher import Matcher
from .meta_arch import META_ARCH_REGISTRY, DetectorBase, GeneralizedRCNN, ProposalNetwork, RetinaNet, build_model
from .poolers import ROIPooler
from .dense_heads import RetinaNetHead
from .proposal_generator import PROPOSAL_GENERATOR_REGISTRY, RPN, RPN_HEAD_REGISTRY, build_proposal_generator
from .roi_heads import (
    ROI_BOX_HEAD_REGISTRY,
    ROI_BOX_PREDICTOR_REGISTRY,
    ROI_HEADS_REGISTRY,
    ROI_KEYPOINT_HEAD_REGISTRY,
    ROI_MASK_HEAD_REGISTRY,
    Res5ROIHeads,
    StandardROIHeads,
    build_roi_heads,
)
from .sampling import subsample_labels
from .tta import GeneralizedRCNNWithTTA

__all__ = [
    "ANCHOR_GENERATOR_REGISTRY",
    "BACKBONE_REGISTRY",
    "META_ARCH_REGISTRY",
    "PROPOSAL_GENERATOR_REGISTRY",
    "RPN_HEAD_REGISTRY",
    "ROI_HEADS_REGISTRY",
    "ROI_BOX_HEAD_REGISTRY",
    "ROI_BOX_PREDICTOR_REGISTRY",
    "ROI_MASK_HEAD_REGISTRY",
    "ROI_KEYPOINT_HEAD_REGISTRY",
    "Box2BoxTransform",
    "DetectorBase",
    "GeneralizedRCNN",
    "GeneralizedRCNNWithTTA",
    "Matcher",
    "ProposalNetwork",
    "RPN",
    "ROIPooler",
    "RetinaNet",
    "RetinaNetHead",
    "Res5ROIHeads",
    "StandardROIHeads",
    "build_anchor_generator",
    "build_backbone",
    "build_model",
    "build_proposal_generator",
    "build_roi_heads",
    "subsample_labels",
]
