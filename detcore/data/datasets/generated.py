"""The cache of generated datasets (``shapes``, ``figures``), under detcore's cache folder
(detcore.utils.cache): writing a split into it so that it appears whole or not at all.

A split is generated into a temporary folder beside its final one and renamed into place at the
end, so a killed generation never leaves a half-written dataset behind, and two processes that
generate the same split at once both end up reading one complete copy.
"""
import json
import os
import shutil
import tempfile
import time
from typing import Callable, List, Optional, Tuple

import cv2
import numpy as np

from detcore.utils.cache import get_cache_dir

__all__ = ["ensure_generated", "get_cache_dir", "write_coco_split", "write_png"]


def write_png(path: str, image: np.ndarray) -> None:
    if not cv2.imwrite(path, image):
        raise OSError(f"could not write {path}")


def write_coco_split(
    out_dir: str,
    num_images: int,
    make_image: Callable[[int], Tuple[np.ndarray, List[dict]]],
    info: dict,
    categories: List[dict],
) -> None:
    """Write ``out_dir/images/NNNNNN.png`` for ``make_image(0 .. num_images - 1)`` (an image and
    its annotations without ids) and ``out_dir/annotations.json`` holding them as COCO json. Not
    atomic by itself: ``ensure_generated`` calls the generators on a temporary folder."""
    image_dir = os.path.join(out_dir, "images")
    os.makedirs(image_dir, exist_ok=True)
    images, annotations = [], []
    for index in range(num_images):
        image, anns = make_image(index)
        file_name = f"{index:06d}.png"
        write_png(os.path.join(image_dir, file_name), image)
        image_id = index + 1  # COCO ids are positive
        images.append({"id": image_id, "file_name": file_name, "height": image.shape[0], "width": image.shape[1]})
        for ann in anns:
            annotations.append({"id": len(annotations) + 1, "image_id": image_id, **ann})
    data = {"info": info, "licenses": [], "images": images, "annotations": annotations, "categories": categories}
    with open(os.path.join(out_dir, "annotations.json"), "w") as f:
        f.write(json.dumps(data))  # dumps uses the C encoder, dump does not


def _remove_stale(cache_dir: str, prefix: str, max_age_s: float = 3600.0) -> None:
    """Delete temporary folders left by killed generations (a live one takes seconds, not an hour)."""
    now = time.time()
    for name in os.listdir(cache_dir):
        path = os.path.join(cache_dir, name)
        try:
            if name.startswith(prefix) and now - os.path.getmtime(path) > max_age_s:
                shutil.rmtree(path, ignore_errors=True)
        except OSError:  # removed meanwhile by another process
            pass


def ensure_generated(dirname: str, generate: Callable[[str], None], cache_dir: Optional[str] = None) -> str:
    """``<cache>/<dirname>``, first made by ``generate(folder)`` if it is not in the cache yet."""
    cache_dir = cache_dir or get_cache_dir()
    final = os.path.join(cache_dir, dirname)
    if os.path.isdir(final):
        return final
    os.makedirs(cache_dir, exist_ok=True)
    prefix = f".{dirname}.tmp-"
    _remove_stale(cache_dir, prefix)
    tmp = tempfile.mkdtemp(prefix=prefix, dir=cache_dir)
    try:
        generate(tmp)
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; the cache is meant to be shared
        try:
            os.rename(tmp, final)  # atomic: the split appears complete or not at all
        except OSError:
            if not os.path.isdir(final):  # not "another process finished first"
                raise
    finally:
        if os.path.isdir(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
    return final
