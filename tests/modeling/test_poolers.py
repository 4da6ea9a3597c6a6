import math

import pytest
import torch

from detcore.layers import roi_align
from detcore.modeling.poolers import ROIPooler, assign_boxes_to_levels
from detcore.structures import Boxes

SCALES = (1 / 4, 1 / 8, 1 / 16, 1 / 32)  # p2..p5


def _square(cx, cy, side):
    return [cx - side / 2, cy - side / 2, cx + side / 2, cy + side / 2]


def _features(batch=2, channels=3, size=64, dtype=torch.float32, requires_grad=False):
    # p2 of a (4 * size)-pixel image, then halving.
    g = torch.Generator().manual_seed(0)
    return [
        torch.randn(batch, channels, size >> k, size >> k, generator=g, dtype=dtype).requires_grad_(requires_grad)
        for k in range(len(SCALES))
    ]


def _reference_level(box, min_level=2, max_level=5):
    """The FPN rule written out for one box (absolute level)."""
    x1, y1, x2, y2 = box
    side = math.sqrt((x2 - x1) * (y2 - y1))
    level = math.floor(4 + math.log2(side / 224 + 1e-8))
    return min(max(level, min_level), max_level)


def test_level_mapping_canonical_sizes():
    boxes = Boxes(torch.tensor([_square(200, 200, s) for s in (224, 112, 56, 448, 2.0, 5000.0, 0.0)]))
    levels = assign_boxes_to_levels([boxes], min_level=2, max_level=5, canonical_box_size=224, canonical_level=4)
    assert levels.dtype == torch.int64
    # 224 -> p4, 112 -> p3, 56 -> p2, 448 -> p5, tiny / zero -> finest (p2), huge -> coarsest (p5).
    assert (levels + 2).tolist() == [4, 3, 2, 5, 2, 5, 2]


def test_level_mapping_matches_formula_on_random_boxes():
    g = torch.Generator().manual_seed(1)
    xy = torch.rand(200, 2, generator=g) * 500
    wh = torch.rand(200, 2, generator=g) * 700 + 0.5
    boxes = torch.cat([xy, xy + wh], dim=1)
    split = [Boxes(boxes[:80]), Boxes(boxes[80:])]
    levels = assign_boxes_to_levels(split, 2, 5, 224, 4)
    expected = [_reference_level(b) - 2 for b in boxes.tolist()]
    assert levels.tolist() == expected


def test_level_mapping_uses_canonical_arguments():
    boxes = Boxes(torch.tensor([_square(50, 50, 100)]))
    # With canonical size 100 at level 3 a 100-pixel box lands exactly on level 3.
    assert assign_boxes_to_levels([boxes], 2, 5, 100, 3).tolist() == [1]


def test_pooler_equals_per_level_roi_align_by_hand():
    x = _features()
    boxes = [
        Boxes(torch.tensor([_square(100, 100, 20), _square(120, 90, 230), _square(60, 70, 110), _square(128, 128, 250)])),
        Boxes(torch.tensor([_square(30, 40, 500), _square(200, 20, 60)])),
    ]
    pooler = ROIPooler(output_size=5, scales=SCALES, sampling_ratio=2, aligned=True)
    out = pooler(x, boxes)
    assert out.shape == (6, 3, 5, 5)
    row = 0
    for img, bl in enumerate(boxes):
        for box in bl.tensor:
            level = _reference_level(box.tolist()) - 2
            expected = roi_align(x[level][img : img + 1], [box[None]], 5, SCALES[level], 2, True)
            torch.testing.assert_close(out[row : row + 1], expected)
            row += 1


def test_pooler_order_preserved_under_permutation():
    x = _features(batch=1)
    g = torch.Generator().manual_seed(3)
    xy = torch.rand(30, 2, generator=g) * 200
    wh = torch.rand(30, 2, generator=g) * 300 + 4
    boxes = torch.cat([xy, xy + wh], dim=1)
    pooler = ROIPooler(output_size=(4, 3), scales=SCALES, sampling_ratio=0)
    out = pooler(x, [Boxes(boxes)])
    assert out.shape == (30, 3, 4, 3)
    perm = torch.randperm(30, generator=g)
    out_perm = pooler(x, [Boxes(boxes[perm])])
    torch.testing.assert_close(out_perm, out[perm])


def test_pooler_against_torchvision_multiscale_roi_align():
    torchvision = pytest.importorskip("torchvision")
    from collections import OrderedDict

    x = _features(batch=2)
    # Sizes away from level boundaries: torchvision puts its eps in a slightly different place.
    boxes = [
        Boxes(torch.tensor([_square(100, 100, 30), _square(120, 90, 150), _square(60, 70, 300)])),
        Boxes(torch.tensor([_square(130, 140, 80), _square(128, 128, 600)])),
    ]
    ours = ROIPooler(output_size=7, scales=SCALES, sampling_ratio=2, aligned=False)(x, boxes)
    feats = OrderedDict((f"p{k + 2}", f) for k, f in enumerate(x))
    tv = torchvision.ops.MultiScaleRoIAlign(list(feats), output_size=7, sampling_ratio=2)
    expected = tv(feats, [b.tensor for b in boxes], [(256, 256), (256, 256)])
    torch.testing.assert_close(ours, expected, rtol=1e-4, atol=1e-5)


def test_pooler_single_level_and_batch_index():
    x = [torch.arange(2 * 1 * 8 * 8, dtype=torch.float32).view(2, 1, 8, 8)]
    boxes = [Boxes(torch.tensor([[0.0, 0.0, 16.0, 16.0]])), Boxes(torch.tensor([[0.0, 0.0, 16.0, 16.0]]))]
    pooler = ROIPooler(output_size=2, scales=(1 / 2,), sampling_ratio=1)
    out = pooler(x, boxes)
    expected = roi_align(x[0], [b.tensor for b in boxes], 2, 0.5, 1, True)
    torch.testing.assert_close(out, expected)
    # Same box, different images: the second row reads image 1 (values offset by 64).
    torch.testing.assert_close(out[1] - out[0], torch.full_like(out[0], 64.0))


def test_pooler_empty_boxes():
    x = _features(batch=2)
    out = ROIPooler(7, SCALES, 0)(x, [Boxes(torch.zeros(0, 4)), Boxes(torch.zeros(0, 4))])
    assert out.shape == (0, 3, 7, 7)


def test_pooler_gradient_reaches_every_level():
    x = _features(batch=1, dtype=torch.float64, requires_grad=True)
    # One p2-sized box only: p3..p5 get zero gradients (not None), which keeps DDP happy.
    out = ROIPooler(3, SCALES, 2)(x, [Boxes(torch.tensor([_square(40, 40, 20)], dtype=torch.float64))])
    out.sum().backward()
    assert x[0].grad is not None and x[0].grad.abs().sum() > 0
    for f in x[1:]:
        assert f.grad is not None and f.grad.abs().sum() == 0


def test_pooler_gradcheck():
    x = [f[:, :1, :8, :8] for f in _features(batch=1, dtype=torch.float64)]
    x = [f.clone().requires_grad_(True) for f in x[:2]]
    boxes = [Boxes(torch.tensor([_square(10, 10, 8), _square(16, 16, 170)], dtype=torch.float64))]
    pooler = ROIPooler(2, SCALES[:2], 2)
    assert torch.autograd.gradcheck(lambda a, b: pooler([a, b], boxes), tuple(x))


def test_pooler_bad_arguments():
    with pytest.raises(ValueError, match="powers of 1/2"):
        ROIPooler(7, (1 / 3,), 0)
    with pytest.raises(ValueError, match="fine to coarse"):
        ROIPooler(7, (1 / 4, 1 / 16), 0)
    pooler = ROIPooler(7, SCALES, 0)
    x = _features(batch=2)
    with pytest.raises(ValueError, match="4 feature maps"):
        pooler(x[:3], [Boxes(torch.zeros(0, 4))] * 2)
    with pytest.raises(ValueError, match="box lists"):
        pooler(x, [Boxes(torch.zeros(0, 4))])
    with pytest.raises(TypeError, match="Boxes"):
        pooler(x, [torch.zeros(0, 4)] * 2)
