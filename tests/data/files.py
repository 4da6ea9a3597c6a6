"""Writing small image and json files for the data tests."""
import json

import cv2
import numpy as np


def write_png(path, h, w, seed=0):
    rng = np.random.default_rng(seed)
    image = rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)
    assert cv2.imwrite(str(path), image)
    return image


def write_json(path, data):
    path.write_text(json.dumps(data))
    return path
