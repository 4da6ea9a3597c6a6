"""COCO-format json -> records ("dataset dicts"), and registering any COCO-format dataset.

A record is one image::

    {"file_name": "<image_root>/<file_name>", "height": int, "width": int, "image_id": int,
     "annotations": [{"id": int, "bbox": [x1, y1, x2, y2] (float, xyxy), "category_id": int in
                      [0, K) (contiguous), "iscrowd": 0 or 1,
                      "segmentation": [[x0, y0, x1, y1, ...], ...] or an RLE dict (optional),
                      "keypoints": [x1, y1, v1, ..., xK, yK, vK] (optional; float)}]}

Keypoints: COCO stores them as pixel indices; the records hold pixel centers (x + 0.5, y + 0.5),
detcore's continuous convention (structures/keypoints.py), and the evaluator subtracts the 0.5
again. Unlabeled points (v = 0) are (0, 0, 0). A json whose categories declare keypoint names
(COCO's "keypoints" / "skeleton" fields) gives its dataset the keypoint metadata of
``keypoint_meta``.

Anything malformed is an error naming the json file and the annotation (or image) id.
Well-formed but unusable annotations (non-finite or absurd coordinates, empty or outside boxes,
no polygon of 3 or more points) are dropped, counted and logged: the policy, shared with the
evaluator and the other loaders, is in ``annotation_checks``. Crowd and empty-image handling belongs to the training
pipeline (``get_detection_dataset_dicts`` and the mapper).
"""
import json
import logging
import os
from typing import Any, Dict, List, Optional

from ..catalog import DatasetCatalog, MetadataCatalog
from .annotation_checks import (
    DropReport,
    as_float,
    coco_annotation_reason,
    image_size_problem,
    is_real_number,
    usable_polygons,
)
from .keypoint_meta import keypoint_metadata_from_categories

__all__ = ["load_coco_json", "read_coco_categories", "register_coco_instances"]

logger = logging.getLogger(__name__)


class _Malformed(ValueError):
    pass


def _read_json(json_file: str) -> dict:
    if not os.path.isfile(json_file):
        raise FileNotFoundError(f"COCO json file not found: {json_file}")
    try:
        with open(json_file, "r") as f:
            data = json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{json_file} is not valid json: {e}") from None
    if not isinstance(data, dict) or not all(isinstance(data.get(k), list) for k in ("images", "categories")):
        raise ValueError(f"{json_file}: a COCO json needs 'images' and 'categories' lists at the top level")
    return data


def _parse_categories(data: dict, json_file: str):
    cats = data["categories"]
    for i, c in enumerate(cats):
        if not isinstance(c, dict) or not isinstance(c.get("id"), int) or not isinstance(c.get("name"), str):
            raise ValueError(f"{json_file}: category #{i} needs an int 'id' and a str 'name', got {c!r}")
    cats = sorted(cats, key=lambda c: c["id"])
    ids = [c["id"] for c in cats]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{json_file}: category ids are not unique: {ids}")
    # COCO ids are sparse (1..90 for 80 classes); the model wants 0..K-1 in id order.
    return [c["name"] for c in cats], {cid: i for i, cid in enumerate(ids)}


def _parse_segmentation(segm: Any, height: int, width: int) -> Any:
    """Validated segmentation: an RLE dict, or the polygons with >= 3 points."""
    if isinstance(segm, dict):
        if "counts" not in segm or "size" not in segm:
            raise _Malformed(f"an RLE segmentation needs 'counts' and 'size', got keys {sorted(segm)}")
        if list(segm["size"]) != [height, width]:
            raise _Malformed(f"RLE size {list(segm['size'])} does not match the image size [{height}, {width}]")
        return segm
    if not isinstance(segm, list):
        raise _Malformed(f"segmentation must be a list of polygons or an RLE dict, got {type(segm).__name__}")
    polygons = []
    for poly in segm:
        if not isinstance(poly, list) or not all(is_real_number(v) for v in poly):
            raise _Malformed("every polygon must be a flat list of numbers [x0, y0, x1, y1, ...]")
        if len(poly) % 2 != 0:
            raise _Malformed(f"a polygon has an odd number of coordinates ({len(poly)})")
        polygons.append([as_float(v) for v in poly])
    # Shorter "polygons" (points, lines) exist in COCO; they cover nothing.
    return usable_polygons(polygons)


def _parse_keypoints(ann: dict, expected: Optional[int]) -> List[float]:
    """The annotation's keypoints, checked, as pixel centers (see the module docstring)."""
    kps = ann["keypoints"]
    if not isinstance(kps, list) or not kps or not all(is_real_number(v) for v in kps):
        raise _Malformed("keypoints must be a non-empty flat list of numbers [x1, y1, v1, x2, y2, v2, ...]")
    if len(kps) % 3 != 0:
        raise _Malformed(f"keypoints must hold 3 numbers (x, y, visibility) per keypoint, got {len(kps)} numbers")
    if expected is not None and len(kps) != 3 * expected:
        raise _Malformed(f"keypoints has {len(kps) // 3} keypoints, but its category declares {expected} keypoint names")
    visibility = kps[2::3]
    bad = [v for v in visibility if v not in (0, 1, 2)]
    if bad:
        raise _Malformed(f"keypoint visibility must be 0 (unlabeled), 1 (occluded) or 2 (visible), got {bad[0]!r}")
    labeled = sum(v > 0 for v in visibility)
    num = ann.get("num_keypoints")
    if num is not None and (not is_real_number(num) or num != labeled):
        raise _Malformed(f"num_keypoints is {num!r} but {labeled} keypoints are labeled (visibility > 0)")
    out: List[float] = []
    for x, y, v in zip(kps[0::3], kps[1::3], visibility):
        out += [as_float(x) + 0.5, as_float(y) + 0.5, float(v)] if v > 0 else [0.0, 0.0, 0.0]
    return out


def _parse_annotation(
    ann: Any, images: Dict[int, dict], id_map: Dict[int, int], keypoint_counts: Dict[int, int]
) -> dict:
    if not isinstance(ann, dict):
        raise _Malformed(f"an annotation must be a json object, got {type(ann).__name__}")
    image_id = ann.get("image_id")
    if image_id not in images:
        raise _Malformed(f"image_id {image_id!r} is not in 'images'")
    bbox = ann.get("bbox")
    if not isinstance(bbox, list) or len(bbox) != 4 or not all(is_real_number(v) for v in bbox):
        raise _Malformed(f"bbox must be 4 numbers [x, y, w, h], got {bbox!r}")
    if ann.get("category_id") not in id_map:
        raise _Malformed(f"category_id {ann.get('category_id')!r} is not in 'categories' (ids {sorted(id_map)})")
    iscrowd = ann.get("iscrowd", 0)
    if iscrowd not in (0, 1):
        raise _Malformed(f"iscrowd must be 0 or 1, got {iscrowd!r}")
    x, y, w, h = (as_float(v) for v in bbox)
    out = {
        "id": ann["id"],
        "bbox": [x, y, x + w, y + h],
        "category_id": id_map[ann["category_id"]],
        "iscrowd": int(iscrowd),
    }
    if "segmentation" in ann:
        img = images[image_id]
        out["segmentation"] = _parse_segmentation(ann["segmentation"], img["height"], img["width"])
    if "keypoints" in ann:
        out["keypoints"] = _parse_keypoints(ann, keypoint_counts.get(ann["category_id"]))
    return out


def _parse_image(img: Any, index: int, json_file: str) -> dict:
    if not isinstance(img, dict):
        raise ValueError(f"{json_file}: image #{index} must be a json object, got {type(img).__name__}")
    for key, kind in (("id", int), ("file_name", str), ("height", int), ("width", int)):
        if not isinstance(img.get(key), kind) or isinstance(img.get(key), bool):
            raise ValueError(
                f"{json_file}: image #{index} (id {img.get('id')!r}) needs '{key}' of type {kind.__name__}, "
                f"got {img.get(key)!r}"
            )
    problem = image_size_problem(img["width"], img["height"])
    if problem:
        raise ValueError(f"{json_file}: image id {img['id']}: {problem}")
    return img


def read_coco_categories(json_file: str) -> Dict[str, Any]:
    """The metadata a COCO json's categories give, without reading its annotations:
    ``thing_classes``, ``thing_dataset_id_to_contiguous_id`` and, for a keypoint json, the
    keypoint metadata (what ``load_coco_json`` sets with ``dataset_name``)."""
    json_file = os.fspath(json_file)
    data = _read_json(json_file)
    thing_classes, id_map = _parse_categories(data, json_file)
    meta = keypoint_metadata_from_categories(data["categories"], json_file)
    return dict(thing_classes=thing_classes, thing_dataset_id_to_contiguous_id=id_map, **meta)


def load_coco_json(json_file: str, image_root: str, dataset_name: Optional[str] = None) -> List[dict]:
    """Read a COCO instances json into records (see the module docstring for their fields).

    With ``dataset_name``, its metadata gets ``thing_classes`` (category names in id order),
    ``thing_dataset_id_to_contiguous_id`` (json category id -> contiguous id), which the COCO
    evaluator uses to map predictions back, and the keypoint metadata of a keypoint json.
    """
    json_file, image_root = os.fspath(json_file), os.fspath(image_root)
    data = _read_json(json_file)
    thing_classes, id_map = _parse_categories(data, json_file)
    keypoint_meta = keypoint_metadata_from_categories(data["categories"], json_file)
    keypoint_counts = {c["id"]: len(c["keypoints"]) for c in data["categories"] if "keypoints" in c}
    num_keypoints = None  # K of the first annotation with keypoints: all must have the same

    images: Dict[int, dict] = {}
    for i, img in enumerate(data["images"]):
        img = _parse_image(img, i, json_file)
        if img["id"] in images:
            raise ValueError(f"{json_file}: image id {img['id']} appears twice in 'images'")
        images[img["id"]] = img

    anns_by_image: Dict[int, List[dict]] = {i: [] for i in images}
    seen_ids = set()
    drops = DropReport(json_file)
    anns = data.get("annotations", [])  # absent in test-set jsons
    if not isinstance(anns, list):
        raise ValueError(f"{json_file}: 'annotations' must be a list, got {type(anns).__name__}")
    for i, ann in enumerate(anns):
        ann_id = ann.get("id") if isinstance(ann, dict) else None
        where = f"{json_file}: " + (f"annotation id {ann_id}" if ann_id is not None else f"annotation #{i} (no 'id')")
        if ann_id is None:
            raise ValueError(f"{where}: every annotation needs an 'id'")
        if ann_id in seen_ids:
            raise ValueError(f"{where}: annotation ids must be unique, this one appears twice")
        seen_ids.add(ann_id)
        try:
            parsed = _parse_annotation(ann, images, id_map, keypoint_counts)
            if "keypoints" in parsed:
                num_keypoints = num_keypoints or len(parsed["keypoints"]) // 3
                if len(parsed["keypoints"]) != 3 * num_keypoints:
                    raise _Malformed(
                        f"has {len(parsed['keypoints']) // 3} keypoints where earlier annotations have {num_keypoints}"
                    )
        except _Malformed as e:
            raise ValueError(f"{where}: {e}") from None
        img = images[ann["image_id"]]
        reason = coco_annotation_reason(ann, img["width"], img["height"])
        if reason is not None:
            drops.add(reason, ann_id)
            continue
        anns_by_image[ann["image_id"]].append(parsed)
    drops.log()

    records = []
    for image_id, img in images.items():
        records.append(
            {
                "file_name": os.path.join(image_root, img["file_name"]),
                "height": img["height"],
                "width": img["width"],
                "image_id": image_id,
                "annotations": anns_by_image[image_id],
            }
        )
    logger.info("Loaded %d images and %d annotations from %s", len(records), len(seen_ids) - drops.total, json_file)
    if dataset_name is not None:
        MetadataCatalog.get(dataset_name).set(
            thing_classes=thing_classes, thing_dataset_id_to_contiguous_id=id_map, **keypoint_meta
        )
    return records


def register_coco_instances(name: str, metadata: Dict[str, Any], json_file: str, image_root: str) -> None:
    """Register a COCO-format dataset: ``DatasetCatalog.get(name)`` will read ``json_file`` and
    point records at images under ``image_root``. ``metadata`` (may be empty) is added to the
    dataset's metadata together with json_file, image_root and ``evaluator_type="coco"``."""
    if not isinstance(metadata, dict):
        raise TypeError(f"register_coco_instances('{name}'): metadata must be a dict, got {type(metadata).__name__}")
    json_file, image_root = os.fspath(json_file), os.fspath(image_root)
    DatasetCatalog.register(name, lambda: load_coco_json(json_file, image_root, name))
    MetadataCatalog.get(name).set(json_file=json_file, image_root=image_root, evaluator_type="coco", **metadata)
