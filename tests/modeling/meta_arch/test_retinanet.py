"""RetinaNet, part by part and end to end: anchor labels (hand-computed), the losses against a
plain-PyTorch focal / box loss written here for each normalizer, inference against a plain
threshold → top-k → decode → per-class NMS reference, a training step and inference from the
shapes config, batched = one-by-one, and the errors."""
import contextlib
import math

import pytest
import torch
import torch.nn.functional as F

from detcore.modeling import RetinaNet, build_model
from detcore.structures import Boxes, Instances

from ..small_config import small_cfg

pytestmark = pytest.mark.usefixtures("single_thread")

CONFIG = "retinanet_R_18_FPN_shapes.yaml"


def _cfg(**overrides):
    settings = {"MODEL.RETINANET.SCORE_THRESH_TEST": 0.0, "MODEL.RETINANET.NORM": "", **overrides}
    return small_cfg(CONFIG, **settings)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return build_model(_cfg()).eval()


@contextlib.contextmanager
def _settings(model, **values):
    """Set model attributes for the duration of a block (the module's model is shared)."""
    saved = {k: getattr(model, k) for k in values}
    for k, v in values.items():
        setattr(model, k, v)
    try:
        yield model
    finally:
        for k, v in saved.items():
            setattr(model, k, v)


def _image(h, w, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (3, h, w), dtype=torch.uint8, generator=g)


def _gt(size=(64, 96)):
    return Instances(
        size,
        gt_boxes=Boxes(torch.tensor([[6.0, 8.0, 38.0, 40.0], [40.0, 12.0, 90.0, 60.0]])),
        gt_classes=torch.tensor([2, 0]),
    )


# --- anchor labels ------------------------------------------------------------------------------
def test_anchor_labels_hand_computed(model):
    # Anchor 0 is GT 0 (IoU 1): class 2. Anchor 1 lies in GT 1 with IoU 0.45 (ignored by the
    # thresholds) but is GT 1's best anchor, so the low-quality rule makes it class 0. Anchor 2
    # overlaps nothing and anchor 3 has IoU 0.3 with GT 1: background (3).
    anchors = [Boxes(torch.tensor([[6.0, 8.0, 38.0, 40.0], [40.0, 12.0, 90.0, 33.6]])),
               Boxes(torch.tensor([[100.0, 100.0, 120.0, 120.0], [40.0, 12.0, 55.0, 60.0]]))]
    iou_1 = (50 * 21.6) / (50 * 48)
    assert math.isclose(iou_1, 0.45)
    labels, boxes = model.label_anchors(anchors, [_gt()])
    assert labels.tolist() == [[2, 0, 3, 3]]
    assert boxes[0, 0].tolist() == [6.0, 8.0, 38.0, 40.0] and boxes[0, 1].tolist() == [40.0, 12.0, 90.0, 60.0]
    # Without low-quality matches anchor 1 is ignored.
    with _settings(model.anchor_matcher, allow_low_quality_matches=False):
        labels, _ = model.label_anchors(anchors, [_gt()])
    assert labels.tolist() == [[2, -1, 3, 3]]
    # An image without ground truth: all background.
    empty = Instances((64, 96), gt_boxes=Boxes(torch.zeros(0, 4)), gt_classes=torch.zeros(0, dtype=torch.int64))
    labels, boxes = model.label_anchors(anchors, [empty])
    assert labels.tolist() == [[3, 3, 3, 3]] and boxes.abs().sum() == 0


def test_a_class_outside_num_classes_is_named(model):
    gt = _gt()
    gt.gt_classes = torch.tensor([2, 3])
    with pytest.raises(ValueError, match=r"gt_classes must lie in \[0, 3\) \(MODEL.RETINANET.NUM_CLASSES\), got \[2, 3\]"):
        model.label_anchors([Boxes(torch.tensor([[0.0, 0.0, 10.0, 10.0]]))], [gt])


# --- losses -------------------------------------------------------------------------------------
def _plain_focal(logits, targets, alpha, gamma):
    p = torch.sigmoid(logits)
    ce = -(targets * torch.log(p) + (1 - targets) * torch.log(1 - p))
    p_t = p * targets + (1 - p) * (1 - targets)
    alpha_t = alpha * targets + (1 - alpha) * (1 - targets)
    return (alpha_t * (1 - p_t) ** gamma * ce).sum()


def _plain_deltas(src, dst):
    sw, sh = src[:, 2] - src[:, 0], src[:, 3] - src[:, 1]
    dw, dh = dst[:, 2] - dst[:, 0], dst[:, 3] - dst[:, 1]
    return torch.stack([
        (dst[:, 0] + dw / 2 - src[:, 0] - sw / 2) / sw, (dst[:, 1] + dh / 2 - src[:, 1] - sh / 2) / sh,
        torch.log(dw / sw), torch.log(dh / sh),
    ], dim=1)


def _loss_case(seed=0):
    g = torch.Generator().manual_seed(seed)
    num_images, num_classes = 2, 3
    sizes = [5, 7]  # anchors per level
    anchors = [Boxes(torch.rand(n, 2, generator=g).mul(50).repeat(1, 2) + torch.tensor([0.0, 0.0, 8.0, 12.0]) * (1 + torch.rand(n, 1, generator=g))) for n in sizes]
    logits = [torch.randn(num_images, n, num_classes, generator=g, dtype=torch.float64) for n in sizes]
    deltas = [torch.randn(num_images, n, 4, generator=g, dtype=torch.float64) * 0.3 for n in sizes]
    # Image 0: 4 foreground, image 1: 1 foreground; some ignored, the rest background (3).
    labels = torch.tensor([[0, 2, 3, -1, 3, 1, 3, 3, 1, -1, 3, 3], [3, 3, -1, 3, 3, 3, 2, 3, 3, 3, 3, -1]])
    gt_boxes = torch.cat([a.tensor for a in anchors])[None].repeat(num_images, 1, 1)
    gt_boxes = gt_boxes + torch.rand(gt_boxes.shape, generator=g) * 4 - 1
    gt_boxes[..., 2:] = torch.maximum(gt_boxes[..., 2:], gt_boxes[..., :2] + 2)
    return anchors, logits, labels, deltas, gt_boxes.double()


def _plain_losses(case, normalizer, alpha=0.25, gamma=2.0, beta=0.0):
    anchors, logits, labels, deltas, gt_boxes = case
    anchors = torch.cat([a.tensor for a in anchors]).double()
    logits, deltas = torch.cat(logits, 1), torch.cat(deltas, 1)
    cls, box, counts = [], [], []
    for i in range(len(labels)):
        valid = labels[i] >= 0
        fg = valid & (labels[i] < 3)
        targets = torch.zeros(int(valid.sum()), 3, dtype=torch.float64)
        fg_among_valid = fg[valid]
        targets[fg_among_valid, labels[i][valid][fg_among_valid]] = 1.0
        cls.append(_plain_focal(logits[i][valid], targets, alpha, gamma))
        diff = (deltas[i][fg] - _plain_deltas(anchors[fg], gt_boxes[i][fg])).abs()
        box.append((torch.where(diff < beta, 0.5 * diff**2 / beta, diff - 0.5 * beta) if beta > 0 else diff).sum())
        counts.append(int(fg.sum()))
    if normalizer == "per_image":
        return (sum(c / max(n, 1) for c, n in zip(cls, counts)) / len(cls),
                sum(b / max(n, 1) for b, n in zip(box, counts)) / len(box))
    total = max(sum(counts), 1)
    return sum(cls) / total, sum(box) / total


@pytest.mark.parametrize("normalizer", ["num_foreground", "per_image"])
@pytest.mark.parametrize("beta", [0.0, 0.11])
@pytest.mark.parametrize("gamma", [0.5, 2.0])  # the shapes config's and the paper's
def test_losses_match_a_plain_computation(model, normalizer, beta, gamma):
    """Values and the gradients of logits and deltas (per image weights with "per_image")."""

    def with_grad(case):
        anchors, logits, labels, deltas, gt_boxes = case
        logits = [x.clone().requires_grad_(True) for x in logits]
        deltas = [x.clone().requires_grad_(True) for x in deltas]
        return anchors, logits, labels, deltas, gt_boxes

    case, plain_case = with_grad(_loss_case()), with_grad(_loss_case())
    with _settings(model, loss_normalizer=normalizer, smooth_l1_beta=beta, focal_loss_gamma=gamma):
        losses = model.losses(*case)
    expected_cls, expected_box = _plain_losses(plain_case, normalizer, gamma=gamma, beta=beta)
    torch.testing.assert_close(losses["loss_cls"], expected_cls)
    torch.testing.assert_close(losses["loss_box_reg"], expected_box)
    leaves, plain_leaves = case[1] + case[3], plain_case[1] + plain_case[3]
    got = torch.autograd.grad(losses["loss_cls"] + 2 * losses["loss_box_reg"], leaves)
    expected = torch.autograd.grad(expected_cls + 2 * expected_box, plain_leaves)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b)


def test_per_image_and_batch_normalizers_differ_on_this_case(model):
    # 4 and 1 foreground anchors: averaging per image weighs image 1's anchors 4x more.
    a, b = _plain_losses(_loss_case(), "per_image"), _plain_losses(_loss_case(), "num_foreground")
    assert abs(a[0] - b[0]) > 0.5 and abs(a[1] - b[1]) > 0.02


def test_moving_average_normalizer_follows_detectron2():
    torch.manual_seed(0)
    model = build_model(_cfg(**{"MODEL.RETINANET.LOSS_NORMALIZER": "moving_average"})).train()
    case = _loss_case()
    assert model.moving_normalizer == 100.0
    first = model.losses(*case)
    expected = 0.9 * 100 + 0.1 * 5  # 5 foreground anchors in the batch
    assert math.isclose(model.moving_normalizer, expected)
    second = model.losses(*case)
    assert math.isclose(model.moving_normalizer, 0.9 * expected + 0.1 * 5)
    plain_cls, _ = _plain_losses(case, "num_foreground", gamma=model.focal_loss_gamma)
    torch.testing.assert_close(first["loss_cls"], plain_cls * 5 / expected)
    torch.testing.assert_close(second["loss_cls"], plain_cls * 5 / model.moving_normalizer)
    model.eval()  # evaluation does not move it
    model.losses(*case)
    assert math.isclose(model.moving_normalizer, 0.9 * expected + 0.1 * 5)


def test_giou_box_loss_is_on_decoded_boxes(model):
    generalized_box_iou_loss = pytest.importorskip("torchvision.ops").generalized_box_iou_loss
    case = _loss_case()
    with _settings(model, box_reg_loss_type="giou", loss_normalizer="num_foreground"):
        loss = model.losses(*case)["loss_box_reg"]
    anchors = torch.cat([a.tensor for a in case[0]]).double()
    deltas, labels, gt = torch.cat(case[3], 1), case[2], case[4]
    total = 0.0
    for i in range(2):
        fg = (labels[i] >= 0) & (labels[i] < 3)
        a, d = anchors[fg], deltas[i][fg]
        w, h = a[:, 2] - a[:, 0], a[:, 3] - a[:, 1]
        cx, cy = a[:, 0] + w / 2 + d[:, 0] * w, a[:, 1] + h / 2 + d[:, 1] * h
        pw, ph = w * torch.exp(d[:, 2]), h * torch.exp(d[:, 3])
        pred = torch.stack([cx - pw / 2, cy - ph / 2, cx + pw / 2, cy + ph / 2], 1)
        total = total + generalized_box_iou_loss(pred, gt[i][fg], reduction="sum")
    torch.testing.assert_close(loss, total / 5, rtol=1e-6, atol=1e-9)


# --- inference ----------------------------------------------------------------------------------
def _plain_nms(boxes, scores, classes, thresh):
    order = scores.argsort(descending=True)
    keep = []
    for i in order.tolist():
        ok = True
        for j in keep:
            if classes[i] != classes[j]:
                continue
            lt = torch.maximum(boxes[i, :2], boxes[j, :2])
            rb = torch.minimum(boxes[i, 2:], boxes[j, 2:])
            inter = (rb - lt).clamp(min=0).prod()
            area = lambda b: (b[2] - b[0]) * (b[3] - b[1])  # noqa: E731
            if inter / (area(boxes[i]) + area(boxes[j]) - inter) > thresh:
                ok = False
                break
        if ok:
            keep.append(i)
    return torch.tensor(keep, dtype=torch.int64)


def _plain_inference(anchors, logits, deltas, image_size, thresh, topk, nms, max_det, clip_before):
    """Threshold first, then the top k, as detectron2 and torchvision write it."""
    all_boxes, all_scores, all_classes = [], [], []
    h, w = image_size
    for a, lg, d in zip(anchors, logits, deltas):
        scores = torch.sigmoid(lg).flatten()
        idx = torch.nonzero(scores > thresh).squeeze(1)
        order = scores[idx].argsort(descending=True)[:topk]
        idx = idx[order]
        anchor, cls = idx // lg.shape[1], idx % lg.shape[1]
        src = a.tensor[anchor]
        sw, sh = src[:, 2] - src[:, 0], src[:, 3] - src[:, 1]
        dd = d[anchor]
        cx, cy = src[:, 0] + sw / 2 + dd[:, 0] * sw, src[:, 1] + sh / 2 + dd[:, 1] * sh
        pw = sw * torch.exp(dd[:, 2].clamp(max=math.log(1000 / 16)))
        ph = sh * torch.exp(dd[:, 3].clamp(max=math.log(1000 / 16)))
        all_boxes.append(torch.stack([cx - pw / 2, cy - ph / 2, cx + pw / 2, cy + ph / 2], 1))
        all_scores.append(scores[idx])
        all_classes.append(cls)
    boxes, scores, classes = torch.cat(all_boxes), torch.cat(all_scores), torch.cat(all_classes)
    clip = lambda b: torch.stack([b[:, 0].clamp(0, w), b[:, 1].clamp(0, h), b[:, 2].clamp(0, w), b[:, 3].clamp(0, h)], 1)  # noqa: E731
    if clip_before:
        boxes = clip(boxes)
    keep = _plain_nms(boxes, scores, classes, nms)[:max_det]
    return clip(boxes[keep]), scores[keep], classes[keep]


@pytest.mark.parametrize("clip_before", [False, True])
def test_inference_matches_a_plain_reference(model, clip_before):
    g = torch.Generator().manual_seed(3)
    image_size = (60, 80)
    counts = [40, 12, 3]
    anchors = []
    for n, size in zip(counts, (12.0, 24.0, 48.0)):
        centers = torch.rand(n, 2, generator=g) * torch.tensor([80.0, 60.0])
        anchors.append(Boxes(torch.cat([centers - size / 2, centers + size / 2], 1)))
    logits = [torch.randn(n, 3, generator=g) * 2 - 1 for n in counts]
    deltas = [torch.randn(n, 4, generator=g) * 0.2 for n in counts]
    settings = dict(
        test_score_thresh=0.3, test_topk_candidates=25, test_nms_thresh=0.5, max_detections_per_image=20,
        clip_before_nms=clip_before,
    )
    with _settings(model, **settings):
        got = model.inference_single_image(anchors, logits, deltas, image_size)
    boxes, scores, classes = _plain_inference(anchors, logits, deltas, image_size, 0.3, 25, 0.5, 20, clip_before)
    assert len(got) == len(boxes) == 20  # the cap binds, so the top-k and NMS order matter
    torch.testing.assert_close(got.scores, scores)
    assert got.pred_classes.tolist() == classes.tolist()
    torch.testing.assert_close(got.pred_boxes.tensor, boxes)


def test_inference_drops_non_finite_predictions(model):
    anchors = [Boxes(torch.tensor([[0.0, 0.0, 10.0, 10.0], [20.0, 20.0, 40.0, 40.0]]))]
    logits = [torch.tensor([[5.0, float("nan"), -9.0], [4.0, -9.0, -9.0]])]
    deltas = [torch.tensor([[0.0, 0.0, 0.0, 0.0], [float("inf"), 0.0, 0.0, 0.0]])]
    got = model.inference_single_image(anchors, logits, deltas, (50, 50))
    assert got.pred_classes.tolist() == [0, 2] and torch.isfinite(got.pred_boxes.tensor).all()


# --- end to end ---------------------------------------------------------------------------------
def test_trains_a_step_and_infers():
    torch.manual_seed(0)
    # GN with 64 channels (2 per group): P7 of a 64 px image is 1 x 1, and GroupNorm refuses
    # one value per group in training.
    model = build_model(_cfg(**{"MODEL.RETINANET.NORM": "GN", "MODEL.FPN.OUT_CHANNELS": 64}))
    assert isinstance(model, RetinaNet) and not model.mask_on
    model.train()
    inputs = [
        {"image": _image(64, 96, 1), "instances": _gt()},
        {"image": _image(50, 70, 2), "instances": Instances(
            (50, 70), gt_boxes=Boxes(torch.zeros(0, 4)), gt_classes=torch.zeros(0, dtype=torch.int64))},
    ]
    losses = model(inputs)
    assert set(losses) == {"loss_cls", "loss_box_reg"}
    assert all(v.dim() == 0 and torch.isfinite(v) and v > 0 for v in losses.values())
    sum(losses.values()).backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters() if p.requires_grad)
    assert model.head.cls_score.weight.grad.abs().sum() > 0 and model.head.bbox_pred.weight.grad.abs().sum() > 0

    model.eval()
    out = model([{"image": _image(60, 80, 3), "height": 90, "width": 120}])[0]["instances"]
    assert out.image_size == (90, 120) and set(out.fields()) == {"pred_boxes", "scores", "pred_classes"}
    assert 0 < len(out) <= 20
    boxes = out.pred_boxes.tensor
    assert (boxes[:, 0::2] <= 120).all() and (boxes[:, 1::2] <= 90).all() and (boxes >= 0).all()
    assert (out.scores[:-1] >= out.scores[1:]).all() and out.pred_classes.max() < 3


def test_a_batch_gives_each_images_detections(model):
    a, b = _image(64, 96, 4), _image(40, 50, 5)
    batch = model([{"image": a}, {"image": b}])
    for image, result in zip((a, b), batch):
        alone = model([{"image": image}])[0]["instances"]
        torch.testing.assert_close(result["instances"].pred_boxes.tensor, alone.pred_boxes.tensor)
        torch.testing.assert_close(result["instances"].scores, alone.scores)


def test_config_errors_are_named():
    with pytest.raises(ValueError, match="RetinaNet predicts boxes only: set MODEL.MASK_ON False"):
        build_model(_cfg(**{"MODEL.MASK_ON": True}))
    with pytest.raises(ValueError, match=r"MODEL.RETINANET.IN_FEATURES names \['p8'\]"):
        build_model(_cfg(**{"MODEL.RETINANET.IN_FEATURES": ["p3", "p8"]}))
    model = build_model(_cfg()).train()
    with pytest.raises(ValueError, match="RetinaNet in training mode needs 'instances'"):
        model([{"image": _image(32, 32)}])
