"""coco:JSON[:IMAGE_ROOT] and voc:FOLDER[:SPLIT]: a user's data named where a dataset name goes,
parsed by the documented rule, registered on first use with the classes read from the files."""
import json
import os

import pytest

from detcore.data import DatasetCatalog, DatasetNotRegisteredError, MetadataCatalog, dataset_folder_name
from detcore.data.datasets import DEFAULT_VOC_SPLIT, DataName, parse_data_name

from tests.data.fake_voc import write_voc_tree
from tests.data.files import write_png


@pytest.fixture
def forget():
    """``forget(name)``: remove ``name`` from both catalogs after the test; returns the name."""
    names = []
    yield lambda name: names.append(name) or name
    for name in names:
        if name in DatasetCatalog:
            DatasetCatalog.remove(name)
        MetadataCatalog.remove(name)


# --- the parsing rule -----------------------------------------------------------------------------
@pytest.mark.parametrize("name, expected", [
    ("coco:/data/train.json", DataName("coco", "/data/train.json")),
    ("coco:rel/train.JSON", DataName("coco", "rel/train.JSON")),
    ("coco:/data/train.json:/images", DataName("coco", "/data/train.json", image_root="/images")),
    # ':' inside both paths: the json ends at the first ".json" that ends the text or meets ':'.
    ("coco:/d:1/a.json.d/t.json:/img:2/x", DataName("coco", "/d:1/a.json.d/t.json", image_root="/img:2/x")),
    ("voc:/data/VOC2007", DataName("voc", "/data/VOC2007", split=DEFAULT_VOC_SPLIT)),
    ("voc:/data/VOC2007:trainval", DataName("voc", "/data/VOC2007", split="trainval")),
    # The text after the last ':' is a split only without '/': a trailing '/' keeps it in the folder.
    ("voc:/data/set:2/", DataName("voc", "/data/set:2/", split=DEFAULT_VOC_SPLIT)),
    ("voc:/data/set:2/:val", DataName("voc", "/data/set:2/", split="val")),
    ("voc:/a:b/c", DataName("voc", "/a:b/c", split=DEFAULT_VOC_SPLIT)),
    ("shapes_val", None),
    ("cooc:/data/train.json", None),
])
def test_parse_data_name(name, expected):
    assert parse_data_name(name) == expected


def test_the_default_voc_split_is_torchvisions():
    assert DEFAULT_VOC_SPLIT == "train"  # torchvision.datasets.VOCDetection(image_set="train")


@pytest.mark.parametrize("name, message", [
    ("coco:", "ends in .json"),
    ("coco:/data/train", "ends in .json"),
    ("coco:/data/train.json:", "nothing after the ':'"),
    ("voc:", "no folder"),
    ("voc::val", "no folder"),
])
def test_malformed_data_names(name, message):
    with pytest.raises(ValueError, match=message):
        parse_data_name(name)
    with pytest.raises(ValueError, match=message):
        DatasetCatalog.get(name)


def test_dataset_folder_name():
    assert dataset_folder_name("coco_2017_val") == "coco_2017_val"
    a, b = dataset_folder_name("coco:/data/a/val.json"), dataset_folder_name("coco:/data/a_val.json")
    assert a.startswith("coco_data_a_val.json_") and b.startswith("coco_data_a_val.json_") and a != b
    assert "/" not in a and ":" not in a
    assert dataset_folder_name("..") not in ("..", "") and "/" not in dataset_folder_name("a/../..")
    long = dataset_folder_name("coco:/" + "deep/" * 40 + "val.json")
    assert long.startswith("coco_deep_") and "_deep_val.json_" in long and len(long) < 100


# --- COCO json ------------------------------------------------------------------------------------
def write_user_coco(folder, categories=((7, "cat"), (2, "dog")), image_dir=None):
    image_dir = image_dir or folder
    os.makedirs(folder, exist_ok=True)
    os.makedirs(image_dir, exist_ok=True)
    write_png(os.path.join(image_dir, "a.png"), 40, 50)
    data = {
        "images": [{"id": 5, "file_name": "a.png", "height": 40, "width": 50}],
        "annotations": [{"id": 1, "image_id": 5, "category_id": 7, "bbox": [1, 2, 10, 20], "iscrowd": 0}],
        "categories": [{"id": cid, "name": n} for cid, n in categories],
    }
    path = os.path.join(folder, "train.json")
    with open(path, "w") as f:
        json.dump(data, f)
    return path


def test_coco_name_registers_on_first_use(tmp_path, forget):
    json_file = write_user_coco(str(tmp_path / "my data"))
    name = forget(f"coco:{json_file}")
    assert name not in DatasetCatalog  # asking reads nothing
    meta = MetadataCatalog.get(name)  # the metadata alone registers it: classes known before loading
    assert name in DatasetCatalog
    assert meta.thing_classes == ["dog", "cat"]  # json id order
    assert meta.thing_dataset_id_to_contiguous_id == {2: 0, 7: 1}
    assert meta.json_file == json_file and meta.image_root == str(tmp_path / "my data")
    assert meta.evaluator_type == "coco"
    (record,) = DatasetCatalog.get(name)
    assert record["file_name"] == str(tmp_path / "my data" / "a.png") and os.path.isfile(record["file_name"])
    assert record["annotations"][0]["category_id"] == 1 and record["annotations"][0]["bbox"] == [1, 2, 11, 22]


def test_coco_name_with_an_image_root_and_colons(tmp_path, forget):
    json_file = write_user_coco(str(tmp_path / "ann:v1"), image_dir=str(tmp_path / "img:all"))
    name = forget(f"coco:{json_file}:{tmp_path / 'img:all'}")
    (record,) = DatasetCatalog.get(name)
    assert record["file_name"] == str(tmp_path / "img:all" / "a.png")
    assert MetadataCatalog.get(name).image_root == str(tmp_path / "img:all")


def test_relative_paths_are_taken_from_the_current_folder(tmp_path, monkeypatch, forget):
    write_user_coco(str(tmp_path / "data"))
    monkeypatch.chdir(tmp_path)
    name = forget("coco:data/train.json")
    assert MetadataCatalog.get(name).json_file == str(tmp_path / "data" / "train.json")
    monkeypatch.chdir("/")
    assert DatasetCatalog.get(name)[0]["file_name"] == str(tmp_path / "data" / "a.png")  # resolved once


def test_coco_name_errors_name_the_path(tmp_path, forget):
    missing = tmp_path / "nowhere" / "train.json"
    with pytest.raises(FileNotFoundError, match=f"COCO json file not found: {missing}"):
        DatasetCatalog.get(forget(f"coco:{missing}"))
    json_file = write_user_coco(str(tmp_path / "data"))
    with pytest.raises(FileNotFoundError, match=f"image folder not found: {tmp_path / 'imgs'}"):
        MetadataCatalog.get(forget(f"coco:{json_file}:{tmp_path / 'imgs'}"))
    name = forget(f"coco:{tmp_path / 'empty' / 'train.json'}")
    write_user_coco(str(tmp_path / "empty"), categories=())
    with pytest.raises(ValueError, match="has no categories"):
        DatasetCatalog.get(name)
    # A failed registration leaves nothing behind: fixed on disk, the name works.
    write_user_coco(str(tmp_path / "empty"))
    assert len(DatasetCatalog.get(name)) == 1


def test_unknown_names_mention_the_data_name_syntax():
    with pytest.raises(DatasetNotRegisteredError, match=r"coco:JSON\[:IMAGE_ROOT\] or voc:FOLDER\[:SPLIT\]"):
        DatasetCatalog.get("my_own_data")


# --- VOC folder -----------------------------------------------------------------------------------
def write_user_voc(folder, splits=None):
    images = {
        "img1": (60, 40, [("zebra", (5, 5, 20, 30), 0), ("apple", (1, 1, 10, 10), 1)]),
        "img2": (60, 40, [("kiwi", (3, 4, 50, 30), None)]),
        "img3": (60, 40, [("apple", (3, 4, 50, 30), 0)]),
    }
    return write_voc_tree(folder, images, splits or {"train": ["img1", "img2"], "val": ["img3"]})


def test_voc_name_reads_classes_from_every_annotation(tmp_path, forget):
    folder = write_user_voc(str(tmp_path / "my:voc"))
    train, val = forget(f"voc:{folder}/"), forget(f"voc:{folder}:val")
    # Every split of the folder gets the same classes, sorted (val has apples only).
    assert MetadataCatalog.get(train).thing_classes == MetadataCatalog.get(val).thing_classes == ["apple", "kiwi", "zebra"]
    meta = MetadataCatalog.get(train)
    assert (meta.split, meta.year, meta.evaluator_type, meta.dirname) == ("train", 2012, "pascal_voc", folder)
    records = DatasetCatalog.get(train)
    assert [r["voc_id"] for r in records] == ["img1", "img2"]
    assert [a["category_id"] for a in records[0]["annotations"]] == [2, 0]
    assert [r["voc_id"] for r in DatasetCatalog.get(val)] == ["img3"]


def test_a_folder_named_voc2007_gets_the_11_point_metric(tmp_path, forget):
    folder = write_user_voc(str(tmp_path / "VOC2007"))
    assert MetadataCatalog.get(forget(f"voc:{folder}")).year == 2007


def test_voc_name_errors_name_the_path(tmp_path, forget):
    with pytest.raises(FileNotFoundError, match=f"VOC folder not found: {tmp_path / 'none'}"):
        DatasetCatalog.get(forget(f"voc:{tmp_path / 'none'}"))
    folder = write_user_voc(str(tmp_path / "voc"))
    split_file = os.path.join(folder, "ImageSets", "Main", "trainval.txt")
    with pytest.raises(FileNotFoundError, match=f"split file not found: {split_file}.*the splits there: train, val"):
        MetadataCatalog.get(forget(f"voc:{folder}:trainval"))
    os.rename(os.path.join(folder, "JPEGImages"), os.path.join(folder, "images"))
    with pytest.raises(FileNotFoundError, match=f"no JPEGImages/: {folder}/JPEGImages"):
        DatasetCatalog.get(forget(f"voc:{folder}:val"))
