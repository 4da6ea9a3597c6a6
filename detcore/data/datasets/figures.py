"""``figures``: a synthetic keypoint dataset of stick figures, generated on first use.

Each image holds 1-3 figures facing the viewer on a textured background (the backgrounds of
``shapes``): a torso, a round head, two arms ending in round hands and two legs ending in round
feet, posed at random (arm and leg angles, a tilt, size, place), coloured at random. Nine named
keypoints: head, and left/right shoulder, hand, hip and foot. As for a person facing the camera,
a figure's left side is on the image's right, and both sides look alike: only the position
tells a left hand from a right one, so a flip that forgot to swap the pairs would teach the
model contradictions (the flip-pair swap is tested for real by training on this data).

Occlusion and the image border give COCO's three visibility states: a point covered by a later
figure is labeled but occluded (v = 1), a point outside the image is unlabeled (v = 0, x = y = 0),
the others are visible (v = 2). A figure is placed again elsewhere (up to a few tries, else left
out) when it would cover most of an earlier one or leave fewer than 4 of its own points in the
image. Boxes, masks and areas are those of each figure's visible pixels, as in COCO; masks are
written as RLE, exact even where a limb closes a hole that a polygon could not leave out.

Written as a real COCO keypoint json (``keypoints``, ``num_keypoints``; the category has
``keypoints``, ``skeleton``, ``keypoint_flip_map`` and ``keypoint_oks_sigmas``) + PNGs into the
cache (see generated.py), then read by the ordinary COCO loader. Every image has its own random
generator seeded by (seed, split, index): generations with the same parameters are
byte-identical.
"""
import zlib
from dataclasses import asdict, dataclass
from typing import List, Optional, Tuple

import cv2
import numpy as np
import pycocotools.mask as mask_util

from .generated import ensure_generated, write_coco_split
from .shapes import PALETTE, textured_background

__all__ = [
    "FIGURE_KEYPOINT_NAMES",
    "FIGURE_SKELETON",
    "FIGURE_FLIP_MAP",
    "FIGURE_OKS_SIGMAS",
    "FiguresSpec",
    "ensure_figures_dataset",
    "generate_figures_split",
]

_VERSION = "v1"
FIGURE_KEYPOINT_NAMES = (
    "head", "left_shoulder", "right_shoulder", "left_hand", "right_hand",
    "left_hip", "right_hip", "left_foot", "right_foot",
)  # fmt: skip
FIGURE_SKELETON = (
    ("head", "left_shoulder"), ("head", "right_shoulder"), ("left_shoulder", "right_shoulder"),
    ("left_shoulder", "left_hand"), ("right_shoulder", "right_hand"), ("left_shoulder", "left_hip"),
    ("right_shoulder", "right_hip"), ("left_hip", "right_hip"), ("left_hip", "left_foot"),
    ("right_hip", "right_foot"),
)  # fmt: skip
FIGURE_FLIP_MAP = (
    ("left_shoulder", "right_shoulder"), ("left_hand", "right_hand"), ("left_hip", "right_hip"),
    ("left_foot", "right_foot"),
)  # fmt: skip
# COCO's OKS constants of the nearest person keypoints (Ronchi & Perona's annotation spreads):
# ears for the head, shoulders, wrists for the hands, hips, ankles for the feet.
FIGURE_OKS_SIGMAS = (0.035, 0.079, 0.079, 0.062, 0.062, 0.107, 0.107, 0.089, 0.089)

_SHIFT = 4  # cv2 drawing with 4 fractional bits: sub-pixel positions
_PLACEMENT_TRIES = 8
_MIN_POINTS_IN_IMAGE = 4
_MAX_COVERED_FRACTION = 0.5  # of an earlier figure's visible pixels
_MIN_VISIBLE_AREA = 60  # pixels


@dataclass(frozen=True)
class FiguresSpec:
    """Parameters of one split; the cache folder name is derived from all of them."""

    split: str = "train"
    num_images: int = 600
    seed: int = 0
    min_size: int = 112  # image height and width are drawn independently in [min_size, max_size]
    max_size: int = 176
    max_figures: int = 3

    def __post_init__(self):
        if not self.split or not all(c.isalnum() or c in "_-" for c in self.split):
            raise ValueError(f"FiguresSpec: split must be a non-empty [A-Za-z0-9_-] name, got {self.split!r}")
        if self.num_images < 1:
            raise ValueError(f"FiguresSpec: num_images must be >= 1, got {self.num_images}")
        if not 64 <= self.min_size <= self.max_size:
            raise ValueError(
                f"FiguresSpec: need 64 <= min_size <= max_size, got min_size={self.min_size}, max_size={self.max_size}"
            )
        if self.max_figures < 1:
            raise ValueError(f"FiguresSpec: max_figures must be >= 1, got {self.max_figures}")

    @property
    def dirname(self) -> str:
        return (
            f"figures-{_VERSION}-{self.split}-n{self.num_images}-seed{self.seed}"
            f"-size{self.min_size}-{self.max_size}-k{self.max_figures}"
        )


# --- one figure -------------------------------------------------------------------------------------
def _pose(rng: np.random.Generator, h: int, w: int) -> Tuple[np.ndarray, float]:
    """The 9 keypoints ``[9, 2]`` (image coordinates, order of FIGURE_KEYPOINT_NAMES) of a random
    pose, and the figure's size unit (about its height)."""
    unit = rng.uniform(0.45, 0.9) * min(h, w)
    # Figure frame: x toward the figure's left (the image's right), y down, unit = 1.
    shoulder = np.array([0.15, -0.22])
    hip = np.array([0.10, 0.08])
    mirror = np.array([-1.0, 1.0])
    arm = rng.uniform(0.28, 0.36)
    leg = rng.uniform(0.36, 0.44)
    # Angles from straight down, outward: arms from hanging to raised, legs a little apart.
    a_left, a_right = rng.uniform(np.radians(15), np.radians(160), size=2)
    l_left, l_right = rng.uniform(0.0, np.radians(35), size=2)
    local = np.array(
        [
            [0.0, -0.36],
            shoulder,
            shoulder * mirror,
            shoulder + arm * np.array([np.sin(a_left), np.cos(a_left)]),
            shoulder * mirror + arm * np.array([-np.sin(a_right), np.cos(a_right)]),
            hip,
            hip * mirror,
            hip + leg * np.array([np.sin(l_left), np.cos(l_left)]),
            hip * mirror + leg * np.array([-np.sin(l_right), np.cos(l_right)]),
        ]
    )
    tilt = rng.uniform(-np.radians(30), np.radians(30))
    rotation = np.array([[np.cos(tilt), -np.sin(tilt)], [np.sin(tilt), np.cos(tilt)]])
    center = np.array([rng.uniform(0.1, 0.9) * w, rng.uniform(0.1, 0.9) * h])
    return center + unit * local @ rotation.T, unit


def _draw(points: np.ndarray, unit: float, h: int, w: int) -> np.ndarray:
    """``[h, w]`` uint8 part map of a figure: 0 outside, 1 body (torso, arms, legs), 2 head,
    hands and feet. Later parts are drawn over earlier ones."""
    parts = np.zeros((h, w), dtype=np.uint8)
    scale = 1 << _SHIFT

    def fixed(p):
        return tuple(int(round(v * scale)) for v in p)

    head, ls, rs, lh, rh, lhip, rhip, lf, rf = points
    cv2.fillPoly(parts, [np.round(np.array([ls, rs, rhip, lhip]) * scale).astype(np.int32)], 1, cv2.LINE_8, _SHIFT)
    for start, end, width in ((lhip, lf, 0.08), (rhip, rf, 0.08), (ls, lh, 0.065), (rs, rh, 0.065)):
        # cv2.line's thickness is a whole number of pixels, not a fixed-point one.
        cv2.line(parts, fixed(start), fixed(end), 1, max(2, int(round(width * unit))), cv2.LINE_8, _SHIFT)
    for center, radius in ((head, 0.1), (lh, 0.05), (rh, 0.05), (lf, 0.055), (rf, 0.055)):
        cv2.circle(parts, fixed(center), int(round(radius * unit * scale)), 2, -1, cv2.LINE_8, _SHIFT)
    return parts


def _contrasting_colors(rng: np.random.Generator, background: np.ndarray) -> np.ndarray:
    """Two different palette colours (body; head, hands and feet) that stand out from the background."""
    bg_mean = background.reshape(-1, 3).mean(0)
    far = np.flatnonzero(np.linalg.norm(PALETTE - bg_mean, axis=1) > 90)
    choices = far if len(far) >= 2 else np.arange(len(PALETTE))
    picked = rng.choice(choices, size=2, replace=False)
    return PALETTE[picked] + rng.uniform(-20, 20, size=(2, 3)).astype(np.float32)


# --- one image --------------------------------------------------------------------------------------
def _place_figures(rng: np.random.Generator, h: int, w: int, max_figures: int):
    """Instance-id map, part map (for painting) and the keypoints of each kept figure."""
    ids = np.zeros((h, w), dtype=np.int32)
    parts = np.zeros((h, w), dtype=np.uint8)
    keypoints: List[np.ndarray] = []
    for _ in range(int(rng.integers(1, max_figures + 1))):
        new_id = len(keypoints) + 1
        for _try in range(_PLACEMENT_TRIES):
            points, unit = _pose(rng, h, w)
            inside = (points[:, 0] >= 0) & (points[:, 0] < w) & (points[:, 1] >= 0) & (points[:, 1] < h)
            if inside.sum() < _MIN_POINTS_IN_IMAGE:
                continue
            drawn = _draw(points, unit, h, w)
            mask = drawn > 0
            areas = np.bincount(ids.ravel(), minlength=new_id)
            covered = np.bincount(ids[mask], minlength=new_id)
            if mask.sum() < _MIN_VISIBLE_AREA or (covered[1:] > _MAX_COVERED_FRACTION * areas[1:]).any():
                continue
            ids[mask] = new_id
            parts[mask] = drawn[mask]
            keypoints.append(points)
            break
    return ids, parts, keypoints


def _visibility(points: np.ndarray, ids: np.ndarray, k: int) -> np.ndarray:
    """COCO visibility of figure ``k``'s points: 0 outside the image, 2 when a pixel of the
    figure is within one pixel of the point, else 1 (covered by a later figure)."""
    h, w = ids.shape
    v = np.zeros(len(points), dtype=np.int64)
    for i, (x, y) in enumerate(points):
        if not (0 <= x < w and 0 <= y < h):
            continue
        c, r = int(x), int(y)
        window = ids[max(r - 1, 0) : r + 2, max(c - 1, 0) : c + 2]
        v[i] = 2 if (window == k).any() else 1
    return v


def _make_image(spec: FiguresSpec, index: int):
    """The image and its annotations (json-ready: COCO xywh boxes, keypoints as pixel indices)."""
    rng = np.random.default_rng([spec.seed, zlib.crc32(spec.split.encode()), index])
    h, w = (int(v) for v in rng.integers(spec.min_size, spec.max_size + 1, size=2))
    background = textured_background(rng, h, w)
    ids, parts, keypoints = _place_figures(rng, h, w, spec.max_figures)
    image = background.copy()
    for k in range(1, len(keypoints) + 1):
        colors = _contrasting_colors(rng, background)
        for part in (1, 2):
            image[(ids == k) & (parts == part)] = colors[part - 1]
    image += rng.standard_normal(size=image.shape, dtype=np.float32) * 4  # sensor noise
    image = np.clip(np.round(image), 0, 255).astype(np.uint8)

    annotations = []
    for k, points in enumerate(keypoints, start=1):
        mask = ids == k
        rows, cols = np.flatnonzero(mask.any(1)), np.flatnonzero(mask.any(0))
        x1, y1, x2, y2 = int(cols[0]), int(rows[0]), int(cols[-1]) + 1, int(rows[-1]) + 1
        visibility = _visibility(points, ids, k)
        flat = []
        for (x, y), v in zip(points, visibility):
            # COCO keypoints are pixel indices: the continuous point minus half a pixel.
            flat += [round(float(x) - 0.5, 2), round(float(y) - 0.5, 2), int(v)] if v else [0, 0, 0]
        annotations.append(
            {
                "category_id": 1,
                "bbox": [x1, y1, x2 - x1, y2 - y1],
                "area": int(mask.sum()),
                "iscrowd": 0,
                "segmentation": _rle(mask),
                "keypoints": flat,
                "num_keypoints": int((visibility > 0).sum()),
            }
        )
    return image, annotations


def _rle(mask: np.ndarray) -> dict:
    rle = mask_util.encode(np.asfortranarray(mask.astype(np.uint8)))
    return {"size": [int(v) for v in rle["size"]], "counts": rle["counts"].decode("ascii")}


# --- writing --------------------------------------------------------------------------------------
def _category() -> dict:
    index = {n: i + 1 for i, n in enumerate(FIGURE_KEYPOINT_NAMES)}
    return {
        "id": 1,
        "name": "figure",
        "supercategory": "figure",
        "keypoints": list(FIGURE_KEYPOINT_NAMES),
        "skeleton": [[index[a], index[b]] for a, b in FIGURE_SKELETON],
        "keypoint_flip_map": [list(pair) for pair in FIGURE_FLIP_MAP],
        "keypoint_oks_sigmas": list(FIGURE_OKS_SIGMAS),
    }


def generate_figures_split(spec: FiguresSpec, out_dir: str) -> None:
    """Write ``out_dir/annotations.json`` and ``out_dir/images/NNNNNN.png``."""
    write_coco_split(
        out_dir,
        spec.num_images,
        lambda index: _make_image(spec, index),
        info={"description": "detcore synthetic keypoint figures", "version": _VERSION, **asdict(spec)},
        categories=[_category()],
    )


def ensure_figures_dataset(spec: FiguresSpec, cache_dir: Optional[str] = None) -> str:
    """The folder of ``spec``'s split (``annotations.json`` and ``images/``), generated first if
    it is not in the cache yet."""
    return ensure_generated(spec.dirname, lambda folder: generate_figures_split(spec, folder), cache_dir)
