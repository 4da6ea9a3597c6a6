import math

import pytest
import torch

from detcore.config import get_cfg
from detcore.layers import ShapeSpec
from detcore.modeling.roi_heads import (
    ROI_HEADS_REGISTRY,
    StandardROIHeads,
    add_ground_truth_to_proposals,
    build_roi_heads,
)
from detcore.structures import Boxes, ImageList, Instances, PolygonMasks

CHANNELS = 8
IMAGE = 64  # padded batch size; p2 is 16x16


def _cfg(mask_on=True):
    cfg = get_cfg()
    cfg.MODEL.MASK_ON = mask_on
    cfg.MODEL.ROI_HEADS.NUM_CLASSES = 3
    cfg.MODEL.ROI_HEADS.BATCH_SIZE_PER_IMAGE = 16
    cfg.MODEL.ROI_BOX_HEAD.FC_DIM = 16
    cfg.MODEL.ROI_MASK_HEAD.NUM_CONV = 1
    cfg.MODEL.ROI_MASK_HEAD.CONV_DIM = 8
    return cfg


def _input_shape():
    return {f"p{k}": ShapeSpec(channels=CHANNELS, stride=2**k) for k in range(2, 7)}


def _features(batch=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {f"p{k}": torch.randn(batch, CHANNELS, IMAGE >> k, IMAGE >> k, generator=g) for k in range(2, 7)}


def _images(batch=2):
    return ImageList(torch.zeros(batch, 3, IMAGE, IMAGE), [(64, 64), (60, 50)][:batch])


def _rect_polygon(box):
    x1, y1, x2, y2 = box
    return [[x1, y1, x2, y1, x2, y2, x1, y2]]


def _targets():
    boxes0 = [[4.0, 6.0, 30.0, 40.0], [34.0, 10.0, 60.0, 28.0]]
    t0 = Instances((64, 64), gt_boxes=Boxes(torch.tensor(boxes0)), gt_classes=torch.tensor([2, 0]))
    t0.gt_masks = PolygonMasks([_rect_polygon(b) for b in boxes0])
    t1 = Instances((60, 50), gt_boxes=Boxes(torch.zeros(0, 4)), gt_classes=torch.zeros(0, dtype=torch.int64))
    t1.gt_masks = PolygonMasks([])
    return [t0, t1]


def _proposals(seed=0, count=40):
    g = torch.Generator().manual_seed(seed)
    out = []
    for h, w in [(64, 64), (60, 50)]:
        xy = torch.rand(count, 2, generator=g) * torch.tensor([w - 8.0, h - 8.0])
        wh = torch.rand(count, 2, generator=g) * 30 + 4
        boxes = torch.cat([xy, torch.minimum(xy + wh, torch.tensor([float(w), float(h)]))], dim=1)
        logits = torch.randn(count, generator=g)
        out.append(Instances((h, w), proposal_boxes=Boxes(boxes), objectness_logits=logits))
    return out


def _iou(a, b):
    iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = iw * ih
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


# --- construction ---------------------------------------------------------------------------------
def test_from_config_wires_strides_and_branches():
    heads = build_roi_heads(_cfg(), _input_shape())
    assert isinstance(heads, StandardROIHeads) and "StandardROIHeads" in ROI_HEADS_REGISTRY
    assert heads.box_in_features == ["p2", "p3", "p4", "p5"]
    assert heads.box_pooler.scales == (1 / 4, 1 / 8, 1 / 16, 1 / 32)
    assert heads.box_pooler.output_size == (7, 7) and heads.mask_pooler.output_size == (14, 14)
    assert heads.box_pooler.aligned and heads.box_pooler.canonical_level == 4
    assert heads.box_head.fc1.in_features == CHANNELS * 49
    assert heads.box_predictor.cls_score.out_features == 4
    assert heads.mask_head.predictor.out_channels == 3
    assert heads.proposal_matcher.labels == [0, 1]
    assert not hasattr(build_roi_heads(_cfg(mask_on=False), _input_shape()), "mask_head")


def test_from_config_errors():
    cfg = _cfg()
    cfg.MODEL.ROI_HEADS.IN_FEATURES = ["p2", "p9"]
    with pytest.raises(ValueError, match="p9"):
        build_roi_heads(cfg, _input_shape())
    shapes = _input_shape()
    shapes["p3"] = ShapeSpec(channels=4, stride=8)
    with pytest.raises(ValueError, match="one channel count"):
        build_roi_heads(_cfg(), shapes)


# --- training targets -----------------------------------------------------------------------------
def test_add_ground_truth_to_proposals():
    props = add_ground_truth_to_proposals(_targets(), _proposals(count=5))
    assert len(props[0]) == 7 and len(props[1]) == 5
    torch.testing.assert_close(props[0].proposal_boxes.tensor[5:], _targets()[0].gt_boxes.tensor)
    # sigmoid(logit) = 1 - 1e-10: a GT box is as confident as a proposal gets.
    assert props[0].objectness_logits[5:].tolist() == pytest.approx([math.log((1 - 1e-10) / 1e-10)] * 2)


def test_label_and_sample_matches_iou_rule():
    torch.manual_seed(0)
    heads = build_roi_heads(_cfg(), _input_shape())
    targets = _targets()
    sampled = heads.label_and_sample_proposals(_proposals(), targets)
    gt_boxes = targets[0].gt_boxes.tensor.tolist()
    s0 = sampled[0]
    assert len(s0) == 16  # BATCH_SIZE_PER_IMAGE, enough candidates
    classes = s0.gt_classes.tolist()
    num_fg = sum(c != 3 for c in classes)
    assert 2 <= num_fg <= 4  # the 2 GT boxes themselves at least; at most 25% of 16
    assert all(c != 3 for c in classes[:num_fg]) and all(c == 3 for c in classes[num_fg:])  # fg first
    for box, cls, gt_box in zip(s0.proposal_boxes.tensor.tolist(), classes, s0.gt_boxes.tensor.tolist()):
        ious = [_iou(box, g) for g in gt_boxes]
        best = max(range(2), key=lambda i: ious[i])
        assert cls == ([2, 0][best] if ious[best] >= 0.5 else 3)
        assert gt_box == gt_boxes[best]  # matched GT, also for background
    # The GT boxes were appended and, being perfect matches, are foreground.
    for g in gt_boxes:
        assert g in s0.proposal_boxes.tensor.tolist()
    assert len(s0.gt_masks) == 16 and s0.has("objectness_logits")
    # An image without GT: all background, no gt_boxes to regress to.
    assert sampled[1].gt_classes.tolist() == [3] * 16 and not sampled[1].has("gt_boxes")


def test_label_and_sample_without_appending_gt():
    cfg = _cfg()
    cfg.MODEL.ROI_HEADS.PROPOSAL_APPEND_GT = False
    cfg.MODEL.ROI_HEADS.BATCH_SIZE_PER_IMAGE = 1000
    heads = build_roi_heads(cfg, _input_shape())
    sampled = heads.label_and_sample_proposals(_proposals(count=10), _targets())
    assert len(sampled[0]) == 10  # all proposals, nothing added
    for g in _targets()[0].gt_boxes.tensor.tolist():
        assert g not in sampled[0].proposal_boxes.tensor.tolist()


# --- forward --------------------------------------------------------------------------------------
def test_train_forward_losses_finite_and_backprop():
    torch.manual_seed(0)
    heads = build_roi_heads(_cfg(), _input_shape()).train()
    features = {k: v.requires_grad_(True) for k, v in _features().items()}
    _, losses = heads(_images(), features, _proposals(), _targets())
    assert set(losses) == {"loss_cls", "loss_box_reg", "loss_mask"}
    assert all(v.dim() == 0 and torch.isfinite(v) for v in losses.values())
    assert losses["loss_cls"].item() == pytest.approx(math.log(4), rel=0.05)  # near-uniform at init
    assert losses["loss_mask"].item() == pytest.approx(math.log(2), rel=0.05)
    sum(losses.values()).backward()
    assert heads.mask_head.predictor.weight.grad.abs().sum() > 0
    assert heads.box_predictor.bbox_pred.weight.grad.abs().sum() > 0
    assert features["p2"].grad is not None


def test_train_requires_targets():
    heads = build_roi_heads(_cfg(), _input_shape()).train()
    with pytest.raises(ValueError, match="targets"):
        heads(_images(), _features(), _proposals())


def test_eval_forward_results():
    cfg = _cfg()
    cfg.TEST.DETECTIONS_PER_IMAGE = 5
    heads = build_roi_heads(cfg, _input_shape()).eval()
    with torch.no_grad():
        results, losses = heads(_images(), _features(), _proposals())
    assert losses == {} and len(results) == 2
    for res, size in zip(results, [(64, 64), (60, 50)]):
        assert res.image_size == size
        assert set(res.fields()) == {"pred_boxes", "scores", "pred_classes", "pred_masks"}
        assert len(res) == 5  # near-uniform scores (~0.25 > 0.05): top-k is the limit
        assert res.pred_masks.shape == (5, 1, 28, 28)
        assert ((res.pred_masks > 0) & (res.pred_masks < 1)).all()
        assert res.pred_classes.dtype == torch.int64 and ((res.pred_classes >= 0) & (res.pred_classes < 3)).all()
        t = res.pred_boxes.tensor
        assert (t >= 0).all() and (t[:, 2] <= size[1]).all() and (t[:, 3] <= size[0]).all()
        assert (res.scores[:-1] >= res.scores[1:]).all()


def test_eval_with_no_proposals_and_without_masks():
    heads = build_roi_heads(_cfg(), _input_shape()).eval()
    empty = [Instances(s, proposal_boxes=Boxes(torch.zeros(0, 4)), objectness_logits=torch.zeros(0)) for s in [(64, 64), (60, 50)]]
    with torch.no_grad():
        results, _ = heads(_images(), _features(), empty)
    assert [len(r) for r in results] == [0, 0]
    assert results[0].pred_masks.shape == (0, 1, 28, 28)

    heads = build_roi_heads(_cfg(mask_on=False), _input_shape()).eval()
    with torch.no_grad():
        results, _ = heads(_images(), _features(), _proposals())
    assert not results[0].has("pred_masks") and len(results[0]) > 0
    heads.train()
    _, losses = heads(_images(), _features(), _proposals(), _targets())
    assert set(losses) == {"loss_cls", "loss_box_reg"}


def test_tiny_training_lowers_the_loss():
    torch.manual_seed(0)
    heads = build_roi_heads(_cfg(), _input_shape()).train()
    features, images, targets = _features(), _images(), _targets()
    proposals = _proposals(seed=3, count=30)
    opt = torch.optim.SGD(heads.parameters(), lr=0.05, momentum=0.9)
    history = []
    for _ in range(30):
        _, losses = heads(images, features, proposals, targets)
        total = sum(losses.values())
        opt.zero_grad()
        total.backward()
        opt.step()
        history.append(total.item())
    assert all(math.isfinite(v) for v in history)
    first, last = sum(history[:3]) / 3, sum(history[-3:]) / 3
    assert last < 0.5 * first, history
