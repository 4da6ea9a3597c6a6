"""A user's own data written to disk as a user would have it: a COCO json with its JPEG images,
or a Pascal VOC folder, made from detcore records (e.g. a shapes split) for the tests of
``coco:`` / ``voc:`` dataset names."""
import json
import os

import cv2

from tests.data.fake_voc import voc_tree_from_records

# The shapes classes (circle, square, triangle) under a user's names and sparse, unordered json ids.
USER_CATEGORIES = [(20, "ring"), (3, "tile"), (11, "wedge")]


def write_coco_set(records, json_file, image_dir, categories=USER_CATEGORIES):
    """Write ``records`` as ``json_file`` (xywh boxes, polygons, areas, category k of the records
    as ``categories[k]``'s id) and their images as JPEGs in ``image_dir``, named relative to it.
    Returns ``json_file``."""
    os.makedirs(image_dir, exist_ok=True)
    os.makedirs(os.path.dirname(json_file), exist_ok=True)
    images, annotations = [], []
    for index, r in enumerate(records):
        file_name = f"photo_{index:03d}.jpg"
        assert cv2.imwrite(os.path.join(image_dir, file_name), cv2.imread(r["file_name"]))
        image_id = 100 + index  # a user's ids: not the records' positions
        images.append({"id": image_id, "file_name": file_name, "height": r["height"], "width": r["width"]})
        for a in r["annotations"]:
            x1, y1, x2, y2 = a["bbox"]
            annotations.append({
                "id": len(annotations) + 1, "image_id": image_id, "category_id": categories[a["category_id"]][0],
                "bbox": [x1, y1, x2 - x1, y2 - y1], "area": (x2 - x1) * (y2 - y1), "iscrowd": a.get("iscrowd", 0),
                "segmentation": a["segmentation"],
            })
    data = {
        "images": images,
        "annotations": annotations,
        "categories": [{"id": cid, "name": name, "supercategory": "shape"} for cid, name in categories],
    }
    with open(json_file, "w") as f:
        json.dump(data, f)
    return json_file


def write_voc_folder(dirname, splits, class_names=("ring", "tile", "wedge")):
    """A VOC folder (Annotations/, ImageSets/Main/<split>.txt, JPEGImages/) of ``splits``: split
    name -> records; category k of the records is written as ``class_names[k]``."""
    return voc_tree_from_records(dirname, splits, list(class_names))
