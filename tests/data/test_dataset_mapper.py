"""DatasetMapper on the tiny shapes split: the model input format and geometric consistency, and
the augmentations the config builds (the defaults change nothing; crops, large-scale jitter and
colour jitter keep image and annotations one picture)."""
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from detcore.config import get_cfg
from detcore.data import DatasetCatalog, DatasetMapper, build_augmentation
from detcore.data import detection_utils as utils
from detcore.data.transforms import (
    Augmentation,
    CropTransform,
    FixedSizeCrop,
    RandomBrightness,
    RandomContrast,
    RandomCrop,
    RandomFlip,
    RandomLighting,
    RandomSaturation,
    ResizeScale,
    ResizeShortestEdge,
    ResizeTransform,
)
from detcore.structures import BitMasks, Boxes, Instances, PolygonMasks, polygons_to_bitmask
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


# --- the richer training augmentation --------------------------------------------------------------
CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs").rglob("*.yaml"))


def todays_pipeline(cfg, image):
    """The training pipeline as it was before crop / LSJ / colour jitter existed, written out:
    one short side drawn (choice or range), the resize, then a flip with probability 0.5."""
    lengths = list(cfg.INPUT.MIN_SIZE_TRAIN)
    if cfg.INPUT.MIN_SIZE_TRAIN_SAMPLING == "range":
        size = np.random.randint(lengths[0], lengths[1] + 1)
    else:
        size = lengths[np.random.randint(len(lengths))]
    h, w = image.shape[:2]
    scale = min(size / min(h, w), cfg.INPUT.MAX_SIZE_TRAIN / max(h, w))
    image = cv2.resize(image, (int(w * scale + 0.5), int(h * scale + 0.5)), interpolation=cv2.INTER_LINEAR)
    if cfg.INPUT.RANDOM_FLIP != "none" and np.random.rand() < 0.5:
        image = image[:, ::-1] if cfg.INPUT.RANDOM_FLIP == "horizontal" else image[::-1]
    return image


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: str(p.relative_to(p.parents[1])))
def test_every_configs_training_pipeline_is_unchanged_by_the_new_keys(records, config):
    """The new keys default to off: each config's training images are those of the old
    resize + flip pipeline, drawing the same random numbers (same seed, same images)."""
    cfg = get_cfg()
    cfg.merge_from_file(str(config))
    cfg.INPUT.MIN_SIZE_TRAIN = (48, 56, 64) if cfg.INPUT.MIN_SIZE_TRAIN_SAMPLING == "choice" else (48, 64)
    cfg.INPUT.MAX_SIZE_TRAIN = 100  # small images: fast, same logic
    # The shapes records hold no keypoints; the images do not depend on them (keypoints through
    # transforms are tested in test_keypoint_transforms.py).
    cfg.MODEL.KEYPOINT_ON = False
    # The presets' other resize modes (torchvision's, maskrcnn-benchmark's) are checked against
    # their libraries in tests/data/transforms/test_base.py; here the pipeline around the resize.
    cfg.INPUT.RESIZE_MODE = "opencv"
    augs = build_augmentation(cfg, is_train=True)
    assert [type(a) for a in augs] == [ResizeShortestEdge] + ([RandomFlip] if cfg.INPUT.RANDOM_FLIP != "none" else [])
    mapper = build_from_config(DatasetMapper, cfg, is_train=True)
    assert not mapper.recompute_boxes
    for seed, record in enumerate(records[:4]):
        np.random.seed(seed)
        out = mapper(record)["image"].permute(1, 2, 0).numpy()
        np.random.seed(seed)
        reference = todays_pipeline(cfg, utils.read_image(record["file_name"], cfg.INPUT.FORMAT))
        assert np.array_equal(out, reference)


def test_the_config_builds_the_augmentations_in_order():
    cfg = small_cfg()
    cfg.INPUT.CROP.ENABLED = True
    cfg.INPUT.CROP.TYPE, cfg.INPUT.CROP.SIZE = "absolute_range", (32, 64)
    cfg.INPUT.COLOR_JITTER.BRIGHTNESS, cfg.INPUT.COLOR_JITTER.CONTRAST = 0.2, 0.3
    cfg.INPUT.COLOR_JITTER.SATURATION, cfg.INPUT.COLOR_JITTER.LIGHTING = 0.4, 0.1
    cfg.INPUT.FORMAT = "RGB"
    augs = build_augmentation(cfg, is_train=True)
    assert [type(a) for a in augs] == [
        RandomCrop, ResizeShortestEdge, RandomFlip, RandomBrightness, RandomContrast, RandomSaturation, RandomLighting
    ]
    assert (augs[0].crop_type, augs[0].crop_size) == ("absolute_range", (32.0, 64.0))
    assert [a.intensity for a in augs[3:6]] == [0.2, 0.3, 0.4] and augs[6].scale == 0.1
    assert all(a.image_format == "RGB" for a in augs[3:])
    assert build_from_config(DatasetMapper, cfg, is_train=True).recompute_boxes  # masks on, crop on

    cfg.INPUT.LARGE_SCALE_JITTER.ENABLED = True
    cfg.INPUT.LARGE_SCALE_JITTER.OUTPUT_SIZE, cfg.INPUT.LARGE_SCALE_JITTER.SCALE_RANGE = (96, 128), (0.5, 1.5)
    augs = build_augmentation(cfg, is_train=True)
    assert [type(a) for a in augs[:4]] == [RandomCrop, RandomFlip, ResizeScale, FixedSizeCrop]
    assert (augs[2].min_scale, augs[2].max_scale, augs[2].target_height, augs[2].target_width) == (0.5, 1.5, 96, 128)
    assert augs[3].crop_size == (96, 128) and augs[3].pad_value == tuple(cfg.MODEL.PIXEL_MEAN)

    assert [type(a) for a in build_augmentation(cfg, is_train=False)] == [ResizeShortestEdge]
    cfg.TEST.AUG.ENABLED = True
    assert build_augmentation(cfg, is_train=False) == []  # the TTA wrapper resizes each scale itself
    cfg.MODEL.MASK_ON = False
    assert not build_from_config(DatasetMapper, cfg, is_train=True).recompute_boxes
    with pytest.raises(ValueError, match="recompute_boxes needs the instance masks"):
        DatasetMapper(True, [], use_instance_mask=False, recompute_boxes=True)


@pytest.mark.parametrize("mask_format", ["polygon", "bitmask"])
def test_random_crop_keeps_image_masks_and_boxes_one_picture(records, mask_format):
    """Crop only (no resampling): the image is the window of the file, each mask the window of
    an original instance's mask (pixel for pixel), each box its mask's box, and exactly the
    instances with pixels in the window are kept."""
    crop = RandomCrop("relative_range", (0.3, 0.3))
    mapper = DatasetMapper(True, [crop], use_instance_mask=True, instance_mask_format=mask_format, recompute_boxes=True)
    dropped = 0
    for seed, record in enumerate(records):
        image = cv2.imread(record["file_name"])
        np.random.seed(seed)
        window = crop.get_transform(image)
        np.random.seed(seed)
        out = mapper(record)
        x0, y0, w, h = window.x0, window.y0, window.w, window.h
        assert torch.equal(out["image"], torch.from_numpy(image[y0 : y0 + h, x0 : x0 + w].copy()).permute(2, 0, 1))
        inst = out["instances"]
        assert inst.image_size == (h, w)
        masks = inst.gt_masks if mask_format == "bitmask" else BitMasks.from_polygons(inst.gt_masks, h, w)
        originals = [polygons_to_bitmask(a["segmentation"], record["height"], record["width"]) for a in record["annotations"]]
        visible = [(a["category_id"], m[y0 : y0 + h, x0 : x0 + w]) for a, m in zip(record["annotations"], originals)]
        visible = [(c, m) for c, m in visible if m.any()]
        dropped += len(record["annotations"]) - len(visible)
        assert len(inst) == len(visible)
        for (category, expected), mask, cls in zip(visible, masks.tensor, inst.gt_classes):
            assert torch.equal(mask, expected) and cls == category
        box_of_masks = masks.get_bounding_boxes().tensor
        if mask_format == "bitmask":
            assert torch.equal(inst.gt_boxes.tensor, box_of_masks)
        else:  # the polygons' bounds: 1/8 px inside the pixels' box (mask_to_polygons' tracing)
            assert ((inst.gt_boxes.tensor - box_of_masks).abs() <= 0.125 + 1e-6).all()
    assert dropped > 0  # some instances did leave the window


class CornerCrop(Augmentation):
    def get_transform(self, image):
        return CropTransform(0, 0, 4, 4, image.shape[1], image.shape[0])


def test_a_crop_that_keeps_no_instance_trains_as_background(records):
    """As in detectron2, the crop does not look at the instances: with none left the image is
    still a training input, and the model takes it (RPN and box losses on background only)."""
    from detcore.modeling import build_model
    from tests.modeling.small_config import small_cfg as small_model_cfg

    record = records[0]
    full = sum(polygons_to_bitmask(a["segmentation"], record["height"], record["width"]) for a in record["annotations"])
    assert not full[:4, :4].any()  # no shape in the top-left corner of this image
    mapper = DatasetMapper(True, [CornerCrop(), ResizeShortestEdge(64, 100)], use_instance_mask=True, recompute_boxes=True)
    out = mapper(record)
    assert len(out["instances"]) == 0 and out["image"].shape[1:] == (64, 64)
    torch.manual_seed(0)
    model = build_model(small_model_cfg())
    model.train()
    losses = model([out])
    assert all(torch.isfinite(v) for v in losses.values())
    assert losses["loss_mask"] == 0 and losses["loss_box_reg"] == 0 and losses["loss_cls"] > 0


@pytest.mark.parametrize("mask_format", ["polygon", "bitmask"])
def test_large_scale_jitter_through_the_mapper(records, mask_format):
    cfg = small_cfg()
    cfg.INPUT.MASK_FORMAT = mask_format
    cfg.INPUT.LARGE_SCALE_JITTER.ENABLED = True
    cfg.INPUT.LARGE_SCALE_JITTER.OUTPUT_SIZE = (96, 112)
    cfg.INPUT.LARGE_SCALE_JITTER.SCALE_RANGE = (0.5, 2.0)
    mapper = build_from_config(DatasetMapper, cfg, is_train=True)
    np.random.seed(0)
    for record in records[:8]:
        out = mapper(record)
        assert out["image"].shape == (3, 96, 112)
        inst = out["instances"]
        masks = inst.gt_masks if mask_format == "bitmask" else BitMasks.from_polygons(inst.gt_masks, 96, 112)
        assert masks.tensor.shape[1:] == (96, 112)
        assert (masks.get_bounding_boxes().tensor - inst.gt_boxes.tensor).abs().max() <= 1.0
        # Padding (pixel mean, rounded) never lies under a mask.
        mean = torch.tensor([round(v) for v in cfg.MODEL.PIXEL_MEAN], dtype=torch.uint8)[:, None, None]
        pad = (out["image"] == mean).all(dim=0)
        assert not (masks.tensor.any(dim=0) & pad & (pad.sum(dim=1, keepdim=True) == 112)).any()


def test_colour_jitter_leaves_the_geometry_to_the_same_draws(records):
    """Colour is drawn after the geometry: with the same seed, the instances are those of the
    pipeline without colour jitter, and only the pixels differ."""
    cfg = small_cfg()
    plain = build_from_config(DatasetMapper, cfg, is_train=True)
    cfg.INPUT.COLOR_JITTER.BRIGHTNESS = cfg.INPUT.COLOR_JITTER.SATURATION = 0.5
    cfg.INPUT.COLOR_JITTER.LIGHTING = 0.5
    jitter = build_from_config(DatasetMapper, cfg, is_train=True)
    for seed, record in enumerate(records[:4]):
        np.random.seed(seed)
        a = plain(record)
        np.random.seed(seed)
        b = jitter(record)
        assert a["image"].shape == b["image"].shape and not torch.equal(a["image"], b["image"])
        assert torch.equal(a["instances"].gt_boxes.tensor, b["instances"].gt_boxes.tensor)
        assert all(
            all(np.array_equal(p, q) for p, q in zip(pa, pb))
            for pa, pb in zip(a["instances"].gt_masks.polygons, b["instances"].gt_masks.polygons)
        )


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("INPUT.CROP.SIZE", (0.5, 1.5), r"INPUT.CROP \(TYPE, SIZE\): RandomCrop: crop_size of a 'relative_range' crop must be fractions"),
        ("INPUT.LARGE_SCALE_JITTER.SCALE_RANGE", (2.0, 1.0), r"INPUT.LARGE_SCALE_JITTER .*min_scale <= max_scale"),
        ("INPUT.LARGE_SCALE_JITTER.OUTPUT_SIZE", (96,), r"OUTPUT_SIZE must be \(height, width\)"),
    ],
)
def test_bad_augmentation_settings_name_their_config_keys(key, value, message):
    cfg = small_cfg()
    cfg.INPUT.CROP.ENABLED = key.startswith("INPUT.CROP")
    cfg.INPUT.LARGE_SCALE_JITTER.ENABLED = key.startswith("INPUT.LARGE")
    node = cfg
    *path, leaf = key.split(".")
    for part in path:
        node = node[part]
    node[leaf] = value
    with pytest.raises(ValueError, match=message):
        build_augmentation(cfg, is_train=True)
