"""COCO person-keypoint annotations through the loader: the pixel-center convention, COCO's
visibility rules, the keypoint metadata of the categories, and an error naming the annotation for
every malformed keypoint array."""
import copy
import math

import pytest

from detcore.data import DatasetCatalog, MetadataCatalog, load_coco_json
from detcore.data.build import filter_images_with_few_keypoints
from detcore.data.datasets import coco_person_keypoint_metadata, infer_flip_map, keypoint_metadata_from_categories
from detcore.data.datasets.keypoint_meta import COCO_PERSON_KEYPOINT_NAMES, COCO_PERSON_OKS_SIGMAS

from .files import write_json, write_png

NAMES = ["head", "left_hand", "right_hand"]
DATA = {
    "images": [
        {"id": 1, "file_name": "a.png", "height": 40, "width": 60},
        {"id": 2, "file_name": "b.png", "height": 40, "width": 60},
    ],
    "annotations": [
        {"id": 7, "image_id": 1, "category_id": 1, "bbox": [5, 5, 30, 30], "iscrowd": 0,
         "keypoints": [10, 12, 2, 30, 20, 1, 4, 4, 0], "num_keypoints": 2},
        {"id": 8, "image_id": 2, "category_id": 1, "bbox": [5, 5, 30, 30], "iscrowd": 0,
         "keypoints": [0, 0, 0, 0, 0, 0, 0, 0, 0], "num_keypoints": 0},
    ],
    "categories": [
        {"id": 1, "name": "figure", "keypoints": NAMES, "skeleton": [[1, 2], [1, 3]],
         "keypoint_oks_sigmas": [0.05, 0.06, 0.06]},
    ],
}  # fmt: skip


def _load(tmp_path, data, name=None):
    (tmp_path / "img").mkdir(exist_ok=True)
    for img in data["images"]:
        write_png(tmp_path / "img" / img["file_name"], img["height"], img["width"])
    return load_coco_json(write_json(tmp_path / "k.json", data), tmp_path / "img", name)


def test_keypoints_become_pixel_centers_and_unlabeled_points_zeros(tmp_path):
    records = _load(tmp_path, DATA)
    assert records[0]["annotations"][0]["keypoints"] == [10.5, 12.5, 2.0, 30.5, 20.5, 1.0, 0.0, 0.0, 0.0]
    assert records[1]["annotations"][0]["keypoints"] == [0.0] * 9


def test_the_categories_give_the_keypoint_metadata(tmp_path, register):
    name = register("kp", lambda: _load(tmp_path, DATA, name))
    DatasetCatalog.get(name)
    meta = MetadataCatalog.get(name)
    assert meta.keypoint_names == NAMES
    assert meta.keypoint_skeleton == [("head", "left_hand"), ("head", "right_hand")]
    assert meta.keypoint_flip_map == [("left_hand", "right_hand")]  # from the names
    assert meta.keypoint_oks_sigmas == [0.05, 0.06, 0.06]
    DatasetCatalog.get(name)  # loading again sets the same values: no conflict


@pytest.mark.parametrize(
    "keypoints, message",
    [
        ([10, 12, 2, 30, 20], "3 numbers \\(x, y, visibility\\) per keypoint, got 5 numbers"),
        ([10, 12, 2, 30, 20, 1], "has 2 keypoints, but its category declares 3 keypoint names"),
        ([10, 12, 3, 30, 20, 1, 0, 0, 0], "visibility must be 0 \\(unlabeled\\), 1 \\(occluded\\) or 2 \\(visible\\), got 3"),
        ([10, "12", 2, 30, 20, 1, 0, 0, 0], "non-empty flat list of numbers"),
        ({"x": 1}, "non-empty flat list of numbers"),
        ([10, 12, True, 30, 20, 1, 0, 0, 0], "non-empty flat list of numbers"),
    ],
)
def test_malformed_keypoints_are_errors_naming_the_annotation(tmp_path, keypoints, message):
    data = copy.deepcopy(DATA)
    data["annotations"][0]["keypoints"] = keypoints
    data["annotations"][0].pop("num_keypoints")
    with pytest.raises(ValueError, match=f"k.json: annotation id 7: .*{message}"):
        _load(tmp_path, data)


def test_num_keypoints_must_count_the_labeled_points(tmp_path):
    data = copy.deepcopy(DATA)
    data["annotations"][0]["num_keypoints"] = 3
    with pytest.raises(ValueError, match="annotation id 7: num_keypoints is 3 but 2 keypoints are labeled"):
        _load(tmp_path, data)


def test_annotations_without_a_declared_count_must_agree(tmp_path):
    data = copy.deepcopy(DATA)
    data["categories"][0].pop("keypoints")
    data["categories"][0].pop("skeleton")
    data["categories"][0].pop("keypoint_oks_sigmas")
    data["annotations"][1]["keypoints"] = [0, 0, 0]
    with pytest.raises(ValueError, match="annotation id 8: has 1 keypoints where earlier annotations have 3"):
        _load(tmp_path, data)


def test_a_non_finite_labeled_keypoint_drops_the_annotation(tmp_path, caplog):
    data = copy.deepcopy(DATA)
    data["annotations"][0]["keypoints"][0] = math.nan
    records = _load(tmp_path, data)
    assert records[0]["annotations"] == []
    assert "non-finite keypoint coordinate (annotation ids 7)" in caplog.text
    data["annotations"][0]["keypoints"] = [10, 12, 2, 30, 20, 1, math.inf, 4, 0]  # unlabeled: ignored
    assert len(_load(tmp_path, data)[0]["annotations"]) == 1


def test_category_keypoint_fields_are_checked(tmp_path):
    for field, value, message in [
        ("skeleton", [[1, 4]], r"'skeleton' entries must be \[i, j\] with 1 <= i, j <= 3"),
        ("keypoint_flip_map", [["left_hand", "head", "x"]], "'keypoint_flip_map' entries must be"),
        ("keypoint_oks_sigmas", [0.05, 0.06], "'keypoint_oks_sigmas' must be 3 positive numbers"),
        ("keypoints", ["a", "a", "b"], "keypoint names must be unique"),
    ]:
        data = copy.deepcopy(DATA)
        data["categories"][0][field] = value
        with pytest.raises(ValueError, match=f"category 1 \\('figure'\\): {message}"):
            _load(tmp_path, data)


def test_categories_must_declare_one_keypoint_set():
    categories = [
        {"id": 1, "name": "a", "keypoints": ["x", "y"]},
        {"id": 2, "name": "b", "keypoints": ["x", "z"]},
    ]
    with pytest.raises(ValueError, match="declares other keypoints"):
        keypoint_metadata_from_categories(categories, "f.json")
    assert keypoint_metadata_from_categories([{"id": 1, "name": "a"}], "f.json") == {}


def test_coco_person_metadata():
    meta = coco_person_keypoint_metadata()
    assert meta["keypoint_names"] == list(COCO_PERSON_KEYPOINT_NAMES) and len(meta["keypoint_skeleton"]) == 19
    assert len(meta["keypoint_flip_map"]) == 8 and ("left_ankle", "right_ankle") in meta["keypoint_flip_map"]
    assert meta["keypoint_oks_sigmas"][0] == pytest.approx(0.026) and len(meta["keypoint_oks_sigmas"]) == 17
    # A json with COCO's names and no sigma field gets COCO's sigmas.
    parsed = keypoint_metadata_from_categories([{"id": 1, "name": "person", "keypoints": list(COCO_PERSON_KEYPOINT_NAMES)}], "p.json")
    assert parsed["keypoint_oks_sigmas"] == COCO_PERSON_OKS_SIGMAS


def test_flip_map_from_names():
    assert infer_flip_map(["nose", "left_eye", "right_eye", "LeftHand", "RightHand", "left_only"]) == [
        ("left_eye", "right_eye"),
        ("LeftHand", "RightHand"),
    ]


def test_builtin_coco_person_names_are_registered():
    for name in ("coco_2017_train_person", "coco_2017_val_person"):
        assert name in DatasetCatalog
        meta = MetadataCatalog.get(name)
        assert meta.thing_classes == ["person"] and meta.keypoint_names == list(COCO_PERSON_KEYPOINT_NAMES)
        assert meta.json_file.endswith(f"person_keypoints_{name.split('_')[2]}2017.json")


def test_images_with_few_keypoints_are_filtered():
    def record(*visibilities, crowd=0):
        return {"annotations": [{"keypoints": [1, 1, v] * 1, "iscrowd": crowd} for v in visibilities]}

    records = [record(2, 1), record(0, 2), record(0), record(2, 2, crowd=1)]
    assert filter_images_with_few_keypoints(records, 2) == records[:1]
    assert filter_images_with_few_keypoints(records, 1) == records[:2]
    with pytest.raises(ValueError, match="MIN_KEYPOINTS_PER_IMAGE"):
        filter_images_with_few_keypoints(records, 3)


def test_records_convert_back_to_the_jsons_keypoints(tmp_path):
    """A dataset registered from code is evaluated through a converted json: its keypoints must
    come back as COCO's pixel indices, with their counts."""
    from detcore.data.datasets import convert_to_coco_dict

    records = _load(tmp_path, DATA)
    converted = convert_to_coco_dict(records, ["figure"], {1: 0})
    for original, ann in zip(DATA["annotations"], converted["annotations"]):
        triplets = [original["keypoints"][i : i + 3] for i in range(0, len(original["keypoints"]), 3)]
        # Unlabeled points as COCO writes them: (0, 0, 0).
        assert ann["keypoints"] == [float(v) if t[2] else 0.0 for t in triplets for v in t]
        assert ann["num_keypoints"] == original["num_keypoints"]
