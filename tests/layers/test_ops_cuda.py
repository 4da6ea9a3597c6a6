"""CUDA kernels against the CPU ones: identical NMS; ROIAlign, ROIPool, deformable convolution and
sigmoid focal loss (values and gradients) within tolerance.

Half and bfloat16 have no CPU kernel; the CUDA kernels compute them in float32, so they are
compared with the CPU float32 kernel on the same (upcast, exactly) values.
"""
import warnings

import pytest
import torch

from detcore.layers import (
    batched_nms,
    deform_conv2d,
    nms,
    roi_align,
    roi_pool,
    sigmoid_focal_loss,
    sigmoid_focal_loss_per_image,
)
from detcore.layers import _extension

try:
    from .op_watch import count_syncs
    from .reference_ops import CUDA_VS_CPU_TOLERANCE, distinct_scores, random_boxes
except ImportError:  # tests/ run as rootdir-relative modules, without packages
    from op_watch import count_syncs
    from reference_ops import CUDA_VS_CPU_TOLERANCE, distinct_scores, random_boxes

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(
        not (_extension.is_available() and _extension.cuda_kernels_built()),
        reason="detcore._C was built without CUDA kernels",
    ),
]

ALL_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
ROI_TOL = CUDA_VS_CPU_TOLERANCE


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def _cpu_dtype(dtype):
    return dtype if dtype in (torch.float32, torch.float64) else torch.float32


def _nms_inputs(n, seed, dtype, num_classes=1):
    g = _gen(seed)
    boxes = random_boxes(n, g, xy_max=1000.0).to(dtype)
    # Rounding to half / bfloat16 makes some scores equal; both devices break ties by index.
    scores = distinct_scores(n, g, torch.float64).to(dtype)
    idxs = torch.randint(0, num_classes, (n,), generator=g)
    return boxes, scores, idxs


@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("n", [0, 1, 100, 1000, 5000])
@pytest.mark.parametrize("iou_threshold", [0.0, 0.5, 0.7, 1.0])
def test_nms_cuda_equals_cpu(n, dtype, iou_threshold):
    boxes, scores, _ = _nms_inputs(n, seed=n, dtype=dtype)
    got = nms(boxes.cuda(), scores.cuda(), iou_threshold)
    assert got.device.type == "cuda" and got.dtype == torch.int64
    cpu = _cpu_dtype(dtype)
    expected = nms(boxes.to(cpu), scores.to(cpu), iou_threshold)
    assert torch.equal(got.cpu(), expected)


@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("n,num_classes", [(300, 3), (6000, 20), (20000, 80)])
def test_batched_nms_cuda_equals_cpu(n, num_classes, dtype):
    boxes, scores, idxs = _nms_inputs(n, seed=n + 1, dtype=dtype, num_classes=num_classes)
    got = batched_nms(boxes.cuda(), scores.cuda(), idxs.cuda(), 0.5)
    assert got.device.type == "cuda" and got.dtype == torch.int64
    cpu = _cpu_dtype(dtype)
    assert torch.equal(got.cpu(), batched_nms(boxes.to(cpu), scores.to(cpu), idxs, 0.5))


def test_nms_cuda_large_and_ties():
    boxes, scores, _ = _nms_inputs(100000, seed=2, dtype=torch.float32)
    assert torch.equal(nms(boxes.cuda(), scores.cuda(), 0.7).cpu(), nms(boxes, scores, 0.7))
    tied = torch.full((3000,), 0.5)
    got = nms(boxes[:3000].cuda(), tied.cuda(), 0.5)
    assert torch.equal(got.cpu(), nms(boxes[:3000], tied, 0.5))


def test_nms_cuda_non_contiguous():
    boxes, scores, idxs = _nms_inputs(2000, seed=3, dtype=torch.float32, num_classes=4)
    b = boxes.cuda().t().contiguous().t()
    s = torch.stack([scores, scores], 1).cuda()[:, 1]
    assert not b.is_contiguous() and not s.is_contiguous()
    assert torch.equal(nms(b, s, 0.5).cpu(), nms(boxes, scores, 0.5))
    got = batched_nms(b, s, idxs.cuda(), 0.5)
    assert torch.equal(got.cpu(), batched_nms(boxes, scores, idxs, 0.5))


def _roi_inputs(seed, dtype, k=200):
    g = _gen(seed)
    features = torch.randn(2, 8, 25, 42, generator=g)
    boxes = random_boxes(k, g, xy_max=1344.0, wh_range=(-10.0, 300.0))
    boxes[:, 1::2] *= 800 / 1344  # y in [0, 800]
    rois = torch.cat([(torch.arange(k) % 2).float()[:, None], boxes], dim=1)
    # The values the CUDA kernel sees, upcast exactly for the CPU kernel.
    features, rois = features.to(dtype), rois.to(dtype)
    return features, rois


@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("aligned", [False, True])
@pytest.mark.parametrize("sampling_ratio", [0, 2])
def test_roi_align_cuda_equals_cpu(dtype, aligned, sampling_ratio):
    features, rois = _roi_inputs(4, dtype)
    args = ((7, 6), 1 / 32, sampling_ratio, aligned)
    cpu = _cpu_dtype(dtype)
    # A copy: where cpu is dtype, .to() would return features itself, and x_cuda (made from it)
    # would then be a non-leaf whose .grad stays None.
    x_cpu = features.to(cpu, copy=True).requires_grad_(True)
    out_cpu = roi_align(x_cpu, rois.to(cpu), *args)
    grad_out = torch.randn(out_cpu.shape, generator=_gen(5)).to(dtype)
    out_cpu.backward(grad_out.to(cpu))

    x_cuda = features.cuda().requires_grad_(True)
    out_cuda = roi_align(x_cuda, rois.cuda(), *args)
    assert out_cuda.device.type == "cuda" and out_cuda.dtype == dtype
    out_cuda.backward(grad_out.cuda())
    assert x_cuda.grad.dtype == dtype
    tol = ROI_TOL[dtype]
    torch.testing.assert_close(out_cuda.cpu().to(cpu), out_cpu.detach(), **tol)
    torch.testing.assert_close(x_cuda.grad.cpu().to(cpu), x_cpu.grad, **tol)


def test_roi_align_cuda_non_contiguous_and_empty():
    features, rois = _roi_inputs(6, torch.float32, k=50)
    x = features.cuda().to(memory_format=torch.channels_last)
    expected = roi_align(features, rois, 5, 1 / 32, 2, True)
    torch.testing.assert_close(roi_align(x, rois.cuda(), 5, 1 / 32, 2, True).cpu(), expected)
    x = features.cuda().requires_grad_(True)
    out = roi_align(x, rois.cuda()[:0], 5, 1 / 32, 2, True)
    assert out.shape == (0, 8, 5, 5)
    out.sum().backward()
    assert bool((x.grad == 0).all())


def test_roi_align_cuda_autocast():
    features, rois = _roi_inputs(7, torch.float32, k=60)
    expected = roi_align(features, rois, 7, 1 / 32, 2, True)
    with torch.autocast("cuda", dtype=torch.float16):
        out = roi_align(features.cuda(), rois.cuda(), 7, 1 / 32, 2, True)
        half_out = roi_align(features.cuda().half(), rois.cuda(), 7, 1 / 32, 2, True)
    assert out.dtype == torch.float32 and half_out.dtype == torch.float16
    torch.testing.assert_close(out.cpu(), expected)
    torch.testing.assert_close(half_out.cpu().float(), expected, atol=5e-3, rtol=5e-3)


def test_device_mix_names_the_argument():
    boxes, scores, idxs = _nms_inputs(10, seed=8, dtype=torch.float32)
    with pytest.raises((ValueError, RuntimeError), match="device"):
        nms(boxes.cuda(), scores, 0.5)
    with pytest.raises((ValueError, RuntimeError), match="idxs"):
        batched_nms(boxes.cuda(), scores.cuda(), idxs, 0.5)
    features, rois = _roi_inputs(9, torch.float32, k=5)
    with pytest.raises((ValueError, RuntimeError), match="rois"):
        roi_align(features.cuda(), rois, 2, 1 / 32, 2, True)


def test_bad_batch_index_on_cuda_names_rois():
    features, rois = _roi_inputs(10, torch.float32, k=5)
    rois[3, 0] = 2  # the batch has 2 images
    with pytest.raises((ValueError, RuntimeError), match="rois"):
        roi_align(features.cuda(), rois.cuda(), 2, 1 / 32, 2, True)


def test_roi_align_backward_cuda_alerts_nondeterminism():
    """Its atomics add in arrival order, so deterministic mode refuses it (as torchvision's)."""
    features, rois = _roi_inputs(11, torch.float32, k=5)
    out = roi_align(features.cuda().requires_grad_(True), rois.cuda(), 2, 1 / 32, 2, True)
    was_deterministic = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        with pytest.raises(RuntimeError, match="roi_align_backward_cuda"):
            out.sum().backward()
    finally:
        torch.use_deterministic_algorithms(was_deterministic)


def test_roi_align_cuda_checks_its_rois_with_one_sync():
    """One device-to-host copy for all the roi checks (batch indices, finiteness, sampling grid)."""
    features, rois = _roi_inputs(12, torch.float32, k=5)
    x = features.cuda().requires_grad_(True)
    r = rois.cuda()
    torch.cuda.synchronize()
    with count_syncs() as counter:
        out = roi_align(x, r, 2, 1 / 32, 2, True)
        forward_syncs = counter.syncs()
        out.backward(torch.ones_like(out))
    assert forward_syncs == 1 and counter.syncs() == 2, [str(w.message) for w in counter.log]


# ---------------------------------------------------------------------------------- roi_pool


@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("spatial_scale", [1 / 32, 1 / 16])
@pytest.mark.parametrize("ties", [False, True])
def test_roi_pool_cuda_equals_cpu(dtype, spatial_scale, ties):
    features, rois = _roi_inputs(13, dtype)
    if ties:  # few distinct values: both devices must pick the first maximum
        features = torch.randint(0, 3, features.shape, generator=_gen(14)).to(dtype)
    cpu = _cpu_dtype(dtype)
    # A copy: where cpu is dtype, .to() would return features itself, and x_cuda (made from it)
    # would then be a non-leaf whose .grad stays None.
    x_cpu = features.to(cpu, copy=True).requires_grad_(True)
    out_cpu, argmax_cpu = torch.ops.detcore.roi_pool(x_cpu, rois.to(cpu), spatial_scale, 7, 6)
    grad_out = torch.randn(out_cpu.shape, generator=_gen(15)).to(dtype)
    out_cpu.backward(grad_out.to(cpu))

    x_cuda = features.cuda().requires_grad_(True)
    out_cuda, argmax_cuda = torch.ops.detcore.roi_pool(x_cuda, rois.cuda(), spatial_scale, 7, 6)
    assert out_cuda.dtype == dtype and argmax_cuda.dtype == torch.int32
    out_cuda.backward(grad_out.cuda())
    assert x_cuda.grad.dtype == dtype
    assert torch.equal(argmax_cuda.cpu(), argmax_cpu)
    assert torch.equal(out_cuda.cpu().to(cpu), out_cpu.detach().to(dtype).to(cpu))
    torch.testing.assert_close(x_cuda.grad.cpu().to(cpu), x_cpu.grad, **ROI_TOL[dtype])


def test_roi_pool_cuda_equals_torchvision():
    pytest.importorskip("torchvision")  # registers torch.ops.torchvision
    features, rois = _roi_inputs(16, torch.float32)
    x = features.cuda()
    ours, our_argmax = torch.ops.detcore.roi_pool(x, rois.cuda(), 1 / 16, 7, 7)
    theirs, their_argmax = torch.ops.torchvision.roi_pool(x, rois.cuda(), 1 / 16, 7, 7)
    assert torch.equal(ours, theirs) and torch.equal(our_argmax, their_argmax)


def test_roi_pool_cuda_channels_last_empty_and_autocast():
    features, rois = _roi_inputs(17, torch.float32, k=50)
    expected = roi_pool(features, rois, 5, 1 / 32)
    x = features.cuda().to(memory_format=torch.channels_last)
    assert torch.equal(roi_pool(x, rois.cuda(), 5, 1 / 32).cpu(), expected)
    x = features.cuda().requires_grad_(True)
    out = roi_pool(x, rois.cuda()[:0], 5, 1 / 32)
    assert out.shape == (0, 8, 5, 5)
    out.sum().backward()
    assert bool((x.grad == 0).all())
    with torch.autocast("cuda", dtype=torch.float16):
        out = roi_pool(features.cuda(), rois.cuda(), 5, 1 / 32)
        half_out = roi_pool(features.cuda().half(), rois.cuda(), 5, 1 / 32)
    assert out.dtype == torch.float32 and half_out.dtype == torch.float16
    assert torch.equal(out.cpu(), expected)
    assert torch.equal(half_out.cpu(), roi_pool(features.half().float(), rois, 5, 1 / 32).half())


def test_roi_pool_backward_cuda_alerts_nondeterminism():
    features, rois = _roi_inputs(18, torch.float32, k=5)
    out = roi_pool(features.cuda().requires_grad_(True), rois.cuda(), 2, 1 / 32)
    was_deterministic = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        with pytest.raises(RuntimeError, match="roi_pool_backward_cuda"):
            out.sum().backward()
    finally:
        torch.use_deterministic_algorithms(was_deterministic)


def test_roi_pool_cuda_bad_input_names_the_argument():
    features, rois = _roi_inputs(19, torch.float32, k=5)
    with pytest.raises((ValueError, RuntimeError), match="rois"):
        roi_pool(features.cuda(), rois, 2, 1 / 32)
    rois[3, 0] = 2  # the batch has 2 images
    with pytest.raises(ValueError, match="rois"):
        roi_pool(features.cuda(), rois.cuda(), 2, 1 / 32)
# ---------------------------------------------------------------------------- deform_conv2d


def _deform_inputs(seed, dtype, with_mask, batch=2):
    """A grouped, offset-grouped, strided and dilated deformable conv; many samples off the map."""
    g = _gen(seed)
    x = torch.randn(batch, 8, 13, 15, generator=g)
    weight = torch.randn(6, 4, 3, 2, generator=g) / 5
    bias = torch.randn(6, generator=g)
    offset = torch.randn(batch, 2 * 2 * 6, 7, 14, generator=g) * 2.5
    mask = torch.rand(batch, 2 * 6, 7, 14, generator=g) if with_mask else None
    kwargs = dict(stride=(2, 1), padding=(1, 0), dilation=(1, 1))
    cast = lambda t: None if t is None else t.to(dtype)  # noqa: E731
    return [cast(t) for t in (x, offset, weight, bias, mask)], kwargs


def _deform_value_and_grads(tensors, kwargs, grad_out):
    leaves = [t.detach().clone().requires_grad_(True) if t is not None else None for t in tensors]
    x, offset, weight, bias, mask = leaves
    out = deform_conv2d(x, offset, weight, bias, mask=mask, **kwargs)
    grads = torch.autograd.grad(out, [t for t in leaves if t is not None], grad_out.to(out))
    return [out.detach(), *grads]


@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("with_mask", [False, True])
def test_deform_conv2d_cuda_equals_cpu(dtype, with_mask):
    tensors, kwargs = _deform_inputs(20, dtype, with_mask)
    grad_out = torch.randn(2, 6, 7, 14, generator=_gen(21)).to(dtype)
    cpu = [t.to(_cpu_dtype(dtype)) if t is not None else None for t in tensors]
    expected = _deform_value_and_grads(cpu, kwargs, grad_out.to(_cpu_dtype(dtype)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the backward's non-determinism notice, if enabled
        got = _deform_value_and_grads([t.cuda() if t is not None else None for t in tensors], kwargs, grad_out.cuda())
    for a, b in zip(got, expected):
        assert a.dtype == dtype and a.is_cuda
        torch.testing.assert_close(a.cpu().to(b.dtype), b, **ROI_TOL[dtype])


def test_deform_conv2d_cuda_empty_batch_and_non_contiguous():
    tensors, kwargs = _deform_inputs(22, torch.float32, True)
    x, offset, weight, bias, mask = tensors
    expected = deform_conv2d(x, offset, weight, bias, mask=mask, **kwargs)
    xt = x.cuda().transpose(2, 3).contiguous().transpose(2, 3)
    got = deform_conv2d(xt, offset.cuda(), weight.cuda(), bias.cuda(), mask=mask.cuda()[:, :], **kwargs)
    torch.testing.assert_close(got.cpu(), expected, **ROI_TOL[torch.float32])
    empty, _ = _deform_inputs(23, torch.float32, True, batch=0)
    out = deform_conv2d(*[t.cuda() for t in empty[:4]], mask=empty[4].cuda(), **kwargs)
    assert out.shape == (0, 6, 7, 14)


def test_deform_conv2d_cuda_backward_alerts_nondeterminism():
    """col2im adds with atomics in arrival order, so deterministic mode refuses it."""
    tensors, kwargs = _deform_inputs(24, torch.float32, True)
    x, offset, weight, bias, mask = [t.cuda() for t in tensors]
    out = deform_conv2d(x.requires_grad_(True), offset, weight, bias, mask=mask, **kwargs)
    was_deterministic = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        with pytest.raises(RuntimeError, match="deform_conv2d_backward_cuda"):
            out.sum().backward()
    finally:
        torch.use_deterministic_algorithms(was_deterministic)


# --- sigmoid_focal_loss -----------------------------------------------------------------------------
def _focal_inputs(n, seed, dtype):
    g = _gen(seed)
    x = torch.randn(n, generator=g, dtype=torch.float64) * 5
    x[:4] = torch.tensor([100.0, -100.0, 30.0, -30.0])
    t = torch.rand(n, generator=g, dtype=torch.float64)
    t[::3] = 0.0
    t[1::3] = 1.0
    return x.to(dtype), t.to(dtype)


def _focal_value_and_grads(x, t, grad, **kwargs):
    x = x.detach().clone().requires_grad_(True)
    t = t.detach().clone().requires_grad_(True)
    loss = sigmoid_focal_loss(x, t, **kwargs)
    return [loss.detach(), *torch.autograd.grad(loss, (x, t), grad.to(loss))]


@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("gamma", [0.0, 2.0, 1.5])
def test_sigmoid_focal_loss_cuda_equals_cpu(dtype, reduction, gamma):
    """1M elements (more than the grid: the grid-stride loops and the two-level sum)."""
    n = 1 << 20 if dtype != torch.float64 else 70001
    x, t = _focal_inputs(n, 30, dtype)
    grad = torch.randn(n if reduction == "none" else (), generator=_gen(31)).to(dtype)
    args = dict(alpha=0.25, gamma=gamma, reduction=reduction)
    cpu = _cpu_dtype(dtype)
    expected = _focal_value_and_grads(x.to(cpu), t.to(cpu), grad.to(cpu), **args)
    got = _focal_value_and_grads(x.cuda(), t.cuda(), grad.cuda(), **args)
    for a, b in zip(got, expected):
        assert a.dtype == dtype and a.is_cuda
        tol = dict(rtol=1e-4, atol=1e-5) if dtype == torch.float32 and reduction != "none" else ROI_TOL[dtype]
        # The reference rounded to the op's dtype: a float16 sum of 1M losses is past its range (inf).
        torch.testing.assert_close(a.cpu().to(b.dtype), b.to(dtype).to(b.dtype), **tol)


def test_sigmoid_focal_loss_cuda_is_deterministic():
    """The sums take no atomics: the same bits every run, also in deterministic mode."""
    x, t = _focal_inputs(3_000_000, 32, torch.float32)
    x, t = x.cuda(), t.cuda()
    was_deterministic = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        first = [sigmoid_focal_loss(x, t, reduction=r) for r in ("sum", "mean")]
        for _ in range(3):
            again = [sigmoid_focal_loss(x, t, reduction=r) for r in ("sum", "mean")]
            assert all(torch.equal(a, b) for a, b in zip(first, again))
    finally:
        torch.use_deterministic_algorithms(was_deterministic)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("grad_out", [[0.5, -2.0], [0.7, 0.7]], ids=["per_image", "shared"])
def test_sigmoid_focal_loss_per_image_cuda_equals_cpu(dtype, grad_out):
    """RetinaNet's per-image class loss: the same ops on the GPU, the same targets and ignored rows."""
    g = _gen(34)
    logits = [torch.randn(2, n, 7, generator=g, dtype=torch.float64).mul(3).to(dtype) for n in (3000, 500, 0)]
    labels = torch.randint(-1, 8, (2, 3500), generator=g)
    grad = torch.tensor(grad_out, dtype=dtype)

    def run(device):
        leaves = [x.to(device).requires_grad_(True) for x in logits]
        loss = sigmoid_focal_loss_per_image(leaves, labels.to(device))
        return [loss.detach(), *torch.autograd.grad(loss, leaves, grad.to(device))]

    for a, b in zip(run("cuda"), run("cpu")):
        assert a.is_cuda and a.dtype == dtype
        torch.testing.assert_close(a.cpu(), b, rtol=1e-5, atol=1e-5)


def test_sigmoid_focal_loss_cuda_edge_cases_and_autocast():
    for shape in ((0, 80), (1,), ()):
        x, t = torch.full(shape, 0.7).cuda(), torch.ones(shape).cuda()
        for reduction in ("none", "mean", "sum"):
            got = sigmoid_focal_loss(x, t, reduction=reduction)
            expected = sigmoid_focal_loss(x.cpu(), t.cpu(), reduction=reduction)
            torch.testing.assert_close(got.cpu(), expected, equal_nan=True)
    x, t = _focal_inputs(5000, 33, torch.float32)
    xt = x.reshape(50, 100).cuda().t()  # non-contiguous
    got = sigmoid_focal_loss(xt, t.reshape(50, 100).cuda().t(), reduction="none")
    torch.testing.assert_close(got.cpu(), sigmoid_focal_loss(x.reshape(50, 100).t(), t.reshape(50, 100).t()))
    with torch.autocast("cuda", dtype=torch.float16):
        out = sigmoid_focal_loss(x.cuda().half(), t.cuda().half(), reduction="sum")
    assert out.dtype == torch.float32


def test_sigmoid_focal_loss_cuda_bad_targets_name_the_first():
    x, t = _focal_inputs(100000, 34, torch.float32)
    t[90000] = 2.0
    t[60000] = float("nan")
    with pytest.raises(ValueError, match=r"got nan at targets\[60000\]"):
        sigmoid_focal_loss(x.cuda(), t.cuda(), reduction="sum")
    with pytest.raises(ValueError, match="targets must have the shape of inputs"):
        sigmoid_focal_loss(x.cuda(), t[:10].cuda())
    with pytest.raises(ValueError, match="targets must be on the device of inputs"):
        torch.ops.detcore.sigmoid_focal_loss(x.cuda(), t, 0.25, 2.0, "sum")
