"""Which annotations are usable: one policy for the COCO, VOC and Cityscapes loaders, in training
and in evaluation.

A file whose structure is wrong (missing fields, wrong types, unknown ids or class names, an
image size that is not a whole number of pixels OpenCV can read) is an error naming the file and
the annotation (or object): nobody should train on it. An annotation (a VOC or Cityscapes object)
that is well formed but geometrically unusable is dropped, and the drops are counted and logged
per reason with the first ids, where training loads the file and where an evaluator loads its
ground truth (so pycocotools and the VOC AP never get it). Unusable means:

- a box or polygon coordinate that is NaN, infinite or beyond the float range (a json integer
  of 400 digits: as a float it is infinite);
- a coordinate absurdly far outside the image: more than one image width (height) left of
  (above) it or right of (below) it; annotations lie within their images, and such values (1e9,
  say) make mask rasterization allocate without bound;
- a box with zero or negative width or height, or one lying entirely outside the image;
- a segmentation with no polygon of 3 or more points (shorter ones cover nothing);
- a labeled keypoint (visibility > 0) with a non-finite coordinate.

A box partly outside its image is usable: the data pipeline clips it.

``coco_annotation_reason`` and ``filter_coco_dataset`` apply the policy to COCO json dicts; the
VOC and Cityscapes loaders call ``box_reason`` and ``polygon_reason`` on their objects.
"""
import logging
import math
import numbers
from collections import defaultdict
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

__all__ = [
    "MAX_IMAGE_PIXELS",
    "MAX_IMAGE_SIDE",
    "DropReport",
    "as_float",
    "box_reason",
    "coco_annotation_reason",
    "filter_coco_dataset",
    "image_size_problem",
    "is_real_number",
    "polygon_reason",
    "usable_polygons",
]

logger = logging.getLogger(__name__)

# The largest image OpenCV's reader opens by default (its CV_IO_MAX_IMAGE_WIDTH / _HEIGHT and
# CV_IO_MAX_IMAGE_PIXELS): detcore reads images with OpenCV, so a larger size cannot be right.
MAX_IMAGE_SIDE = 1 << 20
MAX_IMAGE_PIXELS = 1 << 30


def is_real_number(x: Any) -> bool:
    """A json number (bool excluded: json's true is not 1 here)."""
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def as_float(x: Any) -> float:
    """``float(x)`` for a real number, with an integer beyond the float range as +-inf (json
    integers have any number of digits) rather than an OverflowError."""
    try:
        return float(x)
    except OverflowError:
        return math.inf if x > 0 else -math.inf


def _shown(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 24 else f"{text[:12]}...({len(text)} characters)"


def image_size_problem(width: Any, height: Any) -> Optional[str]:
    """Why ``width`` x ``height`` cannot be an image's size in pixels, or None when it can."""
    for name, v in (("width", width), ("height", height)):
        whole = isinstance(v, numbers.Integral) or (isinstance(v, float) and v.is_integer())
        if isinstance(v, bool) or not whole:
            return f"the image {name} must be a whole number of pixels, got {_shown(v)}"
        if not 1 <= v <= MAX_IMAGE_SIDE:
            return f"the image {name} must lie in 1..{MAX_IMAGE_SIDE} pixels, got {_shown(v)}"
    if int(width) * int(height) > MAX_IMAGE_PIXELS:
        return f"the image size {int(width)} x {int(height)} exceeds {MAX_IMAGE_PIXELS} pixels"
    return None


def usable_polygons(segm: List[list]) -> List[list]:
    """The polygons with at least 3 points (the caller has checked the structure)."""
    return [poly for poly in segm if len(poly) >= 6]


def _far_outside(xs: Iterable[float], ys: Iterable[float], width: int, height: int) -> bool:
    return any(x < -width or x > 2 * width for x in xs) or any(y < -height or y > 2 * height for y in ys)


def box_reason(x1: Any, y1: Any, x2: Any, y2: Any, width: int, height: int) -> Optional[str]:
    """Why the box ``(x1, y1, x2, y2)`` (continuous xyxy) of a ``width`` x ``height`` image is
    unusable, or None when it is usable."""
    x1, y1, x2, y2 = (as_float(v) for v in (x1, y1, x2, y2))
    if not all(math.isfinite(v) for v in (x1, y1, x2, y2)):
        return "non-finite bbox"
    if _far_outside((x1, x2), (y1, y2), width, height):
        return "bbox far outside the image"
    if x2 <= x1 or y2 <= y1:
        return "bbox with zero or negative width or height"
    if x1 >= width or y1 >= height or x2 <= 0 or y2 <= 0:
        return "bbox outside the image"
    return None


def polygon_reason(xs: Sequence[Any], ys: Sequence[Any], width: int, height: int) -> Optional[str]:
    """Why polygon points with coordinates ``xs``, ``ys`` (all polygons of an instance together)
    are unusable, or None when they are usable. The number of points is the caller's rule."""
    xs, ys = [as_float(v) for v in xs], [as_float(v) for v in ys]
    if not all(math.isfinite(v) for v in xs + ys):
        return "non-finite polygon coordinate"
    if _far_outside(xs, ys, width, height):
        return "polygon far outside the image"
    return None


def coco_annotation_reason(ann: dict, width: int, height: int) -> Optional[str]:
    """Why the COCO annotation ``ann`` (``bbox`` as [x, y, w, h]; polygons or RLE) of a
    ``width`` x ``height`` image cannot be used, or None when it can. A structurally malformed
    annotation is reported too ("malformed"), for callers that do not check structure first."""
    bbox = ann.get("bbox")
    if not isinstance(bbox, (list, tuple)) or len(bbox) != 4 or not all(is_real_number(v) for v in bbox):
        return "malformed bbox"
    x, y, w, h = (as_float(v) for v in bbox)
    if not all(math.isfinite(v) for v in (x, y, w, h)):
        return "non-finite bbox"
    reason = box_reason(x, y, x + w, y + h, width, height)
    if reason is not None:
        return reason
    segm = ann.get("segmentation")
    if isinstance(segm, list):
        if not all(isinstance(p, list) and all(is_real_number(v) for v in p) for p in segm):
            return "malformed segmentation"
        coords = [v for poly in segm for v in poly]
        reason = polygon_reason(coords[0::2], coords[1::2], width, height)
        if reason is not None:
            return reason
        if not usable_polygons(segm):
            return "no polygon with 3 or more points"
    kps = ann.get("keypoints")
    if isinstance(kps, list) and all(is_real_number(v) for v in kps):
        labeled = [v for i in range(2, len(kps), 3) if kps[i] > 0 for v in kps[i - 2 : i]]
        if not all(math.isfinite(as_float(v)) for v in labeled):
            return "non-finite keypoint coordinate"
    return None


class DropReport:
    """Counts dropped annotations per reason and logs them once, with the first few ids.
    ``kind`` names what is dropped ("annotation", "object") and ``ids`` what identifies one."""

    _SHOWN_IDS = 5

    def __init__(self, source: str, kind: str = "annotation", ids: str = "annotation ids"):
        self.source, self.kind, self.ids_label = source, kind, ids
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
            parts.append(f"{len(ids)} with {reason} ({self.ids_label} {shown}{more})")
        logger.warning(
            "%s: dropped %d unusable %s(s): %s. See detcore.data.datasets.annotation_checks for the policy.",
            self.source, self.total, self.kind, "; ".join(parts),
        )


def filter_coco_dataset(data: dict, source: str) -> Tuple[dict, DropReport]:
    """A copy of a COCO json dict without its unusable annotations (the evaluator's ground
    truth), and the report of what was dropped (already logged)."""
    sizes = {img["id"]: (img["width"], img["height"]) for img in data.get("images", []) if isinstance(img, dict)}
    report = DropReport(source)
    kept = []
    for ann in data.get("annotations", []):
        size = sizes.get(ann.get("image_id")) if isinstance(ann, dict) else None
        reason = "malformed annotation" if size is None else coco_annotation_reason(ann, *size)
        if reason is None:
            if isinstance(ann.get("segmentation"), list):
                ann = {**ann, "segmentation": usable_polygons(ann["segmentation"])}
            kept.append(ann)
        else:
            report.add(reason, ann.get("id") if isinstance(ann, dict) else None)
    report.log()
    return {**data, "annotations": kept}, report
