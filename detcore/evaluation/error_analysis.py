"""What a COCO evaluation found, as arrays: the numbers behind the evaluation pictures.

- ``precision_recall``: each class's precision-recall curves, read from COCOeval's own
  ``eval["precision"]`` array, and its AP (COCO's: the mean over IoU 0.5:0.95 and the 101 recall
  thresholds), at area "all" and the largest max-detections (100 for boxes and masks).
- ``match_image`` / ``match_coco``: detections matched to the ground truth of an image, the rule
  behind the confusion matrix and the gallery of the worst images (below).
- ``confusion_matrix``: classes x classes counts with a background row and column.

The matching (one image at a time). Detections scoring below ``score_threshold`` are left
out. The others, by decreasing score (ties: in the order given), each take the unmatched
ground truth *of any class* with the highest IoU (ties: the first), if that IoU is at least
``iou_threshold``. Crowd regions (``iscrowd``) are never matched this way; a detection left
unmatched whose IoU with a crowd region reaches the threshold (COCO's crowd IoU: the
intersection over the detection's own area) is ignored, as COCOeval ignores it. IoU is
pycocotools' (``mask.iou``): of boxes for "bbox", of masks for "segm", as COCOeval computes it.

The confusion matrix, ``M[row, column]`` with rows the ground truth's class and columns the
detection's class, index ``K`` (the last) standing for background:

- a detection matched to ground truth of class g, itself of class d: ``M[g, d] += 1`` (the
  diagonal when g == d, a confusion otherwise);
- a detection matched to nothing (a false positive): ``M[K, d] += 1`` (the background row);
- ground truth no detection took (a miss): ``M[g, K] += 1`` (the background column).

So row g sums to the (non-crowd) ground truth of class g, column d (rows 0..K) to the
detections of class d above the score threshold (less those ignored on crowd regions), and
``M[K, K]`` is always 0.
"""
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import numpy as np
import pycocotools.mask as mask_util

__all__ = [
    "IOU_THRESHOLD", "SCORE_THRESHOLD", "UNMATCHED", "IGNORED",
    "PrecisionRecall", "precision_recall", "ImageMatches", "match_image", "match_coco", "confusion_matrix",
]

IOU_THRESHOLD = 0.5
# Detections below this score are left out of the confusion matrix and the gallery: the
# demo's default, so the gallery shows what a user's pictures show.
SCORE_THRESHOLD = 0.5
UNMATCHED, IGNORED = -1, -2  # dt_to_gt values besides ground-truth indices


# --- precision-recall, from COCOeval ----------------------------------------------------------------
@dataclass
class PrecisionRecall:
    """Per-class precision-recall curves of one task.

    ``recall``: COCOeval's recall thresholds ``[R]`` (0, 0.01, ..., 1). ``precision``:
    ``[3, K, R]``, COCOeval's interpolated precision at each recall threshold for IoU 0.5, IoU
    0.75 and the mean over IoU 0.5:0.95 (``curves`` names them), class k in ``cat_ids[k]``'s
    place; NaN for a class without ground truth. ``ap``: ``[K]`` COCO AP in percent (the mean
    of the 0.5:0.95 curve, as ``COCOeval.summarize`` averages), NaN without ground truth.
    """

    recall: np.ndarray
    precision: np.ndarray
    ap: np.ndarray
    cat_ids: List[int]
    names: List[str]
    curves = ("IoU 0.5", "IoU 0.75", "IoU 0.5:0.95")


def precision_recall(coco_eval, cat_ids: Optional[Sequence[int]] = None) -> PrecisionRecall:
    """The ``PrecisionRecall`` of an accumulated ``COCOeval`` (pycocotools' or faster_coco_eval's);
    classes in the order of ``cat_ids`` (default: the evaluation's ``params.catIds``)."""
    precision = getattr(coco_eval, "eval", None) or {}
    precision = precision.get("precision")
    if precision is None:
        raise ValueError("precision_recall: coco_eval has no eval['precision']; call evaluate() and accumulate() first")
    params = coco_eval.params
    eval_ids = [int(c) for c in params.catIds]
    cat_ids = eval_ids if cat_ids is None else [int(c) for c in cat_ids]
    missing = [c for c in cat_ids if c not in eval_ids]
    if missing:
        raise ValueError(f"precision_recall: category ids {missing} were not evaluated (evaluated: {eval_ids})")
    iou_thrs = np.asarray(params.iouThrs, dtype=np.float64)
    at = {}
    for thr in (0.5, 0.75):
        hits = np.flatnonzero(np.isclose(iou_thrs, thr))
        if hits.size == 0:
            raise ValueError(f"precision_recall: the evaluation has no IoU threshold {thr} (its thresholds: {iou_thrs})")
        at[thr] = int(hits[0])
    # [T, R, K] at area "all" (index 0) and the largest max-detections (the last).
    p = np.asarray(precision, dtype=np.float64)[:, :, [eval_ids.index(c) for c in cat_ids], 0, -1]
    p = np.where(p > -1, p, np.nan)  # -1: no ground truth of the class
    curves = np.stack([p[at[0.5]], p[at[0.75]], _nanmean(p, axis=0)]).transpose(0, 2, 1)  # [3, K, R]
    ap = _nanmean(p.reshape(-1, p.shape[2]), axis=0) * 100
    names = [str(coco_eval.cocoGt.cats[c]["name"]) for c in cat_ids]
    return PrecisionRecall(np.asarray(params.recThrs, dtype=np.float64), curves, ap, cat_ids, names)


def _nanmean(a: np.ndarray, axis: int) -> np.ndarray:
    """Mean over ``axis`` of the non-NaN values; NaN where there are none (without a warning)."""
    valid = ~np.isnan(a)
    count = valid.sum(axis=axis)
    total = np.where(valid, a, 0.0).sum(axis=axis)
    return np.where(count > 0, total / np.maximum(count, 1), np.nan)


# --- matching ---------------------------------------------------------------------------------------
@dataclass
class ImageMatches:
    """One image's detections matched to its ground truth (see the module's docstring).

    Ground truth: ``gt_classes`` ``[G]`` (class indices), ``gt_crowd`` ``[G]`` bool, and
    ``gt_index`` ``[G]``, each one's position in the annotations it came from. Detections, only
    those at or above the score threshold, by decreasing score: ``dt_classes``, ``dt_scores``,
    ``dt_index`` (position in the detections given) and ``dt_to_gt`` ``[D]`` (the matched ground
    truth's index into the ``gt_*`` arrays, ``UNMATCHED``, or ``IGNORED`` on a crowd region).
    """

    image_id: int
    gt_classes: np.ndarray
    gt_crowd: np.ndarray
    gt_index: np.ndarray
    dt_classes: np.ndarray
    dt_scores: np.ndarray
    dt_index: np.ndarray
    dt_to_gt: np.ndarray

    @property
    def missed(self) -> np.ndarray:
        """Indices (into ``gt_*``) of the non-crowd ground truth no detection took."""
        taken = np.zeros(len(self.gt_classes), dtype=bool)
        taken[self.dt_to_gt[self.dt_to_gt >= 0]] = True
        return np.flatnonzero(~taken & ~self.gt_crowd)

    @property
    def false_positives(self) -> np.ndarray:
        """Indices (into ``dt_*``) of the detections matched to nothing."""
        return np.flatnonzero(self.dt_to_gt == UNMATCHED)

    @property
    def wrong_class(self) -> np.ndarray:
        """Indices (into ``dt_*``) of the detections matched to ground truth of another class."""
        matched = np.flatnonzero(self.dt_to_gt >= 0)
        return matched[self.gt_classes[self.dt_to_gt[matched]] != self.dt_classes[matched]]

    @property
    def num_errors(self) -> int:
        """Misses + false positives + wrong classes: how the gallery ranks images."""
        return len(self.missed) + len(self.false_positives) + len(self.wrong_class)


def _array(x, dtype, name: str, length: Optional[int] = None) -> np.ndarray:
    a = np.asarray(x, dtype=dtype).reshape(-1)
    if length is not None and len(a) != length:
        raise ValueError(f"match_image: {name} has {len(a)} entries, expected {length}")
    return a


def match_image(
    gt_classes,
    dt_classes,
    dt_scores,
    ious,
    gt_crowd=None,
    iou_threshold: float = IOU_THRESHOLD,
    score_threshold: float = SCORE_THRESHOLD,
    image_id: int = -1,
) -> ImageMatches:
    """Match one image's detections to its ground truth (rule in the module's docstring).

    ``ious``: ``[D, G]``, detection i against ground truth j (for a crowd region, COCO's crowd
    IoU), for all D detections given, in their order. Returns the ``ImageMatches``.
    """
    gt_classes = _array(gt_classes, np.int64, "gt_classes")
    num_gt = len(gt_classes)
    gt_crowd = np.zeros(num_gt, dtype=bool) if gt_crowd is None else _array(gt_crowd, bool, "gt_crowd", num_gt)
    dt_classes = _array(dt_classes, np.int64, "dt_classes")
    dt_scores = _array(dt_scores, np.float64, "dt_scores", len(dt_classes))
    ious = np.asarray(ious, dtype=np.float64)
    if ious.size == 0:
        ious = ious.reshape(len(dt_classes), num_gt)
    if ious.shape != (len(dt_classes), num_gt):
        raise ValueError(
            f"match_image: ious must be [detections, ground truth] = {(len(dt_classes), num_gt)}, got {ious.shape}"
        )
    if not 0.0 <= iou_threshold <= 1.0:
        raise ValueError(f"match_image: iou_threshold must be in [0, 1], got {iou_threshold}")

    kept = np.flatnonzero(dt_scores >= score_threshold)
    kept = kept[np.argsort(-dt_scores[kept], kind="stable")]
    taken = gt_crowd.copy()  # crowd regions are never taken by the greedy match
    dt_to_gt = np.full(len(kept), UNMATCHED, dtype=np.int64)
    for i, d in enumerate(kept):
        candidates = np.where(taken, -1.0, ious[d])
        if num_gt and candidates.max() >= iou_threshold:
            best = int(np.argmax(candidates))  # the first of equal IoUs
            taken[best] = True
            dt_to_gt[i] = best
        elif np.any(gt_crowd & (ious[d] >= iou_threshold)):
            dt_to_gt[i] = IGNORED
    return ImageMatches(
        image_id=int(image_id),
        gt_classes=gt_classes,
        gt_crowd=gt_crowd,
        gt_index=np.arange(num_gt),
        dt_classes=dt_classes[kept],
        dt_scores=dt_scores[kept],
        dt_index=kept,
        dt_to_gt=dt_to_gt,
    )


def confusion_matrix(matches: Sequence[ImageMatches], num_classes: int) -> np.ndarray:
    """The ``[K + 1, K + 1]`` int64 confusion matrix of ``matches`` (rows: ground truth class,
    columns: detected class; index K: background; see the module's docstring)."""
    if num_classes < 1:
        raise ValueError(f"confusion_matrix: num_classes must be >= 1, got {num_classes}")
    k = num_classes
    matrix = np.zeros((k + 1, k + 1), dtype=np.int64)
    for m in matches:
        for name, classes in (("ground truth", m.gt_classes), ("detection", m.dt_classes)):
            if classes.size and (classes.min() < 0 or classes.max() >= k):
                raise ValueError(
                    f"confusion_matrix: image {m.image_id} has a {name} of class {int(classes.max())} "
                    f"(or below 0); the classes are 0..{k - 1}"
                )
        matched = m.dt_to_gt >= 0
        np.add.at(matrix, (m.gt_classes[m.dt_to_gt[matched]], m.dt_classes[matched]), 1)
        np.add.at(matrix, (k, m.dt_classes[m.dt_to_gt == UNMATCHED]), 1)
        np.add.at(matrix, (m.gt_classes[m.missed], k), 1)
    return matrix


# --- from COCO objects ------------------------------------------------------------------------------
def match_coco(
    coco_gt,
    results: Sequence[dict],
    image_ids: Sequence[int],
    cat_ids: Sequence[int],
    iou_type: str = "bbox",
    iou_threshold: float = IOU_THRESHOLD,
    score_threshold: float = SCORE_THRESHOLD,
) -> List[ImageMatches]:
    """``match_image`` on every image of ``image_ids``: the ground truth of ``coco_gt`` (a
    pycocotools ``COCO``) against the COCO result dicts ``results``; class k is ``cat_ids[k]``
    (annotations of other categories are left out). ``iou_type``: "bbox" (box IoU) or "segm"
    (mask IoU; results need "segmentation"). ``gt_index`` points into the image's annotations
    (``coco_gt.imgToAnns[image_id]``), ``dt_index`` into its results of those categories, in the
    order of ``results``."""
    if iou_type not in ("bbox", "segm"):
        raise ValueError(f"match_coco: iou_type must be 'bbox' or 'segm', got {iou_type!r}")
    index = {int(c): k for k, c in enumerate(cat_ids)}
    by_image: Dict[int, List[dict]] = {int(i): [] for i in image_ids}
    for r in results:
        if int(r["image_id"]) in by_image and int(r["category_id"]) in index:
            by_image[int(r["image_id"])].append(r)
    out = []
    for image_id, dts in by_image.items():
        anns = coco_gt.imgToAnns.get(image_id, [])
        gt_pos = [j for j, a in enumerate(anns) if int(a["category_id"]) in index]
        gts = [anns[j] for j in gt_pos]
        crowd = [bool(a.get("iscrowd", 0)) for a in gts]
        if iou_type == "bbox":
            dt_geom, gt_geom = [d["bbox"] for d in dts], [a["bbox"] for a in gts]
        else:
            dt_geom, gt_geom = [d["segmentation"] for d in dts], [coco_gt.annToRLE(a) for a in gts]
        ious = mask_util.iou(dt_geom, gt_geom, crowd) if dts and gts else np.zeros((len(dts), len(gts)))
        m = match_image(
            [index[int(a["category_id"])] for a in gts],
            [index[int(d["category_id"])] for d in dts],
            [float(d["score"]) for d in dts],
            ious,
            crowd,
            iou_threshold,
            score_threshold,
            image_id,
        )
        m.gt_index = np.asarray(gt_pos, dtype=np.int64)
        out.append(m)
    return out
