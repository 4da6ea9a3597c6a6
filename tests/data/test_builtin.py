"""Built-in COCO names: data root resolution and errors. (Shapes: see test_shapes.py.)"""
import os

import pytest

from detcore.config import get_cfg
from detcore.data import (
    DatasetCatalog,
    MetadataCatalog,
    build_detection_test_loader,
    get_datasets_root,
    set_datasets_root,
)
from detcore.data.datasets import COCO_CATEGORIES

from .files import write_json, write_png


def make_coco_root(root, split="val2017"):
    (root / "coco" / "annotations").mkdir(parents=True)
    (root / "coco" / split).mkdir()
    write_png(root / "coco" / split / "1.png", 20, 30)
    write_json(
        root / "coco" / "annotations" / f"instances_{split}.json",
        {
            "images": [{"id": 7, "file_name": "1.png", "height": 20, "width": 30}],
            "annotations": [{"id": 1, "image_id": 7, "category_id": 90, "bbox": [1, 2, 3, 4], "iscrowd": 0}],
            "categories": [{"id": i, "name": n} for i, n in COCO_CATEGORIES],
        },
    )


def test_root_precedence(tmp_path, monkeypatch):
    monkeypatch.setenv("DETCORE_DATASETS", str(tmp_path / "env"))
    assert get_datasets_root() == str(tmp_path / "env")
    set_datasets_root(str(tmp_path / "cfg"))
    assert get_datasets_root() == str(tmp_path / "cfg")
    set_datasets_root("")
    monkeypatch.delenv("DETCORE_DATASETS")
    assert get_datasets_root() == "datasets"


def test_missing_files_name_the_path_and_the_env_var(tmp_path):
    with pytest.raises(FileNotFoundError) as e:
        DatasetCatalog.get("coco_2017_train")
    msg = str(e.value)
    assert os.path.join(str(tmp_path / "datasets"), "coco", "annotations", "instances_train2017.json") in msg
    assert "DETCORE_DATASETS" in msg and "DATASETS.ROOT" in msg


def test_coco_val_loads_from_env_root(tmp_path):
    make_coco_root(tmp_path / "datasets")
    records = DatasetCatalog.get("coco_2017_val")
    assert len(records) == 1
    assert records[0]["file_name"] == str(tmp_path / "datasets" / "coco" / "val2017" / "1.png")
    assert records[0]["annotations"][0]["category_id"] == 79  # toothbrush, json id 90
    meta = MetadataCatalog.get("coco_2017_val")
    assert meta.json_file == str(tmp_path / "datasets" / "coco" / "annotations" / "instances_val2017.json")


def test_cfg_root_wins_over_env(tmp_path):
    make_coco_root(tmp_path / "elsewhere")
    cfg = get_cfg()
    cfg.DATASETS.ROOT = str(tmp_path / "elsewhere")
    cfg.DATALOADER.NUM_WORKERS = 0
    cfg.INPUT.MIN_SIZE_TEST = 0
    batches = list(build_detection_test_loader(cfg, "coco_2017_val"))
    assert len(batches) == 1 and batches[0][0]["image_id"] == 7
    assert MetadataCatalog.get("coco_2017_val").image_root == str(tmp_path / "elsewhere" / "coco" / "val2017")
