"""detcore's CUDA NMS kernels, run on the CPU by the CUDA emulation, equal the CPU kernel.

As in test_cuda_emulation.py: detcore/csrc/cuda/nms_kernels.cuh compiled by g++ with
tests/layers/cuda_emulation/cuda_emulation.h, run through the launcher's own host sequence
(nms_launch.h) with the real limits or lowered ones, so that small inputs take the mask kernel's
grid-stride loops and the unwrap's global-memory bitmap. Kept indices must equal the CPU kernel's
exactly: same boxes, same order. batched_nms over many boxes takes the banded path
(nms_band_kernels.cuh: a mask of the pairs inside each category only); the tests lower the size
above which it does (band_above) to reach it with few boxes, and run it once at the real size. The IoU threshold is compared in the IoU's type (float for float,
half and bfloat16 boxes) after its conversion on the host: tests put IoUs exactly on, and one
float step around, thresholds given in double.
"""
import numpy as np
import pytest
import torch

import detcore.layers  # noqa: F401  (loads torch.ops.detcore)

try:
    from .reference_ops import (
        EMULATED_DTYPES, batched_nms_reference, distinct_scores, in_cpu_dtype, iou_one_to_many, random_boxes, seeded)
except ImportError:  # tests/ run as rootdir-relative modules, without packages
    from reference_ops import (
        EMULATED_DTYPES, batched_nms_reference, distinct_scores, in_cpu_dtype, iou_one_to_many, random_boxes, seeded)

DTYPES = EMULATED_DTYPES
NMS_SIZES = [0, 1, 63, 64, 65, 129]  # across the 64-bit mask words
MAX_SHARED_WORDS = (48 * 1024 - 2048) // 8  # launch_config.h's kMaxSharedWords


def _crowded_boxes(n, seed, dtype):
    """Boxes in a small area, so that many overlap near any threshold."""
    g = seeded(seed)
    return random_boxes(n, g, xy_max=150.0, wh_range=(5.0, 80.0)).to(dtype), g


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", NMS_SIZES)
@pytest.mark.parametrize("iou_threshold", [0.0, 0.5, 1.0])
def test_nms_equals_cpu(emu, n, dtype, iou_threshold):
    boxes, g = _crowded_boxes(n, n, dtype)
    scores = distinct_scores(n, g, torch.float64).to(dtype)  # half rounding makes some ties
    got = emu.nms(boxes, scores, None, iou_threshold)
    assert torch.equal(got, torch.ops.detcore.nms(in_cpu_dtype(boxes), in_cpu_dtype(scores), iou_threshold))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,num_classes", [(1, 1), (65, 3), (129, 1), (200, 7)])
def test_batched_nms_equals_cpu(emu, n, num_classes, dtype):
    boxes, g = _crowded_boxes(n, n + 1, dtype)
    scores = distinct_scores(n, g, torch.float64).to(dtype)
    idxs = torch.randint(0, num_classes, (n,), generator=g, dtype=torch.int32)
    got = emu.nms(boxes, scores, idxs, 0.5)
    assert torch.equal(got, torch.ops.detcore.batched_nms(in_cpu_dtype(boxes), in_cpu_dtype(scores), idxs, 0.5))


def test_nms_ties_nan_and_duplicates(emu):
    boxes, g = _crowded_boxes(130, 3, torch.float32)
    boxes[10:20] = boxes[0]  # exact duplicates: IoU 1, suppressed below 1.0 only
    boxes[25, 2] = float("nan")  # a NaN coordinate never suppresses nor is suppressed
    tied = torch.full((130,), 0.5)
    nan_scores = distinct_scores(130, g)
    nan_scores[[3, 70, 129]] = float("nan")  # sorted first, like torch.sort does
    idxs = torch.randint(0, 2, (130,), generator=g)
    for scores in (tied, nan_scores):
        for threshold in (0.0, 0.5, 1.0):
            expected = torch.ops.detcore.nms(boxes, scores, threshold)
            assert torch.equal(emu.nms(boxes, scores, None, threshold), expected)
            expected = torch.ops.detcore.batched_nms(boxes, scores, idxs, threshold)
            assert torch.equal(emu.nms(boxes, scores, idxs, threshold), expected)


@pytest.mark.parametrize("dtype", DTYPES)
def test_nms_non_finite_boxes_equal_cpu(emu, dtype):
    """Many NaN and infinite coordinates: the CPU kernel keeps the boxes whose IoU never exceeds
    the threshold without computing it; the device computes every IoU. Same answer, thresholds
    of both signs (below 0 an infinite box can suppress), batched_nms by the single mask and by
    the banded path."""
    boxes, g = _crowded_boxes(200, 5, torch.float32)
    bad = torch.rand(200, generator=g) < 0.4
    values = torch.tensor([float("nan"), float("inf"), -float("inf")])
    column = torch.randint(0, 4, (200,), generator=g)[bad]
    boxes[bad, column] = values[torch.randint(0, 3, (200,), generator=g)[bad]]
    boxes = boxes.to(dtype)
    scores = distinct_scores(200, g, torch.float64).to(dtype)
    idxs = torch.randint(0, 3, (200,), generator=g)
    cpu_boxes, cpu_scores = in_cpu_dtype(boxes), in_cpu_dtype(scores)
    for threshold in (-0.5, 0.0, 0.5):
        got = emu.nms(boxes, scores, None, threshold)
        assert torch.equal(got, torch.ops.detcore.nms(cpu_boxes, cpu_scores, threshold))
        expected = torch.ops.detcore.batched_nms(cpu_boxes, cpu_scores, idxs, threshold)
        for band_above in (NEVER, ALWAYS):
            got = emu.nms(boxes, scores, idxs, threshold, 65535, MAX_SHARED_WORDS, band_above)
            assert torch.equal(got, expected), band_above


@pytest.mark.parametrize("max_grid_dim", [1, 2, 3])
def test_nms_more_work_than_blocks(emu, max_grid_dim):
    """A grid smaller than the 5 x 5 blocks of 300 boxes: the mask kernel's grid-stride loops."""
    boxes, g = _crowded_boxes(300, 4, torch.float32)
    scores = distinct_scores(300, g)
    idxs = torch.randint(0, 3, (300,), generator=g)
    got = emu.nms(boxes, scores, None, 0.5, max_grid_dim)
    assert torch.equal(got, torch.ops.detcore.nms(boxes, scores, 0.5))
    got = emu.nms(boxes, scores, idxs, 0.5, max_grid_dim)
    assert torch.equal(got, torch.ops.detcore.batched_nms(boxes, scores, idxs, 0.5))


def _pack_words(bits):
    """[n, m] bools as [n, ceil(m / 64)] int64 words, bit k of word w = column 64 * w + k."""
    n, m = bits.shape
    padded = np.zeros((n, -(-m // 64) * 64), dtype=np.uint8)
    padded[:, :m] = bits
    return torch.from_numpy(np.packbits(padded, axis=1, bitorder="little").view("<i8").copy())


def _reference_mask(sorted_boxes, categories, threshold):
    """Bit (i, j): j ranks below i, same category, IoU in the accumulation type > threshold."""
    boxes = in_cpu_dtype(sorted_boxes)
    n = len(boxes)
    bits = np.zeros((n, n), dtype=bool)
    for i in range(n):
        iou = iou_one_to_many(boxes[i], boxes[i + 1 :]).double() > threshold
        if categories is not None:
            iou &= categories[i + 1 :] == categories[i]
        bits[i, i + 1 :] = iou.numpy()
    return _pack_words(bits)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,max_grid_dim", [(1, 65535), (65, 65535), (129, 1), (200, 2)])
@pytest.mark.parametrize("with_categories", [False, True])
def test_nms_mask_words(emu, n, max_grid_dim, dtype, with_categories):
    """Every word the unwrap reads (column block >= row block) is the reference's, bit for bit."""
    boxes, g = _crowded_boxes(n, n + 2, dtype)
    categories = torch.randint(0, 3, (n,), generator=g) if with_categories else None
    mask = emu.nms_mask(boxes, categories, 0.5, max_grid_dim)
    expected = _reference_mask(boxes, categories, 0.5)
    row_block = torch.arange(n)[:, None] // 64
    read = torch.arange(mask.shape[1])[None, :] >= row_block
    assert torch.equal(mask[read], expected[read])


def _random_mask(n, seed, density):
    """A mask as the mask kernel leaves it: random bits above the diagonal, garbage below."""
    g = np.random.default_rng(seed)
    bits = np.triu(g.random((n, n)) < density, k=1)
    mask = _pack_words(bits)
    below = torch.arange(mask.shape[1])[None, :] < (torch.arange(n)[:, None] // 64)
    garbage = g.integers(-(2**63), 2**63 - 1, int(below.sum()), dtype=np.int64)
    mask[below] = torch.from_numpy(garbage)
    return mask, bits


def _greedy_keep(bits):
    n = len(bits)
    removed = np.zeros(n, dtype=bool)
    keep = np.zeros(n, dtype=bool)
    for i in range(n):
        if not removed[i]:
            keep[i] = True
            removed |= bits[i]
    return torch.from_numpy(keep)


@pytest.mark.parametrize("n", [1, 63, 64, 65, 129, 700])
@pytest.mark.parametrize("max_shared_words", [MAX_SHARED_WORDS, 1, 0])
def test_nms_unwrap_shared_and_global(emu, n, max_shared_words):
    """The removed bitmap in shared memory, or (over the limit) in global memory."""
    for seed, density in ((n, 0.02), (n + 1, 0.3)):
        mask, bits = _random_mask(n, seed, density)
        assert torch.equal(emu.nms_unwrap(mask, max_shared_words), _greedy_keep(bits))


def test_nms_unwrap_more_words_than_threads(emu):
    """Over 256 column blocks (16.6k boxes): each unwrap thread owns several removed words."""
    n = 64 * 260 + 5
    rng = np.random.default_rng(5)
    words = np.zeros((n, -(-n // 64)), dtype=np.uint64)
    suppressions = {}
    for row in rng.integers(0, n - 1, 3000).tolist():
        col = int(rng.integers(row + 1, n))
        words[row, col // 64] |= np.uint64(1) << np.uint64(col % 64)
        suppressions.setdefault(row, []).append(col)
    removed, keep = set(), torch.zeros(n, dtype=torch.bool)
    for i in range(n):
        if i not in removed:
            keep[i] = True
            removed.update(suppressions.get(i, ()))
    mask = torch.from_numpy(words.view(np.int64))
    for max_shared_words in (MAX_SHARED_WORDS, 0):
        assert torch.equal(emu.nms_unwrap(mask, max_shared_words), keep)


# ------------------------------------------------------------- the IoU threshold, in the IoU's type


def _iou(a, b, f):
    """box_iou of nms_kernels.cuh, operation by operation in the numpy type f (np.float32 for
    float, half and bfloat16 boxes; np.float64 for double)."""
    a, b = [f(v) for v in a], [f(v) for v in b]
    w = max(f(0), f(min(a[2], b[2]) - max(a[0], b[0])))
    h = max(f(0), f(min(a[3], b[3]) - max(a[1], b[1])))
    inter = f(w * h)
    area_a = f(f(a[2] - a[0]) * f(a[3] - a[1]))
    area_b = f(f(b[2] - b[0]) * f(b[3] - b[1]))
    return f(inter / f(f(area_a + area_b) - inter))


def _pairs(count, seed):
    """Pairs of boxes with small integer corners (exact in bfloat16), all overlapping; the first
    one has IoU 1/2 exactly, the second 1/3 (not a float)."""
    rng = np.random.default_rng(seed)
    pairs = [([0, 0, 4, 1], [0, 0, 2, 1]), ([0, 0, 2, 1], [1, 0, 3, 1])]
    while len(pairs) < count:
        a = [0, 0, *rng.integers(8, 64, 2).tolist()]
        shift = rng.integers(0, 6, 2).tolist()
        size = rng.integers(4, 64, 2).tolist()
        pairs.append((a, [shift[0], shift[1], shift[0] + size[0], shift[1] + size[1]]))
    return pairs


def _thresholds_around(v, f):
    """Thresholds (float64) on and around the IoU v of type f: v; the values of f one step below
    and above; and (for float32) doubles strictly between v and those neighbours, which no float
    equals, some of them rounding to v."""
    below, above = np.nextafter(v, f(-1)), np.nextafter(v, f(2))
    v, below, above = float(v), float(below), float(above)
    return [v, below, above, (v + below) / 2, (v + above) / 2, v - (v - below) / 4, v + (above - v) / 4]


@pytest.mark.parametrize("dtype", DTYPES)
def test_iou_on_and_one_step_around_the_threshold(emu, dtype):
    """Each pair in its own category (one batched_nms call for all): the lower-scored box goes
    exactly when IoU > threshold in double, here where the IoU is the threshold, or one step of
    the IoU's type away, or between two such steps."""
    f = np.float64 if dtype == torch.float64 else np.float32
    pairs = _pairs(24, 21)
    boxes = torch.tensor([box for pair in pairs for box in pair], dtype=torch.float64).to(dtype)
    scores = torch.linspace(1.0, 0.5, 2 * len(pairs), dtype=torch.float64).to(dtype)
    idxs = torch.arange(len(pairs)).repeat_interleave(2)
    ious = [_iou(a, b, f) for a, b in pairs]
    assert ious[0] == 0.5 and (float(ious[1]) != 1 / 3) == (f == np.float32)
    checked = 0
    for v in ious[:6]:
        for threshold in _thresholds_around(v, f):
            suppressed = [float(iou) > threshold for iou in ious]
            expected = [i for p, gone in enumerate(suppressed) for i in (2 * p, 2 * p + 1)[: 2 - gone]]
            cpu = torch.ops.detcore.batched_nms(in_cpu_dtype(boxes), in_cpu_dtype(scores), idxs, threshold)
            assert cpu.tolist() == expected, threshold
            got = emu.nms(boxes, scores, idxs, threshold)
            assert torch.equal(got, cpu), threshold
            checked += 1
    assert checked == 6 * 7


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("threshold", [0.1, 1 / 3, 0.7, 0.5 - 1e-12, 0.5 + 1e-12, -0.25, 1e-30])
def test_thresholds_that_are_no_float(emu, dtype, threshold):
    """Thresholds that no float equals, on crowded boxes (many IoUs near any threshold), for nms
    and batched_nms; the mask's bits are the reference's, compared in double."""
    boxes, g = _crowded_boxes(150, 31, dtype)
    scores = distinct_scores(150, g, torch.float64).to(dtype)
    idxs = torch.randint(0, 3, (150,), generator=g)
    cpu_boxes, cpu_scores = in_cpu_dtype(boxes), in_cpu_dtype(scores)
    expected = torch.ops.detcore.nms(cpu_boxes, cpu_scores, threshold)
    assert torch.equal(emu.nms(boxes, scores, None, threshold), expected)
    expected = torch.ops.detcore.batched_nms(cpu_boxes, cpu_scores, idxs, threshold)
    assert torch.equal(emu.nms(boxes, scores, idxs, threshold), expected)
    mask = emu.nms_mask(boxes, None, threshold)
    reference = _reference_mask(boxes, None, threshold)
    read = torch.arange(mask.shape[1])[None, :] >= (torch.arange(150)[:, None] // 64)
    assert torch.equal(mask[read], reference[read])


# ------------------------------------------------------ batched_nms's banded path (many boxes)

BAND_ABOVE = 5000  # launch_config.h's kNmsBandAbove
ALWAYS, NEVER = 0, 2**62  # band_above: every batched_nms takes the banded path, or none


def _runs(lengths, ids, g):
    """Category ids, len(lengths[i]) boxes of category ids[i], in a random order."""
    idxs = torch.cat([torch.full((m,), c, dtype=torch.int64) for m, c in zip(lengths, ids)])
    return idxs[torch.randperm(len(idxs), generator=g)]


def _band_words(lengths):
    """The banded mask's words: a category of m boxes, b = ceil(m / 64) blocks, has a word per row
    of its row block k and column block k.. b - 1."""
    words = 0
    for m in lengths:
        b = -(-m // 64)
        words += sum(min(64, m - 64 * k) * (b - k) for k in range(b))
    return words


# Categories of 64 boxes (one whole block), 65 (a block and one box), single boxes, and one large
# category; ids negative, beyond 32 bits, and not in order of first appearance.
LAYOUTS = {
    "one category": ([150], [7]),
    "block edges": ([64, 65, 1, 63, 128], [5, -3, 2**40, 0, 9]),
    "singletons and a large one": ([1] * 20 + [300], list(range(20, 0, -1)) + [-1]),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("limits", [(65535, MAX_SHARED_WORDS), (1, 0), (2, 1)])
def test_band_equals_cpu_and_the_single_mask(emu, dtype, layout, limits):
    """Kept indices equal the CPU kernel's and the single mask's (the path below band_above), with
    the real limits, with a grid of one block per dimension (every grid-stride loop; the unwrap's
    one block walks every category, its removed bitmap zeroed between them) and with the removed
    bitmap in global memory."""
    lengths, ids = LAYOUTS[layout]
    g = seeded(len(lengths))
    idxs = _runs(lengths, ids, g)
    n = len(idxs)
    boxes, g = _crowded_boxes(n, n, dtype)
    scores = distinct_scores(n, g, torch.float64).to(dtype)
    for threshold in (0.0, 0.5, 1.0):
        expected = torch.ops.detcore.batched_nms(in_cpu_dtype(boxes), in_cpu_dtype(scores), idxs, threshold)
        assert torch.equal(emu.nms(boxes, scores, idxs, threshold, *limits, ALWAYS), expected)
        assert torch.equal(emu.nms(boxes, scores, idxs, threshold, *limits, NEVER), expected)


def test_band_ties_nan_and_duplicates(emu):
    """Equal scores (lower index first), NaN scores (first), a NaN coordinate, exact duplicates."""
    boxes, g = _crowded_boxes(200, 8, torch.float32)
    boxes[10:20] = boxes[0]
    boxes[25, 2] = float("nan")
    idxs = _runs([70, 64, 66], [2, 0, 1], g)
    nan_scores = distinct_scores(200, g)
    nan_scores[[3, 70, 129, 199]] = float("nan")
    for scores in (torch.full((200,), 0.5), nan_scores):
        for threshold in (0.0, 0.5, 1.0):
            expected = torch.ops.detcore.batched_nms(boxes, scores, idxs, threshold)
            assert torch.equal(emu.nms(boxes, scores, idxs, threshold, 65535, MAX_SHARED_WORDS, ALWAYS), expected)


def test_band_at_the_real_size(emu):
    """Over kNmsBandAbove boxes with the real limits: the banded path, its answer equal to the CPU
    kernel's and to the plain-PyTorch reference's; its mask (the largest buffer) holds the pairs
    inside each category only: 1/50 of the single mask's words here (40 categories)."""
    lengths = [150 + 3 * k for k in range(40)]
    g = seeded(40)
    idxs = _runs(lengths, [k * 7 - 100 for k in range(40)], g)
    n = len(idxs)
    assert n > BAND_ABOVE
    boxes = random_boxes(n, g, xy_max=300.0, wh_range=(5.0, 80.0))
    scores = distinct_scores(n, g)
    emu.allocations()  # forget earlier ones
    got = emu.nms(boxes, scores, idxs, 0.5)
    buffers = emu.allocations().tolist()
    assert torch.equal(got, torch.ops.detcore.batched_nms(boxes, scores, idxs, 0.5))
    assert torch.equal(got, batched_nms_reference(boxes, scores, idxs, 0.5))
    assert max(buffers) == 8 * _band_words(lengths)
    assert 50 * max(buffers) < 8 * n * -(-n // 64)
    emu.nms(boxes[:BAND_ABOVE], scores[:BAND_ABOVE], idxs[:BAND_ABOVE], 0.5)  # at the size: one mask
    assert max(emu.allocations().tolist()) == 8 * BAND_ABOVE * -(-BAND_ABOVE // 64)

