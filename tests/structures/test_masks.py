import numpy as np
import pytest
import torch
import torch.nn.functional as F

from detcore.structures.boxes import Boxes
from detcore.structures.masks import BitMasks, PolygonMasks, polygons_to_bitmask

SQUARE = [2.0, 2.0, 6.0, 2.0, 6.0, 6.0, 2.0, 6.0]  # covers pixels 2..5 in x and y
L_SHAPE = [10.0, 10.0, 40.0, 10.0, 40.0, 20.0, 20.0, 20.0, 20.0, 45.0, 10.0, 45.0]
TRIANGLE = [50.0, 5.0, 75.0, 40.0, 30.0, 35.0]


def centers_in_polygon(poly, h, w):
    """Even-odd test of every pixel center (c + 0.5, r + 0.5) against one polygon."""
    xs, ys = np.asarray(poly[0::2]), np.asarray(poly[1::2])
    cy, cx = np.meshgrid(np.arange(h) + 0.5, np.arange(w) + 0.5, indexing="ij")
    inside = np.zeros((h, w), dtype=bool)
    for i in range(len(xs)):
        x0, y0, x1, y1 = xs[i - 1], ys[i - 1], xs[i], ys[i]
        crosses = (y0 > cy) != (y1 > cy)
        with np.errstate(divide="ignore", invalid="ignore"):
            x_at = x0 + (cy - y0) * (x1 - x0) / (y1 - y0)
        inside ^= crosses & (cx < x_at)
    return torch.from_numpy(inside)


def grid_sample_crop(masks, boxes, m):
    """Reference BitMasks crop: grid_sample (align_corners=False, zero padding) at cell centers."""
    n, h, w = masks.shape
    cell = (torch.arange(m, dtype=torch.float64) + 0.5) / m
    xs = boxes[:, 0:1].double() + cell * (boxes[:, 2:3] - boxes[:, 0:1]).double()
    ys = boxes[:, 1:2].double() + cell * (boxes[:, 3:4] - boxes[:, 1:2]).double()
    # Normalized coordinates: -1 is the left edge of pixel 0, +1 the right edge of pixel w - 1.
    gx = (2 * xs / w - 1)[:, None, :].expand(n, m, m)
    gy = (2 * ys / h - 1)[:, :, None].expand(n, m, m)
    grid = torch.stack([gx, gy], dim=-1)
    out = F.grid_sample(masks[:, None].double(), grid, mode="bilinear", padding_mode="zeros", align_corners=False)
    return out[:, 0]


class TestRasterization:
    def test_square_follows_pixel_center_convention(self):
        bm = polygons_to_bitmask([SQUARE], 10, 10)
        assert bm.dtype == torch.bool and bm.shape == (10, 10)
        expected = torch.zeros(10, 10, dtype=torch.bool)
        expected[2:6, 2:6] = True
        assert torch.equal(bm, expected)

    @pytest.mark.parametrize("poly", [L_SHAPE, TRIANGLE])
    def test_matches_point_in_polygon(self, poly):
        bm = polygons_to_bitmask([poly], 50, 80)
        ref = centers_in_polygon(poly, 50, 80)
        # pycocotools approximates edges on a 5x finer grid: only a few boundary pixels may differ.
        assert (bm != ref).sum() <= 0.02 * ref.sum()
        assert bm.sum() > 0.9 * ref.sum()

    def test_union_of_parts_and_from_polygons(self):
        parts = [SQUARE, [p + 10 for p in SQUARE]]
        bm = polygons_to_bitmask(parts, 20, 20)
        assert bm.sum() == 32
        masks = BitMasks.from_polygons(PolygonMasks([parts, [TRIANGLE], []]), 50, 80)
        assert masks.tensor.shape == (3, 50, 80)
        assert torch.equal(masks.tensor[0, :20, :20], bm)
        assert torch.equal(masks.tensor[1], polygons_to_bitmask([TRIANGLE], 50, 80))
        assert not masks.tensor[2].any()
        assert BitMasks.from_polygons([], 5, 6).tensor.shape == (0, 5, 6)


class TestPolygonMasks:
    def test_invalid_polygons_rejected(self):
        with pytest.raises(ValueError, match="at least 3 points.*got 4"):
            PolygonMasks([[[0, 0, 1, 1]]])
        with pytest.raises(ValueError, match="instance 1.*got 7"):
            PolygonMasks([[SQUARE], [[0, 0, 1, 1, 2, 2, 3]]])
        with pytest.raises(TypeError, match="instance 0.*flat list of numbers"):
            PolygonMasks([SQUARE])

    def test_indexing(self):
        pm = PolygonMasks([[SQUARE], [TRIANGLE], [L_SHAPE, SQUARE]])
        assert len(pm) == 3
        assert len(pm[2]) == 1 and len(pm[2].polygons[0]) == 2
        assert [len(p) for p in pm[torch.tensor([True, False, True])]] == [1, 2]
        assert [p[0][0] for p in pm[torch.tensor([1, 0])]] == [TRIANGLE[0], SQUARE[0]]
        assert len(pm[1:]) == 2 and len(pm[[0, 0]]) == 2
        assert len(PolygonMasks.cat([pm, pm[0]])) == 4

    def test_area_and_boxes(self):
        pm = PolygonMasks([[SQUARE], [TRIANGLE], [SQUARE, [p + 10 for p in SQUARE]], []])
        tri_area = 0.5 * abs((75 - 50) * (35 - 5) - (30 - 50) * (40 - 5))
        torch.testing.assert_close(pm.area(), torch.tensor([16.0, tri_area, 32.0, 0.0]))
        boxes = pm.get_bounding_boxes()
        assert isinstance(boxes, Boxes)
        assert boxes.tensor.tolist() == [[2, 2, 6, 6], [30, 5, 75, 40], [2, 2, 16, 16], [0, 0, 0, 0]]
        assert pm.nonempty().tolist() == [True, True, True, False]


class TestBitMasks:
    def test_construction_and_indexing(self):
        t = torch.zeros(3, 8, 9, dtype=torch.uint8)
        t[1, 2:4, 3:7] = 1
        bm = BitMasks(t)
        assert bm.tensor.dtype == torch.bool and bm.image_size == (8, 9) and len(bm) == 3
        assert bm[1].tensor.shape == (1, 8, 9)
        assert len(bm[torch.tensor([True, True, False])]) == 2
        assert len(BitMasks.cat([bm, bm[0:1]])) == 4
        assert BitMasks(np.zeros((2, 3, 4), dtype=bool)).tensor.shape == (2, 3, 4)
        with pytest.raises(ValueError, match=r"\[N, H, W\]"):
            BitMasks(torch.zeros(8, 9))
        with pytest.raises(ValueError, match="image sizes differ"):
            BitMasks.cat([bm, BitMasks(torch.zeros(1, 8, 8))])

    def test_boxes_area_nonempty(self):
        t = torch.zeros(3, 10, 12, dtype=torch.bool)
        t[0, 2:6, 2:6] = True
        t[1, 0, 11] = True
        t[1, 9, 0] = True
        bm = BitMasks(t)
        assert bm.get_bounding_boxes().tensor.tolist() == [[2, 2, 6, 6], [0, 0, 12, 10], [0, 0, 0, 0]]
        assert bm.area().tolist() == [16.0, 2.0, 0.0]
        assert bm.nonempty().tolist() == [True, True, False]
        # Polygon box and bitmap box of the same square agree (no "+1" anywhere).
        pm = PolygonMasks([[SQUARE]])
        assert torch.equal(pm.get_bounding_boxes().tensor, BitMasks.from_polygons(pm, 10, 12).get_bounding_boxes().tensor)
        assert BitMasks(torch.zeros(0, 4, 4)).get_bounding_boxes().tensor.shape == (0, 4)


class TestCropAndResize:
    def test_square_in_its_own_box_is_all_ones(self):
        out = PolygonMasks([[SQUARE]]).crop_and_resize(torch.tensor([[2.0, 2.0, 6.0, 6.0]]), 28)
        assert out.shape == (1, 28, 28) and out.dtype == torch.bool
        assert out.all()

    def test_bitmask_square_in_its_own_box_is_ones_but_rounded_corners(self):
        # Bilinear sampling then >= 0.5 rounds a pixelated corner: near a corner both axes
        # weigh the inside pixel by < 1/sqrt(2) and the product drops below 0.5. Edges stay set.
        bits = BitMasks.from_polygons(PolygonMasks([[SQUARE]]), 10, 10)
        out = bits.crop_and_resize(torch.tensor([[2.0, 2.0, 6.0, 6.0]]), 28)[0]
        corners = torch.zeros(28, 28, dtype=torch.bool)
        for r in (slice(0, 3), slice(25, 28)):
            for c in (slice(0, 3), slice(25, 28)):
                corners[r, c] = True
        assert out[~corners].all()
        assert not out[0, 0] and out[0, 3] and out[3, 0]

    def test_box_twice_as_large_gives_middle_quarter(self):
        expected = torch.zeros(28, 28, dtype=torch.bool)
        expected[7:21, 7:21] = True
        polys = PolygonMasks([[SQUARE]])
        box = Boxes([[0.0, 0.0, 8.0, 8.0]])
        assert torch.equal(polys.crop_and_resize(box, 28)[0], expected)
        # The bitmap version: the same quarter up to its four (rounded) corner cells.
        out = BitMasks.from_polygons(polys, 10, 10).crop_and_resize(box, 28)[0]
        for r, c in ((7, 7), (7, 20), (20, 7), (20, 20)):
            expected[r, c] = False
        assert torch.equal(out, expected)

    def test_polygon_and_bitmask_agree(self):
        g = torch.Generator().manual_seed(0)
        polys = PolygonMasks([[L_SHAPE], [TRIANGLE], [L_SHAPE, [p + 40 for p in SQUARE]], [TRIANGLE]])
        bits = BitMasks.from_polygons(polys, 50, 80)
        tight = polys.get_bounding_boxes().tensor
        # Proposals jittered around the objects, some sticking out of the image.
        boxes = tight + (torch.rand(4, 4, generator=g) - 0.5) * 12
        for m in (14, 28):
            a = polys.crop_and_resize(boxes, m)
            b = bits.crop_and_resize(boxes, m)
            agree = (a == b).float().mean(dim=(1, 2))
            assert (agree >= 0.95).all(), agree

    def test_bitmask_matches_grid_sample_reference(self):
        g = torch.Generator().manual_seed(1)
        masks = torch.rand(6, 37, 53, generator=g) > 0.5
        xy = torch.rand(6, 2, generator=g) * torch.tensor([53.0, 37.0]) - 5
        boxes = torch.cat([xy, xy + torch.rand(6, 2, generator=g) * 40 + 0.5], dim=1)
        out = BitMasks(masks).crop_and_resize(boxes, 16)
        ref = grid_sample_crop(masks, boxes, 16)
        clear = (ref - 0.5).abs() > 1e-5  # float rounding may flip exact ties only
        assert torch.equal(out[clear], ref[clear] >= 0.5)
        assert clear.float().mean() > 0.9

    def test_empty_input(self):
        for masks in (PolygonMasks([]), BitMasks(torch.zeros(0, 10, 10))):
            out = masks.crop_and_resize(torch.zeros(0, 4), 28)
            assert out.shape == (0, 28, 28) and out.dtype == torch.bool

    def test_errors(self):
        pm = PolygonMasks([[SQUARE]])
        with pytest.raises(ValueError, match=r"\[1, 4\]"):
            pm.crop_and_resize(torch.zeros(2, 4), 28)
        with pytest.raises(ValueError, match="mask_size"):
            BitMasks(torch.zeros(1, 4, 4)).crop_and_resize(torch.zeros(1, 4), 0)

    def test_degenerate_box_is_finite(self):
        out = PolygonMasks([[SQUARE]]).crop_and_resize(torch.tensor([[3.0, 3.0, 3.0, 3.0]]), 7)
        assert out.shape == (1, 7, 7)
