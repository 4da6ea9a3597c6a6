"""The cache of generated datasets (``shapes``, ``figures``): where it lives, and writing a split
into it so that it appears whole or not at all.

A split is generated into a temporary folder beside its final one and renamed into place at the
end, so a killed generation never leaves a half-written dataset behind, and two processes that
generate the same split at once both end up reading one complete copy.
"""
import os
import shutil
import tempfile
import time
from typing import Callable, Optional

import cv2
import numpy as np

__all__ = ["ensure_generated", "get_cache_dir", "write_png"]


def get_cache_dir() -> str:
    """``$DETCORE_CACHE`` if set, else ``~/.cache/detcore``."""
    return os.environ.get("DETCORE_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "detcore")


def write_png(path: str, image: np.ndarray) -> None:
    if not cv2.imwrite(path, image):
        raise OSError(f"could not write {path}")


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
