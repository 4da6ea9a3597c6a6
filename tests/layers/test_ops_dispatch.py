"""The ops through the PyTorch dispatcher: torch.ops.detcore.*, fake kernels (torch.compile,
FakeTensorMode, meta), TorchScript, and the Autocast kernels."""
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from detcore.layers import OpArgumentError, ROIAlign, batched_nms, deform_conv2d, nms, roi_align, roi_pool

try:
    from .reference_ops import distinct_scores, nms_reference, random_boxes, roi_align_reference
except ImportError:  # tests/ run as rootdir-relative modules, without packages
    from reference_ops import distinct_scores, nms_reference, random_boxes, roi_align_reference


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def _detection_inputs(seed=0, n=400):
    g = _gen(seed)
    boxes = random_boxes(n, g, xy_max=300.0, wh_range=(10.0, 80.0))
    scores = distinct_scores(n, g)
    idxs = torch.randint(0, 5, (n,), generator=g)
    features = torch.randn(2, 4, 24, 32, generator=g)  # a stride-16 map of a 384x512 image
    rois = torch.cat([torch.randint(0, 2, (n, 1), generator=g).float(), boxes], dim=1)
    return boxes, scores, idxs, features, rois


@pytest.mark.parametrize(
    "name",
    [
        "nms", "batched_nms", "roi_align", "_roi_align_backward", "roi_pool", "_roi_pool_backward",
        "deform_conv2d", "_deform_conv2d_backward", "sigmoid_focal_loss", "_sigmoid_focal_loss_backward",
    ],
)
def test_ops_are_registered(name):
    op = getattr(torch.ops.detcore, name)
    assert op.default._schema.name == f"detcore::{name}"


def test_op_calls_equal_the_python_functions():
    boxes, scores, idxs, features, rois = _detection_inputs(1)
    assert torch.equal(torch.ops.detcore.nms(boxes, scores, 0.5), nms(boxes, scores, 0.5))
    assert torch.equal(
        torch.ops.detcore.batched_nms(boxes, scores, idxs, 0.5),
        batched_nms(boxes, scores, idxs, 0.5),
    )
    assert torch.equal(
        torch.ops.detcore.roi_align(features, rois, 1 / 16, 7, 6, 2, True),
        roi_align(features, rois, (7, 6), 1 / 16, 2, True),
    )


def test_backward_op_equals_autograd():
    _, _, _, features, rois = _detection_inputs(2, n=30)
    x = features.clone().requires_grad_(True)
    out = roi_align(x, rois, (3, 5), 1 / 16, 0, False)
    grad_out = torch.randn(out.shape, generator=_gen(3))
    (expected,) = torch.autograd.grad(out, x, grad_out)
    got = torch.ops.detcore._roi_align_backward(
        grad_out, rois, 1 / 16, 3, 5, 2, 4, 24, 32, 0, False
    )
    assert got.shape == x.shape
    torch.testing.assert_close(got, expected)
    ref_out = roi_align_reference(x, rois, (3, 5), 1 / 16, 0, False)
    (ref,) = torch.autograd.grad(ref_out, x, grad_out)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)


def test_fake_tensor_shapes():
    _, _, _, features, rois = _detection_inputs(4, n=9)
    with FakeTensorMode() as mode:
        f = mode.from_tensor(features)
        r = mode.from_tensor(rois)
        out = torch.ops.detcore.roi_align(f, r, 0.25, 7, 5, 2, True)
        assert out.shape == (9, 4, 7, 5) and out.dtype == torch.float32
        g = torch.ops.detcore._roi_align_backward(out, r, 0.25, 7, 5, 2, 4, 24, 32, 2, True)
        assert g.shape == (2, 4, 24, 32)


def test_meta_tensors_give_shapes():
    features = torch.empty(3, 8, 20, 30, device="meta")
    rois = torch.empty(11, 5, device="meta")
    out = torch.ops.detcore.roi_align(features, rois, 0.5, 4, 4, 0, False)
    assert out.shape == (11, 8, 4, 4) and out.device.type == "meta"


def test_opcheck_roi_align():
    # Schema, autograd registration, fake kernel and AOT dispatch, forward and backward.
    _, _, _, features, rois = _detection_inputs(5, n=12)
    x = features.clone().requires_grad_(True)
    x64, rois64 = x.detach().double().requires_grad_(True), rois.double()
    for args in ((x, rois, 1 / 16, 3, 3, 2, True), (x64, rois64, 1 / 8, 2, 4, 0, False)):
        torch.library.opcheck(torch.ops.detcore.roi_align.default, args)


def test_opcheck_nms():
    boxes, scores, idxs, _, _ = _detection_inputs(6, n=50)
    torch.library.opcheck(torch.ops.detcore.nms.default, (boxes, scores, 0.5))
    torch.library.opcheck(torch.ops.detcore.batched_nms.default, (boxes, scores, idxs, 0.5))


def _pipeline(boxes, scores, idxs, features, rois):
    """NMS, then ROIAlign of the survivors: a data-dependent size flows into roi_align."""
    keep = nms(boxes, scores, 0.5)
    per_class = batched_nms(boxes, scores, idxs, 0.6)
    pooled = roi_align(features, rois[keep], (7, 7), 1 / 16, 2, True)
    return keep, per_class, pooled


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_torch_compile_fullgraph(backend):
    inputs = _detection_inputs(7)
    compiled = torch.compile(_pipeline, fullgraph=True, backend=backend)
    expected = _pipeline(*inputs)
    got = compiled(*inputs)
    for a, b in zip(got, expected):
        assert torch.equal(a, b)
    # A second input of another size: no crash, same answers (recompiled or dynamic).
    inputs = _detection_inputs(8, n=250)
    for a, b in zip(compiled(*inputs), _pipeline(*inputs)):
        assert torch.equal(a, b)


def test_torch_compile_backward():
    _, _, _, features, rois = _detection_inputs(9, n=40)

    def loss(x):
        return (roi_align(x, rois, (3, 3), 1 / 16, 2, True) ** 2).sum()

    x1 = features.clone().requires_grad_(True)
    x2 = features.clone().requires_grad_(True)
    loss(x1).backward()
    torch.compile(loss, fullgraph=True, backend="aot_eager")(x2).backward()
    torch.testing.assert_close(x2.grad, x1.grad)


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:FutureWarning")
def test_torchscript():
    @torch.jit.script
    def scripted(boxes: torch.Tensor, scores: torch.Tensor, idxs: torch.Tensor,
                 features: torch.Tensor, rois: torch.Tensor):
        keep = torch.ops.detcore.nms(boxes, scores, 0.5)
        per_class = torch.ops.detcore.batched_nms(boxes, scores, idxs, 0.5)
        pooled = torch.ops.detcore.roi_align(features, rois, 0.0625, 2, 2, 2, True)
        return keep, per_class, pooled

    boxes, scores, idxs, features, rois = _detection_inputs(10)
    keep, per_class, pooled = scripted(boxes, scores, idxs, features, rois)
    assert torch.equal(keep, nms_reference(boxes, scores, 0.5))
    assert torch.equal(per_class, batched_nms(boxes, scores, idxs, 0.5))
    assert torch.equal(pooled, roi_align(features, rois, 2, 0.0625, 2, True))


def test_autocast_cpu_roi_align_float32_features():
    _, _, _, features, rois = _detection_inputs(11, n=30)
    expected = roi_align_reference(features, rois, (4, 4), 1 / 16, 2, True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = roi_align(features, rois, (4, 4), 1 / 16, 2, True)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_autocast_cpu_roi_align_bfloat16_features_and_backward():
    _, _, _, features, rois = _detection_inputs(12, n=30)
    x = features.to(torch.bfloat16).requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = roi_align(x, rois, (4, 4), 1 / 16, 2, True)  # float32 rois with bfloat16 features
    assert out.dtype == torch.bfloat16
    x32 = x.detach().float().requires_grad_(True)
    expected = roi_align_reference(x32, rois, (4, 4), 1 / 16, 2, True)
    torch.testing.assert_close(out.float(), expected, atol=2e-2, rtol=2e-2)
    grad_out = torch.randn(out.shape, generator=_gen(13))
    out.backward(grad_out.to(torch.bfloat16))
    (ref_grad,) = torch.autograd.grad(expected, x32, grad_out.to(torch.bfloat16).float())
    assert x.grad is not None and x.grad.dtype == torch.bfloat16
    torch.testing.assert_close(x.grad.float(), ref_grad, atol=2e-2, rtol=2e-2)


def test_autocast_cpu_nms_runs_in_float32():
    boxes, scores, idxs, _, _ = _detection_inputs(14)
    # bfloat16 values upcast exactly: the answer must be float32 NMS of those same values.
    boxes16 = boxes.to(torch.bfloat16)
    scores16 = scores.to(torch.bfloat16)
    expected = nms(boxes16.float(), scores16.float(), 0.5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = nms(boxes16, scores16, 0.5)
        got_batched = batched_nms(boxes16, scores16, idxs, 0.5)
    assert torch.equal(got, expected)
    assert torch.equal(got_batched, batched_nms(boxes16.float(), scores16.float(), idxs, 0.5))


def test_python_wrappers_can_be_scripted_like_torchvisions():
    """Drop-in parity: torch.jit.script works on the Python functions and the module, not only on torch.ops."""
    g = torch.Generator().manual_seed(3)
    boxes = random_boxes(40, g)
    scores = distinct_scores(40, g)
    idxs = torch.randint(0, 3, (40,), generator=g)
    assert torch.equal(torch.jit.script(nms)(boxes, scores, 0.5), nms(boxes, scores, 0.5))
    assert torch.equal(torch.jit.script(batched_nms)(boxes, scores, idxs, 0.5), batched_nms(boxes, scores, idxs, 0.5))

    features = torch.randn(2, 4, 16, 16, generator=g)
    box_list = [torch.tensor([[1.0, 2.0, 9.0, 12.0]]), torch.tensor([[0.5, 0.5, 15.0, 7.0], [3.0, 3.0, 4.0, 4.0]])]
    scripted = torch.jit.script(roi_align)
    assert torch.equal(scripted(features, box_list, [3, 5], 1.0, 2, True), roi_align(features, box_list, (3, 5), 1.0, 2, True))
    module = ROIAlign(7, 0.5, 0, aligned=False)
    assert torch.equal(torch.jit.script(module)(features, box_list), module(features, box_list))


def _bad_calls():
    boxes, scores, x = torch.rand(4, 4), torch.rand(4), torch.rand(1, 2, 8, 8, requires_grad=True)
    far = torch.tensor([[5.0, 0.0, 0.0, 4.0, 4.0]])  # batch index 5 of 1 image
    return {
        "nms": lambda: nms(boxes, scores[:3], 0.5),
        "torch.ops nms": lambda: torch.ops.detcore.nms(boxes[:, :3], scores, 0.5),
        "batched_nms": lambda: batched_nms(boxes, scores, torch.zeros(3, dtype=torch.long), 0.5),
        "roi_align (autograd)": lambda: roi_align(x, far, 2),
        "roi_align (python check)": lambda: roi_align(x, [torch.rand(2, 3)], 2),
        "backward op": lambda: torch.ops.detcore._roi_align_backward(
            torch.rand(1, 2, 2, 2), far, 1.0, 2, 2, 1, 2, 8, 8, 2, True
        ),
    }


@pytest.mark.parametrize("entry", list(_bad_calls()))
def test_bad_arguments_raise_one_error_that_is_both_value_and_runtime_error(entry):
    """A caller's `except RuntimeError` (torchvision's error) and `except ValueError` both work."""
    with pytest.raises(OpArgumentError) as info:
        _bad_calls()[entry]()
    assert isinstance(info.value, ValueError) and isinstance(info.value, RuntimeError)
    assert "\n" not in str(info.value).strip()  # the sentence alone, no C++ frames


def _beyond_int64_calls():
    x, rois = torch.rand(1, 2, 8, 8), torch.tensor([[0, 1.0, 1.0, 5.0, 5.0]])
    offset, weight = torch.zeros(1, 18, 8, 8), torch.rand(3, 2, 3, 3)
    return {
        "roi_align sampling_ratio": (lambda: roi_align(x, rois, 2, 1.0, 2**63), "roi_align: sampling_ratio", 2**63),
        "ROIAlign sampling_ratio": (lambda: ROIAlign(2, 1.0, -(2**63) - 1)(x, rois), "roi_align: sampling_ratio", -(2**63) - 1),
        "roi_align output_size": (lambda: roi_align(x, rois, (2**64, 2)), "roi_align: output_height", 2**64),
        "roi_pool output_size": (lambda: roi_pool(x, rois, (2, 2**63)), "roi_pool: output_width", 2**63),
        "deform_conv2d stride": (lambda: deform_conv2d(x, offset, weight, stride=(1, 2**63)), "deform_conv2d: stride_w", 2**63),
        "deform_conv2d padding": (lambda: deform_conv2d(x, offset, weight, padding=2**70), "deform_conv2d: pad_h", 2**70),
        "deform_conv2d dilation": (lambda: deform_conv2d(x, offset, weight, dilation=2**63), "deform_conv2d: dilation_h", 2**63),
    }


@pytest.mark.parametrize("entry", list(_beyond_int64_calls()))
def test_ints_beyond_64_bits_are_refused_naming_the_argument(entry):
    # The dispatcher's own message was "Expected a value of type 'int' for argument 'sampling_ratio'
    # but instead found type 'int'": the wrappers refuse them first.
    call, argument, value = _beyond_int64_calls()[entry]
    with pytest.raises(OpArgumentError, match=rf"^{argument} must be an integer that fits in 64 bits, got {value}$"):
        call()
