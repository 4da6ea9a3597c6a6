"""nms, batched_nms and roi_align on quantized CPU tensors (quint8, qint8, qint32), as torchvision's
ops take them: computed on the dequantized values, roi_align's output quantized with the input's
scale and zero point."""
import pytest
import torch

from detcore.layers import OpArgumentError, batched_nms, nms, roi_align

try:
    from .reference_ops import batched_nms_reference, distinct_scores, nms_reference, random_boxes
except ImportError:  # tests/ run as rootdir-relative modules, without packages
    from reference_ops import batched_nms_reference, distinct_scores, nms_reference, random_boxes

try:
    import torchvision.ops as tv_ops
except ImportError:
    tv_ops = None

# PyTorch deprecates quantized dtypes; torchvision's ops still take them, so ours do too.
pytestmark = pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor:UserWarning")

QTYPES = [torch.quint8, torch.qint8, torch.qint32]


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _quantized_case(qtype, seed, batch=1):
    g = _gen(seed)
    low = 0.0 if qtype == torch.quint8 else -1.0
    features = low + torch.rand(batch, 6, 20, 20, generator=g) * 4
    q_features = torch.quantize_per_tensor(features, 0.05, 0 if qtype == torch.qint32 else 3, qtype)
    corner = torch.rand(40, 2, generator=g) * 10
    size = torch.rand(40, 2, generator=g) * 10 + 1
    index = torch.randint(0, batch, (40, 1), generator=g).float()
    rois = torch.cat([index, corner, corner + size], dim=1)
    q_rois = torch.quantize_per_tensor(rois, 0.2, 0, qtype)
    return q_features, q_rois


@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("aligned", [False, True])
def test_roi_align_is_the_float_kernel_on_dequantized_values(qtype, aligned):
    q_features, q_rois = _quantized_case(qtype, seed=1, batch=3)
    out = roi_align(q_features, q_rois, 5, 1.0, 2, aligned)
    assert out.dtype == qtype and out.shape == (40, 6, 5, 5)
    assert out.q_scale() == q_features.q_scale() and out.q_zero_point() == q_features.q_zero_point()
    expected = roi_align(q_features.dequantize(), q_rois.dequantize(), 5, 1.0, 2, aligned)
    expected = torch.quantize_per_tensor(expected, q_features.q_scale(), q_features.q_zero_point(), qtype)
    assert torch.equal(out.int_repr(), expected.int_repr())


@pytest.mark.skipif(tv_ops is None, reason="torchvision is not installed")
@pytest.mark.parametrize("qtype", QTYPES)
def test_roi_align_agrees_with_torchvisions_quantized_kernel(qtype):
    # torchvision's kernel takes one image per batch, and sums the raw integers before
    # dequantizing: a value on a rounding boundary may land one step away.
    q_features, q_rois = _quantized_case(qtype, seed=2, batch=1)
    ours = roi_align(q_features, q_rois, 5, 1.0, 2, True).int_repr().long()
    theirs = tv_ops.roi_align(q_features, q_rois, 5, 1.0, 2, True).int_repr().long()
    difference = (ours - theirs).abs()
    assert difference.max() <= 1
    assert (difference > 0).float().mean() < 1e-3


def test_roi_align_refuses_per_channel_quantization():
    features = torch.quantize_per_channel(
        torch.rand(1, 4, 6, 6), torch.full((4,), 0.1), torch.zeros(4, dtype=torch.long), 1, torch.quint8
    )
    with pytest.raises(OpArgumentError, match="per tensor"):
        roi_align(features, torch.tensor([[0, 1.0, 1.0, 4.0, 4.0]]), 2)


@pytest.mark.parametrize("qtype", QTYPES)
def test_nms_and_batched_nms_on_dequantized_values(qtype):
    g = _gen(3)
    boxes = torch.quantize_per_tensor(random_boxes(200, g, xy_max=100.0), 0.5, 0, qtype)
    if qtype == torch.qint8:  # [-128, 127] * 0.5 would clip the boxes
        boxes = torch.quantize_per_tensor(boxes.dequantize() / 2, 0.5, 0, qtype)
    scores = torch.quantize_per_tensor(distinct_scores(200, g), 0.004, 0, qtype)
    plain_boxes, plain_scores = boxes.dequantize(), scores.dequantize()
    assert torch.equal(nms(boxes, scores, 0.5), nms_reference(plain_boxes, plain_scores, 0.5))
    idxs = torch.randint(0, 4, (200,), generator=g)
    assert torch.equal(
        batched_nms(boxes, scores, idxs, 0.5),
        batched_nms_reference(plain_boxes, plain_scores, idxs, 0.5),
    )
    if tv_ops is not None:
        assert torch.equal(nms(boxes, scores, 0.5), tv_ops.nms(boxes, scores, 0.5))
