"""Backbones: a ResNet/ResNeXt body and FPN, selected through BACKBONE_REGISTRY."""
from .backbone import Backbone
from .build import BACKBONE_REGISTRY, build_backbone
from .fpn import (
    FPN,
    LastLevelMaxPool,
    LastLevelP6P7,
    build_resnet_fpn_backbone,
    build_retinanet_resnet_fpn_backbone,
)
from .resnet import BasicBlock, BasicStem, BottleneckBlock, ResNet, build_resnet_backbone

__all__ = [
    "BACKBONE_REGISTRY",
    "Backbone",
    "BasicBlock",
    "BasicStem",
    "BottleneckBlock",
    "FPN",
    "LastLevelMaxPool",
    "LastLevelP6P7",
    "ResNet",
    "build_backbone",
    "build_resnet_backbone",
    "build_resnet_fpn_backbone",
    "build_retinanet_resnet_fpn_backbone",
]
