"""CityscapesInstanceEvaluator driving cityscapesScripts on a tiny official-layout tree, against
AP values worked out by hand; and the trainer's choice of evaluators for Cityscapes and VOC."""
import math
import os

import numpy as np
import pycocotools.mask as mask_util
import pytest
import torch

from detcore.config import get_cfg
from detcore.data import DatasetCatalog, MetadataCatalog
from detcore.data.datasets import register_cityscapes_instances, register_pascal_voc
from detcore.data.datasets.cityscapes import CITYSCAPES_INSTANCE_CLASSES, load_cityscapes_instances
from detcore.engine import DefaultTrainer
from detcore.evaluation import (
    CityscapesInstanceEvaluator,
    COCOEvaluator,
    DatasetEvaluators,
    PascalVOCDetectionEvaluator,
)
from detcore.structures import Boxes, Instances
from tests.data.fake_cityscapes import H, W, write_cityscapes_tree
from tests.data.fake_voc import write_voc_tree

pytest.importorskip("cityscapesscripts")


@pytest.fixture
def tree(tmp_path):
    image_dir, gt_dir = write_cityscapes_tree(str(tmp_path / "json_only"))
    return image_dir, gt_dir, load_cityscapes_instances(image_dir, gt_dir)


def gt_predictions(records, score=0.9):
    """Every non-crowd ground-truth instance predicted exactly: image_id -> [(class, mask, score)]."""
    return {
        r["image_id"]: [
            (a["category_id"], mask_util.decode(a["segmentation"]).astype(bool), score - 0.01 * k)
            for k, a in enumerate(r["annotations"]) if not a["iscrowd"]
        ]
        for r in records
    }


def to_output(preds):
    masks = np.stack([m for _, m, _ in preds]) if preds else np.zeros((0, H, W), bool)
    boxes = []
    for _, m, _ in preds:
        ys, xs = np.nonzero(m)
        boxes.append([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1] if len(xs) else [0, 0, 1, 1])
    return {"instances": Instances(
        (H, W),
        pred_boxes=Boxes(torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4)),
        scores=torch.tensor([s for _, _, s in preds], dtype=torch.float32),
        pred_classes=torch.tensor([c for c, _, _ in preds], dtype=torch.int64),
        pred_masks=torch.from_numpy(masks),
    )}


def evaluate(evaluator, per_image, records):
    evaluator.reset()
    for r in records:
        evaluator.process([{"image_id": r["image_id"], "file_name": r["file_name"]}], [to_output(per_image.get(r["image_id"], []))])
    return evaluator.evaluate()


def make(records, **kwargs):
    return CityscapesInstanceEvaluator("toy", records_fn=lambda n: records, **kwargs)


PRESENT = ("person", "rider", "car", "truck", "bicycle")


def test_perfect_predictions_score_100(tree, tmp_path):
    *_, records = tree
    m = evaluate(make(records, output_dir=str(tmp_path / "out")), gt_predictions(records), records)["cityscapes"]
    assert m["AP"] == pytest.approx(100) and m["AP50"] == pytest.approx(100)
    for name in CITYSCAPES_INSTANCE_CLASSES:
        assert (m[f"AP-{name}"] == pytest.approx(100)) if name in PRESENT else math.isnan(m[f"AP-{name}"]), name
    assert os.path.isfile(tmp_path / "out" / "cityscapes_instance_metrics.json")


def test_no_predictions_score_0(tree):
    *_, records = tree
    m = evaluate(make(records), {}, records)["cityscapes"]
    assert m["AP"] == 0 and m["AP50"] == 0 and m["AP-car"] == 0


def test_hand_computed_cases(tree):
    *_, records = tree
    perfect = gt_predictions(records)
    car = CITYSCAPES_INSTANCE_CLASSES.index("car")
    # One of the two cars (the crowd does not count) missed: precision 1 up to recall 1/2 -> AP 50.
    half = dict(perfect)
    half[0] = [p for p in perfect[0] if not (p[0] == car and p[1][15, 20])]
    m = evaluate(make(records), half, records)["cityscapes"]
    assert m["AP-car"] == pytest.approx(50) and m["AP-person"] == pytest.approx(100)
    # The truck predicted as a bus: truck AP 0, bus (no ground truth) NaN, all others 100.
    truck = CITYSCAPES_INSTANCE_CLASSES.index("truck")
    swapped = dict(perfect)
    swapped[2] = [(CITYSCAPES_INSTANCE_CLASSES.index("bus") if c == truck else c, mk, s) for c, mk, s in perfect[2]]
    m = evaluate(make(records), swapped, records)["cityscapes"]
    assert m["AP-truck"] == 0 and math.isnan(m["AP-bus"]) and m["AP-rider"] == pytest.approx(100)
    assert m["AP"] == pytest.approx(100 * 4 / 5)
    # The rider's mask cut to its top 3/5 (IoU 0.6): matched at overlaps 0.5 and 0.55 of the ten.
    rider = CITYSCAPES_INSTANCE_CLASSES.index("rider")
    cut = dict(perfect)
    cut[1] = [(c, mk.copy(), s) for c, mk, s in perfect[1]]
    for c, mk, _ in cut[1]:
        if c == rider:
            mk[5 + 18 :, :] = False  # rows 5..22 of 5..34
    m = evaluate(make(records), cut, records)["cityscapes"]
    assert m["AP-rider"] == pytest.approx(100 * 2 / 10)
    # A false truck on the sky, scored above the true one: recall 1 at precision 1/2 and recall 0
    # at precision 0; cityscapesScripts integrates steps of half the recall change on each side:
    # 1/2 * 1/2 + 0 * 1/2 = AP 25. (On unlabeled pixels it would be ignored: they are void.)
    fp = dict(perfect)
    fake = np.zeros((H, W), bool)
    fake[0:16, 100:128] = True
    fp[2] = perfect[2] + [(truck, fake, 0.99)]
    m = evaluate(make(records), fp, records)["cityscapes"]
    assert m["AP-truck"] == pytest.approx(25)
    fake[:] = False
    fake[40:60, 60:90] = True
    fp[1] = perfect[1] + [(rider, fake, 0.99)]  # on image 1's unlabeled (void) background
    m = evaluate(make(records), {**perfect, 1: fp[1]}, records)["cityscapes"]
    assert m["AP-rider"] == pytest.approx(100)


def test_a_class_whose_every_prediction_is_ignored_scores_0_and_the_others_keep_their_ap(tree):
    # cityscapesScripts' evaluateMatches raised "IndexError: index -1 is out of bounds" here: the
    # truck has ground truth (image 2) and one prediction, on image 1's unlabeled (void) pixels,
    # which is ignored, so no truck prediction is scored at all (its issue 89). Recall 0: AP 0.
    *_, records = tree
    perfect = gt_predictions(records)
    truck, car, rider = (CITYSCAPES_INSTANCE_CLASSES.index(n) for n in ("truck", "car", "rider"))
    void = np.zeros((H, W), bool)
    void[40:60, 60:90] = True
    preds = {i: [p for p in perfect[i] if p[0] != truck] for i in perfect}
    preds[1] = preds[1] + [(truck, void, 0.5)]
    # Other classes away from 100, hand-computed as in test_hand_computed_cases: one car missed
    # (AP 50), the rider's mask cut to IoU 0.6 (matched at 2 of the 10 thresholds: AP 20).
    preds[0] = [p for p in preds[0] if not (p[0] == car and p[1][15, 20])]
    preds[1] = [(c, mk.copy(), sc) for c, mk, sc in preds[1]]
    for c, mk, _ in preds[1]:
        if c == rider:
            mk[5 + 18 :, :] = False
    m = evaluate(make(records), preds, records)["cityscapes"]
    assert m["AP-truck"] == 0 and m["AP50"] == pytest.approx((0 + 50 + 100 + 100 + 100) / 5)  # rider matched at 0.5
    assert m["AP-car"] == pytest.approx(50) and m["AP-rider"] == pytest.approx(20)
    assert m["AP-person"] == pytest.approx(100) and m["AP-bicycle"] == pytest.approx(100)
    assert math.isnan(m["AP-bus"]) and m["AP"] == pytest.approx((0 + 50 + 20 + 100 + 100) / 5)


def test_instance_id_pngs_and_polygons_give_the_same_ap(tmp_path):
    json_only = load_cityscapes_instances(*write_cityscapes_tree(str(tmp_path / "a")))
    png_only = load_cityscapes_instances(*write_cityscapes_tree(str(tmp_path / "b"), with_json=False, with_png=True))
    preds = gt_predictions(json_only)
    preds[0] = preds[0][1:]
    a = evaluate(make(json_only), preds, json_only)["cityscapes"]
    b = evaluate(make(png_only), preds, png_only)["cityscapes"]
    assert a == pytest.approx(b, nan_ok=True) and 0 < a["AP"] < 100


def test_errors(tree):
    *_, records = tree
    ev = make(records)
    with pytest.raises(ValueError, match="image_id 99"):
        ev.process([{"image_id": 99}], [to_output([])])
    out = to_output(gt_predictions(records)[0])
    out["instances"].remove("pred_masks")
    with pytest.raises(ValueError, match="needs pred_masks"):
        ev.process([{"image_id": 0}], [out])
    with pytest.raises(ValueError, match="not a Cityscapes dataset"):
        CityscapesInstanceEvaluator("x", records_fn=lambda n: [{"image_id": 0, "file_name": "a.png"}])
    assert make(records).evaluate() == {}


def test_trainer_picks_the_evaluators(tree, tmp_path):
    image_dir, gt_dir, records = tree
    name = f"cityscapes_test_{os.getpid()}"
    register_cityscapes_instances(name, image_dir, gt_dir)
    voc_name = f"voc_test_{os.getpid()}"
    voc = write_voc_tree(str(tmp_path / "VOC2007"), {"000001": (40, 30, [("dog", (1, 1, 20, 20), 0)])}, {"test": ["000001"]})
    register_pascal_voc(voc_name, voc, "test", 2007)
    try:
        cfg = get_cfg()
        cfg.MODEL.MASK_ON = True
        cfg.OUTPUT_DIR = str(tmp_path / "out")
        ev = DefaultTrainer.build_evaluator(cfg, name)
        assert isinstance(ev, DatasetEvaluators)
        assert [type(e) for e in ev._evaluators] == [CityscapesInstanceEvaluator, COCOEvaluator]
        results = evaluate(ev, gt_predictions(records), records)
        assert set(results) == {"cityscapes", "bbox", "segm"}
        # COCO AP through the json converted from the records: perfect masks, perfect AP.
        assert results["segm"]["AP"] == pytest.approx(100) and results["cityscapes"]["AP"] == pytest.approx(100)
        written = os.listdir(tmp_path / "out" / "inference" / name)
        assert any(p.startswith(name + "_coco_format_") for p in written)
        assert {"bbox_pr_curves.png", "segm_confusion_matrix.png"} <= set(written)  # TEST.EVAL_PICTURES
        cfg.TEST.EVAL_PICTURES = False
        assert DefaultTrainer.build_evaluator(cfg, name)._evaluators[1]._pictures is False
        assert isinstance(DefaultTrainer.build_evaluator(cfg, voc_name), PascalVOCDetectionEvaluator)
        MetadataCatalog.get(voc_name + "_x").evaluator_type = "lvis"
        with pytest.raises(NotImplementedError, match="evaluator_type 'lvis'"):
            DefaultTrainer.build_evaluator(cfg, voc_name + "_x")
    finally:
        for n in (name, voc_name):
            DatasetCatalog.remove(n)
            MetadataCatalog.remove(n)
        MetadataCatalog.remove(voc_name + "_x")
