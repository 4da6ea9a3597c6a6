"""The CUDA emulation catches what it claims to: each test breaks a copy of detcore's device code
on purpose and shows the emulation failing on it, where the unbroken code passes.

tests/layers/cuda_emulation/mutation_probe.cpp runs the kernels under the emulation without
ATen, built with ThreadSanitizer and -fsanitize=float-cast-overflow (as the emulation's own
builds are), from the real headers and from copies with one mutation each:
 - a raw float to int conversion (the device saturates, the host's is undefined): stopped by the
   float-cast check;
 - a kernel that reads shared memory its block never wrote (expecting zeros, or what another
   block left): every block's shared memory starts as garbage;
 - two blocks adding into the same pixels without atomics: blocks run at once, unordered, so
   ThreadSanitizer reports it;
 - a missing __syncthreads() in a block's tree sum: a race inside the block.
"""
import math
import os
import shutil
import subprocess

import numpy as np
import pytest
import torch

try:
    from . import cuda_emulation
    from .reference_ops import iou_one_to_many, random_boxes, seeded
except ImportError:  # tests/ run as rootdir-relative modules, without packages
    import cuda_emulation
    from reference_ops import iou_one_to_many, random_boxes, seeded

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ (with libtsan)")

GRID_CAST = "return float_to_int<int>(n);"
BATCH_CAST = "g.batch = float_to_int<int64_t>(static_cast<T>(roi[0]));"
CATEGORY_TEST = "if (categories != nullptr && col_categories[k] != row_category) {"
POOL_ATOMIC = "atomicAdd(grad_input + (batch * channels + c) * height * width + offset, value);"
TREE_LOOP = """      shared[tid] += shared[tid + half];
    }
    __syncthreads();"""

MUTATIONS = {
    "none": None,
    # The adaptive grid converted raw, unclamped, as it was before float_to_int.
    "raw_grid_cast": (
        "csrc/roi_align_common.h", GRID_CAST,
        "return static_cast<int>(ceil(roi_size / static_cast<T>(pooled)));"),
    "raw_batch_cast": (
        "csrc/roi_align_common.h", BATCH_CAST, "g.batch = static_cast<int64_t>(roi[0]);"),
    # Plain NMS compares categories it never loaded: right only if shared memory were zeros.
    "unloaded_shared": (
        "csrc/cuda/nms_kernels.cuh", CATEGORY_TEST, "if (col_categories[k] != row_category) {"),
    "plain_add": (
        "csrc/cuda/roi_pool_kernels.cuh", POOL_ATOMIC,
        "grad_input[(batch * channels + c) * height * width + offset] += value;"),
    "no_tree_barrier": (
        "csrc/cuda/sigmoid_focal_loss_kernels.cuh", TREE_LOOP,
        "      shared[tid] += shared[tid + half];\n    }"),
}


@pytest.fixture(scope="module")
def probes():
    return cuda_emulation.mutation_probes(MUTATIONS)


def _run(probe, *args, stdin=""):
    env = dict(os.environ, TSAN_OPTIONS="halt_on_error=1 exitcode=66")
    env.pop("LD_PRELOAD", None)  # scripts/test_emulation_tsan.sh's: the probe links its own
    env.pop("DETCORE_EMULATION_BLOCKS", None)  # the default: several blocks at once
    return subprocess.run(
        [probe, *map(str, args)], input=stdin, capture_output=True, text=True, env=env, timeout=300)


def _ok(result):
    assert result.returncode == 0, result.stderr
    return result.stdout


def _numbers(values):
    return " ".join(repr(float(v)) for v in values)


# ----------------------------------------------------------------- float to int conversions


def _device_conversion(value, bits):
    """cvt.rzi: toward zero, saturated, NaN 0."""
    if math.isnan(value):
        return 0
    lowest, highest = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    if math.isinf(value):
        return highest if value > 0 else lowest
    return min(max(math.trunc(value), lowest), highest)


def _single(value):
    with np.errstate(over="ignore"):
        return float(np.float32(value))


def test_float_to_int_converts_like_the_gpu(probes):
    values = [0.0, -0.0, -2.7, 2.9, 0.5, -0.5, float("nan"), float("inf"), -float("inf"), 1e10,
              -1e10, 2.0**31 - 128, 2.0**31 - 1, 2.0**31, -(2.0**31), -(2.0**31) - 1, 2.0**63,
              -(2.0**63), 2.0**63 - 1024, 1e19, -1e19, 9.2e18, 1e300]
    rows = _ok(_run(probes["none"], "convert", stdin=_numbers(values))).splitlines()
    for value, row in zip(values, rows, strict=True):
        single = _single(value)
        expected = [_device_conversion(single, 32), _device_conversion(value, 32),
                    _device_conversion(single, 64), _device_conversion(value, 64)]
        assert [int(v) for v in row.split()] == expected, value


def _grid_side(size, pooled):
    """roi_align_common.h's adaptive_grid_side on a float32 size."""
    n = math.ceil(float(np.float32(size) / np.float32(pooled))) if math.isfinite(size) else size
    return 0 if math.isnan(n) else int(min(max(n, 0), 1 << 15))


def test_roi_grid_clamped_and_nan_safe(probes):
    """Huge rois get the clamped grid, NaN ones none, a NaN batch index 0: on every device."""
    rois = [[0, 0, 13, 3, 97], [1, 0, 0, 1e12, 5], [0, 0, 0, 1e30, 1e30], [0, 0, 0, float("nan"), 5],
            [float("nan"), 0, 0, 10, 10], [1e20, 0, 0, 10, 10], [0, 50, 50, 10, 10]]
    rows = _ok(_run(probes["none"], "roi_grid", stdin=_numbers([1.0, 7, 1, 1, *sum(rois, [])])))
    for roi, row in zip(rois, rows.splitlines(), strict=True):
        batch, grid_h, grid_w = (int(v) for v in row.split())
        assert batch == _device_conversion(_single(roi[0]), 64)
        half = np.float32(0.5)  # aligned; scale 1
        width = (np.float32(roi[3]) - half) - (np.float32(roi[1]) - half)
        height = (np.float32(roi[4]) - half) - (np.float32(roi[2]) - half)
        assert (grid_h, grid_w) == (_grid_side(height, 7), _grid_side(width, 1)), roi
    assert rows.splitlines()[1].split()[2] == str(1 << 15)


@pytest.mark.parametrize("mutation,roi,type_name", [
    ("raw_grid_cast", [0, 0, 0, 1e12, 5], "'int'"),
    ("raw_batch_cast", [float("nan"), 0, 0, 10, 10], "'long int'"),
])
def test_a_raw_conversion_is_caught(probes, mutation, roi, type_name):
    header = [1.0, 7, 1, 1]
    assert _ok(_run(probes[mutation], "roi_grid", stdin=_numbers(header + [0, 0, 13, 3, 97]))) == "0 12 3\n"
    result = _run(probes[mutation], "roi_grid", stdin=_numbers(header + roi))
    assert result.returncode != 0
    assert "outside the range of representable values of type " + type_name in result.stderr


# ------------------------------------------------------------------------- shared memory


def _crowded_boxes(n):
    """Boxes and near copies of them: many pairs above IoU 0.5, across 64-box blocks."""
    g = seeded(11)
    base = random_boxes(n // 3 + 1, g, xy_max=120.0, wh_range=(20.0, 60.0))
    boxes = base[torch.randint(0, len(base), (n,), generator=g)]
    return boxes + torch.rand(n, 4, generator=g) * 6.0


def _mask_rows(boxes):
    """Per row i, the words of column blocks i // 64 onward: bit k of word w says that box
    64 w + k ranks below i and overlaps it by IoU > 0.5."""
    n = len(boxes)
    rows = []
    for i in range(n):
        bits = np.zeros(-(-n // 64) * 64, dtype=bool)
        bits[i + 1 : n] = (iou_one_to_many(boxes[i], boxes[i + 1 :]).double() > 0.5).numpy()
        words = np.packbits(bits, bitorder="little").view("<u8")
        rows.append([int(w) for w in words[i // 64 :]])
    return rows


def test_shared_memory_a_block_never_wrote_is_garbage(probes):
    """Plain NMS passes no categories: the mutation compares the never-loaded category column.
    Under the old emulation (static __shared__, zero-initialized, kept between blocks and
    launches) a fresh process saw zeros there and passed; every block now starts on garbage."""
    boxes = _crowded_boxes(150)
    stdin = f"{len(boxes)} " + _numbers(boxes.flatten().tolist())
    expected = _mask_rows(boxes)
    assert sum(bin(w).count("1") for row in expected for w in row) > 100
    parse = lambda out: [[int(w) for w in line.split()] for line in out.splitlines()]  # noqa: E731
    assert parse(_ok(_run(probes["none"], "nms_mask", stdin=stdin))) == expected
    assert parse(_ok(_run(probes["unloaded_shared"], "nms_mask", stdin=stdin))) != expected


def test_blocks_racing_without_atomics_are_caught(probes):
    """512 gradients into 256 pixels: gradient k and k + 256 share a pixel, so the threads of one
    block never collide, the two blocks always do. They run at once and nothing orders them:
    ThreadSanitizer reports the plain +=, where serialized blocks hid it."""
    assert _ok(_run(probes["none"], "roi_pool_backward", 512, 16)).split() == ["2"] * 256
    result = _run(probes["plain_add"], "roi_pool_backward", 512, 16)
    assert result.returncode == 66 and "ThreadSanitizer: data race" in result.stderr
    assert "roi_pool_backward_kernel" in result.stderr


def test_a_missing_barrier_is_caught(probes):
    """The focal loss's block sum without the barrier between the tree's levels."""
    values = list(range(1, 3001))
    assert float(_ok(_run(probes["none"], "block_sum", stdin=_numbers(values)))) == sum(values)
    result = _run(probes["no_tree_barrier"], "block_sum", stdin=_numbers(values))
    assert result.returncode == 66 and "ThreadSanitizer: data race" in result.stderr
