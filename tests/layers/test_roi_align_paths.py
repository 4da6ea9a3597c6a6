"""The CPU ROIAlign's paths give the same bits as each other, for any number of threads.

The forward pools 16-channel blocks of an NCHW map when the rois cover it several times over
(rois x bins x channels x 4 >= its size, at least 8 channels), reads a channels-last map in place
roi by roi, and walks NCHW planes roi by roi otherwise; the backward adds into 16-channel blocks
or into NCHW planes channel by channel, under the same rule. Each output value is summed in the
same order on every path, so the paths are compared bit for bit (and with the reference within
rounding). The rois' taps live in a table shared by the threads up to 4M taps, and are
recomputed per use beyond.
"""
import pytest
import torch

from detcore.layers import roi_align

try:
    from .reference_ops import roi_align_reference
except ImportError:  # tests/ run as rootdir-relative modules, without packages
    from reference_ops import roi_align_reference


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _rois(k, images, hw, seed, max_side=0.5):
    g = _gen(seed)
    h, w = hw
    xy = torch.rand(k, 2, generator=g, dtype=torch.float64) * torch.tensor([w * 1.1, h * 1.1]) - 4
    wh = torch.rand(k, 2, generator=g, dtype=torch.float64) * torch.tensor([w, h]) * max_side - 1
    index = torch.randint(0, images, (k, 1), generator=g).to(torch.float64)
    return torch.cat([index, xy, xy + wh], dim=1).float()


def _forward_backward(x, rois, grad_out, **kwargs):
    x = x.detach().clone().requires_grad_(True)
    out = roi_align(x, rois, **kwargs)
    (grad,) = torch.autograd.grad(out, x, grad_out)
    return out.detach(), grad


KW = dict(output_size=(7, 7), spatial_scale=0.25, sampling_ratio=2, aligned=True)


@pytest.mark.parametrize("channels", [8, 20, 32])
def test_blocked_forward_equals_roi_by_roi_bit_for_bit(channels):
    # 300 rois on 2 images of 24x30: the blocked path (partial last block for 8 and 20 channels).
    x = torch.randn(2, channels, 24, 30, generator=_gen(1))
    rois = _rois(300, 2, (96, 120), seed=2)
    out = roi_align(x, rois, **KW)
    # Each roi alone (roi by roi, NCHW planes), and the map channels-last (read in place).
    for k in range(0, 300, 37):
        assert torch.equal(out[k : k + 1], roi_align(x, rois[k : k + 1], **KW))
    assert torch.equal(out, roi_align(x.to(memory_format=torch.channels_last), rois, **KW))
    torch.testing.assert_close(out, roi_align_reference(x, rois, **KW), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("channels", [8, 20])
def test_blocked_backward_equals_planar_bit_for_bit(channels):
    # The same rois on the same map, once alone (blocked: the rois cover it many times) and
    # once beside 400 images no roi touches (planar: the map is now large for them).
    x = torch.randn(2, channels, 24, 30, generator=_gen(3))
    rois = _rois(300, 2, (96, 120), seed=4)
    grad_out = torch.randn(300, channels, 7, 7, generator=_gen(5))
    _, grad_blocked = _forward_backward(x, rois, grad_out, **KW)
    padded = torch.cat([x, torch.randn(400, channels, 24, 30, generator=_gen(6))])
    _, grad_planar = _forward_backward(padded, rois, grad_out, **KW)
    assert torch.equal(grad_blocked, grad_planar[:2]) and bool((grad_planar[2:] == 0).all())
    _, ref = _forward_backward_reference(x, rois, grad_out)
    torch.testing.assert_close(grad_blocked, ref, atol=1e-4, rtol=1e-4)


def _forward_backward_reference(x, rois, grad_out):
    x = x.detach().clone().requires_grad_(True)
    out = roi_align_reference(x, rois, **KW)
    (grad,) = torch.autograd.grad(out, x, grad_out)
    return out.detach(), grad


def test_expanded_gradient_is_read_through_its_strides():
    # out.sum()'s gradient is one value expanded over the output (zero strides).
    x = torch.randn(1, 24, 16, 16, generator=_gen(7), requires_grad=True)
    rois = _rois(100, 1, (64, 64), seed=8)
    (grad,) = torch.autograd.grad(roi_align(x, rois, **KW).sum(), x)
    (dense,) = torch.autograd.grad(roi_align(x, rois, **KW), x, torch.ones(100, 24, 7, 7))
    assert torch.equal(grad, dense)


def test_one_thread_and_two_give_the_same_bits():
    x = torch.randn(2, 48, 20, 28, generator=_gen(9))
    grad_out = torch.randn(400, 48, 7, 7, generator=_gen(10))
    cases = [(_rois(400, 2, (80, 112), seed=11), x), (_rois(3, 2, (80, 112), seed=12), x)]
    before = torch.get_num_threads()
    results = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            results.append([_forward_backward(f, r, grad_out[: len(r)], **KW) for r, f in cases])
    finally:
        torch.set_num_threads(before)
    for (out1, grad1), (out2, grad2) in zip(*results):
        assert torch.equal(out1, out2) and torch.equal(grad1, grad2)


def test_taps_past_the_table_budget_are_recomputed_per_use():
    # 64 rois x 49 bins x 40x40 samples = 5M taps: past the shared table's 4M, each use
    # recomputes its roi's taps; same bits as one roi at a time (its taps fit the table). In
    # float64: each pixel's gradient sums ~10^5 terms, in another order than the sum below.
    x = torch.randn(1, 16, 12, 12, generator=_gen(13), dtype=torch.float64)
    rois = _rois(64, 1, (48, 48), seed=14).double()
    kw = dict(KW, sampling_ratio=40)
    grad_out = torch.randn(64, 16, 7, 7, generator=_gen(15), dtype=torch.float64)
    out, grad = _forward_backward(x, rois, grad_out, **kw)
    for k in (0, 31, 63):
        assert torch.equal(out[k : k + 1], roi_align(x, rois[k : k + 1], **kw))
    grad_sum = sum(_forward_backward(x, rois[k : k + 1], grad_out[k : k + 1], **kw)[1] for k in range(64))
    torch.testing.assert_close(grad, grad_sum, atol=1e-9, rtol=1e-9)
