"""A tiny COCO dataset with known errors, written to disk as a user's would be: images with filled
shapes, their json, and detections that find some, confuse some, miss some and invent some.

Objects never overlap (each sits in its own cell of a grid), and a detection of the wrong class
is never paired with a right one on the same object, so the matching of the confusion matrix
agrees with COCOeval's per-class matching (tests rely on this to cross-check the two).
"""
import json
import os
from dataclasses import dataclass, field
from typing import Dict, List

import cv2
import numpy as np

CATEGORIES = ((1, "circle"), (3, "square"), (7, "triangle"))  # json ids are not contiguous on purpose
COLORS = {1: (60, 60, 220), 3: (60, 180, 60), 7: (220, 120, 40)}  # BGR
SIZE = 160  # image side
CELL = 40  # grid cell side: 4 x 4 cells per image


@dataclass
class Synthetic:
    json_file: str
    image_root: str
    results: List[dict]  # COCO result dicts
    files: Dict[int, str]  # image id -> path
    cat_ids: List[int] = field(default_factory=lambda: [c for c, _ in CATEGORIES])
    # What was made on purpose (score >= 0.5 only), for the tests' expectations.
    kinds: Dict[str, int] = field(default_factory=dict)


def _shape(image, cat_id, x, y, w, h):
    color = COLORS[cat_id]
    if cat_id == 1:
        cv2.ellipse(image, (int(x + w / 2), int(y + h / 2)), (int(w / 2), int(h / 2)), 0, 0, 360, color, -1)
    elif cat_id == 3:
        cv2.rectangle(image, (int(x), int(y)), (int(x + w), int(y + h)), color, -1)
    else:
        pts = np.array([[x + w / 2, y], [x + w, y + h], [x, y + h]], dtype=np.int32)
        cv2.fillPoly(image, [pts], color)


def make_synthetic(folder, num_images: int = 6, seed: int = 0, write_images: bool = True) -> Synthetic:
    """Images 1..num_images of SIZE x SIZE pixels, 3 to 6 objects each; every object gets, at
    random: a good detection (IoU > 0.7), a loose one (IoU 0.5..0.75), a detection of another
    class, a low-score detection (< 0.5), or none; plus a false positive in an empty cell of some
    images. Scores are random, so the PR curves are not trivial."""
    rng = np.random.default_rng(seed)
    os.makedirs(folder, exist_ok=True)
    cat_ids = [c for c, _ in CATEGORIES]
    images, anns, results, files = [], [], [], {}
    kinds = {"good": 0, "loose": 0, "wrong_class": 0, "low_score": 0, "missed": 0, "false_positive": 0}
    for image_id in range(1, num_images + 1):
        image = np.full((SIZE, SIZE, 3), 235, dtype=np.uint8)
        cells = rng.permutation(16)
        n = int(rng.integers(3, 7))
        for cell in cells[:n]:
            cx, cy = (cell % 4) * CELL, (cell // 4) * CELL
            w, h = (float(v) for v in rng.uniform(22, 34, size=2))
            x, y = cx + float(rng.uniform(1, CELL - w - 1)), cy + float(rng.uniform(1, CELL - h - 1))
            cat = int(rng.choice(cat_ids))
            _shape(image, cat, x, y, w, h)
            anns.append({"id": len(anns) + 1, "image_id": image_id, "category_id": cat, "bbox": [x, y, w, h],
                         "area": w * h, "iscrowd": 0, "segmentation": [[x, y, x + w, y, x + w, y + h, x, y + h]]})
            kind = str(rng.choice(["good", "good", "good", "loose", "wrong_class", "low_score", "missed"]))
            kinds[kind] += 1
            if kind == "missed":
                continue
            dx = {"good": 1.0, "loose": 5.0}.get(kind, 1.0)
            box = [x + dx, y + dx * 0.5, w, h]
            det_cat = cat
            if kind == "wrong_class":
                det_cat = int(rng.choice([c for c in cat_ids if c != cat]))
            score = float(rng.uniform(0.05, 0.45)) if kind == "low_score" else float(rng.uniform(0.5, 1.0))
            results.append({"image_id": image_id, "category_id": det_cat, "bbox": box, "score": score})
        if image_id % 2 == 0:  # a false positive in an empty cell
            cell = cells[n]
            cx, cy = (cell % 4) * CELL, (cell // 4) * CELL
            results.append({"image_id": image_id, "category_id": int(rng.choice(cat_ids)),
                            "bbox": [cx + 5.0, cy + 5.0, 25.0, 25.0], "score": float(rng.uniform(0.5, 1.0))})
            kinds["false_positive"] += 1
        name = f"{image_id:06d}.png"
        files[image_id] = os.path.join(folder, name)
        if write_images:
            cv2.imwrite(files[image_id], image)
        images.append({"id": image_id, "width": SIZE, "height": SIZE, "file_name": name})
    json_file = os.path.join(folder, "annotations.json")
    with open(json_file, "w") as f:
        json.dump({"images": images, "annotations": anns,
                   "categories": [{"id": c, "name": n} for c, n in CATEGORIES]}, f)
    return Synthetic(json_file, folder, results, files, kinds=kinds)
