"""Transforms of an image and everything annotated on it, and the random augmentations that draw
them (see ``base.py`` for how the two layers work together).

* ``base``: the framework (``Transform``, ``TransformList``, ``Augmentation``,
  ``apply_augmentations``), resize and flips;
* ``crop``: crops (polygons clipped), padding, large-scale jitter;
* ``color``: brightness, contrast, saturation, PCA lighting.

Written here rather than taken from albumentations: its MIT-licensed line is no longer developed
(its successor, AlbumentationsX, is AGPL), it has no polygon type (polygons would have to be
rasterized and traced back, losing their exactness), and it draws from its own random state,
not the per-worker ``np.random`` seeding the loaders rely on. The transforms that need more than
a resize and a flip are a few hundred lines here.
"""
from .base import (
    Augmentation,
    HFlipTransform,
    NoOpTransform,
    RandomFlip,
    ResizeShortestEdge,
    ResizeTransform,
    Transform,
    TransformList,
    VFlipTransform,
    apply_augmentations,
    mirrors,
)
from .color import (
    BrightnessTransform,
    ColorTransform,
    ContrastTransform,
    LightingTransform,
    RandomBrightness,
    RandomContrast,
    RandomLighting,
    RandomSaturation,
    SaturationTransform,
)
from .crop import CropTransform, FixedSizeCrop, PadTransform, RandomCrop, ResizeScale, clip_polygon

__all__ = [
    "Transform",
    "NoOpTransform",
    "ResizeTransform",
    "HFlipTransform",
    "VFlipTransform",
    "TransformList",
    "CropTransform",
    "PadTransform",
    "ColorTransform",
    "BrightnessTransform",
    "ContrastTransform",
    "SaturationTransform",
    "LightingTransform",
    "Augmentation",
    "ResizeShortestEdge",
    "RandomFlip",
    "RandomCrop",
    "ResizeScale",
    "FixedSizeCrop",
    "RandomBrightness",
    "RandomContrast",
    "RandomSaturation",
    "RandomLighting",
    "apply_augmentations",
    "mirrors",
    "clip_polygon",
]
