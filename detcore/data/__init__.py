"""Data: dataset catalog, COCO / Pascal VOC / Cityscapes / synthetic shapes datasets, transforms,
samplers and loaders."""
from . import transforms
from .build import (
    DatasetFromList,
    MapDataset,
    build_detection_test_loader,
    build_detection_train_loader,
    get_detection_dataset_dicts,
    make_detection_test_loader,
    make_detection_train_loader,
    trivial_batch_collator,
)
from .catalog import DatasetCatalog, DatasetNotRegisteredError, Metadata, MetadataCatalog
from .dataset_mapper import DatasetMapper, build_augmentation
from .datasets import (
    SHAPES_CLASSES,
    ShapesSpec,
    convert_to_coco_json,
    get_datasets_root,
    load_cityscapes_instances,
    load_coco_json,
    load_voc_instances,
    register_cityscapes_instances,
    register_coco_instances,
    register_pascal_voc,
    register_shapes,
    set_datasets_root,
)
from .detection_utils import annotations_to_instances, filter_empty_instances, mask_to_polygons, read_image
from .samplers import GroupedBatchSampler, InferenceSampler, TrainingSampler

__all__ = [
    "DatasetCatalog",
    "DatasetNotRegisteredError",
    "Metadata",
    "MetadataCatalog",
    "DatasetFromList",
    "MapDataset",
    "DatasetMapper",
    "build_augmentation",
    "build_detection_test_loader",
    "build_detection_train_loader",
    "get_detection_dataset_dicts",
    "make_detection_test_loader",
    "make_detection_train_loader",
    "trivial_batch_collator",
    "SHAPES_CLASSES",
    "ShapesSpec",
    "get_datasets_root",
    "set_datasets_root",
    "convert_to_coco_json",
    "load_cityscapes_instances",
    "load_coco_json",
    "load_voc_instances",
    "register_cityscapes_instances",
    "register_coco_instances",
    "register_pascal_voc",
    "register_shapes",
    "annotations_to_instances",
    "filter_empty_instances",
    "mask_to_polygons",
    "read_image",
    "GroupedBatchSampler",
    "InferenceSampler",
    "TrainingSampler",
    "transforms",
]
