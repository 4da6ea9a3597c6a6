"""detcore.layers.nms against a plain-PyTorch greedy NMS and torchvision.ops.nms."""
import pytest
import torch

from detcore.layers import batched_nms, nms

try:
    from .reference_ops import batched_nms_reference, distinct_scores, nms_reference, random_boxes
except ImportError:  # tests/ run as rootdir-relative modules, without packages
    from reference_ops import batched_nms_reference, distinct_scores, nms_reference, random_boxes

try:
    import torchvision
except ImportError:  # detcore works without torchvision; only the comparisons to it skip
    torchvision = None

needs_torchvision = pytest.mark.skipif(torchvision is None, reason="torchvision not importable")


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def _check(boxes, scores, iou_threshold):
    """nms equals the reference (and torchvision, where it imports) exactly."""
    got = nms(boxes, scores, iou_threshold)
    assert got.dtype == torch.int64 and got.dim() == 1
    expected = nms_reference(boxes, scores, iou_threshold)
    assert torch.equal(got, expected), (got, expected)
    if torchvision is not None:
        assert torch.equal(got, torchvision.ops.nms(boxes, scores, iou_threshold))
    return got


def test_import_paths_are_the_same_function():
    from detcore.layers.nms import nms as nms_from_module

    assert nms_from_module is nms


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n", [2, 17, 300, 2000])
@pytest.mark.parametrize("iou_threshold", [0.0, 0.3, 0.5, 0.7, 1.0])
def test_random_boxes_match_reference(n, iou_threshold, dtype):
    g = _gen(n)
    boxes = random_boxes(n, g, dtype)
    scores = distinct_scores(n, g, dtype)
    _check(boxes, scores, iou_threshold)


def test_empty_input_returns_empty_int64():
    for dtype in (torch.float32, torch.float64):
        got = nms(torch.zeros(0, 4, dtype=dtype), torch.zeros(0, dtype=dtype), 0.5)
        assert got.shape == (0,) and got.dtype == torch.int64


def test_one_box_is_kept():
    boxes = torch.tensor([[1.0, 2.0, 3.0, 5.0]])
    assert nms(boxes, torch.tensor([0.3]), 0.5).tolist() == [0]
    assert nms(boxes, torch.tensor([0.3]), 0.0).tolist() == [0]


def test_output_sorted_by_decreasing_score():
    g = _gen(1)
    boxes = random_boxes(500, g)
    scores = distinct_scores(500, g)
    keep = nms(boxes, scores, 0.5)
    assert len(keep) > 1
    assert bool((scores[keep][:-1] > scores[keep][1:]).all())


def test_equal_scores_keep_input_order():
    # Far-apart boxes, all kept: the output is 0..n-1, lower index first on ties.
    boxes = torch.tensor([[10.0 * i, 0.0, 10.0 * i + 5, 5.0] for i in range(50)])
    scores = torch.full((50,), 0.5)
    assert nms(boxes, scores, 0.5).tolist() == list(range(50))
    # Overlapping boxes with all-equal scores: the earlier box wins every tie.
    g = _gen(2)
    boxes = random_boxes(400, g, xy_max=300.0)
    scores = torch.full((400,), 0.25)
    got = nms(boxes, scores, 0.5)
    assert torch.equal(got, nms_reference(boxes, scores, 0.5))
    assert got[0] == 0 and bool((got[1:] > got[:-1]).all())


def test_partial_ties_are_stable():
    g = _gen(3)
    boxes = random_boxes(600, g, xy_max=400.0)
    scores = torch.randint(0, 8, (600,), generator=g).float() / 8  # many ties per value
    got = nms(boxes, scores, 0.4)
    assert torch.equal(got, nms_reference(boxes, scores, 0.4))


def test_identical_boxes():
    boxes = torch.tensor([[3.0, 4.0, 20.0, 30.0]]).repeat(6, 1)
    scores = torch.tensor([0.1, 0.9, 0.3, 0.5, 0.7, 0.2])
    assert nms(boxes, scores, 0.5).tolist() == [1]
    assert nms(boxes, scores, 0.999).tolist() == [1]
    # IoU is exactly 1, which is not > 1: nothing is suppressed, all come back by score.
    assert nms(boxes, scores, 1.0).tolist() == [1, 4, 3, 2, 5, 0]


def test_zero_area_and_negative_size_boxes():
    g = _gen(4)
    boxes = random_boxes(300, g, xy_max=200.0)
    boxes[::5, 2] = boxes[::5, 0]  # zero width
    boxes[1::5, 3] = boxes[1::5, 1]  # zero height
    boxes[2::5, 2] = boxes[2::5, 0] - 7.0  # negative width
    boxes[3::7, :2], boxes[3::7, 2:] = boxes[3::7, 2:].clone(), boxes[3::7, :2].clone()  # flipped
    scores = distinct_scores(300, g)
    for thr in (0.0, 0.5, 1.0):
        _check(boxes, scores, thr)
    # Degenerate boxes never suppress anything (IoU is 0 or 0/0) and are never suppressed.
    points = torch.tensor([[5.0, 5.0, 5.0, 5.0], [5.0, 5.0, 5.0, 5.0], [5.0, 5.0, 9.0, 5.0]])
    assert nms(points, torch.tensor([0.9, 0.8, 0.7]), 0.0).tolist() == [0, 1, 2]
    inverted = torch.tensor([[10.0, 10.0, 0.0, 0.0], [10.0, 10.0, 0.0, 0.0]])
    assert nms(inverted, torch.tensor([0.9, 0.8]), 0.0).tolist() == [0, 1]


def _with_non_finite(boxes, g, fraction):
    """A copy of boxes with one coordinate of about `fraction` of them NaN, inf or -inf."""
    n = len(boxes)
    boxes = boxes.clone()
    bad = torch.rand(n, generator=g) < fraction
    values = torch.tensor([float("nan"), float("inf"), -float("inf")], dtype=boxes.dtype)
    column = torch.randint(0, 4, (n,), generator=g)[bad]
    boxes[bad, column] = values[torch.randint(0, 3, (n,), generator=g)[bad]]
    return boxes, bad


def test_non_finite_boxes_are_kept_and_suppress_nothing():
    # The documented rule, by hand: with a threshold >= 0 a box with a NaN or infinite coordinate
    # is kept and suppresses no box; a finite duplicate is still suppressed by its finite twin.
    boxes = torch.tensor([
        [0.0, 0.0, 10.0, 10.0],
        [0.0, 0.0, 10.0, float("nan")],
        [0.0, 0.0, float("inf"), 10.0],
        [-float("inf"), -float("inf"), float("inf"), float("inf")],
        [0.0, 0.0, 10.0, 10.0],
        [float("inf"), 0.0, float("inf"), 10.0],
    ])
    scores = torch.tensor([0.5, 0.9, 0.8, 0.7, 0.4, 0.6])
    for threshold in (0.0, 0.5, 1.0):
        expected = [1, 2, 3, 5, 0] + ([4] if threshold == 1.0 else [])
        assert nms(boxes, scores, threshold).tolist() == expected
        one_category = torch.zeros(6, dtype=torch.int64)
        assert batched_nms(boxes, scores, one_category, threshold).tolist() == expected
    # Below 0 the arithmetic decides: box 2's IoU with the finite boxes is 0 (an infinite
    # union), above -0.5, while its IoU with box 3 and the NaN box's with any box are NaN.
    assert nms(boxes, scores, -0.5).tolist() == [1, 2, 3, 5]
    _check(boxes, scores, -0.5)


@pytest.mark.parametrize("threshold", [-0.5, -1e-300, 0.0, 0.5, 1.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_non_finite_boxes_follow_the_iou_arithmetic(threshold, dtype):
    # The plain-PyTorch reference's IoU (and torchvision's) on many non-finite boxes, on both
    # sides of the kernel's switch to its grid walk (512 boxes).
    for n in (300, 700):
        g = _gen(20 + n)
        boxes, _ = _with_non_finite(random_boxes(n, g, xy_max=200.0).to(dtype), g, 0.3)
        _check(boxes, distinct_scores(n, g).to(dtype), threshold)


def _ious_computed(call):
    """call()'s result and the number of IoUs the CPU NMS walks computed for it (a counter the
    kernels keep for such checks: cost is checked by counting the work, not by timing it)."""
    from detcore import _C  # loaded by the ops

    before = _C._nms_iou_count()
    result = call()
    return result, _C._nms_iou_count() - before


def test_the_iou_counter_counts_every_iou():
    # 300 disjoint boxes (the plain walk): every box is kept and tests every later box.
    n = 300
    x = torch.arange(n, dtype=torch.float32) * 20
    boxes = torch.stack([x, torch.zeros(n), x + 10, torch.full((n,), 10.0)], 1)
    kept, ious = _ious_computed(lambda: nms(boxes, torch.rand(n, generator=_gen(3)), 0.5))
    assert len(kept) == n and ious == n * (n - 1) // 2


@pytest.mark.parametrize("n", [400, 20_000])  # the plain walk; the grid walk
def test_non_finite_boxes_cost_no_iou(n):
    # The reproducer (10^6 boxes with NaN coordinates: minutes) scaled down: every kept
    # box used to test every non-finite one. Now the answer is every non-finite box plus the NMS
    # of the finite ones, and the call computes exactly the IoUs of the finite boxes' NMS alone:
    # the non-finite boxes never enter a walk.
    g = _gen(21)
    xy = torch.rand(n, 2, generator=g) * (5000 if n > 1000 else 500)
    boxes = torch.cat([xy, xy + 10 + torch.rand(n, 2, generator=g) * 90], 1)
    boxes, bad = _with_non_finite(boxes, g, 0.5)
    scores = torch.rand(n, generator=g)
    idxs = torch.randint(0, 3, (n,), generator=g)
    finite = (~bad).nonzero().flatten()

    def by_score(keep):
        keep = keep.sort().values
        return keep[scores[keep].sort(descending=True, stable=True).indices]

    for op, args in ((nms, ()), (batched_nms, (idxs,))):
        finite_args = [a[finite] for a in args]
        kept_finite, finite_ious = _ious_computed(lambda: op(boxes[finite], scores[finite], *finite_args, 0.5))
        kept, ious = _ious_computed(lambda: op(boxes, scores, *args, 0.5))
        assert torch.equal(kept, by_score(torch.cat([bad.nonzero().flatten(), finite[kept_finite]])))
        assert finite_ious > 0
        assert ious == finite_ious, op.__name__


def test_iou_exactly_at_threshold_is_not_suppressed():
    scores = torch.tensor([0.9, 0.8])
    half = torch.tensor([[0.0, 0.0, 2.0, 1.0], [0.0, 0.0, 1.0, 1.0]])  # IoU exactly 0.5
    quarter = torch.tensor([[0.0, 0.0, 10.0, 10.0], [0.0, 0.0, 5.0, 5.0]])  # IoU exactly 0.25
    for dtype in (torch.float32, torch.float64):
        s = scores.to(dtype)
        assert nms(half.to(dtype), s, 0.5).tolist() == [0, 1]
        assert nms(half.to(dtype), s, 0.49999).tolist() == [0]
        assert nms(quarter.to(dtype), s, 0.25).tolist() == [0, 1]
        assert nms(quarter.to(dtype), s, 0.2499).tolist() == [0]


def test_threshold_compared_like_torchvision():
    # IoU = 1/10. In float32 that is 0.100000001 > 0.1, so torchvision (which compares the float
    # IoU to the double threshold) suppresses; in float64 it equals 0.1 and is kept.
    boxes = torch.tensor([[0.0, 0.0, 10.0, 1.0], [0.0, 0.0, 1.0, 1.0]])
    scores = torch.tensor([0.9, 0.8])
    assert _check(boxes, scores, 0.1).tolist() == [0]
    assert _check(boxes.double(), scores.double(), 0.1).tolist() == [0, 1]


def test_threshold_zero_suppresses_any_overlap_but_not_touching():
    boxes = torch.tensor(
        [[0.0, 0.0, 10.0, 10.0], [10.0, 0.0, 20.0, 10.0], [9.99, 9.99, 30.0, 30.0]]
    )
    scores = torch.tensor([0.9, 0.8, 0.7])
    assert _check(boxes, scores, 0.0).tolist() == [0, 1]


def test_threshold_one_keeps_everything():
    g = _gen(5)
    boxes = random_boxes(200, g, xy_max=50.0)
    scores = distinct_scores(200, g)
    keep = _check(boxes, scores, 1.0)
    assert torch.equal(keep, torch.argsort(scores, descending=True))


def test_single_nan_score_matches_torchvision():
    g = _gen(6)
    boxes = random_boxes(100, g, xy_max=200.0)
    scores = distinct_scores(100, g)
    scores[37] = float("nan")  # torch.sort ranks NaN above every number
    keep = _check(boxes, scores, 0.5)
    assert keep[0] == 37


def test_several_nan_scores_rank_first_in_input_order():
    g = _gen(7)
    boxes = random_boxes(100, g, xy_max=200.0)
    scores = distinct_scores(100, g)
    scores[[5, 60, 61]] = float("nan")
    got = nms(boxes, scores, 0.5)
    assert torch.equal(got, nms_reference(boxes, scores, 0.5))


def test_float64_is_computed_in_float64():
    # At x ~ 1e8 float32 cannot tell these boxes' corners apart; float64 sees IoU = 12/20 = 0.6.
    boxes = torch.tensor(
        [[1e8, 0.0, 1e8 + 4, 4.0], [1e8 + 1, 0.0, 1e8 + 5, 4.0]], dtype=torch.float64
    )
    scores = torch.tensor([0.9, 0.8], dtype=torch.float64)
    assert nms(boxes, scores, 0.5).tolist() == [0]
    assert nms(boxes, scores, 0.6).tolist() == [0, 1]
    assert nms(boxes, scores, 0.59).tolist() == [0]


def test_non_contiguous_inputs():
    g = _gen(8)
    boxes = random_boxes(700, g, xy_max=300.0)
    scores = distinct_scores(700, g)
    expected = nms_reference(boxes, scores, 0.5)
    column_major = boxes.t().contiguous().t()
    row_stride_8 = torch.cat([boxes, torch.zeros(700, 4)], dim=1)[:, :4]
    at_offset = torch.stack([boxes + 1, boxes], dim=0)[1]
    every_other_score = torch.stack([-scores, scores], dim=1)[:, 1]
    assert not column_major.is_contiguous() and not row_stride_8.is_contiguous()
    assert not every_other_score.is_contiguous()
    assert torch.equal(nms(column_major, every_other_score, 0.5), expected)
    assert torch.equal(nms(row_stride_8, scores, 0.5), expected)
    assert torch.equal(nms(at_offset, every_other_score, 0.5), expected)


def test_inputs_are_not_modified():
    g = _gen(9)
    boxes = random_boxes(300, g)
    scores = distinct_scores(300, g)
    boxes_before, scores_before = boxes.clone(), scores.clone()
    nms(boxes, scores, 0.5)
    assert torch.equal(boxes, boxes_before) and torch.equal(scores, scores_before)


def test_huge_n():
    g = _gen(10)
    boxes = random_boxes(20000, g)
    scores = distinct_scores(20000, g)
    keep = nms(boxes, scores, 0.5)
    if torchvision is not None:
        assert torch.equal(keep, torchvision.ops.nms(boxes, scores, 0.5))
    else:
        assert torch.equal(keep, nms_reference(boxes, scores, 0.5))


@pytest.mark.slow
def test_100k_boxes_in_separate_tiles():
    # Boxes in far-apart tiles never overlap across tiles, so NMS of all of them is the per-tile
    # NMS merged by score: the per-category reference with tile ids stays cheap at this size.
    g = _gen(11)
    n, side = 100000, 15
    boxes = random_boxes(n, g)
    tile = torch.randint(0, side * side, (n,), generator=g)
    offset = torch.stack([tile % side, tile // side], dim=1).float() * 1500.0
    boxes = boxes + offset.repeat(1, 2)
    scores = distinct_scores(n, g)
    assert torch.equal(nms(boxes, scores, 0.5), batched_nms_reference(boxes, scores, tile, 0.5))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_on_cpu_computes_in_float32(dtype):
    """float16 / bfloat16 boxes are NMS-ed in float32 on their exactly upcast values (ties in the
    rounded scores broken by index), as the CUDA kernel does through its accumulation type."""
    g = _gen(12)
    boxes = random_boxes(100, g, xy_max=200.0, wh_range=(10.0, 60.0)).to(dtype)
    scores = distinct_scores(100, g).to(dtype)
    got = nms(boxes, scores, 0.5)
    assert torch.equal(got, nms_reference(boxes.float(), scores.float(), 0.5))


def _raises(match, *args):
    with pytest.raises((ValueError, RuntimeError), match=match):
        nms(*args)


def test_bad_shapes_name_the_argument():
    boxes, scores = torch.rand(5, 4), torch.rand(5)
    _raises("boxes", torch.rand(5, 3), scores, 0.5)
    _raises("boxes", torch.rand(20), torch.rand(5), 0.5)
    _raises("boxes", torch.rand(5, 4, 1), scores, 0.5)
    _raises("scores", boxes, torch.rand(5, 1), 0.5)
    _raises("scores", boxes, torch.rand(6), 0.5)  # length mismatch


def test_bad_dtypes_name_the_argument():
    _raises("boxes", torch.randint(0, 5, (5, 4)), torch.rand(5), 0.5)
    _raises("scores", torch.rand(5, 4), torch.rand(5).double(), 0.5)
    _raises("boxes", torch.rand(5, 4, dtype=torch.complex64), torch.rand(5), 0.5)


@pytest.mark.parametrize("threshold", [float("nan"), float("inf"), -float("inf")])
def test_a_non_finite_iou_threshold_is_refused(threshold):
    boxes = torch.tensor([[0.0, 0.0, 10.0, 10.0], [1.0, 1.0, 11.0, 11.0]])
    scores = torch.tensor([0.9, 0.8])
    with pytest.raises(ValueError, match=r"nms: iou_threshold must be a finite number"):
        nms(boxes, scores, threshold)
    with pytest.raises(ValueError, match=r"batched_nms: iou_threshold must be a finite number"):
        batched_nms(boxes, scores, torch.tensor([0, 0]), threshold)


FLOAT8 = [getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, n)]


@pytest.mark.parametrize("dtype", FLOAT8)
def test_float8_is_a_clear_error_not_a_dispatch_failure(dtype):
    boxes = torch.tensor([[0.0, 0.0, 10.0, 10.0]]).to(dtype)
    scores = torch.tensor([0.9]).to(dtype)
    with pytest.raises(ValueError, match=r"nms: boxes must be float32, float64, float16 or bfloat16, got Float8"):
        torch.ops.detcore.nms(boxes, scores, 0.5)
    with pytest.raises(ValueError, match=r"batched_nms: boxes must be float32, .* got Float8"):
        torch.ops.detcore.batched_nms(boxes, scores, torch.tensor([0]), 0.5)
