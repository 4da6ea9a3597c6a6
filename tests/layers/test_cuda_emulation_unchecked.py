"""The CUDA ROIAlign / ROIPool kernels stay in bounds on inputs the argument checks would refuse,
which reach them when the caller turned value checks off (detcore.layers.trusted_inputs): run
by the CUDA emulation (tests/layers/cuda_emulation/, whose launchers run no checks at all).

A roi with a batch index outside [0, N) (-1, N, -0.5, NaN) or a NaN / infinite coordinate pools
zeros (roi_pool: argmax -1) and passes no gradient back; roi_pool's backward skips an argmax
offset past the plane. The good rois of the same call give the CPU kernel's results.

So that a missing guard shows as a wrong value rather than only as undefined memory: the input
is a view into a larger tensor whose neighbouring images hold a marker value (an out-of-range
batch index would read them), batch index -0.5 truncates to image 0 (the checks refuse it: it
is below 0), and the out-of-plane argmax points at the next channel's first pixel.
"""
import math

import pytest
import torch

import detcore.layers  # noqa: F401  (loads torch.ops.detcore)

try:
    from .reference_ops import CUDA_VS_CPU_TOLERANCE, in_cpu_dtype, seeded
except ImportError:  # tests/ run as rootdir-relative modules, without packages
    from reference_ops import CUDA_VS_CPU_TOLERANCE, in_cpu_dtype, seeded

MARKER = 7.0
BATCH, CHANNELS, HEIGHT, WIDTH = 2, 3, 9, 10
GOOD = [[0.0, 1.0, 1.0, 7.0, 6.0], [1.0, 2.0, 0.5, 9.0, 8.0], [1.5, 0.0, 0.0, 4.0, 4.0]]
BAD = [
    [-1.0, 1.0, 1.0, 7.0, 6.0],  # batch index below the batch
    [2.0, 1.0, 1.0, 7.0, 6.0],  # ... past it
    [-0.5, 1.0, 1.0, 7.0, 6.0],  # below 0, though it truncates to image 0
    [math.nan, 1.0, 1.0, 7.0, 6.0],
    [0.0, math.nan, 1.0, 7.0, 6.0],  # non-finite coordinates
    [1.0, 1.0, math.inf, 7.0, 6.0],
    [0.0, 1.0, 1.0, -math.inf, 6.0],
    [1.0, 1.0, 1.0, 7.0, math.inf],
]
DTYPES = [torch.float32, torch.float16]


def _features(dtype):
    """[BATCH, C, H, W] random features, a view into a tensor whose images before and after hold
    MARKER everywhere."""
    storage = torch.full((BATCH + 2, CHANNELS, HEIGHT, WIDTH), MARKER)
    storage[1 : BATCH + 1] = torch.rand(BATCH, CHANNELS, HEIGHT, WIDTH, generator=seeded(0))
    storage = storage.to(dtype)
    features = storage[1 : BATCH + 1]
    assert features.is_contiguous() and features.storage_offset() > 0
    return features


def _rois(dtype):
    rows = GOOD[:1] + BAD[:4] + GOOD[1:] + BAD[4:]  # good and bad mixed, so each index is tried
    good = torch.tensor([row in GOOD for row in rows])
    return torch.tensor(rows, dtype=torch.float64).to(dtype), good


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("sampling_ratio,aligned", [(0, True), (2, False)])
def test_roi_align_pools_zeros_for_bad_rois_and_stays_in_bounds(emu, dtype, sampling_ratio, aligned):
    features, (rois, good) = _features(dtype), _rois(dtype)
    out = emu.roi_align(features, rois, 0.5, 3, 2, sampling_ratio, aligned)
    assert torch.equal(out[~good], torch.zeros_like(out[~good]))
    expected = torch.ops.detcore.roi_align(
        in_cpu_dtype(features), in_cpu_dtype(rois[good]), 0.5, 3, 2, sampling_ratio, aligned)
    torch.testing.assert_close(in_cpu_dtype(out[good]), expected, **CUDA_VS_CPU_TOLERANCE[dtype])

    # The backward passes nothing back for the bad rois: what the good ones alone give.
    grad = torch.rand(out.shape, generator=seeded(1)).to(dtype)
    grad_input = emu.roi_align_backward(
        grad, rois, 0.5, 3, 2, BATCH, CHANNELS, HEIGHT, WIDTH, sampling_ratio, aligned)
    x = in_cpu_dtype(features).clone().requires_grad_(True)
    torch.ops.detcore.roi_align(x, in_cpu_dtype(rois[good]), 0.5, 3, 2, sampling_ratio, aligned).backward(
        in_cpu_dtype(grad[good]))
    torch.testing.assert_close(in_cpu_dtype(grad_input), x.grad, **CUDA_VS_CPU_TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_roi_pool_pools_zeros_for_bad_rois_and_stays_in_bounds(emu, dtype):
    features, (rois, good) = _features(dtype), _rois(dtype)
    out, argmax = emu.roi_pool(features, rois, 0.5, 3, 2)
    assert torch.equal(out[~good], torch.zeros_like(out[~good]))
    assert torch.equal(argmax[~good], torch.full_like(argmax[~good], -1))
    expected, expected_argmax = torch.ops.detcore.roi_pool(in_cpu_dtype(features), in_cpu_dtype(rois[good]), 0.5, 3, 2)
    assert torch.equal(in_cpu_dtype(out[good]), expected.to(dtype).to(expected.dtype))
    assert torch.equal(argmax[good], expected_argmax)

    # The backward, given the argmax of bad rois as a valid one (as a caller's bad argmax might
    # be): their gradient is still dropped.
    grad = torch.rand(out.shape, generator=seeded(1)).to(dtype)
    forged = argmax.clone()
    forged[~good] = 0
    grad_input = emu.roi_pool_backward(grad, rois, forged, BATCH, CHANNELS, HEIGHT, WIDTH)
    x = in_cpu_dtype(features).clone().requires_grad_(True)
    torch.ops.detcore.roi_pool(x, in_cpu_dtype(rois[good]), 0.5, 3, 2)[0].backward(in_cpu_dtype(grad[good]))
    torch.testing.assert_close(in_cpu_dtype(grad_input), x.grad, **CUDA_VS_CPU_TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_roi_pool_backward_skips_offsets_past_the_plane(emu, dtype):
    """argmax H * W would add into the next channel's first pixel (or past the input for the
    last); H * W * C * N + 5 far past the input."""
    rois = torch.tensor([GOOD[0], GOOD[1]], dtype=torch.float64).to(dtype)
    argmax = torch.full((2, CHANNELS, 1, 2), -1, dtype=torch.int32)
    argmax[0, :, 0, 0] = 4  # a real offset: its gradient arrives
    argmax[0, :, 0, 1] = HEIGHT * WIDTH
    argmax[1, :, 0, 0] = HEIGHT * WIDTH * CHANNELS * BATCH + 5
    argmax[1, :, 0, 1] = torch.iinfo(torch.int32).max
    grad = torch.ones(2, CHANNELS, 1, 2, dtype=dtype)
    grad_input = emu.roi_pool_backward(grad, rois, argmax, BATCH, CHANNELS, HEIGHT, WIDTH)
    expected = torch.zeros(BATCH, CHANNELS, HEIGHT * WIDTH)
    expected[0, :, 4] = 1
    assert torch.equal(in_cpu_dtype(grad_input), expected.view(BATCH, CHANNELS, HEIGHT, WIDTH))
