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
import torch
import torch.nn.functional as F
from PIL import Image

from detcore.config.choices import RESIZE_MODES, RESIZE_SAMPLING_STYLES

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
    "mirrors",
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
    """Resize an ``h x w`` image to ``new_h x new_w``, the way ``mode`` (one of RESIZE_MODES) says:

    * "opencv": cv2 bilinear of the image in its dtype (uint8 stays uint8); masks by nearest
      neighbour at pixel centers.
    * "torchvision": torchvision's GeneralizedRCNNTransform, bilinear ``interpolate``
      (align_corners=False, no antialiasing) of the image as float32, which stays float32 (no
      rounding back to 0-255 steps); masks by ``interpolate``'s nearest (``floor(dst * scale)``).
    * "maskrcnn_benchmark": PIL's bilinear of the uint8 image (antialiased when shrinking), as
      its data loader resizes PIL images; masks by bilinear interpolation truncated back to 0 / 1,
      as its BinaryMaskList does.
    """

    def __init__(self, h: int, w: int, new_h: int, new_w: int, mode: str = "opencv"):
        for name, v in (("h", h), ("w", w), ("new_h", new_h), ("new_w", new_w)):
            if int(v) <= 0:
                raise ValueError(f"ResizeTransform: {name} must be a positive size, got {v}")
        if mode not in RESIZE_MODES:
            raise ValueError(f"ResizeTransform: mode must be one of {list(RESIZE_MODES)}, got {mode!r}")
        self.h, self.w, self.new_h, self.new_w = int(h), int(w), int(new_h), int(new_w)
        self.mode = mode

    def _check(self, image: np.ndarray) -> None:
        if image.shape[:2] != (self.h, self.w):
            raise ValueError(
                f"ResizeTransform: expected an image of size {(self.h, self.w)}, got {tuple(image.shape[:2])}"
            )

    def apply_image(self, image, interp=cv2.INTER_LINEAR):
        self._check(image)
        if self.mode == "torchvision":  # float32 whatever the size, as torchvision's
            return _interpolate(image, (self.new_h, self.new_w), "bilinear").numpy()
        if (self.h, self.w) == (self.new_h, self.new_w):
            return image
        if self.mode == "maskrcnn_benchmark":
            return _pil_resize(image, (self.new_h, self.new_w), Image.BILINEAR)
        out = cv2.resize(image, (self.new_w, self.new_h), interpolation=interp)
        # cv2 drops a trailing channel axis of size 1; keep the input's rank.
        return out.reshape(self.new_h, self.new_w, *image.shape[2:])

    def apply_segmentation(self, mask):
        dtype = mask.dtype
        self._check(mask)
        if (self.h, self.w) == (self.new_h, self.new_w):
            return mask
        if self.mode == "torchvision":
            out = _interpolate(mask.astype(np.float32), (self.new_h, self.new_w), "nearest").numpy()
        elif self.mode == "maskrcnn_benchmark":
            out = np.trunc(_interpolate(mask.astype(np.float32), (self.new_h, self.new_w), "bilinear").numpy())
        else:
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
        mode = "" if self.mode == "opencv" else f", mode='{self.mode}'"
        return f"ResizeTransform({self.h}x{self.w} -> {self.new_h}x{self.new_w}{mode})"


def _interpolate(array: np.ndarray, size: Tuple[int, int], mode: str) -> torch.Tensor:
    """``F.interpolate`` of an ``[H, W]`` or ``[H, W, C]`` array as contiguous float32 NCHW (the
    layout torchvision resizes in); returns float32 ``[h, w]`` / ``[h, w, C]``."""
    t = torch.from_numpy(np.ascontiguousarray(array)).to(torch.float32)
    chw = t[None] if t.dim() == 2 else t.permute(2, 0, 1)
    kwargs = {"align_corners": False} if mode == "bilinear" else {}
    out = F.interpolate(chw[None].contiguous(), size=size, mode=mode, **kwargs)[0]
    return out[0] if t.dim() == 2 else out.permute(1, 2, 0).contiguous()


def _pil_resize(image: np.ndarray, size: Tuple[int, int], resample) -> np.ndarray:
    """PIL's resize of a uint8 ``[H, W]`` or ``[H, W, 3]`` array to ``size = (h, w)``."""
    if image.dtype != np.uint8 or image.ndim not in (2, 3) or (image.ndim == 3 and image.shape[2] != 3):
        raise ValueError(
            "ResizeTransform: mode 'maskrcnn_benchmark' resizes uint8 [H, W] or [H, W, 3] images with PIL, "
            f"got {image.dtype} {image.shape}"
        )
    return np.asarray(Image.fromarray(image).resize((size[1], size[0]), resample))


class HFlipTransform(Transform):
    def __init__(self, width: int):
        self.width = int(width)

    def apply_image(self, image):
        # A copy, not np.ascontiguousarray: a 1-pixel-wide image's reversed view counts as
        # contiguous to numpy, keeps its negative stride, and torch.from_numpy refuses it.
        return image[:, ::-1].copy()

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
        return image[::-1].copy()  # a copy: see HFlipTransform.apply_image

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
    A length of 0 leaves the image as it is. ``mode`` (INPUT.RESIZE_MODE) picks the size rounding
    and the interpolation (see `ResizeTransform` and `get_output_shape`)."""

    def __init__(self, short_edge_length, max_size: int = 10**9, sample_style: str = "choice", mode: str = "opencv"):
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
        if mode not in RESIZE_MODES:
            raise ValueError(f"ResizeShortestEdge: mode must be one of {list(RESIZE_MODES)}, got {mode!r}")
        self.max_size = int(max_size)
        self.sample_style = sample_style
        self.mode = mode

    @staticmethod
    def get_output_shape(h: int, w: int, short_edge: int, max_size: int, mode: str = "opencv") -> Tuple[int, int]:
        """``(new_h, new_w)``. "opencv" rounds ``side * scale``; "torchvision" truncates it (its
        ``interpolate(scale_factor=..., recompute_scale_factor=True)``); "maskrcnn_benchmark" caps
        the short side at ``round(max_size * short / long)`` and truncates the long side's
        ``short_edge * long / short``."""
        if mode == "maskrcnn_benchmark":
            short, long = min(h, w), max(h, w)
            if long / short * short_edge > max_size:
                short_edge = int(round(max_size * short / long))
            if short == short_edge:
                return h, w
            if h < w:
                return short_edge, int(short_edge * w / h)
            return int(short_edge * h / w), short_edge
        if mode == "torchvision":
            scale = min(short_edge / min(h, w), max_size / max(h, w))
            return max(int(h * scale), 1), max(int(w * scale), 1)
        scale = short_edge / min(h, w)
        if max(h, w) * scale > max_size:
            scale = max_size / max(h, w)
        return max(int(h * scale + 0.5), 1), max(int(w * scale + 0.5), 1)

    @staticmethod
    def test_transform(h: int, w: int, short_edge: int, max_size: int, mode: str = "opencv") -> "Transform":
        """The resize of the evaluation loader for one test size (none for a size <= 0), without
        drawing from np.random: for single images outside a loader (Predictor, export)."""
        if short_edge <= 0:
            return NoOpTransform()
        shape = ResizeShortestEdge.get_output_shape(h, w, short_edge, max_size, mode)
        return ResizeTransform(h, w, *shape, mode=mode)

    def get_transform(self, image):
        h, w = image.shape[:2]
        if self.sample_style == "range":
            size = int(np.random.randint(self.lengths[0], self.lengths[1] + 1))
        else:
            size = self.lengths[np.random.randint(len(self.lengths))]
        if size == 0:
            return NoOpTransform()
        return self.test_transform(h, w, size, self.max_size, self.mode)

    def __repr__(self):
        mode = "" if self.mode == "opencv" else f", mode='{self.mode}'"
        return (
            f"ResizeShortestEdge(lengths={self.lengths}, max_size={self.max_size}, "
            f"sample_style='{self.sample_style}'{mode})"
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


def mirrors(transform: Transform) -> bool:
    """Whether ``transform`` turns the image into its mirror image (an odd number of flips, in any
    direction): what was an object's left side is then drawn as a right side, so named
    left/right points must swap names (detection_utils.transform_keypoint_annotations).

    Read from the transform's own point map (the orientation of a small triangle through
    ``apply_coords``), so every geometric transform, present or future, answers for itself."""
    probe = transform.apply_coords(np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]]))
    (x0, y0), (x1, y1), (x2, y2) = probe
    return bool((x1 - x0) * (y2 - y0) - (y1 - y0) * (x2 - x0) < 0)
