"""detcore.layers.batched_nms against a per-category loop of the reference NMS and torchvision.

The CPU kernel runs one class-masked pass for small inputs and independent per-class NMS for
large ones; the sizes below straddle the switch (a few thousand boxes) so both are compared.
"""
import pytest
import torch

from detcore.layers import OpArgumentError, batched_nms, nms

try:
    from .reference_ops import batched_nms_reference, distinct_scores, random_boxes
except ImportError:  # tests/ run as rootdir-relative modules, without packages
    from reference_ops import batched_nms_reference, distinct_scores, random_boxes

try:
    from torchvision.ops.boxes import _batched_nms_vanilla as tv_batched_nms_vanilla
except ImportError:  # torchvision missing, or a version without this private helper
    tv_batched_nms_vanilla = None


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def _inputs(n, num_classes, seed, dtype=torch.float32, xy_max=1000.0):
    g = _gen(seed)
    boxes = random_boxes(n, g, dtype, xy_max=xy_max)
    scores = distinct_scores(n, g, dtype)
    idxs = torch.randint(0, num_classes, (n,), generator=g)
    return boxes, scores, idxs


def _check(boxes, scores, idxs, iou_threshold):
    got = batched_nms(boxes, scores, idxs, iou_threshold)
    assert got.dtype == torch.int64 and got.dim() == 1
    expected = batched_nms_reference(boxes, scores, idxs, iou_threshold)
    assert torch.equal(got, expected), (got, expected)
    if tv_batched_nms_vanilla is not None:
        # torchvision's vanilla path (a loop of nms per class) is exact; its default path shifts
        # boxes per class, which can round IoUs near the threshold.
        assert torch.equal(got, tv_batched_nms_vanilla(boxes, scores, idxs, iou_threshold))
    return got


def test_import_paths_are_the_same_function():
    from detcore.layers.nms import batched_nms as from_module

    assert from_module is batched_nms


# 4096/4097 sit on either side of the CPU kernel's switch to per-class NMS.
@pytest.mark.parametrize("n", [1, 3, 60, 1000, 4096, 4097, 6000])
@pytest.mark.parametrize("num_classes", [1, 5, 80])
def test_matches_reference_across_sizes(n, num_classes):
    boxes, scores, idxs = _inputs(n, num_classes, seed=n + num_classes, xy_max=600.0)
    _check(boxes, scores, idxs, 0.5)


@pytest.mark.parametrize("iou_threshold", [0.0, 0.5, 0.7, 1.0])
def test_large_input_many_classes(iou_threshold):
    boxes, scores, idxs = _inputs(20000, 80, seed=1)
    keep = _check(boxes, scores, idxs, iou_threshold)
    assert bool((scores[keep][:-1] > scores[keep][1:]).all())


@pytest.mark.parametrize("n", [500, 20000])
def test_small_and_large_paths_agree_with_each_other(n):
    # The same boxes through both strategies: the small path on each class alone, the large
    # (or small) one on all of them together. Per-class results must be the same.
    boxes, scores, idxs = _inputs(n, 7, seed=2)
    keep = batched_nms(boxes, scores, idxs, 0.6)
    for c in range(7):
        members = torch.nonzero(idxs == c).flatten()
        alone = members[nms(boxes[members], scores[members], 0.6)]
        assert torch.equal(keep[idxs[keep] == c], alone)


def test_float64():
    boxes, scores, idxs = _inputs(5000, 10, seed=3, dtype=torch.float64)
    _check(boxes, scores, idxs, 0.55)
    boxes, scores, idxs = _inputs(300, 10, seed=4, dtype=torch.float64)
    _check(boxes, scores, idxs, 0.55)


def test_one_class_equals_plain_nms():
    for n in (800, 9000):
        boxes, scores, _ = _inputs(n, 1, seed=5)
        idxs = torch.full((n,), 3, dtype=torch.int64)
        assert torch.equal(batched_nms(boxes, scores, idxs, 0.5), nms(boxes, scores, 0.5))


def test_different_classes_never_suppress_each_other():
    boxes = torch.tensor([[0.0, 0.0, 10.0, 10.0]]).repeat(4, 1)
    scores = torch.tensor([0.5, 0.9, 0.7, 0.8])
    idxs = torch.tensor([0, 1, 2, 1])
    assert batched_nms(boxes, scores, idxs, 0.5).tolist() == [1, 2, 0]


def test_empty_input_returns_empty_int64():
    got = batched_nms(torch.zeros(0, 4), torch.zeros(0), torch.zeros(0, dtype=torch.int64), 0.5)
    assert got.shape == (0,) and got.dtype == torch.int64


@pytest.mark.parametrize("n", [400, 8000])
def test_unusual_category_ids(n):
    # Negative, huge and int32 ids: categories are labels, not offsets.
    boxes, scores, idxs = _inputs(n, 4, seed=6, xy_max=500.0)
    table = torch.tensor([-7, 0, 123456789, 2**40])
    labels = table[idxs]
    got = _check(boxes, scores, labels, 0.5)
    assert torch.equal(got, batched_nms(boxes, scores, idxs, 0.5))
    small = torch.tensor([-7, 0, 1234567, 3], dtype=torch.int32)[idxs]
    assert torch.equal(batched_nms(boxes, scores, small, 0.5), got)


def test_equal_scores_are_stable():
    for n in (300, 6000):
        boxes, _, idxs = _inputs(n, 3, seed=7, xy_max=400.0)
        scores = torch.full((n,), 0.5)
        got = batched_nms(boxes, scores, idxs, 0.5)
        assert torch.equal(got, batched_nms_reference(boxes, scores, idxs, 0.5))


def test_non_contiguous_inputs():
    for n in (500, 6000):
        boxes, scores, idxs = _inputs(n, 9, seed=8)
        expected = batched_nms_reference(boxes, scores, idxs, 0.5)
        boxes_nc = boxes.t().contiguous().t()
        scores_nc = torch.stack([scores, scores], dim=1)[:, 1]
        idxs_nc = torch.stack([idxs, idxs], dim=1)[:, 0]
        assert not boxes_nc.is_contiguous() and not scores_nc.is_contiguous()
        assert not idxs_nc.is_contiguous()
        assert torch.equal(batched_nms(boxes_nc, scores_nc, idxs_nc, 0.5), expected)


def test_inputs_are_not_modified():
    boxes, scores, idxs = _inputs(6000, 5, seed=9)
    before = (boxes.clone(), scores.clone(), idxs.clone())
    batched_nms(boxes, scores, idxs, 0.5)
    assert all(torch.equal(a, b) for a, b in zip(before, (boxes, scores, idxs)))


def _raises(match, *args):
    with pytest.raises(OpArgumentError, match=match):
        batched_nms(*args)


@pytest.mark.parametrize("kind", ["bool", "uint8", "int32", "float32", "float64"])
def test_category_ids_of_any_real_type(kind):
    """As torchvision: integer, bool and floating ids; distinct values are distinct categories
    (0.5 and 1.0 too, which torchvision's coordinate-offset path would let overlap)."""
    boxes, scores, idxs = _inputs(500, 6, seed=3)
    values = {
        "bool": idxs % 2 == 1,
        "uint8": idxs.to(torch.uint8),
        "int32": idxs.to(torch.int32),
        "float32": idxs.float() * 0.5,
        "float64": idxs.double() * 0.5 - 1,
    }[kind]
    expected = batched_nms_reference(boxes, scores, torch.unique(values, return_inverse=True)[1], 0.5)
    assert torch.equal(batched_nms(boxes, scores, values, 0.5), expected)


def test_bad_input_names_the_argument():
    boxes, scores, idxs = torch.rand(5, 4), torch.rand(5), torch.zeros(5, dtype=torch.int64)
    _raises("idxs", boxes, scores, torch.zeros(4, dtype=torch.int64), 0.5)
    _raises("idxs", boxes, scores, torch.zeros(5, 1, dtype=torch.int64), 0.5)
    _raises("idxs", boxes, scores, torch.tensor([0.0, 1.0, float("nan"), 0.0, 1.0]), 0.5)
    _raises("idxs", boxes, scores, torch.zeros(5, dtype=torch.complex64), 0.5)
    _raises("boxes", torch.rand(5, 5), scores, idxs, 0.5)
    _raises("scores", boxes, torch.rand(4), idxs, 0.5)
    _raises("boxes", torch.randint(0, 9, (5, 4)), scores, idxs, 0.5)


def test_empty_boxes_return_empty_before_the_other_arguments_are_looked_at():
    # torchvision returns an empty result for no boxes whatever the rest is (None included).
    for boxes in (torch.empty(0, 4), torch.empty(0, 4, dtype=torch.float64)):
        keep = batched_nms(boxes, None, None, None)
        assert keep.dtype == torch.int64 and keep.shape == (0,)
    keep = batched_nms(torch.empty(0, 4), torch.empty(0), torch.empty(0, dtype=torch.int64), 0.5)
    assert keep.shape == (0,)


@pytest.mark.skipif(tv_batched_nms_vanilla is None, reason="torchvision's per-category loop")
@pytest.mark.parametrize("n", [300, 3000])
def test_non_finite_boxes_are_kept_per_category(n):
    # torchvision's per-category answer at both sizes (its default path below 1000 boxes shifts
    # every box by NaN or inf and keeps them all: see the batched_nms docstring).
    boxes, scores, idxs = _inputs(n, 4, seed=11, xy_max=200.0)
    g = _gen(12)
    bad = torch.rand(n, generator=g) < 0.3
    values = torch.tensor([float("nan"), float("inf"), -float("inf")])
    boxes[bad, torch.randint(0, 4, (n,), generator=g)[bad]] = values[torch.randint(0, 3, (n,), generator=g)[bad]]
    got = batched_nms(boxes, scores, idxs, 0.5)
    assert torch.equal(got, tv_batched_nms_vanilla(boxes, scores, idxs, 0.5))
    assert bad[got].sum() == bad.sum()  # every non-finite box kept
