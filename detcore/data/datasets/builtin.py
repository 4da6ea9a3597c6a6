"""The datasets every detcore process knows by name: ``coco_2017_{train,val}``,
``coco_2014_{train,val}``, their person keypoints ``coco_{2017,2014}_{train,val}_person``,
``voc_2007_{trainval,train,val,test}``, ``voc_2012_{trainval,train,val}``,
``cityscapes_fine_instance_seg_{train,val}``, ``shapes_{train,val}`` and ``figures_{train,val}``.

COCO, VOC and Cityscapes are looked for under the data root, resolved when the dataset is used (not at
import): ``cfg.DATASETS.ROOT`` when set (the loader builders pass it to ``set_datasets_root``),
else ``$DETCORE_DATASETS``, else ``./datasets``; with the usual layouts::

    <root>/coco/annotations/instances_train2017.json
    <root>/coco/annotations/person_keypoints_train2017.json
    <root>/coco/train2017/*.jpg
    <root>/VOC2007/{Annotations,ImageSets,JPEGImages}/   (VOCdevkit/VOC2007 of the devkit tar)
    <root>/VOC2012/{Annotations,ImageSets,JPEGImages}/
    <root>/cityscapes/leftImg8bit/train/<city>/*_leftImg8bit.png
    <root>/cityscapes/gtFine/train/<city>/*_gtFine_polygons.json (or *_gtFine_instanceIds.png)

The shapes and figures splits are generated into the cache on first use (see ``shapes.py``,
``figures.py``).
"""
import os
from typing import Optional

from ..catalog import DatasetCatalog, MetadataCatalog
from .cityscapes import CITYSCAPES_INSTANCE_CLASSES, load_cityscapes_instances
from .coco import load_coco_json
from .figures import FIGURE_FLIP_MAP, FIGURE_KEYPOINT_NAMES, FIGURE_OKS_SIGMAS, FIGURE_SKELETON, FiguresSpec
from .figures import ensure_figures_dataset
from .keypoint_meta import coco_person_keypoint_metadata
from .pascal_voc import register_pascal_voc
from .shapes import SHAPES_CLASSES, ShapesSpec, ensure_shapes_dataset

__all__ = [
    "get_datasets_root", "set_datasets_root", "register_cityscapes_instances", "register_figures", "register_shapes",
    "COCO_CATEGORIES",
]

_ENV_VAR = "DETCORE_DATASETS"
_root_override: Optional[str] = None

# (json category id, name) of the 80 COCO thing classes; ids are sparse, as in the json.
COCO_CATEGORIES = [
    (1, "person"), (2, "bicycle"), (3, "car"), (4, "motorcycle"), (5, "airplane"), (6, "bus"),
    (7, "train"), (8, "truck"), (9, "boat"), (10, "traffic light"), (11, "fire hydrant"),
    (13, "stop sign"), (14, "parking meter"), (15, "bench"), (16, "bird"), (17, "cat"), (18, "dog"),
    (19, "horse"), (20, "sheep"), (21, "cow"), (22, "elephant"), (23, "bear"), (24, "zebra"),
    (25, "giraffe"), (27, "backpack"), (28, "umbrella"), (31, "handbag"), (32, "tie"),
    (33, "suitcase"), (34, "frisbee"), (35, "skis"), (36, "snowboard"), (37, "sports ball"),
    (38, "kite"), (39, "baseball bat"), (40, "baseball glove"), (41, "skateboard"), (42, "surfboard"),
    (43, "tennis racket"), (44, "bottle"), (46, "wine glass"), (47, "cup"), (48, "fork"), (49, "knife"),
    (50, "spoon"), (51, "bowl"), (52, "banana"), (53, "apple"), (54, "sandwich"), (55, "orange"),
    (56, "broccoli"), (57, "carrot"), (58, "hot dog"), (59, "pizza"), (60, "donut"), (61, "cake"),
    (62, "chair"), (63, "couch"), (64, "potted plant"), (65, "bed"), (67, "dining table"),
    (70, "toilet"), (72, "tv"), (73, "laptop"), (74, "mouse"), (75, "remote"), (76, "keyboard"),
    (77, "cell phone"), (78, "microwave"), (79, "oven"), (80, "toaster"), (81, "sink"),
    (82, "refrigerator"), (84, "book"), (85, "clock"), (86, "vase"), (87, "scissors"),
    (88, "teddy bear"), (89, "hair drier"), (90, "toothbrush"),
]

# name -> (image folder, annotation json), relative to <root>/coco.
_COCO_SPLITS = {
    "coco_2017_train": ("train2017", "annotations/instances_train2017.json"),
    "coco_2017_val": ("val2017", "annotations/instances_val2017.json"),
    "coco_2014_train": ("train2014", "annotations/instances_train2014.json"),
    "coco_2014_val": ("val2014", "annotations/instances_val2014.json"),
    # Person keypoints: the same images, the "person" category with its 17 keypoints.
    "coco_2017_train_person": ("train2017", "annotations/person_keypoints_train2017.json"),
    "coco_2017_val_person": ("val2017", "annotations/person_keypoints_val2017.json"),
    "coco_2014_train_person": ("train2014", "annotations/person_keypoints_train2014.json"),
    "coco_2014_val_person": ("val2014", "annotations/person_keypoints_val2014.json"),
}

# name -> (folder under the root, split, year).
_VOC_SPLITS = {
    "voc_2007_trainval": ("VOC2007", "trainval", 2007),
    "voc_2007_train": ("VOC2007", "train", 2007),
    "voc_2007_val": ("VOC2007", "val", 2007),
    "voc_2007_test": ("VOC2007", "test", 2007),
    "voc_2012_trainval": ("VOC2012", "trainval", 2012),
    "voc_2012_train": ("VOC2012", "train", 2012),
    "voc_2012_val": ("VOC2012", "val", 2012),
}

_CITYSCAPES_SPLITS = {"cityscapes_fine_instance_seg_train": "train", "cityscapes_fine_instance_seg_val": "val"}

_SHAPES_SPLITS = {
    "shapes_train": ShapesSpec(split="train", num_images=800),
    "shapes_val": ShapesSpec(split="val", num_images=100),
}

_FIGURES_SPLITS = {
    "figures_train": FiguresSpec(split="train", num_images=600),
    "figures_val": FiguresSpec(split="val", num_images=100),
}


def set_datasets_root(root: Optional[str]) -> None:
    """Use ``root`` as the data root from now on (``None`` or "": back to the env var / default)."""
    global _root_override
    _root_override = os.fspath(root) if root else None


def get_datasets_root() -> str:
    """``set_datasets_root``'s value, else ``$DETCORE_DATASETS``, else ``./datasets``."""
    return _root_override or os.environ.get(_ENV_VAR) or "datasets"


def _coco_paths(name: str, check: bool = False):
    image_dir, json_rel = _COCO_SPLITS[name]
    root = get_datasets_root()
    json_file = os.path.join(root, "coco", json_rel)
    image_root = os.path.join(root, "coco", image_dir)
    if check:
        for path, what in ((json_file, "annotation file"), (image_root, "image folder")):
            if not os.path.exists(path):
                raise FileNotFoundError(
                    f"Dataset '{name}': {what} not found at {os.path.abspath(path)}. The data root is "
                    f"cfg.DATASETS.ROOT if set, else ${_ENV_VAR}, else ./datasets (now: '{root}'); it must "
                    f"hold coco/{json_rel} and coco/{image_dir}/"
                )
    return json_file, image_root


def _register_coco(name: str) -> None:
    DatasetCatalog.register(name, lambda: load_coco_json(*_coco_paths(name, check=True), dataset_name=name))
    meta = MetadataCatalog.get(name)
    if name.endswith("_person"):
        # What the json's person category says, known before it is read (for drawing, flips).
        meta.set(thing_classes=["person"], thing_dataset_id_to_contiguous_id={1: 0}, **coco_person_keypoint_metadata())
    else:
        meta.set(
            thing_classes=[n for _, n in COCO_CATEGORIES],
            thing_dataset_id_to_contiguous_id={cid: i for i, (cid, _) in enumerate(COCO_CATEGORIES)},
        )
    meta.set(evaluator_type="coco")
    meta.set_lazy("json_file", lambda: _coco_paths(name)[0])
    meta.set_lazy("image_root", lambda: _coco_paths(name)[1])


def _voc_dir(name: str) -> str:
    folder, split, _ = _VOC_SPLITS[name]
    root = get_datasets_root()
    path = os.path.join(root, folder)
    if not os.path.isdir(path):
        raise FileNotFoundError(
            f"Dataset '{name}': folder not found at {os.path.abspath(path)}. The data root is "
            f"cfg.DATASETS.ROOT if set, else ${_ENV_VAR}, else ./datasets (now: '{root}'); it must hold "
            f"{folder}/Annotations, {folder}/ImageSets/Main/{split}.txt and {folder}/JPEGImages"
        )
    return path


def _cityscapes_dirs(name: str, check: bool = False):
    split = _CITYSCAPES_SPLITS[name]
    root = get_datasets_root()
    image_dir = os.path.join(root, "cityscapes", "leftImg8bit", split)
    gt_dir = os.path.join(root, "cityscapes", "gtFine", split)
    if check:
        for path in (image_dir, gt_dir):
            if not os.path.isdir(path):
                raise FileNotFoundError(
                    f"Dataset '{name}': folder not found at {os.path.abspath(path)}. The data root is "
                    f"cfg.DATASETS.ROOT if set, else ${_ENV_VAR}, else ./datasets (now: '{root}'); it must hold "
                    f"cityscapes/leftImg8bit/{split}/ and cityscapes/gtFine/{split}/"
                )
    return image_dir, gt_dir


def register_cityscapes_instances(name: str, image_dir: str, gt_dir: str) -> None:
    """Register a Cityscapes-layout instance segmentation split (``cityscapes.py``): evaluated
    with Cityscapes' instance AP and COCO AP (``evaluator_type="cityscapes_instance"``)."""
    image_dir, gt_dir = os.fspath(image_dir), os.fspath(gt_dir)
    DatasetCatalog.register(name, lambda: load_cityscapes_instances(image_dir, gt_dir))
    MetadataCatalog.get(name).set(
        thing_classes=list(CITYSCAPES_INSTANCE_CLASSES), image_dir=image_dir, gt_dir=gt_dir,
        evaluator_type="cityscapes_instance",
    )


def _register_builtin_cityscapes(name: str) -> None:
    DatasetCatalog.register(name, lambda: load_cityscapes_instances(*_cityscapes_dirs(name, check=True)))
    meta = MetadataCatalog.get(name)
    meta.set(thing_classes=list(CITYSCAPES_INSTANCE_CLASSES), evaluator_type="cityscapes_instance")
    meta.set_lazy("image_dir", lambda: _cityscapes_dirs(name)[0])
    meta.set_lazy("gt_dir", lambda: _cityscapes_dirs(name)[1])


def register_shapes(name: str, spec: ShapesSpec, cache_dir: Optional[str] = None) -> None:
    """Register a shapes split under ``name``; it is generated into ``cache_dir`` (default:
    ``$DETCORE_CACHE`` or ``~/.cache/detcore``, read when first used) the first time its
    records or its json_file / image_root are asked for."""

    def folder() -> str:
        return ensure_shapes_dataset(spec, cache_dir)

    DatasetCatalog.register(
        name, lambda: load_coco_json(os.path.join(folder(), "annotations.json"), os.path.join(folder(), "images"), name)
    )
    meta = MetadataCatalog.get(name)
    meta.set(
        thing_classes=list(SHAPES_CLASSES),
        thing_dataset_id_to_contiguous_id={i + 1: i for i in range(len(SHAPES_CLASSES))},
        evaluator_type="coco",
    )
    meta.set_lazy("json_file", lambda: os.path.join(folder(), "annotations.json"))
    meta.set_lazy("image_root", lambda: os.path.join(folder(), "images"))


def register_figures(name: str, spec: FiguresSpec, cache_dir: Optional[str] = None) -> None:
    """Register a figures split (keypoints) under ``name``; generated into ``cache_dir`` (default:
    ``$DETCORE_CACHE`` or ``~/.cache/detcore``) the first time it is used."""

    def folder() -> str:
        return ensure_figures_dataset(spec, cache_dir)

    DatasetCatalog.register(
        name, lambda: load_coco_json(os.path.join(folder(), "annotations.json"), os.path.join(folder(), "images"), name)
    )
    meta = MetadataCatalog.get(name)
    # What the generated json's category says (load_coco_json checks that it agrees).
    meta.set(
        thing_classes=["figure"],
        thing_dataset_id_to_contiguous_id={1: 0},
        keypoint_names=list(FIGURE_KEYPOINT_NAMES),
        keypoint_skeleton=list(FIGURE_SKELETON),
        keypoint_flip_map=list(FIGURE_FLIP_MAP),
        keypoint_oks_sigmas=list(FIGURE_OKS_SIGMAS),
        evaluator_type="coco",
    )
    meta.set_lazy("json_file", lambda: os.path.join(folder(), "annotations.json"))
    meta.set_lazy("image_root", lambda: os.path.join(folder(), "images"))


def register_all_builtin() -> None:
    for name in _COCO_SPLITS:
        if name not in DatasetCatalog:
            _register_coco(name)
    for name, (_, split, year) in _VOC_SPLITS.items():
        if name not in DatasetCatalog:
            register_pascal_voc(name, "", split, year, dirname_fn=lambda name=name: _voc_dir(name))
    for name in _CITYSCAPES_SPLITS:
        if name not in DatasetCatalog:
            _register_builtin_cityscapes(name)
    for name, spec in _SHAPES_SPLITS.items():
        if name not in DatasetCatalog:
            register_shapes(name, spec)
    for name, spec in _FIGURES_SPLITS.items():
        if name not in DatasetCatalog:
            register_figures(name, spec)
