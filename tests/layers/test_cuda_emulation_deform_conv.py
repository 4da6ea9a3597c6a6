"""detcore's CUDA deform_conv2d kernels, run on the CPU by the CUDA emulation, equal the CPU op.

Each kernel of detcore/csrc/cuda/deform_conv2d_kernels.cuh (im2col, col2im with atomics, the
offset/mask gradients) runs under tests/layers/cuda_emulation/ through the launcher's own host
sequence (deform_conv2d_launch.h) and is compared with the CPU kernel's corresponding result:
the columns (the CPU op with an identity weight returns them), the output, the input gradient,
the offset and mask gradients, and the weight / bias gradients of the GEMMs around them. Half
and bfloat16 are compared with the CPU float32 kernel on the same (exactly upcast) values. A
grid of 1 or 2 blocks makes small inputs take the grid-stride loops.
"""
import pytest
import torch

import detcore.layers  # noqa: F401  (loads torch.ops.detcore)

try:
    from .reference_ops import CUDA_VS_CPU_TOLERANCE, EMULATED_DTYPES, in_cpu_dtype, seeded
    from .test_deform_conv import one_sided_offset_derivatives, sample_points
except ImportError:  # tests/ run as rootdir-relative modules, without packages
    from reference_ops import CUDA_VS_CPU_TOLERANCE, EMULATED_DTYPES, in_cpu_dtype, seeded
    from test_deform_conv import one_sided_offset_derivatives, sample_points

DTYPES = EMULATED_DTYPES
TOL = CUDA_VS_CPU_TOLERANCE

# (in_channels, out_channels, kernel, groups, offset_groups, stride, padding, dilation, size)
CONFIGS = [
    (3, 4, (3, 3), 1, 1, (1, 1), (1, 1), (1, 1), (6, 7)),
    (4, 2, (2, 3), 2, 2, (2, 1), (1, 0), (1, 2), (7, 8)),
]





def _inputs(config, seed, dtype, with_mask=True, batch=2):
    cin, cout, kernel, groups, og, stride, padding, dilation, size = config
    g = seeded(seed)
    ho = (size[0] + 2 * padding[0] - dilation[0] * (kernel[0] - 1) - 1) // stride[0] + 1
    wo = (size[1] + 2 * padding[1] - dilation[1] * (kernel[1] - 1) - 1) // stride[1] + 1
    taps = kernel[0] * kernel[1]
    x = torch.randn(batch, cin, *size, generator=g)
    weight = torch.randn(cout, cin // groups, *kernel, generator=g)
    bias = torch.randn(cout, generator=g)
    offset = torch.randn(batch, 2 * og * taps, ho, wo, generator=g) * 2.5  # many off the map
    mask = torch.rand(batch, og * taps, ho, wo, generator=g) if with_mask else None
    args = (*stride, *padding, *dilation, groups, og)
    cast = lambda t: None if t is None else t.to(dtype)  # noqa: E731
    return cast(x), cast(weight), cast(offset), cast(mask), cast(bias), args


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("config", range(len(CONFIGS)))
@pytest.mark.parametrize("with_mask", [False, True])
@pytest.mark.parametrize("max_blocks", [65535, 1])
def test_im2col_columns_equal_cpu(emu, dtype, config, with_mask, max_blocks):
    """The columns are the CPU op's output for an identity weight (groups 1), bit for bit."""
    x, _, offset, mask, _, args = _inputs(CONFIGS[config], config, dtype, with_mask)
    cin, kh, kw = x.shape[1], *CONFIGS[config][2]
    eye = torch.eye(cin * kh * kw).reshape(cin * kh * kw, cin, kh, kw)
    args = (*args[:6], 1, args[7])
    columns = emu.deform_conv2d_columns(x, eye.to(dtype), offset, mask, *args, max_blocks)
    expected = torch.ops.detcore.deform_conv2d(
        in_cpu_dtype(x), eye.to(in_cpu_dtype(x).dtype), in_cpu_dtype(offset), in_cpu_dtype(mask), None, *args
    )
    assert columns.dtype == in_cpu_dtype(x).dtype  # accumulation type
    assert torch.equal(columns, expected.flatten(2))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("config", range(len(CONFIGS)))
@pytest.mark.parametrize("with_mask", [False, True])
def test_forward_equals_cpu(emu, dtype, config, with_mask):
    x, weight, offset, mask, bias, args = _inputs(CONFIGS[config], 10 + config, dtype, with_mask)
    out = emu.deform_conv2d(x, weight, offset, mask, bias, *args)
    expected = torch.ops.detcore.deform_conv2d(*map(in_cpu_dtype, (x, weight, offset, mask, bias)), *args)
    assert out.dtype == dtype
    torch.testing.assert_close(in_cpu_dtype(out), expected, **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("config", range(len(CONFIGS)))
@pytest.mark.parametrize("with_mask", [False, True])
def test_backward_equals_cpu(emu, dtype, config, with_mask):
    """col2im (input gradient), the coordinate kernel (offset, mask) and the weight/bias GEMMs."""
    x, weight, offset, mask, bias, args = _inputs(CONFIGS[config], 20 + config, dtype, with_mask)
    out = torch.ops.detcore.deform_conv2d(*map(in_cpu_dtype, (x, weight, offset, mask, bias)), *args)
    grad = torch.randn(out.shape, generator=seeded(config)).to(dtype)
    got = emu.deform_conv2d_backward(grad, x, weight, offset, mask, *args)
    expected = torch.ops.detcore._deform_conv2d_backward(
        in_cpu_dtype(grad), *map(in_cpu_dtype, (x, weight, offset, mask, bias)), *args
    )
    names = ["input", "weight", "offset", "mask", "bias"]
    for name, a, b in zip(names, got, expected):
        assert a.dtype == dtype and a.shape == b.shape, name
        torch.testing.assert_close(in_cpu_dtype(a), b, **TOL[dtype], msg=lambda m: f"grad {name}: {m}")
    if not with_mask:
        assert got[3].shape == (0,)


@pytest.mark.parametrize("config", range(len(CONFIGS)))
@pytest.mark.parametrize("with_mask", [False, True])
def test_offset_gradient_at_integer_points_is_the_right_derivative(emu, config, with_mask):
    """Offsets in {-2, ..., 2}: every tap samples an integer point, many exactly at -1 or at
    H / W. The coordinate kernel's offset gradient is the right derivative there (a one-sided
    difference of test_deform_conv's plain-PyTorch reference), nonzero at the -1 taps over the
    map, and every gradient equals the CPU's."""
    x, weight, offset, mask, bias, args = _inputs(CONFIGS[config], 50 + config, torch.float64, with_mask)
    offset = torch.randint(-2, 3, offset.shape, generator=seeded(51 + config)).double()
    kwargs = dict(stride=args[0:2], padding=args[2:4], dilation=args[4:6])
    out = torch.ops.detcore.deform_conv2d(x, weight, offset, mask, bias, *args)
    grad = torch.randn(out.shape, generator=seeded(52 + config), dtype=torch.float64)
    got = emu.deform_conv2d_backward(grad, x, weight, offset, mask, *args)
    right = one_sided_offset_derivatives(x, offset, weight, mask, kwargs, grad, 0.5)
    torch.testing.assert_close(got[2], right, atol=1e-9, rtol=1e-9)
    y, xs = sample_points(offset, weight.shape[2:], kwargs)
    at_minus_one = (y == -1) & (xs >= 0) & (xs <= x.shape[3] - 1)
    assert int(at_minus_one.sum()) > 5 and bool((got[2][:, 0::2][at_minus_one] != 0).all())
    expected = torch.ops.detcore._deform_conv2d_backward(grad, x, weight, offset, mask, bias, *args)
    for name, a, b in zip(["input", "weight", "offset", "mask", "bias"], got, expected):
        torch.testing.assert_close(a, b, **TOL[torch.float64], msg=lambda m: f"grad {name}: {m}")


@pytest.mark.parametrize("max_blocks", [1, 2])
def test_more_work_than_blocks(emu, max_blocks):
    """A grid of 1 or 2 blocks for up to 8 blocks' work: the kernels' grid-stride loops."""
    x, weight, offset, mask, bias, args = _inputs(CONFIGS[0], 30, torch.float64)
    out = emu.deform_conv2d(x, weight, offset, mask, bias, *args, max_blocks)
    assert torch.equal(out, emu.deform_conv2d(x, weight, offset, mask, bias, *args))
    grad = torch.randn(out.shape, generator=seeded(31), dtype=torch.float64)
    got = emu.deform_conv2d_backward(grad, x, weight, offset, mask, *args, max_blocks)
    expected = torch.ops.detcore._deform_conv2d_backward(grad, x, weight, offset, mask, bias, *args)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, **TOL[torch.float64])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_col2im_atomics_into_one_pixel_block(emu, dtype):
    """Every tap of every position samples (1.5, 1.5): 4 pixels take 0.25 of each grad column
    entry, all added with atomics into the same 4 values of each channel. One block of 256
    threads, each looping over ~8000 entries (so the threads run at once), for 8 x 9 x 160 x 178
    entries: exact sums
    (multiples of 0.25 below 2**22), so the order does not matter; a plain += loses updates."""
    h, w = 160, 178
    x = torch.randn(1, 8, h, w, dtype=dtype)
    weight = torch.ones(1, 8, 3, 3, dtype=dtype)
    tap_y = torch.arange(3, dtype=dtype).repeat_interleave(3)[:, None, None]
    tap_x = torch.arange(3, dtype=dtype).repeat(3)[:, None, None]
    ys = (torch.arange(h, dtype=dtype)[:, None] - 1 + tap_y).expand(9, h, w)
    xs = (torch.arange(w, dtype=dtype)[None, :] - 1 + tap_x).expand(9, h, w)
    offset = torch.stack([1.5 - ys, 1.5 - xs], dim=1).reshape(1, 18, h, w)
    grad = torch.ones(1, 1, h, w, dtype=dtype)
    args = (1, 1, 1, 1, 1, 1, 1, 1)
    got = emu.deform_conv2d_backward(grad, x, weight, offset, None, *args, 1)[0]
    expected = torch.ops.detcore._deform_conv2d_backward(grad, x, weight, offset, None, None, *args)[0]
    assert got[0, :, 1:3, 1:3].eq(h * w * 9 * 0.25).all() and got.sum() == 8 * h * w * 9
    assert torch.equal(got, expected)


def test_empty_batch(emu):
    x, weight, offset, mask, bias, args = _inputs(CONFIGS[1], 40, torch.float32, batch=0)
    out = emu.deform_conv2d(x, weight, offset, mask, bias, *args)
    assert out.shape == (0, 2, 4, 4)
    grads = emu.deform_conv2d_backward(out, x, weight, offset, mask, *args)
    assert [g.shape for g in grads] == [x.shape, weight.shape, offset.shape, mask.shape, bias.shape]


def test_one_channel_one_position(emu):
    """Launches of a single thread's work (1 channel, 1 x 1 output, 1 x 1 kernel), and one of no
    work at all (no channels): the smallest and the empty grids."""
    g = seeded(41)
    x, weight = torch.randn(2, 1, 1, 1, generator=g), torch.randn(2, 1, 1, 1, generator=g)
    offset, mask = torch.rand(2, 2, 1, 1, generator=g) - 0.5, torch.rand(2, 1, 1, 1, generator=g)
    bias = torch.randn(2, generator=g)
    args = (1, 1, 0, 0, 1, 1, 1, 1)
    out = emu.deform_conv2d(x, weight, offset, mask, bias, *args)
    torch.testing.assert_close(out, torch.ops.detcore.deform_conv2d(x, weight, offset, mask, bias, *args))
    grad = torch.randn(out.shape, generator=g)
    got = emu.deform_conv2d_backward(grad, x, weight, offset, mask, *args)
    expected = torch.ops.detcore._deform_conv2d_backward(grad, x, weight, offset, mask, bias, *args)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, **TOL[torch.float32])
    out = emu.deform_conv2d(x[:, :0], weight[:, :0], offset, mask, bias, *args)
    assert torch.equal(out, bias[None, :, None, None].expand(2, 2, 1, 1))
