"""A user's own data, named where a dataset name goes (DATASETS.TRAIN / TEST, the evaluators,
``DatasetCatalog.get``), with no code to register it:

    coco:JSON[:IMAGE_ROOT]   a COCO-format json; its images under IMAGE_ROOT (default: the
                             json's folder)
    voc:FOLDER[:SPLIT]       a Pascal VOC layout folder (Annotations/, ImageSets/Main/SPLIT.txt,
                             JPEGImages/); SPLIT defaults to "train", torchvision's VOCDetection
                             default (detectron2's built-in names use "trainval" and "test": write
                             them out, e.g. voc:VOC2007:trainval)

Paths may hold ':' (the part before the first ':' is the scheme), and the rest is split by
these rules, which look at the text only, never at the disk:

- coco: the json path ends at the first ".json" (any case) that ends the text or is followed by
  ':'; what follows that ':' is IMAGE_ROOT, ':' included. So a json path must end in ".json" and
  must not hold ".json:" before its end.
- voc: the text after the last ':' is SPLIT when it is not empty and holds no '/'; otherwise the
  whole text is FOLDER. A folder whose last component holds ':' is written with a trailing '/'
  (``voc:/data/set:2/`` is the folder ``/data/set:2``, split "train").

Relative paths are taken from the current folder and "~" is expanded, when the name is first
used; the name itself stays as written (it is the dataset's name in logs and in
OUTPUT_DIR/inference/, see ``catalog.dataset_folder_name``).

Registered on first use (``catalog.register_name_scheme``), the data's class names are read
then: a COCO json's categories (in category id order, as ``load_coco_json`` maps them), a VOC
folder's object names over all its Annotations/*.xml (sorted, so every split of a folder agrees
and the devkit's 20 classes come out in VOC order). A missing json, folder or split file is a
``FileNotFoundError`` naming the path. Evaluation: COCO AP for coco:, the VOC AP (area metric;
the 11-point one of VOC2007 when the folder is named VOC2007) for voc:.
"""
import os
import re
from dataclasses import dataclass
from typing import Optional

from ..catalog import register_name_scheme
from .coco import read_coco_categories, register_coco_instances
from .pascal_voc import read_voc_class_names, register_pascal_voc

__all__ = ["DataName", "parse_data_name", "register_data_name", "DEFAULT_VOC_SPLIT", "COCO_SYNTAX", "VOC_SYNTAX"]

COCO_SYNTAX = "coco:JSON[:IMAGE_ROOT]"
VOC_SYNTAX = "voc:FOLDER[:SPLIT]"
DEFAULT_VOC_SPLIT = "train"
_JSON_END = re.compile(r"\.json(?=:|$)", re.IGNORECASE)


@dataclass(frozen=True)
class DataName:
    """A parsed data name: ``kind`` "coco" (``path`` the json, ``image_root`` or None for the
    json's folder) or "voc" (``path`` the folder, ``split``)."""

    kind: str
    path: str
    image_root: Optional[str] = None
    split: Optional[str] = None


def parse_data_name(name: str) -> Optional[DataName]:
    """``name`` split by the module docstring's rules; None when it is not a coco: / voc: name.
    A coco: / voc: name that breaks the rules is a ValueError saying which."""
    scheme, sep, rest = name.partition(":")
    if not sep or scheme not in ("coco", "voc"):
        return None
    if scheme == "coco":
        match = _JSON_END.search(rest)
        if not rest or match is None:
            raise ValueError(
                f"Dataset name '{name}': expected {COCO_SYNTAX}, where the json file's name ends in .json"
            )
        json_file, image_root = rest[: match.end()], rest[match.end() + 1 :]
        if match.end() < len(rest) and not image_root:
            raise ValueError(f"Dataset name '{name}': nothing after the ':' that follows the json (expected {COCO_SYNTAX})")
        return DataName("coco", json_file, image_root=image_root or None)
    folder, sep, split = rest.rpartition(":")
    if not sep or not split or "/" in split:
        folder, split = rest, DEFAULT_VOC_SPLIT
    if not folder:
        raise ValueError(f"Dataset name '{name}': no folder (expected {VOC_SYNTAX})")
    return DataName("voc", folder, split=split)


def _absolute(path: str) -> str:
    return os.path.abspath(os.path.expanduser(path))


def register_data_name(name: str) -> None:
    """Register the coco: / voc: name ``name`` in DatasetCatalog and MetadataCatalog, its class
    names read from the data now."""
    parsed = parse_data_name(name)
    if parsed is None:
        raise ValueError(f"register_data_name: '{name}' is not a data name ({COCO_SYNTAX} or {VOC_SYNTAX})")
    if parsed.kind == "coco":
        _register_coco(name, parsed)
    else:
        _register_voc(name, parsed)


def _register_coco(name: str, parsed: DataName) -> None:
    json_file = _absolute(parsed.path)
    if not os.path.isfile(json_file):
        raise FileNotFoundError(f"Dataset '{name}': COCO json file not found: {json_file}")
    image_root = _absolute(parsed.image_root) if parsed.image_root else os.path.dirname(json_file)
    if not os.path.isdir(image_root):
        default = "" if parsed.image_root else f" (the json's folder; name another one as {COCO_SYNTAX})"
        raise FileNotFoundError(f"Dataset '{name}': image folder not found: {image_root}{default}")
    metadata = read_coco_categories(json_file)
    if not metadata["thing_classes"]:
        raise ValueError(f"Dataset '{name}': {json_file} has no categories, so no classes to train on")
    register_coco_instances(name, metadata, json_file, image_root)


def _register_voc(name: str, parsed: DataName) -> None:
    folder = _absolute(parsed.path)
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"Dataset '{name}': VOC folder not found: {folder}")
    lists = os.path.join(folder, "ImageSets", "Main")
    list_file = os.path.join(lists, f"{parsed.split}.txt")
    if not os.path.isfile(list_file):
        found = sorted(f[:-4] for f in os.listdir(lists) if f.endswith(".txt")) if os.path.isdir(lists) else []
        splits = f"; the splits there: {', '.join(found)}" if found else ""
        raise FileNotFoundError(
            f"Dataset '{name}': split file not found: {list_file} (split '{parsed.split}'{splits}; name one as "
            f"{VOC_SYNTAX})"
        )
    for sub in ("Annotations", "JPEGImages"):
        if not os.path.isdir(os.path.join(folder, sub)):
            raise FileNotFoundError(f"Dataset '{name}': VOC folder has no {sub}/: {os.path.join(folder, sub)}")
    classes = read_voc_class_names(os.path.join(folder, "Annotations"))
    # The year picks the headline metric: the devkit's 11-point AP for VOC2007 only.
    year = 2007 if os.path.basename(folder) == "VOC2007" else 2012
    register_pascal_voc(name, folder, parsed.split, year, class_names=classes)


register_name_scheme("coco", register_data_name, COCO_SYNTAX)
register_name_scheme("voc", register_data_name, VOC_SYNTAX)
