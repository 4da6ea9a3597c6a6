import pytest
import torch
import torch.nn.functional as F
from torch import nn

from detcore.config import get_cfg
from detcore.layers import ShapeSpec
from detcore.modeling.anchor_generator import DefaultAnchorGenerator
from detcore.modeling.box_regression import Box2BoxTransform
from detcore.modeling.matcher import Matcher
from detcore.modeling.proposal_generator import (
    PROPOSAL_GENERATOR_REGISTRY,
    RPN,
    StandardRPNHead,
    build_proposal_generator,
    find_top_rpn_proposals,
)
from detcore.structures import Boxes, ImageList, Instances

CHANNELS = 8
STRIDES = {"p3": 8, "p4": 16}


def _rpn(**overrides):
    args = dict(
        in_features=["p3", "p4"],
        head=StandardRPNHead(CHANNELS, 3),
        anchor_generator=DefaultAnchorGenerator([[16], [32]], [[0.5, 1.0, 2.0]], [8, 16]),
        anchor_matcher=Matcher([0.3, 0.7], [0, -1, 1], allow_low_quality_matches=True),
        box2box_transform=Box2BoxTransform((1.0, 1.0, 1.0, 1.0)),
        batch_size_per_image=256,
        positive_fraction=0.5,
        pre_nms_topk=(60, 50),
        post_nms_topk=(40, 30),
        nms_thresh=0.7,
    )
    args.update(overrides)
    return RPN(**args)


def _inputs(seed=0, sizes=((64, 96), (50, 70))):
    g = torch.Generator().manual_seed(seed)
    images = ImageList(torch.zeros(len(sizes), 3, 64, 96), list(sizes))
    feats = {k: torch.randn(len(sizes), CHANNELS, 64 // s, 96 // s, generator=g) for k, s in STRIDES.items()}
    gt = [
        Instances(
            sizes[0],
            gt_boxes=Boxes([[10.0, 12.0, 40.0, 30.0], [50.0, 20.0, 90.0, 60.0]]),
            gt_classes=torch.tensor([0, 1]),
        ),
        Instances(sizes[1], gt_boxes=Boxes([[5.0, 5.0, 25.0, 45.0]]), gt_classes=torch.tensor([0])),
    ][: len(sizes)]
    return images, feats, gt


def _randomize_head(rpn, seed=0, scale=0.3):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in rpn.rpn_head.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * scale)


def _plain_iou(a, b):
    lt = torch.maximum(a[:, None, :2], b[None, :, :2])
    rb = torch.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = (rb - lt).clamp(min=0).prod(dim=2)
    area = lambda t: (t[:, 2] - t[:, 0]) * (t[:, 3] - t[:, 1])  # noqa: E731
    return inter / (area(a)[:, None] + area(b)[None, :] - inter)


# --- head ---------------------------------------------------------------------------------------
def test_head_shapes_and_init():
    torch.manual_seed(0)
    head = StandardRPNHead(32, 3)
    logits, deltas = head([torch.randn(2, 32, 10, 12), torch.randn(2, 32, 5, 6)])
    assert [tuple(x.shape) for x in logits] == [(2, 3, 10, 12), (2, 3, 5, 6)]
    assert [tuple(x.shape) for x in deltas] == [(2, 12, 10, 12), (2, 12, 5, 6)]
    assert 0.008 < head.conv.weight.std().item() < 0.012
    for layer in (head.conv, head.objectness_logits, head.anchor_deltas):
        assert torch.count_nonzero(layer.bias) == 0
    with pytest.raises(ValueError, match="features\\[0\\]"):
        head([torch.randn(2, 16, 4, 4)])


# --- proposal selection -------------------------------------------------------------------------
def test_find_top_proposals_topk_per_level_and_per_image():
    # Level 0: 4 disjoint boxes; level 1: 3 disjoint boxes. pre_nms_topk=2 keeps the best 2 per level.
    lvl0 = torch.tensor([[0, 0, 10, 10], [20, 0, 30, 10], [40, 0, 50, 10], [60, 0, 70, 10]], dtype=torch.float32)
    lvl1 = torch.tensor([[0, 20, 10, 30], [20, 20, 30, 30], [40, 20, 50, 30]], dtype=torch.float32)
    boxes = [lvl0[None].repeat(2, 1, 1), lvl1[None].repeat(2, 1, 1)]
    scores = [
        torch.tensor([[0.1, 0.9, 0.5, 0.2], [0.4, 0.3, 0.2, 0.1]]),
        torch.tensor([[0.8, 0.0, 0.7], [0.6, 0.5, 0.9]]),
    ]
    out = find_top_rpn_proposals(boxes, scores, [(100, 100), (100, 100)], 0.7, pre_nms_topk=2, post_nms_topk=3)
    assert out[0].objectness_logits.tolist() == pytest.approx([0.9, 0.8, 0.7])
    torch.testing.assert_close(out[0].proposal_boxes.tensor, torch.stack([lvl0[1], lvl1[0], lvl1[2]]))
    # post_nms_topk is per image: image 1 gets its own 3.
    assert out[1].objectness_logits.tolist() == pytest.approx([0.9, 0.6, 0.4])


def test_nms_runs_within_levels_only():
    box = torch.tensor([[0.0, 0.0, 10.0, 10.0]])
    near = torch.tensor([[0.0, 0.0, 10.0, 9.5]])
    boxes = [torch.cat([box, near])[None], box[None]]
    scores = [torch.tensor([[2.0, 1.0]]), torch.tensor([[1.5]])]
    out = find_top_rpn_proposals(boxes, scores, [(20, 20)], 0.7, pre_nms_topk=10, post_nms_topk=10)[0]
    # `near` is suppressed by `box` on its level; the identical box on level 1 survives.
    assert out.objectness_logits.tolist() == [2.0, 1.5]


def test_clip_min_size_and_non_finite():
    boxes = torch.tensor(
        [[[-5.0, -5.0, 30.0, 12.0], [2.0, 2.0, 3.5, 9.0], [40.0, 40.0, 50.0, 50.0], [1.0, 1.0, 9.0, 9.0]]]
    )
    scores = torch.tensor([[4.0, 3.0, 2.0, 1.0]])
    out = find_top_rpn_proposals([boxes], [scores], [(16, 20)], 0.7, 10, 10, min_box_size=2.0)[0]
    # Box 0 clipped to the image, box 1 too narrow (1.5 <= 2), box 2 outside (empty after clipping).
    assert out.objectness_logits.tolist() == [4.0, 1.0]
    torch.testing.assert_close(out.proposal_boxes.tensor, torch.tensor([[0.0, 0.0, 20.0, 12.0], [1.0, 1.0, 9.0, 9.0]]))

    bad = boxes.clone()
    bad[0, 3, 2] = float("nan")
    out = find_top_rpn_proposals([bad], [scores], [(16, 20)], 0.7, 10, 10, training=False)[0]
    assert torch.isfinite(out.proposal_boxes.tensor).all() and 1.0 not in out.objectness_logits.tolist()
    with pytest.raises(FloatingPointError):
        find_top_rpn_proposals([bad], [scores], [(16, 20)], 0.7, 10, 10, training=True)


# --- the module ---------------------------------------------------------------------------------
def test_eval_outputs():
    rpn = _rpn().eval()
    _randomize_head(rpn)
    images, feats, _ = _inputs()
    proposals, losses = rpn(images, feats)
    assert losses == {}
    assert len(proposals) == 2
    for inst, (h, w) in zip(proposals, images.image_sizes):
        assert inst.image_size == (h, w)
        assert 0 < len(inst) <= 30
        scores = inst.objectness_logits
        assert torch.all(scores[:-1] >= scores[1:])
        b = inst.proposal_boxes.tensor
        assert (b[:, 0] >= 0).all() and (b[:, 1] >= 0).all() and (b[:, 2] <= w).all() and (b[:, 3] <= h).all()
        assert inst.proposal_boxes.nonempty().all()


def test_training_losses_and_detached_proposals():
    torch.manual_seed(0)
    rpn = _rpn().train()
    _randomize_head(rpn, scale=0.05)
    images, feats, gt = _inputs()
    proposals, losses = rpn(images, feats, gt)
    assert set(losses) == {"loss_rpn_cls", "loss_rpn_loc"}
    for v in losses.values():
        assert v.dim() == 0 and torch.isfinite(v) and v.item() > 0
    assert all(len(p) <= 40 for p in proposals)
    assert not proposals[0].proposal_boxes.tensor.requires_grad
    assert not proposals[0].objectness_logits.requires_grad
    sum(losses.values()).backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in rpn.rpn_head.parameters())
    with pytest.raises(ValueError, match="gt_instances"):
        rpn(images, feats)


def test_autocast_keeps_losses_and_proposals_in_float32():
    torch.manual_seed(0)
    rpn = _rpn().train()
    images, feats, gt = _inputs()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        proposals, losses = rpn(images, feats, gt)
    assert all(v.dtype == torch.float32 and torch.isfinite(v) for v in losses.values())
    assert proposals[0].proposal_boxes.tensor.dtype == torch.float32
    assert proposals[0].objectness_logits.dtype == torch.float32


@pytest.mark.parametrize("beta", [0.0, 0.3])
def test_losses_match_plain_reference(beta):
    # A sample larger than the anchor count with positive_fraction 1 takes every labelled anchor,
    # which makes the losses deterministic and checkable against a from-scratch computation.
    n = 10_000
    rpn = _rpn(batch_size_per_image=n, positive_fraction=1.0, smooth_l1_beta=beta, loss_weight=1.5).train()
    _randomize_head(rpn, scale=0.05)
    images, feats, gt = _inputs()
    _, losses = rpn(images, feats, gt)

    level_feats = [feats["p3"], feats["p4"]]
    anchors = torch.cat([a.tensor for a in rpn.anchor_generator(level_feats)])
    raw_logits, raw_deltas = rpn.rpn_head(level_feats)
    cls_sum = loc_sum = 0.0
    for i, inst in enumerate(gt):
        # Flatten in (y, x, anchor) order, the anchors' order.
        logits = torch.cat([x[i].permute(1, 2, 0).reshape(-1) for x in raw_logits])
        deltas = torch.cat([d[i].view(3, 4, *d.shape[-2:]).permute(2, 3, 0, 1).reshape(-1, 4) for d in raw_deltas])
        iou = _plain_iou(inst.gt_boxes.tensor, anchors)
        best, idx = iou.max(dim=0)
        labels = torch.full_like(best, -1.0)
        labels[best < 0.3] = 0.0
        labels[best >= 0.7] = 1.0
        for g in range(iou.shape[0]):
            labels[iou[g] == iou[g].max()] = 1.0
        valid = labels >= 0
        cls_sum = cls_sum + F.binary_cross_entropy_with_logits(logits[valid], labels[valid], reduction="sum")
        pos = labels == 1
        a, t = anchors[pos], inst.gt_boxes.tensor[idx[pos]]
        aw, ah, tw, th = a[:, 2] - a[:, 0], a[:, 3] - a[:, 1], t[:, 2] - t[:, 0], t[:, 3] - t[:, 1]
        target = torch.stack(
            [
                ((t[:, 0] + t[:, 2]) - (a[:, 0] + a[:, 2])) / 2 / aw,
                ((t[:, 1] + t[:, 3]) - (a[:, 1] + a[:, 3])) / 2 / ah,
                torch.log(tw / aw),
                torch.log(th / ah),
            ],
            dim=1,
        )
        diff = (deltas[pos] - target).abs()
        per = diff if beta == 0 else torch.where(diff < beta, 0.5 * diff**2 / beta, diff - 0.5 * beta)
        loc_sum = loc_sum + per.sum()
    norm = n * len(gt)
    torch.testing.assert_close(losses["loss_rpn_cls"], 1.5 * cls_sum / norm)
    torch.testing.assert_close(losses["loss_rpn_loc"], 1.5 * loc_sum / norm)


def test_sampling_counts_and_boundary():
    torch.manual_seed(0)
    rpn = _rpn(batch_size_per_image=64, positive_fraction=0.25)
    images, feats, gt = _inputs()
    anchors = rpn.anchor_generator([feats["p3"], feats["p4"]])
    labels, matched = rpn.label_and_sample_anchors(anchors, gt)
    total = sum(len(a) for a in anchors)
    assert labels.shape == (2, total) and matched.shape == (2, total, 4)
    for row in labels:
        assert (row == 1).sum() <= 16 and (row >= 0).sum() == 64

    big = 10_000
    all_anchors = Boxes.cat(anchors)
    keep_all = _rpn(batch_size_per_image=big, positive_fraction=1.0, anchor_boundary_thresh=-1)
    labels_all, _ = keep_all.label_and_sample_anchors(anchors, gt)
    strict = _rpn(batch_size_per_image=big, positive_fraction=1.0, anchor_boundary_thresh=0)
    labels_in, _ = strict.label_and_sample_anchors(anchors, gt)
    for i, inst in enumerate(gt):
        inside = all_anchors.inside_box(inst.image_size, 0)
        assert (~inside).any() and inside.any()
        assert (labels_in[i][~inside] == -1).all()
        assert (labels_all[i][~inside] >= 0).any()
        # Every ground truth still gets a positive inside anchor.
        assert (labels_in[i][inside] == 1).any()


def test_image_without_ground_truth():
    torch.manual_seed(0)
    rpn = _rpn().train()
    images, feats, gt = _inputs()
    gt[1] = Instances(gt[1].image_size, gt_boxes=Boxes(torch.zeros(0, 4)), gt_classes=torch.zeros(0, dtype=torch.int64))
    anchors = rpn.anchor_generator([feats["p3"], feats["p4"]])
    labels, _ = rpn.label_and_sample_anchors(anchors, gt)
    assert not (labels[1] == 1).any() and (labels[1] == 0).sum() == 256
    _, losses = rpn(images, feats, gt)
    assert all(torch.isfinite(v) for v in losses.values())


@pytest.mark.parametrize("loss_type", ["smooth_l1", "l1", "giou"])
def test_build_from_config(loss_type):
    cfg = get_cfg()
    cfg.MODEL.RPN.IN_FEATURES = ["p3", "p4"]
    cfg.MODEL.ANCHOR_GENERATOR.SIZES = [[16], [32]]
    cfg.MODEL.RPN.BBOX_REG_LOSS_TYPE = loss_type
    cfg.MODEL.RPN.POST_NMS_TOPK_TEST = 7
    shapes = {k: ShapeSpec(channels=CHANNELS, stride=s) for k, s in {"p2": 4, **STRIDES}.items()}
    rpn = build_proposal_generator(cfg, shapes)
    assert isinstance(rpn, RPN) and "RPN" in PROPOSAL_GENERATOR_REGISTRY
    assert rpn.anchor_generator.strides == [8, 16] and rpn.rpn_head.num_anchors == 3
    images, feats, gt = _inputs()
    _, losses = rpn.train()(images, feats, gt)
    assert all(torch.isfinite(v) and v > 0 for v in losses.values())
    proposals, _ = rpn.eval()(images, feats)
    assert all(len(p) <= 7 for p in proposals)

    cfg.MODEL.RPN.IN_FEATURES = ["p3", "p7"]
    with pytest.raises(ValueError, match="p7"):
        build_proposal_generator(cfg, shapes)


def test_tiny_rpn_learns():
    torch.manual_seed(0)
    h, w = 64, 64
    image = torch.zeros(1, 3, h, w)
    gt_boxes = torch.tensor([[8.0, 8.0, 28.0, 24.0], [36.0, 30.0, 60.0, 58.0]])
    for x1, y1, x2, y2 in gt_boxes.int().tolist():
        image[0, :, y1:y2, x1:x2] = 1.0
    gt = [Instances((h, w), gt_boxes=Boxes(gt_boxes), gt_classes=torch.tensor([0, 0]))]
    images = ImageList(image, [(h, w)])

    features = nn.Sequential(
        nn.Conv2d(3, CHANNELS, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.Conv2d(CHANNELS, CHANNELS, 3, stride=2, padding=1),
        nn.ReLU(),
    )
    rpn = _rpn(
        in_features=["p2"],
        anchor_generator=DefaultAnchorGenerator([[16, 32]], [[0.5, 1.0, 2.0]], [4]),
        head=StandardRPNHead(CHANNELS, 6),
        batch_size_per_image=64,
    ).train()
    params = list(features.parameters()) + list(rpn.parameters())
    opt = torch.optim.Adam(params, lr=0.01)
    history = []
    for _ in range(30):
        _, losses = rpn(images, {"p2": features(image)}, gt)
        loss = losses["loss_rpn_cls"] + losses["loss_rpn_loc"]
        opt.zero_grad()
        loss.backward()
        opt.step()
        history.append(loss.item())
    first, last = sum(history[:5]) / 5, sum(history[-5:]) / 5
    assert last < 0.5 * first, history

    proposals, _ = rpn.eval()(images, {"p2": features(image)})
    # The best 10 proposals already find both objects (an untrained head ranks anchors at random).
    top = proposals[0].proposal_boxes.tensor[:10]
    assert _plain_iou(gt_boxes, top).max(dim=1).values.min() > 0.4
