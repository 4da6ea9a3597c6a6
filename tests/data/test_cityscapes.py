"""The Cityscapes instance loader on a tiny tree in the official layout: masks, boxes, classes,
crowds and occlusion from the polygon json; the same from the instance-id PNGs; errors."""
import json
import os

import numpy as np
import pycocotools.mask as mask_util
import pytest
from PIL import Image

from detcore.data import DatasetCatalog, MetadataCatalog
from detcore.data.datasets import cityscapes
from detcore.data.datasets.cityscapes import CITYSCAPES_INSTANCE_CLASSES, load_cityscapes_instances
from tests.data.fake_cityscapes import H, W, rect, write_cityscapes_tree


def by_class(record):
    return sorted(
        (CITYSCAPES_INSTANCE_CLASSES[a["category_id"]], a["bbox"], int(mask_util.area(a["segmentation"])), a["iscrowd"])
        for a in record["annotations"]
    )


def test_records_from_polygons(tmp_path):
    image_dir, gt_dir = write_cityscapes_tree(str(tmp_path))
    records = load_cityscapes_instances(image_dir, gt_dir)
    assert [os.path.basename(r["file_name"]) for r in records] == [
        "aachen_000000_000019_leftImg8bit.png", "aachen_000001_000019_leftImg8bit.png", "bochum_000000_000313_leftImg8bit.png",
    ]
    assert [r["image_id"] for r in records] == [0, 1, 2]
    assert all((r["height"], r["width"]) == (H, W) for r in records)
    first = records[0]
    assert first["gt_polygons_file"] == os.path.join(gt_dir, "aachen", "aachen_000000_000019_gtFine_polygons.json")
    assert first["gt_instance_ids_file"].endswith("aachen_000000_000019_gtFine_instanceIds.png")
    # Road, license plate and caravan are no classes; the person covers the car's columns 60..69.
    assert by_class(first) == [
        ("car", [10.0, 10.0, 30.0, 20.0], 200, 0),
        ("car", [40.0, 10.0, 60.0, 30.0], 20 * 20, 0),
        ("car", [90.0, 40.0, 120.0, 56.0], 30 * 16, 1),  # the cargroup: a crowd
        ("person", [60.0, 5.0, 80.0, 35.0], 600, 0),
    ]
    assert by_class(records[1]) == [("bicycle", [5.0, 5.0, 25.0, 25.0], 400, 0), ("rider", [30.0, 5.0, 50.0, 35.0], 600, 0)]
    assert {a["segmentation"]["size"] == [H, W] and isinstance(a["segmentation"]["counts"], str)
            for r in records for a in r["annotations"]} == {True}


def test_instance_id_pngs_give_the_same_records(tmp_path):
    from_json = load_cityscapes_instances(*write_cityscapes_tree(str(tmp_path / "a")))
    from_png = load_cityscapes_instances(*write_cityscapes_tree(str(tmp_path / "b"), with_json=False, with_png=True))
    for a, b in zip(from_json, from_png):
        assert not os.path.exists(b["gt_polygons_file"]) and os.path.exists(b["gt_instance_ids_file"])
        assert a["annotations"] == b["annotations"]


def test_worker_processes_give_the_same_records(tmp_path, monkeypatch):
    dirs = write_cityscapes_tree(str(tmp_path))
    serial = load_cityscapes_instances(*dirs, num_workers=1)
    monkeypatch.setattr(cityscapes, "_PARALLEL_FROM", 2)
    assert load_cityscapes_instances(*dirs, num_workers=2) == serial


def test_builtin_names(tmp_path):
    with pytest.raises(FileNotFoundError, match="cityscapes/leftImg8bit/val/"):
        DatasetCatalog.get("cityscapes_fine_instance_seg_val")
    write_cityscapes_tree(str(tmp_path / "datasets"), split="train")  # $DETCORE_DATASETS of the fixture
    assert len(DatasetCatalog.get("cityscapes_fine_instance_seg_train")) == 3
    meta = MetadataCatalog.get("cityscapes_fine_instance_seg_train")
    assert meta.evaluator_type == "cityscapes_instance"
    assert list(meta.thing_classes) == list(CITYSCAPES_INSTANCE_CLASSES) and len(meta.thing_classes) == 8
    assert meta.gt_dir == str(tmp_path / "datasets" / "cityscapes" / "gtFine" / "train")


def _rewrite(gt_dir, data):
    path = os.path.join(gt_dir, "bochum", "bochum_000000_000313_gtFine_polygons.json")
    with open(path, "w") as f:
        f.write(data if isinstance(data, str) else json.dumps(data))
    return path


@pytest.mark.parametrize(
    "data, match",
    [
        ('{"imgHeight": 64, "imgWidth"', "not a Cityscapes polygon annotation"),
        ({"imgHeight": 64, "imgWidth": 128, "objects": [{"label": "spaceship", "polygon": [[0, 0], [5, 5], [0, 5]]}]},
         "label 'spaceship', which is not a Cityscapes label"),
        ({"imgHeight": 64, "imgWidth": 128, "objects": [{"label": "car", "polygon": [[0, 0]]}]}, "polygon of 1 point"),
        ({"imgHeight": 64, "objects": []}, "not a Cityscapes polygon annotation"),
        # A size that is not its image's (drawing 10^6 x 64 once ended in a bare MemoryError).
        ({"imgHeight": H, "imgWidth": 10**6, "objects": []}, rf"imgWidth x imgHeight is 1000000 x {H}, but its image is {W} x {H}"),
        ({"imgHeight": H, "imgWidth": float("nan"), "objects": []}, r"not a Cityscapes polygon annotation \(ValueError: cannot convert float NaN to integer\)"),
        ({"imgHeight": 10**400, "imgWidth": W, "objects": []}, "the image height must lie in 1..1048576 pixels"),
        ({"imgHeight": H, "imgWidth": W, "objects": [{"label": "car", "polygon": [[0, 0], ["a", 5], [0, 5]]}]},
         r"object #0 \('car'\) has a polygon point that is not two numbers"),
    ],
)
def test_bad_json_is_named(tmp_path, data, match):
    image_dir, gt_dir = write_cityscapes_tree(str(tmp_path))
    path = _rewrite(gt_dir, data)
    with pytest.raises(ValueError, match=match) as info:
        load_cityscapes_instances(image_dir, gt_dir)
    assert path in str(info.value)


def test_unusable_polygons_are_dropped_and_logged_as_coco_annotations_are(tmp_path, caplog):
    image_dir, gt_dir = write_cityscapes_tree(str(tmp_path))
    objects = [
        {"label": "truck", "polygon": rect(20, 20, 59, 49)},
        {"label": "car", "polygon": [[0, 0], [float("nan"), 5], [0, 5]]},   # NaN: once drawn as if it were fine
        {"label": "car", "polygon": [[0, 0], [1e30, 5], [0, 5]]},           # absurdly far outside
        {"label": "bus", "polygon": [[0, 0], [10**400, 5], [0, 5]]},        # beyond the float range
        {"label": "person", "polygon": rect(70, 30, 84, 59)},
    ]
    path = _rewrite(gt_dir, {"imgHeight": H, "imgWidth": W, "objects": objects})
    with caplog.at_level("WARNING"):
        records = load_cityscapes_instances(image_dir, gt_dir)
    assert by_class(records[2]) == [("person", [70.0, 30.0, 85.0, 60.0], 15 * 30, 0), ("truck", [20.0, 20.0, 60.0, 50.0], 40 * 30, 0)]
    name = os.path.basename(path)
    assert f"{gt_dir}: dropped 3 unusable object(s)" in caplog.text
    assert f"2 with non-finite polygon coordinate (objects {name} #1, {name} #3)" in caplog.text
    assert f"1 with polygon far outside the image (objects {name} #2)" in caplog.text
    # The evaluator draws its ground truth from the same json the same way.
    ids = cityscapes.polygons_to_instance_ids(path)
    assert sorted(set(np.unique(ids).tolist()) - {0}) == [24000, 27000]


def test_an_instance_id_png_of_another_size_than_its_image_is_an_error(tmp_path):
    image_dir, gt_dir = write_cityscapes_tree(str(tmp_path), with_json=False, with_png=True)
    png = os.path.join(gt_dir, "bochum", "bochum_000000_000313_gtFine_instanceIds.png")
    Image.fromarray(np.zeros((H, W + 1), np.uint16)).save(png)
    with pytest.raises(ValueError, match=rf"the instance-id PNG is {W + 1} x {H}, but its image is {W} x {H}") as info:
        load_cityscapes_instances(image_dir, gt_dir)
    assert png in str(info.value)


def test_missing_ground_truth_and_images(tmp_path):
    image_dir, gt_dir = write_cityscapes_tree(str(tmp_path))
    os.remove(os.path.join(gt_dir, "bochum", "bochum_000000_000313_gtFine_polygons.json"))
    with pytest.raises(FileNotFoundError, match="bochum_000000_000313_leftImg8bit.png: no ground truth"):
        load_cityscapes_instances(image_dir, gt_dir)
    with pytest.raises(FileNotFoundError, match="No Cityscapes images"):
        load_cityscapes_instances(gt_dir, gt_dir)
    with pytest.raises(FileNotFoundError, match="image folder not found"):
        load_cityscapes_instances(str(tmp_path / "nowhere"), gt_dir)
