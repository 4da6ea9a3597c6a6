"""Keys with a closed set of values (detcore/config/choices.py): the defaults' comments list
exactly those values, a merge refuses anything else naming the key, and the code that reads
each key accepts every listed value."""
import re
from pathlib import Path

import pytest
import torch

from detcore.config import ConfigError, get_cfg
from detcore.config.choices import (
    BOX_REG_LOSS_TYPES,
    CELL_ANCHOR_ORDERS,
    CHOICES,
    CLIP_TYPES,
    FLIP_DIRECTIONS,
    FPN_TOP_BLOCKS,
    LR_SCHEDULERS,
    NORMS,
    RESNET_DEPTHS,
)
from detcore.layers import ShapeSpec, get_norm
from detcore.modeling import Box2BoxTransform
from detcore.modeling.backbone import build_top_block
from detcore.modeling.backbone.resnet import _BLOCKS_PER_STAGE
from detcore.modeling.roi_heads import FastRCNNOutputLayers
from detcore.solver import build_gradient_clipper, build_lr_scheduler
from detcore.structures import Boxes, Instances

DEFAULTS_PY = Path(__file__).resolve().parents[2] / "detcore" / "config" / "defaults.py"


def comment_of(key: str) -> str:
    """The comment that documents ``_C.<key>``: the comment lines above it, above any
    assignments of the same group written right before it (e.g. the SOLVER.WARMUP_* keys)."""
    lines = DEFAULTS_PY.read_text().split("\n")
    index = next(i for i, line in enumerate(lines) if line.startswith(f"_C.{key} = "))
    while index > 0 and lines[index - 1].startswith("_C."):
        index -= 1
    comment = []
    while index > 0 and lines[index - 1].startswith("#"):
        index -= 1
        comment.insert(0, lines[index][1:].strip())
    return " ".join(comment)


@pytest.mark.parametrize("key", sorted(CHOICES))
def test_the_comment_lists_exactly_the_allowed_values(key):
    allowed = CHOICES[key]
    comment = comment_of(key)
    if all(isinstance(v, str) or v is None for v in allowed):
        assert set(re.findall(r'"([^"]*)"', comment)) == {v for v in allowed if v is not None}, comment
        assert ("null" in comment) == (None in allowed), comment
    else:
        numbers = set(re.findall(r"\b\d+\b", comment))
        assert {str(v) for v in allowed} <= numbers, comment


@pytest.mark.parametrize("key", sorted(CHOICES))
def test_defaults_are_allowed_and_merges_check_the_set(key):
    cfg = get_cfg()
    node = cfg
    for part in key.split("."):
        node = node[part]
    assert all(v in CHOICES[key] for v in node) if isinstance(node, list) else node in CHOICES[key]
    for value in CHOICES[key]:
        cfg.merge_from_list([key, repr([value]) if isinstance(node, list) else str(value)])
    bad = "nonsense" if isinstance(node, str) else (["res9"] if isinstance(node, list) else 7)
    before = cfg.dump()
    with pytest.raises(ConfigError, match=rf"config key {re.escape(key)} in the override list must be one of"):
        cfg.merge_from_list([key, str(bad)])
    assert cfg.dump() == before  # all or nothing


def test_a_bad_value_set_in_code_is_not_blamed_on_a_later_merge():
    cfg = get_cfg()
    cfg.MODEL.ROI_BOX_HEAD.BBOX_REG_LOSS_TYPE = "iou"  # bypasses the merge check; build_model will refuse it
    cfg.merge_from_list(["SOLVER.BASE_LR", "0.1"])  # unrelated: accepted
    with pytest.raises(ConfigError, match="MODEL.RPN.BBOX_REG_LOSS_TYPE in the override list"):
        cfg.merge_from_list(["MODEL.RPN.BBOX_REG_LOSS_TYPE", "iou"])


def test_null_norm_and_list_valued_keys():
    cfg = get_cfg()
    cfg.merge_from_list(["MODEL.FPN.NORM", "None", "MODEL.RESNETS.OUT_FEATURES", "['res3', 'res5']"])
    assert cfg.MODEL.FPN.NORM is None and get_norm(cfg.MODEL.FPN.NORM, 8) is None
    with pytest.raises(ConfigError, match=r"MODEL.RESNETS.OUT_FEATURES .* got \['res3', 'p5'\]"):
        cfg.merge_from_list(["MODEL.RESNETS.OUT_FEATURES", "['res3', 'p5']"])


def test_a_bad_value_in_a_file_names_the_file_and_the_key(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("MODEL:\n  ROI_BOX_HEAD:\n    BBOX_REG_LOSS_TYPE: iou\n")
    with pytest.raises(ConfigError, match=r"MODEL.ROI_BOX_HEAD.BBOX_REG_LOSS_TYPE in .*bad.yaml must be one of "
                                          r"\['smooth_l1', 'l1', 'giou'\], got 'iou'"):
        get_cfg().merge_from_file(str(path))


# --- the code accepts every listed value -----------------------------------------------------------
def test_norms_and_depths_are_what_the_layers_build():
    for norm in NORMS:
        layer = get_norm(norm, 32)
        assert (layer is None) == (norm in ("", None))
    assert set(_BLOCKS_PER_STAGE) == set(RESNET_DEPTHS)


def test_every_cell_anchor_order_builds():
    from detcore.modeling.anchor_generator import DefaultAnchorGenerator

    for order in CELL_ANCHOR_ORDERS:
        generator = DefaultAnchorGenerator([[32, 40]], [[0.5, 1.0]], [8], cell_anchor_order=order)
        assert generator.cell_anchors[0].shape == (4, 4)


def test_every_top_block_builds():
    shapes = {"res5": ShapeSpec(channels=512, stride=32)}
    for name in FPN_TOP_BLOCKS:
        block = build_top_block(name, shapes, 64)
        assert (block is None) == (name in ("", "none"))


def test_every_schedule_clip_type_and_flip_builds():
    from detcore.data.dataset_mapper import build_augmentation

    cfg = get_cfg()
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    for name in LR_SCHEDULERS:
        cfg.SOLVER.LR_SCHEDULER_NAME = name
        assert type(build_lr_scheduler(cfg, optimizer)).__name__ == name
    cfg.SOLVER.CLIP_GRADIENTS.ENABLED = True
    for clip in CLIP_TYPES:
        cfg.SOLVER.CLIP_GRADIENTS.CLIP_TYPE = clip
        assert callable(build_gradient_clipper(cfg))
    for flip in FLIP_DIRECTIONS:
        cfg.INPUT.RANDOM_FLIP = flip
        assert len(build_augmentation(cfg, is_train=True)) == (1 if flip == "none" else 2)


def _box_loss(loss_type, deltas):
    predictor = FastRCNNOutputLayers(
        ShapeSpec(channels=8), box2box_transform=Box2BoxTransform((10.0, 10.0, 5.0, 5.0)), num_classes=2,
        box_reg_loss_type=loss_type,
    )
    proposals = Instances((100, 100))
    proposals.proposal_boxes = Boxes(torch.tensor([[10.0, 10.0, 50.0, 50.0], [0.0, 0.0, 20.0, 30.0]], dtype=torch.float64))
    proposals.gt_boxes = Boxes(torch.tensor([[12.0, 8.0, 52.0, 48.0], [0.0, 0.0, 20.0, 30.0]], dtype=torch.float64))
    proposals.gt_classes = torch.tensor([1, 2])  # a foreground ROI of class 1, a background ROI
    scores = torch.zeros(2, 3, dtype=torch.float64)
    return predictor.losses((scores, deltas), [proposals])["loss_box_reg"]


def test_every_box_loss_type_works_in_the_box_head():
    deltas = torch.zeros(2, 8, dtype=torch.float64, requires_grad=True)
    for loss_type in BOX_REG_LOSS_TYPES:
        loss = _box_loss(loss_type, deltas)
        loss.backward()
        assert torch.isfinite(loss) and loss > 0


def test_giou_box_loss_is_one_minus_giou_of_the_decoded_box_over_all_rois():
    # Zero deltas decode to the proposal itself: [10, 10, 50, 50] against GT [12, 8, 52, 48].
    # Intersection 38 x 38, union 2 * 1600 - 1444, hull 42 x 42 (hand-computed).
    inter, union, hull = 38.0 * 38.0, 2 * 1600.0 - 38.0 * 38.0, 42.0 * 42.0
    giou = inter / union - (hull - union) / hull
    loss = _box_loss("giou", torch.zeros(2, 8, dtype=torch.float64))
    torch.testing.assert_close(loss, torch.tensor((1.0 - giou) / 2, dtype=torch.float64), rtol=1e-6, atol=0)
    # A perfect box gives no loss.
    d = Box2BoxTransform((10.0, 10.0, 5.0, 5.0)).get_deltas(
        torch.tensor([[10.0, 10.0, 50.0, 50.0]], dtype=torch.float64),
        torch.tensor([[12.0, 8.0, 52.0, 48.0]], dtype=torch.float64),
    )
    deltas = torch.zeros(2, 8, dtype=torch.float64)
    deltas[0, 4:8] = d[0]  # class 1's slot of the foreground ROI
    assert _box_loss("giou", deltas).abs() < 1e-6


@pytest.mark.parametrize(
    "key, value",
    [
        ("MODEL.RPN.NMS_THRESH", "5.0"),  # would suppress nothing
        ("MODEL.ROI_HEADS.NMS_THRESH_TEST", "-0.1"),
        ("MODEL.ROI_HEADS.SCORE_THRESH_TEST", "1.5"),
        ("MODEL.ROI_HEADS.IOU_THRESHOLDS", "[0.5, 1.5]"),
        ("SOLVER.BASE_LR", "-0.01"),
        ("SOLVER.CHECKPOINT_PERIOD", "0"),
        ("MODEL.ROI_BOX_HEAD.POOLER_SAMPLING_RATIO", "100000"),
    ],
)
def test_numbers_outside_their_range_are_refused_at_merge(key, value):
    with pytest.raises(ConfigError, match=rf"config key {re.escape(key)} in the override list must lie in \["):
        get_cfg().merge_from_list([key, value])


def test_nan_from_a_yaml_file_is_refused(tmp_path):
    path = tmp_path / "nan.yaml"
    path.write_text("MODEL:\n  RPN:\n    NMS_THRESH: .nan\n")
    with pytest.raises(ConfigError, match=r"MODEL.RPN.NMS_THRESH in .*nan.yaml must be a finite number in \[0.0, 1.0\], got nan"):
        get_cfg().merge_from_file(str(path))


def test_device_names_are_checked_at_merge_and_availability_at_build():
    from detcore.utils.comm import resolve_device

    cfg = get_cfg()
    with pytest.raises(ConfigError, match=r"MODEL.DEVICE in the override list must be a torch device .* got 'gpu'"):
        cfg.merge_from_list(["MODEL.DEVICE", "gpu"])
    cfg.merge_from_list(["MODEL.DEVICE", "cuda:3"])  # a valid name: whether it exists is for the build
    if torch.cuda.device_count() < 4:
        with pytest.raises(RuntimeError, match=r"MODEL.DEVICE is 'cuda:3', but"):
            resolve_device(cfg.MODEL.DEVICE)
    assert resolve_device("cpu") == torch.device("cpu")


# --- numbers, list shapes, devices: the rest of the merge check -------------------------------------
@pytest.mark.parametrize(
    "key, value, message",
    [
        ("SOLVER.BASE_LR", "1e999", r"must be a finite number in \[0.0, inf\), got inf"),  # literal_eval gives inf
        ("MODEL.RPN.LOSS_WEIGHT", "1e999", "must be a finite number"),
        ("MODEL.ROI_KEYPOINT_HEAD.LOSS_WEIGHT", "1e999", "must be a finite number"),
        ("SOLVER.STEPS", "[-5, 2]", r"must lie in \[1, inf\), got -5"),
        ("SOLVER.STEPS", "[5, 2]", r"must be strictly increasing, got \(5, 2\)"),
        ("SOLVER.STEPS", "[5, 5]", "must be strictly increasing"),
        ("DATASETS.TRAIN", "[['a'], 'b']", r"must be a list of strings, got \(\['a'\], 'b'\)"),
        ("DATASETS.TEST", "[1]", "must be a list of strings"),
        ("MODEL.RPN.BBOX_REG_WEIGHTS", "(1.0, 1.0, 1.0)", "must hold 4 values, got 3"),
        ("MODEL.RESNETS.DEFORM_ON_PER_STAGE", "[0, 1, 1, 1]", "must be a list of bools"),
        ("MODEL.ANCHOR_GENERATOR.SIZES", "[[32, [64]]]", "must be a list of numbers or lists of numbers"),
        ("MODEL.ANCHOR_GENERATOR.SIZES", "[[32], [0]]", r"must lie in \(0.0, inf\), got 0"),
        ("MODEL.PIXEL_STD", "[57.0, 0.0, 58.0]", r"must lie in \(0.0, inf\), got 0.0"),
        ("INPUT.MIN_SIZE_TRAIN", "(-3,)", "must lie in"),
        ("MODEL.DEVICE", "mps", "must be 'cpu' or 'cuda' .*no mps kernels, got 'mps'"),
        ("SOLVER.CLIP_GRADIENTS.NORM_TYPE", "0.0", "must lie in"),
    ],
)
def test_values_the_code_cannot_use_are_refused_at_merge_naming_the_key(key, value, message):
    cfg = get_cfg()
    before = cfg.dump()
    with pytest.raises(ConfigError, match=rf"config key {re.escape(key)} in the override list {message}"):
        cfg.merge_from_list([key, value])
    assert cfg.dump() == before


def test_infinity_and_nan_from_a_yaml_file(tmp_path):
    path = tmp_path / "inf.yaml"
    path.write_text("SOLVER:\n  BASE_LR: .inf\n")
    with pytest.raises(ConfigError, match=r"SOLVER.BASE_LR in .*inf.yaml must be a finite number in \[0.0, inf\), got inf"):
        get_cfg().merge_from_file(str(path))
    path.write_text("INPUT:\n  CROP:\n    SIZE: [0.5, .nan]\n")
    with pytest.raises(ConfigError, match=r"INPUT.CROP.SIZE in .*inf.yaml must be a finite number"):
        get_cfg().merge_from_file(str(path))
    # The max norm is a p-norm of infinite p: the one key that may be infinite (never NaN).
    path.write_text("SOLVER:\n  CLIP_GRADIENTS:\n    NORM_TYPE: .inf\n")
    cfg = get_cfg()
    cfg.merge_from_file(str(path))
    assert cfg.SOLVER.CLIP_GRADIENTS.NORM_TYPE == float("inf")
    path.write_text("SOLVER:\n  CLIP_GRADIENTS:\n    NORM_TYPE: .nan\n")
    with pytest.raises(ConfigError, match="NORM_TYPE in .* must be a finite number"):
        get_cfg().merge_from_file(str(path))


def test_every_list_valued_key_has_a_shape_and_the_defaults_pass_every_check():
    from detcore.config.choices import LIST_SHAPES, find_problems

    cfg = get_cfg()
    assert find_problems(cfg) == []
    lists = []

    def walk(node, prefix=""):
        for k, v in node.items():
            if isinstance(v, dict):
                walk(v, f"{prefix}{k}.")
            elif isinstance(v, (list, tuple)):
                lists.append(prefix + k)

    walk(cfg)
    assert sorted(lists) == sorted(LIST_SHAPES)
    # Anchor sizes as detectron2 allows them: one flat list shared by all levels.
    cfg.merge_from_list(["MODEL.ANCHOR_GENERATOR.SIZES", "[32, 64]", "SOLVER.STEPS", "(10, 20)"])


def test_a_device_set_in_code_is_named_when_the_model_is_built():
    from detcore.utils.comm import resolve_device

    with pytest.raises(RuntimeError, match=r"MODEL.DEVICE must be 'cpu' or 'cuda' .* got 'mps'"):
        resolve_device("mps")
