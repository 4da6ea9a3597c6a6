"""Cropping, padding and large-scale jitter: the transforms that cut annotations.

``CropTransform`` moves points by the crop's offset (``apply_coords``, which keypoints use as
well) and then clips what has an extent: boxes to the crop rectangle, polygons to the crop
rectangle as polygons (not just their boxes), bitmaps by cropping the array. An instance whose
polygons all fall outside is left with none, and the mapper drops it (``filter_empty_instances``).

Augmentations:

* ``RandomCrop``: detectron2's crop types -- "relative" (a fixed fraction of the image),
  "relative_range" (a fraction drawn in ``[size, 1]``), "absolute" (pixels, capped at the image)
  and "absolute_range" (pixels drawn in ``[min, max]``, per side). The crop is drawn without
  looking at the instances, as detectron2 does: a crop may keep none, and the image then trains
  as background only.
* ``ResizeScale`` + ``FixedSizeCrop``: large-scale jitter (Ghiasi et al., 2021; detectron2's
  LSJ recipe). The image is resized to fit a random multiple of a fixed target size, then cropped
  (when larger) at a random offset and padded at the bottom / right (when smaller) to exactly
  that size.
"""
from typing import List, Sequence, Tuple, Union

import numpy as np

from detcore.config.choices import CROP_TYPES

from .base import Augmentation, NoOpTransform, ResizeTransform, Transform, TransformList

__all__ = [
    "clip_polygon",
    "CropTransform",
    "PadTransform",
    "RandomCrop",
    "ResizeScale",
    "FixedSizeCrop",
]

# Clipped pieces with less area than this (px^2) are degenerate leftovers: edges running along
# the crop border with nothing inside.
_MIN_PIECE_AREA = 1e-6


def _clip_half_plane(points: np.ndarray, axis: int, bound: float, keep_above: bool) -> np.ndarray:
    """One Sutherland-Hodgman step: the polygon ``points`` ([K, 2]) cut by the line
    ``coord[axis] = bound``, keeping the side ``>= bound`` (``keep_above``) or ``<= bound``."""
    if len(points) == 0:
        return points
    v = points[:, axis]
    inside = v >= bound if keep_above else v <= bound
    nxt = np.roll(points, -1, axis=0)
    nxt_inside = np.roll(inside, -1)
    crossing = inside != nxt_inside
    with np.errstate(divide="ignore", invalid="ignore"):  # edges along the line: not used, never 0 / 0 where used
        t = (bound - v) / (nxt[:, axis] - v)
        cut = points + t[:, None] * (nxt - points)
    cut[:, axis] = bound  # exactly on the line, whatever the rounding of t
    # Each edge S -> E emits: E if both are inside; the crossing if it leaves; the crossing and E
    # if it enters; nothing if both are outside. Two slots per edge keep the emission order.
    first = np.where(crossing[:, None], cut, nxt)
    slots = np.stack([first, nxt], axis=1)  # [K, 2, 2]
    valid = np.stack([crossing | (inside & nxt_inside), ~inside & nxt_inside], axis=1)
    return slots[valid]


def _area(points: np.ndarray) -> float:
    x, y = points[:, 0], points[:, 1]
    return 0.5 * abs(float(np.dot(x, np.roll(y, -1)) - np.dot(y, np.roll(x, -1))))


def clip_polygon(polygon: np.ndarray, width: float, height: float) -> List[np.ndarray]:
    """The flat polygon ``[x0, y0, x1, y1, ...]`` clipped to the rectangle ``[0, width] x
    [0, height]``: ``[]`` when nothing is left, else one flat polygon.

    Sutherland-Hodgman against the four sides. A concave polygon that the rectangle cuts into
    several parts comes out as one polygon whose parts are joined by edges running along the
    border (zero area); rasterizing it (a pixel is set when its center is inside, by the parity
    of edge crossings) still gives exactly the original polygon's pixels inside the rectangle:
    pixel centers never lie on the border lines, and a border edge is crossed twice or never.
    Self-intersecting polygons are clipped with the same guarantee.
    """
    points = np.asarray(polygon, dtype=np.float64).reshape(-1, 2)
    for axis, bound, keep_above in ((0, 0.0, True), (0, float(width), False), (1, 0.0, True), (1, float(height), False)):
        points = _clip_half_plane(points, axis, bound, keep_above)
    if len(points) < 3 or _area(points) < _MIN_PIECE_AREA:
        return []
    return [points.reshape(-1)]


class CropTransform(Transform):
    """Keep the ``w x h`` window whose top-left pixel is ``(x0, y0)`` of an ``orig_h x orig_w``
    image."""

    def __init__(self, x0: int, y0: int, w: int, h: int, orig_w: int, orig_h: int):
        x0, y0, w, h, orig_w, orig_h = (int(v) for v in (x0, y0, w, h, orig_w, orig_h))
        if w <= 0 or h <= 0 or x0 < 0 or y0 < 0 or x0 + w > orig_w or y0 + h > orig_h:
            raise ValueError(
                f"CropTransform: the window x0={x0}, y0={y0}, w={w}, h={h} must be non-empty and lie "
                f"inside the {orig_h}x{orig_w} (HxW) image"
            )
        self.x0, self.y0, self.w, self.h, self.orig_w, self.orig_h = x0, y0, w, h, orig_w, orig_h

    def apply_image(self, image):
        if image.shape[:2] != (self.orig_h, self.orig_w):
            raise ValueError(
                f"CropTransform: expected an image of size {(self.orig_h, self.orig_w)}, got {tuple(image.shape[:2])}"
            )
        return image[self.y0 : self.y0 + self.h, self.x0 : self.x0 + self.w]

    def apply_coords(self, coords):
        coords = np.array(coords, dtype=np.float64)
        coords -= (self.x0, self.y0)
        return coords

    def apply_box(self, boxes):
        boxes = super().apply_box(boxes)
        return np.clip(boxes, 0, [self.w, self.h, self.w, self.h])

    def apply_polygons(self, polygons):
        return [piece for p in super().apply_polygons(polygons) for piece in clip_polygon(p, self.w, self.h)]

    def inverse(self):
        return PadTransform(self.h, self.w, self.orig_h, self.orig_w, offset=(self.x0, self.y0))

    def __repr__(self):
        return f"CropTransform(x0={self.x0}, y0={self.y0}, w={self.w}, h={self.h} of {self.orig_h}x{self.orig_w})"


class PadTransform(Transform):
    """Place an ``h x w`` image at ``offset`` (x, y; default the top-left corner) of a
    ``new_h x new_w`` canvas filled with ``pad_value`` (a number or one per channel); bitmaps
    are padded with 0."""

    def __init__(self, h: int, w: int, new_h: int, new_w: int, pad_value: Union[float, Sequence[float]] = 0.0,
                 offset: Tuple[int, int] = (0, 0)):
        h, w, new_h, new_w = int(h), int(w), int(new_h), int(new_w)
        x0, y0 = int(offset[0]), int(offset[1])
        if h <= 0 or w <= 0 or x0 < 0 or y0 < 0 or x0 + w > new_w or y0 + h > new_h:
            raise ValueError(
                f"PadTransform: a {h}x{w} image at offset (x={x0}, y={y0}) must fit in the {new_h}x{new_w} output"
            )
        self.h, self.w, self.new_h, self.new_w, self.x0, self.y0 = h, w, new_h, new_w, x0, y0
        self.pad_value = pad_value

    def _pad(self, image, value):
        if image.shape[:2] != (self.h, self.w):
            raise ValueError(f"PadTransform: expected an image of size {(self.h, self.w)}, got {tuple(image.shape[:2])}")
        out = np.empty((self.new_h, self.new_w, *image.shape[2:]), dtype=image.dtype)
        out[...] = np.asarray(value, dtype=np.float64).round().astype(image.dtype) if image.dtype == np.uint8 else value
        out[self.y0 : self.y0 + self.h, self.x0 : self.x0 + self.w] = image
        return out

    def apply_image(self, image):
        return self._pad(image, self.pad_value)

    def apply_segmentation(self, mask):
        return self._pad(mask, 0)

    def apply_coords(self, coords):
        coords = np.array(coords, dtype=np.float64)
        coords += (self.x0, self.y0)
        return coords

    def inverse(self):
        return CropTransform(self.x0, self.y0, self.w, self.h, self.new_w, self.new_h)

    def __repr__(self):
        return f"PadTransform({self.h}x{self.w} -> {self.new_h}x{self.new_w} at x={self.x0}, y={self.y0})"


class RandomCrop(Augmentation):
    """A random window of a size set by ``crop_type`` (see the module docstring) and
    ``crop_size`` = (height, width) [fractions for the relative types, pixels for the absolute
    ones; (min, max) pixels for "absolute_range"], at a uniformly drawn position."""

    def __init__(self, crop_type: str, crop_size: Sequence[float]):
        if crop_type not in CROP_TYPES:
            raise ValueError(f"RandomCrop: crop_type must be one of {list(CROP_TYPES)}, got {crop_type!r}")
        size = tuple(float(v) for v in crop_size)
        if len(size) != 2:
            raise ValueError(f"RandomCrop: crop_size must be 2 numbers, got {crop_size!r}")
        if crop_type.startswith("relative") and not all(0.0 < v <= 1.0 for v in size):
            raise ValueError(f"RandomCrop: crop_size of a {crop_type!r} crop must be fractions in (0, 1], got {crop_size!r}")
        if crop_type.startswith("absolute"):
            if not all(v >= 1 and v == int(v) for v in size):
                raise ValueError(f"RandomCrop: crop_size of a {crop_type!r} crop must be whole pixels >= 1, got {crop_size!r}")
            if crop_type == "absolute_range" and size[0] > size[1]:
                raise ValueError(f"RandomCrop: crop_size of an 'absolute_range' crop is (min, max), got {crop_size!r}")
        self.crop_type, self.crop_size = crop_type, size

    def get_crop_size(self, h: int, w: int) -> Tuple[int, int]:
        """(crop height, crop width) for an ``h x w`` image; draws from np.random for the range types."""
        ch, cw = self.crop_size
        if self.crop_type == "relative":
            return max(int(h * ch + 0.5), 1), max(int(w * cw + 0.5), 1)
        if self.crop_type == "relative_range":
            fh, fw = np.asarray(self.crop_size) + np.random.rand(2) * (1.0 - np.asarray(self.crop_size))
            return max(int(h * fh + 0.5), 1), max(int(w * fw + 0.5), 1)
        if self.crop_type == "absolute":
            return min(int(ch), h), min(int(cw), w)
        lo, hi = int(ch), int(cw)  # absolute_range: (min, max) for each side
        return int(np.random.randint(min(h, lo), min(h, hi) + 1)), int(np.random.randint(min(w, lo), min(w, hi) + 1))

    def get_transform(self, image):
        h, w = image.shape[:2]
        ch, cw = self.get_crop_size(h, w)
        y0 = int(np.random.randint(h - ch + 1))
        x0 = int(np.random.randint(w - cw + 1))
        return CropTransform(x0, y0, cw, ch, w, h)

    def __repr__(self):
        return f"RandomCrop(crop_type='{self.crop_type}', crop_size={self.crop_size})"


class ResizeScale(Augmentation):
    """Resize so the image fits (aspect kept) in ``scale * (target_height, target_width)``, with
    ``scale`` drawn uniformly in ``[min_scale, max_scale]``: the first half of large-scale jitter."""

    def __init__(self, min_scale: float, max_scale: float, target_height: int, target_width: int):
        if not 0 < min_scale <= max_scale:
            raise ValueError(f"ResizeScale: need 0 < min_scale <= max_scale, got {min_scale}, {max_scale}")
        if int(target_height) <= 0 or int(target_width) <= 0:
            raise ValueError(f"ResizeScale: the target size must be positive, got {(target_height, target_width)}")
        self.min_scale, self.max_scale = float(min_scale), float(max_scale)
        self.target_height, self.target_width = int(target_height), int(target_width)

    def get_transform(self, image):
        h, w = image.shape[:2]
        scale = np.random.uniform(self.min_scale, self.max_scale)
        factor = min(scale * self.target_height / h, scale * self.target_width / w)
        new_h, new_w = max(int(round(h * factor)), 1), max(int(round(w * factor)), 1)
        return ResizeTransform(h, w, new_h, new_w)

    def __repr__(self):
        return (
            f"ResizeScale(scale=[{self.min_scale}, {self.max_scale}] of "
            f"{self.target_height}x{self.target_width})"
        )


class FixedSizeCrop(Augmentation):
    """Crop at a random offset to at most ``crop_size`` = (height, width), then pad at the bottom
    and right with ``pad_value`` to exactly that size: the second half of large-scale jitter."""

    def __init__(self, crop_size: Sequence[int], pad_value: Union[float, Sequence[float]] = 0.0):
        size = tuple(int(v) for v in crop_size)
        if len(size) != 2 or min(size) <= 0:
            raise ValueError(f"FixedSizeCrop: crop_size must be (height, width) > 0, got {crop_size!r}")
        self.crop_size, self.pad_value = size, pad_value

    def get_transform(self, image):
        h, w = image.shape[:2]
        out_h, out_w = self.crop_size
        ch, cw = min(h, out_h), min(w, out_w)
        # Offsets drawn per axis (detectron2 draws one fraction for both).
        y0 = int(round((h - ch) * np.random.uniform(0.0, 1.0)))
        x0 = int(round((w - cw) * np.random.uniform(0.0, 1.0)))
        crop = CropTransform(x0, y0, cw, ch, w, h) if (ch, cw) != (h, w) else NoOpTransform()
        pad = PadTransform(ch, cw, out_h, out_w, self.pad_value) if (ch, cw) != (out_h, out_w) else NoOpTransform()
        return TransformList([crop, pad])

    def __repr__(self):
        return f"FixedSizeCrop(crop_size={self.crop_size}, pad_value={self.pad_value})"
