import math

import pytest
import torch

from detcore.modeling.box_regression import Box2BoxTransform, box_loss, box_regression_loss, giou_loss


def _random_boxes(n, max_coord=600.0, min_size=1.0, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(n, 2, generator=g, dtype=torch.float64) * max_coord
    wh = torch.rand(n, 2, generator=g, dtype=torch.float64) * max_coord + min_size
    return torch.cat([xy, xy + wh], dim=1).to(dtype)


def test_get_deltas_hand_computed():
    src = torch.tensor([[0.0, 0.0, 10.0, 20.0]])  # center (5, 10), size 10 x 20
    tgt = torch.tensor([[2.0, 4.0, 22.0, 24.0]])  # center (12, 14), size 20 x 20
    deltas = Box2BoxTransform((1.0, 1.0, 1.0, 1.0)).get_deltas(src, tgt)
    expected = torch.tensor([[7.0 / 10, 4.0 / 20, math.log(2.0), 0.0]])
    torch.testing.assert_close(deltas, expected)
    weighted = Box2BoxTransform((10.0, 10.0, 5.0, 5.0)).get_deltas(src, tgt)
    torch.testing.assert_close(weighted, expected * torch.tensor([10.0, 10.0, 5.0, 5.0]))


@pytest.mark.parametrize("weights", [(1.0, 1.0, 1.0, 1.0), (10.0, 10.0, 5.0, 5.0), (2.0, 3.0, 0.5, 7.0)])
@pytest.mark.parametrize("max_coord", [50.0, 4000.0])
def test_round_trip(weights, max_coord):
    coder = Box2BoxTransform(weights)
    # Sizes within a factor 51 of each other: below the clamp at 1000 / 16.
    src = _random_boxes(500, max_coord, min_size=max_coord / 50, seed=1, dtype=torch.float64)
    tgt = _random_boxes(500, max_coord, min_size=max_coord / 50, seed=2, dtype=torch.float64)
    deltas = coder.get_deltas(src, tgt)
    assert (deltas[:, 2:] / torch.tensor(weights[2:], dtype=torch.float64)).abs().max() < coder.scale_clamp
    torch.testing.assert_close(coder.apply_deltas(deltas, src), tgt, rtol=0, atol=1e-9 * max_coord)


def test_round_trip_float32_large_boxes():
    coder = Box2BoxTransform((10.0, 10.0, 5.0, 5.0))
    src = _random_boxes(300, 3000.0, min_size=100.0, seed=3)
    tgt = _random_boxes(300, 3000.0, min_size=100.0, seed=4)
    out = coder.apply_deltas(coder.get_deltas(src, tgt), src)
    torch.testing.assert_close(out, tgt, rtol=1e-5, atol=1e-2)


def test_apply_deltas_class_specific_columns():
    coder = Box2BoxTransform((10.0, 10.0, 5.0, 5.0))
    boxes = _random_boxes(7, seed=5)
    g = torch.Generator().manual_seed(6)
    deltas = torch.randn(7, 3 * 4, generator=g)
    out = coder.apply_deltas(deltas, boxes)
    assert out.shape == (7, 12)
    for k in range(3):
        torch.testing.assert_close(out[:, 4 * k : 4 * k + 4], coder.apply_deltas(deltas[:, 4 * k : 4 * k + 4], boxes))


def test_apply_deltas_zero_deltas_is_identity():
    boxes = _random_boxes(20, seed=7)
    out = Box2BoxTransform((1.0, 1.0, 1.0, 1.0)).apply_deltas(torch.zeros(20, 4), boxes)
    torch.testing.assert_close(out, boxes)


def test_apply_deltas_decodes_half_precision_in_float32():
    coder = Box2BoxTransform((1.0, 1.0, 1.0, 1.0))
    boxes = torch.tensor([[1000.0, 1000.0, 1100.0, 1050.0]])
    deltas = torch.tensor([[0.01, 0.0, 0.0, 0.0]])
    out = coder.apply_deltas(deltas.to(torch.bfloat16), boxes)
    assert out.dtype == torch.float32
    # bfloat16 cannot hold 1001 (its spacing there is 8); the decoded box must.
    torch.testing.assert_close(out, coder.apply_deltas(deltas.to(torch.bfloat16).float(), boxes))
    assert coder.apply_deltas(deltas.double(), boxes).dtype == torch.float64


def test_scale_clamp_limits_growth():
    coder = Box2BoxTransform((1.0, 1.0, 1.0, 1.0))
    boxes = torch.tensor([[0.0, 0.0, 16.0, 16.0]])
    out = coder.apply_deltas(torch.tensor([[0.0, 0.0, 1e4, 1e4]]), boxes)
    assert torch.isfinite(out).all()
    # exp(log(1000 / 16)) * 16 = 1000, centered on (8, 8).
    torch.testing.assert_close(out, torch.tensor([[8.0 - 500.0, 8.0 - 500.0, 8.0 + 500.0, 8.0 + 500.0]]))
    # The clamp applies to dw / ww, and only from above (shrinking is not limited).
    custom = Box2BoxTransform((1.0, 1.0, 2.0, 2.0), scale_clamp=math.log(2.0))
    out = custom.apply_deltas(torch.tensor([[0.0, 0.0, 10.0, -2.0]]), boxes)
    torch.testing.assert_close(out[0, 2] - out[0, 0], torch.tensor(32.0))
    torch.testing.assert_close(out[0, 3] - out[0, 1], torch.tensor(16.0 * math.exp(-1.0)))


def test_matches_torchvision_box_coder():
    det_utils = pytest.importorskip("torchvision.models.detection._utils")
    weights = (10.0, 10.0, 5.0, 5.0)
    clamp = math.log(1000.0 / 16)
    ours = Box2BoxTransform(weights, scale_clamp=clamp)
    theirs = det_utils.BoxCoder(weights, bbox_xform_clip=clamp)
    src = _random_boxes(200, 800.0, seed=8)
    tgt = _random_boxes(200, 800.0, seed=9)
    # torchvision: encode_single(reference=gt, proposals=src); decode_single(codes, boxes).
    torch.testing.assert_close(ours.get_deltas(src, tgt), theirs.encode_single(tgt, src), rtol=1e-5, atol=1e-5)
    deltas = torch.randn(200, 4, generator=torch.Generator().manual_seed(10)) * 3
    torch.testing.assert_close(ours.apply_deltas(deltas, src), theirs.decode_single(deltas, src), rtol=1e-5, atol=1e-3)


def test_bad_input_raises():
    coder = Box2BoxTransform((1.0, 1.0, 1.0, 1.0))
    with pytest.raises(ValueError, match="weights"):
        Box2BoxTransform((1.0, 1.0))
    with pytest.raises(ValueError, match="src_boxes"):
        coder.get_deltas(torch.zeros(3, 5), torch.zeros(3, 4))
    with pytest.raises(ValueError, match="paired"):
        coder.get_deltas(torch.ones(3, 4), torch.ones(2, 4))
    with pytest.raises(ValueError, match="deltas"):
        coder.apply_deltas(torch.zeros(3, 6), torch.ones(3, 4))
    with pytest.raises(ValueError, match="rows"):
        coder.apply_deltas(torch.zeros(3, 4), torch.ones(2, 4))


def test_box_regression_loss():
    g = torch.Generator().manual_seed(11)
    pred, target = torch.randn(30, 4, generator=g), torch.randn(30, 4, generator=g)
    l1 = (pred - target).abs().sum()
    torch.testing.assert_close(box_regression_loss(pred, target, "l1"), l1)
    torch.testing.assert_close(box_regression_loss(pred, target, "smooth_l1", 0.0), l1)
    beta = 0.5
    d = (pred - target).abs()
    smooth = torch.where(d < beta, 0.5 * d**2 / beta, d - 0.5 * beta).sum()
    torch.testing.assert_close(box_regression_loss(pred, target, "smooth_l1", beta), smooth)
    with pytest.raises(ValueError, match="loss_type"):
        box_regression_loss(pred, target, "l2")


def test_giou_loss():
    a = torch.tensor([[0.0, 0.0, 10.0, 10.0], [0.0, 0.0, 10.0, 10.0], [0.0, 0.0, 10.0, 10.0]])
    b = torch.tensor([[0.0, 0.0, 10.0, 10.0], [0.0, 0.0, 10.0, 5.0], [20.0, 0.0, 30.0, 10.0]])
    # Per pair: 1 - 1 = 0; 1 - 0.5 = 0.5; disjoint: IoU 0, hull 300, union 200 -> 1 + 100/300.
    per_pair = [giou_loss(a[i : i + 1], b[i : i + 1]) for i in range(3)]
    torch.testing.assert_close(torch.stack(per_pair), torch.tensor([0.0, 0.5, 1.0 + 1.0 / 3.0]), atol=1e-5, rtol=0)
    torch.testing.assert_close(giou_loss(a, b), sum(per_pair))


def test_box_loss_is_the_delta_loss_or_giou_of_the_decoded_boxes():
    coder = Box2BoxTransform((10.0, 10.0, 5.0, 5.0))
    src, gt = _random_boxes(20, seed=3), _random_boxes(20, seed=4)
    deltas = torch.randn(20, 4, generator=torch.Generator().manual_seed(5)) * 0.5
    target = coder.get_deltas(src, gt)
    torch.testing.assert_close(box_loss(coder, src, deltas, gt, "l1"), (deltas - target).abs().sum())
    torch.testing.assert_close(
        box_loss(coder, src, deltas, gt, "smooth_l1", 0.3), box_regression_loss(deltas, target, "smooth_l1", 0.3)
    )
    torch.testing.assert_close(box_loss(coder, src, deltas, gt, "giou"), giou_loss(coder.apply_deltas(deltas, src), gt))
    # Half-precision deltas (AMP) are scored in float32.
    half = box_loss(coder, src, deltas.half(), gt, "l1")
    assert half.dtype == torch.float32
    torch.testing.assert_close(half, (deltas.half().float() - target).abs().sum())
