"""Dataset sources: COCO-format json files, Pascal VOC, Cityscapes, records registered from code
(converted to COCO json for evaluation), the synthetic shapes and figures generators, and a user's
own data named ``coco:JSON[:IMAGE_ROOT]`` / ``voc:FOLDER[:SPLIT]`` (``data_names``)."""
from .builtin import (
    COCO_CATEGORIES,
    get_datasets_root,
    register_all_builtin,
    register_cityscapes_instances,
    register_figures,
    register_shapes,
    set_datasets_root,
)
from .cityscapes import CITYSCAPES_INSTANCE_CLASSES, load_cityscapes_instances
from .coco import load_coco_json, read_coco_categories, register_coco_instances
from .data_names import DEFAULT_VOC_SPLIT, DataName, parse_data_name, register_data_name
from .coco_conversion import convert_to_coco_dict, convert_to_coco_json
from .figures import FiguresSpec, ensure_figures_dataset, generate_figures_split
from .keypoint_meta import coco_person_keypoint_metadata, infer_flip_map, keypoint_metadata_from_categories
from .pascal_voc import VOC_CLASSES, load_voc_instances, read_voc_class_names, register_pascal_voc
from .shapes import SHAPES_CLASSES, ShapesSpec, ensure_shapes_dataset, generate_shapes_split, get_cache_dir

__all__ = [
    "COCO_CATEGORIES",
    "CITYSCAPES_INSTANCE_CLASSES",
    "DEFAULT_VOC_SPLIT",
    "DataName",
    "parse_data_name",
    "read_coco_categories",
    "read_voc_class_names",
    "register_data_name",
    "VOC_CLASSES",
    "load_cityscapes_instances",
    "load_voc_instances",
    "register_cityscapes_instances",
    "register_pascal_voc",
    "convert_to_coco_dict",
    "convert_to_coco_json",
    "SHAPES_CLASSES",
    "FiguresSpec",
    "coco_person_keypoint_metadata",
    "ensure_figures_dataset",
    "generate_figures_split",
    "infer_flip_map",
    "keypoint_metadata_from_categories",
    "register_figures",
    "ShapesSpec",
    "ensure_shapes_dataset",
    "generate_shapes_split",
    "get_cache_dir",
    "get_datasets_root",
    "load_coco_json",
    "register_all_builtin",
    "register_coco_instances",
    "register_shapes",
    "set_datasets_root",
]

# The built-in names exist as soon as detcore.data is imported; nothing is read until used.
register_all_builtin()
