"""A tiny Cityscapes tree with the official folder names, file names and polygon json format."""
import json
import os

import cv2
import numpy as np
from PIL import Image

from detcore.data.datasets.cityscapes import polygons_to_instance_ids

H, W = 64, 128


def rect(x1, y1, x2, y2):
    """A polygon whose filled pixels are columns x1..x2 and rows y1..y2 (inclusive), as PIL draws it."""
    return [[x1, y1], [x2, y1], [x2, y2], [x1, y2]]


# city -> [(frame name, objects in drawing order)]. Later objects cover earlier ones.
SCENES = {
    "aachen": [
        ("aachen_000000_000019", [
            ("road", rect(0, 40, 127, 63)),
            ("car", rect(10, 10, 29, 19)),            # 20 x 10 = 200 px
            ("car", rect(40, 10, 69, 29)),            # 30 x 20, its right part covered by the person
            ("person", rect(60, 5, 79, 34)),          # 20 x 30 = 600 px, drawn over the car
            ("cargroup", rect(90, 40, 119, 55)),      # a group: crowd
            ("license plate", rect(15, 15, 18, 16)),  # id -1: not drawn
            ("caravan", rect(0, 50, 14, 63)),          # has instances but is not evaluated
        ]),
        ("aachen_000001_000019", [
            ("bicycle", rect(5, 5, 24, 24)),
            ("rider", rect(30, 5, 49, 34)),
        ]),
    ],
    "bochum": [
        ("bochum_000000_000313", [
            ("sky", rect(0, 0, 127, 20)),
            ("truck", rect(20, 20, 59, 49)),
            ("person", rect(70, 30, 84, 59)),
        ]),
    ],
}


def write_cityscapes_tree(root, split="val", scenes=SCENES, with_json=True, with_png=False):
    """``<root>/cityscapes/{leftImg8bit,gtFine}/<split>/<city>/...``; returns (image dir, gt dir).
    The instance-id PNGs, when asked for, are drawn from the json by cityscapesScripts' own
    drawing function and saved 16-bit, as the official ones (its json2instanceImg saves a 32-bit
    image, which recent Pillow cannot write as PNG)."""
    image_dir = os.path.join(root, "cityscapes", "leftImg8bit", split)
    gt_dir = os.path.join(root, "cityscapes", "gtFine", split)
    for city, frames in scenes.items():
        os.makedirs(os.path.join(image_dir, city), exist_ok=True)
        os.makedirs(os.path.join(gt_dir, city), exist_ok=True)
        for k, (base, objects) in enumerate(frames):
            rng = np.random.default_rng(k)
            cv2.imwrite(
                os.path.join(image_dir, city, f"{base}_leftImg8bit.png"),
                rng.integers(0, 256, size=(H, W, 3), dtype=np.uint8),
            )
            polygons = os.path.join(gt_dir, city, f"{base}_gtFine_polygons.json")
            with open(polygons, "w") as f:
                json.dump({"imgHeight": H, "imgWidth": W, "objects": [{"label": label, "polygon": poly} for label, poly in objects]}, f)
            if with_png:
                ids = polygons_to_instance_ids(polygons).astype(np.uint16)
                Image.fromarray(ids).save(os.path.join(gt_dir, city, f"{base}_gtFine_instanceIds.png"))
            if not with_json:
                os.remove(polygons)
    return image_dir, gt_dir
