"""BACKBONE_REGISTRY and build_backbone: pick a backbone class by its config name."""
from detcore.layers.shape_spec import ShapeSpec
from detcore.utils.registry import Registry

from .backbone import Backbone

__all__ = ["BACKBONE_REGISTRY", "build_backbone"]

# Backbones: `from_config(cfg, input_shape)` gets the ShapeSpec of the input images.
BACKBONE_REGISTRY = Registry("BACKBONE", "MODEL.BACKBONE.NAME")


def build_backbone(cfg, input_shape=None):
    """Build the backbone named by cfg.MODEL.BACKBONE.NAME.

    `input_shape` (a ShapeSpec) defaults to one with as many channels as cfg.MODEL.PIXEL_MEAN
    has entries (3 for RGB/BGR images).
    """
    if input_shape is None:
        input_shape = ShapeSpec(channels=len(cfg.MODEL.PIXEL_MEAN))
    backbone = BACKBONE_REGISTRY.build(cfg, input_shape)
    if not isinstance(backbone, Backbone):
        raise TypeError(
            f"backbone '{cfg.MODEL.BACKBONE.NAME}' built a {type(backbone).__name__}, "
            "expected a detcore.modeling.backbone.Backbone"
        )
    return backbone
