"""Backbone base class, ShapeSpec, BACKBONE_REGISTRY and build_backbone."""
import dataclasses

import pytest
import torch
from torch import nn

from detcore.config import get_cfg
from detcore.layers.shape_spec import ShapeSpec
from detcore.modeling import BACKBONE_REGISTRY, build_backbone
from detcore.modeling.backbone import Backbone


class _TinyBackbone(Backbone):
    """A one-conv backbone, as a user would register one."""

    def __init__(self, in_channels):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, 8, 3, stride=2, padding=1)
        self._out_features = ["c1"]
        self._out_feature_channels = {"c1": 8}
        self._out_feature_strides = {"c1": 2}

    def forward(self, x):
        return {"c1": self.conv(x)}


@BACKBONE_REGISTRY.register(name="_test_tiny_backbone")
def _build_tiny(cfg, input_shape):
    return _TinyBackbone(input_shape.channels)


@BACKBONE_REGISTRY.register(name="_test_not_a_backbone")
def _build_not_a_backbone(cfg, input_shape):
    return nn.Conv2d(input_shape.channels, 8, 1)


BUILTIN = [
    "build_resnet_backbone",
    "build_resnet_fpn_backbone",
    "build_retinanet_resnet_fpn_backbone",
]


def test_shape_spec():
    spec = ShapeSpec(channels=256, stride=8)
    assert (spec.channels, spec.height, spec.width, spec.stride) == (256, None, None, 8)
    assert ShapeSpec(3) == ShapeSpec(channels=3)
    assert ShapeSpec().channels is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.channels = 1
    assert {spec: 1}[ShapeSpec(256, stride=8)] == 1  # hashable


def test_builtin_builders_are_registered():
    for name in BUILTIN:
        assert name in BACKBONE_REGISTRY


def test_custom_backbone_through_the_registry():
    cfg = get_cfg()
    cfg.MODEL.BACKBONE.NAME = "_test_tiny_backbone"
    model = build_backbone(cfg)
    assert isinstance(model, _TinyBackbone) and model.conv.in_channels == 3  # len(PIXEL_MEAN)
    assert model.output_shape() == {"c1": ShapeSpec(channels=8, stride=2)}
    assert model.size_divisibility == 0
    assert model(torch.randn(1, 3, 8, 8))["c1"].shape == (1, 8, 4, 4)
    assert build_backbone(cfg, ShapeSpec(channels=5)).conv.in_channels == 5


def test_typo_lists_registered_names():
    cfg = get_cfg()
    cfg.MODEL.BACKBONE.NAME = "build_resnet_fpn_backbon"
    with pytest.raises(KeyError) as info:
        build_backbone(cfg)
    message = str(info.value)
    assert "Did you mean 'build_resnet_fpn_backbone'" in message
    for name in BUILTIN:
        assert name in message


def test_builder_must_return_a_backbone():
    cfg = get_cfg()
    cfg.MODEL.BACKBONE.NAME = "_test_not_a_backbone"
    with pytest.raises(TypeError, match=r"returned Conv2d, expected a detcore\.modeling\."):
        build_backbone(cfg)


def test_base_forward_is_abstract():
    with pytest.raises(NotImplementedError, match="must implement forward"):
        Backbone()(torch.zeros(1))
