"""Colour jitter: pixel values as the formulas say (written out here, and cv2's grey conversion
as a second opinion), annotations untouched, factors drawn in their ranges."""
import cv2
import numpy as np
import pytest

from detcore.data.transforms import (
    BrightnessTransform,
    ContrastTransform,
    LightingTransform,
    RandomBrightness,
    RandomContrast,
    RandomLighting,
    RandomSaturation,
    SaturationTransform,
    TransformList,
    apply_augmentations,
)


@pytest.fixture
def image():
    return np.random.default_rng(0).integers(0, 256, (12, 17, 3), dtype=np.uint8)


def blend(image, factor, other):
    return np.clip(np.rint(factor * image.astype(np.float64) + (1 - factor) * other), 0, 255).astype(np.uint8)


def test_brightness_scales_pixels(image):
    for factor in (0.0, 0.6, 1.0, 1.7):
        out = BrightnessTransform(factor).apply_image(image)
        assert out.dtype == np.uint8 and np.abs(out.astype(int) - blend(image, factor, 0.0)).max() <= 1
    assert np.array_equal(BrightnessTransform(1.0).apply_image(image), image)
    assert (BrightnessTransform(0.0).apply_image(image) == 0).all()


@pytest.mark.parametrize("fmt", ["BGR", "RGB"])
def test_contrast_blends_with_the_mean_grey(image, fmt):
    code = cv2.COLOR_BGR2GRAY if fmt == "BGR" else cv2.COLOR_RGB2GRAY
    grey = cv2.cvtColor(image, code).astype(np.float64)  # cv2 rounds to uint8: mean within 0.5
    for factor in (0.3, 1.5):
        out = ContrastTransform(factor, fmt).apply_image(image)
        assert np.abs(out.astype(int) - blend(image, factor, grey.mean())).max() <= 1
    flat = ContrastTransform(0.0, fmt).apply_image(image)
    assert len(np.unique(flat)) == 1 and abs(int(flat[0, 0, 0]) - grey.mean()) <= 1


@pytest.mark.parametrize("fmt", ["BGR", "RGB"])
def test_saturation_blends_with_each_pixels_grey(image, fmt):
    code = cv2.COLOR_BGR2GRAY if fmt == "BGR" else cv2.COLOR_RGB2GRAY
    grey = cv2.cvtColor(image, code)
    out = SaturationTransform(0.0, fmt).apply_image(image)
    assert np.abs(out.astype(int) - grey[:, :, None].astype(int)).max() <= 1  # all grey
    out = SaturationTransform(1.8, fmt).apply_image(image)
    assert np.abs(out.astype(int) - blend(image, 1.8, grey[:, :, None].astype(np.float64))).max() <= 1
    # A grey image has no saturation to change.
    grey3 = np.dstack([grey] * 3)
    assert np.abs(SaturationTransform(1.8, fmt).apply_image(grey3).astype(int) - grey3).max() <= 1


def test_lighting_adds_the_pca_offset_in_the_images_channel_order(image):
    np.random.seed(3)
    t_rgb = RandomLighting(0.1, "RGB").get_transform(image)
    np.random.seed(3)
    t_bgr = RandomLighting(0.1, "BGR").get_transform(image)
    assert np.allclose(t_bgr.offset, t_rgb.offset[::-1])
    # AlexNet: offset = eigvecs @ (alpha * eigvals), alpha ~ N(0, 0.1), 0..255 pixels.
    np.random.seed(3)
    alpha = np.random.normal(scale=0.1, size=3)
    eigvals = np.array([0.2175, 0.0188, 0.0045]) * 255
    eigvecs = np.array([[-0.5675, 0.7192, 0.4009], [-0.5808, -0.0045, -0.8140], [-0.5836, -0.6948, 0.4203]])
    assert np.allclose(t_rgb.offset, eigvecs @ (alpha * eigvals), atol=1e-5)
    out = LightingTransform([10.0, -300.0, 0.4]).apply_image(image)
    ref = np.clip(np.rint(image + np.array([10.0, -300.0, 0.4])), 0, 255)
    assert np.array_equal(out, ref.astype(np.uint8))


def test_annotations_pass_through_unchanged(image):
    t = TransformList([BrightnessTransform(0.5), ContrastTransform(1.3), SaturationTransform(0.2), LightingTransform([1, 2, 3])])
    boxes = np.array([[1.5, 2.0, 7.25, 9.0]])
    assert np.array_equal(t.apply_box(boxes), boxes)
    poly = np.array([1.0, 1.0, 5.5, 1.0, 3.0, 4.5])
    assert np.array_equal(t.apply_polygons([poly])[0], poly)
    mask = np.random.default_rng(1).random((12, 17)) > 0.5
    assert np.array_equal(t.apply_segmentation(mask), mask)
    assert t.apply_image(image).shape == image.shape


@pytest.mark.parametrize("aug_cls", [RandomBrightness, RandomContrast, RandomSaturation])
def test_factors_are_drawn_in_range(aug_cls, image):
    np.random.seed(0)
    factors = [aug_cls(0.4).get_transform(image).factor for _ in range(300)]
    assert 0.6 <= min(factors) < 0.65 and 1.35 < max(factors) <= 1.4
    np.random.seed(0)
    assert all(aug_cls(0.0).get_transform(image).factor == 1.0 for _ in range(5))


def test_jitter_chain_draws_once_per_augmentation(image):
    np.random.seed(5)
    out, t = apply_augmentations([RandomBrightness(0.2), RandomContrast(0.2), RandomSaturation(0.2), RandomLighting(0.1)], image)
    assert [type(x).__name__ for x in t.transforms] == [
        "BrightnessTransform", "ContrastTransform", "SaturationTransform", "LightingTransform"
    ]
    assert np.array_equal(out, t.apply_image(image))


def test_bad_arguments():
    with pytest.raises(ValueError, match=r"intensity must lie in \[0, 1\]"):
        RandomBrightness(1.5)
    with pytest.raises(ValueError, match="image_format must be one of"):
        RandomSaturation(0.2, "HSV")
    with pytest.raises(ValueError, match="scale must be"):
        RandomLighting(-0.1)
    with pytest.raises(ValueError, match=r"\[H, W, 3\]"):
        SaturationTransform(0.5).apply_image(np.zeros((4, 4), np.uint8))
    with pytest.raises(ValueError, match="3 finite numbers"):
        LightingTransform([1.0, 2.0])
