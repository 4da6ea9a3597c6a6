"""Draw detections (boxes, masks, keypoints and their skeleton, class names, scores) into a BGR
image with OpenCV only.

Every class keeps one colour in every picture (``class_color``), so pictures from different
images or checkpoints can be compared at a glance. Line widths and text size follow the image
size. Keypoints are dots coloured by side (left, right, middle, from their names), so a
left/right mix-up shows at a glance, on the instance's skeleton drawn in its class colour. A small
image (the 96-160 px shapes images) is drawn scaled up by a whole factor (``upscale_factor``,
``draw_instances(scale=...)``): at its own size a readable label covers the object it names.
"""
import colorsys
import math
from typing import Optional, Sequence, Tuple, Union

import cv2
import numpy as np
import torch

from detcore.structures import BitMasks, Boxes, Instances, Keypoints, PolygonMasks

__all__ = ["class_color", "draw_instances", "upscale_factor"]

_GOLDEN_RATIO = 0.618033988749895
_NO_CLASS_COLOR = (80, 200, 80)  # BGR green for class-less boxes (e.g. proposals)
# BGR keypoint colours by side: left points orange, right points blue, the others white.
_LEFT_COLOR, _RIGHT_COLOR, _MIDDLE_COLOR = (0, 140, 255), (255, 120, 0), (255, 255, 255)


def class_color(class_id: Optional[int]) -> Tuple[int, int, int]:
    """Deterministic, well-separated BGR colour of a class.

    Hues step by the golden ratio, so neighbouring ids (often similar classes) get far-apart
    hues and no palette runs out; saturation/value alternate a little for ids whose hues meet.
    """
    if class_id is None or class_id < 0:
        return _NO_CLASS_COLOR
    hue = (0.08 + class_id * _GOLDEN_RATIO) % 1.0
    value = 0.95 if (class_id // 5) % 2 == 0 else 0.78
    r, g, b = colorsys.hsv_to_rgb(hue, 0.8, value)
    return int(b * 255), int(g * 255), int(r * 255)


def upscale_factor(height: int, width: int, min_short_side: int = 480, max_long_side: int = 2400) -> int:
    """The whole factor that brings an image's short side to at least ``min_short_side`` pixels
    (1 for images that big already, or for ``min_short_side`` 0), as long as the long side stays
    within ``max_long_side``. Whole factors keep every pixel a square block and map a box
    coordinate ``x`` to exactly ``x * factor``."""
    if min_short_side < 0 or max_long_side < 1:
        raise ValueError(
            f"upscale_factor: min_short_side must be >= 0 and max_long_side >= 1, got {min_short_side}, {max_long_side}"
        )
    short, long = min(height, width), max(height, width)
    if short < 1 or short >= min_short_side:
        return 1
    return max(1, min(math.ceil(min_short_side / short), max_long_side // long))


def _field(instances: Instances, *names):
    for name in names:
        if instances.has(name):
            return instances.get(name)
    return None


def _to_numpy(x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().numpy()
    return np.asarray(x)


def _masks_array(masks, height: int, width: int) -> np.ndarray:
    if isinstance(masks, PolygonMasks):
        masks = BitMasks.from_polygons(masks, height, width).tensor
    elif isinstance(masks, BitMasks):
        masks = masks.tensor
    masks = _to_numpy(masks)
    if masks.ndim != 3 or masks.shape[1:] != (height, width):
        raise ValueError(
            f"draw_instances: masks (pred_masks / gt_masks) must be [N, H, W] at the image size "
            f"{(height, width)}, got {tuple(masks.shape)}"
        )
    return masks if masks.dtype == np.bool_ else masks > 0.5


def _text_color(bg: Tuple[int, int, int]) -> Tuple[int, int, int]:
    b, g, r = bg
    return (0, 0, 0) if 0.299 * r + 0.587 * g + 0.114 * b > 140 else (255, 255, 255)


def draw_instances(
    image: np.ndarray,
    instances: Instances,
    class_names: Optional[Sequence[str]] = None,
    score_threshold: float = 0.5,
    mask_alpha: float = 0.45,
    scale: int = 1,
    keypoint_names: Optional[Sequence[str]] = None,
    keypoint_skeleton: Optional[Sequence[Tuple[str, str]]] = None,
    keypoint_threshold: Optional[float] = None,
) -> np.ndarray:
    """A copy of ``image`` (``uint8 [H, W, 3]`` BGR) with ``instances`` drawn on it; with
    ``scale`` k > 1, the image enlarged k times (each pixel a k x k block, see
    ``upscale_factor``) with the detections drawn at their enlarged positions, lines and labels
    sized for the enlarged picture.

    Reads ``pred_boxes`` / ``scores`` / ``pred_classes`` / ``pred_masks`` / ``pred_keypoints``
    (model outputs) or ``gt_boxes`` / ``gt_classes`` / ``gt_masks`` / ``gt_keypoints``
    (annotations: no scores, so all are drawn). Instances scoring below ``score_threshold`` are
    left out. Masks (bool ``[N, H, W]``, ``BitMasks`` or ``PolygonMasks``) get a ``mask_alpha``
    colour fill and an outline; each instance is labelled "name 87%" (or the class index when
    ``class_names`` is None).

    Keypoints (``[N, K, 3]``: x, y and a score, or ``Keypoints`` with visibility) are drawn as
    dots, joined by the lines of ``keypoint_skeleton`` (pairs of names in ``keypoint_names``, a
    dataset's metadata). Points with visibility 0, or a score below ``keypoint_threshold`` (the
    heatmap logit of a prediction; None draws every predicted point), are left out.
    """
    if not isinstance(image, np.ndarray) or image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
        desc = f"{image.dtype} {image.shape}" if isinstance(image, np.ndarray) else type(image).__name__
        raise ValueError(f"draw_instances: image must be a uint8 numpy array [H, W, 3] (BGR), got {desc}")
    if not isinstance(instances, Instances):
        raise TypeError(f"draw_instances: instances must be Instances, got {type(instances).__name__}")
    if isinstance(scale, bool) or not isinstance(scale, (int, np.integer)) or scale < 1:
        raise ValueError(f"draw_instances: scale must be a whole number >= 1, got {scale!r}")
    scale = int(scale)
    height, width = image.shape[:2]
    # Nearest neighbour: pixel (i, j) becomes the block [i*k, (i+1)*k) x [j*k, (j+1)*k).
    out = np.ascontiguousarray(image.repeat(scale, axis=0).repeat(scale, axis=1) if scale > 1 else image.copy())
    n = len(instances)
    if n == 0:
        return out

    boxes = _field(instances, "pred_boxes", "gt_boxes")
    scores = _field(instances, "scores")
    classes = _field(instances, "pred_classes", "gt_classes")
    masks = _field(instances, "pred_masks", "gt_masks")
    if boxes is None and masks is None:
        raise ValueError(
            f"draw_instances: nothing to draw; instances need pred_boxes/gt_boxes or "
            f"pred_masks/gt_masks (have {list(instances.fields())})"
        )
    masks = _masks_array(masks, height, width) if masks is not None else None
    draw_rectangles = boxes is not None
    if boxes is None:  # labels still need an anchor
        boxes = BitMasks(torch.from_numpy(masks)).get_bounding_boxes()
    boxes = _to_numpy(boxes.tensor if isinstance(boxes, Boxes) else boxes).astype(np.float64).reshape(-1, 4) * scale
    if masks is not None and scale > 1:
        masks = masks.repeat(scale, axis=1).repeat(scale, axis=2)
    height, width = out.shape[:2]
    scores = _to_numpy(scores).astype(np.float64) if scores is not None else None
    classes = _to_numpy(classes).astype(np.int64) if classes is not None else None

    keep = np.arange(n) if scores is None else np.nonzero(scores >= score_threshold)[0]
    if keep.size == 0:
        return out
    # Big instances first, so small ones and their outlines stay visible on top.
    areas = (boxes[keep, 2] - boxes[keep, 0]) * (boxes[keep, 3] - boxes[keep, 1])
    order = keep[np.argsort(-areas, kind="stable")]

    size = math.sqrt(height * width)
    thickness = max(1, int(round(size / 500)))
    font_scale = float(np.clip(size / 800, 0.33, 1.3))
    font_thickness = 1 if font_scale < 0.7 else 2
    colors = {i: class_color(int(classes[i]) if classes is not None else None) for i in order}

    if masks is not None:
        for i in order:
            m = masks[i]
            if not m.any():
                continue
            color = np.array(colors[i], dtype=np.float32)
            out[m] = (out[m].astype(np.float32) * (1 - mask_alpha) + color * mask_alpha).round().astype(np.uint8)
            contours, _ = cv2.findContours(m.astype(np.uint8), cv2.RETR_LIST, cv2.CHAIN_APPROX_NONE)
            cv2.drawContours(out, contours, -1, colors[i], thickness, lineType=cv2.LINE_AA)

    keypoints = _field(instances, "pred_keypoints", "gt_keypoints")
    if keypoints is not None:
        _draw_keypoints(
            out, keypoints, order, colors, keypoint_names, keypoint_skeleton, keypoint_threshold, thickness, scale
        )

    if draw_rectangles:
        for i in order:
            x1, y1, x2, y2 = boxes[i]
            # Box edges are pixel boundaries; the last covered pixel is x2 - 1.
            p1 = (int(round(x1)), int(round(y1)))
            p2 = (max(p1[0], int(round(x2)) - 1), max(p1[1], int(round(y2)) - 1))
            # LINE_8: anti-aliasing would smear a 1 px axis-aligned edge over 3 pixels.
            cv2.rectangle(out, p1, p2, colors[i], thickness, lineType=cv2.LINE_8)

    # Labels last, so no fill or outline covers them. The best-scoring instance picks its spot
    # first and is drawn last (on top); the others move off labels already placed.
    by_score = order if scores is None else order[np.argsort(-scores[order], kind="stable")]
    placed = []
    for i in by_score:
        text = _label(i, classes, scores, class_names)
        if text:
            placed.append((_place_label(out.shape[:2], text, boxes[i], font_scale, font_thickness, placed), text, i))
    for rect, text, i in reversed(placed):
        _draw_label(out, rect, text, colors[i], font_scale, font_thickness)
    return out


def _keypoint_color(name: Optional[str]) -> Tuple[int, int, int]:
    lowered = (name or "").lower()
    if "left" in lowered:
        return _LEFT_COLOR
    return _RIGHT_COLOR if "right" in lowered else _MIDDLE_COLOR


def _draw_keypoints(
    out, keypoints: Union[Keypoints, torch.Tensor], order, colors, names, skeleton, threshold, thickness, scale=1
):
    is_gt = isinstance(keypoints, Keypoints)
    points = _to_numpy(keypoints.tensor if is_gt else keypoints).astype(np.float64)
    if points.ndim == 3:
        points[..., :2] *= scale  # continuous coordinates: the enlarged picture's
    if points.ndim != 3 or points.shape[2] != 3:
        raise ValueError(f"draw_instances: keypoints must be [N, K, 3], got {points.shape}")
    num_keypoints = points.shape[1]
    if names is not None and len(names) != num_keypoints:
        raise ValueError(f"draw_instances: {len(names)} keypoint_names for {num_keypoints} keypoints")
    index = {n: k for k, n in enumerate(names or [])}
    lines = []
    for pair in skeleton or []:
        missing = [n for n in pair if n not in index]
        if missing:
            raise ValueError(f"draw_instances: keypoint_skeleton names {missing}, which are not in keypoint_names {names}")
        lines.append((index[pair[0]], index[pair[1]]))
    radius = max(2, thickness + 1)
    # Points are drawn (and lines end) at pixel centers: the continuous point (x, y) is pixel
    # (x - 0.5, y - 0.5); with 4 fractional bits the dots sit where the points are.
    shift = 4

    def fixed(p):
        return int(round((p[0] - 0.5) * 16)), int(round((p[1] - 0.5) * 16))

    for i in order:
        kp = points[i]
        if is_gt:
            shown = kp[:, 2] > 0
        else:
            shown = np.ones(num_keypoints, dtype=bool) if threshold is None else kp[:, 2] >= threshold
        for a, b in lines:
            if shown[a] and shown[b]:
                cv2.line(out, fixed(kp[a]), fixed(kp[b]), colors[i], max(1, thickness), cv2.LINE_AA, shift)
        for k in np.flatnonzero(shown):
            center = fixed(kp[k])
            cv2.circle(out, center, (radius + 1) * 16, (0, 0, 0), -1, cv2.LINE_AA, shift)  # a dark rim: readable on any colour
            cv2.circle(out, center, radius * 16, _keypoint_color(names[k] if names else None), -1, cv2.LINE_AA, shift)


def _label(i, classes, scores, class_names) -> str:
    parts = []
    if classes is not None:
        c = int(classes[i])
        parts.append(class_names[c] if class_names is not None and 0 <= c < len(class_names) else str(c))
    if scores is not None:
        parts.append(f"{scores[i]:.0%}")
    return " ".join(parts)


def _overlaps(a, b) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def _place_label(image_hw, text, box, font_scale, font_thickness, placed):
    """``(x1, y1, x2, y2)`` of the label background: above the box, else just inside its top,
    else below or inside its bottom; the first spot that is in the image and clear of the
    labels in ``placed`` wins (the first in-image spot when all collide)."""
    height, width = image_hw
    (tw, th), baseline = cv2.getTextSize(text, cv2.FONT_HERSHEY_SIMPLEX, font_scale, font_thickness)
    pad = max(1, int(round(th * 0.25)))
    w, h = tw + 2 * pad, th + baseline + pad
    x = int(np.clip(round(box[0]), 0, max(0, width - w)))
    y1, y2 = int(round(box[1])), int(round(box[3]))
    spots = [min(max(0, top), max(0, height - h)) for top in (y1 - h, y1, y2, y2 - h)]
    in_image = [top for top, raw in zip(spots, (y1 - h, y1, y2, y2 - h)) if top == raw] or spots
    for top in in_image:
        rect = (x, top, x + w, top + h)
        if not any(_overlaps(rect, other[0]) for other in placed):
            return rect
    return (x, in_image[0], x + w, in_image[0] + h)


def _draw_label(out, rect, text, color, font_scale, font_thickness) -> None:
    x1, y1, x2, y2 = rect
    font = cv2.FONT_HERSHEY_SIMPLEX
    (_, th), _ = cv2.getTextSize(text, font, font_scale, font_thickness)
    pad = max(1, int(round(th * 0.25)))
    cv2.rectangle(out, (x1, y1), (x2 - 1, y2 - 1), color, thickness=cv2.FILLED)
    cv2.putText(out, text, (x1 + pad, y1 + th + pad // 2), font, font_scale, _text_color(color),
                font_thickness, lineType=cv2.LINE_AA)
