"""detcore's CUDA kernels, run on the CPU by the CUDA emulation, equal the CPU kernels.

The device code (detcore/csrc/cuda/*_kernels.cuh) is compiled by g++ with
tests/layers/cuda_emulation/cuda_emulation.h: every CUDA thread a std::thread, __syncthreads a
barrier, launched with the real grid (detcore/csrc/cuda/launch_config.h). The grid and
shared-memory limits are lowered in some tests so that small inputs take the grid-stride loops
and the NMS unwrap's global-memory path. Half and bfloat16 are compared with the CPU float32
kernel on the same (exactly upcast) values, as in test_ops_cuda.py. DETCORE_EMULATION_TSAN=1
builds the emulation with ThreadSanitizer (scripts/test_emulation_tsan.sh).
"""
import math
import shutil
import subprocess

import numpy as np
import pytest
import torch

import detcore.layers  # noqa: F401  (loads torch.ops.detcore)

try:
    from . import cuda_emulation
    from .reference_ops import CUDA_VS_CPU_TOLERANCE, EMULATED_DTYPES, in_cpu_dtype, seeded, distinct_scores, iou_one_to_many, random_boxes
except ImportError:  # tests/ run as rootdir-relative modules, without packages
    import cuda_emulation
    from reference_ops import CUDA_VS_CPU_TOLERANCE, EMULATED_DTYPES, in_cpu_dtype, seeded, distinct_scores, iou_one_to_many, random_boxes

DTYPES = EMULATED_DTYPES
TOL = CUDA_VS_CPU_TOLERANCE
NMS_SIZES = [0, 1, 63, 64, 65, 129]  # across the 64-bit mask words
MAX_SHARED_WORDS = (48 * 1024 - 2048) // 8  # launch_config.h's kMaxSharedWords





def _crowded_boxes(n, seed, dtype):
    """Boxes in a small area, so that many overlap near any threshold."""
    g = seeded(seed)
    return random_boxes(n, g, xy_max=150.0, wh_range=(5.0, 80.0)).to(dtype), g


# ---------------------------------------------------------------------------------------- nms


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


# ---------------------------------------------------------------------------------- roi_align


def _roi_inputs(seed, dtype, k=24, size=(11, 13)):
    """Rois inside, across and outside the map, some of negative or zero size."""
    g = seeded(seed)
    height, width = size
    features = torch.randn(2, 3, height, width, generator=g)
    boxes = random_boxes(k, g, xy_max=16.0 * max(size), wh_range=(-20.0, 120.0))
    boxes[0] = torch.tensor([-200.0, -200.0, -100.0, -150.0])  # wholly outside
    boxes[1] = torch.tensor([40.0, 40.0, 40.0, 40.0])  # a point
    rois = torch.cat([(torch.arange(k) % 2).double()[:, None], boxes.double()], dim=1)
    return features.to(dtype), rois.to(dtype)


def _cpu_roi_align(features, rois, grad, *args):
    """The CPU kernel's forward and input gradient, on the upcast values for half types."""
    x = in_cpu_dtype(features).requires_grad_(True)
    out = torch.ops.detcore.roi_align(x, in_cpu_dtype(rois), *args)
    out.backward(in_cpu_dtype(grad))
    return out.detach(), x.grad


def _backward(op, grad, rois, input_shape, args, *limit):
    """op (the emulated or the CPU backward) with roi_align's (scale, ph, pw, ratio, aligned)."""
    scale, ph, pw, sampling_ratio, aligned = args
    return op(grad, rois, scale, ph, pw, *input_shape, sampling_ratio, aligned, *limit)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("aligned", [False, True])
@pytest.mark.parametrize("sampling_ratio", [-1, 0, 1, 3])
def test_roi_align_equals_cpu(emu, dtype, aligned, sampling_ratio):
    features, rois = _roi_inputs(sampling_ratio + 7, dtype)
    args = (0.25, 3, 4, sampling_ratio, aligned)
    grad = torch.randn(len(rois), 3, 3, 4, generator=seeded(1)).to(dtype)
    out_cpu, grad_cpu = _cpu_roi_align(features, rois, grad, *args)

    out = emu.roi_align(features, rois, *args)
    grad_input = _backward(emu.roi_align_backward, grad, rois, features.shape, args)
    assert out.dtype == dtype and grad_input.dtype == dtype
    torch.testing.assert_close(in_cpu_dtype(out), out_cpu, **TOL[dtype])
    torch.testing.assert_close(in_cpu_dtype(grad_input), grad_cpu, **TOL[dtype])


@pytest.mark.parametrize("max_blocks", [1, 2])
def test_roi_align_more_work_than_blocks(emu, max_blocks):
    """The same results with a grid of 1 or 2 blocks for 9 blocks' work: the grid-stride loops."""
    features, rois = _roi_inputs(3, torch.float32, k=64)
    args = (0.25, 3, 4, 2, True)
    grad = torch.randn(64, 3, 3, 4, generator=seeded(2))
    out = emu.roi_align(features, rois, *args, max_blocks)
    assert torch.equal(out, emu.roi_align(features, rois, *args))
    grad_input = _backward(emu.roi_align_backward, grad, rois, features.shape, args, max_blocks)
    full_grid = _backward(emu.roi_align_backward, grad, rois, features.shape, args)
    torch.testing.assert_close(grad_input, full_grid, atol=1e-6, rtol=1e-6)  # atomics' order
    _, grad_cpu = _cpu_roi_align(features, rois, grad, *args)
    torch.testing.assert_close(grad_input, grad_cpu)


def test_roi_align_edge_cases(emu):
    """No rois, a map without pixels, one roi, and the zero-stride gradient of out.sum()."""
    features, rois = _roi_inputs(4, torch.float32, k=3)
    args = (0.25, 2, 2, 0, True)
    expanded = torch.ones(1, 1, 1, 1).expand(3, 3, 2, 2)
    cases = [(features, rois[:0], None), (features[:, :, :0], rois, None)]
    cases += [(features, rois[:1], None), (features, rois, expanded)]
    for x, r, grad in cases:
        expected = torch.ops.detcore.roi_align(x, r, *args)
        torch.testing.assert_close(emu.roi_align(x, r, *args), expected)
        grad = torch.ones(expected.shape) if grad is None else grad
        cpu = _backward(torch.ops.detcore._roi_align_backward, grad.contiguous(), r, x.shape, args)
        got = _backward(emu.roi_align_backward, grad, r, x.shape, args)
        torch.testing.assert_close(got, cpu)


def test_roi_align_adaptive_count_of_issue_roi(emu):
    """y 13 -> 97 at 1/3 is 28 rows for 7 bins: the CPU samples 5 rows per bin (float rounding)."""
    x = (torch.arange(40.0)[:, None] ** 2 + torch.arange(4.0)).reshape(1, 1, 40, 4)
    rois = torch.tensor([[0.0, 0.0, 13.0, 3.0, 97.0]])
    args = (1 / 3, 7, 1, 0, True)
    expected = torch.ops.detcore.roi_align(x, rois, *args)  # 4 rows per bin would be 1e-3 off
    torch.testing.assert_close(emu.roi_align(x, rois, *args), expected, rtol=1e-6, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_roi_align_backward_atomics(emu, dtype):
    """256 threads of one block, 1024 atomic adds each, all into the same 4 pixels.

    The roi covers 1 pixel, its 16 x 16 samples fall between pixels (0, 0) and (1, 1) at
    multiples of 1/32: every term is a multiple of 2**-18 and the sums are exact whatever the
    order (float32 with 16 rois, which stay under its 24 bits). A plain += would lose updates.
    """
    rois_count = 256 if dtype == torch.float64 else 16
    shape = (1, 1, 3, 3)
    rois = torch.tensor([[0.0, 0.5, 0.5, 1.5, 1.5]], dtype=dtype).repeat(rois_count, 1)
    grad = torch.ones(rois_count, 1, 1, 1, dtype=dtype)
    args = (1.0, 1, 1, 16, True)
    got = _backward(emu.roi_align_backward, grad, rois, shape, args)
    expected = _backward(torch.ops.detcore._roi_align_backward, grad, rois, shape, args)
    assert torch.equal(got, expected) and got.sum() == rois_count


# ------------------------------------------------------------------------- FMA contraction


def _has_fma():
    try:
        with open("/proc/cpuinfo") as f:
            return " fma " in f.read().replace("\n", " ")
    except OSError:
        return False


def _unfused_geometry(roi, scale, ph, pw, sampling_ratio, aligned):
    """roi_align_common.h's geometry in float32, every operation rounded (the CPU kernel's)."""
    f = np.float32
    s, offset = f(scale), f(0.5 if aligned else 0.0)
    x1, y1, x2, y2 = (f(v) for v in roi)
    start_w, start_h = f(x1 * s) - offset, f(y1 * s) - offset
    width, height = (f(x2 * s) - offset) - start_w, (f(y2 * s) - offset) - start_h
    if not aligned:
        width, height = max(width, f(1)), max(height, f(1))
    grid_h = sampling_ratio if sampling_ratio > 0 else int(math.ceil(height / f(ph)))
    grid_w = sampling_ratio if sampling_ratio > 0 else int(math.ceil(width / f(pw)))
    bin_h, bin_w = height / f(ph), width / f(pw)
    y = (start_h + f(ph - 1) * bin_h) + (f(grid_h - 1) + f(0.5)) * bin_h / f(grid_h)
    x = (start_w + f(pw - 1) * bin_w) + (f(grid_w - 1) + f(0.5)) * bin_w / f(grid_w)
    return [grid_h, grid_w, start_h, start_w, bin_h, bin_w, y, x]


@pytest.mark.skipif(shutil.which("g++") is None or not _has_fma(), reason="needs g++, an FMA CPU")
@pytest.mark.parametrize("scale,output,aligned", [(1 / 3, (7, 1), True), (1 / 32, (7, 7), False)])
def test_device_geometry_with_fma_contraction(scale, output, aligned):
    """Built like nvcc builds device code (a * b + c fused), the geometry is still the CPU's."""
    rois = random_boxes(30, seeded(9), xy_max=300.0, wh_range=(1.0, 150.0)).tolist()
    rois.insert(0, [0.0, 13.0, 3.0, 97.0])  # the roi of the issue, 28 rows for 7 bins at 1/3
    scale = float(np.float32(scale))
    args = [str(scale), str(output[0]), str(output[1]), "0", str(int(aligned))]
    args += [repr(float(np.float32(v))) for roi in rois for v in roi]
    probe = subprocess.run(
        [cuda_emulation.fma_probe(), *args], capture_output=True, text=True, check=True)
    lines = probe.stdout.splitlines()
    if float(lines[0]) != 28.0:
        pytest.skip("this g++ does not fuse a * b - c here, so it cannot show a fused geometry")
    for roi, line in zip(rois, lines[1:]):
        values = line.split()
        got = [int(v) for v in values[:2]] + [np.float32(float(v)) for v in values[2:]]
        assert got == _unfused_geometry(roi, scale, *output, 0, aligned), roi
