"""The CPU NMS's two walks on inputs that reach each of their paths.

From 512 boxes on, the CPU kernel files the boxes in grids (one per size class, cells sized to
the boxes and to their density) and, where a sampled cost estimate says this beats the plain
walk, a kept box tests only the boxes in the cells near it (detcore/csrc/cpu/nms_grid.h); below
that, the plain walk tests every later box. Boxes no IoU involves (a NaN area; with a threshold
>= 0 also an infinite coordinate, or zero or negative size) are kept without entering either
walk; all other boxes under a negative threshold are in a list scanned by every kept box. Each
test here compares with torchvision's greedy NMS (a plain walk, the semantics we follow bit for
bit) or with an answer known by construction, at sizes on both sides of the switch.
"""
import pytest
import torch

from detcore.layers import batched_nms, nms

try:
    from .reference_ops import batched_nms_reference, distinct_scores, nms_reference, random_boxes
except ImportError:  # tests/ run as rootdir-relative modules, without packages
    from reference_ops import batched_nms_reference, distinct_scores, nms_reference, random_boxes

try:
    import torchvision
except ImportError:
    torchvision = None

needs_torchvision = pytest.mark.skipif(torchvision is None, reason="torchvision not importable")

GRID_MIN_BOXES = 512  # nms_kernel.cpp's kGridMinBoxes


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _same_as_torchvision(boxes, scores, threshold):
    got = nms(boxes, scores, threshold)
    expected = torchvision.ops.nms(boxes, scores, threshold)
    assert torch.equal(got, expected), (len(got), len(expected))
    return got


def _log_uniform_boxes(n, g, lo, hi, canvas, dtype=torch.float32):
    """Boxes of sides log-uniform in [lo, hi] (aspect up to 2), centres uniform on the canvas:
    many size classes, big boxes over small ones, as region proposals are."""
    side = lo * (hi / lo) ** torch.rand(n, generator=g, dtype=torch.float64)
    aspect = 2.0 ** (2 * torch.rand(n, generator=g, dtype=torch.float64) - 1)
    w, h = side * aspect.sqrt(), side / aspect.sqrt()
    cx = torch.rand(n, generator=g, dtype=torch.float64) * canvas[0]
    cy = torch.rand(n, generator=g, dtype=torch.float64) * canvas[1]
    return torch.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], dim=1).to(dtype)


@needs_torchvision
@pytest.mark.parametrize("n", [GRID_MIN_BOXES - 1, GRID_MIN_BOXES, 6000])
@pytest.mark.parametrize("threshold", [0.0, 0.3, 0.7])
def test_many_size_classes(n, threshold):
    g = _gen(n)
    boxes = _log_uniform_boxes(n, g, 2.0, 2000.0, (1333.0, 800.0))
    _same_as_torchvision(boxes, distinct_scores(n, g), threshold)


@needs_torchvision
@pytest.mark.parametrize("xy_max", [50.0, 1000.0, 30000.0])
def test_dense_and_sparse_canvases(xy_max):
    # Cells as wide as half a box (dense), and cells holding 16 boxes each (sparse).
    g = _gen(1)
    boxes = random_boxes(8000, g, xy_max=xy_max)
    _same_as_torchvision(boxes, distinct_scores(8000, g), 0.5)


def test_huge_n_with_a_known_answer():
    # 200,000 boxes: pairs of near twins on a lattice of disjoint cells, twin B 1 px off twin A
    # (IoU 0.8 > 0.7); the higher scored twin of each pair is kept, and only it.
    g = _gen(2)
    pairs = 100000
    cell = torch.arange(pairs, dtype=torch.float64)
    x, y = (cell % 400) * 50, (cell // 400) * 50
    a = torch.stack([x, y, x + 9, y + 9], dim=1)
    b = a + torch.tensor([1.0, 0.0, 1.0, 0.0], dtype=torch.float64)
    boxes = torch.cat([a, b]).float()
    scores = distinct_scores(2 * pairs, g)
    winner = torch.where(scores[:pairs] > scores[pairs:], torch.arange(pairs), torch.arange(pairs) + pairs)
    expected = winner[torch.sort(scores[winner], descending=True, stable=True)[1]]
    assert torch.equal(nms(boxes, scores, 0.7), expected)
    # Disjoint boxes only: nothing is suppressed.
    keep = nms(a.float(), scores[:pairs], 0.0)
    assert torch.equal(keep, torch.sort(scores[:pairs], descending=True, stable=True)[1])


def test_all_suppressed_by_the_first():
    # Every box overlaps the best one (a big box around all of them) by more than the threshold.
    g = _gen(3)
    n = 5000
    centre = torch.tensor([500.0, 500.0, 600.0, 600.0])
    boxes = centre + torch.rand(n, 4, generator=g) * 4 - 2
    scores = distinct_scores(n, g)
    assert nms(boxes, scores, 0.5).tolist() == [int(scores.argmax())]


@needs_torchvision
def test_ties_keep_the_lower_index():
    # Quantized scores (many ties) over heavily overlapping boxes: the stable order decides.
    g = _gen(4)
    boxes = random_boxes(5000, g, xy_max=300.0)
    scores = torch.randint(0, 20, (5000,), generator=g).float()
    keep = _same_as_torchvision(boxes, scores, 0.5)
    assert torch.equal(keep, nms_reference(boxes, scores, 0.5))


@needs_torchvision
@pytest.mark.parametrize("n", [500, 3000])
def test_non_finite_coordinates(n):
    # NaN and infinite coordinates follow torchvision's IoU arithmetic (std::min / std::max,
    # which do not propagate NaN as torch.minimum does): such boxes are kept, suppressing none.
    g = _gen(5)
    boxes = random_boxes(n, g, xy_max=500.0)
    bad = torch.randperm(n, generator=g)[: n // 10]
    values = torch.tensor([float("nan"), float("inf"), -float("inf"), 1e38])
    boxes[bad, torch.randint(0, 4, (len(bad),), generator=g)] = values[torch.randint(0, 4, (len(bad),), generator=g)]
    scores = distinct_scores(n, g)
    for threshold in (0.0, 0.5):
        _same_as_torchvision(boxes, scores, threshold)


@needs_torchvision
@pytest.mark.parametrize("threshold", [-0.5, -1e-300, 0.0, 0.7])
def test_mostly_non_finite_boxes(threshold):
    # Most boxes NaN or infinite somewhere, the rest overlapping: the NaN and (threshold >= 0)
    # infinite ones are kept outside the walks, the infinite ones under a negative threshold
    # still suppress and are suppressed as torchvision's arithmetic says.
    g = _gen(12)
    n = 4000
    boxes = random_boxes(n, g, xy_max=300.0)
    bad = torch.rand(n, generator=g) < 0.8
    values = torch.tensor([float("nan"), float("inf"), -float("inf")])
    column = torch.randint(0, 4, (n,), generator=g)[bad]
    boxes[bad, column] = values[torch.randint(0, 3, (n,), generator=g)[bad]]
    _same_as_torchvision(boxes, distinct_scores(n, g), threshold)


@needs_torchvision
@pytest.mark.parametrize("threshold", [-0.5, -0.0, -1e-300])
def test_negative_thresholds_suppress_disjoint_boxes(threshold):
    g = _gen(6)
    boxes = random_boxes(3000, g, xy_max=5000.0)
    _same_as_torchvision(boxes, distinct_scores(3000, g), threshold)


@needs_torchvision
def test_empty_and_inverted_boxes_are_kept_untouched():
    g = _gen(7)
    n = 4000
    boxes = random_boxes(n, g, xy_max=400.0)
    flat = torch.randperm(n, generator=g)[:800]
    boxes[flat[:400], 2] = boxes[flat[:400], 0]  # zero width
    boxes[flat[400:], 1], boxes[flat[400:], 3] = boxes[flat[400:], 3], boxes[flat[400:], 1].clone()  # y2 < y1
    keep = _same_as_torchvision(boxes, distinct_scores(n, g), 0.3)
    assert set(flat.tolist()) <= set(keep.tolist())


@needs_torchvision
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_tiny_boxes_far_from_the_origin(dtype):
    # Boxes a few ulps wide at 1e7 (float32) or 1e12 (float64): the cells are then about as
    # narrow as the spacing of the coordinates, and the cell bounds must still round outwards.
    g = _gen(8)
    n = 3000
    base = 1e7 if dtype == torch.float32 else 1e12
    ulp = float(torch.finfo(dtype).eps) * base
    lo = base + torch.randint(0, 400, (n, 2), generator=g).to(torch.float64) * ulp
    size = torch.randint(1, 6, (n, 2), generator=g).to(torch.float64) * ulp
    boxes = torch.cat([lo, lo + size], dim=1).to(dtype)
    scores = distinct_scores(n, g, dtype)
    for threshold in (0.0, 0.2, 0.5):
        _same_as_torchvision(boxes, scores, threshold)


@needs_torchvision
def test_boxes_of_every_magnitude():
    # Sides from 1e-3 to 1e5 around one point: more size classes than the grid has levels.
    g = _gen(9)
    n = 3000
    side = 10.0 ** (torch.rand(n, generator=g, dtype=torch.float64) * 8 - 3)
    centre = torch.randn(n, 2, generator=g, dtype=torch.float64) * side[:, None] * 0.3
    boxes = torch.cat([centre - side[:, None] / 2, centre + side[:, None] / 2], dim=1).float()
    for threshold in (0.0, 0.1, 0.5):
        _same_as_torchvision(boxes, distinct_scores(n, g), threshold)


@pytest.mark.parametrize("sizes", [[3000, 5, 1200, 40, 2000], [1] * 300 + [1500]])
def test_batched_groups_on_both_walks_equal_the_reference(sizes):
    g = _gen(10)
    idxs = torch.cat([torch.full((s,), c) for c, s in enumerate(sizes)])
    n = len(idxs)
    boxes = random_boxes(n, g, xy_max=600.0)
    scores = distinct_scores(n, g)
    perm = torch.randperm(n, generator=g)
    keep = batched_nms(boxes, scores, idxs[perm], 0.5)
    assert torch.equal(keep, batched_nms_reference(boxes, scores, idxs[perm], 0.5))


def test_one_thread_and_two_give_the_same_result():
    g = _gen(11)
    n = 30000
    boxes = _log_uniform_boxes(n, g, 4.0, 800.0, (1333.0, 800.0))
    scores = distinct_scores(n, g)
    idxs = torch.randint(0, 6, (n,), generator=g)
    before = torch.get_num_threads()
    try:
        results = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            results.append((nms(boxes, scores, 0.6), batched_nms(boxes, scores, idxs, 0.6)))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])
