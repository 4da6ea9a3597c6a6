"""Cityscapes fine instance segmentation (the ``gtFine`` layout) -> records.

The layout, as the Cityscapes download unpacks it::

    <root>/cityscapes/leftImg8bit/<split>/<city>/<city>_<seq>_<frame>_leftImg8bit.png
    <root>/cityscapes/gtFine/<split>/<city>/<city>_<seq>_<frame>_gtFine_polygons.json
    <root>/cityscapes/gtFine/<split>/<city>/<city>_<seq>_<frame>_gtFine_instanceIds.png

The 8 classes with instances that Cityscapes evaluates are the things (caravan and trailer have
instances but are not evaluated, so they are not classes here). An image's instances come from
its polygon json when there is one, else from its instance-id PNG:

- json: the polygons are drawn in file order into an instance-id map by cityscapesScripts' own
  ``createInstanceImage`` (a later polygon covers an earlier one, as in the official PNGs, which
  that function made), so both sources give the same masks;
- PNG: pixel value ``label_id * 1000 + k`` is instance k of a class, a bare ``label_id`` a group
  of that class ("cargroup": annotators could not separate them).

Every instance becomes an annotation with its visible pixels as a compressed RLE, its box the
box of those pixels (xyxy, no +1) and ``category_id`` 0..7; groups are ``iscrowd=1``. The record
keeps the ground-truth file names (``gt_polygons_file``, ``gt_instance_ids_file``) for the
Cityscapes evaluator. Unknown labels, unreadable files, a polygon point that is not two numbers
and a ground-truth size other than the image's are errors naming the file (and the object). A
polygon with a NaN, infinite or absurdly distant point is dropped (not drawn) and logged, by the
policy of the COCO and VOC loaders (``annotation_checks``).
"""
import glob
import logging
import os
from concurrent.futures import ProcessPoolExecutor
from typing import List, Optional, Tuple

import numpy as np
import pycocotools.mask as mask_util
from PIL import Image

from .annotation_checks import DropReport, image_size_problem, is_real_number, polygon_reason

__all__ = [
    "CITYSCAPES_INSTANCE_CLASSES",
    "CITYSCAPES_INSTANCE_LABEL_IDS",
    "cityscapes_files",
    "load_cityscapes_instances",
    "polygons_to_instance_ids",
]

logger = logging.getLogger(__name__)

# The evaluated instance classes and their Cityscapes label ids (cityscapesScripts' labels.py).
CITYSCAPES_INSTANCE_CLASSES = ("person", "rider", "car", "truck", "bus", "train", "motorcycle", "bicycle")
CITYSCAPES_INSTANCE_LABEL_IDS = (24, 25, 26, 27, 28, 31, 32, 33)
_LABEL_TO_CLASS = {label: k for k, label in enumerate(CITYSCAPES_INSTANCE_LABEL_IDS)}
_IMAGE_SUFFIX = "_leftImg8bit.png"
# Files at which loading goes to worker processes: decoding a 2048x1024 image is slow enough that
# a pool pays from a few dozen files (docs/benchmarks.md, "Figures behind code choices").
_PARALLEL_FROM = 32


def cityscapes_scripts():
    """The cityscapesscripts modules used here, with an install hint when it is missing."""
    try:
        from cityscapesscripts.helpers import labels
        from cityscapesscripts.helpers.annotation import Annotation
        from cityscapesscripts.preparation import json2instanceImg
    except ImportError as e:
        raise ImportError(
            "Cityscapes needs the cityscapesscripts package (pip install cityscapesscripts; "
            f"scripts/setup_env.sh installs it): {e}"
        ) from None
    return labels, Annotation, json2instanceImg


def polygons_to_instance_ids(
    json_file: str, image_size: Optional[Tuple[int, int]] = None, dropped: Optional[list] = None
) -> np.ndarray:
    """The ``[H, W]`` int32 instance-id map of a ``*_gtFine_polygons.json``, drawn exactly as the
    official ``*_gtFine_instanceIds.png`` are (cityscapesScripts' ``createInstanceImage``).

    ``image_size`` ``(width, height)``: the size the json must state (its image's). Objects
    whose polygon is unusable are not drawn; with ``dropped`` (a list), ``(reason, object index)``
    is appended for each."""
    labels, Annotation, json2instanceImg = cityscapes_scripts()
    annotation = Annotation()
    try:
        annotation.fromJsonFile(json_file)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{json_file}: not a Cityscapes polygon annotation ({type(e).__name__}: {e})") from None
    width, height = annotation.imgWidth, annotation.imgHeight
    problem = image_size_problem(width, height)
    if problem:
        raise ValueError(f"{json_file}: {problem} (imgWidth, imgHeight)")
    annotation.imgWidth, annotation.imgHeight = width, height = int(width), int(height)
    if image_size is not None and (width, height) != tuple(image_size):
        raise ValueError(
            f"{json_file}: imgWidth x imgHeight is {width} x {height}, but its image is {image_size[0]} x {image_size[1]}"
        )
    for k, obj in enumerate(annotation.objects):
        if obj.deleted:
            continue
        name = obj.label[: -len("group")] if obj.label not in labels.name2label and obj.label.endswith("group") else obj.label
        if name not in labels.name2label:
            # createInstanceImage would print and exit the process: stop here with a sentence.
            raise ValueError(f"{json_file}: object #{k} has label '{obj.label}', which is not a Cityscapes label")
        if len(obj.polygon) < 2:
            raise ValueError(f"{json_file}: object #{k} ('{obj.label}') has a polygon of {len(obj.polygon)} point(s)")
        if not all(is_real_number(p.x) and is_real_number(p.y) for p in obj.polygon):
            raise ValueError(f"{json_file}: object #{k} ('{obj.label}') has a polygon point that is not two numbers [x, y]")
        reason = polygon_reason([p.x for p in obj.polygon], [p.y for p in obj.polygon], width, height)
        if reason is not None:
            obj.deleted = 1  # createInstanceImage skips deleted objects
            if dropped is not None:
                dropped.append((reason, k))
    return np.asarray(json2instanceImg.createInstanceImage(annotation, "ids"), dtype=np.int32)


def _read_instance_ids_png(png_file: str) -> np.ndarray:
    try:
        with Image.open(png_file) as im:
            ids = np.asarray(im, dtype=np.int32)
    except OSError as e:
        raise ValueError(f"{png_file}: not a readable instance-id PNG ({e})") from None
    if ids.ndim != 2:
        raise ValueError(f"{png_file}: an instance-id PNG has one channel, got shape {ids.shape}")
    return ids


def _annotations(ids: np.ndarray) -> List[dict]:
    annotations = []
    for value in np.unique(ids):
        value = int(value)
        label = value // 1000 if value >= 1000 else value
        if label not in _LABEL_TO_CLASS:
            continue
        mask = ids == value
        rows, cols = np.flatnonzero(mask.any(axis=1)), np.flatnonzero(mask.any(axis=0))
        rle = mask_util.encode(np.asfortranarray(mask.astype(np.uint8)))
        rle["counts"] = rle["counts"].decode("ascii")
        annotations.append(
            {
                "bbox": [float(cols[0]), float(rows[0]), float(cols[-1] + 1), float(rows[-1] + 1)],
                "category_id": _LABEL_TO_CLASS[label],
                "iscrowd": int(value < 1000),
                "segmentation": rle,
            }
        )
    return annotations


def cityscapes_files(image_dir: str, gt_dir: str) -> List[Tuple[str, str, str]]:
    """``(image, polygons json, instance-id PNG)`` paths of every image under ``image_dir``
    (``<city>/<name>_leftImg8bit.png``), sorted; the ground-truth files may not exist."""
    if not os.path.isdir(image_dir):
        raise FileNotFoundError(f"Cityscapes image folder not found: {image_dir}")
    files = []
    for image in sorted(glob.glob(os.path.join(image_dir, "*", "*" + _IMAGE_SUFFIX))):
        city = os.path.basename(os.path.dirname(image))
        base = os.path.basename(image)[: -len(_IMAGE_SUFFIX)]
        prefix = os.path.join(gt_dir, city, base + "_gtFine_")
        files.append((image, prefix + "polygons.json", prefix + "instanceIds.png"))
    if not files:
        raise FileNotFoundError(f"No Cityscapes images (<city>/*{_IMAGE_SUFFIX}) under {image_dir}")
    return files


def _image_size(image: str) -> Tuple[int, int]:
    """``(width, height)`` of an image file, from its header."""
    try:
        with Image.open(image) as im:
            return im.size
    except OSError as e:
        raise ValueError(f"{image}: not a readable image ({e})") from None


def _load_one(files: Tuple[str, str, str]) -> dict:
    image, polygons, instance_ids = files
    dropped: List[Tuple[str, int]] = []
    size = _image_size(image)
    if os.path.isfile(polygons):
        ids = polygons_to_instance_ids(polygons, size, dropped)
    elif os.path.isfile(instance_ids):
        ids = _read_instance_ids_png(instance_ids)
        if ids.shape != (size[1], size[0]):
            raise ValueError(
                f"{instance_ids}: the instance-id PNG is {ids.shape[1]} x {ids.shape[0]}, but its image is {size[0]} x {size[1]}"
            )
    else:
        raise FileNotFoundError(f"{image}: no ground truth ({polygons} nor {instance_ids})")
    return {
        "dropped": [(reason, f"{os.path.basename(polygons)} #{k}") for reason, k in dropped],
        "file_name": image,
        "height": int(ids.shape[0]),
        "width": int(ids.shape[1]),
        "annotations": _annotations(ids),
        "gt_polygons_file": polygons,
        "gt_instance_ids_file": instance_ids,
    }


def load_cityscapes_instances(image_dir: str, gt_dir: str, num_workers: Optional[int] = None) -> List[dict]:
    """Records of every image under ``image_dir`` with its ground truth from ``gt_dir`` (the same
    split of ``gtFine``). Many images are read by ``num_workers`` processes (default: the CPU
    count, at most 8)."""
    files = cityscapes_files(os.fspath(image_dir), os.fspath(gt_dir))
    if num_workers is None:
        num_workers = min(os.cpu_count() or 1, 8)
    if num_workers > 1 and len(files) >= _PARALLEL_FROM:
        with ProcessPoolExecutor(num_workers) as pool:
            records = list(pool.map(_load_one, files, chunksize=8))
    else:
        records = [_load_one(f) for f in files]
    drops = DropReport(gt_dir, kind="object", ids="objects")
    for image_id, record in enumerate(records):
        record["image_id"] = image_id
        for reason, where in record.pop("dropped"):
            drops.add(reason, where)
    drops.log()
    logger.info(
        "Loaded %d images and %d instances from %s",
        len(records), sum(len(r["annotations"]) for r in records), gt_dir,
    )
    return records

