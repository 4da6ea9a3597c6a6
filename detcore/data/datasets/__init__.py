"""Dataset sources: COCO-format json files and the synthetic shapes generator."""
from .builtin import COCO_CATEGORIES, get_datasets_root, register_all_builtin, register_shapes, set_datasets_root
from .coco import load_coco_json, register_coco_instances
from .coco_conversion import convert_to_coco_dict, convert_to_coco_json
from .shapes import SHAPES_CLASSES, ShapesSpec, ensure_shapes_dataset, generate_shapes_split, get_cache_dir

__all__ = [
    "COCO_CATEGORIES",
    "convert_to_coco_dict",
    "convert_to_coco_json",
    "SHAPES_CLASSES",
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
