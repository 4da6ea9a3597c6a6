"""Backbones: a ResNet/ResNeXt body and FPN, selected through BACKBONE_REGISTRY."""
from .backbone import Backbone
from .build import BACKBONE_REGISTRY, build_backbone
from .fpn import FPN, LastLevelMaxPool, LastLevelP6P7, RetinaNetFPN, build_top_block
from .resnet import BasicBlock, BasicStem, BottleneckBlock, ResNet

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
    "RetinaNetFPN",
    "build_backbone",
    "build_top_block",
]
