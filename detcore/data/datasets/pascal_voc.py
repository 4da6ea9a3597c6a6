"""Pascal VOC detection (VOC2007 / VOC2012 layout) -> records, and registering such datasets.

The layout, as the VOC devkit ships it::

    <dirname>/Annotations/<id>.xml          one file per image: size and objects
    <dirname>/ImageSets/Main/<split>.txt    the image ids of a split, one a line
    <dirname>/JPEGImages/<id>.jpg

A record is one image (``image_id`` is its position in the split's list; ``voc_id`` the id in
the file names)::

    {"file_name": ".../JPEGImages/<id>.jpg", "height", "width", "image_id": int, "voc_id": str,
     "annotations": [{"bbox": [x1, y1, x2, y2], "category_id": int, "iscrowd": 0,
                      "difficult": 0 or 1}]}

VOC boxes are 1-based inclusive pixel indices; detcore's boxes are continuous xyxy (no +1), so
``xmin - 1, ymin - 1, xmax, ymax``: a box covering pixels 1..10 is 10 wide either way. Difficult
objects are kept and flagged: training uses them (as detectron2 does; they do not hurt), the
VOC evaluator ignores them as the devkit does. Every structural problem (unparsable XML, a
missing field, an unknown class name, a non-numeric coordinate, an image size that is not a whole
number of pixels) is an error naming the file and the object. An object whose box is unusable
(NaN or infinite coordinates, absurdly far outside the image, empty, or outside the image) is
dropped and logged, by the policy the COCO loader follows (``annotation_checks``); the VOC
evaluator, which reads these records, never sees it.
"""
import logging
import os
import xml.etree.ElementTree as ET
from typing import Callable, List, Optional, Sequence

from ..catalog import DatasetCatalog, MetadataCatalog
from .annotation_checks import DropReport, box_reason, image_size_problem

__all__ = ["VOC_CLASSES", "load_voc_instances", "read_voc_class_names", "register_pascal_voc"]

logger = logging.getLogger(__name__)

VOC_CLASSES = (
    "aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car", "cat", "chair", "cow",
    "diningtable", "dog", "horse", "motorbike", "person", "pottedplant", "sheep", "sofa", "train",
    "tvmonitor",
)


def _text(node: ET.Element, path: str, xml_file: str, what: str) -> str:
    child = node.find(path)
    if child is None or child.text is None or not child.text.strip():
        raise ValueError(f"{xml_file}: {what} has no <{path}>")
    return child.text.strip()


def _number(node: ET.Element, path: str, xml_file: str, what: str) -> float:
    text = _text(node, path, xml_file, what)
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"{xml_file}: {what} <{path}> must be a number, got {text!r}") from None


def _parse_annotation_file(xml_file: str, class_index: dict, drops: DropReport) -> dict:
    try:
        root = ET.parse(xml_file).getroot()
    except FileNotFoundError:
        raise FileNotFoundError(f"VOC annotation file not found: {xml_file}") from None
    except ET.ParseError as e:
        raise ValueError(f"{xml_file} is not valid XML: {e}") from None
    width = _number(root, "size/width", xml_file, "the image")
    height = _number(root, "size/height", xml_file, "the image")
    problem = image_size_problem(width, height)
    if problem:
        raise ValueError(f"{xml_file}: {problem} (<size>)")
    width, height = int(width), int(height)
    annotations = []
    for k, obj in enumerate(root.findall("object")):
        what = f"object #{k}"
        name = _text(obj, "name", xml_file, what)
        if name not in class_index:
            raise ValueError(f"{xml_file}: {what} has class '{name}', which is not one of {list(class_index)}")
        difficult = obj.find("difficult")  # absent on some VOC2012 objects: not difficult
        difficult = _number(obj, "difficult", xml_file, what) if difficult is not None and difficult.text else 0
        if difficult not in (0, 1):
            raise ValueError(f"{xml_file}: {what} ('{name}') <difficult> must be 0 or 1, got {difficult!r}")
        box = obj.find("bndbox")
        if box is None:
            raise ValueError(f"{xml_file}: {what} ('{name}') has no <bndbox>")
        x1, y1, x2, y2 = (_number(box, k, xml_file, f"{what} ('{name}')") for k in ("xmin", "ymin", "xmax", "ymax"))
        bbox = [x1 - 1.0, y1 - 1.0, x2, y2]
        reason = box_reason(*bbox, width, height)
        if reason is not None:
            drops.add(reason, f"{os.path.basename(xml_file)} #{k}")
            continue
        annotations.append(
            {"bbox": bbox, "category_id": class_index[name], "iscrowd": 0, "difficult": int(difficult)}
        )
    return {"height": height, "width": width, "annotations": annotations}


def read_voc_class_names(annotations_dir: str) -> List[str]:
    """The object class names used in ``annotations_dir/*.xml`` (every file, whatever split lists
    it, so that all splits of a folder get the same classes), sorted: the VOC devkit's 20 names
    come out in ``VOC_CLASSES`` order."""
    annotations_dir = os.fspath(annotations_dir)
    if not os.path.isdir(annotations_dir):
        raise FileNotFoundError(f"VOC annotation folder not found: {annotations_dir}")
    names = set()
    for entry in sorted(os.listdir(annotations_dir)):
        if not entry.endswith(".xml"):
            continue
        xml_file = os.path.join(annotations_dir, entry)
        try:
            root = ET.parse(xml_file).getroot()
        except ET.ParseError as e:
            raise ValueError(f"{xml_file} is not valid XML: {e}") from None
        for k, obj in enumerate(root.findall("object")):
            names.add(_text(obj, "name", xml_file, f"object #{k}"))
    if not names:
        raise ValueError(f"No <object> with a <name> in any .xml file of {annotations_dir}: no class names to train on")
    return sorted(names)


def load_voc_instances(dirname: str, split: str, class_names: Sequence[str] = VOC_CLASSES) -> List[dict]:
    """Records of the images listed in ``<dirname>/ImageSets/Main/<split>.txt``."""
    dirname = os.fspath(dirname)
    list_file = os.path.join(dirname, "ImageSets", "Main", f"{split}.txt")
    if not os.path.isfile(list_file):
        raise FileNotFoundError(
            f"VOC image list not found: {list_file} (a VOC folder holds Annotations/, ImageSets/Main/ and JPEGImages/)"
        )
    with open(list_file) as f:
        # Lines are "<id>" (the Main lists) or "<id> <flag>" (the per-class lists): take the id.
        ids = [line.split()[0] for line in f if line.strip()]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{list_file}: an image id is listed twice")
    class_index = {name: i for i, name in enumerate(class_names)}
    drops = DropReport(os.path.join(dirname, "Annotations"), kind="object", ids="objects")
    records = []
    for image_id, voc_id in enumerate(ids):
        record = _parse_annotation_file(os.path.join(dirname, "Annotations", f"{voc_id}.xml"), class_index, drops)
        record.update(
            file_name=os.path.join(dirname, "JPEGImages", f"{voc_id}.jpg"), image_id=image_id, voc_id=voc_id
        )
        records.append(record)
    drops.log()
    n = sum(len(r["annotations"]) for r in records)
    logger.info("Loaded %d images and %d objects from %s (split '%s')", len(records), n, dirname, split)
    return records


def register_pascal_voc(
    name: str,
    dirname: str,
    split: str,
    year: int,
    class_names: Sequence[str] = VOC_CLASSES,
    dirname_fn: Optional[Callable[[], str]] = None,
) -> None:
    """Register a VOC-layout dataset: evaluated by ``PascalVOCDetectionEvaluator``
    (``evaluator_type="pascal_voc"``), with the VOC2007 11-point metric as the headline for
    ``year`` 2007 and the area metric otherwise. ``dirname_fn`` (no arguments, returns the
    folder) replaces ``dirname`` for folders resolved when used, as the built-in names do."""
    if not isinstance(year, int) or year < 2007:
        raise ValueError(f"register_pascal_voc('{name}'): year must be 2007 or later, got {year!r}")
    folder = dirname_fn if dirname_fn is not None else (lambda: os.fspath(dirname))
    DatasetCatalog.register(name, lambda: load_voc_instances(folder(), split, class_names))
    meta = MetadataCatalog.get(name)
    meta.set(thing_classes=list(class_names), split=split, year=year, evaluator_type="pascal_voc")
    meta.set_lazy("dirname", folder)
