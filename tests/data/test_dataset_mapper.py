"""DatasetMapper on the tiny shapes split: the model input format and geometric consistency."""
import cv2
import numpy as np
import pytest
import torch

from detcore.config import get_cfg
from detcore.data import DatasetCatalog, DatasetMapper
from detcore.data.transforms import Augmentation, RandomFlip, ResizeShortestEdge, ResizeTransform
from detcore.structures import BitMasks, Boxes, Instances, PolygonMasks
from detcore.utils.registry import build_from_config


@pytest.fixture
def records(tiny_shapes):
    return DatasetCatalog.get(tiny_shapes)


def small_cfg():
    cfg = get_cfg()
    cfg.MODEL.MASK_ON = True
    cfg.INPUT.MIN_SIZE_TRAIN = (96, 112)
    cfg.INPUT.MAX_SIZE_TRAIN = 200
    cfg.INPUT.MIN_SIZE_TEST = 100
    cfg.INPUT.MAX_SIZE_TEST = 200
    return cfg


def test_train_output_format(records):
    np.random.seed(0)
    mapper = build_from_config(DatasetMapper, small_cfg(), is_train=True)
    for record in records[:5]:
        out = mapper(record)
        assert set(out) == {"file_name", "image_id", "height", "width", "image", "instances"}
        assert (out["height"], out["width"], out["image_id"]) == (record["height"], record["width"], record["image_id"])
        image = out["image"]
        assert image.dtype == torch.uint8 and image.dim() == 3 and image.shape[0] == 3
        assert min(image.shape[1:]) in (96, 112) and max(image.shape[1:]) <= 200
        inst = out["instances"]
        assert isinstance(inst, Instances) and inst.image_size == tuple(image.shape[1:])
        assert isinstance(inst.gt_boxes, Boxes) and isinstance(inst.gt_masks, PolygonMasks)
        assert inst.gt_classes.dtype == torch.int64
        assert len(inst) == len(record["annotations"]) and ((inst.gt_classes >= 0) & (inst.gt_classes < 3)).all()


def test_test_mode_has_no_instances_and_resizes(records):
    out = build_from_config(DatasetMapper, small_cfg(), is_train=False)(records[0])
    assert "instances" not in out
    assert min(out["image"].shape[1:]) == 100
    cfg = small_cfg()
    cfg.INPUT.MIN_SIZE_TEST = 0  # no resizing
    out = build_from_config(DatasetMapper, cfg, is_train=False)(records[0])
    reference = cv2.imread(records[0]["file_name"])
    assert torch.equal(out["image"], torch.from_numpy(reference).permute(2, 0, 1))


def test_rgb_format_reverses_channels(records):
    bgr = DatasetMapper(False, [])(records[0])["image"]
    rgb = DatasetMapper(False, [], image_format="RGB")(records[0])["image"]
    assert torch.equal(rgb, bgr.flip(0))


def test_masks_off_gives_no_gt_masks(records):
    out = DatasetMapper(True, [ResizeShortestEdge(100, 200)], use_instance_mask=False)(records[0])
    assert not out["instances"].has("gt_masks") and len(out["instances"]) > 0


@pytest.mark.parametrize("mask_format", ["polygon", "bitmask"])
@pytest.mark.parametrize("vertical", [False, True])
def test_boxes_follow_masks_through_resize_and_flip(records, mask_format, vertical):
    mapper = DatasetMapper(
        True,
        [ResizeShortestEdge(150, 400), RandomFlip(1.0, horizontal=not vertical, vertical=vertical)],
        use_instance_mask=True,
        instance_mask_format=mask_format,
    )
    for record in records[:6]:
        out = mapper(record)
        inst = out["instances"]
        assert isinstance(inst.gt_masks, PolygonMasks if mask_format == "polygon" else BitMasks)
        masks = inst.gt_masks if mask_format == "bitmask" else BitMasks.from_polygons(inst.gt_masks, *inst.image_size)
        assert masks.tensor.shape[1:] == out["image"].shape[1:]
        diff = (masks.get_bounding_boxes().tensor - inst.gt_boxes.tensor).abs()
        assert diff.max() <= 1.0, record["file_name"]
        # The image was flipped with the masks: reference = the file, resized, then flipped.
        ref = cv2.imread(record["file_name"])
        ref = cv2.resize(ref, (out["image"].shape[2], out["image"].shape[1]), interpolation=cv2.INTER_LINEAR)
        ref = ref[::-1] if vertical else ref[:, ::-1]
        assert torch.equal(out["image"], torch.from_numpy(ref.copy()).permute(2, 0, 1))


class DoubleSize(Augmentation):
    def get_transform(self, image):
        h, w = image.shape[:2]
        return ResizeTransform(h, w, 2 * h, 2 * w)


@pytest.mark.parametrize("mask_format", ["polygon", "bitmask"])
@pytest.mark.parametrize(
    "augs", [[], [RandomFlip(1.0)], [DoubleSize(), RandomFlip(1.0, horizontal=False, vertical=True)]]
)
def test_masks_are_exact_on_whole_pixel_scales(records, mask_format, augs):
    """Without resampling (flips, exact 2x), the mask is the pixel-exact transform of the
    original visible mask and its box is exactly the transformed box."""
    mapper = DatasetMapper(True, augs, use_instance_mask=True, instance_mask_format=mask_format)
    plain = DatasetMapper(True, [], use_instance_mask=True, instance_mask_format="bitmask")
    for record in records[:4]:
        inst = mapper(record)["instances"]
        masks = inst.gt_masks if mask_format == "bitmask" else BitMasks.from_polygons(inst.gt_masks, *inst.image_size)
        assert torch.equal(masks.get_bounding_boxes().tensor, inst.gt_boxes.tensor)
        reference = plain(record)["instances"].gt_masks.tensor  # original frame
        for aug in augs:
            if isinstance(aug, DoubleSize):
                reference = reference.repeat_interleave(2, dim=1).repeat_interleave(2, dim=2)
            else:
                reference = reference.flip(2 if aug.horizontal else 1)
        assert torch.equal(masks.tensor, reference)


def test_mapper_does_not_modify_the_record(records):
    record = records[0]
    before = repr(record)
    DatasetMapper(True, [ResizeShortestEdge(150, 400), RandomFlip(1.0)], use_instance_mask=True)(record)
    assert repr(record) == before


def test_bad_arguments():
    with pytest.raises(ValueError, match="image_format"):
        DatasetMapper(True, [], image_format="L")
    with pytest.raises(ValueError, match="instance_mask_format"):
        DatasetMapper(True, [], instance_mask_format="rle")
    with pytest.raises(TypeError, match="from_config"):
        DatasetMapper(small_cfg(), True)
    cfg = small_cfg()
    cfg.INPUT.RANDOM_FLIP = "diagonal"
    with pytest.raises(ValueError, match="RANDOM_FLIP"):
        build_from_config(DatasetMapper, cfg, is_train=True)
