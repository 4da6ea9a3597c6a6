"""detcore.layers as a drop-in for torchvision.ops, checked side by side on the CPU.

Behaviours torchvision's test/test_ops.py checks (TestNMS, TestRoIAlign + RoIOpTester,
TestMultiScaleRoIAlign), one a line; "elsewhere" = already compared in another tests/layers file.
NMS / batched NMS
  nms equals greedy NMS: 1000 random boxes, one pair just over the threshold 0.2/0.5/0.8
  nms refuses 1-D boxes, [N, 5] boxes, 2-D scores, a length mismatch (RuntimeError; ValueError too)
  quantized nms (quint8; scale/zero point 1/0, 2/50, 3/10) equals nms of the dequantized values
  float16 nms keeps what float32 keeps (torchvision: CUDA/MPS; here CPU, bfloat16 too)
  autocast (torchvision: CUDA; here CPU autocast): same results and output dtypes
  batched_nms equals both torchvision implementations (per-category loop, coordinate offsets)
  batched_nms of no boxes is empty whatever the other arguments ................... elsewhere
  opcheck: schema, autograd registration, fake tensor, AOT dispatch ............... elsewhere
  (brief) batched_nms with bool and floating category ids
RoIAlign
  float32/float64 forward, contiguous or permuted, aligned or not, sampling_ratio -1 (-2, 0, 2)
  float16 forward (float16 rois), within torchvision's half tolerance
  gradients equal torchvision's; gradcheck through torch.jit.script(roi_align)
  deterministic algorithms mode (torchvision skips it on the CPU)
  fx: the module is one graph node (leaf); a traced module equals eager
  torch.jit.script of a module holding RoIAlign(output_size=[3, 3]) fed a list of boxes
  quantized input and rois: qint8, quint8, qint32; scale/zero point 1/0, 2/10, 0.1/50; aligned
  quantized input holding several images (torchvision refuses)
  boxes of a bad shape (Tensor[K, 4]; list of Tensor[L, 3]) are refused
  gradcheck in eager mode, non-contiguous input, repr of RoIAlign ................. elsewhere
  (brief) output_size as int / pair / list / 0 (and its backward), channels-last, bfloat16
MultiScaleRoIAlign
  repr and fx leaf-ness: torchvision's own module, the substitution does not touch them
  (brief) with detcore's roi_align in torchvision.ops.poolers: equal output over a 4-level
    pyramid (boxes mapped to >= 3 levels) and one level; torch.jit.script compiles detcore's op in

Expected differences (detcore refuses, each tested for a clear OpArgumentError):
  - sampling_ratio > 128, adaptive grids over 16384 samples/bin, NaN/inf rois, spatial_scale not a
    finite number > 0, NaN/inf iou_threshold: torchvision would run for hours, exhaust memory or
    return garbage (README).
  - a batch index outside [0, N) (torchvision reads out of bounds), an output_size of 3 entries
    (torchvision silently drops the third).
  - bad box shapes: torchvision raises AssertionError (torch._assert), detcore OpArgumentError, a
    ValueError and a RuntimeError; an ``except AssertionError`` no longer catches it.
Expected differences in values:
  - low precision: torchvision's CPU kernels refuse float16 NMS and bfloat16 ROIAlign and compute
    float16 ROIAlign in float16; detcore computes in float32. NMS is therefore compared with
    torchvision's float32 NMS of the same exactly representable values (no borderline IoU to flip;
    only torchvision's CUDA half NMS computes IoU in half), ROIAlign within half tolerance.
  - torchvision's batched_nms (< 4000 boxes) offsets bfloat16 boxes in bfloat16, rounding them;
    detcore equals its per-category loop there.
  - quantized ROIAlign: torchvision sums raw integers and requantizes; detcore dequantizes, runs the
    float kernel, requantizes: within one quantization step (exact at scale 1, zero point 0).
  - feature_extraction names the pooling node "layer" (torchvision's registered leaf module) or
    "layer.roi_align" (detcore's wrapped leaf function); the node count is the same.
"""
import math

import pytest
import torch
from torch.autograd import gradcheck

import detcore.layers as dc
from detcore.layers import OpArgumentError

tv = pytest.importorskip("torchvision")
from torchvision.models.feature_extraction import get_graph_node_names  # noqa: E402
from torchvision.ops import boxes as tv_boxes  # noqa: E402
from torchvision.ops import poolers as tv_poolers  # noqa: E402

pytestmark = [
    pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor:UserWarning"),
    pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:FutureWarning"),
]


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _both_errors(call):
    """`call` raises, and both a RuntimeError and a ValueError handler would catch it."""
    with pytest.raises(RuntimeError) as caught:
        call()
    assert isinstance(caught.value, ValueError), type(caught.value).__mro__
    assert isinstance(caught.value, OpArgumentError), type(caught.value).__mro__
    return caught.value


# ------------------------------------------------------------------------------------------------
# NMS
# ------------------------------------------------------------------------------------------------
def _boxes_with_a_pair_just_over(n, iou_threshold, seed, dtype=torch.float32):
    """n random boxes; the last is the first one stretched to the right until their IoU is a hair
    above `iou_threshold`, so one of the two must go when the other is kept."""
    g = _gen(seed)
    corner = torch.rand(n, 2, generator=g) * 100
    size = torch.rand(n, 2, generator=g) * 100
    boxes = torch.cat([corner, corner + size], dim=1)
    target = iou_threshold + 1e-5
    width = float(boxes[0, 2] - boxes[0, 0])
    stretched = boxes[0].clone()
    stretched[2] += width * (1 - target) / target  # IoU = width / (width + stretch)
    boxes[-1] = stretched
    scores = torch.rand(n, generator=g)
    return boxes.to(dtype), scores.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("iou", [0.2, 0.5, 0.8])
def test_nms_equals_torchvision_with_a_pair_just_over_the_threshold(iou, seed, dtype):
    boxes, scores = _boxes_with_a_pair_just_over(1000, iou, seed, dtype)
    expected = tv.ops.nms(boxes, scores, iou)
    got = dc.nms(boxes, scores, iou)
    assert got.dtype == torch.int64
    assert torch.equal(got, expected)
    # The planted pair really is decided: never both kept.
    kept = set(got.tolist())
    assert not {0, len(boxes) - 1} <= kept


@pytest.mark.parametrize(
    "boxes, scores",
    [
        (torch.rand(4), torch.rand(3)),  # boxes not 2-D
        (torch.rand(3, 5), torch.rand(3)),  # 5 coordinates
        (torch.rand(3, 4), torch.rand(3, 2)),  # scores not 1-D
        (torch.rand(3, 4), torch.rand(4)),  # lengths differ
        (torch.rand(3, 4), torch.rand(3).double()),  # dtypes differ
        (torch.randint(0, 9, (3, 4)), torch.rand(3)),  # integer boxes
    ],
)
def test_nms_bad_input_is_an_error_both_handlers_catch(boxes, scores):
    with pytest.raises(RuntimeError):
        tv.ops.nms(boxes, scores, 0.5)
    _both_errors(lambda: dc.nms(boxes, scores, 0.5))
    with pytest.raises(ValueError):
        dc.nms(boxes, scores, 0.5)


def test_op_argument_error_is_both_value_and_runtime_error():
    assert issubclass(OpArgumentError, ValueError)
    assert issubclass(OpArgumentError, RuntimeError)


def _exact_low_precision_detections(n, seed):
    """Integer coordinates <= 256 and scores k/256: exact in float16 and bfloat16 alike."""
    g = _gen(seed)
    corner = torch.randint(0, 64, (n, 2), generator=g)  # crowded: every threshold matters
    size = torch.randint(8, 57, (n, 2), generator=g)
    boxes = torch.cat([corner, corner + size], dim=1).float()
    scores = (torch.randperm(n, generator=g) + 1).float() / 256
    return boxes, scores


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("iou", [0.2, 0.5, 0.8])
def test_nms_low_precision_equals_torchvision_float32_of_the_same_values(dtype, iou):
    boxes, scores = _exact_low_precision_detections(250, seed=int(iou * 10))
    low_boxes, low_scores = boxes.to(dtype), scores.to(dtype)
    assert torch.equal(low_boxes.float(), boxes) and torch.equal(low_scores.float(), scores)
    expected = tv.ops.nms(boxes, scores, iou)
    got = dc.nms(low_boxes, low_scores, iou)
    assert got.dtype == torch.int64
    assert torch.equal(got, expected)
    idxs = torch.randint(0, 4, (len(boxes),), generator=_gen(5))
    assert torch.equal(
        dc.batched_nms(low_boxes, low_scores, idxs, iou), tv.ops.batched_nms(boxes, scores, idxs, iou)
    )


def test_nms_float16_keeps_what_float32_keeps():
    # Three large, nearly identical boxes (IoU ~0.97) at threshold 0.2: only the best survives.
    boxes = torch.tensor(
        [
            [301.25, 170.5, 1180.0, 840.75],
            [299.5, 173.25, 1178.5, 842.0],
            [296.0, 181.0, 1176.25, 838.5],
        ]
    )
    scores = torch.tensor([0.625, 0.75, 0.4375])
    keep32 = tv.ops.nms(boxes, scores, 0.2)
    assert keep32.tolist() == [1]
    assert torch.equal(dc.nms(boxes.half(), scores.half(), 0.2), keep32)
    assert torch.equal(dc.nms(boxes, scores, 0.2), keep32)


@pytest.mark.parametrize("scale, zero_point", [(1.0, 0), (2.0, 50), (3.0, 10)])
@pytest.mark.parametrize("iou", [0.2, 0.5, 0.8])
def test_quantized_nms_equals_torchvision(iou, scale, zero_point):
    boxes, scores = _boxes_with_a_pair_just_over(1000, iou, seed=7)
    qboxes = torch.quantize_per_tensor(boxes, scale, zero_point, torch.quint8)
    qscores = torch.quantize_per_tensor(scores * 100, scale, zero_point, torch.quint8)
    expected = tv.ops.nms(qboxes, qscores, iou)
    # torchvision's own property: the same as NMS of the dequantized values (scores tie a lot).
    assert torch.equal(expected, tv.ops.nms(qboxes.dequantize(), qscores.dequantize(), iou))
    got = dc.nms(qboxes, qscores, iou)
    assert got.dtype == torch.int64
    assert torch.equal(got, expected)


@pytest.mark.parametrize("qdtype", [torch.qint8, torch.qint32])
def test_quantized_nms_other_integer_types(qdtype):
    boxes, scores = _boxes_with_a_pair_just_over(300, 0.5, seed=8)
    qboxes = torch.quantize_per_tensor(boxes - 60, 1.0, 0, qdtype)  # some negative coordinates
    qscores = torch.quantize_per_tensor(scores * 100, 1.0, 0, qdtype)
    assert torch.equal(dc.nms(qboxes, qscores, 0.5), tv.ops.nms(qboxes, qscores, 0.5))


def _torchvision_style_batched(seed, n=1000):
    """Every box spans [<1, >10] on both axes, so most pairs overlap heavily."""
    g = _gen(seed)
    boxes = torch.cat([torch.rand(n, 2, generator=g), torch.rand(n, 2, generator=g) + 10], dim=1)
    scores = torch.rand(n, generator=g)
    idxs = torch.randint(0, 4, (n,), generator=g)
    return boxes, scores, idxs


@pytest.mark.parametrize("seed", range(3))
def test_batched_nms_equals_both_torchvision_implementations(seed):
    boxes, scores, idxs = _torchvision_style_batched(seed)
    got = dc.batched_nms(boxes, scores, idxs, 0.9)
    assert torch.equal(got, tv_boxes._batched_nms_vanilla(boxes, scores, idxs, 0.9))
    assert torch.equal(got, tv_boxes._batched_nms_coordinate_trick(boxes, scores, idxs, 0.9))
    assert torch.equal(got, tv.ops.batched_nms(boxes, scores, idxs, 0.9))


def _spread_detections(n, seed):
    g = _gen(seed)
    corner = torch.rand(n, 2, generator=g) * 60
    boxes = torch.cat([corner, corner + 5 + torch.rand(n, 2, generator=g) * 30], dim=1)
    return boxes, torch.rand(n, generator=g)


def test_batched_nms_bool_category_ids():
    boxes, scores = _spread_detections(300, seed=11)
    idxs = torch.rand(300, generator=_gen(12)) > 0.5
    expected = tv.ops.batched_nms(boxes, scores, idxs, 0.5)
    assert torch.equal(dc.batched_nms(boxes, scores, idxs, 0.5), expected)
    # Two categories: fewer suppressions than one category would have.
    assert len(expected) > len(tv.ops.nms(boxes, scores, 0.5))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_batched_nms_integer_valued_float_ids_as_torchvision(dtype):
    boxes, scores = _spread_detections(300, seed=13)
    idxs = torch.randint(0, 5, (300,), generator=_gen(14)).to(dtype)
    expected = tv.ops.batched_nms(boxes, scores, idxs, 0.5)
    assert torch.equal(dc.batched_nms(boxes, scores, idxs, 0.5), expected)
    assert torch.equal(expected, dc.batched_nms(boxes, scores, idxs.long(), 0.5))


def test_batched_nms_fractional_float_ids_are_distinct_categories():
    # Every distinct value is its own category (torchvision's per-category loop; its offset trick
    # only separates categories whose ids differ by at least 1).
    boxes, scores = _spread_detections(300, seed=15)
    table = torch.tensor([-1.5, 0.0, 0.25, 0.5, 7.75])
    idxs = table[torch.randint(0, 5, (300,), generator=_gen(16))]
    expected = tv_boxes._batched_nms_vanilla(boxes, scores, idxs, 0.5)
    assert torch.equal(dc.batched_nms(boxes, scores, idxs, 0.5), expected)
    relabelled = torch.unique(idxs, return_inverse=True)[1]
    assert torch.equal(expected, tv.ops.batched_nms(boxes, scores, relabelled, 0.5))


# ------------------------------------------------------------------------------------------------
# RoIAlign
# ------------------------------------------------------------------------------------------------
ROIS_ON_10X10 = [
    [0, 0, 0, 9, 9], [0, 0, 5, 4, 9], [0, 5, 5, 9, 9], [1, 0, 0, 9, 9], [1, 2.5, 1.25, 7.5, 3.0]
]


def _pair_of_maps(dtype, contiguous, seed=0, channels=50, size=10):
    x = torch.rand(2, channels, size, size, generator=_gen(seed), dtype=torch.float64).to(dtype)
    if not contiguous:
        x = x.permute(0, 1, 3, 2)
        assert not x.is_contiguous()
    return x


@pytest.mark.parametrize("sampling_ratio", [-1, -2, 0, 2])
@pytest.mark.parametrize("aligned", [False, True])
@pytest.mark.parametrize("contiguous", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_roi_align_forward_equals_torchvision(dtype, contiguous, aligned, sampling_ratio):
    x = _pair_of_maps(dtype, contiguous)
    rois = torch.tensor(ROIS_ON_10X10, dtype=dtype)
    expected = tv.ops.RoIAlign((5, 5), 1.0, sampling_ratio, aligned)(x, rois)
    got = dc.RoIAlign((5, 5), 1.0, sampling_ratio, aligned)(x, rois)
    assert got.dtype == dtype and got.shape == expected.shape
    tol = 1e-6 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(got, expected, rtol=tol, atol=tol)
    functional = dc.roi_align(x, rois, 5, 1.0, sampling_ratio, aligned)
    torch.testing.assert_close(functional, got, rtol=0, atol=0)


@pytest.mark.parametrize("output_size", [3, (3, 3), [3, 3], (2, 4)])
def test_roi_align_output_size_forms(output_size):
    x = _pair_of_maps(torch.float32, True, seed=1, channels=3)
    rois = torch.tensor(ROIS_ON_10X10)
    expected = tv.ops.roi_align(x, rois, output_size, 0.5, 2, True)
    got = dc.roi_align(x, rois, output_size, 0.5, 2, True)
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("aligned", [False, True])
@pytest.mark.parametrize("contiguous", [True, False])
def test_roi_align_float16_forward_within_torchvision_half_tolerance(contiguous, aligned):
    x32 = _pair_of_maps(torch.float32, contiguous, seed=2)
    x16 = x32.half()
    rois = torch.tensor(ROIS_ON_10X10)
    got = dc.roi_align(x16, rois.half(), 5, 1.0, -1, aligned)
    assert got.dtype == torch.float16
    # torchvision computes in half: within its own test's tolerance for values in [0, 1).
    theirs = tv.ops.roi_align(x16, rois.half(), 5, 1.0, -1, aligned)
    torch.testing.assert_close(got, theirs, rtol=5e-3, atol=5e-3)
    # detcore computes in float32: the float32 result of the same values, rounded once.
    in_float = tv.ops.roi_align(x16.float(), rois.half().float(), 5, 1.0, -1, aligned)
    torch.testing.assert_close(got, in_float.half())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_roi_align_low_precision_backward(dtype):
    x32 = _pair_of_maps(torch.float32, True, seed=3, channels=4)
    x = x32.to(dtype).requires_grad_(True)
    rois = torch.tensor(ROIS_ON_10X10)
    out = dc.roi_align(x, rois.to(dtype), 3, 1.0, 2, True)
    assert out.dtype == dtype
    grad_out = torch.rand(out.shape, generator=_gen(4)).to(dtype)
    out.backward(grad_out)
    assert x.grad.dtype == dtype and x.grad.shape == x.shape
    ref_x = x.detach().float().requires_grad_(True)
    ref = tv.ops.roi_align(ref_x, rois.to(dtype).float(), 3, 1.0, 2, True)
    ref.backward(grad_out.float())
    torch.testing.assert_close(out.float(), ref.detach(), rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(x.grad.float(), ref_x.grad, rtol=1e-2, atol=1e-2)
    if dtype == torch.float16:  # torchvision has a CPU half backward; bfloat16 it refuses
        tv_x = x.detach().clone().requires_grad_(True)
        tv.ops.roi_align(tv_x, rois.half(), 3, 1.0, 2, True).backward(grad_out)
        torch.testing.assert_close(x.grad, tv_x.grad, rtol=5e-3, atol=5e-3)


@pytest.mark.parametrize("output_size", [(0, 3), (3, 0), 0])
def test_roi_align_output_size_zero_forward_and_backward(output_size):
    x = _pair_of_maps(torch.float32, True, seed=5, channels=3).requires_grad_(True)
    rois = torch.tensor(ROIS_ON_10X10)
    expected = tv.ops.roi_align(x, rois, output_size, 1.0, -1, False)
    got = dc.roi_align(x, rois, output_size, 1.0, -1, False)
    assert got.shape == expected.shape and got.numel() == 0 and got.dtype == x.dtype
    got.sum().backward()
    assert x.grad is not None and x.grad.shape == x.shape
    assert torch.equal(x.grad, torch.zeros_like(x))


@pytest.mark.parametrize("num_rois", [3, 40])
def test_roi_align_channels_last_forward_and_backward(num_rois):
    g = _gen(6)
    x = torch.randn(2, 16, 12, 14, generator=g).contiguous(memory_format=torch.channels_last)
    corner = torch.rand(num_rois, 2, generator=g) * 10
    size = 1 + torch.rand(num_rois, 2, generator=g) * 6
    image = torch.randint(0, 2, (num_rois, 1), generator=g).float()
    rois = torch.cat([image, corner, corner + size], dim=1)
    grad_out = torch.randn(num_rois, 16, 3, 4, generator=g)
    results = []
    for fn in (tv.ops.roi_align, dc.roi_align):
        xi = x.detach().clone(memory_format=torch.channels_last).requires_grad_(True)
        out = fn(xi, rois, (3, 4), 1.0, 0, True)
        out.backward(grad_out)
        results.append((out.detach(), xi.grad))
    (tv_out, tv_grad), (dc_out, dc_grad) = results
    torch.testing.assert_close(dc_out, tv_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dc_grad, tv_grad, rtol=1e-5, atol=1e-5)


def _backward_setup(seed, contiguous):
    x = torch.rand(1, 8, 5, 5, generator=_gen(seed), dtype=torch.float64)
    if not contiguous:
        x = x.permute(0, 1, 3, 2)
    rois = torch.tensor([[0, 0, 0, 4, 4], [0, 0, 2, 3, 4], [0, 2, 2, 4, 4]], dtype=torch.float64)
    return x.requires_grad_(True), rois


@pytest.mark.parametrize("contiguous", [True, False])
def test_roi_align_gradients_equal_torchvision_and_pass_gradcheck_when_scripted(contiguous):
    x, rois = _backward_setup(9, contiguous)
    grad_out = torch.rand(3, 8, 2, 2, generator=_gen(10), dtype=torch.float64)
    (tv_grad,) = torch.autograd.grad(tv.ops.roi_align(x, rois, 2, 1.0, 1), x, grad_out)
    (dc_grad,) = torch.autograd.grad(dc.roi_align(x, rois, 2, 1.0, 1), x, grad_out)
    torch.testing.assert_close(dc_grad, tv_grad, rtol=1e-12, atol=1e-12)
    scripted = torch.jit.script(dc.roi_align)
    assert gradcheck(lambda z: scripted(z, rois, 2, 1.0, 1), (x,), atol=1e-5)


def test_roi_align_under_deterministic_algorithms():
    x, rois = _backward_setup(11, True)
    grad_out = torch.rand(3, 8, 3, 3, generator=_gen(12), dtype=torch.float64)
    (free,) = torch.autograd.grad(dc.roi_align(x, rois, 3, 1.0, -1, True), x, grad_out)
    previous = torch.are_deterministic_algorithms_enabled()
    previous_warn = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        out = dc.roi_align(x, rois, 3, 1.0, -1, True)
        (strict,) = torch.autograd.grad(out, x, grad_out)
    finally:
        torch.use_deterministic_algorithms(previous, warn_only=previous_warn)
    torch.testing.assert_close(out, tv.ops.roi_align(x, rois, 3, 1.0, -1, True), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(strict, free, rtol=0, atol=0)


class _Holds(torch.nn.Module):
    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, features, rois):
        return self.layer(features, rois)


def test_roi_align_module_is_a_single_fx_node_like_torchvision():
    ours = get_graph_node_names(_Holds(dc.RoIAlign((5, 5), 1.0, -1)))
    theirs = get_graph_node_names(_Holds(tv.ops.RoIAlign((5, 5), 1.0, -1)))
    assert ours[0] == ours[1]
    assert len(ours[0]) == len(theirs[0]) == 3  # two inputs and the pooling
    assert ours[0][:2] == theirs[0][:2] == ["features", "rois"]
    assert ours[0][2].startswith(theirs[0][2])  # "layer.roi_align" for "layer", see the docstring


def test_roi_align_module_fx_trace_equals_eager_and_torchvision():
    module = dc.RoIAlign((5, 5), 1.0, -1)
    traced = torch.fx.symbolic_trace(module)
    x = torch.rand(2, 50, 5, 5, generator=_gen(13))
    rois = torch.tensor(ROIS_ON_10X10)  # partly outside the 5x5 maps
    eager = module(x, rois)
    assert traced(x, rois).dtype == x.dtype
    torch.testing.assert_close(traced(x, rois), eager, rtol=0, atol=0)
    torch.testing.assert_close(eager, tv.ops.RoIAlign((5, 5), 1.0, -1)(x, rois), rtol=1e-6, atol=1e-6)


class _PoolsBoxList(torch.nn.Module):
    def __init__(self, pool):
        super().__init__()
        self.pool = pool

    def forward(self, images: torch.Tensor, boxes: list[torch.Tensor]) -> torch.Tensor:
        return self.pool(images, boxes)


def test_scripted_module_with_a_list_of_boxes_like_torchvision():
    x = torch.rand(2, 1, 10, 10, generator=_gen(14))
    per_image = torch.tensor(ROIS_ON_10X10)[:, 1:]  # five boxes for each image
    boxes = [per_image, per_image.flip(0)]
    settings = dict(output_size=[3, 3], spatial_scale=1.0, sampling_ratio=-1)
    ours = torch.jit.script(_PoolsBoxList(dc.RoIAlign(**settings)))
    theirs = torch.jit.script(_PoolsBoxList(tv.ops.RoIAlign(**settings)))
    got = ours(x, boxes)
    assert got.shape == (10, 1, 3, 3)
    torch.testing.assert_close(got, theirs(x, boxes), rtol=1e-6, atol=1e-6)


def _quantized_case(qdtype, scale, zero_point, seed, images=1):
    g = _gen(seed)
    x = torch.randint(50, 100, (images, 2, 10, 10), generator=g).float()
    rois = torch.randint(0, 5, (200, 5), generator=g).float()
    rois[:, 0] = torch.randint(0, images, (200,), generator=g).float()
    rois[:, 3:] += rois[:, 1:3]  # x2 >= x1, y2 >= y1
    qx = torch.quantize_per_tensor(x, scale, zero_point, qdtype)
    qrois = torch.quantize_per_tensor(rois, scale, zero_point, qdtype)
    return qx, qrois


@pytest.mark.parametrize("aligned", [False, True])
@pytest.mark.parametrize("scale, zero_point", [(1.0, 0), (2.0, 10), (0.1, 50)])
@pytest.mark.parametrize("qdtype", [torch.qint8, torch.quint8, torch.qint32])
def test_quantized_roi_align_within_one_step_of_torchvision(qdtype, scale, zero_point, aligned):
    qx, qrois = _quantized_case(qdtype, scale, zero_point, seed=17)
    expected = tv.ops.roi_align(qx, qrois, 5, 1.0, -1, aligned)
    got = dc.roi_align(qx, qrois, 5, 1.0, -1, aligned)
    assert got.is_quantized and got.dtype == expected.dtype == qdtype
    assert got.shape == expected.shape
    assert got.q_scale() == qx.q_scale() and got.q_zero_point() == qx.q_zero_point()
    steps = (got.int_repr().long() - expected.int_repr().long()).abs()
    assert steps.max() <= 1
    assert steps.count_nonzero() / steps.numel() < 0.05
    if (scale, zero_point) == (1.0, 0):  # whole numbers throughout: no rounding to disagree on
        assert torch.equal(got.int_repr(), expected.int_repr())


def test_quantized_roi_align_with_several_images():
    qx, qrois = _quantized_case(torch.quint8, 1.0, 0, seed=18, images=2)
    with pytest.raises(RuntimeError):  # torchvision's kernel reads image 0 only, so it refuses
        tv.ops.roi_align(qx, qrois, 5)
    try:
        got = dc.roi_align(qx, qrois, 5)
    except RuntimeError as error:  # refusing, as torchvision does, is compatible; not dispatching is not
        assert not isinstance(error, NotImplementedError), str(error)[:200]
        return
    # Accepting is fine too, if every roi pools its own image.
    for image in range(2):
        mine = qrois.dequantize()[:, 0] == image
        single = torch.quantize_per_tensor(qx.dequantize()[image : image + 1], 1.0, 0, torch.quint8)
        rois = qrois.dequantize()[mine]
        rois[:, 0] = 0  # the same boxes on a batch of that one image
        rois_single = torch.quantize_per_tensor(rois, 1.0, 0, torch.quint8)
        expected = tv.ops.roi_align(single, rois_single, 5)
        assert (got[mine].int_repr().long() - expected.int_repr().long()).abs().max() <= 1


def test_bad_box_shapes_are_refused():
    x = torch.linspace(1, 64, 64).reshape(1, 1, 8, 8)
    four_columns = torch.tensor([[0.0, 0.0, 3.0, 3.0]])
    three_columns = [torch.tensor([[0.0, 0.0, 3.0]])]
    for boxes in (four_columns, three_columns):
        with pytest.raises(AssertionError):  # torch._assert in torchvision
            tv.ops.roi_align(x, boxes, output_size=(2, 2))
        _both_errors(lambda: dc.roi_align(x, boxes, output_size=(2, 2)))


@pytest.mark.parametrize(
    "case",
    ["3-D input", "rois dtype differs", "negative output_size", "empty list"],
)
def test_roi_align_errors_torchvision_users_catch_still_catch(case):
    x = torch.rand(2, 3, 8, 8)
    rois = torch.tensor([[0, 1.0, 1.0, 5.0, 5.0]])
    call = {
        "3-D input": lambda m: m.roi_align(x[0], rois, 2),
        "rois dtype differs": lambda m: m.roi_align(x, rois.double(), 2),
        "negative output_size": lambda m: m.roi_align(x, rois, (-1, 2)),
        "empty list": lambda m: m.roi_align(x, [], 2),
    }[case]
    with pytest.raises(Exception) as theirs:
        call(tv.ops)
    error = _both_errors(lambda: call(dc))
    assert isinstance(error, type(theirs.value))  # torchvision raises RuntimeError or ValueError here


# ------------------------------------------------------------------------------------------------
# Autocast on the CPU (torchvision's autocast tests run on CUDA)
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("x_dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rois_dtype", [torch.float32, torch.bfloat16])
def test_autocast_cpu_roi_align_dtype_and_values_like_torchvision(x_dtype, rois_dtype):
    x = _pair_of_maps(torch.float32, False, seed=19, channels=4).to(x_dtype)
    rois = torch.tensor(ROIS_ON_10X10).to(rois_dtype)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = tv.ops.roi_align(x, rois, 3, 1.0, 2, True)
        got = dc.roi_align(x, rois, 3, 1.0, 2, True)
    assert got.dtype == expected.dtype == x_dtype
    torch.testing.assert_close(got, expected)


def test_autocast_cpu_nms_like_torchvision():
    boxes, scores = _exact_low_precision_detections(200, seed=20)
    idxs = torch.randint(0, 3, (200,), generator=_gen(21))
    for dtype in (torch.float32, torch.bfloat16):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            b, s = boxes.to(dtype), scores.to(dtype)
            assert torch.equal(dc.nms(b, s, 0.5), tv.ops.nms(b, s, 0.5))
            # torchvision's per-category loop: its offset trick (used below 4000 boxes) shifts
            # bfloat16 boxes in bfloat16, which rounds them (see the docstring).
            assert torch.equal(
                dc.batched_nms(b, s, idxs, 0.5), tv_boxes._batched_nms_vanilla(b, s, idxs, 0.5)
            )


# ------------------------------------------------------------------------------------------------
# Deliberate refusals (README): torchvision accepts, detcore raises a clear OpArgumentError
# ------------------------------------------------------------------------------------------------
def test_refused_sampling_ratio_over_128():
    x = torch.rand(1, 2, 8, 8)
    rois = torch.tensor([[0, 1.0, 1.0, 5.0, 5.0]])
    assert tv.ops.roi_align(x, rois, 2, 1.0, 129).shape == (1, 2, 2, 2)
    error = _both_errors(lambda: dc.roi_align(x, rois, 2, 1.0, 129))
    assert "sampling_ratio must be at most 128" in str(error)


def test_refused_adaptive_grid_over_16384_samples_per_bin():
    # Not run on torchvision: it would take minutes.
    x = torch.rand(1, 2, 8, 8)
    huge = torch.tensor([[0, 0.0, 0.0, 1e6, 1e6]])
    error = _both_errors(lambda: dc.roi_align(x, huge, 7, 1.0, 0))
    assert "16384" in str(error)
    assert dc.roi_align(x, huge, 7, 1.0, 2).shape == (1, 2, 7, 7)  # a fixed grid is fine


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_refused_non_finite_rois(bad):
    x = torch.rand(1, 2, 8, 8)
    rois = torch.tensor([[0, 1.0, 1.0, 5.0, 5.0], [0, 1.0, 2.0, bad, 5.0]])
    error = _both_errors(lambda: dc.roi_align(x, rois, 2, 1.0, 2))
    assert "rois must be finite" in str(error)


@pytest.mark.parametrize("scale", [math.nan, math.inf, 0.0, -0.5])
def test_refused_spatial_scale_not_finite_positive(scale):
    x = torch.rand(1, 2, 8, 8)
    rois = torch.tensor([[0, 1.0, 1.0, 5.0, 5.0]])
    if math.isfinite(scale):  # torchvision runs it (its infinite case is left out: slow)
        assert tv.ops.roi_align(x, rois, 2, scale, 2).shape == (1, 2, 2, 2)
    error = _both_errors(lambda: dc.roi_align(x, rois, 2, scale, 2))
    assert "spatial_scale must be a finite number > 0" in str(error)


@pytest.mark.parametrize("threshold", [math.nan, math.inf, -math.inf])
def test_refused_non_finite_iou_threshold(threshold):
    boxes = torch.tensor([[0.0, 0.0, 10.0, 10.0], [1.0, 1.0, 11.0, 11.0]])
    scores = torch.tensor([0.9, 0.8])
    assert tv.ops.nms(boxes, scores, threshold).dtype == torch.int64
    error = _both_errors(lambda: dc.nms(boxes, scores, threshold))
    assert "iou_threshold must be a finite number" in str(error)
    error = _both_errors(lambda: dc.batched_nms(boxes, scores, torch.tensor([0, 1]), threshold))
    assert "iou_threshold must be a finite number" in str(error)


def test_refused_batch_index_out_of_range_and_three_entry_output_size():
    # Not run on torchvision: it reads outside the input for the first, ignores the extra entry
    # for the second.
    x = torch.rand(2, 2, 8, 8)
    outside = torch.tensor([[2.0, 1.0, 1.0, 5.0, 5.0]])
    assert "rois" in str(_both_errors(lambda: dc.roi_align(x, outside, 2)))
    rois = torch.tensor([[0, 1.0, 1.0, 5.0, 5.0]])
    assert "output_size" in str(_both_errors(lambda: dc.roi_align(x, rois, (2, 2, 2))))


# ------------------------------------------------------------------------------------------------
# torchvision's MultiScaleRoIAlign with detcore's roi_align in it
# ------------------------------------------------------------------------------------------------
def _pyramid(seed, levels=("p2", "p3", "p4", "p5"), image_hw=(480, 640), images=2):
    g = _gen(seed)
    h, w = image_hw
    features = {
        name: torch.randn(images, 8, h // 2 ** (i + 2), w // 2 ** (i + 2), generator=g)
        for i, name in enumerate(levels)
    }
    boxes = []
    for _ in range(images):
        side = torch.exp(torch.empty(30).uniform_(math.log(12), math.log(460), generator=g))
        corner = torch.rand(30, 2, generator=g) * torch.tensor([w - 12.0, h - 12.0])
        aspect = torch.empty(30).uniform_(0.5, 2.0, generator=g)
        size = torch.stack([side * aspect.sqrt(), side / aspect.sqrt()], dim=1)
        boxes.append(torch.cat([corner, corner + size], dim=1))
    return features, boxes, [image_hw] * images


@pytest.fixture
def detcore_in_torchvision_poolers(monkeypatch):
    """torchvision.ops.poolers with detcore's roi_align, counting the calls; TorchScript's cache
    of the compiled pooler function is put back afterwards so no other test sees detcore's."""
    calls = []

    def counting(*args, **kwargs):
        calls.append(1)
        return dc.roi_align(*args, **kwargs)

    cache = torch.jit._state._jit_caching_layer
    fn = tv_poolers._multiscale_roi_align
    cached = cache.get(fn)
    monkeypatch.setattr(tv_poolers, "roi_align", counting)
    yield calls
    if cached is None:
        cache.pop(fn, None)
    else:
        cache[fn] = cached


@pytest.mark.parametrize("sampling_ratio", [2, -1])
def test_multiscale_roi_align_with_detcore_equals_torchvision(
    detcore_in_torchvision_poolers, sampling_ratio
):
    features, boxes, image_shapes = _pyramid(seed=22)
    patched = tv.ops.MultiScaleRoIAlign(list(features), 7, sampling_ratio)
    got = patched(features, boxes, image_shapes)
    assert len(detcore_in_torchvision_poolers) == 4  # one call per level: detcore did the work
    levels = patched.map_levels(boxes)
    assert len(torch.unique(levels)) >= 3  # the boxes really spread over the pyramid
    with pytest.MonkeyPatch.context() as undo:
        undo.setattr(tv_poolers, "roi_align", tv.ops.roi_align)
        unpatched = tv.ops.MultiScaleRoIAlign(list(features), 7, sampling_ratio)
        expected = unpatched(features, boxes, image_shapes)
    assert got.shape == expected.shape == (60, 8, 7, 7)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_multiscale_roi_align_single_level_with_detcore(detcore_in_torchvision_poolers):
    features, boxes, image_shapes = _pyramid(seed=23, levels=("p3",))
    got = tv.ops.MultiScaleRoIAlign(["p3"], (5, 4), 0)(features, boxes, image_shapes)
    assert len(detcore_in_torchvision_poolers) == 1
    scale = features["p3"].shape[-1] / 640  # the pooler infers it from the map and image widths
    expected = tv.ops.roi_align(features["p3"], boxes, (5, 4), scale, 0)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


class _FreshPooler(tv.ops.MultiScaleRoIAlign):
    """torchvision's MultiScaleRoIAlign, unchanged. A class of its own, because TorchScript keeps
    one compiled type per class: scripting torchvision's own class here would reuse a type compiled
    earlier (bound to torchvision's op) or leave one bound to detcore's for later tests."""


def test_multiscale_roi_align_with_detcore_scripts(monkeypatch, detcore_in_torchvision_poolers):
    monkeypatch.setattr(tv_poolers, "roi_align", dc.roi_align)  # TorchScript needs the real function
    # Compile the pooling function afresh (the fixture puts the cached one back afterwards).
    torch.jit._state._jit_caching_layer.pop(tv_poolers._multiscale_roi_align, None)
    features, boxes, image_shapes = _pyramid(seed=24)
    scripted = torch.jit.script(_FreshPooler(list(features), 7, 2))
    graph = scripted.forward.graph.copy()
    torch._C._jit_pass_inline(graph)
    assert "detcore::roi_align" in str(graph) and "torchvision::roi_align" not in str(graph)
    got = scripted(features, boxes, image_shapes)
    with pytest.MonkeyPatch.context() as undo:
        undo.setattr(tv_poolers, "roi_align", tv.ops.roi_align)
        expected = tv.ops.MultiScaleRoIAlign(list(features), 7, 2)(features, boxes, image_shapes)
    assert got.shape == (60, 8, 7, 7)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
