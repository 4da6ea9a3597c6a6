"""Records -> COCO json: the converted json scores predictions exactly as the original json does,
its cache is reused while the records are unchanged and replaced when they change."""
import json
import os

import numpy as np
import pycocotools.mask as mask_util
import pytest
import torch

from detcore.data import MetadataCatalog, load_coco_json
from detcore.data.datasets import coco_conversion
from detcore.data.datasets.coco_conversion import annotation_area, convert_to_coco_dict, convert_to_coco_json
from detcore.evaluation import COCOEvaluator
from detcore.structures import Boxes, Instances

H, W = 60, 80
CATEGORIES = [{"id": 3, "name": "cat"}, {"id": 7, "name": "dog"}]  # sparse ids, as in COCO


def _rect(x, y, w, h):
    return [[x, y, x + w, y, x + w, y + h, x, y + h]]


def _original_json(tmp_path):
    """Three images: polygons (one with two parts), a crowd RLE (uncompressed, as COCO writes
    crowds) and a compressed-RLE instance, of two sparse category ids."""
    crowd = np.zeros((H, W), np.uint8)
    crowd[40:58, 2:30] = 1
    crowd_rle = mask_util.encode(np.asfortranarray(crowd))
    # Uncompressed counts: column-major run lengths starting with zeros.
    flat = crowd.flatten(order="F")
    runs, value, count = [], 0, 0
    for v in flat:
        if v == value:
            count += 1
        else:
            runs.append(count)
            value, count = v, 1
    runs.append(count)
    blob = np.zeros((H, W), np.uint8)
    blob[5:25, 50:75] = 1
    blob[10:15, 55:60] = 0  # a hole: only an RLE can say so
    blob_rle = mask_util.encode(np.asfortranarray(blob))
    blob_rle["counts"] = blob_rle["counts"].decode()

    anns = [
        {"id": 1, "image_id": 10, "category_id": 3, "bbox": [4, 4, 20, 16], "iscrowd": 0, "segmentation": _rect(4, 4, 20, 16)},
        {"id": 2, "image_id": 10, "category_id": 7, "bbox": [30, 10, 40, 30], "iscrowd": 0,
         "segmentation": _rect(30, 10, 15, 30) + _rect(50, 10, 20, 30)},
        {"id": 3, "image_id": 11, "category_id": 3, "bbox": [2, 40, 28, 18], "iscrowd": 1,
         "segmentation": {"size": [H, W], "counts": runs}},
        {"id": 4, "image_id": 11, "category_id": 3, "bbox": [40, 2, 30, 30], "iscrowd": 0, "segmentation": _rect(40, 2, 30, 30)},
        {"id": 5, "image_id": 12, "category_id": 7, "bbox": [50, 5, 25, 20], "iscrowd": 0, "segmentation": blob_rle},
        {"id": 6, "image_id": 12, "category_id": 3, "bbox": [1, 1, 6, 5], "iscrowd": 0, "segmentation": _rect(1, 1, 6, 5)},
    ]
    assert mask_util.area(crowd_rle) == sum(runs[1::2])
    data = {
        "images": [{"id": i, "file_name": f"{i}.jpg", "height": H, "width": W} for i in (10, 11, 12)],
        "annotations": anns,
        "categories": CATEGORIES,
    }
    path = tmp_path / "original.json"
    path.write_text(json.dumps(data))
    return str(path)


def _predictions(records, seed):
    """Per image: each ground truth jittered (box and mask), plus a false positive; random scores."""
    rng = np.random.default_rng(seed)
    out = {}
    for r in records:
        boxes, classes, masks = [], [], []
        for a in r["annotations"]:
            box = np.asarray(a["bbox"]) + rng.normal(0, 2.0, 4)
            boxes.append(box)
            classes.append(a["category_id"])
            mask = np.zeros((H, W), bool)
            x1, y1, x2, y2 = np.clip(np.round(box), 0, [W, H, W, H]).astype(int)
            mask[y1:y2, x1:x2] = True
            masks.append(mask)
        boxes.append([10, 30, 40, 55])
        classes.append(1)
        fp = np.zeros((H, W), bool)
        fp[30:55, 10:40] = True
        masks.append(fp)
        out[r["image_id"]] = Instances(
            (H, W),
            pred_boxes=Boxes(torch.tensor(np.asarray(boxes), dtype=torch.float32)),
            scores=torch.tensor(rng.uniform(0.05, 1.0, len(boxes)), dtype=torch.float32),
            pred_classes=torch.tensor(classes),
            pred_masks=torch.from_numpy(np.stack(masks)),
        )
    return out


def _evaluate(evaluator, predictions):
    evaluator.reset()
    for image_id, inst in predictions.items():
        evaluator.process([{"image_id": image_id}], [{"instances": inst}])
    return evaluator.evaluate()


def _register_from_code(register, records, classes, mapping):
    name = register("from_code", lambda: [dict(r) for r in records])
    MetadataCatalog.get(name).set(thing_classes=classes, thing_dataset_id_to_contiguous_id=mapping)
    return name


def test_converted_json_gives_the_ap_of_the_original(tmp_path, register):
    original = _original_json(tmp_path)
    records = load_coco_json(original, str(tmp_path))
    classes, mapping = ["cat", "dog"], {3: 0, 7: 1}
    name = _register_from_code(register, records, classes, mapping)

    for seed in range(3):
        preds = _predictions(records, seed)
        expected = _evaluate(COCOEvaluator(original, ("bbox", "segm"), dataset_id_to_contiguous_id=mapping), preds)
        out = tmp_path / f"out{seed}"
        got = _evaluate(COCOEvaluator(name, ("bbox", "segm"), str(out), metadata_fn=MetadataCatalog.get), preds)
        assert set(got) == {"bbox", "segm"}
        for task in got:
            assert got[task].keys() == expected[task].keys()
            for key, value in expected[task].items():
                assert got[task][key] == pytest.approx(value, nan_ok=True), (seed, task, key)
        assert 0 < got["segm"]["AP"] < 100 and 0 < got["bbox"]["AP"] < 100
        (converted,) = [p for p in os.listdir(out) if p.startswith(name)]
        assert converted.endswith(".json")


def test_converted_json_content(tmp_path):
    original = _original_json(tmp_path)
    records = load_coco_json(original, str(tmp_path))
    orig = json.loads(open(original).read())
    coco = convert_to_coco_dict(records, ["cat", "dog"], {3: 0, 7: 1}, "toy")
    assert coco["categories"] == CATEGORIES
    assert [i["id"] for i in coco["images"]] == [10, 11, 12]
    assert len(coco["annotations"]) == len(orig["annotations"])
    for a, b in zip(coco["annotations"], orig["annotations"]):
        assert a["id"] >= 1  # COCOeval reads gt id 0 as "unmatched"
        assert (a["image_id"], a["category_id"], a["iscrowd"]) == (b["image_id"], b["category_id"], b["iscrowd"])
        assert a["bbox"] == pytest.approx(b["bbox"])
        assert a["segmentation"] == b["segmentation"]
        assert a["area"] == pytest.approx(annotation_area(b["segmentation"], b["bbox"], H, W))
    # Hand-checked areas: a 20x16 rectangle covers 320 pixels; the two-part polygon 15*30 + 20*30.
    assert coco["annotations"][0]["area"] == 320
    assert coco["annotations"][1]["area"] == 15 * 30 + 20 * 30
    assert coco["annotations"][4]["area"] == 25 * 20 - 25


def test_bitmask_and_box_only_annotations():
    mask = np.zeros((H, W), bool)
    mask[3:9, 10:20] = True
    records = [
        {"image_id": 1, "file_name": "a.jpg", "height": H, "width": W, "annotations": [
            {"bbox": [10.0, 3.0, 20.0, 9.0], "category_id": 0, "segmentation": mask},
            {"bbox": [0.0, 0.0, 5.0, 4.0], "category_id": 1, "segmentation": torch.from_numpy(mask)},
        ]},
        {"image_id": 2, "file_name": "b.jpg", "height": H, "width": W, "annotations": [
            {"bbox": [1.0, 2.0, 4.5, 6.0], "category_id": 1, "iscrowd": 1},
        ]},
    ]
    coco = convert_to_coco_dict(records, ["a", "b"])
    first, second, box_only = coco["annotations"]
    assert isinstance(first["segmentation"]["counts"], str)
    assert mask_util.decode(first["segmentation"]).astype(bool).tolist() == mask.tolist()
    assert first["area"] == 60 and second["segmentation"] == first["segmentation"]
    assert box_only == {"id": 3, "image_id": 2, "category_id": 1, "bbox": [1.0, 2.0, 3.5, 4.0], "iscrowd": 1, "area": 14.0}
    assert [c["id"] for c in coco["categories"]] == [0, 1]  # no mapping: contiguous ids


def test_cache_is_reused_while_unchanged_and_replaced_when_changed(tmp_path, register, monkeypatch):
    records = load_coco_json(_original_json(tmp_path), str(tmp_path))
    classes = ["cat", "dog"]
    out = str(tmp_path / "out")
    calls = []
    real = coco_conversion.convert_to_coco_dict
    monkeypatch.setattr(coco_conversion, "convert_to_coco_dict", lambda *a: calls.append(1) or real(*a))

    meta = {"thing_classes": classes}
    first = convert_to_coco_json("toy", out, records, meta)
    again = convert_to_coco_json("toy", out, [dict(r) for r in load_coco_json(_original_json(tmp_path), str(tmp_path))], meta)
    assert again == first and len(calls) == 1
    # Same content with an old timestamp, or a newer one: still reused (content, not time).
    os.utime(first, (0, 0))
    assert convert_to_coco_json("toy", out, records, meta) == first and len(calls) == 1

    records[1]["annotations"][1]["bbox"][0] += 0.5  # one coordinate moves
    changed = convert_to_coco_json("toy", out, records, meta)
    assert changed != first and len(calls) == 2
    assert not os.path.exists(first)  # the stale conversion is gone
    assert json.load(open(changed))["annotations"][3]["bbox"][0] == pytest.approx(40.5)
    renamed = convert_to_coco_json("toy", out, records, {"thing_classes": ["cat", "hound"]})
    assert renamed != changed and len(calls) == 3
    # Another dataset's conversion in the same folder is left alone.
    other = convert_to_coco_json("toy_2", out, records, meta)
    assert os.path.exists(renamed) and os.path.exists(other)


def test_write_is_atomic(tmp_path, monkeypatch):
    records = load_coco_json(_original_json(tmp_path), str(tmp_path))
    out = tmp_path / "out"

    seen_while_writing = []

    def killed(obj, f):
        f.write('{"images": [')
        f.flush()
        # A reader (or a run killed right now, with no cleanup) must not find a json yet.
        seen_while_writing.extend(p for p in os.listdir(out) if p.endswith(".json"))
        raise KeyboardInterrupt

    monkeypatch.setattr(coco_conversion.json, "dump", killed)
    with pytest.raises(KeyboardInterrupt):
        convert_to_coco_json("toy", str(out), records, {"thing_classes": ["cat", "dog"]})
    assert seen_while_writing == []
    assert os.listdir(out) == []  # nor its temporary file after the interruption
    monkeypatch.undo()
    path = convert_to_coco_json("toy", str(out), records, {"thing_classes": ["cat", "dog"]})
    assert len(json.load(open(path))["annotations"]) == 6


def test_evaluator_without_output_dir_caches_in_the_detcore_cache(tmp_path, register):
    records = load_coco_json(_original_json(tmp_path), str(tmp_path))
    name = _register_from_code(register, records, ["cat", "dog"], {3: 0, 7: 1})
    COCOEvaluator(name, "bbox", metadata_fn=MetadataCatalog.get)
    cache = tmp_path / "cache" / "coco_json"  # $DETCORE_CACHE of the data tests' fixture
    assert [p for p in os.listdir(cache) if p.startswith(name)]


@pytest.mark.parametrize(
    "record, classes, match",
    [
        ({"file_name": "x.jpg", "height": H, "width": W, "annotations": []}, ["a"], "int 'image_id'"),
        ({"image_id": "img1", "height": H, "width": W}, ["a"], "int 'image_id'"),
        ({"image_id": 1, "height": 0, "width": W}, ["a"], "'height' and 'width'"),
        ({"image_id": 1, "height": H, "width": W, "annotations": [{"id": 9, "bbox": [0, 0, 1, 1], "category_id": 1}]},
         ["a"], r"annotation 9: category_id must be an int in \[0, 1\)"),
        ({"image_id": 1, "height": H, "width": W, "annotations": [{"bbox": [0, 0, 1], "category_id": 0}]},
         ["a"], "bbox must be 4 numbers"),
        ({"image_id": 1, "height": H, "width": W, "annotations": [
            {"bbox": [0, 0, 1, 1], "category_id": 0, "segmentation": np.zeros((3, 3), bool)}]},
         ["a"], r"bitmask segmentation must be \[H, W\]"),
        ({"image_id": 1, "height": H, "width": W, "annotations": [
            {"bbox": [0, 0, 1, 1], "category_id": 0, "segmentation": [[0, 0, 1, 1]]}]},
         ["a"], "3 or more"),
    ],
)
def test_bad_records_are_named(record, classes, match):
    with pytest.raises(ValueError, match=match) as info:
        convert_to_coco_dict([record], classes, dataset_name="mine")
    assert "'mine' record #0" in str(info.value)


def test_duplicate_image_ids_and_missing_classes(tmp_path):
    rec = {"image_id": 1, "height": H, "width": W}
    with pytest.raises(ValueError, match="image_id 1 is used by two records"):
        convert_to_coco_dict([rec, dict(rec)], ["a"])
    with pytest.raises(ValueError, match="no thing_classes"):
        convert_to_coco_json("mine", str(tmp_path), [rec], {})
