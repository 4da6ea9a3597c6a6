"""detcore.layers.roi_pool, forward and backward: equal to torchvision's op bit for bit (values,
argmax, gradients, ties) and to a plain-PyTorch reference written here; the dispatcher paths
(autocast, TorchScript, torch.compile, fake tensors, torch.fx) and the argument checks."""
from typing import List

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from detcore.layers import ROIPool, RoIPool, roi_pool

try:
    from .reference_ops import boxes_to_rois
except ImportError:  # tests/ run as rootdir-relative modules, without packages
    from reference_ops import boxes_to_rois

try:
    import torchvision
except ImportError:  # detcore works without torchvision; only the comparisons to it skip
    torchvision = None

needs_torchvision = pytest.mark.skipif(torchvision is None, reason="torchvision is not importable")
FLOAT_MIN = -torch.finfo(torch.float32).max  # torchvision's starting max, also in float64


# --- the reference ---------------------------------------------------------------------------------
def _round_half_away(x):
    """C's round() (half away from zero), elementwise; torch.round rounds half to even."""
    whole = torch.trunc(x)
    frac = x - whole  # exact
    return whole + torch.sign(x) * (frac.abs() >= 0.5).to(x.dtype)


def roi_pool_reference(input, rois, output_size, spatial_scale=1.0):
    """Max pooling of quantized bins, written from the definition in the rois' dtype.

    Corners: round(coordinate * scale); the roi spans end - start + 1 pixels (at least 1); bin p
    covers [floor(p * size / n), ceil((p + 1) * size / n)) from the corner, clipped to the map.
    A bin's value is its largest (the first one row by row among equal ones, as torch.max
    returns), an empty bin gives 0. Differentiable in ``input``: torch.max routes each bin's
    gradient to the pixel it picked. Inputs without NaN and above -FLT_MAX (see the tests
    against torchvision for those).
    """
    if isinstance(output_size, int):
        output_size = (output_size, output_size)
    pooled_h, pooled_w = output_size
    _, channels, height, width = input.shape
    dtype = rois.dtype
    scale = torch.tensor(spatial_scale, dtype=dtype)
    corners = _round_half_away(rois[:, 1:].detach().cpu() * scale).to(torch.int64).tolist()
    outputs = []
    for roi, (x1, y1, x2, y2) in zip(rois.detach().cpu().tolist(), corners):
        batch = int(roi[0])
        bin_h = torch.tensor(max(y2 - y1 + 1, 1), dtype=dtype) / pooled_h
        bin_w = torch.tensor(max(x2 - x1 + 1, 1), dtype=dtype) / pooled_w
        bins = []
        for ph in range(pooled_h):
            h0 = min(max(int(torch.floor(torch.tensor(ph, dtype=dtype) * bin_h)) + y1, 0), height)
            h1 = min(max(int(torch.ceil(torch.tensor(ph + 1, dtype=dtype) * bin_h)) + y1, 0), height)
            for pw in range(pooled_w):
                w0 = min(max(int(torch.floor(torch.tensor(pw, dtype=dtype) * bin_w)) + x1, 0), width)
                w1 = min(max(int(torch.ceil(torch.tensor(pw + 1, dtype=dtype) * bin_w)) + x1, 0), width)
                if h1 <= h0 or w1 <= w0:
                    bins.append(input.new_zeros(channels))
                else:
                    region = input[batch, :, h0:h1, w0:w1].reshape(channels, -1)
                    bins.append(region.max(dim=1).values)
        outputs.append(torch.stack(bins, dim=1).reshape(channels, pooled_h, pooled_w))
    if not outputs:
        return input.new_zeros(0, channels, pooled_h, pooled_w)
    return torch.stack(outputs)


# --- inputs ----------------------------------------------------------------------------------------
def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def _features(shape, seed, dtype=torch.float32):
    return torch.randn(shape, generator=_gen(seed), dtype=torch.float64).to(dtype)


def _rois(k, batch, image_hw, seed, dtype=torch.float32, min_size=-3.0):
    """k rois in image coordinates: some partly or wholly outside, a few empty or inverted."""
    g = _gen(seed)
    h, w = image_hw
    x1 = torch.rand(k, generator=g, dtype=torch.float64) * 1.4 * w - 0.3 * w
    y1 = torch.rand(k, generator=g, dtype=torch.float64) * 1.4 * h - 0.3 * h
    bw = min_size + torch.rand(k, generator=g, dtype=torch.float64) * (0.7 * w - min_size)
    bh = min_size + torch.rand(k, generator=g, dtype=torch.float64) * (0.7 * h - min_size)
    index = torch.randint(0, batch, (k,), generator=g).to(torch.float64)
    return torch.stack([index, x1, y1, x1 + bw, y1 + bh], dim=1).to(dtype)


def _forward_backward(fn, x, rois, grad_out, *args):
    x = x.detach().clone().requires_grad_(True)
    out = fn(x, rois, *args)
    out.backward(grad_out)
    return out.detach(), x.grad


def _equal_to_torchvision(x, rois, output_size, spatial_scale, seed=0):
    """Output, argmax and input gradient identical to torchvision's (same bits)."""
    out = roi_pool(x, rois, output_size, spatial_scale)
    if torchvision is None:
        return out
    size = (output_size, output_size) if isinstance(output_size, int) else output_size
    _, ours = torch.ops.detcore.roi_pool(x, rois, spatial_scale, *size)
    _, theirs = torch.ops.torchvision.roi_pool(x, rois, spatial_scale, *size)
    assert torch.equal(ours, theirs), "argmax differs"
    grad_out = _features(out.shape, seed + 1, x.dtype)
    out, grad = _forward_backward(roi_pool, x, rois, grad_out, output_size, spatial_scale)
    tv_out, tv_grad = _forward_backward(torchvision.ops.roi_pool, x, rois, grad_out, output_size, spatial_scale)
    assert torch.equal(out, tv_out)
    assert torch.equal(grad, tv_grad)
    return out


def _equal_to_reference(x, rois, output_size, spatial_scale, seed=0):
    out = roi_pool(x, rois, output_size, spatial_scale)
    ref = roi_pool_reference(x, rois, output_size, spatial_scale)
    assert out.shape == ref.shape and out.dtype == x.dtype
    assert torch.equal(out, ref)
    grad_out = _features(out.shape, seed + 1, x.dtype)
    _, grad = _forward_backward(roi_pool, x, rois, grad_out, output_size, spatial_scale)
    _, ref_grad = _forward_backward(roi_pool_reference, x, rois, grad_out, output_size, spatial_scale)
    # Both add the same terms per pixel, possibly in another order.
    torch.testing.assert_close(grad, ref_grad, rtol=1e-6, atol=1e-6)
    return out


# The CPU forward paths: planar (a few rois on a large map: each reads only its region) and
# blocked (rois that cover the map several times: blocks of 16 channels, vectorized, with a
# scalar rest for other channel counts), each from an NCHW or a channels-last input.
def _planar(x):
    return x.contiguous()


def _channels_last(x):
    return x.contiguous(memory_format=torch.channels_last)


LAYOUTS = [_planar, _channels_last]
# (channels, height, width, rois): which path and which part of the block kernel runs.
PATHS = {
    "planar": (5, 60, 70, 6),
    "blocked-scalar": (9, 13, 17, 40),
    "blocked-vector": (32, 13, 17, 40),
    "blocked-both": (21, 9, 11, 30),
}


# --- values and gradients --------------------------------------------------------------------------
def test_import_paths_are_the_same_objects():
    import sys

    module = sys.modules["detcore.layers.roi_pool"]
    assert module.roi_pool is roi_pool and module.ROIPool is ROIPool and module.RoIPool is RoIPool


@needs_torchvision
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("spatial_scale", [1.0, 0.5, 0.3, 1 / 16])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("path", list(PATHS))
def test_equals_torchvision(path, spatial_scale, dtype, layout):
    channels, height, width, k = PATHS[path]
    x = layout(_features((2, channels, height, width), seed=1, dtype=dtype))
    rois = _rois(k, 2, (height / spatial_scale, width / spatial_scale), seed=2, dtype=dtype)
    _equal_to_torchvision(x, rois, (3, 4), spatial_scale)


@needs_torchvision
@pytest.mark.parametrize("output_size", [1, 7, (2, 5), (6, 1), (20, 20)])
def test_output_sizes_equal_torchvision(output_size):
    """Also more bins than pixels (20 x 20 on small rois): bins repeat or are empty."""
    x = _features((1, 3, 16, 18), seed=3)
    rois = _rois(12, 1, (16, 18), seed=4)
    out = _equal_to_torchvision(x, rois, output_size, 1.0)
    h, w = (output_size, output_size) if isinstance(output_size, int) else output_size
    assert out.shape == (12, 3, h, w)


@needs_torchvision
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("path", list(PATHS))
def test_ties_pick_the_first_pixel_like_torchvision(path, dtype, layout):
    """Few distinct values: most bins hold their maximum several times. The argmax (and so the
    gradient) must be the pixel torchvision picks: the first one, row by row."""
    channels, height, width, k = PATHS[path]
    x = layout(torch.randint(0, 3, (2, channels, height, width), generator=_gen(5)).to(dtype))
    rois = _rois(k, 2, (height, width), seed=6, dtype=dtype)
    _equal_to_torchvision(x, rois, (3, 3), 1.0)
    flat = layout(torch.zeros(1, 8, 6, 6, dtype=dtype))  # all tied: pixel (h0, w0) of each bin
    _equal_to_torchvision(flat, torch.tensor([[0, 0.0, 0.0, 5.0, 5.0]], dtype=dtype), 2, 1.0)


@needs_torchvision
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("channels", [8, 16])
def test_nan_inf_and_huge_negatives_like_torchvision(channels, dtype, layout):
    """NaN is never picked; a bin of only -inf / values <= -FLT_MAX gives -FLT_MAX and argmax -1
    (torchvision starts its max there, in float64 too)."""
    x = _features((1, channels, 8, 8), seed=7, dtype=dtype)
    x[0, :, 0:2, 0:2] = float("nan")
    x[0, :3, 4:, 4:] = -float("inf")
    x[0, 3:, 4:, 4:] = FLOAT_MIN
    if dtype == torch.float64:
        x[0, 5:, 4:, 4:] = -1e300
    x[0, 1, 0, 1] = 5.0  # one number among NaNs
    rois = torch.tensor([[0, 0.0, 0.0, 3.0, 3.0], [0, 4.0, 4.0, 7.0, 7.0], [0, 0.0, 0.0, 7.0, 7.0]], dtype=dtype)
    out = _equal_to_torchvision(layout(x), rois, 2, 1.0)  # few rois: the planar path
    _equal_to_torchvision(layout(x), rois.repeat(10, 1), 2, 1.0)  # the blocked path
    assert not out.isnan().any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("spatial_scale", [1.0, 0.3])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("path", list(PATHS))
def test_equals_reference(path, spatial_scale, dtype, layout):
    channels, height, width, k = PATHS[path]
    x = layout(_features((2, channels, height, width), seed=8, dtype=dtype))
    rois = _rois(k, 2, (height / spatial_scale, width / spatial_scale), seed=9, dtype=dtype)
    _equal_to_reference(x, rois, (3, 4), spatial_scale)


def test_corners_round_half_away_from_zero():
    """x = 2.5 starts at pixel 3 and -0.5 at -1 (C's round; torch.round would give 2 and 0)."""
    x = torch.arange(2 * 10.0).reshape(1, 1, 2, 10)
    rois = torch.tensor([[0, 2.5, 0.0, 2.5, 1.0], [0, -1.5, 0.0, -0.5, 1.0], [0, 0.0, 0.0, 1.5, 0.0]])
    out = roi_pool(x, rois, (1, 1), 1.0).flatten().tolist()
    assert out == [13.0, 0.0, 2.0]
    assert torch.equal(roi_pool_reference(x, rois, 1, 1.0).flatten(), torch.tensor(out))


def test_rois_outside_zero_size_and_inverted():
    x = _features((2, 3, 10, 10), seed=10)
    rois = torch.tensor(
        [
            [0, -50.0, -50.0, -20.0, -20.0],  # wholly above-left: every bin empty
            [1, 30.0, 30.0, 60.0, 60.0],  # wholly below-right
            [0, -3.0, -3.0, 4.0, 4.0],  # straddles the top-left corner
            [1, 5.0, -2.0, 12.5, 8.5],  # straddles the right edge
            [0, 3.0, 3.0, 3.0, 3.0],  # a point: one pixel
            [1, 6.0, 6.0, 2.0, 2.0],  # inverted: one pixel
            [0, 9.4, 0.0, 9.4, 9.0],  # the last column
        ]
    )
    out = _equal_to_reference(x, rois, (2, 3), 1.0)
    assert bool((out[:2] == 0).all())
    if torchvision is not None:
        _equal_to_torchvision(x, rois, (2, 3), 1.0)


def test_huge_coordinates_are_safe():
    """Coordinates far beyond any map (int overflow in a plain cast) pool nothing, or the map."""
    x = _features((1, 2, 6, 6), seed=11)
    rois = torch.tensor([[0, 1e12, 1e12, 2e12, 2e12], [0, -3e15, -3e15, 1e15, 1e15], [0, 1.0, 1.0, 1e30, 1e30]])
    out = roi_pool(x, rois, 2, 1.0)
    assert bool((out[0] == 0).all())
    assert torch.isfinite(out).all()
    big = roi_pool(x, rois, 2, 1e30)  # a huge scale: every corner clamped
    assert torch.isfinite(big).all()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_list_of_boxes_equals_tensor_rois(layout):
    x = layout(_features((2, 8, 12, 12), seed=12))
    boxes = [_rois(4, 1, (24, 24), seed=13)[:, 1:], _rois(3, 1, (24, 24), seed=14)[:, 1:]]
    from_list = roi_pool(x, boxes, (3, 3), 0.5)
    assert torch.equal(from_list, roi_pool(x, boxes_to_rois(boxes), (3, 3), 0.5))
    if torchvision is not None:
        assert torch.equal(from_list, torchvision.ops.roi_pool(x, boxes, (3, 3), 0.5))


def test_many_rois_and_channels_equal_torchvision_on_both_paths():
    """Enough work for the channels-last path and several threads' chunks of rois."""
    if torchvision is None:
        pytest.skip("torchvision is not importable")
    x = _features((2, 32, 25, 34), seed=15)
    rois = _rois(300, 2, (100, 136), seed=16)
    _equal_to_torchvision(x, rois, 7, 0.25)
    _equal_to_torchvision(_channels_last(x), rois, 7, 0.25)


def test_empty_rois_channels_and_maps():
    x = _features((2, 3, 8, 8), seed=17).requires_grad_(True)
    out = roi_pool(x, torch.zeros(0, 5), 2, 1.0)
    assert out.shape == (0, 3, 2, 2)
    out.sum().backward()
    assert x.grad is not None and bool((x.grad == 0).all())
    rois = torch.tensor([[0, 1.0, 1.0, 5.0, 5.0], [1, 0.0, 0.0, 3.0, 6.0]])
    no_channels = roi_pool(torch.zeros(2, 0, 8, 8), rois, 2, 1.0)
    assert no_channels.shape == (2, 0, 2, 2)
    no_pixels, argmax = torch.ops.detcore.roi_pool(torch.zeros(2, 3, 0, 8), rois, 1.0, 2, 2)
    assert bool((no_pixels == 0).all()) and bool((argmax == -1).all())
    empty_batch = roi_pool(torch.zeros(0, 3, 8, 8), torch.zeros(0, 5), 2, 1.0)
    assert empty_batch.shape == (0, 3, 2, 2)


def test_non_contiguous_input_rois_and_grad():
    x = _features((2, 8, 12, 10), seed=18).transpose(2, 3)  # [2, 8, 10, 12], strided
    rois = torch.cat([_rois(9, 2, (10, 12), seed=19), torch.zeros(9, 2)], dim=1)[:, :5]
    assert not x.is_contiguous() and not rois.is_contiguous()
    grad_out = _features((9, 8, 4, 3), seed=20).transpose(2, 3)  # [9, 8, 3, 4], strided
    assert not grad_out.is_contiguous()
    out, grad = _forward_backward(roi_pool, x, rois, grad_out, (3, 4), 1.0)
    x_c = x.contiguous()
    out_c, grad_c = _forward_backward(roi_pool, x_c, rois.contiguous(), grad_out.contiguous(), (3, 4), 1.0)
    assert torch.equal(out, out_c) and torch.equal(grad, grad_c)
    # The expanded (zero-stride) gradient of out.sum().
    y = x_c.clone().requires_grad_(True)
    roi_pool(y, rois, (3, 4), 1.0).sum().backward()
    _, ones_grad = _forward_backward(roi_pool, x_c, rois, torch.ones(9, 8, 3, 4), (3, 4), 1.0)
    assert torch.equal(y.grad, ones_grad)


def test_gradcheck():
    # Distinct, well separated values: the finite differences never move a bin's maximum.
    g = _gen(21)
    x = (torch.randperm(2 * 3 * 8 * 9, generator=g).double() / 10).reshape(2, 3, 8, 9)
    x.requires_grad_(True)
    rois = _rois(6, 2, (8, 9), seed=22, dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda t: roi_pool(t, rois, (3, 2), 1.0), (x,), eps=1e-4)


def test_double_backward_is_an_error_not_silent_zeros():
    x = _features((1, 2, 6, 6), seed=23, dtype=torch.float64).requires_grad_(True)
    rois = torch.tensor([[0, 0.0, 0.0, 4.0, 4.0]], dtype=torch.float64)
    out = roi_pool(x, rois, 2, 1.0)
    grad_out = torch.ones_like(out, requires_grad=True)
    (grad,) = torch.autograd.grad(out, x, grad_out, create_graph=True)
    with pytest.raises(RuntimeError, match="double backward"):
        grad.sum().backward()


def test_inputs_are_not_modified():
    x = _features((1, 2, 8, 8), seed=24)
    rois = _rois(5, 1, (8, 8), seed=25)
    x_before, rois_before = x.clone(), rois.clone()
    roi_pool(x, rois, 2, 1.0)
    assert torch.equal(x, x_before) and torch.equal(rois, rois_before)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_types_on_cpu_equal_float32_of_the_same_values(dtype):
    x = _features((2, 8, 10, 10), seed=26).to(dtype).requires_grad_(True)
    rois = _rois(12, 2, (20, 20), seed=27).to(dtype)
    out = roi_pool(x, rois, 3, 0.5)
    assert out.dtype == dtype
    x32 = x.detach().float().requires_grad_(True)
    expected = roi_pool(x32, rois.float(), 3, 0.5)
    assert torch.equal(out.float(), expected)  # a max of exactly upcast values: exact
    grad_out = _features(out.shape, seed=28).to(dtype)
    out.backward(grad_out)
    expected.backward(grad_out.float())
    assert x.grad.dtype == dtype
    assert torch.equal(x.grad, x32.grad.to(dtype))


def test_autocast_cpu():
    x = _features((2, 4, 10, 10), seed=29)
    rois = _rois(10, 2, (20, 20), seed=30)
    expected = roi_pool(x, rois, 3, 0.5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = roi_pool(x, rois, 3, 0.5)
        low = x.to(torch.bfloat16).requires_grad_(True)
        low_out = roi_pool(low, rois, 3, 0.5)  # bfloat16 features with float32 rois
    assert out.dtype == torch.float32 and torch.equal(out, expected)
    assert low_out.dtype == torch.bfloat16
    assert torch.equal(low_out.float(), roi_pool(low.detach().float(), rois, 3, 0.5))
    low_out.float().sum().backward()
    assert low.grad is not None and low.grad.dtype == torch.bfloat16


# --- argument checks -------------------------------------------------------------------------------
def _raises(match, *args, **kwargs):
    with pytest.raises(ValueError, match=match):
        roi_pool(*args, **kwargs)


def test_bad_input_names_the_argument():
    x = torch.rand(2, 3, 8, 8)
    rois = torch.tensor([[0, 1.0, 1.0, 5.0, 5.0]])
    _raises("boxes", x, torch.rand(3, 4), 2)  # a tensor needs the batch index column
    _raises("boxes", x, torch.rand(3, 5, 1), 2)
    _raises(r"roi_pool: input must have shape \[N, C, H, W\]", torch.rand(3, 8, 8), rois, 2)
    _raises("roi_pool: input must be float32, float64, float16 or bfloat16", torch.randint(0, 5, (2, 3, 8, 8)), rois.long(), 2)
    _raises("roi_pool: rois must have the dtype of input", x, rois.double(), 2)
    _raises("roi_pool: output_size must be non-negative", x, rois, (-1, 2))
    _raises("output_size", x, rois, (2, 2, 2))
    _raises(r"roi_pool: boxes\[0\] must be a Tensor\[L, 4\]", x, [torch.rand(2, 3)], 2)
    _raises("roi_pool: boxes is an empty list", x, [], 2)
    _raises("spatial_scale must be a finite number > 0", x, rois, 2, 0.0)
    _raises("spatial_scale must be a finite number > 0", x, rois, 2, float("nan"))
    _raises("rois must be finite", x, torch.tensor([[0, 1.0, float("inf"), 5.0, 5.0]]), 2)
    wide = torch.zeros(1, 1, 1, 1).expand(1, 1, 50000, 50000)  # no memory behind it
    _raises(r"H \* W must be at most 2147483647", wide, rois, 2)


@pytest.mark.parametrize("index", [2.0, -1.0, float("nan")])
def test_bad_batch_index_names_rois(index):
    x = torch.rand(2, 3, 8, 8)
    rois = torch.tensor([[0, 1.0, 1.0, 5.0, 5.0], [index, 1.0, 1.0, 5.0, 5.0]])
    _raises("rois", x, rois, 2)
    grad = torch.rand(2, 3, 2, 2)
    argmax = torch.zeros(2, 3, 2, 2, dtype=torch.int32)
    with pytest.raises(ValueError, match="rois"):
        torch.ops.detcore._roi_pool_backward(grad, rois, argmax, 1.0, 2, 2, 2, 3, 8, 8)


def test_backward_op_checks_argmax():
    rois = torch.tensor([[0, 1.0, 1.0, 5.0, 5.0]])
    grad = torch.rand(1, 3, 2, 2)

    def backward(argmax):
        return torch.ops.detcore._roi_pool_backward(grad, rois, argmax, 1.0, 2, 2, 1, 3, 8, 8)

    ok = torch.full((1, 3, 2, 2), -1, dtype=torch.int32)
    ok[0, :, 0, 0] = 63
    assert backward(ok).sum() == grad[0, :, 0, 0].sum()
    for bad in (64, -2, 2**31 - 1):
        argmax = ok.clone()
        argmax[0, 1, 1, 1] = bad
        with pytest.raises(ValueError, match=r"argmax must hold offsets into the H \* W plane, in \[-1, 64\)"):
            backward(argmax)
    with pytest.raises(ValueError, match="argmax must be int32"):
        backward(ok.long())
    with pytest.raises(ValueError, match="argmax must have the shape of grad"):
        backward(ok[:, :2])


@pytest.mark.parametrize("dtype", [getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, n)])
def test_float8_is_a_clear_error(dtype):
    x = torch.rand(1, 2, 8, 8).to(dtype)
    rois = torch.tensor([[0, 1.0, 1.0, 5.0, 5.0]]).to(dtype)
    with pytest.raises(ValueError, match=r"roi_pool: input must be float32, float64, float16 or bfloat16"):
        torch.ops.detcore.roi_pool(x, rois, 1.0, 2, 2)


# --- the module and the drop-in details ------------------------------------------------------------
def test_module_spelling_and_repr_match_torchvision():
    ours = RoIPool(7, spatial_scale=0.25)
    assert isinstance(ours, ROIPool) and isinstance(ours, torch.nn.Module) and ours.output_size == 7
    assert repr(ours) == "RoIPool(output_size=7, spatial_scale=0.25)"
    assert repr(ROIPool((7, 5), 0.5)) == "ROIPool(output_size=(7, 5), spatial_scale=0.5)"
    if torchvision is not None:
        assert repr(torchvision.ops.RoIPool(7, 0.25)) == repr(ours)
        assert repr(torchvision.ops.RoIPool((7, 5), 0.5)) == repr(RoIPool((7, 5), 0.5))
    x = _features((2, 3, 10, 10), seed=31)
    rois = _rois(6, 2, (40, 40), seed=32)
    assert torch.equal(ours(x, rois), roi_pool(x, rois, 7, 0.25))


class _PoolsBoxLists(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.pool = RoIPool(3, 0.5)

    def forward(self, x: torch.Tensor, boxes: List[torch.Tensor]) -> torch.Tensor:
        return self.pool(x, boxes) * 2


def _box_list():
    return [torch.tensor([[1.0, 1.0, 17.0, 17.0]]), torch.tensor([[0.0, 2.0, 9.0, 13.0], [3.0, 3.0, 4.0, 4.0]])]


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:FutureWarning")
def test_torchscript():
    x = _features((2, 4, 10, 10), seed=33)
    module = _PoolsBoxLists()
    scripted = torch.jit.script(module)
    assert torch.equal(scripted(x, _box_list()), module(x, _box_list()))
    scripted_fn = torch.jit.script(roi_pool)
    rois = boxes_to_rois(_box_list())
    assert torch.equal(scripted_fn(x, rois, [3, 2], 0.5), roi_pool(x, rois, (3, 2), 0.5))


def test_fx_symbolic_tracing_keeps_roi_pool_a_leaf():
    module = _PoolsBoxLists()
    traced = torch.fx.symbolic_trace(module)
    targets = [node.target for node in traced.graph.nodes if node.op == "call_function"]
    assert roi_pool in targets  # one call node, not its internals
    x = _features((2, 4, 10, 10), seed=34)
    assert torch.equal(traced(x, _box_list()), module(x, _box_list()))


def test_fake_tensors_and_meta_give_shapes():
    x = _features((2, 4, 10, 12), seed=35)
    rois = _rois(9, 2, (10, 12), seed=36)
    with FakeTensorMode() as mode:
        out, argmax = torch.ops.detcore.roi_pool(mode.from_tensor(x), mode.from_tensor(rois), 0.5, 7, 5)
        assert out.shape == (9, 4, 7, 5) and out.dtype == torch.float32 and argmax.dtype == torch.int32
        g = torch.ops.detcore._roi_pool_backward(out, mode.from_tensor(rois), argmax, 0.5, 7, 5, 2, 4, 10, 12)
        assert g.shape == (2, 4, 10, 12)
    meta, _ = torch.ops.detcore.roi_pool(torch.empty(3, 8, 20, 30, device="meta"), torch.empty(11, 5, device="meta"), 0.5, 4, 4)
    assert meta.shape == (11, 8, 4, 4) and meta.device.type == "meta"


def test_opcheck():
    x = _features((2, 4, 10, 12), seed=37).requires_grad_(True)
    rois = _rois(8, 2, (20, 24), seed=38)
    x64 = x.detach().double().requires_grad_(True)
    for args in ((x, rois, 0.5, 3, 3), (x64, rois.double(), 0.25, 2, 4)):
        torch.library.opcheck(torch.ops.detcore.roi_pool.default, args)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_torch_compile_fullgraph_forward_and_backward(backend):
    rois = _rois(20, 2, (20, 24), seed=39)

    def loss(x):
        return (roi_pool(x, rois, (3, 3), 0.5) ** 2).sum()

    features = _features((2, 4, 10, 12), seed=40)
    x1 = features.clone().requires_grad_(True)
    x2 = features.clone().requires_grad_(True)
    expected = loss(x1)
    expected.backward()
    got = torch.compile(loss, fullgraph=True, backend=backend)(x2)
    got.backward()
    assert torch.equal(got, expected) and torch.equal(x2.grad, x1.grad)
