"""The transform framework, and the resize and flip transforms with the augmentations that draw them.

Two layers, as in detectron2: an *augmentation* (``ResizeShortestEdge``, ``RandomFlip``) looks
at an image and draws a deterministic *transform* (``ResizeTransform``, ``HFlipTransform``...),
which is then applied identically to the image, boxes, polygons and bitmaps -- so they cannot
drift apart. Coordinates are continuous with pixel ``j`` covering ``[j, j + 1)``: resizing
scales them, a horizontal flip maps ``x -> width - x``.

One rule per kind of data: every point-like annotation (box corners, polygon vertices, and
keypoints) moves through ``apply_coords``; every per-pixel one (bitmaps) through
``apply_segmentation``. A transform that also cuts (a crop) clips after ``apply_coords`` in its
``apply_box`` / ``apply_polygons``; ``TransformList`` chains those methods transform by
transform, so the cut happens in the frame where it belongs.

Randomness comes from ``np.random`` (seeded per data-loader worker by ``build.py``).
"""
from typing import List, Sequence, Tuple

import cv2
import numpy as np
from detcore.config.choices import RESIZE_SAMPLING_STYLES

__all__ = [
    "Transform",
    "NoOpTransform",
    "ResizeTransform",
    "HFlipTransform",
    "VFlipTransform",
    "TransformList",
    "Augmentation",
    "ResizeShortestEdge",
    "RandomFlip",
    "apply_augmentations",
]


# --- transforms -----------------------------------------------------------------------------------
class Transform:
    """A deterministic geometric transform. Subclasses define ``apply_image`` and ``apply_coords``;
    boxes, polygons and bitmaps follow from them."""

    def apply_image(self, image: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def apply_coords(self, coords: np.ndarray) -> np.ndarray:
        """``[N, 2]`` float (x, y) points -> transformed points."""
        raise NotImplementedError

    def apply_segmentation(self, mask: np.ndarray) -> np.ndarray:
        """``[H, W]`` bool/uint8 mask; subclasses that interpolate must not blend labels."""
        return self.apply_image(mask)

    def apply_box(self, boxes: np.ndarray) -> np.ndarray:
        """``[N, 4]`` xyxy boxes: the box around the 4 transformed corners of each."""
        boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
        corners = boxes[:, [0, 1, 2, 1, 0, 3, 2, 3]].reshape(-1, 2)
        corners = self.apply_coords(corners).reshape(-1, 4, 2)
        return np.concatenate([corners.min(axis=1), corners.max(axis=1)], axis=1)

    def apply_polygons(self, polygons: Sequence[np.ndarray]) -> List[np.ndarray]:
        """Flat ``[x0, y0, x1, y1, ...]`` polygons -> transformed flat polygons (a transform that
        cuts may return fewer: the parts left)."""
        return [self.apply_coords(np.asarray(p, dtype=np.float64).reshape(-1, 2)).reshape(-1) for p in polygons]

    def inverse(self) -> "Transform":
        """The transform that maps this one's output frame back to its input frame (used by
        test-time augmentation to bring detections back to the original image)."""
        raise NotImplementedError(f"{type(self).__name__} has no inverse")


class NoOpTransform(Transform):
    def apply_image(self, image):
        return image

    def apply_coords(self, coords):
        return np.asarray(coords, dtype=np.float64)

    def inverse(self):
        return self

    def __repr__(self):
        return "NoOpTransform()"


class ResizeTransform(Transform):
    """Resize an ``h x w`` image to ``new_h x new_w`` (bilinear for images, nearest for masks)."""

    def __init__(self, h: int, w: int, new_h: int, new_w: int):
        for name, v in (("h", h), ("w", w), ("new_h", new_h), ("new_w", new_w)):
            if int(v) <= 0:
                raise ValueError(f"ResizeTransform: {name} must be a positive size, got {v}")
        self.h, self.w, self.new_h, self.new_w = int(h), int(w), int(new_h), int(new_w)

    def _check(self, image: np.ndarray) -> None:
        if image.shape[:2] != (self.h, self.w):
            raise ValueError(
                f"ResizeTransform: expected an image of size {(self.h, self.w)}, got {tuple(image.shape[:2])}"
            )

    def apply_image(self, image, interp=cv2.INTER_LINEAR):
        self._check(image)
        if (self.h, self.w) == (self.new_h, self.new_w):
            return image
        out = cv2.resize(image, (self.new_w, self.new_h), interpolation=interp)
        # cv2 drops a trailing channel axis of size 1; keep the input's rank.
        return out.reshape(self.new_h, self.new_w, *image.shape[2:])

    def apply_segmentation(self, mask):
        dtype = mask.dtype
        # NEAREST_EXACT samples at pixel centers (plain NEAREST is shifted by half a pixel).
        out = self.apply_image(mask.astype(np.uint8), interp=cv2.INTER_NEAREST_EXACT)
        return out.astype(dtype)

    def apply_coords(self, coords):
        coords = np.array(coords, dtype=np.float64)
        coords[:, 0] *= self.new_w / self.w
        coords[:, 1] *= self.new_h / self.h
        return coords

    def inverse(self):
        return ResizeTransform(self.new_h, self.new_w, self.h, self.w)

    def __repr__(self):
        return f"ResizeTransform({self.h}x{self.w} -> {self.new_h}x{self.new_w})"


class HFlipTransform(Transform):
    def __init__(self, width: int):
        self.width = int(width)

    def apply_image(self, image):
        return np.ascontiguousarray(image[:, ::-1])

    def apply_coords(self, coords):
        coords = np.array(coords, dtype=np.float64)
        coords[:, 0] = self.width - coords[:, 0]
        return coords

    def inverse(self):
        return self

    def __repr__(self):
        return f"HFlipTransform(width={self.width})"


class VFlipTransform(Transform):
    def __init__(self, height: int):
        self.height = int(height)

    def apply_image(self, image):
        return np.ascontiguousarray(image[::-1])

    def apply_coords(self, coords):
        coords = np.array(coords, dtype=np.float64)
        coords[:, 1] = self.height - coords[:, 1]
        return coords

    def inverse(self):
        return self

    def __repr__(self):
        return f"VFlipTransform(height={self.height})"


class TransformList(Transform):
    """Transforms applied in order. Boxes and polygons go through each transform's own
    ``apply_box`` / ``apply_polygons`` in turn, so a crop clips them in its own frame."""

    def __init__(self, transforms: Sequence[Transform]):
        self.transforms = [t for t in transforms if not isinstance(t, NoOpTransform)]

    def apply_image(self, image):
        for t in self.transforms:
            image = t.apply_image(image)
        return image

    def apply_segmentation(self, mask):
        for t in self.transforms:
            mask = t.apply_segmentation(mask)
        return mask

    def apply_coords(self, coords):
        coords = np.asarray(coords, dtype=np.float64)
        for t in self.transforms:
            coords = t.apply_coords(coords)
        return coords

    def apply_box(self, boxes):
        boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
        for t in self.transforms:
            boxes = t.apply_box(boxes)
        return boxes

    def apply_polygons(self, polygons):
        polygons = [np.asarray(p, dtype=np.float64).reshape(-1) for p in polygons]
        for t in self.transforms:
            polygons = t.apply_polygons(polygons)
        return polygons

    def inverse(self):
        return TransformList([t.inverse() for t in reversed(self.transforms)])

    def __len__(self):
        return len(self.transforms)

    def __repr__(self):
        return f"TransformList({', '.join(map(repr, self.transforms))})"


# --- augmentations ----------------------------------------------------------------------------------
class Augmentation:
    """Draws a ``Transform`` for a given image (``get_transform``)."""

    def get_transform(self, image: np.ndarray) -> Transform:
        raise NotImplementedError


class ResizeShortestEdge(Augmentation):
    """Scale the image so its short side is ``short_edge_length`` (one drawn per image: a choice
    among the values, or a uniform integer in ``[lo, hi]`` with ``sample_style="range"``) unless
    the long side would exceed ``max_size``, in which case the long side becomes ``max_size``.
    A length of 0 leaves the image as it is."""

    def __init__(self, short_edge_length, max_size: int = 10**9, sample_style: str = "choice"):
        if isinstance(short_edge_length, (int, np.integer)):
            short_edge_length = (int(short_edge_length),)
        self.lengths = tuple(int(v) for v in short_edge_length)
        if sample_style not in RESIZE_SAMPLING_STYLES:
            raise ValueError(
                f"ResizeShortestEdge: sample_style must be one of {list(RESIZE_SAMPLING_STYLES)}, got {sample_style!r}"
            )
        if not self.lengths or any(v < 0 for v in self.lengths):
            raise ValueError(f"ResizeShortestEdge: short_edge_length must be sizes >= 0, got {short_edge_length!r}")
        if sample_style == "range" and len(self.lengths) != 2:
            raise ValueError(
                f"ResizeShortestEdge: sample_style 'range' needs short_edge_length = (min, max), got {self.lengths}"
            )
        if max_size <= 0:
            raise ValueError(f"ResizeShortestEdge: max_size must be positive, got {max_size}")
        self.max_size = int(max_size)
        self.sample_style = sample_style

    @staticmethod
    def get_output_shape(h: int, w: int, short_edge: int, max_size: int) -> Tuple[int, int]:
        scale = short_edge / min(h, w)
        if max(h, w) * scale > max_size:
            scale = max_size / max(h, w)
        return max(int(h * scale + 0.5), 1), max(int(w * scale + 0.5), 1)

    @staticmethod
    def test_transform(h: int, w: int, short_edge: int, max_size: int) -> "Transform":
        """The resize of the evaluation loader for one test size (none for a size <= 0), without
        drawing from np.random: for single images outside a loader (Predictor, export)."""
        if short_edge <= 0:
            return NoOpTransform()
        return ResizeTransform(h, w, *ResizeShortestEdge.get_output_shape(h, w, short_edge, max_size))

    def get_transform(self, image):
        h, w = image.shape[:2]
        if self.sample_style == "range":
            size = int(np.random.randint(self.lengths[0], self.lengths[1] + 1))
        else:
            size = self.lengths[np.random.randint(len(self.lengths))]
        if size == 0:
            return NoOpTransform()
        new_h, new_w = self.get_output_shape(h, w, size, self.max_size)
        return ResizeTransform(h, w, new_h, new_w)

    def __repr__(self):
        return (
            f"ResizeShortestEdge(lengths={self.lengths}, max_size={self.max_size}, "
            f"sample_style='{self.sample_style}')"
        )


class RandomFlip(Augmentation):
    """Flip horizontally (or vertically) with probability ``prob``."""

    def __init__(self, prob: float = 0.5, horizontal: bool = True, vertical: bool = False):
        if horizontal == vertical:
            raise ValueError("RandomFlip: exactly one of horizontal / vertical must be True")
        if not 0.0 <= prob <= 1.0:
            raise ValueError(f"RandomFlip: prob must be in [0, 1], got {prob}")
        self.prob, self.horizontal = float(prob), horizontal

    def get_transform(self, image):
        h, w = image.shape[:2]
        if np.random.rand() >= self.prob:
            return NoOpTransform()
        return HFlipTransform(w) if self.horizontal else VFlipTransform(h)

    def __repr__(self):
        return f"RandomFlip(prob={self.prob}, {'horizontal' if self.horizontal else 'vertical'})"


def apply_augmentations(augmentations: Sequence[Augmentation], image: np.ndarray):
    """Draw each augmentation's transform on the image produced by the previous ones.
    Returns ``(new_image, TransformList)``."""
    transforms = []
    for aug in augmentations:
        t = aug.get_transform(image)
        image = t.apply_image(image)
        transforms.append(t)
    return image, TransformList(transforms)
