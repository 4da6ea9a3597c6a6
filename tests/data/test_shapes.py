"""The synthetic shapes dataset, checked through pycocotools' reading of the generated json."""
import contextlib
import io
import json
import os

import cv2
import numpy as np
import pytest
from pycocotools.coco import COCO

from detcore.data import DatasetCatalog, MetadataCatalog, register_shapes
from detcore.data.datasets import ShapesSpec, ensure_shapes_dataset, get_cache_dir
from detcore.data.datasets import generated as generated_module
from detcore.data.datasets import shapes as shapes_module

SPEC = ShapesSpec(split="train", num_images=20, seed=1)


@pytest.fixture
def generated(tmp_path):
    folder = ensure_shapes_dataset(SPEC, str(tmp_path / "c"))
    with contextlib.redirect_stdout(io.StringIO()):
        coco = COCO(os.path.join(folder, "annotations.json"))
    return folder, coco


def test_two_generations_are_byte_identical(tmp_path):
    a = ensure_shapes_dataset(SPEC, str(tmp_path / "a"))
    b = ensure_shapes_dataset(SPEC, str(tmp_path / "b"))
    files = sorted(os.listdir(os.path.join(a, "images")))
    assert len(files) == 20 and files == sorted(os.listdir(os.path.join(b, "images")))
    for rel in ["annotations.json"] + [os.path.join("images", f) for f in files]:
        with open(os.path.join(a, rel), "rb") as fa, open(os.path.join(b, rel), "rb") as fb:
            assert fa.read() == fb.read(), rel


def test_seed_and_split_change_the_data(tmp_path):
    base = json.load(open(os.path.join(ensure_shapes_dataset(SPEC, str(tmp_path)), "annotations.json")))
    for other in (ShapesSpec(split="train", num_images=20, seed=2), ShapesSpec(split="val", num_images=20, seed=1)):
        data = json.load(open(os.path.join(ensure_shapes_dataset(other, str(tmp_path)), "annotations.json")))
        assert data["annotations"] != base["annotations"]


def test_json_is_coco(generated):
    folder, coco = generated
    assert [c["name"] for c in coco.loadCats(sorted(coco.getCatIds()))] == ["circle", "square", "triangle"]
    assert len(coco.getImgIds()) == 20
    classes = set()
    for img in coco.loadImgs(coco.getImgIds()):
        assert 96 <= img["height"] <= 160 and 96 <= img["width"] <= 160
        image = cv2.imread(os.path.join(folder, "images", img["file_name"]))
        assert image.shape == (img["height"], img["width"], 3)
        classes |= {a["category_id"] for a in coco.loadAnns(coco.getAnnIds(imgIds=img["id"]))}
    assert classes == {1, 2, 3}


def test_masks_boxes_and_areas_agree(generated):
    _, coco = generated
    for ann in coco.loadAnns(coco.getAnnIds()):
        mask = coco.annToMask(ann).astype(bool)  # pycocotools rasterizes the polygons
        rows, cols = np.nonzero(mask)
        x, y = cols.min(), rows.min()
        assert ann["bbox"] == [x, y, cols.max() + 1 - x, rows.max() + 1 - y], ann["id"]
        assert ann["area"] == mask.sum() >= 20, ann["id"]
        assert ann["iscrowd"] == 0


def test_occluded_masks_do_not_overlap_and_match_the_pixels(generated):
    folder, coco = generated
    overlapping_boxes = 0
    for img in coco.loadImgs(coco.getImgIds()):
        anns = coco.loadAnns(coco.getAnnIds(imgIds=img["id"]))
        masks = np.stack([coco.annToMask(a).astype(bool) for a in anns])
        assert masks.sum(0).max() <= 1, img["file_name"]
        boxes = np.array([a["bbox"] for a in anns], dtype=float)
        for i in range(len(boxes)):
            for j in range(i + 1, len(boxes)):
                (x1, y1, w1, h1), (x2, y2, w2, h2) = boxes[i], boxes[j]
                overlapping_boxes += min(x1 + w1, x2 + w2) > max(x1, x2) and min(y1 + h1, y2 + h2) > max(y1, y2)
        # Each instance is painted one colour (+ shading and noise): the image inside a mask
        # varies far less than across the whole image.
        image = cv2.imread(os.path.join(folder, "images", img["file_name"])).astype(float)
        for m in masks:
            assert image[m].std(0).max() < 20
    assert overlapping_boxes > 0  # occlusion really happens in this sample


def test_generation_is_atomic(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    real_write = generated_module.write_png
    written = []

    def dying_write(path, image):
        if len(written) == 5:
            raise KeyboardInterrupt("killed")
        written.append(path)
        real_write(path, image)

    monkeypatch.setattr(generated_module, "write_png", dying_write)
    with pytest.raises(KeyboardInterrupt):
        ensure_shapes_dataset(SPEC, str(cache))
    assert os.listdir(cache) == []  # neither the final folder nor the temporary one is left
    assert os.path.dirname(os.path.dirname(written[0])).startswith(str(cache / f".{SPEC.dirname}.tmp-"))

    monkeypatch.setattr(generated_module, "write_png", real_write)
    folder = ensure_shapes_dataset(SPEC, str(cache))
    assert os.listdir(cache) == [SPEC.dirname]
    assert len(os.listdir(os.path.join(folder, "images"))) == 20


def test_stale_temporary_folders_are_cleaned(tmp_path):
    stale = tmp_path / f".{SPEC.dirname}.tmp-dead"
    fresh = tmp_path / f".{SPEC.dirname}.tmp-running"
    for d in (stale, fresh):
        d.mkdir()
    os.utime(stale, (0, 0))  # last touched in 1970
    ensure_shapes_dataset(SPEC, str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == sorted([SPEC.dirname, fresh.name])


def test_existing_cache_is_reused(tmp_path, monkeypatch):
    folder = ensure_shapes_dataset(SPEC, str(tmp_path))

    def fail(*args):
        raise AssertionError("regenerated")

    monkeypatch.setattr(shapes_module, "generate_shapes_split", fail)
    assert ensure_shapes_dataset(SPEC, str(tmp_path)) == folder


def test_cache_dir_follows_env(tmp_path, monkeypatch):
    assert get_cache_dir() == str(tmp_path / "cache")  # set by the autouse fixture
    monkeypatch.delenv("DETCORE_CACHE")
    assert get_cache_dir() == os.path.join(os.path.expanduser("~"), ".cache", "detcore")


def test_registered_split_generates_on_first_use(tmp_path):
    name = "shapes_registered_test"
    register_shapes(name, ShapesSpec(split="val", num_images=20, seed=5))
    try:
        assert not (tmp_path / "cache").exists()  # registering reads and writes nothing
        records = DatasetCatalog.get(name)
        assert len(records) == 20
        assert os.listdir(tmp_path / "cache") == [ShapesSpec(split="val", num_images=20, seed=5).dirname]
        meta = MetadataCatalog.get(name)
        assert meta.json_file.startswith(str(tmp_path / "cache")) and os.path.isfile(meta.json_file)
        assert meta.thing_dataset_id_to_contiguous_id == {1: 0, 2: 1, 3: 2}
        cats = {a["category_id"] for r in records for a in r["annotations"]}
        assert cats <= {0, 1, 2}
        assert all(os.path.isfile(r["file_name"]) for r in records)
    finally:
        DatasetCatalog.remove(name)
        MetadataCatalog.remove(name)


@pytest.mark.parametrize(
    "kwargs, message",
    [({"num_images": 0}, "num_images"), ({"min_size": 200}, "min_size"), ({"split": "a/b"}, "split"),
     ({"max_shapes": 0}, "max_shapes")],
)
def test_spec_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ShapesSpec(**kwargs)
