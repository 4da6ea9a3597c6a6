"""Which COCO annotations are usable: one policy for training and evaluation.

An annotation whose structure is wrong (missing fields, wrong types, unknown ids) is an error
naming the json file and the annotation id: the file is broken and nobody should train on it.
An annotation that is well formed but geometrically unusable is dropped, and the drops are
counted and logged per reason with the first annotation ids, both where training loads the json
and where the evaluator loads its ground truth (so pycocotools never gets it). Unusable means:

- a bbox or polygon coordinate that is NaN or infinite;
- a coordinate absurdly far outside the image: more than one image width (height) left of
  (above) it or right of (below) it; COCO annotations lie within their images, and such values
  (1e9, say) make mask rasterization allocate without bound;
- a bbox with zero or negative width or height, or one lying entirely outside the image;
- a segmentation with no polygon of 3 or more points (shorter ones cover nothing);
- a labeled keypoint (visibility > 0) with a NaN or infinite coordinate.
"""
import logging
import math
import numbers
from collections import defaultdict
from typing import Any, Dict, Iterable, List, Optional, Tuple

__all__ = ["DropReport", "filter_coco_dataset", "is_real_number", "unusable_reason", "usable_polygons"]

logger = logging.getLogger(__name__)


def is_real_number(x: Any) -> bool:
    """A json number (bool excluded: json's true is not 1 here)."""
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def usable_polygons(segm: List[list]) -> List[list]:
    """The polygons with at least 3 points (the caller has checked the structure)."""
    return [poly for poly in segm if len(poly) >= 6]


def _far_outside(xs: Iterable[float], ys: Iterable[float], width: int, height: int) -> bool:
    return any(x < -width or x > 2 * width for x in xs) or any(y < -height or y > 2 * height for y in ys)


def unusable_reason(ann: dict, width: int, height: int) -> Optional[str]:
    """Why the COCO annotation ``ann`` (``bbox`` as [x, y, w, h]; polygons or RLE) of a
    ``width`` x ``height`` image cannot be used, or None when it can. A structurally malformed
    annotation is reported too ("malformed"), for callers that do not check structure first."""
    bbox = ann.get("bbox")
    if not isinstance(bbox, (list, tuple)) or len(bbox) != 4 or not all(is_real_number(v) for v in bbox):
        return "malformed bbox"
    x, y, w, h = (float(v) for v in bbox)
    if not all(math.isfinite(v) for v in (x, y, w, h)):
        return "non-finite bbox"
    if _far_outside((x, x + w), (y, y + h), width, height):
        return "bbox far outside the image"
    if w <= 0 or h <= 0:
        return "bbox with zero or negative width or height"
    if x >= width or y >= height or x + w <= 0 or y + h <= 0:
        return "bbox outside the image"
    segm = ann.get("segmentation")
    if isinstance(segm, list):
        if not all(isinstance(p, list) and all(is_real_number(v) for v in p) for p in segm):
            return "malformed segmentation"
        coords = [float(v) for poly in segm for v in poly]
        if not all(math.isfinite(v) for v in coords):
            return "non-finite polygon coordinate"
        if _far_outside(coords[0::2], coords[1::2], width, height):
            return "polygon far outside the image"
        if not usable_polygons(segm):
            return "no polygon with 3 or more points"
    kps = ann.get("keypoints")
    if isinstance(kps, list) and all(is_real_number(v) for v in kps):
        labeled = [v for i in range(2, len(kps), 3) if kps[i] > 0 for v in kps[i - 2 : i]]
        if not all(math.isfinite(float(v)) for v in labeled):
            return "non-finite keypoint coordinate"
    return None


class DropReport:
    """Counts dropped annotations per reason and logs them once, with the first few ids."""

    _SHOWN_IDS = 5

    def __init__(self, source: str):
        self.source = source
        self._ids: Dict[str, List[Any]] = defaultdict(list)

    def add(self, reason: str, ann_id: Any) -> None:
        self._ids[reason].append(ann_id)

    @property
    def total(self) -> int:
        return sum(len(v) for v in self._ids.values())

    def counts(self) -> Dict[str, int]:
        return {reason: len(ids) for reason, ids in self._ids.items()}

    def log(self) -> None:
        if not self._ids:
            return
        parts = []
        for reason, ids in sorted(self._ids.items()):
            shown = ", ".join(str(i) for i in ids[: self._SHOWN_IDS])
            more = f", ... ({len(ids) - self._SHOWN_IDS} more)" if len(ids) > self._SHOWN_IDS else ""
            parts.append(f"{len(ids)} with {reason} (annotation ids {shown}{more})")
        logger.warning(
            "%s: dropped %d unusable annotation(s): %s. See detcore.data.datasets.coco_checks for the policy.",
            self.source, self.total, "; ".join(parts),
        )


def filter_coco_dataset(data: dict, source: str) -> Tuple[dict, DropReport]:
    """A copy of a COCO json dict without its unusable annotations (the evaluator's ground
    truth), and the report of what was dropped (already logged)."""
    sizes = {img["id"]: (img["width"], img["height"]) for img in data.get("images", []) if isinstance(img, dict)}
    report = DropReport(source)
    kept = []
    for ann in data.get("annotations", []):
        size = sizes.get(ann.get("image_id")) if isinstance(ann, dict) else None
        reason = "malformed annotation" if size is None else unusable_reason(ann, *size)
        if reason is None:
            if isinstance(ann.get("segmentation"), list):
                ann = {**ann, "segmentation": usable_polygons(ann["segmentation"])}
            kept.append(ann)
        else:
            report.add(reason, ann.get("id") if isinstance(ann, dict) else None)
    report.log()
    return {**data, "annotations": kept}, report
