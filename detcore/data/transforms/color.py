"""Photometric augmentation: brightness, contrast, saturation and PCA lighting noise.

These change pixel values only: every annotation (points, boxes, polygons, bitmaps) passes
through unchanged. Each blends the image with something, ``factor * image + (1 - factor) *
other``, computed in float32 and rounded back to the image's type (uint8 clipped to [0, 255]):

* brightness: ``other`` is black;
* contrast: ``other`` is the mean grey level of the image (as torchvision's ``adjust_contrast``);
* saturation: ``other`` is the grey image itself (ITU-R 601 luma weights);
* lighting (AlexNet's "fancy PCA", detectron2's ``RandomLighting``): adds
  ``eigvecs @ (alpha * eigvals)`` to every pixel, ``alpha ~ N(0, scale)`` per component, with the
  ImageNet RGB pixel statistics. The eigenvalues are AlexNet's, for 0..255 pixels; detectron2
  uses them divided by 255 on 0..255 images, where scale 0.1 moves pixels by well under one
  grey level.

Grey levels and the lighting direction depend on the channel order, so the augmentations that
need them take ``image_format`` ("BGR" or "RGB").
"""
import numpy as np

from detcore.config.choices import IMAGE_FORMATS

from .base import Augmentation, Transform

__all__ = [
    "ColorTransform",
    "BrightnessTransform",
    "ContrastTransform",
    "SaturationTransform",
    "LightingTransform",
    "RandomBrightness",
    "RandomContrast",
    "RandomSaturation",
    "RandomLighting",
]

_LUMA_RGB = np.array([0.299, 0.587, 0.114], dtype=np.float32)
# ImageNet RGB pixel covariance, as in AlexNet: eigenvalues for 0..255 pixels, eigenvectors as columns.
_PCA_EIGVALS_RGB = np.array([0.2175, 0.0188, 0.0045], dtype=np.float64) * 255.0
_PCA_EIGVECS_RGB = np.array(
    [[-0.5675, 0.7192, 0.4009], [-0.5808, -0.0045, -0.8140], [-0.5836, -0.6948, 0.4203]], dtype=np.float64
)


def _check_format(image_format: str, where: str) -> str:
    if image_format not in IMAGE_FORMATS:
        raise ValueError(f"{where}: image_format must be one of {list(IMAGE_FORMATS)}, got {image_format!r}")
    return image_format


def _luma_weights(image_format: str) -> np.ndarray:
    return _LUMA_RGB if image_format == "RGB" else _LUMA_RGB[::-1].copy()


def _check_color(image: np.ndarray, where: str) -> None:
    if image.ndim != 3 or image.shape[2] != 3:
        raise ValueError(f"{where}: expected an [H, W, 3] image, got shape {image.shape}")


def _to_dtype(values: np.ndarray, dtype) -> np.ndarray:
    if dtype == np.uint8:
        return np.clip(np.rint(values), 0, 255).astype(np.uint8)
    return values.astype(dtype)


class ColorTransform(Transform):
    """A transform of pixel values only: geometry and masks are left as they are."""

    def apply_coords(self, coords):
        return np.array(coords, dtype=np.float64)

    def apply_segmentation(self, mask):
        return mask


class _BlendTransform(ColorTransform):
    """``factor * image + (1 - factor) * other(image)``."""

    def __init__(self, factor: float):
        if not np.isfinite(factor) or factor < 0:
            raise ValueError(f"{type(self).__name__}: factor must be a finite number >= 0, got {factor}")
        self.factor = float(factor)

    def _other(self, image: np.ndarray):
        raise NotImplementedError

    def apply_image(self, image):
        x = image.astype(np.float32)
        out = self.factor * x + (1.0 - self.factor) * self._other(x)
        return _to_dtype(out, image.dtype)

    def __repr__(self):
        return f"{type(self).__name__}(factor={self.factor:.4f})"


class BrightnessTransform(_BlendTransform):
    """Pixel values times ``factor``."""

    def _other(self, image):
        return np.float32(0.0)


class ContrastTransform(_BlendTransform):
    """Pixel values pulled towards (``factor`` < 1) or pushed from the image's mean grey level."""

    def __init__(self, factor: float, image_format: str = "BGR"):
        super().__init__(factor)
        self.image_format = _check_format(image_format, "ContrastTransform")

    def _other(self, image):
        _check_color(image, "ContrastTransform")
        return np.float32((image @ _luma_weights(self.image_format)).mean())


class SaturationTransform(_BlendTransform):
    """Colours pulled towards (``factor`` < 1) or pushed from each pixel's grey level."""

    def __init__(self, factor: float, image_format: str = "BGR"):
        super().__init__(factor)
        self.image_format = _check_format(image_format, "SaturationTransform")

    def _other(self, image):
        _check_color(image, "SaturationTransform")
        return (image @ _luma_weights(self.image_format))[:, :, None]


class LightingTransform(ColorTransform):
    """Adds ``offset`` (one value per channel, in the image's channel order) to every pixel."""

    def __init__(self, offset):
        self.offset = np.asarray(offset, dtype=np.float32).reshape(-1)
        if self.offset.shape != (3,) or not np.isfinite(self.offset).all():
            raise ValueError(f"LightingTransform: offset must be 3 finite numbers, got {offset!r}")

    def apply_image(self, image):
        _check_color(image, "LightingTransform")
        return _to_dtype(image.astype(np.float32) + self.offset, image.dtype)

    def __repr__(self):
        return f"LightingTransform(offset={np.round(self.offset, 3).tolist()})"


class _RandomFactor(Augmentation):
    """Draws a blend factor uniformly in ``[1 - intensity, 1 + intensity]``."""

    def __init__(self, intensity: float, image_format: str = "BGR"):
        if not 0.0 <= intensity <= 1.0:
            raise ValueError(f"{type(self).__name__}: intensity must lie in [0, 1], got {intensity}")
        self.intensity = float(intensity)
        self.image_format = _check_format(image_format, type(self).__name__)

    def _factor(self) -> float:
        return float(np.random.uniform(1.0 - self.intensity, 1.0 + self.intensity))

    def __repr__(self):
        return f"{type(self).__name__}(intensity={self.intensity}, image_format='{self.image_format}')"


class RandomBrightness(_RandomFactor):
    def get_transform(self, image):
        return BrightnessTransform(self._factor())


class RandomContrast(_RandomFactor):
    def get_transform(self, image):
        return ContrastTransform(self._factor(), self.image_format)


class RandomSaturation(_RandomFactor):
    def get_transform(self, image):
        return SaturationTransform(self._factor(), self.image_format)


class RandomLighting(Augmentation):
    """AlexNet's PCA lighting noise with standard deviation ``scale`` (0.1 in AlexNet)."""

    def __init__(self, scale: float, image_format: str = "BGR"):
        if not np.isfinite(scale) or scale < 0:
            raise ValueError(f"RandomLighting: scale must be a finite number >= 0, got {scale}")
        self.scale = float(scale)
        self.image_format = _check_format(image_format, "RandomLighting")

    def get_transform(self, image):
        alpha = np.random.normal(scale=self.scale, size=3)
        offset_rgb = _PCA_EIGVECS_RGB @ (alpha * _PCA_EIGVALS_RGB)
        return LightingTransform(offset_rgb if self.image_format == "RGB" else offset_rgb[::-1])

    def __repr__(self):
        return f"RandomLighting(scale={self.scale}, image_format='{self.image_format}')"
