"""detcore's cache folder: generated datasets, COCO json conversions and downloaded weights all
go under one root, ``$DETCORE_CACHE`` (``~/.cache/detcore`` when unset), read at each use so that
a program (or a test) may set it after import."""
import os

__all__ = ["get_cache_dir"]


def get_cache_dir() -> str:
    """``$DETCORE_CACHE`` if set, else ``~/.cache/detcore``."""
    return os.environ.get("DETCORE_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "detcore")
