import math

import pytest
import torch

from detcore.layers import ShapeSpec
from detcore.modeling.box_regression import Box2BoxTransform
from detcore.modeling.roi_heads import FastRCNNOutputLayers, fast_rcnn_inference
from detcore.structures import Boxes, Instances

WEIGHTS = (10.0, 10.0, 5.0, 5.0)


def _predictor(num_classes=3, in_dim=6, **kwargs):
    return FastRCNNOutputLayers(
        ShapeSpec(channels=in_dim), box2box_transform=Box2BoxTransform(WEIGHTS), num_classes=num_classes, **kwargs
    )


# --- plain references ---------------------------------------------------------------------------
def _encode(src, tgt, weights=WEIGHTS):
    """R-CNN deltas written out coordinate by coordinate."""
    out = []
    for (a1, b1, a2, b2), (c1, d1, c2, d2) in zip(src.tolist(), tgt.tolist()):
        pw, ph, gw, gh = a2 - a1, b2 - b1, c2 - c1, d2 - d1
        pcx, pcy, gcx, gcy = a1 + pw / 2, b1 + ph / 2, c1 + gw / 2, d1 + gh / 2
        out.append(
            [
                weights[0] * (gcx - pcx) / pw,
                weights[1] * (gcy - pcy) / ph,
                weights[2] * math.log(gw / pw),
                weights[3] * math.log(gh / ph),
            ]
        )
    return torch.tensor(out, dtype=torch.float64).reshape(-1, 4)


def _smooth_l1(x, beta):
    x = x.abs()
    if beta == 0:
        return x
    return torch.where(x < beta, 0.5 * x * x / beta, x - 0.5 * beta)


def _iou(a, b):
    iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = iw * ih
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def _reference_inference(boxes, probs, image_shape, score_thresh, nms_thresh, topk):
    """Loops over classes and ROIs: clip, threshold, greedy NMS per class, sort, top-k."""
    h, w = image_shape
    num_classes = probs.shape[1] - 1
    dets = []
    for c in range(num_classes):
        cand = []
        for r in range(boxes.shape[0]):
            s = probs[r, c].item()
            if s > score_thresh:
                x1, y1, x2, y2 = boxes[r, 4 * c : 4 * c + 4].tolist()
                box = [min(max(x1, 0), w), min(max(y1, 0), h), min(max(x2, 0), w), min(max(y2, 0), h)]
                cand.append((s, box, r))
        cand.sort(key=lambda t: -t[0])
        kept = []
        for s, box, r in cand:
            if all(_iou(box, k[1]) <= nms_thresh for k in kept):
                kept.append((s, box, r))
        dets += [(s, box, c, r) for s, box, r in kept]
    dets.sort(key=lambda t: -t[0])
    return dets[:topk] if topk >= 0 else dets


def _labeled_proposals(g):
    """Two images of sampled ROIs: image 0 with GT (fg and bg), image 1 background only, no gt_boxes."""
    p0 = Instances((100, 120))
    p0.proposal_boxes = Boxes(torch.tensor([[10, 10, 50, 60], [30, 20, 90, 70], [5, 5, 25, 15], [0, 0, 100, 100.0]]))
    p0.gt_boxes = Boxes(torch.tensor([[12, 8, 55, 58], [28, 25, 85, 75], [1, 1, 2, 2], [1, 1, 2, 2.0]]))
    p0.gt_classes = torch.tensor([2, 0, 3, 3])  # 3 = background
    p1 = Instances((80, 80))
    p1.proposal_boxes = Boxes(torch.tensor([[1, 2, 30, 40], [10, 10, 20, 20.0]]))
    p1.gt_classes = torch.tensor([3, 3])
    return [p0, p1]


# --- losses -------------------------------------------------------------------------------------
@pytest.mark.parametrize("beta", [0.0, 0.5])
def test_losses_match_plain_recomputation(beta):
    g = torch.Generator().manual_seed(0)
    pred = _predictor(num_classes=3, smooth_l1_beta=beta)
    proposals = _labeled_proposals(g)
    scores = torch.randn(6, 4, generator=g, dtype=torch.float64)
    deltas = torch.randn(6, 12, generator=g, dtype=torch.float64)
    losses = pred.losses((scores, deltas), proposals)

    gt = torch.tensor([2, 0, 3, 3, 3, 3])
    expected_cls = -torch.log_softmax(scores, dim=1)[torch.arange(6), gt].mean()
    targets = _encode(proposals[0].proposal_boxes.tensor[:2], proposals[0].gt_boxes.tensor[:2])
    fg_deltas = torch.stack([deltas[0, 8:12], deltas[1, 0:4]])
    expected_box = _smooth_l1(fg_deltas - targets, beta).sum() / 6  # normalized by ALL sampled ROIs
    torch.testing.assert_close(losses["loss_cls"], expected_cls)
    torch.testing.assert_close(losses["loss_box_reg"], expected_box)


def test_losses_class_agnostic_and_weights():
    g = torch.Generator().manual_seed(1)
    pred = _predictor(num_classes=3, cls_agnostic_bbox_reg=True, loss_weight={"loss_box_reg": 2.0})
    proposals = _labeled_proposals(g)
    scores = torch.randn(6, 4, generator=g)
    deltas = torch.randn(6, 4, generator=g)
    losses = pred.losses((scores, deltas), proposals)
    targets = _encode(proposals[0].proposal_boxes.tensor[:2], proposals[0].gt_boxes.tensor[:2]).float()
    expected = 2.0 * (deltas[:2] - targets).abs().sum() / 6
    torch.testing.assert_close(losses["loss_box_reg"], expected)


def test_losses_without_foreground_are_zero_with_gradient():
    pred = _predictor(num_classes=3)
    proposals = _labeled_proposals(None)[1:]
    x = torch.randn(2, 6)
    losses = pred.losses(pred(x), proposals)
    assert losses["loss_box_reg"].item() == 0.0
    sum(losses.values()).backward()
    assert pred.bbox_pred.weight.grad is not None and pred.cls_score.weight.grad.abs().sum() > 0


def test_losses_need_labels():
    pred = _predictor()
    p = Instances((10, 10), proposal_boxes=Boxes(torch.tensor([[0, 0, 5, 5.0]])))
    with pytest.raises(ValueError, match="gt_classes"):
        pred.losses(pred(torch.randn(1, 6)), [p])


# --- inference ----------------------------------------------------------------------------------
def _per_class(boxes):
    """Same box for every class of 2: [R, 4] -> [R, 8]."""
    return boxes.repeat(1, 2)


def test_inference_score_filter_and_sorting():
    boxes = _per_class(torch.tensor([[0, 0, 10, 10], [50, 50, 60, 60], [20, 0, 30, 10.0]]))
    probs = torch.tensor([[0.6, 0.1, 0.3], [0.2, 0.7, 0.1], [0.45, 0.52, 0.03]])
    (res,), (rois,) = fast_rcnn_inference([boxes], [probs], [(100, 100)], 0.5, 0.5, 100)
    assert res.scores.tolist() == pytest.approx([0.7, 0.6, 0.52])
    assert res.pred_classes.tolist() == [1, 0, 1]
    assert rois.tolist() == [1, 0, 2]
    torch.testing.assert_close(res.pred_boxes.tensor, torch.tensor([[50, 50, 60, 60], [0, 0, 10, 10], [20, 0, 30, 10.0]]))


def test_inference_nms_is_per_class():
    overlapping = torch.tensor([[0, 0, 10, 10], [1, 0, 11, 10.0]])  # IoU 9/11
    probs = torch.tensor([[0.9, 0.05, 0.05], [0.8, 0.1, 0.1]])
    (res,), _ = fast_rcnn_inference([_per_class(overlapping)], [probs], [(50, 50)], 0.01, 0.5, -1)
    # Class 0 keeps box 0 and class 1 keeps box 1: the 0.9 class-0 box does not suppress the
    # overlapping class-1 box, while each class drops its own weaker duplicate.
    assert res.pred_classes.tolist() == [0, 1]
    assert res.scores.tolist() == pytest.approx([0.9, 0.1])
    torch.testing.assert_close(res.pred_boxes.tensor, overlapping)
    (res,), _ = fast_rcnn_inference([_per_class(overlapping)], [probs], [(50, 50)], 0.01, 0.85, -1)
    assert len(res) == 4  # IoU 0.82 <= 0.85: nothing suppressed


def test_inference_topk_and_clipping():
    xs = torch.arange(10, dtype=torch.float32) * 20
    boxes = torch.stack([xs - 5, xs * 0 - 5, xs + 10, xs * 0 + 300], dim=1)  # sticks out of the image
    probs = torch.stack([torch.linspace(0.5, 0.95, 10), torch.zeros(10), 1 - torch.linspace(0.5, 0.95, 10)], dim=1)
    (res,), (rois,) = fast_rcnn_inference([_per_class(boxes)], [probs], [(100, 185)], 0.05, 0.5, 3)
    assert rois.tolist() == [9, 8, 7]
    assert res.pred_classes.tolist() == [0, 0, 0]
    expected = torch.tensor([[175, 0, 185, 100], [155, 0, 170, 100], [135, 0, 150, 100.0]])
    torch.testing.assert_close(res.pred_boxes.tensor, expected)


def test_inference_empty_and_nonfinite():
    (res,), (rois,) = fast_rcnn_inference([torch.zeros(0, 8)], [torch.zeros(0, 3)], [(10, 10)], 0.05, 0.5, 100)
    assert len(res) == 0 and res.pred_boxes.tensor.shape == (0, 4) and res.pred_classes.dtype == torch.int64
    assert rois.numel() == 0
    boxes = _per_class(torch.tensor([[0, 0, 5, 5], [0, 0, float("inf"), 5]]))
    probs = torch.tensor([[0.1, 0.8, 0.1], [0.1, 0.8, 0.1]])
    (res,), (rois,) = fast_rcnn_inference([boxes], [probs], [(10, 10)], 0.05, 0.5, 100)
    assert rois.tolist() == [0, 0]


def test_inference_matches_loop_reference_on_random_input():
    g = torch.Generator().manual_seed(5)
    num_classes, rois = 4, 60
    xy = torch.rand(rois, num_classes, 2, generator=g) * 90 - 10
    wh = torch.rand(rois, num_classes, 2, generator=g) * 40 + 1
    boxes = torch.cat([xy, xy + wh], dim=2).reshape(rois, num_classes * 4)
    probs = torch.softmax(torch.randn(rois, num_classes + 1, generator=g) * 2, dim=1)
    (res,), (roi_idx,) = fast_rcnn_inference([boxes], [probs], [(70, 80)], 0.1, 0.4, 25)
    expected = _reference_inference(boxes, probs, (70, 80), 0.1, 0.4, 25)
    assert len(res) == len(expected) == 25
    assert res.scores.tolist() == pytest.approx([d[0] for d in expected])
    assert res.pred_classes.tolist() == [d[2] for d in expected]
    assert roi_idx.tolist() == [d[3] for d in expected]
    torch.testing.assert_close(res.pred_boxes.tensor, torch.tensor([d[1] for d in expected]))


def test_predictor_inference_end_to_end():
    pred = _predictor(num_classes=2, in_dim=3, test_score_thresh=0.05, test_nms_thresh=0.5, test_topk_per_image=10)
    with torch.no_grad():
        pred.bbox_pred.weight.zero_()  # deltas 0: the boxes are the proposals
        pred.cls_score.weight.copy_(torch.eye(3))
    props = [
        Instances((40, 40), proposal_boxes=Boxes(torch.tensor([[0, 0, 10, 10], [20, 20, 30, 30.0]]))),
        Instances((40, 40), proposal_boxes=Boxes(torch.zeros(0, 4))),
    ]
    x = torch.tensor([[4.0, 0, 0], [0, 4.0, 0]])
    results, rois = pred.inference(pred(x), props)
    assert len(results) == 2 and len(results[1]) == 0
    p = torch.softmax(torch.tensor([4.0, 0, 0]), 0)
    assert results[0].pred_classes.tolist() == [0, 1]
    torch.testing.assert_close(results[0].scores, p[:1].repeat(2))
    torch.testing.assert_close(results[0].pred_boxes.tensor, props[0].proposal_boxes.tensor)
    assert rois[0].tolist() == [0, 1]


def test_inference_argument_errors():
    with pytest.raises(ValueError, match="one of each per image"):
        fast_rcnn_inference([torch.zeros(1, 8)], [], [(5, 5)], 0.1, 0.5, 10)
    with pytest.raises(ValueError, match="columns"):
        fast_rcnn_inference([torch.zeros(1, 12)], [torch.zeros(1, 3)], [(5, 5)], 0.1, 0.5, 10)
