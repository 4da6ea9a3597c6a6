"""detcore's CUDA sigmoid focal loss kernels, run on the CPU by the CUDA emulation, equal the CPU
kernel.

As in test_cuda_emulation.py: detcore/csrc/cuda/sigmoid_focal_loss_kernels.cuh compiled by g++
with tests/layers/cuda_emulation/cuda_emulation.h, launched with the real grid (launch_config.h)
or a lowered one, so that small inputs take the grid-stride loops. The device code computes with
the C library's exp / log1p (the GPU: CUDA's), the CPU kernel with its own vector functions, so
values are compared within the shared CUDA-vs-CPU tolerance. The sums are fixed trees: the same
bits on every run. Half and bfloat16 are compared with the CPU float32 kernel on the same,
exactly upcast, values.
"""
import pytest
import torch

import detcore.layers  # noqa: F401  (loads torch.ops.detcore)

try:
    from .reference_ops import CUDA_VS_CPU_TOLERANCE, EMULATED_DTYPES, in_cpu_dtype, seeded
    from .test_sigmoid_focal_loss import ALPHAS, alpha_grid, assert_alpha_weighting_is_precise
except ImportError:  # tests/ run as rootdir-relative modules, without packages
    from reference_ops import CUDA_VS_CPU_TOLERANCE, EMULATED_DTYPES, in_cpu_dtype, seeded
    from test_sigmoid_focal_loss import ALPHAS, alpha_grid, assert_alpha_weighting_is_precise

TOL = CUDA_VS_CPU_TOLERANCE
REDUCTIONS = ["none", "mean", "sum"]


def _inputs(n, seed, dtype, scale=5.0):
    g = seeded(seed)
    x = torch.randn(n, generator=g, dtype=torch.float64) * scale
    x[:4] = torch.tensor([100.0, -100.0, 30.0, -30.0])  # saturated logits
    t = torch.rand(n, generator=g, dtype=torch.float64)
    t[::3] = 0.0
    t[1::3] = 1.0
    return x.to(dtype), t.to(dtype)


def _cpu(x, t, grad, alpha, gamma, reduction):
    """The CPU kernel's loss and both gradients, on the upcast values for half types."""
    xc = in_cpu_dtype(x).requires_grad_(True)
    tc = in_cpu_dtype(t).requires_grad_(True)
    loss = torch.ops.detcore.sigmoid_focal_loss(xc, tc, alpha, gamma, reduction)
    gx, gt = torch.autograd.grad(loss, (xc, tc), in_cpu_dtype(grad))
    return loss.detach(), gx, gt


def _emulated(emu, x, t, grad, alpha, gamma, reduction, *limit):
    loss, bad = emu.sigmoid_focal_loss(x, t, alpha, gamma, reduction, *limit)
    gx, gt, bad_backward = emu.sigmoid_focal_loss_backward(grad, x, t, alpha, gamma, reduction, True, *limit)
    assert int(bad) == int(bad_backward) == x.numel()  # every target is a probability
    return loss, gx, gt


def _assert_equal_to_cpu(got, expected, dtype):
    for a, b in zip(got, expected):
        assert a.dtype == dtype and a.shape == b.shape
        torch.testing.assert_close(in_cpu_dtype(a), b.to(dtype).to(b.dtype), **TOL[dtype])


@pytest.mark.parametrize("dtype", EMULATED_DTYPES)
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_equals_cpu(emu, dtype, reduction):
    """3000 elements: 12 blocks, and a last one partly empty."""
    x, t = _inputs(3000, 1, dtype)
    grad = torch.randn(3000 if reduction == "none" else (), generator=seeded(2)).to(dtype)
    for alpha, gamma in ((0.25, 2.0), (-1.0, 0.0), (0.5, 1.0), (0.25, 1.5), (0.75, 0.5)):
        got = _emulated(emu, x, t, grad, alpha, gamma, reduction)
        _assert_equal_to_cpu(got, _cpu(x, t, grad, alpha, gamma, reduction), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_tiny_alphas_keep_the_loss_and_gradients_precise(emu, dtype):
    """The device code's a_t, as the CPU kernel's: tiny alphas, 0 and 1, hard and soft targets,
    saturated logits, held to the float64 reference (test_sigmoid_focal_loss's bounds)."""
    x, t = alpha_grid(dtype)
    ones = torch.ones(len(x), dtype=dtype)
    for alpha in ALPHAS:
        for gamma in (0.0, 1.0, 2.0, 1.5):
            got = _emulated(emu, x, t, ones, alpha, gamma, "none")
            assert_alpha_weighting_is_precise(got, x, t, alpha, gamma, "emulated")


@pytest.mark.parametrize("max_blocks", [1, 2])
def test_more_work_than_blocks(emu, max_blocks):
    """A grid of 1 or 2 blocks for 12 blocks' work: the grid-stride loops and their sums."""
    x, t = _inputs(3000, 3, torch.float64)
    for reduction in REDUCTIONS:
        grad = torch.randn(3000 if reduction == "none" else (), generator=seeded(4), dtype=torch.float64)
        got = _emulated(emu, x, t, grad, 0.25, 2.0, reduction, max_blocks)
        _assert_equal_to_cpu(got, _cpu(x, t, grad, 0.25, 2.0, reduction), torch.float64)


def test_sums_are_the_same_bits_every_run(emu):
    """No atomics in the sum: threads that finish in another order give the same result."""
    x, t = _inputs(5000, 5, torch.float32)
    first = [emu.sigmoid_focal_loss(x, t, 0.25, 2.0, r)[0] for r in ("sum", "mean")]
    for _ in range(2):
        again = [emu.sigmoid_focal_loss(x, t, 0.25, 2.0, r)[0] for r in ("sum", "mean")]
        assert all(torch.equal(a, b) for a, b in zip(first, again))
    expected = torch.ops.detcore.sigmoid_focal_loss(x.double(), t.double(), 0.25, 2.0, "sum")
    torch.testing.assert_close(first[0].double(), expected, rtol=1e-6, atol=0)


def test_first_bad_target_is_the_lowest_index(emu):
    """Bad targets in several blocks: the kernels keep the lowest index, as the CPU reports."""
    x, t = _inputs(3000, 6, torch.float32)
    t[2900] = 2.0
    t[1700] = float("nan")
    t[600] = -0.5
    _, bad = emu.sigmoid_focal_loss(x, t, 0.25, 2.0, "sum")
    *_, bad_backward = emu.sigmoid_focal_loss_backward(torch.tensor(1.0), x, t, 0.25, 2.0, "sum", False)
    assert int(bad) == int(bad_backward) == 600
    with pytest.raises(ValueError, match=r"got -0.5 at targets\[600\]"):
        torch.ops.detcore.sigmoid_focal_loss(x, t, 0.25, 2.0, "sum")


def test_edge_cases(emu):
    """No elements, one, a 0-dim tensor, the expanded (zero-stride) grad of loss.sum(), no
    targets gradient."""
    for shape in ((0,), (1,), ()):
        x = torch.full(shape, 0.7, dtype=torch.float64)
        t = torch.full(shape, 1.0, dtype=torch.float64)
        for reduction in REDUCTIONS:
            loss, _ = emu.sigmoid_focal_loss(x, t, 0.25, 2.0, reduction)
            expected = torch.ops.detcore.sigmoid_focal_loss(x, t, 0.25, 2.0, reduction)
            torch.testing.assert_close(loss, expected, equal_nan=True, rtol=1e-12, atol=0)
    x, t = _inputs(700, 7, torch.float32)
    ones = torch.ones(()).expand(700)
    gx, gt, _ = emu.sigmoid_focal_loss_backward(ones, x, t, 0.25, 2.0, "none", False)
    assert gt.shape == (0,)
    _, expected, _ = _cpu(x, t, torch.ones(700), 0.25, 2.0, "none")
    torch.testing.assert_close(gx, expected, **TOL[torch.float32])


def test_backward_strided_grad(emu):
    """A per-element grad that is not contiguous (the launcher makes it so for the kernel)."""
    x, t = _inputs(3000, 8, torch.float32)
    x, t = x.view(30, 100), t.view(30, 100)
    grad = torch.randn(100, 30, generator=seeded(9)).t()
    gx, gt, _ = emu.sigmoid_focal_loss_backward(grad, x, t, 0.25, 2.0, "none", True)
    _, ex, et = _cpu(x, t, grad.contiguous(), 0.25, 2.0, "none")
    torch.testing.assert_close(gx, ex, **TOL[torch.float32])
    torch.testing.assert_close(gt, et, **TOL[torch.float32])
