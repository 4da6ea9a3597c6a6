"""The CUDA emulation held against the hardware: each kernel's GPU result against the result of
the same device source run by the emulation (tests/layers/cuda_emulation) on the same inputs.

Where both sides do the same arithmetic in the same order the results must have the same bits:
NMS (the mask kernel's IoU test is built from rounded operations, rounded_ops.h, that nvcc may
not fuse, and the unwrap is integer work), ROIAlign's and ROIPool's forward passes (the same
rounded geometry and blend, a max), and deformable im2col (seen through an identity weight: the
GEMM after it multiplies every column by exactly 1). The GPU exposes NMS's two kernels (the IoU
mask and its unwrap) only through their composition, the kept indices.

Where the order of additions is the GPU's own the results differ by rounding alone, within
REORDER_TOLERANCE: the backward passes add with atomicAdd in arrival order (ROIAlign, ROIPool,
deformable col2im), and deformable convolution's GEMMs run in cuBLAS, blocked its own way.
Reordering m terms moves a sum by at most 2 (m - 1) u sum|terms| (u the unit roundoff), by
about sqrt(m) u |terms| in practice. Here m stays below a few thousand terms of magnitude below
10, so float64 sums differ by < 1e-11 (1e-9 leaves a margin) and float32 ones by ~1e-6 (1e-4
would take hundreds of roundings all in one direction). Half and bfloat16 accumulate in float32
and round once at the end, which can land one unit of the last place apart: the shared
CUDA-vs-CPU tolerance of reference_ops (0.5% / 3%).

The sigmoid focal loss is close, not equal: its device code calls exp / log1p / pow, which are
CUDA's on the GPU and the C library's under the emulation (each within 1-2 units of the last
place), and nvcc contracts its plain a * b + c into FMAs (-fmad=true, as the emulation, built
with -ffp-contract=off, does not). FOCAL_TOLERANCE bounds a few units of the last place of
values and derivatives of magnitude <= 1 (float32: 1e-5 relative, 1e-6 absolute for
derivatives that cancel to near 0; float64: 1e-12 / 1e-14).

Device: CUDA when a GPU and detcore's CUDA kernels are there. DETCORE_EMULATION_VS_DEVICE=cpu
runs the same comparisons against the CPU kernels instead (the rehearsal of
scripts/gpu_check.sh, so that this file cannot rot between GPU runs): the CPU kernels are not
the device code, so there every claim relaxes to the shared CUDA-vs-CPU tolerance, and half and
bfloat16 inputs go through the CPU float32 kernels on the same, exactly upcast, values.
"""
import os

import pytest
import torch

from detcore.layers import _extension, deform_conv2d, nms, roi_align, roi_pool, sigmoid_focal_loss

try:
    from .reference_ops import CUDA_VS_CPU_TOLERANCE, distinct_scores, in_cpu_dtype, random_boxes, seeded
except ImportError:  # tests/ run as rootdir-relative modules, without packages
    from reference_ops import CUDA_VS_CPU_TOLERANCE, distinct_scores, in_cpu_dtype, random_boxes, seeded


def _device():
    if torch.cuda.is_available() and _extension.is_available() and _extension.cuda_kernels_built():
        return "cuda"
    return os.environ.get("DETCORE_EMULATION_VS_DEVICE") or None


DEVICE = _device()
ON_GPU = DEVICE == "cuda"
pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(
        DEVICE not in ("cuda", "cpu"),
        reason="needs a CUDA GPU and detcore's CUDA kernels (DETCORE_EMULATION_VS_DEVICE=cpu: the CPU kernels)",
    ),
]

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
REORDER_TOLERANCE = {
    torch.float64: dict(atol=1e-9, rtol=1e-9),
    torch.float32: dict(atol=1e-4, rtol=1e-4),
    torch.float16: CUDA_VS_CPU_TOLERANCE[torch.float16],
    torch.bfloat16: CUDA_VS_CPU_TOLERANCE[torch.bfloat16],
}
FOCAL_TOLERANCE = {
    torch.float64: dict(atol=1e-14, rtol=1e-12),
    torch.float32: dict(atol=1e-6, rtol=1e-5),
    torch.float16: CUDA_VS_CPU_TOLERANCE[torch.float16],
    torch.bfloat16: CUDA_VS_CPU_TOLERANCE[torch.bfloat16],
}


# ------------------------------------------------------------------------------------- helpers
def _looser(a, b):
    return {k: max(a[k], b[k]) for k in ("atol", "rtol")}


def _on_device(t):
    """A copy of t as the device op takes it: on the GPU as it is; on the CPU upcast to float32
    if half (a copy in any case: a leaf that takes gradients must be a tensor of its own)."""
    if t is None:
        return None
    return t.to(DEVICE) if ON_GPU else in_cpu_dtype(t).clone()


def _back(t, dtype):
    """A device result as a CPU tensor of the emulated result's dtype."""
    return t.detach().cpu().to(dtype)


def assert_same_bits(got, emulated, what):
    """Equal bits on the GPU; the CPU kernels (rehearsal) within the CUDA-vs-CPU tolerance."""
    got = got.cpu()
    if ON_GPU:
        assert got.dtype == emulated.dtype and got.shape == emulated.shape, what
        differ = got.ne(emulated) & ~(got.isnan() & emulated.isnan())
        assert not differ.any(), f"{what}: {int(differ.sum())} of {got.numel()} elements differ"
    else:
        tol = CUDA_VS_CPU_TOLERANCE.get(emulated.dtype, dict(atol=0, rtol=0))
        torch.testing.assert_close(got.to(emulated.dtype), emulated, **tol, msg=lambda m: f"{what}: {m}")


def assert_close_as(got, emulated, tolerance, what):
    tol = tolerance[emulated.dtype]
    if not ON_GPU:
        tol = _looser(tol, CUDA_VS_CPU_TOLERANCE[emulated.dtype])
    torch.testing.assert_close(got.cpu().to(emulated.dtype), emulated, **tol, msg=lambda m: f"{what}: {m}")


# ----------------------------------------------------------------------------------------- nms
def _crowded_boxes(n, seed, dtype):
    """Boxes in a small area, so that many overlap near any threshold; distinct scores."""
    g = seeded(seed)
    boxes = random_boxes(n, g, xy_max=150.0, wh_range=(5.0, 80.0)).to(dtype)
    return boxes, distinct_scores(n, g, torch.float64).to(dtype), g


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [0, 1, 63, 64, 65, 129, 300])
@pytest.mark.parametrize("with_categories", [False, True])
def test_nms_kept_indices(emu, n, dtype, with_categories):
    """Across the 64-box words of the mask; with categories, the batched (category-aware) mask."""
    boxes, scores, g = _crowded_boxes(n, n + 100, dtype)
    idxs = torch.randint(0, 3, (n,), generator=g) if with_categories else None
    for threshold in (0.0, 0.5, 1.0) if n == 65 else (0.5,):
        emulated = emu.nms(boxes, scores, idxs, threshold)
        if with_categories:
            got = torch.ops.detcore.batched_nms(_on_device(boxes), _on_device(scores), idxs.to(DEVICE), threshold)
        else:
            got = nms(_on_device(boxes), _on_device(scores), threshold)
        assert got.device.type == DEVICE and torch.equal(got.cpu(), emulated), (n, threshold)


@pytest.mark.parametrize("dtype", DTYPES)
def test_batched_nms_banded(emu, dtype):
    """Over 5000 boxes (launch_config.h's kNmsBandAbove): batched_nms's banded path."""
    lengths = torch.tensor([1, 64, 65] + [128] * 39)  # 5122 boxes
    boxes, scores, g = _crowded_boxes(int(lengths.sum()), 7, dtype)
    idxs = torch.repeat_interleave(torch.arange(len(lengths)), lengths)
    idxs = idxs[torch.randperm(len(idxs), generator=g)]
    emulated = emu.nms(boxes, scores, idxs, 0.5)
    got = torch.ops.detcore.batched_nms(_on_device(boxes), _on_device(scores), idxs.to(DEVICE), 0.5)
    assert got.device.type == DEVICE and torch.equal(got.cpu(), emulated)


def test_nms_ties_nan_and_duplicates(emu):
    boxes, scores, g = _crowded_boxes(130, 3, torch.float32)
    boxes[10:20] = boxes[0]  # exact duplicates: IoU 1
    boxes[25, 2] = float("nan")
    scores[[3, 70, 129]] = float("nan")
    tied = torch.full((130,), 0.5)
    for s in (scores, tied):
        for threshold in (0.0, 0.5, 1.0):
            got = nms(_on_device(boxes), _on_device(s), threshold)
            assert torch.equal(got.cpu(), emu.nms(boxes, s, None, threshold))


# ----------------------------------------------------------------------------------- roi_align
def _roi_inputs(seed, dtype, k=24, size=(11, 13), channels=3):
    """Rois (in image pixels, at scale 1/4) inside, across and outside the map, some of negative
    or zero size, most covering a few map pixels per bin."""
    g = seeded(seed)
    height, width = size
    features = torch.randn(2, channels, height, width, generator=g)
    boxes = random_boxes(k, g, xy_max=4.0 * max(size), wh_range=(-8.0, 48.0))
    boxes[0] = torch.tensor([-200.0, -200.0, -100.0, -150.0])  # wholly outside
    boxes[1] = torch.tensor([40.0, 40.0, 40.0, 40.0])  # a point
    rois = torch.cat([(torch.arange(k) % 2).double()[:, None], boxes.double()], dim=1)
    return features.to(dtype), rois.to(dtype), g


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("aligned", [False, True])
@pytest.mark.parametrize("sampling_ratio", [0, 2])
def test_roi_align(emu, dtype, aligned, sampling_ratio):
    features, rois, g = _roi_inputs(sampling_ratio + 7, dtype)
    args = (0.25, 3, 4, sampling_ratio, aligned)
    grad = torch.randn(len(rois), 3, 3, 4, generator=g).to(dtype)

    x = _on_device(features).requires_grad_(True)
    out = roi_align(x, _on_device(rois), (3, 4), 0.25, sampling_ratio, aligned)
    out.backward(_on_device(grad))
    emulated = emu.roi_align(features, rois, *args)
    assert_same_bits(_back(out, dtype), emulated, "roi_align forward")
    emulated_grad = emu.roi_align_backward(grad, rois, *args[:3], *features.shape, *args[3:])
    assert_close_as(_back(x.grad, dtype), emulated_grad, REORDER_TOLERANCE, "roi_align backward")


def test_roi_align_non_contiguous_and_empty(emu):
    features, rois, g = _roi_inputs(11, torch.float32, k=40, size=(9, 16), channels=5)
    args = (0.25, 2, 2, 0, True)
    x = _on_device(features).to(memory_format=torch.channels_last)
    assert_same_bits(roi_align(x, _on_device(rois), 2, 0.25, 0, True), emu.roi_align(features, rois, *args), "channels-last")
    grad = torch.randn(40, 5, 2, 2, generator=g)
    expanded = torch.ones(1, 1, 1, 1).expand(40, 5, 2, 2)  # out.sum()'s zero-stride gradient
    for g_out in (grad.transpose(2, 3), expanded):
        xr = _on_device(features).requires_grad_(True)
        roi_align(xr, _on_device(rois), 2, 0.25, 0, True).backward(_on_device(g_out))
        emulated = emu.roi_align_backward(g_out, rois, *args[:3], *features.shape, *args[3:])
        assert_close_as(_back(xr.grad, torch.float32), emulated, REORDER_TOLERANCE, "non-contiguous grad")
    empty = roi_align(_on_device(features), _on_device(rois[:0]), 2, 0.25, 0, True)
    assert empty.shape == emu.roi_align(features, rois[:0], *args).shape == (0, 5, 2, 2)


# ------------------------------------------------------------------------------------ roi_pool
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ties", [False, True])
def test_roi_pool(emu, dtype, ties):
    features, rois, g = _roi_inputs(13, dtype)
    if ties:  # few distinct values: both sides must pick the first maximum
        features = torch.randint(0, 3, features.shape, generator=g).to(dtype)
    grad = torch.randn(len(rois), 3, 3, 4, generator=g).to(dtype)

    x = _on_device(features).requires_grad_(True)
    out, argmax = torch.ops.detcore.roi_pool(x, _on_device(rois), 0.25, 3, 4)
    out.backward(_on_device(grad))
    emulated, emulated_argmax = emu.roi_pool(features, rois, 0.25, 3, 4)
    assert_same_bits(_back(out, dtype), emulated, "roi_pool forward")
    assert torch.equal(argmax.cpu(), emulated_argmax), "roi_pool argmax"
    emulated_grad = emu.roi_pool_backward(grad, rois, emulated_argmax, *features.shape)
    assert_close_as(_back(x.grad, dtype), emulated_grad, REORDER_TOLERANCE, "roi_pool backward")


# ------------------------------------------------------------------------------- deform_conv2d
def _deform_inputs(seed, dtype, with_mask, batch=2):
    """A grouped, offset-grouped, strided and dilated deformable conv; many samples off the map."""
    g = seeded(seed)
    x = torch.randn(batch, 4, 7, 8, generator=g)
    weight = torch.randn(2, 2, 2, 3, generator=g)
    bias = torch.randn(2, generator=g)
    offset = torch.randn(batch, 2 * 2 * 6, 4, 4, generator=g) * 2.5
    mask = torch.rand(batch, 2 * 6, 4, 4, generator=g) if with_mask else None
    geometry = dict(stride=(2, 1), padding=(1, 0), dilation=(1, 2))
    flat = (2, 1, 1, 0, 1, 2, 2, 2)  # stride, padding, dilation, groups 2, offset groups 2
    cast = lambda t: None if t is None else t.to(dtype)  # noqa: E731
    return [cast(t) for t in (x, weight, offset, mask, bias)], geometry, flat, g


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_mask", [False, True])
def test_deform_conv2d(emu, dtype, with_mask):
    (x, weight, offset, mask, bias), geometry, flat, g = _deform_inputs(20, dtype, with_mask)
    grad = torch.randn(2, 2, 4, 4, generator=g).to(dtype)
    leaves = [_on_device(t).requires_grad_(True) if t is not None else None for t in (x, weight, offset, mask, bias)]
    out = deform_conv2d(leaves[0], leaves[2], leaves[1], leaves[4], mask=leaves[3], **geometry)
    present = [t for t in leaves if t is not None]
    grads = torch.autograd.grad(out, present, _on_device(grad))
    emulated = emu.deform_conv2d(x, weight, offset, mask, bias, *flat)
    assert_close_as(_back(out, dtype), emulated, REORDER_TOLERANCE, "deform_conv2d forward")
    emulated_grads = emu.deform_conv2d_backward(grad, x, weight, offset, mask, *flat)
    names = ["input", "weight", "offset", "mask", "bias"]
    got = dict(zip([n for n, t in zip(names, leaves) if t is not None], grads))
    for name, expected in zip(names, emulated_grads):
        if name in got:
            assert_close_as(_back(got[name], dtype), expected, REORDER_TOLERANCE, f"grad {name}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_mask", [False, True])
def test_deform_im2col_columns(emu, dtype, with_mask):
    """An identity weight (groups 1) turns the output into the columns: 1 * v, + exact zeros."""
    (x, _, offset, mask, _), geometry, flat, _ = _deform_inputs(21, dtype, with_mask)
    taps = x.shape[1] * 2 * 3
    eye = torch.eye(taps).reshape(taps, x.shape[1], 2, 3).to(dtype)
    flat = (*flat[:6], 1, flat[7])
    with torch.no_grad():
        got = deform_conv2d(_on_device(x), _on_device(offset), _on_device(eye), None, mask=_on_device(mask), **geometry)
    emulated = emu.deform_conv2d(x, eye, offset, mask, None, *flat)
    assert_same_bits(_back(got, dtype), emulated, "deform im2col columns")


def test_deform_conv2d_empty_batch(emu):
    (x, weight, offset, mask, bias), geometry, flat, _ = _deform_inputs(22, torch.float32, True, batch=0)
    out = deform_conv2d(*map(_on_device, (x, offset, weight, bias)), mask=_on_device(mask), **geometry)
    assert out.shape == emu.deform_conv2d(x, weight, offset, mask, bias, *flat).shape == (0, 2, 4, 4)


# --------------------------------------------------------------------------- sigmoid focal loss
def _focal_inputs(n, seed, dtype):
    g = seeded(seed)
    x = torch.randn(n, generator=g, dtype=torch.float64) * 5
    x[:4] = torch.tensor([100.0, -100.0, 30.0, -30.0])[: min(n, 4)]  # saturated logits
    t = torch.rand(n, generator=g, dtype=torch.float64)
    t[::3] = 0.0
    t[1::3] = 1.0
    return x.to(dtype), t.to(dtype), g


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("gamma", [0.0, 2.0, 1.5])
def test_sigmoid_focal_loss(emu, dtype, reduction, gamma):
    """4099 elements: 17 blocks of 256 (the second-level sum), the last one partial."""
    x, t, g = _focal_inputs(4099, 30, dtype)
    grad = torch.randn(x.shape if reduction == "none" else (), generator=g).to(dtype)
    xd, td = _on_device(x).requires_grad_(True), _on_device(t).requires_grad_(True)
    loss = sigmoid_focal_loss(xd, td, alpha=0.25, gamma=gamma, reduction=reduction)
    gx, gt = torch.autograd.grad(loss, (xd, td), _on_device(grad))
    emulated, bad = emu.sigmoid_focal_loss(x, t, 0.25, gamma, reduction)
    egx, egt, bad_backward = emu.sigmoid_focal_loss_backward(grad, x, t, 0.25, gamma, reduction, True)
    assert int(bad) == int(bad_backward) == x.numel()  # every target is a probability
    for what, a, b in (("loss", loss, emulated), ("d inputs", gx, egx), ("d targets", gt, egt)):
        assert_close_as(_back(a, dtype), b, FOCAL_TOLERANCE, what)


@pytest.mark.parametrize("n", [0, 1, 63, 64, 65, 257])
def test_sigmoid_focal_loss_small_sizes(emu, n):
    x, t, _ = _focal_inputs(n, n, torch.float32)
    for reduction in ("none", "mean", "sum"):
        got = sigmoid_focal_loss(_on_device(x), _on_device(t), reduction=reduction)
        emulated, _ = emu.sigmoid_focal_loss(x, t, 0.25, 2.0, reduction)
        torch.testing.assert_close(got.cpu(), emulated, equal_nan=True, **FOCAL_TOLERANCE[torch.float32])
