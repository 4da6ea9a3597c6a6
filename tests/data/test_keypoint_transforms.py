"""Keypoints through the data pipeline: they follow every geometric transform through its point
map, leave the labeled set when they leave the image, and swap left/right names exactly when a
transform mirrors the image."""
import numpy as np
import pytest
import torch

from detcore.config import get_cfg
from detcore.data import DatasetCatalog, DatasetMapper, load_coco_json
from detcore.data.detection_utils import annotations_to_instances, transform_keypoint_annotations
from detcore.data.transforms import (
    HFlipTransform,
    NoOpTransform,
    RandomFlip,
    ResizeShortestEdge,
    ResizeTransform,
    Transform,
    TransformList,
    VFlipTransform,
    mirrors,
)
from detcore.utils.registry import build_from_config

from .files import write_json, write_png

NAMES = ["head", "left_hand", "right_hand"]
FLIP = [0, 2, 1]


class Transpose(Transform):
    """x <-> y: a mirror across the diagonal (no flip class, still a mirror)."""

    def apply_coords(self, coords):
        return np.asarray(coords, dtype=np.float64)[:, ::-1].copy()


class Rotate90(Transform):
    """A quarter turn of an h x w image: (x, y) -> (h - y, x). No mirror."""

    def __init__(self, h):
        self.h = h

    def apply_coords(self, coords):
        c = np.asarray(coords, dtype=np.float64)
        return np.stack([self.h - c[:, 1], c[:, 0]], axis=1)


class Shift(Transform):
    """A crop's point map: the crop's top-left corner becomes the origin."""

    def __init__(self, x0, y0):
        self.x0, self.y0 = x0, y0

    def apply_coords(self, coords):
        return np.asarray(coords, dtype=np.float64) - [self.x0, self.y0]


@pytest.mark.parametrize(
    "transforms, expected",
    [
        ([NoOpTransform()], False),
        ([ResizeTransform(40, 60, 80, 30)], False),
        ([HFlipTransform(60)], True),
        ([VFlipTransform(40)], True),
        ([HFlipTransform(60), VFlipTransform(40)], False),  # a half turn
        ([ResizeTransform(40, 60, 20, 30), HFlipTransform(30)], True),
        ([HFlipTransform(60), HFlipTransform(60)], False),
        ([Transpose()], True),
        ([Rotate90(40)], False),
        ([Shift(5, 7)], False),
    ],
)
def test_mirrors_is_read_from_the_point_map(transforms, expected):
    assert mirrors(TransformList(transforms)) is expected


KEYPOINTS = [10.5, 12.5, 2, 50.5, 20.5, 1, 0, 0, 0]  # head, left hand, unlabeled right hand


def test_a_resize_scales_the_labeled_points():
    out = transform_keypoint_annotations(KEYPOINTS, TransformList([ResizeTransform(40, 60, 20, 120)]), (20, 120))
    assert out.tolist() == [[21.0, 6.25, 2], [101.0, 10.25, 1], [0, 0, 0]]


def test_a_flip_moves_the_points_and_swaps_their_names():
    out = transform_keypoint_annotations(KEYPOINTS, TransformList([HFlipTransform(60)]), (40, 60), FLIP)
    # The left hand at x = 50.5 is drawn at 9.5: in the mirror image it is a right hand.
    assert out.tolist() == [[49.5, 12.5, 2], [0, 0, 0], [9.5, 20.5, 1]]
    back = transform_keypoint_annotations(out, TransformList([HFlipTransform(60)]), (40, 60), FLIP)
    assert back.tolist() == np.asarray(KEYPOINTS).reshape(3, 3).tolist()


def test_a_vertical_flip_is_a_mirror_too_and_a_half_turn_is_not():
    out = transform_keypoint_annotations(KEYPOINTS, TransformList([VFlipTransform(40)]), (40, 60), FLIP)
    assert out.tolist() == [[10.5, 27.5, 2], [0, 0, 0], [50.5, 19.5, 1]]
    turned = TransformList([HFlipTransform(60), VFlipTransform(40)])
    out = transform_keypoint_annotations(KEYPOINTS, turned, (40, 60), FLIP)
    assert out.tolist() == [[49.5, 27.5, 2], [9.5, 19.5, 1], [0, 0, 0]]


def test_any_transform_moves_the_points_and_the_image_border_unlabels_them():
    out = transform_keypoint_annotations(KEYPOINTS, TransformList([Shift(20, 5)]), (35, 40))
    # The head (10.5 - 20 < 0) left the crop: unlabeled, as COCO writes it.
    assert out.tolist() == [[0, 0, 0], [30.5, 15.5, 1], [0, 0, 0]]
    out = transform_keypoint_annotations(KEYPOINTS, TransformList([Rotate90(40)]), (60, 40))
    assert out.tolist() == [[27.5, 10.5, 2], [19.5, 50.5, 1], [0, 0, 0]]


def test_the_crop_of_the_training_augmentation_moves_and_unlabels_points_too():
    from detcore.data.transforms import CropTransform

    crop = TransformList([CropTransform(20, 5, 40, 30, orig_w=60, orig_h=40), HFlipTransform(40)])
    out = transform_keypoint_annotations(KEYPOINTS, crop, (30, 40), FLIP)
    # Head left the crop; the left hand, at (30.5, 15.5) in the crop, is mirrored to the right hand.
    assert out.tolist() == [[0, 0, 0], [0, 0, 0], [9.5, 15.5, 1]]


def test_a_mirror_without_flip_indices_is_an_error():
    with pytest.raises(ValueError, match="mirror the image, so left/right keypoints must swap"):
        transform_keypoint_annotations(KEYPOINTS, TransformList([HFlipTransform(60)]), (40, 60))
    with pytest.raises(ValueError, match="3 points, but the flip indices are for 2"):
        transform_keypoint_annotations(KEYPOINTS, TransformList([HFlipTransform(60)]), (40, 60), [1, 0])


def test_instances_get_gt_keypoints():
    annos = [{"id": 1, "bbox": [0, 0, 10, 10], "category_id": 0, "keypoints": np.zeros((3, 3))}] * 2
    inst = annotations_to_instances(annos, (20, 20), with_masks=False, with_keypoints=True)
    assert inst.gt_keypoints.tensor.shape == (2, 3, 3)
    assert annotations_to_instances([], (20, 20), with_masks=False, with_keypoints=True, num_keypoints=3).gt_keypoints.tensor.shape == (0, 3, 3)
    with pytest.raises(ValueError, match="annotation 5 has no 'keypoints'"):
        annotations_to_instances([{"id": 5, "bbox": [0, 0, 1, 1], "category_id": 0}], (20, 20), with_masks=False, with_keypoints=True)


# --- the mapper -----------------------------------------------------------------------------------
DATA = {
    "images": [{"id": 1, "file_name": "a.png", "height": 40, "width": 60}],
    "annotations": [
        {"id": 3, "image_id": 1, "category_id": 1, "bbox": [5, 5, 50, 30], "iscrowd": 0,
         "keypoints": [10, 12, 2, 50, 20, 1, 0, 0, 0]},
    ],
    "categories": [{"id": 1, "name": "figure", "keypoints": NAMES, "keypoint_oks_sigmas": [0.1] * 3}],
}  # fmt: skip


@pytest.fixture
def keypoint_dataset(tmp_path, register):
    write_png(tmp_path / "a.png", 40, 60)
    json_file = write_json(tmp_path / "k.json", DATA)
    name = register("kp", lambda: load_coco_json(json_file, tmp_path, name))
    DatasetCatalog.get(name)  # the metadata (keypoint names, flip map) comes with the json
    return name


def _cfg(name, k=3):
    cfg = get_cfg()
    cfg.merge_from_list(["MODEL.KEYPOINT_ON", True, "MODEL.ROI_KEYPOINT_HEAD.NUM_KEYPOINTS", k, "DATASETS.TRAIN", [name]])
    return cfg


def test_the_mapper_flips_keypoints_with_the_datasets_pairs(keypoint_dataset):
    mapper = build_from_config(DatasetMapper, _cfg(keypoint_dataset), is_train=True)
    assert mapper.keypoint_flip_indices == FLIP
    record = DatasetCatalog.get(keypoint_dataset)[0]
    mapper.augmentations = [ResizeShortestEdge(80, 1000), RandomFlip(1.0)]  # x2, then mirrored
    kp = mapper(record)["instances"].gt_keypoints.tensor
    # head (10.5, 12.5) -> (21, 25) -> (120 - 21, 25); the left hand becomes the right hand.
    assert kp.tolist() == [[[99.0, 25.0, 2.0], [0.0, 0.0, 0.0], [19.0, 41.0, 1.0]]]
    assert not build_from_config(DatasetMapper, _cfg(keypoint_dataset), is_train=False).use_keypoint


def test_the_mapper_checks_the_datasets_keypoints(keypoint_dataset):
    with pytest.raises(ValueError, match=r"has 3 keypoints \['head', 'left_hand', 'right_hand'\], but MODEL.ROI_KEYPOINT_HEAD.NUM_KEYPOINTS is 17"):
        build_from_config(DatasetMapper, _cfg(keypoint_dataset, k=17), is_train=True)
    with pytest.raises(ValueError, match="dataset 'shapes_val' has no keypoint_names"):
        build_from_config(DatasetMapper, _cfg("shapes_val"), is_train=True)


def test_without_keypoint_on_keypoints_are_left_out(keypoint_dataset):
    cfg = _cfg(keypoint_dataset)
    cfg.MODEL.KEYPOINT_ON = False
    mapper = build_from_config(DatasetMapper, cfg, is_train=True)
    mapper.augmentations = [RandomFlip(1.0)]  # no flip indices needed: keypoints are not read
    out = mapper(DatasetCatalog.get(keypoint_dataset)[0])["instances"]
    assert not out.has("gt_keypoints") and len(out) == 1
    assert torch.equal(out.gt_boxes.tensor, torch.tensor([[5.0, 5.0, 55.0, 35.0]]))
