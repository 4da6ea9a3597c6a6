import math

import pytest
import torch

from detcore.config import get_cfg
from detcore.layers import ShapeSpec
from detcore.modeling.roi_heads import (
    ROI_MASK_HEAD_REGISTRY,
    MaskRCNNConvUpsampleHead,
    build_mask_head,
    mask_rcnn_inference,
    mask_rcnn_loss,
)
from detcore.structures import BitMasks, Boxes, Instances, PolygonMasks


def _bce(logit, target):
    """Binary cross entropy of one logit, written out."""
    p = 1 / (1 + math.exp(-logit))
    return -(target * math.log(p) + (1 - target) * math.log(1 - p))


def test_head_layers_and_shapes():
    head = MaskRCNNConvUpsampleHead(ShapeSpec(channels=4), num_classes=3, conv_dims=[8, 8, 6])
    names = [n for n, _ in head.named_children()]
    assert names == ["mask_fcn1", "mask_fcn2", "deconv", "deconv_relu", "predictor"]
    assert head.deconv.kernel_size == (2, 2) and head.deconv.stride == (2, 2) and head.deconv.out_channels == 6
    assert head.predictor.kernel_size == (1, 1)
    assert head.layers(torch.randn(5, 4, 14, 14)).shape == (5, 3, 28, 28)
    assert head.layers(torch.randn(0, 4, 14, 14)).shape == (0, 3, 28, 28)


def test_head_init():
    torch.manual_seed(0)
    head = MaskRCNNConvUpsampleHead(ShapeSpec(channels=64), num_classes=80, conv_dims=[64, 256])
    assert 0.0008 < head.predictor.weight.std() < 0.0012
    assert head.predictor.bias.abs().sum() == 0 and head.mask_fcn1.bias.abs().sum() == 0
    # msra fill: normal with std sqrt(2 / fan_out), fan_out = out_channels * 3 * 3.
    assert head.mask_fcn1.weight.std().item() == pytest.approx(math.sqrt(2 / (64 * 9)), rel=0.1)


def test_builder_reads_config():
    cfg = get_cfg()
    cfg.MODEL.ROI_HEADS.NUM_CLASSES = 5
    cfg.MODEL.ROI_MASK_HEAD.NUM_CONV = 2
    cfg.MODEL.ROI_MASK_HEAD.CONV_DIM = 8
    head = build_mask_head(cfg, ShapeSpec(channels=4, height=14, width=14))
    assert isinstance(head, MaskRCNNConvUpsampleHead)
    assert [n for n, _ in head.named_children()][:3] == ["mask_fcn1", "mask_fcn2", "deconv"]
    assert head.predictor.out_channels == 5 and head.deconv.out_channels == 8
    cfg.MODEL.ROI_MASK_HEAD.CLS_AGNOSTIC_MASK = True
    assert build_mask_head(cfg, ShapeSpec(channels=4)).predictor.out_channels == 1
    assert "MaskRCNNConvUpsampleHead" in ROI_MASK_HEAD_REGISTRY


def _two_roi_instances():
    # Image 0 (8x8): GT bitmap = left half set; ROI covers the whole image, GT class 2.
    left = torch.zeros(1, 8, 8, dtype=torch.bool)
    left[:, :, :4] = True
    inst0 = Instances((8, 8), proposal_boxes=Boxes(torch.tensor([[0, 0, 8, 8.0]])), gt_classes=torch.tensor([2]))
    inst0.gt_masks = BitMasks(left)
    # Image 1: GT polygon = top half of an 8x8 square; ROI = that square, GT class 0.
    inst1 = Instances((8, 8), proposal_boxes=Boxes(torch.tensor([[0, 0, 8, 8.0]])), gt_classes=torch.tensor([0]))
    inst1.gt_masks = PolygonMasks([[[0, 0, 8, 0, 8, 4, 0, 4]]])
    return [inst0, inst1]


def test_mask_loss_equals_hand_computed_bce():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, 2, 2, generator=g, dtype=torch.float64)
    loss = mask_rcnn_loss(logits, _two_roi_instances())
    # 2x2 targets: left half -> [[1, 0], [1, 0]], top half -> [[1, 1], [0, 0]].
    targets = [(2, [[1, 0], [1, 0]]), (0, [[1, 1], [0, 0]])]
    terms = [
        _bce(logits[r, cls, i, j].item(), t[i][j]) for r, (cls, t) in enumerate(targets) for i in range(2) for j in range(2)
    ]
    assert loss.item() == pytest.approx(sum(terms) / len(terms))


def test_mask_loss_class_agnostic_and_empty():
    logits = torch.zeros(2, 1, 2, 2, requires_grad=True)
    assert mask_rcnn_loss(logits, _two_roi_instances()).item() == pytest.approx(math.log(2))
    empty = Instances((8, 8), proposal_boxes=Boxes(torch.zeros(0, 4)), gt_classes=torch.zeros(0, dtype=torch.int64))
    logits = torch.zeros(0, 3, 28, 28, requires_grad=True)
    loss = mask_rcnn_loss(logits, [empty])
    assert loss.item() == 0.0
    loss.backward()
    assert logits.grad is not None


def test_mask_targets_of_a_square_polygon():
    square = PolygonMasks([[[10, 10, 30, 10, 30, 30, 10, 30]]] * 2)
    boxes = torch.tensor([[10, 10, 30, 30], [0, 0, 40, 40.0]])
    targets = square.crop_and_resize(boxes, 28)
    assert targets.shape == (2, 28, 28) and targets.dtype == torch.bool
    assert targets[0].all()  # the ROI is the square itself
    # ROI twice as large: cell j's center is at 40 * (j + 0.5) / 28; inside when in [10, 30].
    centers = 40 * (torch.arange(28) + 0.5) / 28
    inside = (centers >= 10) & (centers <= 30)
    assert torch.equal(targets[1], inside[:, None] & inside[None, :])

    # ...and those are exactly the targets the loss uses.
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 1, 28, 28, generator=g)
    inst = Instances((40, 40), proposal_boxes=Boxes(boxes), gt_classes=torch.tensor([0, 0]), gt_masks=square)
    expected = torch.nn.functional.binary_cross_entropy_with_logits(logits[:, 0], targets.float())
    torch.testing.assert_close(mask_rcnn_loss(logits, [inst]), expected)


def test_mask_inference_picks_predicted_class():
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(3, 4, 5, 5, generator=g)
    dets = [
        Instances((20, 20), pred_classes=torch.tensor([3, 1])),
        Instances((20, 20), pred_classes=torch.zeros(0, dtype=torch.int64)),
        Instances((20, 20), pred_classes=torch.tensor([2])),
    ]
    mask_rcnn_inference(logits, dets)
    assert dets[0].pred_masks.shape == (2, 1, 5, 5) and dets[1].pred_masks.shape == (0, 1, 5, 5)
    torch.testing.assert_close(dets[0].pred_masks[1, 0], torch.sigmoid(logits[1, 1]))
    torch.testing.assert_close(dets[0].pred_masks[0, 0], torch.sigmoid(logits[0, 3]))
    torch.testing.assert_close(dets[2].pred_masks[0, 0], torch.sigmoid(logits[2, 2]))

    agnostic = [Instances((20, 20), pred_classes=torch.tensor([3]))]
    mask_rcnn_inference(logits[:1, :1], agnostic)
    torch.testing.assert_close(agnostic[0].pred_masks, torch.sigmoid(logits[:1, :1]))
    with pytest.raises(ValueError, match="mask predictions"):
        mask_rcnn_inference(logits, dets[:1])


def test_head_forward_train_and_eval():
    head = MaskRCNNConvUpsampleHead(ShapeSpec(channels=4), num_classes=3, conv_dims=[4, 4], loss_weight=2.0)
    x = torch.randn(2, 4, 1, 1)
    instances = _two_roi_instances()
    head.train()
    losses = head(x, instances)
    assert set(losses) == {"loss_mask"}
    torch.testing.assert_close(losses["loss_mask"], 2.0 * mask_rcnn_loss(head.layers(x), instances))
    head.eval()
    dets = [Instances((8, 8), pred_boxes=Boxes(torch.tensor([[0, 0, 4, 4.0]] * 2)), pred_classes=torch.tensor([0, 2]))]
    out = head(x, dets)
    assert out[0].pred_masks.shape == (2, 1, 2, 2)
    assert ((out[0].pred_masks >= 0) & (out[0].pred_masks <= 1)).all()
