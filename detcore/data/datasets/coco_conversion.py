"""Records ("dataset dicts") -> a COCO instances json, so that any registered dataset can be
scored by the COCO evaluator (pycocotools needs a json ground truth).

    path = convert_to_coco_json("my_dataset", output_dir)   # converted once, then reused

The json is cached as ``<output_dir>/<name>_coco_format_<hash>.json``: the hash is taken over
the records' content and the class names, so a changed dataset (an edited box, a new image, a
renamed class) gets a new file and an unchanged one reuses the old, whatever the timestamps say.
The file is written to a temporary name and renamed into place, so a killed run never leaves a
half-written json for the next one to trust; older conversions of the same name are removed.

What is converted, per annotation: the box (records are xyxy, COCO is xywh), ``category_id``
(contiguous ``0..K-1`` -> the dataset's ids through ``thing_dataset_id_to_contiguous_id`` when
the metadata has it, else unchanged), ``iscrowd``, and the segmentation: polygons and RLE dicts
as they are, a bitmask (``[H, W]`` array) as compressed RLE; keypoints (records hold pixel
centers) as COCO's pixel indices, with their ``num_keypoints``. ``area`` is the annotation's own
when it has one, else the segmentation's pixel area, else the box's (``annotation_area``).
"""
import hashlib
import json
import logging
import numbers
import os
import tempfile
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import pycocotools.mask as mask_util

from ..catalog import DatasetCatalog, MetadataCatalog

__all__ = ["annotation_area", "convert_to_coco_dict", "convert_to_coco_json"]

logger = logging.getLogger(__name__)

# Bump when the json written for the same records changes, so old caches are not reused.
_FORMAT_VERSION = 2  # 2: keypoints
_HASH_CHARS = 16


def annotation_area(segmentation: Any, bbox_xywh: Sequence[float], height: int, width: int) -> float:
    """COCO "area" of an annotation: pixels of its segmentation (polygons or RLE, rasterized by
    pycocotools; several polygons add up), or ``w * h`` of its box when it has none."""
    if segmentation is None or (isinstance(segmentation, list) and not segmentation):
        return float(bbox_xywh[2] * bbox_xywh[3])
    if isinstance(segmentation, list):
        rles = mask_util.frPyObjects(segmentation, height, width)
    elif isinstance(segmentation.get("counts"), list):  # uncompressed RLE
        rles = [mask_util.frPyObjects(segmentation, height, width)]
    else:
        rles = [segmentation]
    return float(sum(mask_util.area(rles)))


def _bitmask_to_rle(mask: np.ndarray, where: str, height: int, width: int) -> dict:
    if mask.ndim != 2 or tuple(mask.shape) != (height, width):
        raise ValueError(f"{where}: a bitmask segmentation must be [H, W] = [{height}, {width}], got {mask.shape}")
    rle = mask_util.encode(np.asfortranarray(mask.astype(np.uint8)))
    rle["counts"] = rle["counts"].decode("ascii")
    return rle


def _segmentation(segm: Any, where: str, height: int, width: int) -> Any:
    if hasattr(segm, "numpy") and callable(segm.numpy):  # a torch tensor
        segm = segm.detach().cpu().numpy()
    if isinstance(segm, np.ndarray):
        return _bitmask_to_rle(segm, where, height, width)
    if isinstance(segm, dict):
        if "counts" not in segm or "size" not in segm:
            raise ValueError(f"{where}: an RLE segmentation needs 'counts' and 'size', got keys {sorted(segm)}")
        counts = segm["counts"]
        if isinstance(counts, bytes):
            counts = counts.decode("ascii")
        return {"size": [int(v) for v in segm["size"]], "counts": counts}
    if isinstance(segm, (list, tuple)):
        polygons = [[float(v) for v in poly] for poly in segm]
        if any(len(p) < 6 or len(p) % 2 for p in polygons):
            raise ValueError(f"{where}: every polygon needs 3 or more (x, y) points")
        return polygons
    raise ValueError(
        f"{where}: segmentation must be polygons, an RLE dict or an [H, W] bitmask, got {type(segm).__name__}"
    )


def _keypoints(keypoints: Any, where: str) -> List[float]:
    """A record's keypoints (pixel centers, [K, 3] or flat) as COCO's flat pixel indices."""
    kp = np.asarray(keypoints.detach().cpu() if hasattr(keypoints, "detach") else keypoints, dtype=np.float64)
    if kp.size % 3 or kp.size == 0 or not np.isfinite(kp).all():
        raise ValueError(f"{where}: keypoints must be finite (x, y, visibility) triplets, got shape {kp.shape}")
    kp = kp.reshape(-1, 3).copy()
    labeled = kp[:, 2] > 0
    kp[labeled, :2] -= 0.5  # the loader's +0.5 undone
    kp[~labeled] = 0
    return kp.reshape(-1).tolist()


def _real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def convert_to_coco_dict(
    records: Sequence[dict],
    thing_classes: Sequence[str],
    dataset_id_to_contiguous_id: Optional[Dict[int, int]] = None,
    dataset_name: str = "dataset",
) -> dict:
    """A COCO instances dict (``images``, ``annotations``, ``categories``) of ``records``.

    Every record needs an int ``image_id`` (unique), ``height`` and ``width``; annotations need
    ``bbox`` (xyxy) and ``category_id`` in ``[0, len(thing_classes))``. Errors name the dataset,
    the image and the annotation.
    """
    num_classes = len(thing_classes)
    if dataset_id_to_contiguous_id:
        to_dataset_id = {int(v): int(k) for k, v in dataset_id_to_contiguous_id.items()}
    else:
        to_dataset_id = {i: i for i in range(num_classes)}
    if sorted(to_dataset_id) != list(range(num_classes)):
        raise ValueError(
            f"'{dataset_name}': thing_dataset_id_to_contiguous_id must map onto 0..{num_classes - 1} "
            f"(one per thing class), got contiguous ids {sorted(to_dataset_id)}"
        )
    categories = [{"id": to_dataset_id[i], "name": str(name)} for i, name in enumerate(thing_classes)]

    images, annotations, seen = [], [], set()
    for index, record in enumerate(records):
        image_id = record.get("image_id")
        where = f"'{dataset_name}' record #{index} ({record.get('file_name', 'no file_name')})"
        if not isinstance(image_id, int) or isinstance(image_id, bool):
            raise ValueError(f"{where}: needs an int 'image_id' to be evaluated, got {image_id!r}")
        if image_id in seen:
            raise ValueError(f"{where}: image_id {image_id} is used by two records")
        seen.add(image_id)
        height, width = record.get("height"), record.get("width")
        if not (isinstance(height, int) and isinstance(width, int) and height > 0 and width > 0):
            raise ValueError(f"{where}: needs positive int 'height' and 'width', got {height!r} x {width!r}")
        images.append({"id": image_id, "file_name": str(record.get("file_name", "")), "height": height, "width": width})

        for k, ann in enumerate(record.get("annotations", [])):
            ann_where = f"{where}, annotation {ann.get('id', '#' + str(k))}"
            bbox = ann.get("bbox")
            if not (isinstance(bbox, (list, tuple, np.ndarray)) and len(bbox) == 4 and all(_real(v) for v in bbox)):
                raise ValueError(f"{ann_where}: bbox must be 4 numbers [x1, y1, x2, y2], got {bbox!r}")
            x1, y1, x2, y2 = (float(v) for v in bbox)
            cls = ann.get("category_id")
            if not isinstance(cls, int) or not 0 <= cls < num_classes:
                raise ValueError(f"{ann_where}: category_id must be an int in [0, {num_classes}), got {cls!r}")
            out = {
                "id": len(annotations) + 1,  # COCOeval treats id 0 as "unmatched": start at 1
                "image_id": image_id,
                "category_id": to_dataset_id[cls],
                "bbox": [x1, y1, x2 - x1, y2 - y1],
                "iscrowd": int(ann.get("iscrowd", 0)),
            }
            segm = None
            if "segmentation" in ann:
                segm = out["segmentation"] = _segmentation(ann["segmentation"], ann_where, height, width)
            if "keypoints" in ann:
                out["keypoints"] = _keypoints(ann["keypoints"], ann_where)
                out["num_keypoints"] = sum(1 for v in out["keypoints"][2::3] if v > 0)
            area = ann.get("area")
            out["area"] = float(area) if _real(area) else annotation_area(segm, out["bbox"], height, width)
            annotations.append(out)

    return {
        "info": {"description": f"'{dataset_name}' converted from detcore records"},
        "images": images,
        "annotations": annotations,
        "categories": categories,
    }


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return {"ndarray": obj.shape, "dtype": str(obj.dtype), "sha1": hashlib.sha1(obj.tobytes()).hexdigest()}
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, bytes):
        return obj.decode("latin-1")
    if hasattr(obj, "numpy") and callable(obj.numpy):
        return _json_default(obj.detach().cpu().numpy())
    raise TypeError(f"cannot hash a {type(obj).__name__} in a record")


def _content_hash(records: Sequence[dict], thing_classes: Sequence[str], mapping: Optional[Dict[int, int]]) -> str:
    digest = hashlib.sha256()
    header = {"version": _FORMAT_VERSION, "classes": list(thing_classes), "mapping": sorted((mapping or {}).items())}
    digest.update(json.dumps(header, sort_keys=True, default=_json_default).encode())
    for record in records:
        # Only what the json is made of: a new mapper-only field does not invalidate the cache.
        fields = {k: record.get(k) for k in ("image_id", "file_name", "height", "width", "annotations")}
        digest.update(json.dumps(fields, sort_keys=True, default=_json_default).encode())
    return digest.hexdigest()[:_HASH_CHARS]


def convert_to_coco_json(
    dataset_name: str,
    output_dir: str,
    records: Optional[List[dict]] = None,
    metadata: Any = None,
) -> str:
    """The path of a COCO json of ``dataset_name`` in ``output_dir``, converted now or reused.

    ``records`` default to ``DatasetCatalog.get(dataset_name)``, ``metadata`` (for
    ``thing_classes`` and ``thing_dataset_id_to_contiguous_id``) to its ``MetadataCatalog`` entry.
    """
    if records is None:
        records = DatasetCatalog.get(dataset_name)
    if metadata is None:
        metadata = MetadataCatalog.get(dataset_name)
    get = metadata.get if isinstance(metadata, dict) else lambda key: getattr(metadata, key, None)
    thing_classes = get("thing_classes")
    if not thing_classes:
        raise ValueError(
            f"Dataset '{dataset_name}' has no thing_classes in its metadata: set them "
            f"(MetadataCatalog.get('{dataset_name}').thing_classes = [...]) to evaluate it with COCO AP"
        )
    mapping = get("thing_dataset_id_to_contiguous_id")
    safe_name = "".join(c if c.isalnum() or c in "-_." else "_" for c in dataset_name)
    prefix = f"{safe_name}_coco_format_"
    path = os.path.join(output_dir, f"{prefix}{_content_hash(records, thing_classes, mapping)}.json")
    if os.path.isfile(path):
        logger.info("Reusing the COCO json of '%s' (same content hash): %s", dataset_name, path)
        return path

    coco = convert_to_coco_dict(records, thing_classes, mapping, dataset_name)
    os.makedirs(output_dir, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=".json.tmp", dir=output_dir)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(coco, f)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    for name in os.listdir(output_dir):  # older conversions of this dataset
        if name.startswith(prefix) and name.endswith(".json") and os.path.join(output_dir, name) != path:
            os.remove(os.path.join(output_dir, name))
    logger.info(
        "Converted '%s' to a COCO json (%d images, %d annotations): %s",
        dataset_name, len(coco["images"]), len(coco["annotations"]), path,
    )
    return path
