"""PascalVOCDetectionEvaluator: hand-computed cases, and a reference written here from the VOC
devkit's definition (1-based inclusive boxes with "+1" areas, per-image 'det' flags), run on
ground truth written as VOC XML and read back through the loader."""
import json
import math

import numpy as np
import pytest
import torch

from detcore.data.datasets.pascal_voc import load_voc_instances
from detcore.evaluation import PascalVOCDetectionEvaluator
from detcore.evaluation.pascal_voc_evaluation import METRICS_FILE, voc_ap
from detcore.structures import Boxes, Instances
from tests.data.fake_voc import write_voc_tree


def record(image_id, anns):
    """anns: (class, [x1, y1, x2, y2], difficult)."""
    return {
        "image_id": image_id, "file_name": f"{image_id}.jpg", "height": 100, "width": 100,
        "annotations": [{"bbox": list(map(float, b)), "category_id": c, "iscrowd": 0, "difficult": d} for c, b, d in anns],
    }


def make_evaluator(records, classes=("a", "b"), year=2007, **kwargs):
    return PascalVOCDetectionEvaluator(
        "toy", metadata_fn=lambda n: {"thing_classes": list(classes), "year": year},
        records_fn=lambda n: records, **kwargs,
    )


def instances(dets):
    """dets: (class, [x1, y1, x2, y2], score)."""
    return Instances(
        (100, 100),
        pred_boxes=Boxes(torch.tensor([d[1] for d in dets], dtype=torch.float32).reshape(-1, 4)),
        scores=torch.tensor([d[2] for d in dets], dtype=torch.float32),
        pred_classes=torch.tensor([d[0] for d in dets], dtype=torch.int64),
    )


def evaluate(evaluator, per_image):
    evaluator.reset()
    for image_id, dets in per_image.items():
        evaluator.process([{"image_id": image_id}], [{"instances": instances(dets)}])
    return evaluator.evaluate()["bbox"]


# --- hand-computed cases ---------------------------------------------------------------------------
def test_perfect_detections_score_100():
    records = [record(0, [(0, [10, 10, 30, 40], 0), (1, [50, 50, 90, 80], 0)]), record(1, [(1, [0, 0, 20, 20], 0)])]
    per_image = {0: [(0, [10, 10, 30, 40], 0.9), (1, [50, 50, 90, 80], 0.8)], 1: [(1, [0, 0, 20, 20], 0.7)]}
    for year in (2007, 2012):
        m = evaluate(make_evaluator(records, year=year), per_image)
        for key in ("AP", "AP50", "AP75", "AP50-11point", "AP50-area", "AP50-area-a", "AP50-11point-b"):
            assert m[key] == pytest.approx(100.0), key


def test_a_false_positive_between_two_true_positives():
    # Ranked: TP (0.9), FP (0.8), TP (0.7) over 2 boxes: recall .5 .5 1, precision 1 .5 2/3.
    records = [record(0, [(0, [0, 0, 10, 10], 0), (0, [50, 50, 60, 60], 0)])]
    dets = {0: [(0, [0, 0, 10, 10], 0.9), (0, [20, 20, 30, 30], 0.8), (0, [50, 50, 60, 60], 0.7)]}
    m = evaluate(make_evaluator(records, classes=("a",)), dets)
    # Area: 0.5 * 1 + 0.5 * 2/3. 11-point: levels 0..0.5 reach precision 1, 0.6..1 reach 2/3.
    assert m["AP50-area"] == pytest.approx(100 * (0.5 + 0.5 * 2 / 3))
    assert m["AP50-11point"] == pytest.approx(100 * (6 + 5 * 2 / 3) / 11)
    assert m["AP50"] == m["AP50-11point"]  # 2007: the 11-point metric is the headline
    assert evaluate(make_evaluator(records, classes=("a",), year=2012), dets)["AP50"] == m["AP50-area"]


def test_a_difficult_only_image_changes_nothing():
    records = [record(0, [(0, [0, 0, 10, 10], 0)]), record(1, [(0, [30, 30, 60, 60], 1)])]
    # The top-scored detection hits the difficult box: ignored, neither true nor false.
    dets = {0: [(0, [0, 0, 10, 10], 0.5)], 1: [(0, [30, 30, 60, 60], 0.9)]}
    m = evaluate(make_evaluator(records, classes=("a",)), dets)
    assert m["AP50-area"] == pytest.approx(100) and m["AP50-11point"] == pytest.approx(100)
    # Missing the difficult box costs nothing either; a detection elsewhere on that image is false.
    assert evaluate(make_evaluator(records, classes=("a",)), {0: dets[0], 1: []})["AP50-area"] == pytest.approx(100)
    m = evaluate(make_evaluator(records, classes=("a",)), {0: dets[0], 1: [(0, [80, 80, 90, 90], 0.9)]})
    assert m["AP50-area"] == pytest.approx(50)  # FP then TP: precision 0 then 1/2 at recall 1


def test_a_known_precision_recall_curve():
    # Class 0: 4 boxes over 2 images (one never found). Ranked detections:
    #   0.95 TP (img0 box A)      tp 1 fp 0   r .25 p 1
    #   0.90 FP (duplicate of A)  tp 1 fp 1   r .25 p .5
    #   0.80 TP (img1 box C)      tp 2 fp 1   r .5  p 2/3
    #   0.70 FP (IoU exactly .5)  tp 2 fp 2   r .5  p .5
    #   0.60 TP (img0 box B)      tp 3 fp 2   r .75 p .6
    #   0.50 FP (no box there)    tp 3 fp 3   r .75 p .5
    # Class 1 has no box: no AP, left out of the means.
    records = [
        record(0, [(0, [0, 0, 20, 20], 0), (0, [40, 40, 60, 60], 0)]),
        record(1, [(0, [10, 10, 30, 30], 0), (0, [70, 70, 90, 90], 0)]),
    ]
    dets = {
        0: [(0, [0, 0, 20, 20], 0.95), (0, [1, 1, 20, 20], 0.90), (0, [40, 40, 60, 60], 0.60), (1, [0, 0, 5, 5], 0.99)],
        1: [(0, [10, 10, 30, 30], 0.80), (0, [70, 70, 90, 80], 0.70), (0, [0, 80, 10, 90], 0.50)],
    }
    m = evaluate(make_evaluator(records), dets)
    # Area: envelope 1 to .25, 2/3 to .5, .6 to .75, then 0.
    assert m["AP50-area-a"] == pytest.approx(100 * (0.25 * 1 + 0.25 * 2 / 3 + 0.25 * 0.6))
    # 11-point: 0..0.2 -> 1 (3 levels), 0.3..0.5 -> 2/3 (3), 0.6, 0.7 -> .6 (2), 0.8..1 -> 0 (3).
    assert m["AP50-11point-a"] == pytest.approx(100 * (3 * 1 + 3 * 2 / 3 + 2 * 0.6) / 11)
    assert math.isnan(m["AP50-area-b"]) and math.isnan(m["AP50-11point-b"])
    assert m["AP50-area"] == m["AP50-area-a"] and m["AP50"] == m["AP50-11point-a"]
    # At IoU 0.75 the duplicate [1, 1, 20, 20] (IoU .9025) is still a duplicate: the same curve.
    assert m["AP75"] == pytest.approx(m["AP50"])


def test_voc_ap_edge_cases():
    assert voc_ap(np.array([]), np.array([]), True) == 0 and voc_ap(np.array([]), np.array([]), False) == 0
    # Recall exactly 0.3 (3 of 10) does not reach the level np.arange puts at 0.30000000000000004,
    # as in the devkit's Python port.
    assert voc_ap(np.array([0.1, 0.2, 0.3]), np.array([1.0, 1.0, 1.0]), True) == pytest.approx(3 / 11)


def test_only_processed_images_count_and_repeats_count_once():
    records = [record(0, [(0, [0, 0, 10, 10], 0)]), record(1, [(0, [0, 0, 10, 10], 0)])]
    ev = make_evaluator(records, classes=("a",))
    assert evaluate(ev, {0: [(0, [0, 0, 10, 10], 0.9)]})["AP50-area"] == pytest.approx(100)
    ev.reset()
    ev.process([{"image_id": 0}], [{"instances": instances([(0, [0, 0, 10, 10], 0.9)])}])
    ev.process([{"image_id": 0}], [{"instances": instances([(0, [50, 50, 60, 60], 0.95)])}])
    assert ev.evaluate()["bbox"]["AP50-area"] == pytest.approx(100)


def test_errors_and_metrics_file(tmp_path):
    records = [record(0, [(0, [0, 0, 10, 10], 0)])]
    ev = make_evaluator(records, classes=("a",), output_dir=str(tmp_path))
    with pytest.raises(ValueError, match="image_id 7"):
        ev.process([{"image_id": 7}], [{"instances": instances([])}])
    with pytest.raises(ValueError, match="pred_classes holds 3"):
        ev.process([{"image_id": 0}], [{"instances": instances([(3, [0, 0, 1, 1], 0.5)])}])
    with pytest.raises(ValueError, match="no thing_classes"):
        PascalVOCDetectionEvaluator("x", metadata_fn=lambda n: {}, records_fn=lambda n: records)
    assert make_evaluator(records, classes=("a",)).evaluate() == {}
    m = evaluate(ev, {0: []})
    assert m["AP50-area"] == 0 and m["AP"] == 0
    saved = json.load(open(tmp_path / METRICS_FILE))
    assert saved["bbox"]["AP50-area"] == 0


# --- against the devkit's definition ----------------------------------------------------------------
def devkit_voc_eval(gt_objects, detections, classname, ovthresh, use_07_metric):
    """The devkit's voc_eval, written from its definition: gt_objects: image -> [(name, [x1, y1,
    x2, y2] 1-based inclusive, difficult)]; detections: [(image, score, [x1, y1, x2, y2] 1-based)]."""
    class_recs, npos = {}, 0
    for image, objs in gt_objects.items():
        R = [o for o in objs if o[0] == classname]
        bbox = np.array([o[1] for o in R], dtype=float).reshape(-1, 4)
        difficult = np.array([o[2] for o in R]).astype(bool)
        det = [False] * len(R)
        npos += int(sum(~difficult))
        class_recs[image] = {"bbox": bbox, "difficult": difficult, "det": det}
    image_ids = [d[0] for d in detections]
    confidence = np.array([d[1] for d in detections], dtype=float)
    BB = np.array([d[2] for d in detections], dtype=float).reshape(-1, 4)
    sorted_ind = np.argsort(-confidence, kind="stable")
    BB = BB[sorted_ind, :]
    image_ids = [image_ids[x] for x in sorted_ind]
    nd = len(image_ids)
    tp, fp = np.zeros(nd), np.zeros(nd)
    for d in range(nd):
        R = class_recs[image_ids[d]]
        bb = BB[d, :]
        ovmax = -np.inf
        BBGT = R["bbox"]
        if BBGT.size > 0:
            ixmin = np.maximum(BBGT[:, 0], bb[0])
            iymin = np.maximum(BBGT[:, 1], bb[1])
            ixmax = np.minimum(BBGT[:, 2], bb[2])
            iymax = np.minimum(BBGT[:, 3], bb[3])
            iw = np.maximum(ixmax - ixmin + 1.0, 0.0)
            ih = np.maximum(iymax - iymin + 1.0, 0.0)
            inters = iw * ih
            uni = (bb[2] - bb[0] + 1.0) * (bb[3] - bb[1] + 1.0) + (BBGT[:, 2] - BBGT[:, 0] + 1.0) * (
                BBGT[:, 3] - BBGT[:, 1] + 1.0) - inters
            overlaps = inters / uni
            ovmax, jmax = np.max(overlaps), np.argmax(overlaps)
        if ovmax > ovthresh:
            if not R["difficult"][jmax]:
                if not R["det"][jmax]:
                    tp[d] = 1.0
                    R["det"][jmax] = 1
                else:
                    fp[d] = 1.0
        else:
            fp[d] = 1.0
    fp, tp = np.cumsum(fp), np.cumsum(tp)
    rec = tp / float(npos)
    prec = tp / np.maximum(tp + fp, np.finfo(np.float64).eps)
    # The devkit's ap, both ways.
    if use_07_metric:
        ap = 0.0
        for t in np.arange(0.0, 1.1, 0.1):
            p = 0 if np.sum(rec >= t) == 0 else np.max(prec[rec >= t])
            ap = ap + p / 11.0
        return ap
    mrec = np.concatenate(([0.0], rec, [1.0]))
    mpre = np.concatenate(([0.0], prec, [0.0]))
    for i in range(mpre.size - 1, 0, -1):
        mpre[i - 1] = np.maximum(mpre[i - 1], mpre[i])
    i = np.where(mrec[1:] != mrec[:-1])[0]
    return np.sum((mrec[i + 1] - mrec[i]) * mpre[i + 1])


CLASSES = ("cat", "dog", "bird")


def random_scene(rng, num_images):
    images, dets = {}, {}
    for k in range(num_images):
        voc_id = f"{k:06d}"
        w, h = int(rng.integers(60, 120)), int(rng.integers(60, 120))
        objects = []
        for _ in range(int(rng.integers(0, 5))):
            x1, y1 = int(rng.integers(1, w - 20)), int(rng.integers(1, h - 20))
            x2, y2 = int(rng.integers(x1 + 5, w + 1)), int(rng.integers(y1 + 5, h + 1))
            objects.append((CLASSES[int(rng.integers(3))], (x1, y1, x2, y2), int(rng.random() < 0.2)))
        images[voc_id] = (w, h, objects)
        # Detections in detcore's continuous coordinates: jittered boxes (some duplicated, some of the
        # wrong class) and random boxes.
        image_dets = []
        for name, (x1, y1, x2, y2), _ in objects:
            for _ in range(int(rng.integers(0, 3))):
                box = np.array([x1 - 1, y1 - 1, x2, y2], float) + rng.normal(0, 3, 4)
                cls = CLASSES.index(name) if rng.random() < 0.85 else int(rng.integers(3))
                image_dets.append((cls, box.tolist(), float(rng.random())))
        for _ in range(int(rng.integers(0, 3))):
            x1, y1 = rng.uniform(0, w - 10), rng.uniform(0, h - 10)
            image_dets.append((int(rng.integers(3)), [x1, y1, x1 + rng.uniform(5, 40), y1 + rng.uniform(5, 40)], float(rng.random())))
        dets[voc_id] = image_dets
    return images, dets


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_against_the_devkit_definition(tmp_path, seed):
    rng = np.random.default_rng(seed)
    images, dets = random_scene(rng, 25)
    voc = write_voc_tree(str(tmp_path / "VOC2007"), images, {"test": list(images)})
    records = load_voc_instances(voc, "test", CLASSES)
    assert sum(len(r["annotations"]) for r in records) > 20
    ev = PascalVOCDetectionEvaluator(
        "toy", metadata_fn=lambda n: {"thing_classes": list(CLASSES), "year": 2007}, records_fn=lambda n: records
    )
    m = evaluate(ev, {r["image_id"]: dets[r["voc_id"]] for r in records})

    gt_objects = {voc_id: objs for voc_id, (_, _, objs) in images.items()}
    # Predictions go to the devkit as detectron2 writes them: xmin + 1, ymin + 1 (1-based).
    per_class = {
        name: [(voc_id, s, [b[0] + 1, b[1] + 1, b[2], b[3]]) for voc_id, ds in dets.items() for c, b, s in ds if c == k]
        for k, name in enumerate(CLASSES)
    }
    for use_07 in (True, False):
        key = "11point" if use_07 else "area"
        ref = {n: 100 * devkit_voc_eval(gt_objects, per_class[n], n, 0.5, use_07) for n in CLASSES}
        for n in CLASSES:
            assert m[f"AP50-{key}-{n}"] == pytest.approx(ref[n], abs=1e-9), (key, n)
        assert m[f"AP50-{key}"] == pytest.approx(np.mean(list(ref.values())))
    coco_style = [
        np.mean([100 * devkit_voc_eval(gt_objects, per_class[n], n, t / 100, True) for n in CLASSES])
        for t in range(50, 100, 5)
    ]
    assert m["AP"] == pytest.approx(np.mean(coco_style))
    assert m["AP75"] == pytest.approx(coco_style[5])
    assert 0 < m["AP75"] < m["AP50"] < 100


def test_a_voc_name_alone(tmp_path):
    """PascalVOCDetectionEvaluator("voc:FOLDER:SPLIT") reads the classes (sorted), year and ground
    truth from the folder, as the explicit metadata_fn / records_fn would give them."""
    from detcore.data import DatasetCatalog, MetadataCatalog

    rng = np.random.default_rng(5)
    images, dets = random_scene(rng, 12)
    voc = write_voc_tree(str(tmp_path / "VOC2007"), images, {"test": list(images)})
    name = f"voc:{voc}:test"
    try:
        ev = PascalVOCDetectionEvaluator(name, output_dir=str(tmp_path / "out"))
        classes = sorted(CLASSES)
        records = load_voc_instances(voc, "test", classes)
        sorted_dets = {  # the scene's class indices are CLASSES'; the name's classes are sorted
            r["image_id"]: [(classes.index(CLASSES[c]), b, s) for c, b, s in dets[r["voc_id"]]] for r in records
        }
        named = evaluate(ev, sorted_dets)
        explicit = evaluate(make_evaluator(records, classes, 2007), sorted_dets)
        assert named == pytest.approx(explicit, nan_ok=True)
        assert (tmp_path / "out" / METRICS_FILE).is_file()
    finally:
        DatasetCatalog.remove(name)
        MetadataCatalog.remove(name)
