"""Writing a small Pascal VOC tree (the devkit's folder names and XML format) for tests."""
import os
import zlib

import cv2
import numpy as np


def voc_xml(voc_id, width, height, objects, with_size=True):
    """The XML of one image; ``objects``: (class name, (xmin, ymin, xmax, ymax) 1-based, difficult or
    None for no <difficult> tag)."""
    parts = [
        "<annotation>",
        "  <folder>VOC2007</folder>",
        f"  <filename>{voc_id}.jpg</filename>",
        "  <source><database>The VOC2007 Database</database></source>",
    ]
    if with_size:
        parts.append(f"  <size><width>{width}</width><height>{height}</height><depth>3</depth></size>")
    parts.append("  <segmented>0</segmented>")
    for name, (x1, y1, x2, y2), difficult in objects:
        parts += ["  <object>", f"    <name>{name}</name>", "    <pose>Unspecified</pose>", "    <truncated>0</truncated>"]
        if difficult is not None:
            parts.append(f"    <difficult>{int(difficult)}</difficult>")
        parts.append(
            f"    <bndbox><xmin>{x1}</xmin><ymin>{y1}</ymin><xmax>{x2}</xmax><ymax>{y2}</ymax></bndbox>"
        )
        parts.append("  </object>")
    parts.append("</annotation>")
    return "\n".join(parts) + "\n"


def write_voc_tree(dirname, images, splits, image_writer=None):
    """``images``: voc id -> (width, height, objects) as for ``voc_xml``; ``splits``: split name ->
    list of ids. Writes Annotations/, ImageSets/Main/ and JPEGImages/ (plain noise images unless
    ``image_writer(path, voc_id, width, height, objects)`` is given)."""
    for sub in ("Annotations", "ImageSets/Main", "JPEGImages"):
        os.makedirs(os.path.join(dirname, sub), exist_ok=True)
    for voc_id, (width, height, objects) in images.items():
        with open(os.path.join(dirname, "Annotations", f"{voc_id}.xml"), "w") as f:
            f.write(voc_xml(voc_id, width, height, objects))
        path = os.path.join(dirname, "JPEGImages", f"{voc_id}.jpg")
        if image_writer is not None:
            image_writer(path, voc_id, width, height, objects)
        else:
            rng = np.random.default_rng(zlib.crc32(voc_id.encode()))
            cv2.imwrite(path, rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8))
    for split, ids in splits.items():
        with open(os.path.join(dirname, "ImageSets", "Main", f"{split}.txt"), "w") as f:
            f.write("".join(f"{i}\n" for i in ids))
    return dirname


def voc_tree_from_records(dirname, splits, class_names, difficult_below=0):
    """A VOC tree made from detcore records (e.g. a shapes split): each image re-encoded as JPEG,
    each box written 1-based inclusive, boxes smaller than ``difficult_below`` pixels flagged
    difficult. ``splits``: split name -> records; ``class_names``: category_id -> VOC class."""
    images, ids = {}, {}
    for split, records in splits.items():
        ids[split] = []
        for r in records:
            voc_id = f"{split}_{r['image_id']:06d}"
            objects = []
            for a in r["annotations"]:
                x1, y1, x2, y2 = (int(round(v)) for v in a["bbox"])
                objects.append((class_names[a["category_id"]], (x1 + 1, y1 + 1, x2, y2), int((x2 - x1) * (y2 - y1) < difficult_below)))
            images[voc_id] = (r["width"], r["height"], objects, r["file_name"])
            ids[split].append(voc_id)

    def copy_image(path, voc_id, width, height, objects):
        assert cv2.imwrite(path, cv2.imread(images[voc_id][3]))

    write_voc_tree(dirname, {k: v[:3] for k, v in images.items()}, ids, image_writer=copy_image)
    return dirname
