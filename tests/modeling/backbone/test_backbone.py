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

    @classmethod
    def from_config(cls, cfg, input_shape):
        return {"in_channels": input_shape.channels}

    def forward(self, x):
        return {"c1": self.conv(x)}


BACKBONE_REGISTRY.register(_TinyBackbone, name="_test_tiny_backbone")


@BACKBONE_REGISTRY.register(name="_test_not_a_backbone")
class _NotABackbone(nn.Conv2d):
    @classmethod
    def from_config(cls, cfg, input_shape):
        return {"in_channels": input_shape.channels, "out_channels": 8, "kernel_size": 1}


BUILTIN = ["ResNet", "FPN", "RetinaNetFPN"]
# detectron2's builder names select the same classes.
DETECTRON2_NAMES = {
    "build_resnet_backbone": "ResNet",
    "build_resnet_fpn_backbone": "FPN",
    "build_retinanet_resnet_fpn_backbone": "RetinaNetFPN",
}


def test_shape_spec():
    spec = ShapeSpec(channels=256, stride=8)
    assert (spec.channels, spec.height, spec.width, spec.stride) == (256, None, None, 8)
    assert ShapeSpec(3) == ShapeSpec(channels=3)
    assert ShapeSpec().channels is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.channels = 1
    assert {spec: 1}[ShapeSpec(256, stride=8)] == 1  # hashable


def test_builtin_backbones_are_registered():
    for name in BUILTIN:
        assert name in BACKBONE_REGISTRY
    for alias, name in DETECTRON2_NAMES.items():
        assert BACKBONE_REGISTRY.get(alias) is BACKBONE_REGISTRY.get(name)
    assert BACKBONE_REGISTRY.names() == sorted(BUILTIN + ["_test_not_a_backbone", "_test_tiny_backbone"])


def test_registering_a_builder_function_is_refused():
    with pytest.raises(TypeError, match="must be a class with a from_config classmethod"):
        BACKBONE_REGISTRY.register(lambda cfg, shape: None, name="_test_function")
    assert "_test_function" not in BACKBONE_REGISTRY


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
    with pytest.raises(TypeError, match=r"built a _NotABackbone, expected a detcore\.modeling\."):
        build_backbone(cfg)


def test_base_forward_is_abstract():
    with pytest.raises(NotImplementedError, match="must implement forward"):
        Backbone()(torch.zeros(1))
