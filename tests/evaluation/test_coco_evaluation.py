"""COCOEvaluator against AP values worked out by hand for tiny ground truth / detection pairs."""
import json
import logging
import math
import os
import sys
import types

import numpy as np
import pycocotools.mask as mask_util
import pytest
import torch
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from detcore.evaluation import METRICS_FILE, RESULTS_FILE, COCOEvaluator, instances_to_coco_json
from detcore.structures import Boxes, Instances

H = W = 200


# --- helpers ------------------------------------------------------------------------------------
def box_ann(ann_id, image_id, category_id, xywh, segmentation=None, area=None):
    x, y, w, h = xywh
    ann = {
        "id": ann_id,
        "image_id": image_id,
        "category_id": category_id,
        "bbox": [float(v) for v in xywh],
        "area": float(w * h) if area is None else float(area),
        "iscrowd": 0,
    }
    # A rectangle polygon by default, so that the file is valid for segm too.
    ann["segmentation"] = segmentation or [[x, y, x + w, y, x + w, y + h, x, y + h]]
    return ann


def write_gt(tmp_path, annotations, num_images=1, categories=((1, "thing"),), name="gt.json"):
    data = {
        "images": [{"id": i, "width": W, "height": H, "file_name": f"{i}.png"} for i in range(1, num_images + 1)],
        "annotations": annotations,
        "categories": [{"id": cid, "name": cname} for cid, cname in categories],
    }
    path = os.path.join(str(tmp_path), name)
    with open(path, "w") as f:
        json.dump(data, f)
    return path


def prediction(boxes_xyxy, scores, classes, masks=None, size=(H, W)):
    inst = Instances(
        size,
        pred_boxes=Boxes(torch.tensor(boxes_xyxy, dtype=torch.float32).reshape(-1, 4)),
        scores=torch.tensor(scores, dtype=torch.float32),
        pred_classes=torch.tensor(classes, dtype=torch.int64),
    )
    if masks is not None:
        inst.pred_masks = torch.as_tensor(np.asarray(masks, dtype=bool)).reshape(-1, *size)
    return {"instances": inst}


def empty_prediction(size=(H, W), with_masks=False):
    return prediction(np.zeros((0, 4)), [], [], masks=np.zeros((0, *size), bool) if with_masks else None, size=size)


def run(evaluator, per_image):
    """per_image: {image_id: output dict}; one process() call per image."""
    evaluator.reset()
    for image_id, output in per_image.items():
        evaluator.process([{"image_id": image_id}], [output])
    return evaluator.evaluate()


def coco_ap(tp_flags, num_gt):
    """Independent COCO AP of one ranked detection list (highest score first): 101 recall points,
    precision made non-increasing from the right, first point whose recall reaches each level."""
    flags = np.asarray(tp_flags, dtype=np.float64)
    tp, fp = np.cumsum(flags), np.cumsum(1 - flags)
    recall, precision = tp / num_gt, tp / (tp + fp)
    for i in range(len(precision) - 2, -1, -1):
        precision[i] = max(precision[i], precision[i + 1])
    total = 0.0
    for r in np.linspace(0, 1, 101):
        reached = np.nonzero(recall >= r)[0]
        total += precision[reached[0]] if reached.size else 0.0
    return total / 101


def xyxy(xywh):
    x, y, w, h = xywh
    return [x, y, x + w, y + h]


def box_iou(a, b):
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    area = lambda t: (t[2] - t[0]) * (t[3] - t[1])  # noqa: E731
    return inter / (area(a) + area(b) - inter)


def polygon_mask(poly):
    """The pixels pycocotools assigns to a polygon (the ground truth's own rasterization)."""
    rle = mask_util.merge(mask_util.frPyObjects([poly], H, W))
    return mask_util.decode(rle).astype(bool)


def mask_box(mask):
    """Tight xyxy box of a mask (pixel j spans [j, j + 1))."""
    ys, xs = np.nonzero(mask)
    return [float(xs.min()), float(ys.min()), float(xs.max() + 1), float(ys.max() + 1)]


def xywh(box):
    return (box[0], box[1], box[2] - box[0], box[3] - box[1])


# --- box AP -------------------------------------------------------------------------------------
def test_perfect_detections_give_ap_100_in_every_size_bucket(tmp_path):
    small, medium, large = (10, 10, 20, 20), (40, 40, 50, 50), (60, 60, 120, 120)
    gt = write_gt(tmp_path, [box_ann(1, 1, 1, small), box_ann(2, 1, 1, medium), box_ann(3, 2, 1, large)], num_images=2)
    ev = COCOEvaluator(gt, tasks=("bbox",))
    res = run(ev, {1: prediction([xyxy(small), xyxy(medium)], [0.9, 0.8], [0, 0]), 2: prediction([xyxy(large)], [0.7], [0])})
    assert list(res) == ["bbox"]
    for name in ("AP", "AP50", "AP75", "APs", "APm", "APl", "AP-thing"):
        assert res["bbox"][name] == pytest.approx(100.0), name


def test_shifted_box_matches_only_thresholds_below_its_iou(tmp_path):
    gt_box = (20, 20, 100, 100)  # area 10000: "large"
    pred_box = [40, 20, 140, 120]  # shifted 20 px right
    iou = box_iou(xyxy(gt_box), pred_box)
    assert iou == pytest.approx(2 / 3)
    # Matched at IoU thresholds 0.50, 0.55, 0.60, 0.65; missed at 0.70 ... 0.95.
    matched = sum(iou >= t for t in np.linspace(0.5, 0.95, 10))
    assert matched == 4
    ev = COCOEvaluator(write_gt(tmp_path, [box_ann(1, 1, 1, gt_box)]), tasks="bbox")
    res = run(ev, {1: prediction([pred_box], [0.9], [0])})["bbox"]
    assert res["AP50"] == pytest.approx(100.0)
    assert res["AP75"] == pytest.approx(0.0)
    assert res["AP"] == pytest.approx(100.0 * matched / 10)
    assert res["APl"] == pytest.approx(40.0)
    # No ground truth in the small / medium buckets: NaN, not COCOeval's -1.
    assert math.isnan(res["APs"]) and math.isnan(res["APm"])


def test_false_positive_with_higher_score_lowers_ap(tmp_path):
    gt_box = (20, 20, 60, 60)
    ev = COCOEvaluator(write_gt(tmp_path, [box_ann(1, 1, 1, gt_box)]), tasks="bbox")
    # FP first (score .9), then TP (.8): precision 1/2 at recall 1 -> AP 0.5 at every IoU.
    res = run(ev, {1: prediction([[150, 150, 190, 190], xyxy(gt_box)], [0.9, 0.8], [0, 0])})["bbox"]
    assert coco_ap([0, 1], 1) == pytest.approx(0.5)
    assert res["AP"] == pytest.approx(50.0)
    assert res["AP50"] == pytest.approx(50.0)
    # The same detections with the FP scored lower do not hurt.
    res = run(ev, {1: prediction([[150, 150, 190, 190], xyxy(gt_box)], [0.7, 0.8], [0, 0])})["bbox"]
    assert res["AP"] == pytest.approx(100.0)


def test_ranked_tp_fp_list_across_images_matches_hand_ap(tmp_path):
    a, b = (10, 10, 50, 50), (100, 100, 60, 40)
    gt = write_gt(tmp_path, [box_ann(1, 1, 1, a), box_ann(2, 2, 1, b)], num_images=2)
    ev = COCOEvaluator(gt, tasks="bbox")
    # Ranking: TP(A) .9, FP .8 (image 1, far from A), TP(B) .7.
    res = run(
        ev,
        {
            1: prediction([xyxy(a), [120, 10, 180, 60]], [0.9, 0.8], [0, 0]),
            2: prediction([xyxy(b)], [0.7], [0]),
        },
    )["bbox"]
    expected = coco_ap([1, 0, 1], 2)
    assert expected == pytest.approx((51 + 50 * 2 / 3) / 101)
    assert res["AP"] == pytest.approx(100 * expected)
    assert res["AP50"] == pytest.approx(100 * expected)


def test_only_processed_images_are_scored(tmp_path):
    a, b = (10, 10, 50, 50), (100, 100, 60, 40)
    ev = COCOEvaluator(write_gt(tmp_path, [box_ann(1, 1, 1, a), box_ann(2, 2, 1, b)], num_images=2), tasks="bbox")
    assert run(ev, {1: prediction([xyxy(a)], [0.9], [0])})["bbox"]["AP"] == pytest.approx(100.0)
    # Image 2 processed with no detections: its ground truth is missed, recall stops at 1/2.
    res = run(ev, {1: prediction([xyxy(a)], [0.9], [0]), 2: empty_prediction()})["bbox"]
    assert res["AP"] == pytest.approx(100 * coco_ap([1], 2))
    assert res["AP"] == pytest.approx(100 * 51 / 101)


def test_repeated_image_counts_once(tmp_path, caplog):
    a = (10, 10, 50, 50)
    ev = COCOEvaluator(write_gt(tmp_path, [box_ann(1, 1, 1, a)]), tasks="bbox")
    ev.reset()
    ev.process([{"image_id": 1}], [prediction([xyxy(a)], [0.9], [0])])
    # A padded distributed sampler repeats an image: without dedup this would add a FP.
    ev.process([{"image_id": 1}], [prediction([xyxy(a)], [0.9], [0])])
    with caplog.at_level(logging.WARNING):
        res = ev.evaluate()
    assert res["bbox"]["AP"] == pytest.approx(100.0)
    assert "more than once" in caplog.text


# --- mask AP ------------------------------------------------------------------------------------
def test_segm_perfect_masks_give_100(tmp_path):
    triangle = [20.0, 20.0, 90.0, 30.0, 40.0, 110.0]
    ell = [100.0, 100.0, 180.0, 100.0, 180.0, 120.0, 120.0, 120.0, 120.0, 190.0, 100.0, 190.0]
    masks = [polygon_mask(triangle), polygon_mask(ell)]
    anns = [
        box_ann(i + 1, 1, 1, xywh(mask_box(m)), segmentation=[poly], area=int(m.sum()))
        for i, (poly, m) in enumerate(zip([triangle, ell], masks))
    ]
    ev = COCOEvaluator(write_gt(tmp_path, anns))
    res = run(ev, {1: prediction([mask_box(m) for m in masks], [0.9, 0.8], [0, 0], masks=np.stack(masks))})
    assert list(res) == ["bbox", "segm"]
    for name in ("AP", "AP50", "AP75"):
        assert res["segm"][name] == pytest.approx(100.0)
        assert res["bbox"][name] == pytest.approx(100.0)


def test_segm_partial_mask_known_iou(tmp_path):
    rect = [10.0, 10.0, 60.0, 10.0, 60.0, 30.0, 10.0, 30.0]
    gt_mask = polygon_mask(rect)
    assert gt_mask.sum() == 1000  # 50 x 20 pixels
    pred_mask = gt_mask.copy()
    pred_mask[:, 46:] = False  # keep 36 of 50 columns
    iou = (pred_mask & gt_mask).sum() / (pred_mask | gt_mask).sum()
    assert iou == pytest.approx(0.72)
    ann = box_ann(1, 1, 1, (10, 10, 50, 20), segmentation=[rect], area=1000)
    ev = COCOEvaluator(write_gt(tmp_path, [ann]), tasks=("segm",))
    res = run(ev, {1: prediction([[10, 10, 60, 30]], [0.9], [0], masks=pred_mask[None])})
    assert list(res) == ["segm"]
    # IoU .72 clears thresholds 0.50 ... 0.70: 5 of 10.
    assert res["segm"]["AP50"] == pytest.approx(100.0)
    assert res["segm"]["AP75"] == pytest.approx(0.0)
    assert res["segm"]["AP"] == pytest.approx(50.0)
    # 1000 px < 32^2: a "small" object.
    assert res["segm"]["APs"] == pytest.approx(50.0)


def test_segm_skipped_when_predictions_have_no_masks(tmp_path, caplog):
    a = (10, 10, 50, 50)
    ev = COCOEvaluator(write_gt(tmp_path, [box_ann(1, 1, 1, a)]))
    with caplog.at_level(logging.WARNING):
        res = run(ev, {1: prediction([xyxy(a)], [0.9], [0])})
    assert list(res) == ["bbox"]
    assert "skipping 'segm'" in caplog.text


# --- category ids -------------------------------------------------------------------------------
CATS = ((1, "cat"), (5, "dog"), (9, "bird"))
BOXES = {1: (10, 10, 40, 40), 5: (80, 10, 40, 40), 9: (10, 100, 60, 60)}


def three_class_gt(tmp_path):
    anns = [box_ann(i + 1, 1, cid, BOXES[cid]) for i, cid in enumerate((1, 5, 9))]
    return write_gt(tmp_path, anns, categories=CATS)


def test_category_ids_remapped_from_contiguous(tmp_path):
    ev = COCOEvaluator(three_class_gt(tmp_path), tasks="bbox", output_dir=str(tmp_path / "out"))
    assert ev.dataset_id_to_contiguous_id == {1: 0, 5: 1, 9: 2}  # sorted json ids
    boxes = [xyxy(BOXES[c]) for c in (1, 5, 9)]
    res = run(ev, {1: prediction(boxes, [0.9, 0.8, 0.7], [0, 1, 2])})["bbox"]
    assert res["AP"] == pytest.approx(100.0)
    assert res["AP-cat"] == res["AP-dog"] == res["AP-bird"] == pytest.approx(100.0)
    with open(tmp_path / "out" / RESULTS_FILE) as f:
        assert [r["category_id"] for r in json.load(f)] == [1, 5, 9]

    # Swapping the classes of the first two boxes makes both of them wrong.
    res = run(ev, {1: prediction(boxes, [0.9, 0.8, 0.7], [1, 0, 2])})["bbox"]
    assert res["AP-cat"] == pytest.approx(0.0) and res["AP-dog"] == pytest.approx(0.0)
    assert res["AP-bird"] == pytest.approx(100.0)
    assert res["AP"] == pytest.approx(100.0 / 3)


def test_explicit_and_metadata_mappings(tmp_path):
    gt = three_class_gt(tmp_path)
    mapping = {9: 0, 5: 1, 1: 2}
    boxes = [xyxy(BOXES[c]) for c in (1, 5, 9)]
    ev = COCOEvaluator(gt, tasks="bbox", dataset_id_to_contiguous_id=mapping)
    assert run(ev, {1: prediction(boxes, [0.9, 0.8, 0.7], [2, 1, 0])})["bbox"]["AP"] == pytest.approx(100.0)

    calls = []

    def metadata_fn(name):
        calls.append(name)
        return types.SimpleNamespace(json_file=gt, thing_dataset_id_to_contiguous_id=mapping)

    ev = COCOEvaluator("toy_val", tasks="bbox", metadata_fn=metadata_fn)
    assert calls == ["toy_val"] and ev.dataset_id_to_contiguous_id == mapping
    assert run(ev, {1: prediction(boxes, [0.9, 0.8, 0.7], [2, 1, 0])})["bbox"]["AP"] == pytest.approx(100.0)
    # A dict works as metadata too; without a mapping the json's sorted ids are used.
    ev = COCOEvaluator("toy_val", tasks="bbox", metadata_fn=lambda name: {"json_file": gt})
    assert ev.dataset_id_to_contiguous_id == {1: 0, 5: 1, 9: 2}


def test_bad_mappings_and_classes_raise(tmp_path):
    gt = three_class_gt(tmp_path)
    with pytest.raises(ValueError, match="not in"):
        COCOEvaluator(gt, dataset_id_to_contiguous_id={1: 0, 5: 1, 7: 2})
    with pytest.raises(ValueError, match="0..2"):
        COCOEvaluator(gt, dataset_id_to_contiguous_id={1: 0, 5: 1, 9: 3})
    ev = COCOEvaluator(gt, tasks="bbox")
    with pytest.raises(ValueError, match="pred_classes holds 3"):
        ev.process([{"image_id": 1}], [prediction([[0, 0, 5, 5]], [0.5], [3])])


def test_category_without_ground_truth_is_nan(tmp_path):
    anns = [box_ann(1, 1, 1, BOXES[1])]
    ev = COCOEvaluator(write_gt(tmp_path, anns, categories=CATS), tasks="bbox")
    res = run(ev, {1: prediction([xyxy(BOXES[1])], [0.9], [0])})["bbox"]
    assert res["AP-cat"] == pytest.approx(100.0)
    assert math.isnan(res["AP-dog"]) and math.isnan(res["AP-bird"])
    assert res["AP"] == pytest.approx(100.0)  # the mean skips categories without ground truth
    ev = COCOEvaluator(write_gt(tmp_path, anns, categories=CATS), tasks="bbox", per_category_ap=False)
    assert "AP-cat" not in run(ev, {1: prediction([xyxy(BOXES[1])], [0.9], [0])})["bbox"]


# --- empty input, files, errors -----------------------------------------------------------------
def test_no_detections_give_zero_where_there_is_ground_truth_and_strict_json(tmp_path, caplog):
    # xywh (10, 10, 40, 40): area 1600, a "medium" object; no small or large ground truth.
    ev = COCOEvaluator(write_gt(tmp_path, [box_ann(1, 1, 1, (10, 10, 40, 40))]), output_dir=str(tmp_path / "out"))
    with caplog.at_level(logging.WARNING):
        res = run(ev, {1: empty_prediction(with_masks=True)})
    assert list(res) == ["bbox", "segm"]
    for task in res.values():
        assert {k: v for k, v in task.items() if not math.isnan(v)} == {
            "AP": 0.0, "AP50": 0.0, "AP75": 0.0, "APm": 0.0, "AP-thing": 0.0
        }
        assert math.isnan(task["APs"]) and math.isnan(task["APl"])  # nothing to miss there
    assert "no predictions" in caplog.text
    with open(tmp_path / "out" / RESULTS_FILE) as f:
        assert json.load(f) == []
    text = (tmp_path / "out" / METRICS_FILE).read_text()
    assert "NaN" not in text
    saved = json.loads(text, parse_constant=lambda token: pytest.fail(f"non-JSON token {token}"))
    assert saved["bbox"]["APs"] is None and saved["bbox"]["AP"] == 0.0


def test_empty_area_buckets_are_null_in_the_metrics_file(tmp_path):
    ev = COCOEvaluator(write_gt(tmp_path, [box_ann(1, 1, 1, (10, 10, 40, 40))]), ("bbox",), output_dir=str(tmp_path / "out"))
    res = run(ev, {1: prediction([[10.0, 10.0, 50.0, 50.0]], [0.9], [0])})
    assert res["bbox"]["AP"] == pytest.approx(100.0) and math.isnan(res["bbox"]["APs"])
    saved = json.loads((tmp_path / "out" / METRICS_FILE).read_text(), parse_constant=lambda t: pytest.fail(t))
    assert saved["bbox"]["APs"] is None and saved["bbox"]["APl"] is None


def test_unusable_ground_truth_is_dropped_as_in_training(tmp_path, caplog):
    # A NaN polygon, a polygon of 2 points, a negative-width box and an absurd coordinate: pycocotools
    # would crash or count them as missed. They are dropped with a logged count, by the loader's rule.
    bad = [
        box_ann(2, 1, 1, (5, 5, 10, 10), segmentation=[[5, 5, float("nan"), 5, 15, 15]]),
        box_ann(3, 1, 1, (5, 5, 10, 10), segmentation=[[5, 5, 15, 5]]),
        box_ann(4, 1, 1, (60, 5, -10, 10)),
        box_ann(5, 1, 1, (5, 5, 10, 10), segmentation=[[5, 5, 1e9, 5, 15, 15]]),
    ]
    ev = COCOEvaluator(write_gt(tmp_path, [box_ann(1, 1, 1, (10, 10, 40, 40))] + bad), output_dir=str(tmp_path / "out"))
    assert "dropped 4 unusable annotation(s)" in caplog.text and "annotation ids 4" in caplog.text
    res = run(ev, {1: prediction([[10.0, 10.0, 50.0, 50.0]], [0.9], [0], masks=[polygon_mask([10, 10, 50, 10, 50, 50, 10, 50])])})
    assert res["bbox"]["AP"] == pytest.approx(100.0) and res["segm"]["AP"] == pytest.approx(100.0)


def test_nothing_processed_gives_empty_result(tmp_path, caplog):
    ev = COCOEvaluator(write_gt(tmp_path, [box_ann(1, 1, 1, (10, 10, 50, 50))]))
    ev.reset()
    with caplog.at_level(logging.WARNING):
        assert ev.evaluate() == {}
    assert "no images were processed" in caplog.text


def test_results_and_metrics_files_load_with_pycocotools(tmp_path):
    triangle = [20.0, 20.0, 90.0, 30.0, 40.0, 110.0]
    m = polygon_mask(triangle)
    gt = write_gt(tmp_path, [box_ann(1, 1, 1, (20, 20, 70, 90), segmentation=[triangle], area=int(m.sum()))])
    out = tmp_path / "eval"
    ev = COCOEvaluator(gt, output_dir=str(out))
    res = run(ev, {1: prediction([mask_box(m), [0, 0, 10, 10]], [0.9, 0.3], [0, 0], masks=np.stack([m, np.zeros_like(m)]))})

    with open(out / RESULTS_FILE) as f:
        saved = json.load(f)
    assert len(saved) == 2 and isinstance(saved[0]["segmentation"]["counts"], str)
    assert saved[0]["bbox"] == pytest.approx(list(xywh(mask_box(m))))
    coco_gt = COCO(gt)
    coco_dt = coco_gt.loadRes(str(out / RESULTS_FILE))
    assert len(coco_dt.anns) == 2
    assert np.array_equal(coco_dt.annToMask(coco_dt.anns[1]).astype(bool), m)
    # Evaluating the saved file directly gives the evaluator's bbox AP.
    e = COCOeval(coco_gt, coco_dt, "bbox")
    e.evaluate()
    e.accumulate()
    e.summarize()
    assert res["bbox"]["AP"] == pytest.approx(100 * e.stats[0])

    with open(out / METRICS_FILE) as f:
        metrics = json.load(f)
    assert set(metrics) == {"bbox", "segm"}
    assert metrics["segm"]["AP"] == pytest.approx(res["segm"]["AP"])


def test_summary_table_is_printed(tmp_path, capsys):
    a = (10, 10, 50, 50)
    run(COCOEvaluator(write_gt(tmp_path, [box_ann(1, 1, 1, a)]), tasks="bbox"), {1: prediction([xyxy(a)], [0.9], [0])})
    out = capsys.readouterr().out
    assert out.count("Average Precision") == 6 and out.count("Average Recall") == 6
    assert "loading annotations" not in out  # pycocotools' chatter is kept out of stdout


def test_invalid_inputs_raise(tmp_path):
    gt = write_gt(tmp_path, [box_ann(1, 1, 1, (10, 10, 50, 50))])
    with pytest.raises(ValueError, match="tasks"):
        COCOEvaluator(gt, tasks=("keypoint",))
    with pytest.raises(ValueError, match="neither a json file nor a registered dataset"):
        COCOEvaluator("no_such_dataset")
    with pytest.raises(ValueError, match="json_file"):
        COCOEvaluator("toy", metadata_fn=lambda name: {"json_file": str(tmp_path / "missing.json")})
    ev = COCOEvaluator(gt)
    with pytest.raises(ValueError, match="image_id"):
        ev.process([{"file_name": "x.png"}], [empty_prediction()])
    with pytest.raises(ValueError, match="instances"):
        ev.process([{"image_id": 1}], [{"proposals": None}])
    with pytest.raises(ValueError, match="1 inputs but 2 outputs"):
        ev.process([{"image_id": 1}], [empty_prediction(), empty_prediction()])
    # Unpasted [N, 1, M, M] masks and float probabilities are caught with a hint.
    bad = prediction([[0, 0, 5, 5]], [0.5], [0])
    bad["instances"].pred_masks = torch.zeros(1, 1, 28, 28, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"pred_masks must be bool \[N, H, W\]"):
        ev.process([{"image_id": 1}], [bad])
    bad["instances"].remove("pred_masks")
    bad["instances"].pred_masks = torch.zeros(1, H, W)
    with pytest.raises(ValueError, match="threshold"):
        ev.process([{"image_id": 1}], [bad])
    # An image id that is not in the json.
    ev.reset()
    ev.process([{"image_id": 42}], [empty_prediction()])
    with pytest.raises(ValueError, match=r"\[42\]"):
        ev.evaluate()


def test_instances_to_coco_json_converts_boxes_and_masks():
    mask = np.zeros((6, 8), bool)
    mask[1:3, 2:5] = True
    inst = prediction([[2.0, 1.0, 5.0, 3.0]], [0.25], [1], masks=mask[None], size=(6, 8))["instances"]
    (res,) = instances_to_coco_json(inst, 7, {0: 3, 1: 11})
    assert res["image_id"] == 7 and res["category_id"] == 11 and res["score"] == pytest.approx(0.25)
    assert res["bbox"] == [2.0, 1.0, 3.0, 2.0]
    assert res["segmentation"]["size"] == [6, 8]
    decoded = mask_util.decode({"size": [6, 8], "counts": res["segmentation"]["counts"].encode()})
    assert np.array_equal(decoded.astype(bool), mask)
    assert instances_to_coco_json(empty_prediction()["instances"], 1) == []


# --- backends and ranks ---------------------------------------------------------------------------
def test_faster_coco_eval_is_used_when_importable(tmp_path, monkeypatch):
    """A stand-in module exposing faster_coco_eval's names (backed by pycocotools) checks the
    selection and that only the API the two share is used."""
    used = []

    class FakeCOCO(COCO):
        def __init__(self, path=None):
            used.append("COCO")
            super().__init__(path)

    class FakeCOCOevalFaster(COCOeval):
        def evaluate(self):
            used.append("evaluate")
            super().evaluate()

    fake = types.ModuleType("faster_coco_eval")
    fake.COCO, fake.COCOeval_faster = FakeCOCO, FakeCOCOevalFaster
    monkeypatch.setitem(sys.modules, "faster_coco_eval", fake)
    a = (10, 10, 50, 50)
    gt = write_gt(tmp_path, [box_ann(1, 1, 1, a)])
    ev = COCOEvaluator(gt, tasks="bbox")
    assert ev.backend == "faster_coco_eval"
    assert run(ev, {1: prediction([xyxy(a)], [0.9], [0])})["bbox"]["AP"] == pytest.approx(100.0)
    assert used == ["COCO", "evaluate"]
    assert COCOEvaluator(gt, tasks="bbox", use_fast_impl=False).backend == "pycocotools"


def test_without_faster_coco_eval_falls_back_to_pycocotools(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "faster_coco_eval", None)  # makes the import fail
    ev = COCOEvaluator(write_gt(tmp_path, [box_ann(1, 1, 1, (10, 10, 50, 50))]), tasks="bbox")
    assert ev.backend == "pycocotools"


def _distributed_worker(rank, world_size, init_file, gt, out_file):
    torch.distributed.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        ev = COCOEvaluator(gt, tasks="bbox")
        boxes = {1: (10, 10, 50, 50), 2: (100, 100, 60, 40)}
        # Rank 0 sees image 1 (perfect), rank 1 sees image 2 (a miss plus a false positive).
        if rank == 0:
            outputs = {1: prediction([xyxy(boxes[1])], [0.9], [0])}
        else:
            outputs = {2: prediction([[0, 0, 20, 20]], [0.95], [0])}
        res = run(ev, outputs)
        if rank == 0:
            with open(out_file, "w") as f:
                json.dump(res, f)
        else:
            assert res == {}
    finally:
        torch.distributed.destroy_process_group()


def test_predictions_are_gathered_across_ranks(tmp_path):
    if not torch.distributed.is_available():
        pytest.skip("torch.distributed is not available in this build")
    import torch.multiprocessing as mp

    boxes = {1: (10, 10, 50, 50), 2: (100, 100, 60, 40)}
    gt = write_gt(tmp_path, [box_ann(1, 1, 1, boxes[1]), box_ann(2, 2, 1, boxes[2])], num_images=2)
    out_file = str(tmp_path / "rank0.json")
    mp.spawn(_distributed_worker, args=(2, str(tmp_path / "init"), gt, out_file), nprocs=2, join=True)
    with open(out_file) as f:
        res = json.load(f)
    # Both ranks' detections count: FP (.95) before TP (.9), two ground truths.
    assert res["bbox"]["AP"] == pytest.approx(100 * coco_ap([0, 1], 2))
    single = run(
        COCOEvaluator(gt, tasks="bbox"),
        {1: prediction([xyxy(boxes[1])], [0.9], [0]), 2: prediction([[0, 0, 20, 20]], [0.95], [0])},
    )
    assert res["bbox"]["AP"] == pytest.approx(single["bbox"]["AP"])


# --- proposal recall ----------------------------------------------------------------------------
def proposals(boxes_xyxy, objectness, size=(H, W)):
    return {
        "proposals": Instances(
            size,
            proposal_boxes=Boxes(torch.tensor(boxes_xyxy, dtype=torch.float32).reshape(-1, 4)),
            objectness_logits=torch.tensor(objectness, dtype=torch.float32),
        )
    }


def test_box_proposals_report_ar_at_100_and_1000_by_size(tmp_path):
    # Image 1: a medium object [10, 10, 60, 60] (area 2500), matched exactly by a proposal that is
    # only 121st by objectness: missed at AR@100, found at AR@1000. The proposals come unsorted.
    # Image 2: a small object [100, 100, 120, 120] (area 400), covered rows 100..116.6: IoU 0.83,
    # counted at the thresholds 0.50 .. 0.80 (7 of 10).
    gt = write_gt(tmp_path, [box_ann(1, 1, 1, (10, 10, 50, 50)), box_ann(2, 2, 1, (100, 100, 20, 20))], num_images=2)
    decoys = [[150.0 + i % 5, 150.0, 160.0 + i % 5, 160.0] for i in range(150)]
    boxes = decoys[:75] + [[10.0, 10.0, 60.0, 60.0]] + decoys[75:]
    objectness = list(np.linspace(5.0, 1.0, 120)) + [0.5] + list(np.linspace(0.4, 0.0, 30))
    objectness = objectness[:75] + [objectness[120]] + objectness[75:120] + objectness[121:]  # the good one at rank 121
    ev = COCOEvaluator(gt, tasks=("box_proposals",), output_dir=str(tmp_path / "out"))
    results = run(ev, {1: proposals(boxes, objectness), 2: proposals([[100.0, 100.0, 120.0, 116.6]], [0.0])})
    metrics = results["box_proposals"]
    assert metrics["AR@100"] == pytest.approx((0 + 7) / 20 * 100)
    assert metrics["AR@1000"] == pytest.approx((10 + 7) / 20 * 100)
    assert metrics["ARs@100"] == pytest.approx(70.0) and metrics["ARs@1000"] == pytest.approx(70.0)
    assert metrics["ARm@100"] == 0.0 and metrics["ARm@1000"] == 100.0
    assert math.isnan(metrics["ARl@100"]) and math.isnan(metrics["ARl@1000"])
    saved = json.loads((tmp_path / "out" / METRICS_FILE).read_text())
    assert saved["box_proposals"]["AR@1000"] == pytest.approx(85.0) and saved["box_proposals"]["ARl@100"] is None
    assert not (tmp_path / "out" / RESULTS_FILE).exists()  # no detections to save


def test_box_proposals_need_proposals_and_ignore_crowds(tmp_path):
    crowd = box_ann(2, 1, 1, (100, 100, 50, 50))
    crowd["iscrowd"] = 1
    gt = write_gt(tmp_path, [box_ann(1, 1, 1, (10, 10, 50, 50)), crowd])
    ev = COCOEvaluator(gt, tasks=("bbox", "box_proposals"))
    with pytest.raises(ValueError, match=r"need \['proposals'\]"):
        ev.process([{"image_id": 1}], [empty_prediction()])
    with pytest.raises(ValueError, match="objectness_logits"):
        bad = proposals([[0, 0, 1, 1]], [0.0])
        bad["proposals"].remove("objectness_logits")
        ev.process([{"image_id": 1}], [{**empty_prediction(), **bad}])
    # Both tasks from one output; the crowd region is no object to recall.
    output = {**prediction([[10, 10, 60, 60]], [0.9], [0]), **proposals([[10.0, 10.0, 60.0, 60.0]], [1.0])}
    results = run(ev, {1: output})
    assert results["bbox"]["AP"] == pytest.approx(100.0)
    assert results["box_proposals"]["AR@100"] == pytest.approx(100.0)


# --- a dataset named, nothing else ----------------------------------------------------------------
def test_a_registered_name_alone_finds_its_json_and_mapping(tmp_path):
    """As in detectron2: COCOEvaluator(name, output_dir=...) reads the name's metadata from the
    catalog, registered from code or named coco:JSON (registered on first use)."""
    from detcore.data import DatasetCatalog, MetadataCatalog, register_coco_instances

    gt = three_class_gt(tmp_path)
    boxes = [xyxy(BOXES[c]) for c in (1, 5, 9)]
    names = ["toy_named_val", f"coco:{gt}"]
    register_coco_instances(names[0], {"thing_dataset_id_to_contiguous_id": {9: 0, 5: 1, 1: 2}}, gt, str(tmp_path))
    try:
        ev = COCOEvaluator(names[0], output_dir=str(tmp_path / "out"))
        assert ev.dataset_id_to_contiguous_id == {9: 0, 5: 1, 1: 2}  # the metadata's, not the json's order
        assert run(ev, {1: prediction(boxes, [0.9, 0.8, 0.7], [2, 1, 0])})["bbox"]["AP"] == pytest.approx(100.0)
        assert (tmp_path / "out" / METRICS_FILE).is_file()
        ev = COCOEvaluator(names[1], tasks="bbox")
        assert ev.dataset_id_to_contiguous_id == {1: 0, 5: 1, 9: 2}
        res = run(ev, {1: prediction(boxes, [0.9, 0.8, 0.7], [0, 1, 2])})["bbox"]
        assert res["AP-cat"] == res["AP-dog"] == res["AP-bird"] == pytest.approx(100.0)
    finally:
        for name in names:
            if name in DatasetCatalog:
                DatasetCatalog.remove(name)
            MetadataCatalog.remove(name)


def test_an_unknown_name_is_refused_and_leaves_no_metadata():
    from detcore.data import MetadataCatalog

    with pytest.raises(ValueError, match="neither a json file nor a registered dataset"):
        COCOEvaluator("no_such_dataset_here")
    assert "no_such_dataset_here" not in MetadataCatalog
