import cv2
import numpy as np
import pytest
import torch

from detcore.data.detection_utils import mask_to_polygons
from detcore.data.transforms import (
    HFlipTransform,
    NoOpTransform,
    RandomFlip,
    ResizeShortestEdge,
    ResizeTransform,
    TransformList,
    VFlipTransform,
    apply_augmentations,
)
from detcore.structures import polygons_to_bitmask


def mask_box(mask):
    rows, cols = np.nonzero(mask)
    return np.array([cols.min(), rows.min(), cols.max() + 1, rows.max() + 1], dtype=float)


@pytest.mark.parametrize(
    "h, w, short, max_size, expected",
    [(100, 200, 50, 1000, (50, 100)), (200, 100, 50, 1000, (100, 50)), (100, 400, 100, 300, (75, 300)),
     (480, 640, 800, 1333, (800, 1067)), (33, 33, 64, 64, (64, 64))],
)
def test_resize_shortest_edge_shape(h, w, short, max_size, expected):
    t = ResizeShortestEdge(short, max_size).get_transform(np.zeros((h, w, 3), np.uint8))
    assert (t.new_h, t.new_w) == expected
    assert t.apply_image(np.zeros((h, w, 3), np.uint8)).shape == (*expected, 3)


def test_resize_sampling_styles():
    image = np.zeros((10, 20, 3), np.uint8)
    np.random.seed(0)
    choice = ResizeShortestEdge((16, 24, 32), 1000, "choice")
    assert {choice.get_transform(image).new_h for _ in range(60)} == {16, 24, 32}
    rng = ResizeShortestEdge((16, 20), 1000, "range")
    assert {rng.get_transform(image).new_h for _ in range(100)} == set(range(16, 21))
    assert isinstance(ResizeShortestEdge(0).get_transform(image), NoOpTransform)
    with pytest.raises(ValueError, match="range"):
        ResizeShortestEdge((16, 20, 24), 1000, "range")


def test_resize_matches_cv2_and_scales_coords():
    image = np.random.default_rng(0).integers(0, 256, (10, 20, 3), dtype=np.uint8)
    t = ResizeTransform(10, 20, 15, 30)
    assert np.array_equal(t.apply_image(image), cv2.resize(image, (30, 15), interpolation=cv2.INTER_LINEAR))
    assert t.apply_coords(np.array([[2.0, 4.0], [20.0, 10.0]])).tolist() == [[3.0, 6.0], [30.0, 15.0]]
    with pytest.raises(ValueError, match=r"expected an image of size \(10, 20\)"):
        t.apply_image(np.zeros((11, 20, 3), np.uint8))


def test_flips():
    image = np.arange(2 * 3 * 3).reshape(2, 3, 3).astype(np.uint8)
    h = HFlipTransform(3)
    assert np.array_equal(h.apply_image(image), image[:, ::-1])
    assert h.apply_box(np.array([[0.0, 0.0, 1.0, 2.0]])).tolist() == [[2.0, 0.0, 3.0, 2.0]]
    v = VFlipTransform(2)
    assert np.array_equal(v.apply_image(image), image[::-1])
    assert v.apply_box(np.array([[0.0, 0.0, 1.0, 0.5]])).tolist() == [[0.0, 1.5, 1.0, 2.0]]
    np.random.seed(0)
    kinds = {type(RandomFlip(0.5).get_transform(image)) for _ in range(40)}
    assert kinds == {NoOpTransform, HFlipTransform}
    assert isinstance(RandomFlip(1.0, horizontal=False, vertical=True).get_transform(image), VFlipTransform)


@pytest.mark.parametrize("shape", [(1, 1, 3), (1, 5, 3), (5, 1, 3), (1, 1), (4, 1)])
def test_flips_of_one_pixel_wide_or_high_images_become_tensors(shape):
    # numpy calls a reversed view contiguous along a dimension of size 1 and keeps its negative
    # stride; torch.from_numpy refused it (TTA with TEST.AUG.MIN_SIZES (1,) or MAX_SIZE 1).
    image = np.arange(int(np.prod(shape)), dtype=np.uint8).reshape(shape)
    for flip, reference in ((HFlipTransform(shape[1]), image[:, ::-1]), (VFlipTransform(shape[0]), image[::-1])):
        out = flip.apply_image(image)
        assert min(out.strides) >= 0 and np.array_equal(out, reference)
        assert torch.equal(torch.from_numpy(out), torch.from_numpy(reference.copy()))


@pytest.mark.parametrize("flip", [HFlipTransform, VFlipTransform])
@pytest.mark.parametrize("new_size", [(37, 55), (90, 134), (50, 74)])
def test_boxes_and_masks_stay_consistent(flip, new_size):
    """After resize + flip, the box of the transformed mask (bitmap or re-rasterized polygons)
    is the transformed box, within a pixel."""
    h, w = 50, 74
    mask = np.zeros((h, w), np.uint8)
    cv2.circle(mask, (20, 30), 12, 1, -1)
    cv2.fillPoly(mask, [np.array([[40, 5], [70, 12], [52, 28]], np.int32)], 1)
    box = mask_box(mask)
    resize = ResizeTransform(h, w, *new_size)
    t = TransformList([resize, flip(new_size[1] if flip is HFlipTransform else new_size[0])])
    new_box = t.apply_box(box[None])[0]
    bitmap = t.apply_segmentation(mask)
    assert bitmap.shape == new_size and bitmap.dtype == np.uint8
    assert np.abs(mask_box(bitmap) - new_box).max() <= 1.0
    polys = t.apply_polygons([np.asarray(p) for p in mask_to_polygons(mask)])
    raster = polygons_to_bitmask(polys, *new_size).numpy()
    assert np.abs(mask_box(raster) - new_box).max() <= 1.0
    # The image follows the same geometry: flipping back gives the plain resized image.
    image = np.dstack([mask * 255] * 3).astype(np.uint8)
    back = t.transforms[1].apply_image(t.apply_image(image))  # a flip is its own inverse
    assert np.array_equal(back, resize.apply_image(image))


def test_apply_augmentations_chains_on_the_resized_image():
    np.random.seed(0)
    image = np.zeros((20, 40, 3), np.uint8)
    out, t = apply_augmentations([ResizeShortestEdge(10, 100), RandomFlip(1.0)], image)
    assert out.shape == (10, 20, 3)
    assert [type(x) for x in t.transforms] == [ResizeTransform, HFlipTransform]
    assert t.transforms[1].width == 20  # the flip saw the resized image


# --- INPUT.RESIZE_MODE: the sizes and pixels other libraries give -----------------------------------
@pytest.mark.parametrize(
    "size, expected",
    [
        # (opencv, torchvision, maskrcnn_benchmark), short side 800, long side at most 1333.
        ((375, 500), ((800, 1067), (800, 1066), (800, 1066))),  # 1066.67: rounded / truncated
        ((641, 427), ((1201, 800), (1200, 800), (1200, 800))),  # 1200.94
        ((300, 1000), ((400, 1333), (399, 1333), (400, 1333))),  # capped: short side 399.9
        ((500, 1500), ((444, 1333), (444, 1333), (444, 1332))),  # maskrcnn-benchmark: int(444 * 3)
        ((800, 800), ((800, 800), (800, 800), (800, 800))),
    ],
)
def test_resize_size_rules(size, expected):
    h, w = size
    for mode, shape in zip(("opencv", "torchvision", "maskrcnn_benchmark"), expected):
        assert ResizeShortestEdge.get_output_shape(h, w, 800, 1333, mode) == shape, mode
        t = ResizeShortestEdge(800, 1333, mode=mode).get_transform(np.zeros((h, w, 3), np.uint8))
        assert (t.new_h, t.new_w) == shape and t.mode == mode


def test_maskrcnn_benchmark_resize_is_pil_bilinear():
    from PIL import Image
    import torch

    rng = np.random.default_rng(1)
    image = rng.integers(0, 256, (75, 100, 3), dtype=np.uint8)
    for new_size in ((160, 213), (40, 53)):  # up, and down (PIL antialiases when shrinking)
        t = ResizeTransform(75, 100, *new_size, mode="maskrcnn_benchmark")
        expected = np.asarray(Image.fromarray(image).resize(new_size[::-1], Image.BILINEAR))
        got = t.apply_image(image)
        assert got.dtype == np.uint8 and np.array_equal(got, expected)
        assert not np.array_equal(got, ResizeTransform(75, 100, *new_size).apply_image(image))  # cv2 differs
        # Its BinaryMaskList: bilinear interpolation of the 0/1 mask, truncated back to the mask's dtype.
        mask = (rng.random((75, 100)) > 0.3).astype(np.uint8)
        reference = torch.nn.functional.interpolate(
            torch.from_numpy(mask)[None, None].float(), size=new_size, mode="bilinear", align_corners=False
        )[0, 0].to(torch.uint8)
        assert np.array_equal(t.apply_segmentation(mask), reference.numpy())
    with pytest.raises(ValueError, match="'maskrcnn_benchmark' resizes uint8"):
        ResizeTransform(75, 100, 150, 200, mode="maskrcnn_benchmark").apply_image(image.astype(np.float32))
    with pytest.raises(ValueError, match="mode must be one of"):
        ResizeShortestEdge(800, 1333, mode="pil")
