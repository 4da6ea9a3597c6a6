"""The synthetic keypoint dataset "figures", checked through pycocotools' reading of its json."""
import contextlib
import io
import json
import os

import cv2
import numpy as np
import pytest
from pycocotools.coco import COCO

from detcore.data import DatasetCatalog, MetadataCatalog, register_figures
from detcore.data.datasets import FiguresSpec, ensure_figures_dataset
from detcore.data.datasets.figures import FIGURE_FLIP_MAP, FIGURE_KEYPOINT_NAMES, FIGURE_OKS_SIGMAS

SPEC = FiguresSpec(split="train", num_images=30, seed=1)
NAME = {n: i for i, n in enumerate(FIGURE_KEYPOINT_NAMES)}


@pytest.fixture
def generated(tmp_path):
    folder = ensure_figures_dataset(SPEC, str(tmp_path / "c"))
    with contextlib.redirect_stdout(io.StringIO()):
        coco = COCO(os.path.join(folder, "annotations.json"))
    return folder, coco


def test_two_generations_are_byte_identical_and_the_seed_matters(tmp_path):
    small = FiguresSpec(split="train", num_images=5, seed=1)
    a, b = ensure_figures_dataset(small, str(tmp_path / "a")), ensure_figures_dataset(small, str(tmp_path / "b"))
    files = sorted(os.listdir(os.path.join(a, "images")))
    assert len(files) == 5
    for rel in ["annotations.json"] + [os.path.join("images", f) for f in files]:
        with open(os.path.join(a, rel), "rb") as fa, open(os.path.join(b, rel), "rb") as fb:
            assert fa.read() == fb.read(), rel
    other = ensure_figures_dataset(FiguresSpec(split="train", num_images=5, seed=2), str(tmp_path / "a"))
    load = lambda folder: json.load(open(os.path.join(folder, "annotations.json")))["annotations"]  # noqa: E731
    assert load(other) != load(a)


def test_the_category_describes_the_keypoints(generated):
    _, coco = generated
    (category,) = coco.loadCats(coco.getCatIds())
    assert category["keypoints"] == list(FIGURE_KEYPOINT_NAMES) and len(category["skeleton"]) == 10
    assert category["keypoint_flip_map"] == [list(p) for p in FIGURE_FLIP_MAP]
    assert category["keypoint_oks_sigmas"] == list(FIGURE_OKS_SIGMAS)


def test_keypoints_follow_cocos_rules(generated):
    folder, coco = generated
    counts = np.zeros(3, dtype=int)  # points per visibility
    for img in coco.loadImgs(coco.getImgIds()):
        image = cv2.imread(os.path.join(folder, "images", img["file_name"]))
        anns = coco.loadAnns(coco.getAnnIds(imgIds=img["id"]))
        assert 1 <= len(anns) <= 3
        for ann in anns:
            kp = np.asarray(ann["keypoints"], dtype=float).reshape(-1, 3)
            assert kp.shape == (9, 3) and ann["num_keypoints"] == int((kp[:, 2] > 0).sum()) >= 1
            counts += np.bincount(kp[:, 2].astype(int), minlength=3)
            assert (kp[kp[:, 2] == 0] == 0).all()  # unlabeled: (0, 0, 0)
            labeled = kp[kp[:, 2] > 0]
            # Labeled points are pixel indices inside the image.
            assert (labeled[:, 0] >= -0.5).all() and (labeled[:, 0] < img["width"] - 0.5).all()
            assert (labeled[:, 1] >= -0.5).all() and (labeled[:, 1] < img["height"] - 0.5).all()
            mask = coco.annToMask(ann).astype(bool)
            assert ann["area"] == mask.sum() > 0
            for x, y, v in labeled:
                c, r = int(x + 0.5), int(y + 0.5)  # the pixel holding the point
                near = mask[max(r - 1, 0) : r + 2, max(c - 1, 0) : c + 2].any()
                assert near == (v == 2), (img["file_name"], ann["id"], x, y, v)
            # Facing the viewer: the left shoulder is on the image's right (tilts stay under 30 deg).
            ls, rs = kp[NAME["left_shoulder"]], kp[NAME["right_shoulder"]]
            if ls[2] and rs[2]:
                assert ls[0] > rs[0]
        assert image.shape[:2] == (img["height"], img["width"])
    # All three visibility states occur: outside the image, occluded, visible.
    assert counts[0] >= 5 and counts[1] >= 5 and counts[2] > 100, counts


def test_registered_split_loads_with_its_metadata(tmp_path):
    name = "test_figures_tiny"
    register_figures(name, FiguresSpec(split="val", num_images=4, seed=3), cache_dir=str(tmp_path))
    try:
        records = DatasetCatalog.get(name)
        assert len(records) == 4 and all(len(a["keypoints"]) == 27 for r in records for a in r["annotations"])
        meta = MetadataCatalog.get(name)
        assert meta.keypoint_names == list(FIGURE_KEYPOINT_NAMES) and meta.evaluator_type == "coco"
        assert ("left_hand", "right_hand") in meta.keypoint_flip_map
    finally:
        DatasetCatalog.remove(name)
        MetadataCatalog.remove(name)


def test_spec_checks():
    with pytest.raises(ValueError, match="min_size <= max_size"):
        FiguresSpec(min_size=200, max_size=100)
    with pytest.raises(ValueError, match="split must be"):
        FiguresSpec(split="a/b")
