"""Proposal recall (AR) on hand-made cases whose IoUs and recalls are worked out in the comments,
and against pycocotools' own AR (COCOeval with useCats=0) where the matching is unambiguous."""
import contextlib
import io
import math

import numpy as np
import pytest
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from detcore.evaluation import greedy_proposal_overlaps, proposal_recall, proposal_recall_metrics
from detcore.evaluation.proposal_recall import IOU_THRESHOLDS


def strip(x1, x2, y1=0.0, y2=10.0):
    """A box of height 10 spanning [x1, x2]: IoU between two strips is their 1-D IoU."""
    return [x1, y1, x2, y2]


def area(box):
    return (box[2] - box[0]) * (box[3] - box[1])


def image(proposals, gt_boxes, gt_areas=None):
    gt_areas = [area(b) for b in gt_boxes] if gt_areas is None else gt_areas
    return np.array(proposals, dtype=np.float64).reshape(-1, 4), np.array(gt_boxes, np.float64).reshape(-1, 4), np.array(gt_areas, np.float64)


def test_thresholds_are_cocos():
    np.testing.assert_allclose(IOU_THRESHOLDS, [0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95])


def test_the_best_covered_object_takes_its_proposal_first():
    # GT1 = [0, 10], GT2 = [1, 11]. p_a = [1, 11]: IoU 9/11 = 0.818 with GT1, 1.0 with GT2.
    # p_b = [0, 7.7]: IoU 7.7/10 = 0.77 with GT1, (7.7 - 1) / 11 = 0.609 with GT2.
    # GT2 is best covered (1.0 by p_a) and takes p_a; GT1 then takes p_b (0.77). Matching the
    # objects in their order instead would give GT1 0.818 and GT2 0.609.
    gt1, gt2 = strip(0, 10), strip(1, 11)
    p_a, p_b = strip(1, 11), strip(0, 7.7)
    np.testing.assert_allclose(greedy_proposal_overlaps(np.array([p_a, p_b]), np.array([gt1, gt2])), [0.77, 1.0])
    # Recall: GT2 at all 10 thresholds, GT1 at 0.50 .. 0.75 (6 of them): AR = 16 / 20.
    result = proposal_recall([image([p_a, p_b], [gt1, gt2])], limit=100)
    assert result["num_gt"] == 2
    np.testing.assert_allclose(result["recalls"], [1, 1, 1, 1, 1, 1, 0.5, 0.5, 0.5, 0.5])
    assert result["ar"] == pytest.approx(0.8)


def test_a_proposal_covers_one_object_only():
    # One proposal equal to GT1 = [0, 10] also overlaps GT2 = [0, 9] at IoU 0.9, but it is taken.
    overlaps = greedy_proposal_overlaps(np.array([strip(0, 10)]), np.array([strip(0, 10), strip(0, 9)]))
    np.testing.assert_allclose(overlaps, [1.0, 0.0])
    assert proposal_recall([image([strip(0, 10)], [strip(0, 10), strip(0, 9)])], limit=10)["ar"] == 0.5


def test_only_the_first_limit_proposals_count():
    # Proposals by decreasing objectness: a miss, then a perfect one. AR@1 misses, AR@2 finds.
    gt = [strip(20, 30)]
    proposals = [strip(0, 10), strip(20, 30)]
    assert proposal_recall([image(proposals, gt)], limit=1)["ar"] == 0.0
    assert proposal_recall([image(proposals, gt)], limit=2)["ar"] == 1.0


def test_recall_pools_the_objects_of_all_images():
    # Image 1: GT [0, 10] covered at 6/10 = 0.6 (thresholds 0.50, 0.55, 0.60: 3 of 10).
    # Image 2: GT [0, 10] covered at 1.0, GT [50, 60] not at all (its proposal is at [70, 80]).
    # Image 3: no proposal at all: its GT counts, as missed. Image 4: no GT: it counts for nothing.
    images = [
        image([strip(0, 6)], [strip(0, 10)]),
        image([strip(0, 10), strip(70, 80)], [strip(0, 10), strip(50, 60)]),
        image([], [strip(0, 10)]),
        image([strip(0, 10)], []),
    ]
    result = proposal_recall(images, limit=100)
    assert result["num_gt"] == 4
    # Per threshold: (image 1's hit + image 2's perfect one) / 4.
    expected = np.array([(t <= 0.6 + 1e-9) + 1 for t in IOU_THRESHOLDS]) / 4
    np.testing.assert_allclose(result["recalls"], expected)
    assert result["ar"] == pytest.approx((3 + 10) / 40)
    np.testing.assert_allclose(result["overlaps"], [0.0, 0.0, 0.6, 1.0])


def test_area_ranges_use_the_given_area_and_hide_other_objects():
    # A small object (area given as 900 although its box is 40 x 40 = 1600: COCO's area is the
    # segmentation's), a medium (60 x 60 = 3600) and a large one (100 x 100 = 10000).
    small, medium, large = [0, 0, 40, 40], [50, 0, 110, 60], [0, 100, 100, 200]
    # Proposals: the small object's box, the medium one cut to 49.2 of its 60 rows (IoU 0.82) and
    # the large one's box; none overlaps another object.
    proposals = [small, [50, 0, 110, 49.2], large]
    images = [image(proposals, [small, medium, large], gt_areas=[900, 3600, 10000])]
    assert proposal_recall(images, limit=100, area="small")["ar"] == 1.0
    assert proposal_recall(images, limit=100, area="small")["num_gt"] == 1
    # Medium: 0.82 reaches 0.50 .. 0.80, 7 thresholds of 10.
    assert proposal_recall(images, limit=100, area="medium")["ar"] == pytest.approx(0.7)
    assert proposal_recall(images, limit=100, area="large")["ar"] == 1.0
    assert proposal_recall(images, limit=100, area="all")["ar"] == pytest.approx((10 + 7 + 10) / 30)
    # A small-object proposal cannot serve a large object when only large ones count: with only
    # the small object's proposal, the large object is missed.
    only_small = [image([small], [small, large], gt_areas=[900, 10000])]
    assert proposal_recall(only_small, limit=100, area="large")["ar"] == 0.0


def test_no_ground_truth_gives_nan_and_metric_names():
    metrics = proposal_recall_metrics([image([strip(0, 10)], [[0, 0, 40, 40]], gt_areas=[1600])])
    assert list(metrics) == [
        "AR@100", "ARs@100", "ARm@100", "ARl@100", "AR@1000", "ARs@1000", "ARm@1000", "ARl@1000"
    ]
    # IoU of [0,0,10,10] with [0,0,40,40] is 100 / 1600 < 0.5: recall 0 where the object counts.
    assert metrics["AR@100"] == 0.0 and metrics["ARm@100"] == 0.0
    assert math.isnan(metrics["ARs@100"]) and math.isnan(metrics["ARl@1000"])


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="area must be one of"):
        proposal_recall([], limit=10, area="tiny")
    with pytest.raises(ValueError, match="limit must be >= 1"):
        proposal_recall([], limit=0)
    with pytest.raises(ValueError, match="image 0 has 1 boxes but 2 areas"):
        proposal_recall([image([], [strip(0, 1)], gt_areas=[1, 2])], limit=10)


def _pycocotools_ar(images):
    """AR@100 (all, small, medium, large) from COCOeval with useCats=0 (one class for all)."""
    gt = {"images": [], "annotations": [], "categories": [{"id": 1, "name": "object"}]}
    dets = []
    for i, (proposals, boxes, areas) in enumerate(images, start=1):
        gt["images"].append({"id": i, "width": 2000, "height": 1000})
        for j, (b, a) in enumerate(zip(boxes, areas)):
            gt["annotations"].append({
                "id": len(gt["annotations"]) + 1, "image_id": i, "category_id": 1, "iscrowd": 0, "area": float(a),
                "bbox": [float(b[0]), float(b[1]), float(b[2] - b[0]), float(b[3] - b[1])],
            })
        for rank, p in enumerate(proposals):
            dets.append({"image_id": i, "category_id": 1, "score": 1.0 - rank * 1e-3,
                         "bbox": [float(p[0]), float(p[1]), float(p[2] - p[0]), float(p[3] - p[1])]})
    with contextlib.redirect_stdout(io.StringIO()):
        coco = COCO()
        coco.dataset = gt
        coco.createIndex()
        evaluation = COCOeval(coco, coco.loadRes(dets), "bbox")
        evaluation.params.useCats = 0
        evaluation.evaluate()
        evaluation.accumulate()
        evaluation.summarize()
    return evaluation.stats[8:12] * 100  # AR@100 all, small, medium, large


def test_equals_pycocotools_where_each_object_meets_one_proposal():
    """Objects far apart, each with one proposal around it at some IoU (and decoys far from all
    objects): COCOeval's score-order matching and the greedy one agree, so the ARs must too."""
    rng = np.random.default_rng(0)
    images = []
    for _ in range(12):
        proposals, boxes, areas = [], [], []
        for k in range(int(rng.integers(1, 6))):
            side = float(rng.choice([20.0, 50.0, 120.0]))  # small, medium and large objects
            x, y = 250.0 * k, float(rng.uniform(0, 300))  # 250 apart: a proposal meets one object
            boxes.append([x, y, x + side, y + side])
            areas.append(side * side)
            if rng.uniform() < 0.8:  # some objects get no proposal at all
                grow = float(rng.uniform(0.0, 0.6)) * side
                proposals.append([x, y, x + side + grow, y + side])  # IoU side / (side + grow)
        proposals += [[1500.0, 800.0, 1500.0 + s, 800.0 + s] for s in rng.uniform(5, 90, size=3)]
        order = rng.permutation(len(proposals))
        images.append(image([proposals[i] for i in order], boxes, areas))
    ours = proposal_recall_metrics(images, limits=(100,))
    np.testing.assert_allclose([ours["AR@100"], ours["ARs@100"], ours["ARm@100"], ours["ARl@100"]], _pycocotools_ar(images), atol=1e-9)
