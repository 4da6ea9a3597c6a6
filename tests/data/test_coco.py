"""COCO json loading, checked against pycocotools' own reading of the same file."""
import contextlib
import copy
import io

import numpy as np
import pytest
from pycocotools.coco import COCO

from detcore.data import (
    DatasetCatalog,
    DatasetMapper,
    MetadataCatalog,
    get_detection_dataset_dicts,
    load_coco_json,
    register_coco_instances,
)

from .files import write_json, write_png

# Category ids 7 and 3 (sparse, unsorted): contiguous ids follow the id order, 3 -> 0, 7 -> 1.
TINY = {
    "images": [
        {"id": 10, "file_name": "a.png", "height": 40, "width": 60},
        {"id": 11, "file_name": "b.png", "height": 50, "width": 30},
        {"id": 12, "file_name": "empty.png", "height": 20, "width": 20},
        {"id": 13, "file_name": "crowd.png", "height": 20, "width": 20},
    ],
    "annotations": [
        {"id": 1, "image_id": 10, "category_id": 7, "bbox": [5, 6, 10, 20], "iscrowd": 0,
         "segmentation": [[5, 6, 15, 6, 15, 26, 5, 26]]},
        {"id": 2, "image_id": 10, "category_id": 3, "bbox": [30.5, 1, 20, 10.25], "iscrowd": 0,
         "segmentation": [[30.5, 1, 50.5, 1, 50.5, 11.25], [1, 2, 3, 4]]},  # 2nd "polygon": 2 points
        {"id": 3, "image_id": 10, "category_id": 3, "bbox": [0, 0, 60, 40], "iscrowd": 1,
         "segmentation": {"size": [40, 60], "counts": [0, 2400]}},
        {"id": 4, "image_id": 11, "category_id": 7, "bbox": [2, 3, 0, 10], "iscrowd": 0,  # zero width
         "segmentation": [[2, 3, 2, 13, 2, 8]]},
        {"id": 5, "image_id": 11, "category_id": 3, "bbox": [4, 4, 10, 10], "iscrowd": 0,
         "segmentation": [[4, 4, 14, 4, 14, 14, 4, 14]]},
        {"id": 6, "image_id": 13, "category_id": 7, "bbox": [0, 0, 5, 5], "iscrowd": 1,
         "segmentation": {"size": [20, 20], "counts": [0, 25, 375]}},
    ],
    "categories": [{"id": 7, "name": "seven"}, {"id": 3, "name": "three"}],
}


@pytest.fixture
def tiny(tmp_path):
    images = tmp_path / "images"
    images.mkdir()
    for img in TINY["images"]:
        write_png(images / img["file_name"], img["height"], img["width"], seed=img["id"])
    return write_json(tmp_path / "tiny.json", TINY), images


def reference(json_file):
    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints progress
        return COCO(str(json_file))


def test_records_match_pycocotools(tiny):
    json_file, image_root = tiny
    records = load_coco_json(json_file, image_root)
    coco = reference(json_file)
    cat_ids = sorted(coco.getCatIds())
    assert [r["image_id"] for r in records] == [10, 11, 12, 13]
    for r in records:
        info = coco.loadImgs(r["image_id"])[0]
        assert r["file_name"] == str(image_root / info["file_name"])
        assert (r["height"], r["width"]) == (info["height"], info["width"])
        # The zero-width box (id 4) is unusable: dropped (and logged) by the loader.
        anns = [a for a in coco.loadAnns(coco.getAnnIds(imgIds=r["image_id"])) if a["id"] != 4]
        assert [a["id"] for a in r["annotations"]] == [a["id"] for a in anns]
        for got, ann in zip(r["annotations"], anns):
            x, y, w, h = ann["bbox"]
            assert got["bbox"] == [x, y, x + w, y + h]
            assert all(isinstance(v, float) for v in got["bbox"])
            assert got["category_id"] == cat_ids.index(ann["category_id"])
            assert got["iscrowd"] == ann["iscrowd"]


def test_segmentations(tiny):
    records = {r["image_id"]: r for r in load_coco_json(*tiny)}
    anns = {a["id"]: a for r in records.values() for a in r["annotations"]}
    assert anns[1]["segmentation"] == [[5, 6, 15, 6, 15, 26, 5, 26]]
    assert anns[2]["segmentation"] == [[30.5, 1, 50.5, 1, 50.5, 11.25]]  # the 2-point one is dropped
    assert anns[3]["segmentation"] == {"size": [40, 60], "counts": [0, 2400]}  # RLE kept as is


def test_metadata_from_json(tiny, register):
    name = register("tiny_meta", lambda: [])
    load_coco_json(*tiny, dataset_name=name)
    meta = MetadataCatalog.get(name)
    assert meta.thing_classes == ["three", "seven"]
    assert meta.thing_dataset_id_to_contiguous_id == {3: 0, 7: 1}


def test_register_coco_instances(tiny):
    json_file, image_root = tiny
    name = "tiny_registered_coco"
    register_coco_instances(name, {"extra": 1}, json_file, image_root)
    try:
        meta = MetadataCatalog.get(name)
        assert (meta.json_file, meta.image_root, meta.evaluator_type, meta.extra) == (
            str(json_file), str(image_root), "coco", 1
        )
        assert len(DatasetCatalog.get(name)) == 4
        assert meta.thing_classes == ["three", "seven"]  # set by loading
    finally:
        DatasetCatalog.remove(name)
        MetadataCatalog.remove(name)


def test_empty_and_crowd_only_images_are_filtered_for_training(tiny, register):
    name = register("tiny_filter", lambda: load_coco_json(*tiny))
    kept = get_detection_dataset_dicts([name], filter_empty=True)
    assert [r["image_id"] for r in kept] == [10, 11]  # 12: no annotation, 13: only a crowd one
    assert [r["image_id"] for r in get_detection_dataset_dicts(name, filter_empty=False)] == [10, 11, 12, 13]


def test_mapper_drops_crowd_and_degenerate_boxes(tiny):
    records = {r["image_id"]: r for r in load_coco_json(*tiny)}
    mapper = DatasetMapper(True, [], use_instance_mask=True)
    inst = mapper(records[10])["instances"]
    assert inst.gt_classes.tolist() == [1, 0]  # the crowd annotation 3 is gone
    assert inst.gt_boxes.tensor.tolist() == [[5, 6, 15, 26], [30.5, 1, 50.5, 11.25]]
    inst = mapper(records[11])["instances"]
    assert inst.gt_classes.tolist() == [0]  # annotation 4 (zero width) is gone
    empty = mapper(records[12])["instances"]
    assert len(empty) == 0 and empty.gt_boxes.tensor.shape == (0, 4) and len(empty.gt_masks) == 0


def test_rle_segmentation_as_bitmask_and_polygon(tmp_path):
    write_png(tmp_path / "r.png", 10, 12)
    mask = np.zeros((10, 12), dtype=np.uint8)
    mask[2:5, 3:9] = 1
    counts, pos, val = [], 0, 0
    flat = mask.flatten(order="F")  # uncompressed COCO RLE: column-major run lengths, from 0s
    while pos < flat.size:
        run = 0
        while pos < flat.size and flat[pos] == val:
            run, pos = run + 1, pos + 1
        counts.append(run)
        val = 1 - val
    data = {
        "images": [{"id": 1, "file_name": "r.png", "height": 10, "width": 12}],
        "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [3, 2, 6, 3], "iscrowd": 0,
                         "segmentation": {"size": [10, 12], "counts": counts}}],
        "categories": [{"id": 1, "name": "x"}],
    }
    records = load_coco_json(write_json(tmp_path / "r.json", data), tmp_path)
    for fmt in ("bitmask", "polygon"):
        inst = DatasetMapper(True, [], use_instance_mask=True, instance_mask_format=fmt)(records[0])["instances"]
        if fmt == "bitmask":
            assert inst.gt_masks.tensor[0].numpy().astype(np.uint8).tolist() == mask.tolist()
        assert inst.gt_masks.get_bounding_boxes().tensor.round().tolist() == [[3, 2, 9, 5]]


def test_missing_image_file_error_names_the_file(tiny):
    json_file, image_root = tiny
    (image_root / "b.png").unlink()
    records = load_coco_json(json_file, image_root)
    mapper = DatasetMapper(False, [])
    with pytest.raises(FileNotFoundError, match=r"b\.png"):
        mapper(records[1])


def test_unreadable_image_error_names_the_file(tiny):
    json_file, image_root = tiny
    (image_root / "a.png").write_bytes(b"this is not a png")
    records = load_coco_json(json_file, image_root)
    with pytest.raises(OSError, match=r"a\.png"):
        DatasetMapper(False, [])(records[0])


def test_image_size_mismatch_names_the_file(tiny):
    json_file, image_root = tiny
    write_png(image_root / "a.png", 41, 60)
    records = load_coco_json(json_file, image_root)
    with pytest.raises(ValueError, match=r"a\.png.*41x60"):
        DatasetMapper(False, [])(records[0])


@pytest.mark.parametrize(
    "change, message",
    [
        ({"bbox": [1, 2, 3]}, "bbox must be 4 numbers"),
        ({"bbox": [1, 2, "3", 4]}, "bbox must be 4 numbers"),
        ({"category_id": 99}, "category_id 99"),
        ({"image_id": 404}, "image_id 404"),
        ({"segmentation": [[1, 2, 3, 4, 5, 6, 7]]}, "odd number"),
        ({"segmentation": "polygon"}, "segmentation must be"),
        ({"segmentation": {"counts": "x", "size": [5, 5]}}, "does not match the image size"),
        ({"iscrowd": 2}, "iscrowd"),
    ],
)
def test_malformed_annotation_error_names_the_id(tiny, change, message):
    json_file, image_root = tiny
    data = copy.deepcopy(TINY)
    data["annotations"][4].update(change)  # annotation id 5
    write_json(json_file, data)
    with pytest.raises(ValueError, match=f"annotation id 5: .*{message}") as e:
        load_coco_json(json_file, image_root)
    assert str(json_file) in str(e.value)


def test_duplicate_or_missing_annotation_id(tiny):
    json_file, image_root = tiny
    data = copy.deepcopy(TINY)
    data["annotations"][1]["id"] = 1
    write_json(json_file, data)
    with pytest.raises(ValueError, match="annotation id 1: .*twice"):
        load_coco_json(json_file, image_root)
    del data["annotations"][1]["id"]
    write_json(json_file, data)
    with pytest.raises(ValueError, match="annotation #1 .*needs an 'id'"):
        load_coco_json(json_file, image_root)


def test_bad_json_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.json"):
        load_coco_json(tmp_path / "nope.json", tmp_path)
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="bad.json is not valid json"):
        load_coco_json(tmp_path / "bad.json", tmp_path)
    write_json(tmp_path / "noimages.json", {"categories": []})
    with pytest.raises(ValueError, match="'images' and 'categories'"):
        load_coco_json(tmp_path / "noimages.json", tmp_path)
    write_json(tmp_path / "img.json", {"images": [{"id": 1, "file_name": "x.png", "width": 3}], "categories": []})
    with pytest.raises(ValueError, match="image #0 \\(id 1\\) needs 'height'"):
        load_coco_json(tmp_path / "img.json", tmp_path)
