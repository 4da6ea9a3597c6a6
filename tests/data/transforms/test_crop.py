"""Crops, padding and large-scale jitter: the image, boxes, polygons and bitmaps must stay one
picture (each checked against the others, and polygons against an exact rasterizer written here)."""
import cv2
import numpy as np
import pytest

from detcore.data.transforms import (
    CropTransform,
    FixedSizeCrop,
    NoOpTransform,
    PadTransform,
    RandomCrop,
    ResizeScale,
    ResizeTransform,
    TransformList,
    apply_augmentations,
    clip_polygon,
)
from detcore.structures import polygons_to_bitmask


def parity_raster(polygons, h, w):
    """Reference rasterizer: pixel (r, c) is set when its center (c + 0.5, r + 0.5) is inside one
    of the polygons, by the even-odd rule (which pycocotools follows on a 1/5 px vertex grid)."""
    ys, xs = np.mgrid[0:h, 0:w] + 0.5
    out = np.zeros((h, w), bool)
    for poly in polygons:
        pts = np.asarray(poly, dtype=np.float64).reshape(-1, 2)
        inside = np.zeros((h, w), bool)
        for (xa, ya), (xb, yb) in zip(pts, np.roll(pts, -1, axis=0)):
            if ya == yb:
                continue
            spans = (ya > ys) != (yb > ys)
            x_cross = xa + (ys - ya) * (xb - xa) / (yb - ya)
            inside ^= spans & (xs < x_cross)
        out |= inside
    return out


def random_polygon(rng, kind, h, w):
    k = int(rng.integers(3, 14))
    if kind == "star":  # concave, simple
        center = rng.uniform([0.2 * w, 0.2 * h], [0.8 * w, 0.8 * h])
        angles = np.sort(rng.uniform(0, 2 * np.pi, k))
        radii = rng.uniform(2, 0.5 * min(h, w), k)
        pts = np.stack([center[0] + radii * np.cos(angles), center[1] + radii * np.sin(angles)], axis=1)
    else:  # any vertices, self-intersecting, reaching past the image
        pts = rng.uniform([-10, -10], [w + 10, h + 10], (k, 2))
    return pts.reshape(-1)


def random_window(rng, h, w):
    x0, y0 = int(rng.integers(0, w // 2)), int(rng.integers(0, h // 2))
    return x0, y0, int(rng.integers(1, w - x0 + 1)), int(rng.integers(1, h - y0 + 1))


@pytest.mark.parametrize("kind", ["star", "any"])
def test_clipped_polygons_rasterize_to_the_crop_of_the_original(kind):
    """Exactly (center-inside rule): the polygons cut to the window cover the same pixels as the
    original polygons inside the window -- including concave ones cut into several parts."""
    rng = np.random.default_rng(0 if kind == "star" else 1)
    h, w = 50, 70
    for _ in range(400):
        polys = [random_polygon(rng, kind, h, w) for _ in range(int(rng.integers(1, 3)))]
        x0, y0, cw, ch = random_window(rng, h, w)
        clipped = CropTransform(x0, y0, cw, ch, w, h).apply_polygons(polys)
        reference = parity_raster(polys, h, w)[y0 : y0 + ch, x0 : x0 + cw]
        assert np.array_equal(parity_raster(clipped, ch, cw), reference)
        for p in clipped:  # inside the window, as flat float arrays
            xy = p.reshape(-1, 2)
            assert xy.min() >= 0 and (xy[:, 0] <= cw).all() and (xy[:, 1] <= ch).all()


def test_a_u_shape_cut_through_its_arms_keeps_both_arms():
    u = np.array([0, 0, 30, 0, 30, 30, 20, 30, 20, 10, 10, 10, 10, 30, 0, 30], dtype=np.float64)
    # Window y in [20, 40): only the two arms (x 0..10 and 20..30) are left.
    clipped = clip_polygon(u - np.tile([0, 20], 8), 40, 20)
    assert len(clipped) == 1
    raster = parity_raster(clipped, 20, 40)
    assert raster[:10, :10].all() and raster[:10, 20:30].all()
    assert not raster[:, 10:20].any() and not raster[10:].any() and not raster[:, 30:].any()
    # With pycocotools, as the training targets are drawn, the same pixels.
    assert np.array_equal(polygons_to_bitmask(clipped, 20, 40).numpy(), raster)


def test_polygons_outside_or_touching_the_window_vanish():
    assert clip_polygon([50, 50, 60, 50, 55, 60], 40, 40) == []
    assert clip_polygon([0, 0, 10, 0, 5, 0], 40, 40) == []  # no area
    assert clip_polygon([-10, 0, 0, 0, 0, 10, -10, 10], 40, 40) == []  # only its edge on the border
    # A polygon inside the window comes out as it went in (starting at its second vertex).
    whole = np.array([1, 1, 9, 2, 5, 8], dtype=np.float64)
    (same,) = clip_polygon(whole, 40, 40)
    assert np.array_equal(np.roll(same.reshape(-1, 2), 1, axis=0), whole.reshape(-1, 2))


def test_crop_moves_image_boxes_polygons_and_bitmaps_together():
    rng = np.random.default_rng(2)
    h, w = 60, 90
    for _ in range(100):
        poly = random_polygon(rng, "star", h, w)
        mask = parity_raster([poly], h, w)
        image = np.dstack([mask * 200, mask * 100, rng.integers(0, 50, (h, w))]).astype(np.uint8)
        x0, y0, cw, ch = random_window(rng, h, w)
        t = CropTransform(x0, y0, cw, ch, w, h)
        out = t.apply_image(image)
        assert np.array_equal(out, image[y0 : y0 + ch, x0 : x0 + cw])
        assert np.array_equal(t.apply_segmentation(mask), out[:, :, 0] == 200)  # the bitmap is the image's
        clipped = t.apply_polygons([poly])
        assert np.array_equal(parity_raster(clipped, ch, cw), out[:, :, 0] == 200)
        # The box: the original box shifted and clipped, which holds the polygon's clipped bounds.
        xy = poly.reshape(-1, 2)
        box = t.apply_box(np.concatenate([xy.min(0), xy.max(0)])[None])[0]
        assert np.allclose(box, np.clip([xy[:, 0].min() - x0, xy[:, 1].min() - y0, xy[:, 0].max() - x0,
                                         xy[:, 1].max() - y0], 0, [cw, ch, cw, ch]))
        if clipped:
            cxy = np.concatenate(clipped).reshape(-1, 2)
            assert (cxy.min(0) >= box[:2] - 1e-9).all() and (cxy.max(0) <= box[2:] + 1e-9).all()
        # Points (what keypoints use) are only shifted: they may leave the window.
        assert np.allclose(t.apply_coords(np.array([[0.0, 0.0], [w, h]])), [[-x0, -y0], [w - x0, h - y0]])


def test_crop_then_resize_clips_in_the_crop_frame():
    """A chained box is clipped where the crop happens, not only at the end."""
    crop = CropTransform(10, 0, 20, 20, 40, 20)
    resize = ResizeTransform(20, 20, 40, 40)
    t = TransformList([crop, resize])
    assert t.apply_box(np.array([[0.0, 5.0, 15.0, 10.0]])).tolist() == [[0.0, 10.0, 10.0, 20.0]]
    assert t.apply_polygons([np.array([0.0, 0.0, 5.0, 0.0, 5.0, 5.0])]) == []


def test_pad_and_its_inverse():
    image = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    pad = PadTransform(2, 3, 4, 5, pad_value=(1.4, 2.6, 3.0))
    out = pad.apply_image(image)
    assert out.shape == (4, 5, 3) and np.array_equal(out[:2, :3], image)
    assert (out[2:] == [1, 3, 3]).all() and (out[:, 3:] == [1, 3, 3]).all()
    mask = np.ones((2, 3), bool)
    assert pad.apply_segmentation(mask).sum() == 6 and pad.apply_segmentation(mask).dtype == bool
    assert pad.apply_coords(np.array([[1.5, 1.0]])).tolist() == [[1.5, 1.0]]
    assert np.array_equal(pad.inverse().apply_image(out), image)
    crop = CropTransform(1, 2, 3, 2, 6, 5)
    assert np.array_equal(crop.inverse().apply_coords(crop.apply_coords(np.array([[2.5, 3.5]]))), [[2.5, 3.5]])


def test_bad_windows_and_sizes_are_refused():
    with pytest.raises(ValueError, match=r"x0=5, y0=0, w=10, h=4 .* inside the 4x12"):
        CropTransform(5, 0, 10, 4, 12, 4)
    with pytest.raises(ValueError, match=r"expected an image of size \(4, 12\)"):
        CropTransform(0, 0, 2, 2, 12, 4).apply_image(np.zeros((5, 12, 3), np.uint8))
    with pytest.raises(ValueError, match="must fit"):
        PadTransform(5, 5, 4, 8)
    with pytest.raises(ValueError, match="crop_type must be one of"):
        RandomCrop("random", (0.5, 0.5))
    with pytest.raises(ValueError, match=r"fractions in \(0, 1\]"):
        RandomCrop("relative", (0.5, 1.5))
    with pytest.raises(ValueError, match="whole pixels"):
        RandomCrop("absolute", (10.5, 20))
    with pytest.raises(ValueError, match=r"\(min, max\)"):
        RandomCrop("absolute_range", (30, 20))
    with pytest.raises(ValueError, match="min_scale <= max_scale"):
        ResizeScale(2.0, 1.0, 100, 100)
    with pytest.raises(ValueError, match="crop_size"):
        FixedSizeCrop((0, 10))


@pytest.mark.parametrize(
    "crop_type, size, check",
    [
        ("relative", (0.5, 0.25), lambda ch, cw: (ch, cw) == (30, 25)),
        ("relative_range", (0.5, 0.25), lambda ch, cw: 30 <= ch <= 60 and 25 <= cw <= 100),
        ("absolute", (40, 500), lambda ch, cw: (ch, cw) == (40, 100)),
        ("absolute_range", (20, 80), lambda ch, cw: 20 <= ch <= 60 and 20 <= cw <= 80),
    ],
)
def test_random_crop_sizes_and_positions(crop_type, size, check):
    np.random.seed(0)
    image = np.zeros((60, 100, 3), np.uint8)
    aug = RandomCrop(crop_type, size)
    sizes, corners = set(), set()
    for _ in range(200):
        t = aug.get_transform(image)
        assert check(t.h, t.w), (t.h, t.w)
        assert t.x0 + t.w <= 100 and t.y0 + t.h <= 60
        sizes.add((t.h, t.w))
        corners.add((t.x0, t.y0))
    assert (len(sizes) > 20) == crop_type.endswith("range")
    assert len(corners) > 20  # positions are drawn


@pytest.mark.parametrize("shape", [(60, 100), (100, 60), (30, 30)])
def test_large_scale_jitter_output_is_fixed_and_consistent(shape):
    """Resize to fit scale x target, crop / pad to the target: the picture is the resized one,
    windowed, with the pad value around; masks and polygons follow."""
    np.random.seed(1)
    h, w = shape
    rng = np.random.default_rng(3)
    target = (64, 80)
    augs = [ResizeScale(0.3, 2.0, *target), FixedSizeCrop(target, pad_value=(7, 8, 9))]
    for _ in range(30):
        poly = random_polygon(rng, "star", h, w)
        mask = parity_raster([poly], h, w)
        image = np.dstack([mask * 255] * 3).astype(np.uint8)
        out, t = apply_augmentations(augs, image)
        assert out.shape == (*target, 3)
        resize = t.transforms[0]
        scale = min(resize.new_h / h, resize.new_w / w)
        assert isinstance(resize, ResizeTransform) and abs(resize.new_h - round(h * scale)) <= 1
        # Reference: resize with cv2, then take the window the crop chose, then pad.
        ref = cv2.resize(image, (resize.new_w, resize.new_h), interpolation=cv2.INTER_LINEAR)
        crop = next((x for x in t.transforms[1].transforms if isinstance(x, CropTransform)), None)
        x0, y0 = (crop.x0, crop.y0) if crop else (0, 0)
        window = ref[y0 : y0 + target[0], x0 : x0 + target[1]]
        vh, vw = window.shape[:2]
        assert np.array_equal(out[:vh, :vw], window)
        assert (out[vh:] == [7, 8, 9]).all() and (out[:, vw:] == [7, 8, 9]).all()
        # Polygons and bitmaps land where the image's mask is: they differ from it only along the
        # outlines, within a source pixel (``scale`` output pixels): resampling blurs no more.
        bitmap = t.apply_segmentation(mask.astype(np.uint8)).astype(bool)
        polys = t.apply_polygons([poly])
        raster = parity_raster(polys, *target) if polys else np.zeros(target, bool)
        image_mask = out[:, :, 0] >= 128
        near = outline_band(image_mask, 2 * int(np.ceil(scale)) + 1)
        for m in (bitmap, raster):
            assert m.shape == target
            assert not ((m != image_mask) & ~near & ~outline_band(m, 2 * int(np.ceil(scale)) + 1)).any()


def outline_band(mask, k):
    """Pixels within k // 2 (chessboard distance) of the outline of a bool mask."""
    m, kernel = mask.astype(np.uint8), np.ones((k, k), np.uint8)
    return (cv2.dilate(m, kernel) != cv2.erode(m, kernel, borderType=cv2.BORDER_REPLICATE))


def test_fixed_size_crop_of_an_exact_fit_changes_nothing():
    t = FixedSizeCrop((20, 30)).get_transform(np.zeros((20, 30, 3), np.uint8))
    assert len(t) == 0
    assert isinstance(TransformList([NoOpTransform()]).inverse(), TransformList)
