"""error_analysis: the numbers behind the evaluation pictures.

The precision-recall curves against precision worked out by hand for a ranked list, and against
pycocotools' own AP for one class and one IoU threshold at a time; the confusion matrix against
a case built by hand (every kind of cell: right class, wrong class, false positive, miss,
duplicate, crowd, low score, cross-class greedy choice).
"""
import contextlib
import io

import numpy as np
import pytest
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from detcore.evaluation.error_analysis import (
    IGNORED, UNMATCHED, confusion_matrix, match_coco, match_image, precision_recall,
)

from .synthetic_coco import make_synthetic


def quiet(fn, *args):
    with contextlib.redirect_stdout(io.StringIO()):
        return fn(*args)


def coco_from(images, annotations, categories):
    gt = COCO()
    gt.dataset = {"images": images, "annotations": annotations, "categories": categories}
    quiet(gt.createIndex)
    return gt


def ann(ann_id, image_id, cat, xywh, crowd=0):
    x, y, w, h = xywh
    return {"id": ann_id, "image_id": image_id, "category_id": cat, "bbox": list(map(float, xywh)),
            "area": float(w * h), "iscrowd": crowd, "segmentation": [[x, y, x + w, y, x + w, y + h, x, y + h]]}


def det(image_id, cat, xywh, score):
    return {"image_id": image_id, "category_id": cat, "bbox": list(map(float, xywh)), "score": score}


def evaluate(gt, results, iou_type="bbox", cat_ids=None, iou_thrs=None):
    dt = quiet(gt.loadRes, [dict(r) for r in results])
    ev = COCOeval(gt, dt, iou_type)
    if cat_ids is not None:
        ev.params.catIds = list(cat_ids)
    if iou_thrs is not None:
        ev.params.iouThrs = np.asarray(iou_thrs, dtype=np.float64)
    quiet(ev.evaluate)
    quiet(ev.accumulate)
    quiet(ev.summarize)  # fills ev.stats: stats[0] is the AP over its IoU thresholds
    return ev


def box_iou(a, b):
    ax, ay, aw, ah = a
    bx, by, bw, bh = b
    iw = max(0.0, min(ax + aw, bx + bw) - max(ax, bx))
    ih = max(0.0, min(ay + ah, by + bh) - max(ay, by))
    inter = iw * ih
    return inter / (aw * ah + bw * bh - inter)


def interpolated_precision(tp_flags, num_gt, recall_thresholds):
    """Independent COCO precision curve of one ranked detection list: precision made
    non-increasing from the right; at each recall threshold, that of the first detection whose
    recall reaches it (0 when none does)."""
    flags = np.asarray(tp_flags, dtype=np.float64)
    tp, fp = np.cumsum(flags), np.cumsum(1 - flags)
    recall, precision = tp / num_gt, tp / (tp + fp)
    for i in range(len(precision) - 2, -1, -1):
        precision[i] = max(precision[i], precision[i + 1])
    out = []
    for r in recall_thresholds:
        hits = [i for i in range(len(recall)) if recall[i] >= r]
        out.append(precision[hits[0]] if hits else 0.0)
    return np.array(out)


# --- precision-recall -------------------------------------------------------------------------------
GT_BOXES = [(0, 0, 40, 40), (60, 0, 40, 40), (120, 0, 40, 40), (0, 60, 40, 40)]
LOOSE = (120 + 6, 0 + 4, 40, 40)  # IoU ~0.62 with GT_BOXES[2]


def hand_case():
    """One class ("thing", id 4) with four boxes and a second class ("empty", id 9) with none;
    five ranked detections: TP, FP, TP, loose (TP up to IoU 0.6), FP."""
    images = [{"id": 1, "width": 200, "height": 200}]
    anns = [ann(i + 1, 1, 4, b) for i, b in enumerate(GT_BOXES)]
    dets = [det(1, 4, GT_BOXES[0], 0.9), det(1, 4, (0, 150, 30, 30), 0.8), det(1, 4, GT_BOXES[1], 0.7),
            det(1, 4, LOOSE, 0.6), det(1, 4, (150, 150, 30, 30), 0.5)]
    return coco_from(images, anns, [{"id": 4, "name": "thing"}, {"id": 9, "name": "empty"}]), dets


def test_precision_recall_curves_match_a_hand_computation():
    iou = box_iou(LOOSE, GT_BOXES[2])
    assert 0.6 < iou < 0.65
    gt, dets = hand_case()
    ev = evaluate(gt, dets)
    pr = precision_recall(ev)
    assert pr.cat_ids == [4, 9] and pr.names == ["thing", "empty"]
    assert pr.precision.shape == (3, 2, 101) and pr.recall.shape == (101,)
    np.testing.assert_allclose(pr.recall, np.linspace(0, 1, 101))
    # Per IoU threshold 0.5, 0.55, ..., 0.95: the loose detection is a TP up to 0.6.
    thresholds = np.linspace(0.5, 0.95, 10)
    curves = [interpolated_precision([1, 0, 1, 1 if t <= iou else 0, 0], 4, pr.recall) for t in thresholds]
    np.testing.assert_allclose(pr.precision[0, 0], curves[0], atol=1e-12)  # IoU 0.5
    np.testing.assert_allclose(pr.precision[1, 0], curves[5], atol=1e-12)  # IoU 0.75
    np.testing.assert_allclose(pr.precision[2, 0], np.mean(curves, axis=0), atol=1e-12)
    assert pr.ap[0] == pytest.approx(100 * np.mean(curves))
    # Values the hand curve must have (so the reference itself is not trivially wrong):
    # precision 1 up to recall 0.25, then 3/4 up to 0.75 at IoU 0.5; 2/3 up to 0.5 at IoU 0.75.
    assert curves[0][25] == 1.0 and curves[0][26] == curves[0][75] == 0.75 and curves[0][76] == 0.0
    assert curves[5][50] == pytest.approx(2 / 3) and curves[5][51] == 0.0
    # A class without ground truth: NaN curves and AP, not zeros.
    assert np.isnan(pr.precision[:, 1]).all() and np.isnan(pr.ap[1])


def test_precision_recall_per_class_agrees_with_pycocotools_one_class_at_a_time(tmp_path):
    data = make_synthetic(str(tmp_path), num_images=6, seed=1, write_images=False)
    gt = quiet(COCO, data.json_file)
    pr = precision_recall(evaluate(gt, data.results), cat_ids=[7, 1, 3])  # an order of our own
    assert pr.names == ["triangle", "circle", "square"]
    for k, cat in enumerate([7, 1, 3]):
        # COCO's AP is the mean of the 101-point curve: the curve's area.
        ap50 = evaluate(gt, data.results, cat_ids=[cat], iou_thrs=[0.5]).stats[0]
        ap75 = evaluate(gt, data.results, cat_ids=[cat], iou_thrs=[0.75]).stats[0]
        ap = evaluate(gt, data.results, cat_ids=[cat]).stats[0]
        assert np.mean(pr.precision[0, k]) == pytest.approx(ap50, abs=1e-12)
        assert np.mean(pr.precision[1, k]) == pytest.approx(ap75, abs=1e-12)
        assert np.mean(pr.precision[2, k]) == pytest.approx(ap, abs=1e-12)
        assert pr.ap[k] == pytest.approx(100 * ap, abs=1e-10)
        assert 0 < ap < 1  # the data has errors of every kind: no trivial curve


def test_precision_recall_refuses_what_it_cannot_read():
    gt, dets = hand_case()
    ev = evaluate(gt, dets)
    with pytest.raises(ValueError, match=r"category ids \[5\] were not evaluated"):
        precision_recall(ev, cat_ids=[4, 5])
    fresh = COCOeval(gt, quiet(gt.loadRes, [dict(d) for d in dets]), "bbox")
    with pytest.raises(ValueError, match="accumulate"):
        precision_recall(fresh)
    no_half = evaluate(gt, dets, iou_thrs=[0.6, 0.7])
    with pytest.raises(ValueError, match="no IoU threshold 0.5"):
        precision_recall(no_half)


# --- confusion matrix -------------------------------------------------------------------------------
A, B, C = 10, 20, 30  # json ids of classes 0, 1, 2


def confusion_case():
    images = [{"id": i, "width": 200, "height": 200} for i in (1, 2, 3)]
    anns = [
        ann(1, 1, A, (10, 10, 40, 40)),    # taken by an A detection, then a duplicate (FP)
        ann(2, 1, B, (100, 10, 40, 40)),   # taken by a C detection (wrong class)
        ann(3, 1, C, (10, 100, 40, 40)),   # only a low-score detection: missed
        ann(4, 2, B, (0, 0, 200, 80), crowd=1),  # a crowd region: its detection is ignored
        ann(5, 2, A, (20, 120, 40, 40)),   # a detection of IoU ~0.39: missed, and that one a FP
        ann(6, 3, A, (0, 0, 40, 40)),      # the detection overlaps this one (IoU ~0.74) ...
        ann(7, 3, B, (8, 0, 40, 40)),      # ... and this one more (IoU ~0.90): it takes the B
    ]
    dets = [
        det(1, A, (10, 10, 40, 40), 0.9),
        det(1, C, (100, 10, 40, 40), 0.8),
        det(1, A, (150, 150, 30, 30), 0.7),  # on nothing: FP
        det(1, A, (11, 11, 40, 40), 0.6),    # duplicate of the first: FP
        det(1, B, (10, 100, 40, 40), 0.3),   # below the score threshold: left out
        det(2, B, (10, 10, 60, 40), 0.9),    # inside the crowd: ignored
        det(2, A, (30, 130, 40, 40), 0.8),
        det(3, A, (6, 0, 40, 40), 0.95),
        det(3, C, (140, 140, 30, 30), 0.2),  # image 3 has no C: low score, left out
    ]
    cats = [{"id": A, "name": "a"}, {"id": B, "name": "b"}, {"id": C, "name": "c"}]
    return coco_from(images, anns, cats), dets


def test_confusion_matrix_of_a_hand_built_case():
    assert 0.3 < box_iou((20, 120, 40, 40), (30, 130, 40, 40)) < 0.5
    assert 0.5 < box_iou((6, 0, 40, 40), (0, 0, 40, 40)) < box_iou((6, 0, 40, 40), (8, 0, 40, 40))
    gt, dets = confusion_case()
    matches = match_coco(gt, dets, [1, 2, 3], [A, B, C])
    m1, m2, m3 = matches
    assert m1.dt_to_gt.tolist() == [0, 1, UNMATCHED, UNMATCHED]  # the 0.3 one is left out
    assert m1.dt_scores.tolist() == [0.9, 0.8, 0.7, 0.6] and m1.dt_index.tolist() == [0, 1, 2, 3]
    assert m1.missed.tolist() == [2] and m1.wrong_class.tolist() == [1] and m1.false_positives.tolist() == [2, 3]
    assert m2.dt_to_gt.tolist() == [IGNORED, UNMATCHED] and m2.missed.tolist() == [1]
    assert m3.dt_to_gt.tolist() == [1] and m3.missed.tolist() == [0]
    assert [m.num_errors for m in matches] == [4, 2, 2]
    expected = np.array([
        # det: a  b  c  background
        [1, 0, 0, 2],   # gt a: image 1's taken; images 2 and 3 missed
        [1, 0, 1, 0],   # gt b: image 3's taken by an a; image 1's by a c
        [0, 0, 0, 1],   # gt c: missed
        [3, 0, 0, 0],   # background: image 1's FP and duplicate, image 2's loose a
    ])
    np.testing.assert_array_equal(confusion_matrix(matches, 3), expected)


def test_confusion_matrix_thresholds_move_detections_between_cells():
    gt, dets = confusion_case()
    # Score 0.25: the b on image 1's c becomes a wrong class; the c of 0.2 still left out.
    m = confusion_matrix(match_coco(gt, dets, [1, 2, 3], [A, B, C], score_threshold=0.25), 3)
    assert m[2, 1] == 1 and m[2, 3] == 0
    # IoU 0.3: image 2's a takes its ground truth.
    m = confusion_matrix(match_coco(gt, dets, [1, 2, 3], [A, B, C], iou_threshold=0.3), 3)
    assert m[0, 0] == 2 and m[3, 0] == 2
    # Only image 1, and class c left out of the classes: its ground truth and detections vanish.
    m = confusion_matrix(match_coco(gt, dets, [1], [A, B]), 2)
    np.testing.assert_array_equal(m, [[1, 0, 0], [0, 0, 1], [2, 0, 0]])


def test_confusion_matrix_sums_agree_with_cocoeval_on_synthetic_data(tmp_path):
    """Row sums are the ground truth per class; the diagonal equals COCOeval's matched
    detections at IoU 0.5 with score >= 0.5 (the data pairs no right and wrong class on one
    object, so the two matchings agree)."""
    data = make_synthetic(str(tmp_path), num_images=8, seed=2, write_images=False)
    gt = quiet(COCO, data.json_file)
    matrix = confusion_matrix(match_coco(gt, data.results, sorted(gt.imgs), data.cat_ids), 3)
    ev = evaluate(gt, data.results, iou_thrs=[0.5])
    for k, cat in enumerate(data.cat_ids):
        assert matrix[k].sum() == len(gt.getAnnIds(catIds=[cat]))
        matched = 0
        for e in ev.evalImgs:
            if e is None or e["category_id"] != cat or e["aRng"] != ev.params.areaRng[0]:
                continue
            scores = np.asarray(e["dtScores"])
            matched += int(((np.asarray(e["dtMatches"])[0] > 0) & (scores >= 0.5)).sum())
        assert matrix[k, k] == matched
    assert matrix[3].sum() == data.kinds["false_positive"]
    assert matrix[:3, :3].sum() - np.trace(matrix) == data.kinds["wrong_class"]
    assert matrix[3, 3] == 0


def test_match_image_ties_go_to_the_first_and_crowds_are_never_taken():
    m = match_image([0, 0], [0, 0], [0.9, 0.9], [[0.7, 0.7], [0.7, 0.7]])
    assert m.dt_to_gt.tolist() == [0, 1] and m.dt_index.tolist() == [0, 1]
    m = match_image([0, 1], [1], [0.9], [[0.9, 0.6]], gt_crowd=[True, False])
    assert m.dt_to_gt.tolist() == [1] and m.missed.tolist() == []  # the crowd is not missed either
    m = match_image([0], [0, 0], [0.4, 0.6], np.zeros((2, 1)), score_threshold=0.5)
    assert m.dt_index.tolist() == [1] and m.false_positives.tolist() == [0] and m.missed.tolist() == [0]
    m = match_image([], [2], [0.9], np.zeros((1, 0)))
    assert m.dt_to_gt.tolist() == [UNMATCHED]


def test_bad_input_names_the_argument():
    with pytest.raises(ValueError, match=r"ious must be \[detections, ground truth\] = \(1, 2\)"):
        match_image([0, 1], [0], [0.9], [[0.5]])
    with pytest.raises(ValueError, match="dt_scores has 2 entries, expected 1"):
        match_image([0], [0], [0.9, 0.8], [[0.5]])
    with pytest.raises(ValueError, match="iou_threshold must be in"):
        match_image([0], [0], [0.9], [[0.5]], iou_threshold=1.5)
    with pytest.raises(ValueError, match="the classes are 0..1"):
        confusion_matrix([match_image([0], [2], [0.9], [[0.9]])], 2)
    with pytest.raises(ValueError, match="num_classes must be >= 1"):
        confusion_matrix([], 0)
    gt, dets = confusion_case()
    with pytest.raises(ValueError, match="iou_type must be 'bbox' or 'segm'"):
        match_coco(gt, dets, [1], [A], iou_type="keypoints")
