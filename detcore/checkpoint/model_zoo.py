"""Weights by name: what MODEL.WEIGHTS, ``--model`` and the Python API accept besides a path.

    MODEL.WEIGHTS torchvision/mask_rcnn_R_50_FPN                         a catalog name (catalog.py)
    MODEL.WEIGHTS detectron2/COCO-Keypoints/keypoint_rcnn_R_50_FPN_3x    detectron2's model zoo name
    MODEL.WEIGHTS https://example.org/model-1a2b3c4d.pth                 a URL (sha256 prefix in its name)
    MODEL.WEIGHTS "https://example.org/model.pth#sha256=<hex>"           a URL with its sha256
    MODEL.WEIGHTS detectron2://ImageNetPretrained/MSRA/R-50.pkl          detectron2's own spelling

    cfg = get_config("torchvision/mask_rcnn_R_50_FPN")   # its preset, MODEL.WEIGHTS set to it
    path = resolve_weights(cfg.MODEL.WEIGHTS)             # downloaded (once) and verified: a file

An existing file always wins: a path is used as it is. A URL that is in the catalog (or a
``detectron2://`` path) is its catalog entry, checksum included. Catalog URLs are fetched from
``$DETCORE_WEIGHTS_MIRROR`` when set (download.mirrored); other URLs as given. Files are cached
and verified as download.py says.
"""
import difflib
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import torch

from detcore.config import get_cfg
from detcore.config.presets import config_roots
from detcore.utils import comm

from .catalog import CATALOG, Checksum, ZooEntry
from .download import DownloadError, fetch, mirrored
from .io import read_checkpoint
from .layouts import detect_format

__all__ = [
    "catalog_table",
    "get_config",
    "get_config_file",
    "get_entry",
    "list_models",
    "lookup",
    "metadata",
    "resolve_weights",
    "url_checksum",
]

logger = logging.getLogger(__name__)

_DETECTRON2_SCHEME = "detectron2://"
_DETECTRON2_PREFIX = "https://dl.fbaipublicfiles.com/detectron2/"  # detectron2 model_zoo.py S3_PREFIX
_PUBLISHERS = ("torchvision/", "detectron2/")
# torch's convention: "name-<sha256 prefix>.ext" (torch.hub HASH_REGEX); 8 digits at least here,
# so that a name like "model-2020.pth" is not read as a checksum.
_HASH_IN_NAME = re.compile(r"-([0-9a-f]{8,64})\.[^-/]*$")
_FRAGMENT = re.compile(r"^sha256=([0-9a-fA-F]+)$")


def _canonical(name: str) -> str:
    name = name.strip()
    for prefix in ("configs/", "./configs/"):
        if name.startswith(prefix):
            name = name[len(prefix):]
    return name[: -len(".yaml")] if name.endswith(".yaml") else name


def _names() -> Dict[str, str]:
    """Every name and alias -> the entry's name."""
    names = {}
    for entry in CATALOG.values():
        names[entry.name] = entry.name
        for alias in entry.aliases:
            names.setdefault(alias, entry.name)
    return names


def list_models() -> List[str]:
    """The catalog's names, sorted."""
    return sorted(CATALOG)


def get_entry(name: str) -> ZooEntry:
    """The catalog entry called ``name`` (or one of its aliases; a ".yaml" suffix and a "configs/"
    prefix are ignored, so a preset's path names its weights). KeyError naming the closest
    names if there is none."""
    key = _canonical(name)
    found = _names().get(key)
    if found is None:
        close = difflib.get_close_matches(key, list(_names()), n=4, cutoff=0.5)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise KeyError(f"no model called {name!r} in detcore's catalog{hint} (all names: detcore.checkpoint.model_zoo.list_models())")
    return CATALOG[found]


def _entry_by_url(url: str) -> Optional[ZooEntry]:
    for entry in CATALOG.values():
        if entry.url == url:
            return entry
    return None


def url_checksum(url: str) -> Tuple[str, Optional[Checksum]]:
    """``url`` without its fragment, and the checksum it carries: a ``#sha256=<hex>`` fragment
    (the whole digest or at least 8 digits of it), else torch's ``name-<sha256 prefix>.ext``."""
    base, _, fragment = url.partition("#")
    if fragment:
        m = _FRAGMENT.match(fragment)
        if m is None or not 8 <= len(m[1]) <= 64:
            raise ValueError(f"the fragment of weights URL {url!r} must be #sha256=<8 to 64 hex digits>, got #{fragment}")
        return base, Checksum("sha256", m[1])
    name = base.split("?", 1)[0].rsplit("/", 1)[-1]
    m = _HASH_IN_NAME.search(name)
    return base, (Checksum("sha256", m[1]) if m else None)


@dataclass(frozen=True)
class _Remote:
    url: str                    # what to download
    cache_url: str              # what names it in the cache: the publisher's URL
    checksum: Optional[Checksum]
    entry: Optional[ZooEntry]


def lookup(spec: str) -> Optional[ZooEntry]:
    """The catalog entry MODEL.WEIGHTS ``spec`` stands for (a name, alias, catalog URL or
    ``detectron2://`` path), or None (a path, or a URL outside the catalog)."""
    if not spec or os.path.exists(spec):
        return None
    if spec.startswith(_DETECTRON2_SCHEME):
        spec = _DETECTRON2_PREFIX + spec[len(_DETECTRON2_SCHEME):]
    if spec.startswith(("https://", "http://")):
        return _entry_by_url(spec.partition("#")[0])
    try:
        return get_entry(spec)
    except KeyError:
        return None


def _remote(spec: str) -> Optional[_Remote]:
    """What to fetch for ``spec``; None for a local path. FileNotFoundError for a name under
    "torchvision/" or "detectron2/" that is neither a file nor in the catalog."""
    if os.path.exists(spec):
        return None
    entry = lookup(spec)
    if entry is not None:
        return _Remote(mirrored(entry.url), entry.url, entry.checksum, entry)
    if spec.startswith(_DETECTRON2_SCHEME):
        spec = _DETECTRON2_PREFIX + spec[len(_DETECTRON2_SCHEME):]
    if spec.startswith(("https://", "http://")):
        url, checksum = url_checksum(spec)
        return _Remote(url, url, checksum, None)
    if spec.startswith(_PUBLISHERS) and not os.path.splitext(spec)[1] in (".pth", ".pkl", ".pt"):
        try:
            get_entry(spec)
        except KeyError as e:
            raise FileNotFoundError(f"MODEL.WEIGHTS {spec!r} is no file, and {e.args[0]}") from None
    return None


def _layout_check(format: str):
    """A check for files whose publisher gives no checksum: they must read safely and be of the
    layout the catalog names."""

    def check(path: Path) -> None:
        state_dict, _ = read_checkpoint(path)
        found = detect_format(state_dict)
        if found != format:
            raise ValueError(f"it is a {found} checkpoint, where the catalog expects {format}")

    return check


def _fetch(remote: _Remote, progress: bool) -> str:
    check = None
    if remote.entry is not None and remote.checksum is None:
        check = _layout_check(remote.entry.format)
    return str(fetch(remote.url, checksum=remote.checksum, check=check, cache_url=remote.cache_url, progress=progress))


def resolve_weights(spec: str, *, all_ranks: bool = False, progress: bool = True) -> str:
    """The local file MODEL.WEIGHTS ``spec`` stands for: a path as it is; a catalog name or a
    URL downloaded into the cache (once) and verified (see the module docstring).

    Args:
        all_ranks: every rank of the torch.distributed process group calls this together (the
            trainer's weights loading, test_net): rank 0 fetches first while the others wait at a
            collective, then they find its file (same machine, or a cache folder the machines
            share) or, with a cache of their own, fetch it too (one process per machine, under
            the cache's file lock). A failure on rank 0 is raised on every rank. Without it,
            processes that fetch the same file at once still take turns through the file lock.
        progress: show download progress.
    """
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"MODEL.WEIGHTS must be a path, a catalog name or a URL, got {spec!r}")
    remote = _remote(spec)
    if remote is None:
        return spec
    if not all_ranks or comm.get_world_size() == 1:
        return _fetch(remote, progress)
    path, failure = None, None
    if comm.get_rank() == 0:
        try:
            path = _fetch(remote, progress)
        except Exception as e:  # every rank must reach the collective below, then raise
            failure = e
    outcomes = comm.all_gather(None if failure is None else f"{type(failure).__name__}: {failure}")
    if failure is not None:
        raise failure
    if outcomes[0] is not None:
        raise DownloadError(f"rank 0 could not fetch MODEL.WEIGHTS {spec!r}: {outcomes[0]}")
    return path if path is not None else _fetch(remote, progress)


# --- presets and class names ------------------------------------------------------------------------
def _config_roots() -> List[Path]:
    """Folders the presets may be in: inside the installed package, then the source tree's configs/."""
    return config_roots()


def get_config_file(name: str) -> str:
    """The path of the preset config of catalog entry ``name`` (a name, alias, catalog URL or
    ``detectron2://`` path)."""
    entry = lookup(name) or get_entry(name)
    if entry.config is None:
        raise ValueError(
            f"{entry.name} has no preset config in detcore (it is an ImageNet body): give one with "
            f"--config-file and MODEL.WEIGHTS {entry.name}"
        )
    for root in _config_roots():
        path = root / entry.config
        if path.is_file():
            return str(path)
    raise FileNotFoundError(f"the preset {entry.config} of {entry.name} is in none of {[str(r) for r in _config_roots()]}")


def get_config(name: str, device: Optional[str] = None):
    """The preset config of catalog entry ``name`` with MODEL.WEIGHTS set to it (for an
    ImageNet body: the preset that trains from it). MODEL.DEVICE becomes ``device`` when given;
    otherwise a preset asking for CUDA on a machine without it gets "cpu"."""
    entry = lookup(name) or get_entry(name)
    cfg = get_cfg()
    cfg.merge_from_file(get_config_file(entry.name))
    cfg.MODEL.WEIGHTS = entry.name
    if device is not None:
        cfg.MODEL.DEVICE = device
    elif cfg.MODEL.DEVICE.startswith("cuda") and not torch.cuda.is_available():
        logger.info("%s: no CUDA GPU here, running on the CPU (MODEL.DEVICE cpu)", entry.name)
        cfg.MODEL.DEVICE = "cpu"
    return cfg


def metadata(name: str) -> Dict[str, Any]:
    """What the model of catalog entry ``name`` (or MODEL.WEIGHTS spelling) predicts, as dataset
    metadata: ``thing_classes`` (in the model's class order) and, for keypoint models,
    ``keypoint_names`` / ``keypoint_skeleton`` / ``keypoint_flip_map`` / ``keypoint_oks_sigmas``.
    Empty for an ImageNet body."""
    from detcore.data.datasets.builtin import COCO_CATEGORIES
    from detcore.data.datasets.keypoint_meta import coco_person_keypoint_metadata

    entry = lookup(name) or get_entry(name)
    if entry.classes == "coco":
        return {"thing_classes": [n for _, n in COCO_CATEGORIES]}
    if entry.classes == "coco_category_ids":
        by_id = dict(COCO_CATEGORIES)
        return {"thing_classes": [by_id.get(i, "N/A") for i in range(1, 91)]}
    if entry.classes == "coco_person":
        return {"thing_classes": ["person"], **coco_person_keypoint_metadata()}
    return {}


def catalog_table() -> str:
    """The catalog as a markdown table: name, preset, classes, checksum and URL of each entry."""
    rows = ["| name | preset (configs/) | classes | checksum | URL |", "|---|---|---|---|---|"]
    for entry in CATALOG.values():
        checksum = f"{entry.checksum.algorithm} `{entry.checksum.prefix}`" if entry.checksum else "none published: layout checked"
        rows.append(
            f"| `{entry.name}` | {entry.config or '-'} | {entry.classes or '- (ImageNet body)'} | {checksum} | {entry.url} |"
        )
    return "\n".join(rows)
