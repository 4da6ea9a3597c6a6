import numpy as np
import pytest
import torch

from detcore.structures.boxes import (
    Boxes,
    pairwise_intersection,
    pairwise_ioa,
    pairwise_iou,
    xywh_to_xyxy,
    xyxy_to_xywh,
)


def random_boxes(n, size=100.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(n, 2, generator=g) * size
    wh = torch.rand(n, 2, generator=g) * size * 0.5
    return torch.cat([xy, xy + wh], dim=1)


def iou_loop(a, b, over_b_only=False):
    """Pairwise IoU (or IoA over b) with scalar Python arithmetic, one pair at a time."""
    out = torch.zeros(len(a), len(b), dtype=torch.float64)
    for i, (ax1, ay1, ax2, ay2) in enumerate(a.tolist()):
        for j, (bx1, by1, bx2, by2) in enumerate(b.tolist()):
            iw = max(0.0, min(ax2, bx2) - max(ax1, bx1))
            ih = max(0.0, min(ay2, by2) - max(ay1, by1))
            inter = iw * ih
            area_a = (ax2 - ax1) * (ay2 - ay1)
            area_b = (bx2 - bx1) * (by2 - by1)
            denom = area_b if over_b_only else area_a + area_b - inter
            out[i, j] = inter / denom if denom > 0 else 0.0
    return out


class TestConstruction:
    def test_from_list_numpy_and_int_tensor_become_float(self):
        for data in ([[0, 0, 2, 3]], np.array([[0, 0, 2, 3]]), torch.tensor([[0, 0, 2, 3]])):
            b = Boxes(data)
            assert b.tensor.dtype == torch.float32
            assert b.tensor.tolist() == [[0.0, 0.0, 2.0, 3.0]]

    def test_float64_kept(self):
        assert Boxes(torch.zeros(2, 4, dtype=torch.float64)).tensor.dtype == torch.float64

    @pytest.mark.parametrize("shape", [(0,), (0, 4), (2, 0), (0, 0, 3)])
    def test_empty_any_shape_becomes_0x4(self, shape):
        b = Boxes(torch.zeros(shape))
        assert b.tensor.shape == (0, 4)
        assert len(b) == 0
        assert Boxes([]).tensor.shape == (0, 4)

    @pytest.mark.parametrize("shape", [(4,), (3, 5), (2, 2, 4)])
    def test_bad_shape_raises_with_shape(self, shape):
        with pytest.raises(ValueError, match=r"\[N, 4\].*" + str(shape[0])):
            Boxes(torch.zeros(shape))


class TestGeometry:
    def test_area_widths_heights_centers(self):
        b = Boxes([[1, 2, 4, 8], [0, 0, 0.5, 0.25]])
        assert b.widths().tolist() == [3, 0.5]
        assert b.heights().tolist() == [6, 0.25]
        assert b.area().tolist() == [18, 0.125]
        assert b.get_centers().tolist() == [[2.5, 5.0], [0.25, 0.125]]

    def test_clip_uses_height_then_width_in_place(self):
        b = Boxes([[-5, -5, 50, 50], [10, 20, 30, 25]])
        out = b.clip((20, 40))  # h=20, w=40
        assert out is b
        assert b.tensor.tolist() == [[0, 0, 40, 20], [10, 20, 30, 20]]

    def test_nonempty(self):
        b = Boxes([[0, 0, 1, 1], [0, 0, 0, 1], [0, 0, 1, 0], [0, 0, 2, 2], [3, 3, 2, 5]])
        assert b.nonempty().tolist() == [True, False, False, True, False]
        assert b.nonempty(threshold=1.0).tolist() == [False, False, False, True, False]

    def test_scale_in_place(self):
        b = Boxes([[1, 2, 3, 4]])
        assert b.scale(2.0, 0.5) is b
        assert b.tensor.tolist() == [[2, 1, 6, 2]]

    def test_inside_box(self):
        b = Boxes([[0, 0, 10, 10], [-1, 0, 10, 10], [0, 0, 11, 10], [0, 0, 10, 22]])
        assert b.inside_box((20, 10)).tolist() == [True, False, False, False]
        assert b.inside_box((20, 10), boundary_threshold=1).tolist() == [True, True, True, False]


class TestIndexing:
    def setup_method(self):
        self.t = random_boxes(6)
        self.b = Boxes(self.t)

    def test_int_returns_boxes_of_one(self):
        for i in (0, 5, -1, np.int64(2)):
            out = self.b[i]
            assert isinstance(out, Boxes) and out.tensor.shape == (1, 4)
            assert torch.equal(out.tensor[0], self.t[int(i)])

    def test_slice_mask_and_index_tensor(self):
        mask = torch.tensor([True, False, True, False, False, True])
        idx = torch.tensor([4, 0, 4])
        for item, expected in ((slice(1, 4), self.t[1:4]), (mask, self.t[mask]), (idx, self.t[idx])):
            out = self.b[item]
            assert isinstance(out, Boxes)
            assert torch.equal(out.tensor, expected)
        assert len(self.b[torch.zeros(6, dtype=torch.bool)]) == 0

    def test_len_iter_clone(self):
        assert len(self.b) == 6
        rows = list(self.b)
        assert len(rows) == 6 and torch.equal(rows[3], self.t[3])
        c = self.b.clone()
        c.tensor += 1
        assert torch.equal(self.b.tensor, self.t)

    def test_cat(self):
        parts = [Boxes(self.t[:2]), Boxes(torch.empty(0, 4)), Boxes(self.t[2:])]
        assert torch.equal(Boxes.cat(parts).tensor, self.t)
        assert Boxes.cat([]).tensor.shape == (0, 4)
        with pytest.raises(TypeError, match="Boxes"):
            Boxes.cat([self.b, self.t])

    def test_to_and_device(self):
        assert self.b.device == torch.device("cpu")
        d = self.b.to(torch.float64)
        assert isinstance(d, Boxes) and d.tensor.dtype == torch.float64
        assert self.b.to("meta").device.type == "meta"


class TestPairwise:
    def test_iou_matches_loop_reference(self):
        a, b = random_boxes(7, seed=1), random_boxes(5, seed=2)
        b[0] = a[3]  # an identical pair: IoU exactly 1
        iou = pairwise_iou(Boxes(a), Boxes(b))
        assert iou.shape == (7, 5)
        torch.testing.assert_close(iou.double(), iou_loop(a, b), rtol=1e-5, atol=1e-6)
        assert iou[3, 0] == pytest.approx(1.0)
        torch.testing.assert_close(pairwise_iou(a, b), iou)  # raw tensors accepted

    def test_iou_matches_torchvision(self):
        ops = pytest.importorskip("torchvision.ops")
        a, b = random_boxes(30, seed=3), random_boxes(40, seed=4)
        torch.testing.assert_close(pairwise_iou(a, b), ops.box_iou(a, b))

    def test_ioa_matches_loop_reference(self):
        a, b = random_boxes(4, seed=5), random_boxes(6, seed=6)
        torch.testing.assert_close(pairwise_ioa(a, b).double(), iou_loop(a, b, over_b_only=True), rtol=1e-5, atol=1e-6)
        # b inside a covers all of b: IoA 1 while IoU is small.
        big, small = torch.tensor([[0.0, 0, 100, 100]]), torch.tensor([[10.0, 10, 20, 20]])
        assert pairwise_ioa(big, small).item() == 1.0
        assert pairwise_iou(big, small).item() == pytest.approx(0.01)

    def test_intersection(self):
        a = torch.tensor([[0.0, 0, 4, 4]])
        b = torch.tensor([[2.0, 2, 6, 6], [4.0, 0, 8, 4], [10.0, 10, 12, 12]])
        assert pairwise_intersection(a, b).tolist() == [[4.0, 0.0, 0.0]]

    def test_degenerate_boxes_give_zero_not_nan(self):
        z = torch.tensor([[1.0, 1, 1, 1], [2.0, 2, 2, 5]])
        for f in (pairwise_iou, pairwise_ioa):
            out = f(z, z)
            assert torch.isfinite(out).all() and (out == 0).all()

    def test_empty_inputs(self):
        a = random_boxes(3)
        assert pairwise_iou(a, torch.empty(0, 4)).shape == (3, 0)
        assert pairwise_iou(Boxes([]), a).shape == (0, 3)
        assert pairwise_ioa(torch.empty(0), a).shape == (0, 3)

    def test_bad_input(self):
        with pytest.raises(ValueError, match="boxes2.*\\[N, 4\\]"):
            pairwise_iou(random_boxes(2), torch.zeros(3, 5))
        with pytest.raises(TypeError, match="boxes1"):
            pairwise_iou([[0, 0, 1, 1]], random_boxes(2))


class TestConversions:
    def test_tensor_round_trip_with_batch_dims(self):
        xyxy = random_boxes(12).reshape(3, 4, 4)
        xywh = xyxy_to_xywh(xyxy)
        torch.testing.assert_close(xywh[..., 2:], xyxy[..., 2:] - xyxy[..., :2])
        torch.testing.assert_close(xywh[..., :2], xyxy[..., :2])
        torch.testing.assert_close(xywh_to_xyxy(xywh), xyxy)

    def test_coco_list_and_numpy(self):
        assert xywh_to_xyxy([10, 20, 5, 7]) == [10.0, 20.0, 15.0, 27.0]
        assert xyxy_to_xywh((10, 20, 15, 27)) == [10.0, 20.0, 5.0, 7.0]
        arr = np.array([[1.0, 2.0, 3.0, 4.0]])
        out = xywh_to_xyxy(arr)
        assert isinstance(out, np.ndarray) and out.tolist() == [[1.0, 2.0, 4.0, 6.0]]

    def test_bad_shape(self):
        with pytest.raises(ValueError, match=r"\[\.\.\., 4\]"):
            xywh_to_xyxy(torch.zeros(2, 3))
        with pytest.raises(ValueError, match="4 numbers"):
            xyxy_to_xywh([1, 2, 3])
