"""Keypoint AP of COCOEvaluator on hand-made cases whose object keypoint similarity (OKS) and AP
are worked out here, with the dataset's own OKS constants.

OKS of a detection with a ground-truth person of area A, per labeled keypoint i at distance d_i:
exp(-d_i^2 / (2 A (2 sigma_i)^2)), averaged over the labeled keypoints. With one person and one
detection, AP over the thresholds 0.50, 0.55, ..., 0.95 is the share of thresholds <= OKS.
"""
import json
import math
import os

import pytest
import torch

from detcore.evaluation import COCOEvaluator, instances_to_coco_json
from detcore.structures import Boxes, Instances

H = W = 200
SIGMA = 0.05
AREA = 10000.0
# Ground truth, COCO pixel indices; detcore's predictions are pixel centers (+0.5).
GT_KEYPOINTS = [[60, 50, 2], [80, 50, 2], [70, 90, 1], [0, 0, 0]]


def write_gt(tmp_path, persons, sigmas=(SIGMA,) * 4, num_images=1):
    annotations = []
    for i, (image_id, keypoints) in enumerate(persons, start=1):
        annotations.append(
            {
                "id": i, "image_id": image_id, "category_id": 1, "bbox": [40.0, 30.0, 100.0, 100.0],
                "area": AREA, "iscrowd": 0, "keypoints": [v for p in keypoints for v in p],
                "num_keypoints": sum(p[2] > 0 for p in keypoints),
            }
        )  # fmt: skip
    category = {"id": 1, "name": "person", "keypoints": ["a", "b", "c", "d"], "skeleton": [[1, 2]]}
    if sigmas is not None:
        category["keypoint_oks_sigmas"] = list(sigmas)
    data = {
        "images": [{"id": i, "width": W, "height": H, "file_name": f"{i}.png"} for i in range(1, num_images + 1)],
        "annotations": annotations,
        "categories": [category],
    }
    path = os.path.join(str(tmp_path), "gt.json")
    with open(path, "w") as f:
        json.dump(data, f)
    return path


def prediction(keypoint_sets, scores):
    """Detections at pixel centers of the given COCO-index keypoints (+0.5), score 1 per point."""
    kp = torch.tensor([[[x + 0.5, y + 0.5, 1.0] for x, y, _ in ks] for ks in keypoint_sets]).reshape(-1, 4, 3)
    n = len(keypoint_sets)
    inst = Instances(
        (H, W),
        pred_boxes=Boxes(torch.tensor([[40.0, 30.0, 140.0, 130.0]] * n).reshape(-1, 4)),
        scores=torch.tensor(scores, dtype=torch.float32),
        pred_classes=torch.zeros(n, dtype=torch.int64),
        pred_keypoints=kp,
    )
    return {"instances": inst}


def keypoint_ap(tmp_path, per_image, **kwargs):
    evaluator = COCOEvaluator(write_gt(tmp_path, **kwargs), ("keypoints",), per_category_ap=False)
    for image_id, output in per_image:
        evaluator.process([{"image_id": image_id}], [output])
    return evaluator.evaluate()["keypoints"]


def shifted(keypoints, dx):
    return [[x + dx, y, v] for x, y, v in keypoints]


def test_perfect_keypoints_give_100(tmp_path):
    metrics = keypoint_ap(tmp_path, [(1, prediction([GT_KEYPOINTS], [0.9]))], persons=[(1, GT_KEYPOINTS)])
    assert metrics["AP"] == pytest.approx(100) and metrics["AP50"] == pytest.approx(100)
    assert metrics["APl"] == pytest.approx(100) and math.isnan(metrics["APm"])  # A = 100^2 > 96^2: "large"


def test_a_known_shift_gives_a_known_ap(tmp_path):
    # Every keypoint moved by d: OKS = exp(-d^2 / (8 A sigma^2)). d chosen for OKS = 0.72, which
    # passes the thresholds 0.50 .. 0.70 (5 of 10): AP 50, AP50 100, AP75 0.
    d = math.sqrt(-math.log(0.72) * 8 * AREA * SIGMA**2)
    metrics = keypoint_ap(tmp_path, [(1, prediction([shifted(GT_KEYPOINTS, d)], [0.9]))], persons=[(1, GT_KEYPOINTS)])
    assert (metrics["AP"], metrics["AP50"], metrics["AP75"]) == pytest.approx((50, 100, 0))
    # The unlabeled 4th point does not count: moving it anywhere changes nothing.
    moved = shifted(GT_KEYPOINTS, d)
    moved[3] = [150, 10, 0]
    again = keypoint_ap(tmp_path, [(1, prediction([moved], [0.9]))], persons=[(1, GT_KEYPOINTS)])
    assert again["AP"] == pytest.approx(50)


def test_the_datasets_sigmas_are_used(tmp_path):
    # The same shift with sigmas twice as large: OKS = 0.72^(1/4) = 0.921, all thresholds up to 0.90 pass.
    d = math.sqrt(-math.log(0.72) * 8 * AREA * SIGMA**2)
    metrics = keypoint_ap(
        tmp_path, [(1, prediction([shifted(GT_KEYPOINTS, d)], [0.9]))], persons=[(1, GT_KEYPOINTS)], sigmas=(2 * SIGMA,) * 4
    )
    assert metrics["AP"] == pytest.approx(90)


def test_two_persons_ranked_detections(tmp_path):
    # Image 1: a perfect detection (score 0.9); image 2: one at OKS 0.72 (score 0.8) and a
    # false positive far away with the highest score (0.95). At threshold t the ranked list is
    # FP, TP1, TP2 (TP2 only while t <= 0.72): precision envelope 2/3 up to recall 1 (t <= 0.70),
    # else 1/2 up to recall 1/2. AP = (5 * 2/3 + 5 * (1/2 * 51/101)) / 10 in COCO's 101-point recall.
    d = math.sqrt(-math.log(0.72) * 8 * AREA * SIGMA**2)
    far = [[180, 180, 2], [190, 180, 2], [185, 195, 2], [0, 0, 0]]
    per_image = [
        (1, prediction([GT_KEYPOINTS], [0.9])),
        (2, prediction([shifted(GT_KEYPOINTS, d), far], [0.8, 0.95])),
    ]
    metrics = keypoint_ap(tmp_path, per_image, persons=[(1, GT_KEYPOINTS), (2, GT_KEYPOINTS)], num_images=2)
    expected = (5 * (2 / 3) + 5 * (0.5 * 51 / 101)) / 10 * 100
    assert metrics["AP"] == pytest.approx(expected, abs=1e-6)


def test_no_keypoint_detections_and_missing_sigmas(tmp_path):
    empty = {"instances": prediction([GT_KEYPOINTS], [0.9])["instances"][torch.zeros(1, dtype=torch.bool)]}
    metrics = keypoint_ap(tmp_path, [(1, empty)], persons=[(1, GT_KEYPOINTS)])
    assert metrics["AP"] == 0.0 and metrics["APl"] == 0.0 and math.isnan(metrics["APm"])
    with pytest.raises(ValueError, match="keypoint AP needs one OKS constant per keypoint"):
        keypoint_ap(tmp_path, [(1, prediction([GT_KEYPOINTS], [0.9]))], persons=[(1, GT_KEYPOINTS)], sigmas=None)


def test_keypoints_are_written_as_coco_pixel_indices():
    inst = prediction([GT_KEYPOINTS], [0.9])["instances"]
    (result,) = instances_to_coco_json(inst, 3, {0: 1})
    assert result["keypoints"][:6] == [60.0, 50.0, 1.0, 80.0, 50.0, 1.0]
    assert result["category_id"] == 1 and len(result["keypoints"]) == 12
