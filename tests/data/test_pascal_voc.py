"""The Pascal VOC loader on a small tree in the devkit's layout, and the built-in VOC names."""
import os

import numpy as np
import pytest

from detcore.data import DatasetCatalog, MetadataCatalog
from detcore.data.datasets.pascal_voc import VOC_CLASSES, load_voc_instances, register_pascal_voc
from tests.data.fake_voc import voc_xml, write_voc_tree

IMAGES = {
    "000005": (50, 40, [("chair", (1, 1, 10, 20), 0), ("dog", (5, 6, 50, 40), 1)]),
    "000007": (30, 60, [("car", (3, 4, 30, 59), None)]),  # no <difficult> tag: not difficult
    "000009": (40, 40, []),
}


@pytest.fixture
def voc(tmp_path):
    return write_voc_tree(str(tmp_path / "VOC2007"), IMAGES, {"trainval": ["000005", "000007"], "test": ["000009"]})


def test_records(voc):
    records = load_voc_instances(voc, "trainval")
    assert [r["voc_id"] for r in records] == ["000005", "000007"]
    assert [r["image_id"] for r in records] == [0, 1]
    first = records[0]
    assert first["file_name"] == os.path.join(voc, "JPEGImages", "000005.jpg")
    assert (first["width"], first["height"]) == (50, 40)
    # 1-based inclusive pixels 1..10 -> continuous [0, 10]: 10 pixels wide either way.
    assert first["annotations"] == [
        {"bbox": [0.0, 0.0, 10.0, 20.0], "category_id": VOC_CLASSES.index("chair"), "iscrowd": 0, "difficult": 0},
        {"bbox": [4.0, 5.0, 50.0, 40.0], "category_id": VOC_CLASSES.index("dog"), "iscrowd": 0, "difficult": 1},
    ]
    assert records[1]["annotations"][0]["difficult"] == 0
    assert load_voc_instances(voc, "test")[0]["annotations"] == []


def test_custom_classes_and_registration(voc, register):
    records = load_voc_instances(voc, "trainval", class_names=("dog", "chair", "car"))
    assert [a["category_id"] for a in records[0]["annotations"]] == [1, 0]
    name = f"my_voc_{os.getpid()}"
    register_pascal_voc(name, voc, "trainval", 2007, class_names=("dog", "chair", "car"))
    try:
        assert len(DatasetCatalog.get(name)) == 2
        meta = MetadataCatalog.get(name)
        assert (meta.thing_classes, meta.year, meta.split, meta.evaluator_type, meta.dirname) == (
            ["dog", "chair", "car"], 2007, "trainval", "pascal_voc", voc)
    finally:
        DatasetCatalog.remove(name)
        MetadataCatalog.remove(name)


def test_builtin_names_resolve_under_the_data_root(tmp_path):
    # The data tests' fixture points $DETCORE_DATASETS at tmp_path / "datasets".
    with pytest.raises(FileNotFoundError, match="VOC2007/ImageSets/Main/test.txt"):
        DatasetCatalog.get("voc_2007_test")
    write_voc_tree(str(tmp_path / "datasets" / "VOC2007"), IMAGES, {"trainval": ["000005", "000007"], "test": ["000009"]})
    write_voc_tree(str(tmp_path / "datasets" / "VOC2012"), IMAGES, {"trainval": ["000007"]})
    assert [r["voc_id"] for r in DatasetCatalog.get("voc_2007_trainval")] == ["000005", "000007"]
    assert [r["voc_id"] for r in DatasetCatalog.get("voc_2007_test")] == ["000009"]
    assert [r["voc_id"] for r in DatasetCatalog.get("voc_2012_trainval")] == ["000007"]
    assert MetadataCatalog.get("voc_2007_test").year == 2007
    assert MetadataCatalog.get("voc_2012_trainval").year == 2012
    assert MetadataCatalog.get("voc_2007_test").evaluator_type == "pascal_voc"
    assert list(MetadataCatalog.get("voc_2012_trainval").thing_classes) == list(VOC_CLASSES)
    assert MetadataCatalog.get("voc_2007_test").dirname == str(tmp_path / "datasets" / "VOC2007")


def _write(voc, voc_id, text):
    with open(os.path.join(voc, "Annotations", f"{voc_id}.xml"), "w") as f:
        f.write(text)


@pytest.mark.parametrize(
    "text, match",
    [
        ("<annotation><size><width>5</width>", "is not valid XML"),
        (voc_xml("000005", 50, 40, [], with_size=False), "the image has no <size/width>"),
        (voc_xml("000005", 50, 0, []), r"the image height must lie in 1..1048576 pixels, got 0.0 \(<size>\)"),
        (voc_xml("000005", "nan", 40, []), r"the image width must be a whole number of pixels, got nan \(<size>\)"),
        (voc_xml("000005", 50, "1e30", []), r"the image height must lie in 1..1048576 pixels, got 1e\+30"),
        (voc_xml("000005", 50.5, 40, []), "the image width must be a whole number of pixels, got 50.5"),
        (voc_xml("000005", 50, 40, [("dog", (1, 1, 5, 5), 0)]).replace("<difficult>0<", "<difficult>nan<"),
         r"object #0 \('dog'\) <difficult> must be 0 or 1, got nan"),
        (voc_xml("000005", 50, 40, [("unicorn", (1, 1, 5, 5), 0)]), "class 'unicorn', which is not one of"),
        (voc_xml("000005", 50, 40, [("dog", (1, 1, "five", 5), 0)]), r"<xmax> must be a number, got 'five'"),
        (voc_xml("000005", 50, 40, [("dog", (1, 1, 5, 5), 0)]).replace("<bndbox>", "<box>").replace("</bndbox>", "</box>"),
         "has no <bndbox>"),
    ],
)
def test_bad_xml_is_named(voc, text, match):
    _write(voc, "000005", text)
    with pytest.raises(ValueError, match=match) as info:
        load_voc_instances(voc, "trainval")
    assert os.path.join(voc, "Annotations", "000005.xml") in str(info.value)


def test_unusable_boxes_are_dropped_and_logged_as_coco_annotations_are(voc, caplog):
    # The policy of detcore.data.datasets.annotation_checks; the image is 50 x 40.
    objects = [
        ("dog", (1, 1, 10, 20), 0),               # kept
        ("cat", (1, 1, "inf", 20), 0),           # non-finite
        ("cat", ("nan", 1, 10, 20), 0),          # non-finite
        ("cat", (1, 1, "1e30", 20), 0),          # absurdly far outside: would rasterize without bound
        ("cat", (61, 1, 70, 20), 0),             # entirely right of the image
        ("cat", (9, 1, 5, 5), 0),                # xmin > xmax: negative width
        ("bird", (45, 35, 60, 50), 1),           # partly outside: kept (clipped later)
    ]
    _write(voc, "000005", voc_xml("000005", 50, 40, objects))
    with caplog.at_level("WARNING"):
        records = load_voc_instances(voc, "trainval")
    assert [(a["category_id"], a["bbox"]) for a in records[0]["annotations"]] == [
        (VOC_CLASSES.index("dog"), [0.0, 0.0, 10.0, 20.0]), (VOC_CLASSES.index("bird"), [44.0, 34.0, 60.0, 50.0])]
    assert records[1]["annotations"][0]["category_id"] == VOC_CLASSES.index("car")  # other files untouched
    text = caplog.text
    assert f"{os.path.join(voc, 'Annotations')}: dropped 5 unusable object(s)" in text
    assert "2 with non-finite bbox (objects 000005.xml #1, 000005.xml #2)" in text
    assert "1 with bbox far outside the image (objects 000005.xml #3)" in text
    assert "1 with bbox outside the image (objects 000005.xml #4)" in text
    assert "1 with bbox with zero or negative width or height (objects 000005.xml #5)" in text
    # The VOC evaluator's ground truth is these records: it never sees the dropped boxes.
    from detcore.evaluation import PascalVOCDetectionEvaluator

    ev = PascalVOCDetectionEvaluator("x", records_fn=lambda n: records, metadata_fn=lambda n: {"thing_classes": VOC_CLASSES})
    assert np.isfinite(ev._ground_truth[0][0]).all() and len(ev._ground_truth[0][0]) == 2


def test_missing_files_are_named(voc):
    os.remove(os.path.join(voc, "Annotations", "000007.xml"))
    with pytest.raises(FileNotFoundError, match="000007.xml"):
        load_voc_instances(voc, "trainval")
    with pytest.raises(FileNotFoundError, match=r"ImageSets/Main/val.txt"):
        load_voc_instances(voc, "val")
