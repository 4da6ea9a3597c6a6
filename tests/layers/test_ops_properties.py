"""Property tests: for any small input hypothesis finds, the ops equal the plain-PyTorch reference.

Coordinates are drawn from a coarse grid (quarters) as well as from arbitrary floats, so that
exact ties in IoU, IoUs exactly at the threshold and samples on pixel boundaries come up.
"""
import pytest
import torch

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from detcore.layers import batched_nms, nms, roi_align  # noqa: E402

try:
    from .reference_ops import batched_nms_reference, nms_reference, roi_align_reference
except ImportError:  # tests/ run as rootdir-relative modules, without packages
    from reference_ops import batched_nms_reference, nms_reference, roi_align_reference

try:
    import torchvision
except ImportError:
    torchvision = None

SETTINGS = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)

coordinate = st.one_of(
    st.integers(-8, 64).map(lambda v: v / 4),  # a grid: exact IoUs and ties
    st.floats(-10.0, 40.0, allow_nan=False, width=32),
)
extent = st.one_of(
    st.integers(-4, 80).map(lambda v: v / 4),  # includes zero and negative sizes
    st.floats(-2.0, 30.0, allow_nan=False, width=32),
)
threshold = st.one_of(
    st.sampled_from([0.0, 0.1, 0.25, 1 / 3, 0.5, 0.7, 1.0]),
    st.floats(0.0, 1.0, allow_nan=False),
)
dtype = st.sampled_from([torch.float32, torch.float64])


@st.composite
def box_sets(draw, max_boxes=40):
    n = draw(st.integers(0, max_boxes))
    rows = draw(st.lists(st.tuples(coordinate, coordinate, extent, extent), min_size=n, max_size=n))
    boxes = torch.tensor([[x, y, x + w, y + h] for x, y, w, h in rows], dtype=torch.float64)
    # Distinct scores (torchvision's order among equal scores is unspecified); ties are
    # covered by the tests in test_nms.py, where stable order is detcore's own promise.
    scores = torch.randperm(n, generator=torch.Generator().manual_seed(draw(st.integers(0, 2**16))))
    return boxes.reshape(n, 4), (scores.to(torch.float64) + 1) / (n + 1)


@SETTINGS
@given(data=box_sets(), iou_threshold=threshold, dtype=dtype)
def test_nms_equals_reference(data, iou_threshold, dtype):
    boxes, scores = (t.to(dtype) for t in data)
    got = nms(boxes, scores, iou_threshold)
    assert torch.equal(got, nms_reference(boxes, scores, iou_threshold))
    if torchvision is not None:
        assert torch.equal(got, torchvision.ops.nms(boxes, scores, iou_threshold))


@SETTINGS
@given(data=box_sets(), iou_threshold=threshold, dtype=dtype, seed=st.integers(0, 2**16))
def test_batched_nms_equals_reference(data, iou_threshold, dtype, seed):
    boxes, scores = (t.to(dtype) for t in data)
    idxs = torch.randint(0, 3, (len(boxes),), generator=torch.Generator().manual_seed(seed))
    got = batched_nms(boxes, scores, idxs, iou_threshold)
    assert torch.equal(got, batched_nms_reference(boxes, scores, idxs, iou_threshold))


@st.composite
def roi_align_cases(draw):
    batch = draw(st.integers(1, 3))
    channels = draw(st.integers(1, 3))
    height = draw(st.integers(1, 9))
    width = draw(st.integers(1, 9))
    k = draw(st.integers(0, 6))
    spatial_scale = draw(st.sampled_from([1.0, 0.5, 0.25, 0.3]))
    rows = draw(
        st.lists(
            st.tuples(st.integers(0, batch - 1), coordinate, coordinate, extent, extent),
            min_size=k,
            max_size=k,
        )
    )
    rois = torch.tensor(
        [[b, x, y, x + w, y + h] for b, x, y, w, h in rows], dtype=torch.float64
    ).reshape(k, 5)
    output_size = (draw(st.integers(1, 4)), draw(st.integers(1, 4)))
    sampling_ratio = draw(st.sampled_from([-1, 0, 1, 2, 3]))
    aligned = draw(st.booleans())
    seed = draw(st.integers(0, 2**16))
    features = torch.randn(
        batch, channels, height, width, generator=torch.Generator().manual_seed(seed),
        dtype=torch.float64,
    )
    return features, rois, output_size, spatial_scale, sampling_ratio, aligned


@SETTINGS
@given(case=roi_align_cases())
def test_roi_align_equals_reference_float64(case):
    features, rois, output_size, spatial_scale, sampling_ratio, aligned = case
    args = (output_size, spatial_scale, sampling_ratio, aligned)
    x = features.clone().requires_grad_(True)
    out = roi_align(x, rois, *args)
    ref = roi_align_reference(x, rois, *args)
    torch.testing.assert_close(out, ref, atol=1e-10, rtol=1e-10)
    grad_out = torch.linspace(-1, 1, ref.numel(), dtype=torch.float64).reshape(ref.shape)
    (grad,) = torch.autograd.grad(out, x, grad_out) if out.numel() else (None,)
    if grad is not None:
        (ref_grad,) = torch.autograd.grad(ref, x, grad_out)
        torch.testing.assert_close(grad, ref_grad, atol=1e-10, rtol=1e-10)


@SETTINGS
@given(case=roi_align_cases())
def test_roi_align_float32(case):
    # float32 against torchvision's float32 kernel, which does the same arithmetic: grid
    # coordinates can put a sample exactly on the map's edge (y == -1 or y == H), where a
    # float64 reference may round the other way. Without torchvision, the float64 reference.
    features, rois, output_size, spatial_scale, sampling_ratio, aligned = case
    args = (output_size, spatial_scale, sampling_ratio, aligned)
    x, r = features.float(), rois.float()
    out = roi_align(x, r, *args)
    assert out.shape == (len(rois), features.shape[1], *output_size) and out.dtype == torch.float32
    if torchvision is not None:
        expected = torchvision.ops.roi_align(x, r, *args)
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    else:
        ref = roi_align_reference(x, r, *args)
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
