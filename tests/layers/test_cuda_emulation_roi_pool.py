"""detcore's CUDA ROIPool kernels, run on the CPU by the CUDA emulation, equal the CPU kernel.

As in test_cuda_emulation.py: detcore/csrc/cuda/roi_pool_kernels.cuh compiled by g++ with
tests/layers/cuda_emulation/cuda_emulation.h, launched with the real grid (launch_config.h) or a
lowered one, so that small inputs take the grid-stride loops. The forward is compared exactly
(a max, the same pixels in the same order); the backward's atomics add in any order, so its sums
are compared within the shared CUDA-vs-CPU tolerance. Half and bfloat16 are compared with the
CPU float32 kernel on the same, exactly upcast, values.
"""
import pytest
import torch

import detcore.layers  # noqa: F401  (loads torch.ops.detcore)

try:
    from .reference_ops import CUDA_VS_CPU_TOLERANCE, EMULATED_DTYPES, in_cpu_dtype, seeded, random_boxes
except ImportError:  # tests/ run as rootdir-relative modules, without packages
    from reference_ops import CUDA_VS_CPU_TOLERANCE, EMULATED_DTYPES, in_cpu_dtype, seeded, random_boxes

DTYPES = EMULATED_DTYPES
TOL = CUDA_VS_CPU_TOLERANCE





def _inputs(seed, dtype, k=24, channels=3, size=(11, 13), ties=False):
    """Rois inside, across and outside the map, some of negative or zero size."""
    g = seeded(seed)
    height, width = size
    if ties:  # few distinct values: the first maximum must win on both devices
        features = torch.randint(0, 3, (2, channels, height, width), generator=g).float()
    else:
        features = torch.randn(2, channels, height, width, generator=g)
    boxes = random_boxes(k, g, xy_max=4.0 * max(size), wh_range=(-10.0, 40.0))
    boxes[0] = torch.tensor([-200.0, -200.0, -100.0, -150.0])  # wholly outside
    boxes[1] = torch.tensor([40.0, 40.0, 40.0, 40.0])  # a point, outside
    boxes[2] = torch.tensor([6.0, 5.0, 6.0, 5.0])  # a point, inside
    rois = torch.cat([(torch.arange(k) % 2).double()[:, None], boxes.double()], dim=1)
    return features.to(dtype), rois.to(dtype)


def _cpu_roi_pool(features, rois, grad, scale, ph, pw):
    """The CPU kernel's output, argmax and input gradient, on the upcast values for half types."""
    x = in_cpu_dtype(features).requires_grad_(True)
    out, argmax = torch.ops.detcore.roi_pool(x, in_cpu_dtype(rois), scale, ph, pw)
    out.backward(in_cpu_dtype(grad))
    return out.detach(), argmax, x.grad


def _emulated(emu, features, rois, grad, scale, ph, pw, *limit):
    out, argmax = emu.roi_pool(features, rois, scale, ph, pw, *limit)
    grad_input = emu.roi_pool_backward(grad, rois, argmax, *features.shape, *limit)
    return out, argmax, grad_input


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scale,output", [(1.0, (3, 4)), (0.5, (2, 2)), (0.3, (5, 3))])
@pytest.mark.parametrize("ties", [False, True])
def test_roi_pool_equals_cpu(emu, dtype, scale, output, ties):
    features, rois = _inputs(int(scale * 10) + ties, dtype, ties=ties)
    grad = torch.randn(len(rois), 3, *output, generator=seeded(1)).to(dtype)
    out_cpu, argmax_cpu, grad_cpu = _cpu_roi_pool(features, rois, grad, scale, *output)

    out, argmax, grad_input = _emulated(emu, features, rois, grad, scale, *output)
    assert out.dtype == dtype and grad_input.dtype == dtype and argmax.dtype == torch.int32
    assert torch.equal(argmax, argmax_cpu)
    assert torch.equal(in_cpu_dtype(out), out_cpu.to(dtype).to(out_cpu.dtype))  # exact: a max
    torch.testing.assert_close(in_cpu_dtype(grad_input), grad_cpu, **TOL[dtype])


@pytest.mark.parametrize("max_blocks", [1, 2])
def test_roi_pool_more_work_than_blocks(emu, max_blocks):
    """The same results with a grid of 1 or 2 blocks for 12 blocks' work: the grid-stride loops."""
    features, rois = _inputs(3, torch.float32, k=64, channels=4)
    grad = torch.randn(64, 4, 3, 4, generator=seeded(2))
    out, argmax, grad_input = _emulated(emu, features, rois, grad, 0.5, 3, 4, max_blocks)
    out_cpu, argmax_cpu, grad_cpu = _cpu_roi_pool(features, rois, grad, 0.5, 3, 4)
    assert torch.equal(out, out_cpu) and torch.equal(argmax, argmax_cpu)
    torch.testing.assert_close(grad_input, grad_cpu, **TOL[torch.float32])


def test_roi_pool_nan_and_lowest_values(emu):
    """NaN never wins; a bin of only -inf gives -FLT_MAX and argmax -1, on both devices."""
    features, rois = _inputs(4, torch.float32, k=12)
    features[:, :, :4, :4] = float("nan")
    features[:, 1, 5:, 5:] = -float("inf")
    for dtype in (torch.float32, torch.float64):
        x, r = features.to(dtype), rois.to(dtype)
        out, argmax = emu.roi_pool(x, r, 1.0, 3, 3)
        expected, expected_argmax = torch.ops.detcore.roi_pool(x, r, 1.0, 3, 3)
        assert torch.equal(out, expected) and torch.equal(argmax, expected_argmax)


def test_roi_pool_edge_cases(emu):
    """No rois, a map without pixels, no channels, one roi, the zero-stride grad of out.sum()."""
    features, rois = _inputs(5, torch.float32, k=3)
    cases = [(features, rois[:0]), (features[:, :, :0], rois), (features[:, :0], rois), (features, rois[2:])]
    for x, r in cases:
        out, argmax = emu.roi_pool(x, r, 1.0, 2, 2)
        expected, expected_argmax = torch.ops.detcore.roi_pool(x, r, 1.0, 2, 2)
        assert torch.equal(out, expected) and torch.equal(argmax, expected_argmax)
        grad = torch.ones(1, 1, 1, 1).expand(expected.shape)
        got = emu.roi_pool_backward(grad, r, argmax, *x.shape)
        cpu = torch.ops.detcore._roi_pool_backward(grad, r, argmax, 1.0, 2, 2, *x.shape)
        assert torch.equal(got, cpu)


def test_roi_pool_backward_strided_grad(emu):
    """A grad with strides of its own in every dimension: the launcher passes them to the kernel."""
    features, rois = _inputs(6, torch.float32, k=5)
    grad = torch.randn(4, 3, 3, 5, generator=seeded(3)).permute(3, 1, 2, 0)  # [5, 3, 3, 4]
    assert grad.stride() == (1, 15, 5, 45)
    _, argmax, expected = _cpu_roi_pool(features, rois, grad.contiguous(), 1.0, 3, 4)
    assert bool((argmax >= 0).any())
    got = emu.roi_pool_backward(grad, rois, argmax, *features.shape)
    torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_roi_pool_backward_atomics(emu, dtype):
    """One block of 256 threads, 64 adds each, all into one pixel: 4096 rois of 2 x 2 bins that
    share pixel (1, 1), the maximum of the map. The sum is exact in any order; a plain += would
    lose some of the 16384 adds. Then 16 channels over the default grid."""
    x = torch.zeros(1, 1, 4, 4, dtype=dtype)
    x[0, 0, 1, 1] = 1.0
    rois = torch.tensor([[0, 0.0, 0.0, 2.0, 2.0]], dtype=dtype).repeat(4096, 1)  # bins rows 0-1, 1-2
    out, argmax = emu.roi_pool(x, rois, 1.0, 2, 2)
    assert bool((argmax == 5).all())
    got = emu.roi_pool_backward(torch.ones_like(out), rois, argmax, *x.shape, 1)
    assert got[0, 0, 1, 1] == 16384 and got.sum() == 16384
    x = x.repeat(1, 16, 1, 1)
    out, argmax = emu.roi_pool(x, rois[:300], 1.0, 2, 2)
    got = emu.roi_pool_backward(torch.ones_like(out), rois[:300], argmax, *x.shape)
    assert bool((got[0, :, 1, 1] == 1200).all()) and got.sum() == 16 * 1200
