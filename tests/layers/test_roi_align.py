"""detcore.layers.roi_align, forward and backward, against a plain-PyTorch reference."""
import math

import numpy as np
import pytest
import torch

from detcore.layers import OpArgumentError, ROIAlign, roi_align

try:
    from .reference_ops import boxes_to_rois, roi_align_reference
except ImportError:  # tests/ run as rootdir-relative modules, without packages
    from reference_ops import boxes_to_rois, roi_align_reference

try:
    import torchvision
except ImportError:  # detcore works without torchvision; only the comparisons to it skip
    torchvision = None

TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.float64: dict(atol=1e-10, rtol=1e-10)}


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def _features(shape, seed, dtype=torch.float32):
    return torch.randn(shape, generator=_gen(seed), dtype=torch.float64).to(dtype)


def _rois(k, batch, image_hw, seed, dtype=torch.float32, min_size=-2.0):
    """k rois in image coordinates: some partly or wholly outside, a few empty or inverted."""
    g = _gen(seed)
    h, w = image_hw
    x1 = torch.rand(k, generator=g, dtype=torch.float64) * 1.3 * w - 0.2 * w
    y1 = torch.rand(k, generator=g, dtype=torch.float64) * 1.3 * h - 0.2 * h
    bw = min_size + torch.rand(k, generator=g, dtype=torch.float64) * (0.6 * w - min_size)
    bh = min_size + torch.rand(k, generator=g, dtype=torch.float64) * (0.6 * h - min_size)
    index = torch.randint(0, batch, (k,), generator=g).to(torch.float64)
    return torch.stack([index, x1, y1, x1 + bw, y1 + bh], dim=1).to(dtype)


def _forward_backward(fn, x, rois, grad_out, **kwargs):
    x = x.detach().clone().requires_grad_(True)
    out = fn(x, rois, **kwargs)
    out.backward(grad_out)
    return out.detach(), x.grad


def _compare(x, rois, output_size, spatial_scale, sampling_ratio, aligned, seed=0):
    """Forward and input gradient equal the reference's (and torchvision's, where it imports)."""
    kwargs = dict(
        output_size=output_size,
        spatial_scale=spatial_scale,
        sampling_ratio=sampling_ratio,
        aligned=aligned,
    )
    tol = TOL[x.dtype]
    out = roi_align(x, rois, **kwargs)
    ref = roi_align_reference(x, rois, **kwargs)
    assert out.shape == ref.shape and out.dtype == x.dtype
    torch.testing.assert_close(out, ref, **tol)

    grad_out = torch.randn(ref.shape, generator=_gen(seed + 1), dtype=torch.float64).to(x.dtype)
    _, grad = _forward_backward(roi_align, x, rois, grad_out, **kwargs)
    _, ref_grad = _forward_backward(roi_align_reference, x, rois, grad_out, **kwargs)
    torch.testing.assert_close(grad, ref_grad, **tol)
    if torchvision is not None:
        tv_out, tv_grad = _forward_backward(torchvision.ops.roi_align, x, rois, grad_out, **kwargs)
        torch.testing.assert_close(out, tv_out, **tol)
        torch.testing.assert_close(grad, tv_grad, **tol)
    return out


def test_import_paths_are_the_same_objects():
    from detcore.layers.roi_align import ROIAlign as module_cls
    from detcore.layers.roi_align import roi_align as module_fn

    assert module_fn is roi_align and module_cls is ROIAlign


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("spatial_scale", [1.0, 0.5, 0.25])
@pytest.mark.parametrize("sampling_ratio", [-1, 0, 2])
@pytest.mark.parametrize("aligned", [False, True])
def test_matches_reference(aligned, sampling_ratio, spatial_scale, dtype):
    x = _features((2, 3, 11, 14), seed=1, dtype=dtype)
    image_hw = (11 / spatial_scale, 14 / spatial_scale)
    rois = _rois(24, 2, image_hw, seed=2, dtype=dtype)
    _compare(x, rois, (3, 4), spatial_scale, sampling_ratio, aligned)


@pytest.mark.parametrize("output_size", [1, 7, (2, 5), (5, 2)])
def test_output_sizes(output_size):
    x = _features((1, 2, 16, 16), seed=3)
    rois = _rois(10, 1, (16, 16), seed=4)
    out = _compare(x, rois, output_size, 1.0, 2, True)
    h, w = (output_size, output_size) if isinstance(output_size, int) else output_size
    assert out.shape == (10, 2, h, w)


@pytest.mark.parametrize("sampling_ratio", [1, 3, 5])
def test_other_fixed_sampling_ratios(sampling_ratio):
    x = _features((1, 4, 9, 9), seed=5, dtype=torch.float64)
    rois = _rois(12, 1, (9, 9), seed=6, dtype=torch.float64)
    _compare(x, rois, 3, 1.0, sampling_ratio, False)


@pytest.mark.parametrize("aligned", [False, True])
def test_rois_outside_the_image(aligned):
    x = _features((1, 2, 8, 8), seed=7)
    rois = torch.tensor(
        [
            [0, -50.0, -50.0, -20.0, -20.0],  # wholly above-left: nothing sampled
            [0, 30.0, 30.0, 60.0, 60.0],  # wholly below-right
            [0, -3.0, -3.0, 4.0, 4.0],  # straddles the top-left corner
            [0, 5.0, -2.0, 9.5, 8.5],  # straddles the right edge
            [0, -1.0, -1.0, 9.0, 9.0],  # a bit larger than the map
        ]
    )
    out = _compare(x, rois, 2, 1.0, 2, aligned)
    assert bool((out[:2] == 0).all())


@pytest.mark.parametrize("aligned", [False, True])
@pytest.mark.parametrize("sampling_ratio", [0, 2])
def test_zero_and_negative_size_rois(aligned, sampling_ratio):
    x = _features((2, 3, 10, 10), seed=8)
    rois = torch.tensor(
        [
            [0, 3.0, 3.0, 3.0, 3.0],  # a point
            [1, 2.5, 4.0, 2.5, 8.0],  # zero width
            [0, 1.0, 6.0, 9.0, 6.0],  # zero height
            [1, 7.0, 7.0, 2.0, 2.0],  # inverted
            [0, 6.0, 1.0, 4.0, 8.0],  # negative width only
            [1, 4.25, 4.75, 4.5, 5.0],  # tiny but positive
        ]
    )
    _compare(x, rois, (2, 3), 1.0, sampling_ratio, aligned)


def test_rois_on_the_last_batch_index():
    x = _features((4, 2, 9, 12), seed=9)
    rois = _rois(8, 4, (9, 12), seed=10)
    rois[:, 0] = 3
    out = _compare(x, rois, 3, 1.0, 2, True)
    # The last image alone gives the same answer: nothing was read from the others.
    only_last = rois.clone()
    only_last[:, 0] = 0
    torch.testing.assert_close(out, roi_align(x[3:], only_last, 3, 1.0, 2, True), **TOL[x.dtype])


def test_list_of_boxes_equals_tensor_rois():
    x = _features((3, 2, 10, 13), seed=11)
    g = _gen(12)
    boxes = [torch.rand(n, 2, generator=g) * 8 for n in (4, 0, 6)]
    boxes = [torch.cat([b, b + 1 + torch.rand(b.shape, generator=g) * 4], dim=1) for b in boxes]
    rois = boxes_to_rois(boxes)
    assert rois[:, 0].tolist() == [0.0] * 4 + [2.0] * 6
    from_list = roi_align(x, boxes, (2, 2), 0.5, 2, True)
    from_tensor = roi_align(x, rois, (2, 2), 0.5, 2, True)
    assert torch.equal(from_list, from_tensor)
    torch.testing.assert_close(from_list, roi_align_reference(x, rois, (2, 2), 0.5, 2, True))
    if torchvision is not None:
        expected = torchvision.ops.roi_align(x, boxes, (2, 2), 0.5, 2, True)
        torch.testing.assert_close(from_list, expected)


def test_empty_rois_forward_and_backward():
    x = _features((2, 3, 6, 7), seed=13).requires_grad_(True)
    for rois in (torch.zeros(0, 5), [torch.zeros(0, 4), torch.zeros(0, 4)]):
        out = roi_align(x, rois, (4, 5), 1.0, 2, True)
        assert out.shape == (0, 3, 4, 5) and out.dtype == torch.float32
        (grad,) = torch.autograd.grad(out.sum(), x)
        assert grad.shape == x.shape and bool((grad == 0).all())


def test_non_contiguous_input_rois_and_grad():
    x = _features((2, 4, 9, 11), seed=14)
    rois = _rois(10, 2, (18, 22), seed=15)
    kwargs = dict(output_size=(3, 3), spatial_scale=0.5, sampling_ratio=-1, aligned=True)
    channels_last = x.to(memory_format=torch.channels_last)
    transposed = x.transpose(2, 3).contiguous().transpose(2, 3)
    rois_nc = torch.cat([rois, rois], dim=1)[:, :5]
    assert not channels_last.is_contiguous() and not transposed.is_contiguous()
    assert not rois_nc.is_contiguous()
    grad_out = torch.randn(3, 3, 10, 4, generator=_gen(16)).permute(2, 3, 1, 0)
    assert grad_out.shape == (10, 4, 3, 3) and not grad_out.is_contiguous()

    ref_out, ref_grad = _forward_backward(
        roi_align_reference, x, rois, grad_out.contiguous(), **kwargs
    )
    for features in (channels_last, transposed):
        out, grad = _forward_backward(roi_align, features, rois_nc, grad_out, **kwargs)
        torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(grad, ref_grad, atol=1e-5, rtol=1e-5)


def test_channels_last_input_with_few_rois():
    # One roi on a large channels-last map: read in place (no planar copy) and still exact.
    x = _features((2, 16, 40, 48), seed=17).to(memory_format=torch.channels_last)
    rois = _rois(1, 2, (80, 96), seed=18)
    kwargs = dict(output_size=(7, 7), spatial_scale=0.5, sampling_ratio=2, aligned=True)
    grad_out = torch.randn(1, 16, 7, 7, generator=_gen(19))
    ref_out, ref_grad = _forward_backward(roi_align_reference, x.contiguous(), rois, grad_out, **kwargs)
    out, grad = _forward_backward(roi_align, x, rois, grad_out, **kwargs)
    torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(grad, ref_grad, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("aligned", [False, True])
@pytest.mark.parametrize("sampling_ratio", [0, 2])
def test_gradcheck(aligned, sampling_ratio):
    # roi_align is linear in its input, so gradcheck over the input is well posed; the roi
    # corners are chosen off the pixel grid so no sample sits on a bilinear kink either.
    x = _features((2, 2, 5, 6), seed=17, dtype=torch.float64).requires_grad_(True)
    rois = torch.tensor(
        [[0, 0.3, 0.6, 4.7, 3.9], [1, 1.15, 0.35, 3.55, 4.45], [1, -0.7, 2.2, 2.9, 5.6]],
        dtype=torch.float64,
    )
    fn = lambda t: roi_align(t, rois, (2, 3), 1.0, sampling_ratio, aligned)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (x,))


def test_double_backward_is_an_error_not_silent_zeros():
    x = _features((1, 2, 6, 6), seed=23, dtype=torch.float64).requires_grad_(True)
    rois = torch.tensor([[0, 0.5, 0.5, 4.5, 4.5]], dtype=torch.float64)
    out = roi_align(x, rois, 2, 1.0, 2, True)
    grad_out = torch.ones_like(out, requires_grad=True)
    (grad,) = torch.autograd.grad(out, x, grad_out, create_graph=True)
    with pytest.raises(RuntimeError, match="double backward"):
        grad.sum().backward()


def test_roialign_module():
    x = _features((2, 3, 10, 10), seed=18)
    rois = _rois(6, 2, (40, 40), seed=19)
    module = ROIAlign((2, 3), spatial_scale=0.25, sampling_ratio=2, aligned=True)
    assert torch.equal(module(x, rois), roi_align(x, rois, (2, 3), 0.25, 2, True))
    assert isinstance(module, torch.nn.Module)
    legacy = ROIAlign(4, 0.25, 0)
    torch.testing.assert_close(legacy(x, rois), roi_align_reference(x, rois, 4, 0.25, 0, False))
    text = repr(module)
    assert "spatial_scale=0.25" in text and "aligned=True" in text


def test_inputs_are_not_modified():
    x = _features((1, 2, 8, 8), seed=20)
    rois = _rois(5, 1, (8, 8), seed=21)
    x_before, rois_before = x.clone(), rois.clone()
    roi_align(x, rois, 2, 1.0, 2, True)
    assert torch.equal(x, x_before) and torch.equal(rois, rois_before)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_on_cpu_computes_in_float32(dtype):
    """float16 / bfloat16 features and rois are pooled in float32 on their exactly upcast values
    and rounded once to the input's dtype, forward and backward."""
    x = _features((2, 3, 8, 8), seed=22).to(dtype).requires_grad_(True)
    rois = torch.tensor([[0, 1.0, 1.0, 6.0, 5.0], [1, 0.3, 2.0, 4.0, 7.5]]).to(dtype)
    out = roi_align(x, rois, 3, 1.0, 0, True)
    x32 = x.detach().float().requires_grad_(True)
    expected = roi_align_reference(x32, rois.float(), 3, 1.0, 0, True)
    assert out.dtype == dtype
    assert torch.equal(out, expected.to(dtype))
    grad_out = torch.rand(out.shape, generator=torch.Generator().manual_seed(1)).to(dtype)
    out.backward(grad_out)
    # The float32 kernel's gradient, rounded once (the reference sums in another order).
    (grad32,) = torch.autograd.grad(roi_align(x32, rois.float(), 3, 1.0, 0, True), x32, grad_out.float())
    assert x.grad.dtype == dtype
    assert torch.equal(x.grad, grad32.to(dtype))
    (expected_grad,) = torch.autograd.grad(expected, x32, grad_out.float())
    torch.testing.assert_close(grad32, expected_grad, atol=1e-6, rtol=1e-5)


def _raises(match, *args, **kwargs):
    with pytest.raises(OpArgumentError, match=match):
        roi_align(*args, **kwargs)


def test_bad_input_names_the_argument():
    x = torch.rand(2, 3, 8, 8)
    rois = torch.tensor([[0, 1.0, 1.0, 5.0, 5.0]])
    _raises("rois|boxes", x, torch.rand(3, 4), 2)  # a tensor needs the batch index column
    _raises("rois|boxes", x, torch.rand(3, 5, 1), 2)
    _raises("input", torch.rand(3, 8, 8), rois, 2)
    _raises("input", torch.randint(0, 5, (2, 3, 8, 8)), rois.long(), 2)
    _raises("rois|dtype", x, rois.double(), 2)
    _raises("output_size", x, rois, (-1, 2))
    _raises("output_size", x, rois, (2, 2, 2))
    _raises("boxes", x, [torch.rand(2, 3)], 2)
    _raises("boxes", x, [], 2)


@pytest.mark.parametrize("index", [2.0, -1.0, 7.0, float("nan")])
def test_bad_batch_index_names_rois(index):
    x = torch.rand(2, 3, 8, 8)
    rois = torch.tensor([[0, 1.0, 1.0, 5.0, 5.0], [index, 1.0, 1.0, 5.0, 5.0]])
    _raises("rois", x, rois, 2)
    # The backward op takes the batch size separately and checks it too.
    with pytest.raises((ValueError, RuntimeError), match="rois"):
        torch.ops.detcore._roi_align_backward(
            torch.rand(2, 3, 2, 2), rois, 1.0, 2, 2, 2, 3, 8, 8, 2, True
        )


# --- arguments that once ran for hours, exhausted memory or returned garbage ------------------------
def _refused(match, *args):
    # The argument checks' ValueError, with its message. (No timing: a check that came after the
    # work would show as a test that runs for hours.)
    with pytest.raises(ValueError, match=match):
        roi_align(*args)


@pytest.mark.parametrize("sampling_ratio", [129, 10000, 2**31, 2**32, 2**40])
def test_sampling_ratio_is_bounded_and_never_truncated(sampling_ratio):
    # 2**32 once became 0 through an int cast and returned all zeros; 10000 ended in bad_alloc.
    x = torch.rand(1, 2, 8, 8)
    rois = torch.tensor([[0, 1.0, 1.0, 5.0, 5.0]])
    _refused(rf"sampling_ratio must be at most 128 .* got {sampling_ratio}", x, rois, 2, 1.0, sampling_ratio)


def test_negative_sampling_ratios_mean_adaptive_as_in_torchvision():
    x = torch.rand(1, 2, 8, 8)
    rois = torch.tensor([[0, 1.0, 1.0, 7.0, 6.0]])
    adaptive = roi_align(x, rois, 2, 1.0, 0, True)
    for ratio in (-1, -2, -100):
        torch.testing.assert_close(roi_align(x, rois, 2, 1.0, ratio, True), adaptive, rtol=0, atol=0)


def _bilinear64(plane, y, x):
    """torchvision's bilinear sample of a float64 [H, W] array at (y, x), aligned semantics."""
    height, width = plane.shape
    if y < -1 or y > height or x < -1 or x > width:
        return 0.0
    y, x = max(y, 0.0), max(x, 0.0)
    y0, x0 = int(y), int(x)
    y1, x1 = min(y0 + 1, height - 1), min(x0 + 1, width - 1)
    if y0 >= height - 1:
        y0, y = height - 1, float(height - 1)
    if x0 >= width - 1:
        x0, x = width - 1, float(width - 1)
    ly, lx = y - y0, x - x0
    return ((1 - ly) * (1 - lx) * plane[y0, x0] + (1 - ly) * lx * plane[y0, x1]
            + ly * (1 - lx) * plane[y1, x0] + ly * lx * plane[y1, x1])


def test_adaptive_grid_counts_samples_as_the_gpu_does():
    """Issue 22: rows 13..97 at scale 1/3, aligned, are 28.0000019 high in float32 with each step
    rounded, as on the GPU (28 exactly if y * scale - 0.5 is fused into an FMA), so each of 7 bins
    takes ceil(4.0000003) = 5 samples, not 4: a float64 reference written here, on every build."""
    f = np.float32
    scale, offset, (ph, pw) = f(1 / 3), f(0.5), (7, 2)
    roi = [0.0, 2.0, 13.0, 9.0, 97.0]
    x = _features((1, 3, 40, 12), seed=7)
    out = roi_align(x, torch.tensor([roi]), (ph, pw), float(scale), 0, True)

    start_w, start_h = f(f(roi[1]) * scale) - offset, f(f(roi[2]) * scale) - offset
    width = (f(f(roi[3]) * scale) - offset) - start_w
    height = (f(f(roi[4]) * scale) - offset) - start_h
    grid_w = math.ceil(width / f(pw))
    assert math.ceil(height / f(ph)) == 5 and height == f(28.0000019)

    def reference(grid_h):
        planes = x[0].double().numpy()
        bin_h, bin_w = float(height) / ph, float(width) / pw
        result = np.zeros((planes.shape[0], ph, pw))
        for c, plane in enumerate(planes):
            for i, j in np.ndindex(ph, pw):
                ys = [float(start_h) + (i + (a + 0.5) / grid_h) * bin_h for a in range(grid_h)]
                xs = [float(start_w) + (j + (b + 0.5) / grid_w) * bin_w for b in range(grid_w)]
                result[c, i, j] = np.mean([_bilinear64(plane, y_, x_) for y_ in ys for x_ in xs])
        return torch.from_numpy(result)[None]

    five, four = reference(5), reference(4)
    assert (five - four).abs().max() > 1e-2  # the check can tell the grids apart
    torch.testing.assert_close(out.double(), five, rtol=0, atol=1e-5)


@pytest.mark.parametrize("aligned", [True, False])
def test_a_huge_roi_or_scale_with_adaptive_sampling_is_refused_up_front(aligned):
    x = torch.rand(1, 2, 8, 8)
    huge = torch.tensor([[0, 0.0, 0.0, 1e6, 1e6]])
    _refused(r"adaptive sampling .* samples per output bin \(at most 16384", x, huge, 7, 1.0, 0, aligned)
    rois = torch.tensor([[0, 1.0, 1.0, 5.0, 5.0]])
    _refused(r"spatial_scale", x, rois, 7, 1e6, 0, aligned)
    # The same roi with an explicit sampling ratio is bounded work: it runs.
    assert roi_align(x, huge, 7, 1.0, 2, aligned).shape == (1, 2, 7, 7)


@pytest.mark.parametrize("scale", [0.0, -0.25, float("nan"), float("inf")])
def test_spatial_scale_must_be_finite_and_positive(scale):
    x = torch.rand(1, 2, 8, 8)
    rois = torch.tensor([[0, 1.0, 1.0, 5.0, 5.0]])
    _refused(r"spatial_scale must be a finite number > 0", x, rois, 2, scale, 2)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_roi_coordinates_are_refused(bad):
    x = torch.rand(1, 2, 8, 8)
    rois = torch.tensor([[0, 1.0, 1.0, 5.0, 5.0], [0, 1.0, bad, 5.0, 5.0]])
    _refused(r"rois must be finite, got 1 NaN or infinite value", x, rois, 2, 1.0, 0)
    with pytest.raises(ValueError, match="rois must be finite"):
        torch.ops.detcore._roi_align_backward(torch.rand(2, 2, 2, 2), rois, 1.0, 2, 2, 1, 2, 8, 8, 0, True)


# --- drop-in details that torchvision users rely on -------------------------------------------------
class _PoolsBoxLists(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.pool = ROIAlign(3, 0.5, 2, aligned=True)

    def forward(self, x, boxes):
        return self.pool(x, boxes) * 2


def test_fx_symbolic_tracing_keeps_roi_align_a_leaf():
    # As with torchvision, the function is a leaf where its own module calls it (ROIAlign.forward,
    # the feature-extraction case); a tracer cannot follow its len() of a list of boxes.
    module = _PoolsBoxLists()
    traced = torch.fx.symbolic_trace(module)
    targets = [node.target for node in traced.graph.nodes if node.op == "call_function"]
    assert roi_align in targets  # one call node, not its internals
    x = torch.randn(2, 4, 10, 10)
    boxes = [torch.tensor([[1.0, 1.0, 9.0, 9.0]]), torch.tensor([[0.0, 2.0, 5.0, 7.0], [3.0, 3.0, 4.0, 4.0]])]
    torch.testing.assert_close(traced(x, boxes), module(x, boxes), rtol=0, atol=0)


def test_roialign_spelling_and_repr_match_torchvision():
    from detcore.layers import RoIAlign

    ours = RoIAlign(7, spatial_scale=0.25, sampling_ratio=2, aligned=True)
    assert isinstance(ours, ROIAlign) and ours.output_size == 7
    expected = "RoIAlign(output_size=7, spatial_scale=0.25, sampling_ratio=2, aligned=True)"
    assert repr(ours) == expected
    if torchvision is not None:
        assert repr(torchvision.ops.RoIAlign(7, 0.25, 2, True)) == expected
        assert repr(ROIAlign((7, 5), 0.5, 0)) == repr(torchvision.ops.RoIAlign((7, 5), 0.5, 0)).replace("RoIAlign", "ROIAlign")
    scripted = torch.jit.script(RoIAlign(2, 1.0, 1))
    x = torch.randn(1, 2, 6, 6)
    rois = torch.tensor([[0.0, 1.0, 1.0, 4.0, 5.0]])
    torch.testing.assert_close(scripted(x, rois), roi_align(x, rois, 2, 1.0, 1), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, n)])
def test_float8_is_a_clear_error_not_a_dispatch_failure(dtype):
    x = torch.rand(1, 2, 8, 8).to(dtype)
    rois = torch.tensor([[0, 1.0, 1.0, 5.0, 5.0]]).to(dtype)
    with pytest.raises(ValueError, match=r"roi_align: input must be float32, float64, float16 or bfloat16, got Float8"):
        torch.ops.detcore.roi_align(x, rois, 1.0, 2, 2, 2, True)
