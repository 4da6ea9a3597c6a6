"""``shapes``: a synthetic instance-segmentation dataset, generated on first use.

Circles, squares and triangles of several colours and sizes, overlapping one another, on
textured backgrounds (smooth noise, gradients, stripes). It exists so that the whole pipeline
(data -> Mask R-CNN -> COCO evaluation) can be trained and checked on a CPU in minutes.

How an image is made: shapes are drawn one after the other into an *instance-id map* (later
ones on top). Each instance's mask is then exactly its visible pixels, so occlusion is right by
construction; its box is the box of those pixels, its segmentation the polygons tracing them.
Instances left with a tiny visible area, parts thinner than 2 pixels and specks of a few pixels
are erased (repainted as background), and a shape whose placement would punch a hole into an
earlier one is placed elsewhere, because COCO polygons cannot describe holes. Finally the
colours are painted from the id map, so image and masks agree pixel for pixel.

Everything is written as a real COCO json + PNG files into a cache folder
(``$DETCORE_CACHE`` or ``~/.cache/detcore``, then ``shapes-v1-<split>-...``; see generated.py)
and then read by the ordinary COCO loader. Every image has its own random generator seeded by
(seed, split, index), so a generation is byte-identical to any other with the same parameters.
"""
import zlib
from dataclasses import asdict, dataclass
from typing import List, Optional, Tuple

import cv2
import numpy as np

from ..detection_utils import mask_to_polygons
from .generated import ensure_generated, get_cache_dir, write_coco_split

__all__ = [
    "PALETTE", "SHAPES_CLASSES", "ShapesSpec", "ensure_shapes_dataset", "generate_shapes_split", "get_cache_dir",
    "textured_background",
]

# Version of the generator: bump it whenever the output changes, so old caches are not reused.
_VERSION = "v1"
SHAPES_CLASSES = ("circle", "square", "triangle")
_MIN_VISIBLE_AREA = 20  # pixels; an instance showing less is erased rather than annotated
_MIN_PART_AREA = 8  # pixels; smaller disconnected specks of an occluded shape are erased too
_PLACEMENT_TRIES = 8
_SHIFT = 4  # cv2 drawing with 4 fractional bits: sub-pixel shape positions

# BGR colours the shapes pick from (red, green, blue, yellow, cyan, magenta, orange, white, black, purple).
PALETTE = np.array(
    [
        [40, 40, 210], [50, 170, 40], [200, 70, 30], [40, 210, 220], [210, 200, 40],
        [190, 50, 190], [30, 130, 245], [235, 235, 235], [25, 25, 25], [140, 40, 100],
    ],
    dtype=np.float32,
)


@dataclass(frozen=True)
class ShapesSpec:
    """Parameters of one split; the cache folder name is derived from all of them."""

    split: str = "train"
    num_images: int = 800
    seed: int = 0
    min_size: int = 96  # image height and width are drawn independently in [min_size, max_size]
    max_size: int = 160
    max_shapes: int = 6  # shapes per image: 1..max_shapes (before erasing invisible ones)

    def __post_init__(self):
        if not self.split or not all(c.isalnum() or c in "_-" for c in self.split):
            raise ValueError(f"ShapesSpec: split must be a non-empty [A-Za-z0-9_-] name, got {self.split!r}")
        if self.num_images < 1:
            raise ValueError(f"ShapesSpec: num_images must be >= 1, got {self.num_images}")
        if not 32 <= self.min_size <= self.max_size:
            raise ValueError(
                f"ShapesSpec: need 32 <= min_size <= max_size, got min_size={self.min_size}, max_size={self.max_size}"
            )
        if self.max_shapes < 1:
            raise ValueError(f"ShapesSpec: max_shapes must be >= 1, got {self.max_shapes}")

    @property
    def dirname(self) -> str:
        return (
            f"shapes-{_VERSION}-{self.split}-n{self.num_images}-seed{self.seed}"
            f"-size{self.min_size}-{self.max_size}-k{self.max_shapes}"
        )


# --- drawing --------------------------------------------------------------------------------------
def textured_background(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    """``[h, w, 3]`` float32 BGR texture: smooth noise, a linear gradient, or stripes."""
    c1, c2 = rng.uniform(20, 235, size=(2, 3)).astype(np.float32)
    kind = rng.integers(3)
    ys, xs = np.mgrid[0:h, 0:w].astype(np.float32)
    if kind == 0:
        noise = rng.standard_normal(size=(h, w), dtype=np.float32)
        sigma = float(rng.uniform(1.5, 6.0))
        noise = cv2.GaussianBlur(noise, (0, 0), sigma)
        t = noise / (np.abs(noise).max() + 1e-6) * 0.5 + 0.5
    else:
        angle = rng.uniform(0, np.pi)
        proj = xs * np.cos(angle) + ys * np.sin(angle)
        if kind == 1:
            t = (proj - proj.min()) / (proj.max() - proj.min() + 1e-6)
        else:
            period = rng.uniform(6, 20)
            t = (np.sin(2 * np.pi * proj / period) > 0).astype(np.float32)
    return c1 + (c2 - c1) * t[..., None]


def _shape_mask(rng: np.random.Generator, cls: int, h: int, w: int) -> np.ndarray:
    """``[h, w]`` uint8 filled mask of one randomly placed, sized and rotated shape."""
    size = rng.uniform(0.08, 0.28) * min(h, w)  # "radius"
    cx, cy = rng.uniform(0.05, 0.95) * w, rng.uniform(0.05, 0.95) * h
    scale = 1 << _SHIFT
    mask = np.zeros((h, w), dtype=np.uint8)
    if cls == 0:  # circle
        center = (int(round(cx * scale)), int(round(cy * scale)))
        cv2.circle(mask, center, int(round(size * scale)), 1, -1, cv2.LINE_8, _SHIFT)
        return mask
    n, radius = (4, size * 1.15) if cls == 1 else (3, size * 1.3)  # similar areas for all classes
    angles = rng.uniform(0, 2 * np.pi) + np.arange(n) * (2 * np.pi / n)
    pts = np.stack([cx + radius * np.cos(angles), cy + radius * np.sin(angles)], axis=1)
    cv2.fillPoly(mask, [np.round(pts * scale).astype(np.int32)], 1, cv2.LINE_8, _SHIFT)
    return mask


def _has_hole(mask: np.ndarray) -> bool:
    _, hierarchy = cv2.findContours(mask.astype(np.uint8), cv2.RETR_CCOMP, cv2.CHAIN_APPROX_SIMPLE)
    # RETR_CCOMP: contours with a parent are the borders of holes.
    return hierarchy is not None and bool((hierarchy[0][:, 3] >= 0).any())


def _fill_holes(window: np.ndarray, k: int) -> None:
    """Give instance ``k`` the background pixels it encloses (in place)."""
    contours, _ = cv2.findContours((window == k).astype(np.uint8), cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_NONE)
    filled = np.zeros(window.shape, dtype=np.uint8)
    cv2.drawContours(filled, contours, -1, 1, thickness=cv2.FILLED)
    window[(filled > 0) & (window == 0)] = k


def _open_2x2(mask: np.ndarray) -> np.ndarray:
    """Pixels of ``mask`` that belong to some fully set 2x2 block (a morphological opening;
    cv2's would shift by a pixel, as a 2x2 kernel has no center)."""
    blocks = mask[:-1, :-1] & mask[1:, :-1] & mask[:-1, 1:] & mask[1:, 1:]  # block with top-left (i, j)
    out = np.zeros_like(mask)
    for dy in (0, 1):
        for dx in (0, 1):
            out[dy : dy + blocks.shape[0], dx : dx + blocks.shape[1]] |= blocks
    return out


def _place_shapes(rng: np.random.Generator, h: int, w: int, max_shapes: int) -> Tuple[np.ndarray, List[int]]:
    """Instance-id map (0 = background, k = k-th kept shape) and the class of each shape."""
    ids = np.zeros((h, w), dtype=np.int32)
    classes: List[int] = []
    for _ in range(int(rng.integers(1, max_shapes + 1))):
        cls = int(rng.integers(len(SHAPES_CLASSES)))
        new_id = len(classes) + 1
        for _try in range(_PLACEMENT_TRIES):
            mask = _shape_mask(rng, cls, h, w).astype(bool)
            if not mask.any():
                continue
            trial = np.where(mask, new_id, ids)
            covered = np.unique(ids[mask])
            if not any(_has_hole(trial == j) for j in covered if j > 0):
                ids = trial
                classes.append(cls)
                break
    # Erase the parts of each instance thinner than 2 pixels (one-pixel slivers along an
    # occluder's edge, the last pixel of a sharp tip) and specks of a few pixels peeking between
    # occluders: they vanish or alias in any resize, leaving a box that no longer matches the
    # mask, and teach nothing. Erased pixels become background.
    for k in range(1, len(classes) + 1):
        rows, cols = np.nonzero(ids == k)
        if len(rows) == 0:
            continue
        # Work on the instance's box only (views into ids): much smaller than the image.
        window = ids[rows.min() : rows.max() + 1, cols.min() : cols.max() + 1]
        mask = window == k
        opened = _open_2x2(mask)
        window[mask & ~opened] = 0
        _, parts, stats, _ = cv2.connectedComponentsWithStats(opened.astype(np.uint8), connectivity=8)
        small = np.flatnonzero(stats[1:, cv2.CC_STAT_AREA] < _MIN_PART_AREA) + 1
        if len(small):
            window[np.isin(parts, small)] = 0
        if _has_hole(window == k):  # rare: erasing a thin pixel enclosed by the instance
            _fill_holes(window, k)
    # Erase instances that the later ones (or the border) left almost invisible.
    areas = np.bincount(ids.ravel(), minlength=len(classes) + 1)
    keep = [k for k in range(1, len(classes) + 1) if areas[k] >= _MIN_VISIBLE_AREA]
    relabel = np.zeros(len(classes) + 1, dtype=np.int32)
    relabel[keep] = np.arange(1, len(keep) + 1)
    return relabel[ids], [classes[k - 1] for k in keep]


def _paint(rng: np.random.Generator, background: np.ndarray, ids: np.ndarray, num: int) -> np.ndarray:
    image = background.copy()
    bg_mean = background.reshape(-1, 3).mean(0)
    h, w = ids.shape
    for k in range(1, num + 1):
        # Prefer palette colours that stand out from the background (most of the time).
        far = np.linalg.norm(PALETTE - bg_mean, axis=1) > 90
        choices = np.flatnonzero(far) if far.any() and rng.random() < 0.9 else np.arange(len(PALETTE))
        color = PALETTE[rng.choice(choices)] + rng.uniform(-20, 20, size=3).astype(np.float32)
        # A soft linear shading, so shapes are not flat colour.
        angle = rng.uniform(0, 2 * np.pi)
        strength = rng.uniform(0, 40) / max(h, w)
        ys, xs = np.nonzero(ids == k)
        shade = (xs * np.cos(angle) + ys * np.sin(angle)) * strength
        image[ys, xs] = color + shade[:, None].astype(np.float32)
    image += rng.standard_normal(size=image.shape, dtype=np.float32) * 4  # sensor noise
    return np.clip(np.round(image), 0, 255).astype(np.uint8)


def _make_image(spec: ShapesSpec, index: int):
    """The image and its annotations (json-ready, COCO xywh boxes, 1-based category ids)."""
    rng = np.random.default_rng([spec.seed, zlib.crc32(spec.split.encode()), index])
    h, w = (int(v) for v in rng.integers(spec.min_size, spec.max_size + 1, size=2))
    background = textured_background(rng, h, w)
    ids, classes = _place_shapes(rng, h, w, spec.max_shapes)
    image = _paint(rng, background, ids, len(classes))
    annotations = []
    for k, cls in enumerate(classes, start=1):
        mask = ids == k
        rows, cols = np.flatnonzero(mask.any(1)), np.flatnonzero(mask.any(0))
        x1, y1, x2, y2 = int(cols[0]), int(rows[0]), int(cols[-1]) + 1, int(rows[-1]) + 1
        annotations.append(
            {
                "category_id": cls + 1,
                "bbox": [x1, y1, x2 - x1, y2 - y1],
                "area": int(mask.sum()),
                "iscrowd": 0,
                "segmentation": mask_to_polygons(mask),
            }
        )
    return image, annotations


# --- writing --------------------------------------------------------------------------------------
def generate_shapes_split(spec: ShapesSpec, out_dir: str) -> None:
    """Write ``out_dir/annotations.json`` and ``out_dir/images/NNNNNN.png`` (not atomic by
    itself: ``ensure_shapes_dataset`` calls it on a temporary folder)."""
    write_coco_split(
        out_dir,
        spec.num_images,
        lambda index: _make_image(spec, index),
        info={"description": "detcore synthetic shapes", "version": _VERSION, **asdict(spec)},
        categories=[{"id": i + 1, "name": n, "supercategory": "shape"} for i, n in enumerate(SHAPES_CLASSES)],
    )


def ensure_shapes_dataset(spec: ShapesSpec, cache_dir: Optional[str] = None) -> str:
    """The folder of ``spec``'s split, generating it first if it is not in the cache yet.
    Returns ``<cache>/<spec.dirname>`` (holding ``annotations.json`` and ``images/``)."""
    return ensure_generated(spec.dirname, lambda folder: generate_shapes_split(spec, folder), cache_dir)
