"""Proposal recall: how well a detector's class-agnostic proposals cover the ground truth.

AR@N (COCO's "average recall" for proposals; Hosang et al., 2016) is the recall of the top N
proposals of each image, averaged over the IoU thresholds 0.50, 0.55, ..., 0.95; ARs / ARm / ARl
count only the ground truth of small (area < 32²), medium and large (> 96²) objects, with COCO's
area (the segmentation's, inclusive bounds). Crowd annotations take no part.

A proposal covers at most one object: within each image the object best covered by a remaining
proposal takes it, then the next (detectron2's ``_evaluate_box_proposals``, a close and much
faster stand-in for COCOeval with ``useCats=0``). One difference from detectron2: an image with
no proposal at all still counts its objects (as missed); detectron2 leaves such images out.
"""
from typing import Dict, Iterable, Sequence, Tuple

import numpy as np

__all__ = [
    "AREA_RANGES",
    "IOU_THRESHOLDS",
    "LIMITS",
    "greedy_proposal_overlaps",
    "proposal_recall",
    "proposal_recall_metrics",
]

# Area ranges of COCO (pixels², inclusive), by name, and their suffix in the metric names.
AREA_RANGES = {"all": (0.0, 1e5**2), "small": (0.0, 32.0**2), "medium": (32.0**2, 96.0**2), "large": (96.0**2, 1e5**2)}
_AREA_SUFFIX = {"all": "", "small": "s", "medium": "m", "large": "l"}
IOU_THRESHOLDS = np.linspace(0.5, 0.95, 10)
LIMITS = (100, 1000)


def _pairwise_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """[len(a), len(b)] IoU of xyxy boxes (no "+1"; empty boxes have IoU 0)."""
    area_a = (a[:, 2] - a[:, 0]).clip(min=0) * (a[:, 3] - a[:, 1]).clip(min=0)
    area_b = (b[:, 2] - b[:, 0]).clip(min=0) * (b[:, 3] - b[:, 1]).clip(min=0)
    lt = np.maximum(a[:, None, :2], b[None, :, :2])
    rb = np.minimum(a[:, None, 2:], b[None, :, 2:])
    wh = (rb - lt).clip(min=0)
    inter = wh[..., 0] * wh[..., 1]
    union = area_a[:, None] + area_b[None, :] - inter
    return np.divide(inter, union, out=np.zeros_like(inter), where=union > 0)


def greedy_proposal_overlaps(proposals: np.ndarray, gt_boxes: np.ndarray) -> np.ndarray:
    """The IoU each ground-truth box gets in a one-to-one matching with the proposals.

    Repeatedly, the ground-truth box best covered by a proposal not yet taken takes that
    proposal; boxes left over when the proposals run out get 0.

    Args:
        proposals: ``[P, 4]`` xyxy.
        gt_boxes: ``[G, 4]`` xyxy.

    Returns:
        ``[G]`` float64, entry g for ``gt_boxes[g]``.
    """
    proposals = np.asarray(proposals, dtype=np.float64).reshape(-1, 4)
    gt_boxes = np.asarray(gt_boxes, dtype=np.float64).reshape(-1, 4)
    overlaps = np.zeros(len(gt_boxes))
    if len(proposals) == 0 or len(gt_boxes) == 0:
        return overlaps
    iou = _pairwise_iou(proposals, gt_boxes)
    columns = np.arange(len(gt_boxes))
    for _ in range(min(len(proposals), len(gt_boxes))):
        best_proposal = iou.argmax(axis=0)  # per ground-truth box, its best remaining proposal
        best = iou[best_proposal, columns]
        g = int(best.argmax())
        overlaps[g] = best[g]
        iou[best_proposal[g], :] = -1.0  # both taken
        iou[:, g] = -1.0
    return overlaps


def proposal_recall(
    images: Iterable[Tuple[np.ndarray, np.ndarray, np.ndarray]],
    limit: int,
    area: str = "all",
    thresholds: Sequence[float] = IOU_THRESHOLDS,
) -> Dict[str, object]:
    """Recall of the top ``limit`` proposals per image over a dataset.

    Args:
        images: per image ``(proposals [P, 4] xyxy by decreasing objectness, gt_boxes [G, 4]
            xyxy (no crowd), gt_areas [G])``.
        limit: proposals kept per image (the first ``limit``).
        area: one of AREA_RANGES: only ground truth of that area counts (and can be matched).
        thresholds: IoU thresholds the recall is averaged over.

    Returns:
        ``{"ar": mean recall (NaN without ground truth), "recalls": [T] per threshold,
        "thresholds": [T], "num_gt": objects counted, "overlaps": [num_gt] matched IoUs}``.
    """
    if area not in AREA_RANGES:
        raise ValueError(f"proposal_recall: area must be one of {list(AREA_RANGES)}, got {area!r}")
    if int(limit) < 1:
        raise ValueError(f"proposal_recall: limit must be >= 1, got {limit}")
    low, high = AREA_RANGES[area]
    overlaps = []
    for i, (proposals, gt_boxes, gt_areas) in enumerate(images):
        gt_boxes = np.asarray(gt_boxes, dtype=np.float64).reshape(-1, 4)
        gt_areas = np.asarray(gt_areas, dtype=np.float64).reshape(-1)
        if len(gt_areas) != len(gt_boxes):
            raise ValueError(f"proposal_recall: image {i} has {len(gt_boxes)} boxes but {len(gt_areas)} areas")
        counted = (gt_areas >= low) & (gt_areas <= high)
        if counted.any():
            top = np.asarray(proposals, dtype=np.float64).reshape(-1, 4)[: int(limit)]
            overlaps.append(greedy_proposal_overlaps(top, gt_boxes[counted]))
    overlaps = np.concatenate(overlaps) if overlaps else np.zeros(0)
    thresholds = np.asarray(thresholds, dtype=np.float64)
    if len(overlaps) == 0:
        recalls = np.full(len(thresholds), np.nan)
    else:
        recalls = np.array([(overlaps >= t).mean() for t in thresholds])
    return {
        "ar": float(recalls.mean()),
        "recalls": recalls,
        "thresholds": thresholds,
        "num_gt": int(len(overlaps)),
        "overlaps": np.sort(overlaps),
    }


def proposal_recall_metrics(images: Sequence[Tuple[np.ndarray, np.ndarray, np.ndarray]], limits=LIMITS) -> Dict[str, float]:
    """``AR@N`` and ``ARs@N`` / ``ARm@N`` / ``ARl@N`` for each N of ``limits``, in percent
    (detectron2's names; NaN where no object of that size exists)."""
    metrics = {}
    for limit in limits:
        for area, suffix in _AREA_SUFFIX.items():
            metrics[f"AR{suffix}@{limit}"] = proposal_recall(images, limit, area)["ar"] * 100
    return metrics
