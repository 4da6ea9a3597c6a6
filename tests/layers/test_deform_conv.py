"""detcore.layers.deform_conv2d / DeformConv2d (DCN v1 and v2), forward and all gradients,
against torchvision and against a plain-PyTorch reference (grid_sample + einsum)."""
import math

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

from detcore.layers import DeformConv2d, deform_conv2d

try:
    import torchvision
except ImportError:  # detcore works without torchvision; only the comparisons to it skip
    torchvision = None

TOL = {torch.float32: dict(atol=2e-4, rtol=2e-4), torch.float64: dict(atol=1e-10, rtol=1e-10)}

# (in_channels, out_channels, kernel, groups, offset_groups, stride, padding, dilation, size)
CONFIGS = [
    (4, 6, (3, 3), 1, 1, (1, 1), (1, 1), (1, 1), (9, 11)),
    (6, 4, (3, 2), 2, 3, (2, 1), (1, 0), (1, 2), (10, 9)),
    (8, 6, (1, 3), 2, 4, (1, 2), (0, 2), (2, 1), (7, 12)),
    (6, 6, (2, 2), 3, 1, (2, 2), (2, 1), (1, 1), (8, 8)),
    (4, 2, (3, 3), 1, 2, (1, 1), (0, 0), (2, 2), (9, 9)),
]


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def _out_size(size, kernel, stride, padding, dilation):
    return tuple(
        (size[i] + 2 * padding[i] - dilation[i] * (kernel[i] - 1) - 1) // stride[i] + 1 for i in range(2)
    )


def _inputs(config, seed, dtype=torch.float64, batch=2, with_mask=True, offset_scale=2.0):
    """Random tensors for a config; offsets large enough that many samples fall off the map."""
    cin, cout, kernel, groups, og, stride, padding, dilation, size = config
    g = _gen(seed)
    ho, wo = _out_size(size, kernel, stride, padding, dilation)
    taps = kernel[0] * kernel[1]
    x = torch.randn(batch, cin, *size, generator=g, dtype=torch.float64)
    weight = torch.randn(cout, cin // groups, *kernel, generator=g, dtype=torch.float64)
    bias = torch.randn(cout, generator=g, dtype=torch.float64)
    offset = torch.randn(batch, 2 * og * taps, ho, wo, generator=g, dtype=torch.float64) * offset_scale
    mask = torch.rand(batch, og * taps, ho, wo, generator=g, dtype=torch.float64) if with_mask else None
    cast = lambda t: None if t is None else t.to(dtype)  # noqa: E731
    kwargs = dict(stride=stride, padding=padding, dilation=dilation)
    return cast(x), cast(offset), cast(weight), cast(bias), cast(mask), kwargs


def deform_conv2d_reference(x, offset, weight, bias=None, stride=(1, 1), padding=(0, 0), dilation=(1, 1), mask=None):
    """Deformable convolution from grid_sample (bilinear, zeros outside) and an einsum."""
    n, c, h, w = x.shape
    cout, cg, kh, kw = weight.shape
    groups = c // cg
    ho, wo = offset.shape[2:]
    taps = kh * kw
    og = offset.shape[1] // (2 * taps)
    off = offset.reshape(n, og, taps, 2, ho, wo)
    tap_y = (torch.arange(kh) * dilation[0]).repeat_interleave(kw).to(x.dtype)
    tap_x = (torch.arange(kw) * dilation[1]).repeat(kh).to(x.dtype)
    out_y = (torch.arange(ho) * stride[0] - padding[0]).to(x.dtype)
    out_x = (torch.arange(wo) * stride[1] - padding[1]).to(x.dtype)
    y = tap_y[:, None, None] + out_y[None, :, None] + off[:, :, :, 0]  # [n, og, taps, ho, wo]
    xx = tap_x[:, None, None] + out_x[None, None, :] + off[:, :, :, 1]
    grid = torch.stack([xx / (w - 1) * 2 - 1, y / (h - 1) * 2 - 1], dim=-1)
    samples = F.grid_sample(
        x.reshape(n * og, c // og, h, w),
        grid.reshape(n * og, taps * ho, wo, 2),
        mode="bilinear",
        padding_mode="zeros",
        align_corners=True,
    ).reshape(n, og, c // og, taps, ho, wo)
    if mask is not None:
        samples = samples * mask.reshape(n, og, 1, taps, ho, wo)
    samples = samples.reshape(n, groups, cg, taps, ho, wo)
    out = torch.einsum("ngckyx,gock->ngoyx", samples, weight.reshape(groups, cout // groups, cg, taps))
    out = out.reshape(n, cout, ho, wo)
    if bias is not None:
        out = out + bias[None, :, None, None]
    return out


def _value_and_grads(fn, x, offset, weight, bias, mask, kwargs, seed=5, grad_dtype=None):
    leaves = [t.detach().clone().requires_grad_(True) if t is not None else None for t in (x, offset, weight, bias, mask)]
    x, offset, weight, bias, mask = leaves
    out = fn(x, offset, weight, bias, mask=mask, **kwargs)
    grad_out = torch.randn(out.shape, generator=_gen(seed), dtype=torch.float64)
    grad_out = grad_out.to(grad_dtype or out.dtype).to(out.dtype)
    present = [t for t in leaves if t is not None]
    grads = torch.autograd.grad(out, present, grad_out)
    return out.detach(), grads


@pytest.mark.skipif(torchvision is None, reason="needs torchvision")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("with_mask", [False, True])
@pytest.mark.parametrize("config", range(len(CONFIGS)))
def test_equals_torchvision(config, with_mask, dtype):
    x, offset, weight, bias, mask, kwargs = _inputs(CONFIGS[config], config, dtype, with_mask=with_mask)
    out, grads = _value_and_grads(deform_conv2d, x, offset, weight, bias, mask, kwargs)
    ref, ref_grads = _value_and_grads(torchvision.ops.deform_conv2d, x, offset, weight, bias, mask, kwargs)
    assert out.dtype == dtype and out.shape == ref.shape
    torch.testing.assert_close(out, ref, **TOL[dtype])
    assert len(grads) == (5 if with_mask else 4)
    for name, got, expected in zip(["input", "offset", "weight", "bias", "mask"], grads, ref_grads):
        torch.testing.assert_close(got, expected, **TOL[dtype], msg=lambda m: f"grad {name}: {m}")


@pytest.mark.parametrize("with_mask", [False, True])
@pytest.mark.parametrize("config", range(len(CONFIGS)))
def test_equals_plain_pytorch_reference(config, with_mask):
    x, offset, weight, bias, mask, kwargs = _inputs(CONFIGS[config], 10 + config, with_mask=with_mask)
    out, grads = _value_and_grads(deform_conv2d, x, offset, weight, bias, mask, kwargs)
    ref, ref_grads = _value_and_grads(deform_conv2d_reference, x, offset, weight, bias, mask, kwargs)
    torch.testing.assert_close(out, ref, atol=1e-9, rtol=1e-9)
    for got, expected in zip(grads, ref_grads):
        torch.testing.assert_close(got, expected, atol=1e-9, rtol=1e-9)


@pytest.mark.parametrize("config", range(len(CONFIGS)))
def test_zero_offsets_equal_conv2d(config):
    x, offset, weight, bias, _, kwargs = _inputs(CONFIGS[config], 20 + config)
    groups = x.shape[1] // weight.shape[1]
    expected = F.conv2d(x, weight, bias, groups=groups, **kwargs)
    zero = torch.zeros_like(offset)
    torch.testing.assert_close(deform_conv2d(x, zero, weight, bias, **kwargs), expected)
    ones = torch.ones(offset.shape[0], offset.shape[1] // 2, *offset.shape[2:], dtype=x.dtype)
    torch.testing.assert_close(deform_conv2d(x, zero, weight, bias, mask=ones, **kwargs), expected)


def test_integer_offsets_shift_the_image():
    """An offset of exactly (+1, -2) everywhere is a conv2d of the image shifted by that much."""
    x, offset, weight, bias, _, kwargs = _inputs(CONFIGS[0], 30)
    offset = torch.zeros_like(offset)
    offset[:, 0::2] = 1.0
    offset[:, 1::2] = -2.0
    h, w = x.shape[2:]
    big = F.pad(x, (3, 3, 3, 3))  # original pixel (y, x) at (y + 3, x + 3)
    # The padded map's pixel (Y, X) is the original's (Y - 1, X - 1); it samples (Y, X - 3).
    shifted = big[:, :, 3 : 3 + h + 2, 0 : w + 2]
    expected = F.conv2d(shifted, weight, bias)
    torch.testing.assert_close(deform_conv2d(x, offset, weight, bias, **kwargs), expected)


@pytest.mark.parametrize("with_mask,with_bias", [(False, False), (True, True), (True, False)])
@pytest.mark.parametrize("config", [1, 2])
def test_gradcheck(config, with_mask, with_bias):
    cin, cout, kernel, groups, og, stride, padding, dilation, _ = CONFIGS[config]
    small = (cin, cout, kernel, groups, og, stride, padding, dilation, (5, 6))
    x, offset, weight, bias, mask, kwargs = _inputs(small, 40 + config, batch=2, with_mask=with_mask, offset_scale=1.3)
    bias = bias if with_bias else None
    leaves = [t.requires_grad_(True) for t in (x, offset, weight, bias, mask) if t is not None]

    def fn(*args):
        it = iter(args)
        a, o, w = next(it), next(it), next(it)
        b = next(it) if with_bias else None
        m = next(it) if with_mask else None
        return deform_conv2d(a, o, w, b, mask=m, **kwargs)

    assert torch.autograd.gradcheck(fn, leaves, eps=1e-6, atol=1e-5, nondet_tol=0.0)


# --- the offset gradient where the sampling point sits on an integer: the border --------------------
def integer_offsets(config, seed, dtype=torch.float64, batch=2):
    """_inputs with offsets in {-2, ..., 2}: every tap samples an integer point, many of them
    exactly at -1 or at H / W (with padding even a zero offset does: a fresh offset conv) and some
    beyond, where the blend has a kink. A grad_out for <out, grad_out>."""
    x, offset, weight, bias, mask, kwargs = _inputs(config, seed, dtype)
    offset = torch.randint(-2, 3, offset.shape, generator=_gen(seed + 1)).to(dtype)
    out_shape = (x.shape[0], weight.shape[0], *offset.shape[2:])
    grad_out = torch.randn(out_shape, generator=_gen(seed + 2), dtype=torch.float64).to(dtype)
    return x, offset, weight, bias, mask, kwargs, grad_out


def one_sided_offset_derivatives(x, offset, weight, mask, kwargs, grad_out, step):
    """d <out, grad_out> / d offset as a one-sided difference quotient of the plain-PyTorch
    reference (grid_sample), in float64: offset channel c moved by `step` at every position at
    once (a position's output depends on its own offsets only). The blend is linear in y (or x)
    on each cell [k, k + 1), so from an integer point a step of +0.5 gives the right derivative
    exactly (to rounding) and -0.5 the left one."""
    x, offset, weight, grad_out = (t.double() for t in (x, offset, weight, grad_out))
    mask = None if mask is None else mask.double()

    def total(o):
        return (deform_conv2d_reference(x, o, weight, mask=mask, **kwargs) * grad_out).sum(1)

    base = total(offset)
    out = torch.empty_like(offset)
    for c in range(offset.shape[1]):
        moved = offset.clone()
        moved[:, c] += step
        out[:, c] = (total(moved) - base) / step
    return out


def sample_points(offset, kernel, kwargs):
    """The sampling points (y, x) of every tap: [N, offset_groups * kh * kw, out_h, out_w] each."""
    (kh, kw), stride, padding, dilation = kernel, kwargs["stride"], kwargs["padding"], kwargs["dilation"]
    ho, wo = offset.shape[2:]
    ty = (torch.arange(kh) * dilation[0]).repeat_interleave(kw)  # per tap, row-major
    tx = (torch.arange(kw) * dilation[1]).repeat(kh)
    by = torch.arange(ho) * stride[0] - padding[0]
    bx = torch.arange(wo) * stride[1] - padding[1]
    og = offset.shape[1] // (2 * kh * kw)
    base_y = (ty[:, None, None] + by[None, :, None]).repeat(og, 1, 1).to(offset.dtype)
    base_x = (tx[:, None, None] + bx[None, None, :]).repeat(og, 1, 1).to(offset.dtype)
    return offset[:, 0::2] + base_y, offset[:, 1::2] + base_x


def _offset_grad(fn, x, offset, weight, bias, mask, kwargs, grad_out):
    offset = offset.detach().clone().requires_grad_(True)
    out = fn(x, offset, weight, bias, mask=mask, **kwargs)
    (grad,) = torch.autograd.grad(out, offset, grad_out)
    return grad


@pytest.mark.parametrize("with_mask", [False, True])
@pytest.mark.parametrize("config", [0, 1, 3])
def test_offset_gradient_at_integer_points_is_the_right_derivative(config, with_mask):
    """At an integer point the gradient is the right derivative (the cell [floor, floor + 1)),
    at the border as inside: at -1 the slope towards the map, at H (or W) and below -1 zero. The
    left derivative differs at the -1 taps (it is 0 there: a test that could not tell the two
    conventions apart would be no test)."""
    x, offset, weight, bias, mask, kwargs, grad_out = integer_offsets(CONFIGS[config], 60 + config)
    mask = mask if with_mask else None
    got = _offset_grad(deform_conv2d, x, offset, weight, bias, mask, kwargs, grad_out)
    right = one_sided_offset_derivatives(x, offset, weight, mask, kwargs, grad_out, 0.5)
    left = one_sided_offset_derivatives(x, offset, weight, mask, kwargs, grad_out, -0.5)
    torch.testing.assert_close(got, right, atol=1e-9, rtol=1e-9)
    y, xs = sample_points(offset, weight.shape[2:], kwargs)
    # At y = -1 with x on a column of the map, the right derivative is that column's pixel
    # (weighted), the left one 0.
    at_minus_one = (y == -1) & (xs >= 0) & (xs <= x.shape[3] - 1)
    grad_y, left_y = got[:, 0::2], left[:, 0::2]
    assert int(at_minus_one.sum()) >= 5
    assert bool((grad_y[at_minus_one] != 0).all()) and float(left_y[at_minus_one].abs().max()) < 1e-9


@pytest.mark.skipif(torchvision is None, reason="needs torchvision")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("config", [0, 1, 3])
def test_gradients_at_integer_points_equal_torchvision(config, dtype):
    """Every gradient at integer sampling points (taps exactly at -1 and at H / W among them),
    with and without a mask, equals torchvision's: the border convention is torchvision's."""
    x, offset, weight, bias, mask, kwargs, _ = integer_offsets(CONFIGS[config], 70 + config, dtype)
    for m in (None, mask):
        out, grads = _value_and_grads(deform_conv2d, x, offset, weight, bias, m, kwargs)
        ref, ref_grads = _value_and_grads(torchvision.ops.deform_conv2d, x, offset, weight, bias, m, kwargs)
        torch.testing.assert_close(out, ref, **TOL[dtype])
        for name, a, b in zip(["input", "offset", "weight", "bias", "mask"], grads, ref_grads):
            torch.testing.assert_close(a, b, **TOL[dtype], msg=lambda msg: f"grad {name}: {msg}")


@pytest.mark.skipif(torchvision is None, reason="needs torchvision")
def test_fresh_offset_conv_gets_a_gradient_at_the_border():
    """Zero offsets with padding 1, as a freshly initialised offset conv gives: the top row's
    upper taps sample y = -1, and their y offsets get the gradient that lets them move onto the
    map, equal to torchvision's; the bottom row's lower taps sample y = H and get none."""
    x = torch.randn(1, 2, 5, 6, generator=_gen(75), dtype=torch.float64)
    weight = torch.randn(3, 2, 3, 3, generator=_gen(76), dtype=torch.float64)
    offset = torch.zeros(1, 18, 5, 6, dtype=torch.float64)
    grad_out = torch.ones(1, 3, 5, 6, dtype=torch.float64)
    kwargs = dict(padding=(1, 1))
    got = _offset_grad(deform_conv2d, x, offset, weight, None, None, kwargs, grad_out)
    expected = _offset_grad(torchvision.ops.deform_conv2d, x, offset, weight, None, None, kwargs, grad_out)
    torch.testing.assert_close(got, expected, atol=1e-12, rtol=1e-12)
    # Tap (0, 1) (channel 2: its y offset) of output row 0 samples y = -1, x = ox: by hand, the
    # slope towards row 0 is sum_o sum_c weight[o, c, 0, 1] * x[c, 0, ox].
    by_hand = torch.einsum("oc,cx->x", weight[:, :, 0, 1], x[0, :, 0])
    torch.testing.assert_close(got[0, 2, 0], by_hand, atol=1e-12, rtol=1e-12)
    assert bool((got[0, 14, -1] == 0).all())  # tap (2, 1) of the last row: y = H, nothing beyond


def test_double_backward_raises():
    x, offset, weight, bias, mask, kwargs = _inputs(CONFIGS[0], 50)
    x.requires_grad_(True)
    out = deform_conv2d(x, offset, weight, bias, mask=mask, **kwargs)
    (g,) = torch.autograd.grad(out.sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="double backward"):
        g.sum().backward()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_types_on_cpu_compute_in_float32(dtype):
    x, offset, weight, bias, mask, kwargs = _inputs(CONFIGS[1], 60, dtype)
    out, grads = _value_and_grads(deform_conv2d, x, offset, weight, bias, mask, kwargs)
    up = [t.float() for t in (x, offset, weight, bias, mask)]
    ref, ref_grads = _value_and_grads(deform_conv2d, *up, kwargs, grad_dtype=dtype)
    assert out.dtype == dtype and all(g.dtype == dtype for g in grads)
    # Exactly the float32 result of the same (upcast) values, rounded once to the dtype.
    assert torch.equal(out, ref.to(dtype))
    for got, expected in zip(grads, ref_grads):
        assert torch.equal(got, expected.to(dtype))


def test_autocast_cpu_runs_in_float32_and_returns_input_dtype():
    x, offset, weight, bias, mask, kwargs = _inputs(CONFIGS[0], 70, torch.float32)
    expected = deform_conv2d(x, offset, weight, bias, mask=mask, **kwargs)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = deform_conv2d(x, offset, weight, bias, mask=mask, **kwargs)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, expected)  # no bfloat16 rounding inside

    xb = x.to(torch.bfloat16).requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = deform_conv2d(xb, offset, weight, bias, mask=mask, **kwargs)
    assert out.dtype == torch.bfloat16
    ref = deform_conv2d(xb.detach().float(), offset, weight, bias, mask=mask, **kwargs)
    torch.testing.assert_close(out.float(), ref, atol=5e-2, rtol=2e-2)
    out.float().sum().backward()
    assert xb.grad is not None and xb.grad.dtype == torch.bfloat16


def test_empty_batch():
    x, offset, weight, bias, mask, kwargs = _inputs(CONFIGS[1], 80, batch=0)
    x.requires_grad_(True)
    weight.requires_grad_(True)
    out = deform_conv2d(x, offset, weight, bias, mask=mask, **kwargs)
    assert out.shape == (0, 4, 5, 7)
    out.sum().backward()
    assert x.grad.shape == x.shape and torch.count_nonzero(weight.grad) == 0


def test_samples_all_off_the_map_give_the_bias():
    x, offset, weight, bias, mask, kwargs = _inputs(CONFIGS[0], 81)
    far = torch.full_like(offset, 1e4)
    out = deform_conv2d(x, far, weight, bias, mask=mask, **kwargs)
    torch.testing.assert_close(out, bias[None, :, None, None].expand_as(out))
    nan = torch.full_like(offset, float("nan"))  # NaN offsets sample nothing, never read memory
    torch.testing.assert_close(deform_conv2d(x, nan, weight, None, **kwargs), torch.zeros_like(out))


def test_non_contiguous_inputs():
    x, offset, weight, bias, mask, kwargs = _inputs(CONFIGS[0], 82)
    expected = deform_conv2d(x, offset, weight, bias, mask=mask, **kwargs)
    xt = x.transpose(2, 3).contiguous().transpose(2, 3)
    ot = offset.contiguous(memory_format=torch.channels_last)
    mt = mask.transpose(0, 1).contiguous().transpose(0, 1)
    wt = weight.contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(deform_conv2d(xt, ot, wt, bias, mask=mt, **kwargs), expected, atol=1e-12, rtol=1e-12)


def _errors():
    x, offset, weight, bias, mask, kw = _inputs(CONFIGS[0], 90)
    bad = [
        (dict(input=x[0]), "input must have shape"),
        (dict(weight=weight[:, :3]), r"weight.shape\[1\]"),
        (dict(offset=offset[:, :, :-1]), "offset must have shape"),
        (dict(offset=offset[:, :17]), "offset"),
        (dict(offset=offset[:, :5]), "offset.shape"),
        (dict(mask=mask[:, :4]), "mask must have shape"),
        (dict(bias=bias[:3]), "bias must have shape"),
        (dict(offset=offset.float()), "offset must have the dtype of input"),
        (dict(mask=mask.float()), "mask must have the dtype of input"),
        (dict(input=x.int(), weight=weight.int(), offset=offset.int()), "input must be float32"),
        (dict(stride=(0, 1)), "stride must be positive"),
        (dict(padding=(-1, 0)), "padding must be non-negative"),
        (dict(dilation=(1, 0)), "dilation must be positive"),
        (dict(padding=(0, 0), dilation=(5, 5)), "output would be empty"),
        (dict(mask=mask[:1]), "mask must have shape"),
    ]
    args = dict(input=x, offset=offset, weight=weight, bias=bias, mask=mask, **kw)
    return [({**args, **change}, match) for change, match in bad]


@pytest.mark.parametrize("case", range(15))
def test_bad_input_raises_value_error_naming_the_argument(case):
    args, match = _errors()[case]
    with pytest.raises(ValueError, match=match):
        deform_conv2d(**args)


def test_wrong_shapes_say_torchvisions_words():
    """torchvision's test_wrong_sizes matches "the shape of the offset" (an offset of 2 channels
    for a 3x2 kernel) and "mask.shape[1] is not valid"; detcore's messages hold those words and
    still name the expected shape. Each is a RuntimeError, as torchvision's."""
    x, offset, _, _, mask, kw = _inputs(CONFIGS[1], 92)  # 6 -> 4 channels, 3x2, groups 2, og 3
    layer = DeformConv2d(6, 4, (3, 2), groups=2, **kw).double()
    cases = [
        (offset[:, :2], None, r"the shape of the offset is not valid: offset.shape\[1\] must be a positive multiple of 2 \* kh \* kw = 12, got 2"),
        (offset[:, :17], None, r"the shape of the offset is not valid: offset must have shape \[2, 12, 5, 7\]"),
        (offset[:, :, :-1], None, r"the shape of the offset is not valid: offset must have shape \[2, 36, 5, 7\]"),
        (offset, mask[:, :2], r"the shape of the mask is not valid \(mask.shape\[1\] is not valid\): mask must have shape \[2, 18, 5, 7\]"),
        (offset, mask[:1], r"the shape of the mask is not valid: mask must have shape \[2, 18, 5, 7\]"),
    ]
    for off, m, match in cases:
        with pytest.raises(RuntimeError, match=match):
            layer(x, off, m)
    with pytest.raises(RuntimeError, match="the shape of the offset"):
        torch.ops.detcore.deform_conv2d(x, layer.weight, offset[0], None, None, 2, 1, 1, 0, 1, 2, 2, 3)


def test_groups_must_divide_output_channels():
    x, offset, _, _, _, kw = _inputs(CONFIGS[1], 91)  # 6 input channels
    with pytest.raises(ValueError, match="divisible by groups"):
        deform_conv2d(x, offset, torch.randn(5, 3, 3, 2, dtype=x.dtype), **kw)
    with pytest.raises(ValueError, match="offset_groups"):
        torch.ops.detcore.deform_conv2d(
            x, torch.randn(4, 3, 3, 2, dtype=x.dtype), offset[:, :48], None, None, 2, 1, 1, 0, 1, 2, 2, 4
        )


@pytest.mark.skipif(torchvision is None, reason="needs torchvision")
@pytest.mark.parametrize(
    "args,kwargs",
    [((4, 6, 3), {}), ((4, 6, (3, 2)), dict(stride=2, padding=1, dilation=2, groups=2, bias=False))],
)
def test_module_matches_torchvision(args, kwargs):
    torch.manual_seed(0)
    ours = DeformConv2d(*args, **kwargs)
    torch.manual_seed(0)
    theirs = torchvision.ops.DeformConv2d(*args, **kwargs)
    assert repr(ours) == repr(theirs)
    assert torch.equal(ours.weight, theirs.weight)
    assert (ours.bias is None) == (theirs.bias is None)
    if ours.bias is not None:
        assert torch.equal(ours.bias, theirs.bias)
    x = torch.randn(2, 4, 9, 10)
    kh, kw = ours.kernel_size
    ho, wo = _out_size((9, 10), ours.kernel_size, ours.stride, ours.padding, ours.dilation)
    offset = torch.randn(2, 2 * kh * kw, ho, wo)
    mask = torch.rand(2, kh * kw, ho, wo)
    torch.testing.assert_close(ours(x, offset, mask), theirs(x, offset, mask), **TOL[torch.float32])
    with pytest.raises(ValueError, match="divisible by groups"):
        DeformConv2d(5, 6, 3, groups=2)


class _DeformBlock(torch.nn.Module):
    """A DCN v2 block as a model uses it: an offset/mask conv feeding a deformable conv."""

    def __init__(self, channels=4):
        super().__init__()
        self.offset = torch.nn.Conv2d(channels, 27, 3, padding=1)
        self.conv = DeformConv2d(channels, channels, 3, padding=1)

    def forward(self, x):
        o1, o2, m = torch.chunk(self.offset(x), 3, dim=1)
        return self.conv(x, torch.cat([o1, o2], dim=1), m.sigmoid())


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:FutureWarning")
def test_torchscript_module_and_function():
    torch.manual_seed(1)
    block = _DeformBlock()
    x = torch.randn(2, 4, 8, 9)
    scripted = torch.jit.script(block)
    torch.testing.assert_close(scripted(x), block(x))
    x64, offset, weight, bias, mask, kw = _inputs(CONFIGS[1], 92)
    fn = torch.jit.script(deform_conv2d)
    torch.testing.assert_close(
        fn(x64, offset, weight, bias, kw["stride"], kw["padding"], kw["dilation"], mask),
        deform_conv2d(x64, offset, weight, bias, mask=mask, **kw),
    )


def test_fake_tensor_and_meta_shapes():
    x, offset, weight, bias, mask, _ = _inputs(CONFIGS[1], 93)
    args = (2, 1, 1, 0, 1, 2, 2, 3)
    with FakeTensorMode() as mode:
        f = [mode.from_tensor(t) for t in (x, weight, offset, mask, bias)]
        out = torch.ops.detcore.deform_conv2d(*f, *args)
        assert out.shape == (2, 4, 5, 7)
        grads = torch.ops.detcore._deform_conv2d_backward(out, *f, *args)
        assert [g.shape for g in grads] == [x.shape, weight.shape, offset.shape, mask.shape, bias.shape]
    meta = [t.to("meta") for t in (x, weight, offset)]
    assert torch.ops.detcore.deform_conv2d(*meta, None, None, *args).shape == (2, 4, 5, 7)


def test_opcheck():
    x, offset, weight, bias, mask, _ = _inputs(CONFIGS[1], 94, batch=1)
    args = (2, 1, 1, 0, 1, 2, 2, 3)
    for m, b in ((mask, bias), (None, None)):
        tensors = [t.clone().requires_grad_(True) if t is not None else None for t in (x, weight, offset, m, b)]
        torch.library.opcheck(torch.ops.detcore.deform_conv2d.default, (*tensors, *args))


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_torch_compile_forward_backward(backend):
    torch.manual_seed(2)
    block = _DeformBlock()
    x = torch.randn(2, 4, 8, 9)
    compiled = torch.compile(block, fullgraph=True, backend=backend)
    expected = block(x)
    got = compiled(x)
    torch.testing.assert_close(got, expected)
    got.square().sum().backward()
    compiled_grads = [p.grad.clone() for p in block.parameters()]
    block.zero_grad()
    expected.square().sum().backward()
    for a, b in zip(compiled_grads, [p.grad for p in block.parameters()]):
        torch.testing.assert_close(a, b)


def test_backward_op_equals_autograd():
    x, offset, weight, bias, mask, kwargs = _inputs(CONFIGS[2], 95)
    out, grads = _value_and_grads(deform_conv2d, x, offset, weight, bias, mask, kwargs, seed=3)
    grad_out = torch.randn(out.shape, generator=_gen(3), dtype=torch.float64)
    gi, gw, go, gm, gb = torch.ops.detcore._deform_conv2d_backward(
        grad_out, x, weight, offset, mask, bias, 1, 2, 0, 2, 2, 1, 2, 4
    )
    for got, expected in zip([gi, go, gw, gb, gm], grads):
        torch.testing.assert_close(got, expected)
    *_, gm_none, gb_none = torch.ops.detcore._deform_conv2d_backward(
        grad_out, x, weight, offset, None, None, 1, 2, 0, 2, 2, 1, 2, 4
    )
    assert gm_none.shape == (0,) and torch.allclose(gb_none, grad_out.sum((0, 2, 3)))


def test_many_threads_agree_with_one():
    """The multi-threaded kernels (col2im by channel blocks) give one thread's result."""
    config = (32, 8, (3, 3), 2, 2, (1, 1), (1, 1), (1, 1), (24, 30))
    x, offset, weight, bias, mask, kwargs = _inputs(config, 96, torch.float64)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = _value_and_grads(deform_conv2d, x, offset, weight, bias, mask, kwargs)
        torch.set_num_threads(max(threads, 4))
        many = _value_and_grads(deform_conv2d, x, offset, weight, bias, mask, kwargs)
    finally:
        torch.set_num_threads(threads)
    torch.testing.assert_close(one[0], many[0], atol=1e-12, rtol=1e-12)
    for a, b in zip(one[1], many[1]):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12)


def test_images_in_several_chunks_equal_one_at_a_time():
    """512 channels x 9 taps x 64 x 64 positions is over the CPU kernel's column budget (2**25
    values) for 2 images: they run as 2 chunks, the weight gradient summed over both."""
    g = _gen(97)
    x = torch.randn(2, 512, 64, 64, generator=g)
    weight = torch.randn(4, 512, 3, 3, generator=g) / 50
    offset = torch.randn(2, 18, 64, 64, generator=g) * 2
    mask = torch.rand(2, 9, 64, 64, generator=g)
    kwargs = dict(padding=(1, 1))
    out, grads = _value_and_grads(deform_conv2d, x, offset, weight, None, mask, kwargs)
    grad_out = torch.randn(out.shape, generator=_gen(5), dtype=torch.float64).float()
    per_image = []
    for b in range(2):
        leaves = [t[b : b + 1].clone().requires_grad_(True) for t in (x, offset, mask)] + [weight.clone().requires_grad_(True)]
        o = deform_conv2d(leaves[0], leaves[1], leaves[3], mask=leaves[2], **kwargs)
        per_image.append((o.detach(), torch.autograd.grad(o, leaves, grad_out[b : b + 1])))
    torch.testing.assert_close(out, torch.cat([o for o, _ in per_image]))
    gx, goff, gw, gm = grads
    torch.testing.assert_close(gx, torch.cat([gr[0] for _, gr in per_image]))
    torch.testing.assert_close(goff, torch.cat([gr[1] for _, gr in per_image]))
    torch.testing.assert_close(gm, torch.cat([gr[2] for _, gr in per_image]))
    torch.testing.assert_close(gw, per_image[0][1][3] + per_image[1][1][3], atol=1e-4, rtol=1e-4)
