"""Tests of detcore.config: the defaults, `_BASE_` merging, overrides, errors and the yaml zoo."""
import ast
import re
from pathlib import Path

import pytest
import yaml

from detcore.config import CfgNode, ConfigError, ConfigTypeError, UnknownKeyError, get_cfg

REPO = Path(__file__).resolve().parents[2]
CONFIG_DIR = REPO / "configs"
DEFAULTS_PY = REPO / "detcore" / "config" / "defaults.py"
ZOO = sorted(CONFIG_DIR.rglob("*.yaml"))  # recursive, so configs added later are covered

# The key contract other modules' builders rely on: every key, its default (and so its type).
EXPECTED_DEFAULTS = {
    "VERSION": 1,
    "MODEL.META_ARCHITECTURE": "GeneralizedRCNN",
    "MODEL.DEVICE": "cpu",
    "MODEL.WEIGHTS": "",
    "MODEL.MASK_ON": False,
    "MODEL.KEYPOINT_ON": False,
    "MODEL.PIXEL_MEAN": [103.530, 116.280, 123.675],
    "MODEL.PIXEL_STD": [57.375, 57.120, 58.395],
    "MODEL.CHANNELS_LAST": True,
    "MODEL.BOX_LEGACY_PLUS_ONE": False,
    "MODEL.BACKBONE.NAME": "FPN",
    "MODEL.BACKBONE.FREEZE_AT": 2,
    "MODEL.RESNETS.DEPTH": 50,
    "MODEL.RESNETS.OUT_FEATURES": ["res2", "res3", "res4", "res5"],
    "MODEL.RESNETS.NUM_GROUPS": 1,
    "MODEL.RESNETS.WIDTH_PER_GROUP": 64,
    "MODEL.RESNETS.STRIDE_IN_1X1": True,
    "MODEL.RESNETS.NORM": "FrozenBN",
    "MODEL.RESNETS.STEM_OUT_CHANNELS": 64,
    "MODEL.RESNETS.RES2_OUT_CHANNELS": 256,
    "MODEL.RESNETS.RES5_DILATION": 1,
    "MODEL.RESNETS.DEFORM_ON_PER_STAGE": [False, False, False, False],
    "MODEL.RESNETS.DEFORM_MODULATED": False,
    "MODEL.RESNETS.DEFORM_NUM_GROUPS": 1,
    "MODEL.FPN.IN_FEATURES": ["res2", "res3", "res4", "res5"],
    "MODEL.FPN.OUT_CHANNELS": 256,
    "MODEL.FPN.NORM": "",
    "MODEL.FPN.FUSE_TYPE": "sum",
    "MODEL.FPN.TOP_BLOCK": "maxpool",
    "MODEL.ANCHOR_GENERATOR.NAME": "DefaultAnchorGenerator",
    "MODEL.ANCHOR_GENERATOR.SIZES": [[32], [64], [128], [256], [512]],
    "MODEL.ANCHOR_GENERATOR.ASPECT_RATIOS": [[0.5, 1.0, 2.0]],
    "MODEL.ANCHOR_GENERATOR.OFFSET": 0.0,
    "MODEL.ANCHOR_GENERATOR.ROUND_CELL_ANCHORS": False,
    "MODEL.ANCHOR_GENERATOR.STRIDES_FROM_IMAGE_SIZE": False,
    "MODEL.ANCHOR_GENERATOR.DETECTRON_CELL_ANCHORS": False,
    "MODEL.ANCHOR_GENERATOR.CELL_ANCHOR_ORDER": "size_major",
    "MODEL.PROPOSAL_GENERATOR.NAME": "RPN",
    "MODEL.RPN.HEAD_NAME": "StandardRPNHead",
    "MODEL.RPN.IN_FEATURES": ["p2", "p3", "p4", "p5", "p6"],
    "MODEL.RPN.BOUNDARY_THRESH": -1,
    "MODEL.RPN.IOU_THRESHOLDS": [0.3, 0.7],
    "MODEL.RPN.IOU_LABELS": [0, -1, 1],
    "MODEL.RPN.ALLOW_LOW_QUALITY_MATCHES": True,
    "MODEL.RPN.BATCH_SIZE_PER_IMAGE": 256,
    "MODEL.RPN.POSITIVE_FRACTION": 0.5,
    "MODEL.RPN.BBOX_REG_LOSS_TYPE": "smooth_l1",
    "MODEL.RPN.BBOX_REG_WEIGHTS": (1.0, 1.0, 1.0, 1.0),
    "MODEL.RPN.SMOOTH_L1_BETA": 0.0,
    "MODEL.RPN.LOSS_WEIGHT": 1.0,
    "MODEL.RPN.LOSS_NORMALIZER": "batch_size",
    "MODEL.RPN.PRE_NMS_TOPK_TRAIN": 2000,
    "MODEL.RPN.PRE_NMS_TOPK_TEST": 1000,
    "MODEL.RPN.POST_NMS_TOPK_TRAIN": 2000,
    "MODEL.RPN.POST_NMS_TOPK_TEST": 1000,
    "MODEL.RPN.NMS_THRESH": 0.7,
    "MODEL.RPN.MIN_SIZE": 0.0,
    "MODEL.RPN.PROPOSAL_RANKING": "logit",
    "MODEL.ROI_HEADS.NAME": "StandardROIHeads",
    "MODEL.ROI_HEADS.NUM_CLASSES": 80,
    "MODEL.ROI_HEADS.IN_FEATURES": ["p2", "p3", "p4", "p5"],
    "MODEL.ROI_HEADS.IOU_THRESHOLDS": [0.5],
    "MODEL.ROI_HEADS.IOU_LABELS": [0, 1],
    "MODEL.ROI_HEADS.BATCH_SIZE_PER_IMAGE": 512,
    "MODEL.ROI_HEADS.POSITIVE_FRACTION": 0.25,
    "MODEL.ROI_HEADS.SCORE_THRESH_TEST": 0.05,
    "MODEL.ROI_HEADS.NMS_THRESH_TEST": 0.5,
    "MODEL.ROI_HEADS.PROPOSAL_APPEND_GT": True,
    "MODEL.ROI_HEADS.CANONICAL_BOX_SIZE": 224,
    "MODEL.ROI_HEADS.CANONICAL_LEVEL": 4,
    "MODEL.ROI_HEADS.LEVEL_MAPPER": "detectron2",
    "MODEL.ROI_HEADS.MIN_BOX_SIZE_TEST": 0.0,
    "MODEL.ROI_BOX_HEAD.NAME": "FastRCNNConvFCHead",
    "MODEL.ROI_BOX_HEAD.PREDICTOR_NAME": "FastRCNNOutputLayers",
    "MODEL.ROI_BOX_HEAD.NUM_CONV": 0,
    "MODEL.ROI_BOX_HEAD.CONV_DIM": 256,
    "MODEL.ROI_BOX_HEAD.NUM_FC": 2,
    "MODEL.ROI_BOX_HEAD.FC_DIM": 1024,
    "MODEL.ROI_BOX_HEAD.NORM": "",
    "MODEL.ROI_BOX_HEAD.POOLER_RESOLUTION": 7,
    "MODEL.ROI_BOX_HEAD.POOLER_SAMPLING_RATIO": 0,
    "MODEL.ROI_BOX_HEAD.POOLER_ALIGNED": True,
    "MODEL.ROI_BOX_HEAD.BBOX_REG_WEIGHTS": (10.0, 10.0, 5.0, 5.0),
    "MODEL.ROI_BOX_HEAD.CLS_AGNOSTIC_BBOX_REG": False,
    "MODEL.ROI_BOX_HEAD.BBOX_REG_LOSS_TYPE": "smooth_l1",
    "MODEL.ROI_BOX_HEAD.SMOOTH_L1_BETA": 0.0,
    "MODEL.ROI_MASK_HEAD.NAME": "MaskRCNNConvUpsampleHead",
    "MODEL.ROI_MASK_HEAD.NUM_CONV": 4,
    "MODEL.ROI_MASK_HEAD.CONV_DIM": 256,
    "MODEL.ROI_MASK_HEAD.NORM": "",
    "MODEL.ROI_MASK_HEAD.CLS_AGNOSTIC_MASK": False,
    "MODEL.ROI_MASK_HEAD.POOLER_RESOLUTION": 14,
    "MODEL.ROI_MASK_HEAD.POOLER_SAMPLING_RATIO": 0,
    "MODEL.ROI_MASK_HEAD.POOLER_ALIGNED": True,
    "MODEL.ROI_MASK_HEAD.TARGET_MODE": "aligned",
    "MODEL.ROI_MASK_HEAD.PASTE_MODE": "aligned",
    "MODEL.ROI_MASK_HEAD.MASK_THRESHOLD": 0.5,
    "MODEL.RETINANET.NUM_CLASSES": 80,
    "MODEL.RETINANET.IN_FEATURES": ["p3", "p4", "p5", "p6", "p7"],
    "MODEL.RETINANET.NUM_CONVS": 4,
    "MODEL.RETINANET.NORM": "",
    "MODEL.RETINANET.PRIOR_PROB": 0.01,
    "MODEL.RETINANET.IOU_THRESHOLDS": [0.4, 0.5],
    "MODEL.RETINANET.IOU_LABELS": [0, -1, 1],
    "MODEL.RETINANET.ALLOW_LOW_QUALITY_MATCHES": True,
    "MODEL.RETINANET.FOCAL_LOSS_ALPHA": 0.25,
    "MODEL.RETINANET.FOCAL_LOSS_GAMMA": 2.0,
    "MODEL.RETINANET.BBOX_REG_WEIGHTS": (1.0, 1.0, 1.0, 1.0),
    "MODEL.RETINANET.BBOX_REG_LOSS_TYPE": "smooth_l1",
    "MODEL.RETINANET.SMOOTH_L1_LOSS_BETA": 0.11,
    "MODEL.RETINANET.LOSS_NORMALIZER": "num_foreground",
    "MODEL.RETINANET.SCORE_THRESH_TEST": 0.05,
    "MODEL.RETINANET.TOPK_CANDIDATES_TEST": 1000,
    "MODEL.RETINANET.NMS_THRESH_TEST": 0.5,
    "MODEL.RETINANET.CLIP_BEFORE_NMS": False,
    "MODEL.ROI_KEYPOINT_HEAD.NAME": "KRCNNConvDeconvUpsampleHead",
    "MODEL.ROI_KEYPOINT_HEAD.NUM_KEYPOINTS": 17,
    "MODEL.ROI_KEYPOINT_HEAD.CONV_DIMS": [512] * 8,
    "MODEL.ROI_KEYPOINT_HEAD.POOLER_RESOLUTION": 14,
    "MODEL.ROI_KEYPOINT_HEAD.POOLER_SAMPLING_RATIO": 0,
    "MODEL.ROI_KEYPOINT_HEAD.POOLER_ALIGNED": True,
    "MODEL.ROI_KEYPOINT_HEAD.NORMALIZE_LOSS_BY_VISIBLE_KEYPOINTS": True,
    "MODEL.ROI_KEYPOINT_HEAD.LOSS_WEIGHT": 1.0,
    "INPUT.MIN_SIZE_TRAIN": (800,),
    "INPUT.MIN_SIZE_TRAIN_SAMPLING": "choice",
    "INPUT.MAX_SIZE_TRAIN": 1333,
    "INPUT.MIN_SIZE_TEST": 800,
    "INPUT.MAX_SIZE_TEST": 1333,
    "INPUT.RESIZE_MODE": "opencv",
    "INPUT.FORMAT": "BGR",
    "INPUT.MASK_FORMAT": "polygon",
    "INPUT.RANDOM_FLIP": "horizontal",
    "INPUT.SIZE_DIVISIBILITY": 32,
    "INPUT.COLOR_JITTER.BRIGHTNESS": 0.0,
    "INPUT.COLOR_JITTER.CONTRAST": 0.0,
    "INPUT.COLOR_JITTER.SATURATION": 0.0,
    "INPUT.COLOR_JITTER.LIGHTING": 0.0,
    "INPUT.CROP.ENABLED": False,
    "INPUT.CROP.TYPE": "relative_range",
    "INPUT.CROP.SIZE": (0.9, 0.9),
    "INPUT.LARGE_SCALE_JITTER.ENABLED": False,
    "INPUT.LARGE_SCALE_JITTER.OUTPUT_SIZE": (1024, 1024),
    "INPUT.LARGE_SCALE_JITTER.SCALE_RANGE": (0.1, 2.0),
    "DATASETS.TRAIN": ("shapes_train",),
    "DATASETS.TEST": ("shapes_val",),
    "DATASETS.ROOT": "",
    "DATALOADER.NUM_WORKERS": 2,
    "DATALOADER.ASPECT_RATIO_GROUPING": True,
    "DATALOADER.FILTER_EMPTY_ANNOTATIONS": True,
    "DATALOADER.MIN_KEYPOINTS_PER_IMAGE": 1,
    "DATALOADER.SAMPLER_TRAIN": "TrainingSampler",
    "SOLVER.IMS_PER_BATCH": 16,
    "SOLVER.BASE_LR": 0.02,
    "SOLVER.MOMENTUM": 0.9,
    "SOLVER.NESTEROV": False,
    "SOLVER.WEIGHT_DECAY": 0.0001,
    "SOLVER.WEIGHT_DECAY_NORM": 0.0,
    "SOLVER.BIAS_LR_FACTOR": 1.0,
    "SOLVER.MAX_ITER": 90000,
    "SOLVER.STEPS": (60000, 80000),
    "SOLVER.GAMMA": 0.1,
    "SOLVER.LR_SCHEDULER_NAME": "WarmupMultiStepLR",
    "SOLVER.WARMUP_FACTOR": 0.001,
    "SOLVER.WARMUP_ITERS": 1000,
    "SOLVER.WARMUP_METHOD": "linear",
    "SOLVER.CHECKPOINT_PERIOD": 5000,
    "SOLVER.DIVERGENCE.MAX_LOSS_GROWTH": 100.0,
    "SOLVER.DIVERGENCE.MAX_WEIGHT_GROWTH": 10.0,
    "SOLVER.CLIP_GRADIENTS.ENABLED": False,
    "SOLVER.CLIP_GRADIENTS.CLIP_TYPE": "norm",
    "SOLVER.CLIP_GRADIENTS.CLIP_VALUE": 1.0,
    "SOLVER.CLIP_GRADIENTS.NORM_TYPE": 2.0,
    "SOLVER.AMP.ENABLED": False,
    "SOLVER.AMP.DTYPE": "float16",
    "TEST.DETECTIONS_PER_IMAGE": 100,
    "TEST.EVAL_PERIOD": 0,
    "TEST.IMS_PER_BATCH": 1,
    "TEST.PRECISION": "float32",
    "TEST.EVAL_PICTURES": True,
    "TEST.AUG.ENABLED": False,
    "TEST.AUG.MIN_SIZES": (400, 500, 600, 700, 800, 900, 1000, 1100, 1200),
    "TEST.AUG.MAX_SIZE": 4000,
    "TEST.AUG.FLIP": True,
    "TEST.AUG.MERGE": "nms",
    "TEST.AUG.BOX_VOTING_IOU": 0.8,
    "OUTPUT_DIR": "./output",
    "SEED": -1,
    "LOG_PERIOD": 20,
}


def flatten(node, prefix=""):
    """{"A.B.C": value} for every leaf of a nested dict."""
    out = {}
    for k, v in node.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def get(cfg, full_key):
    for name in full_key.split("."):
        cfg = cfg[name]
    return cfg


def as_lists(value):
    """Tuples and lists compare equal after this (yaml has no tuples)."""
    if isinstance(value, (list, tuple)):
        return [as_lists(v) for v in value]
    return value


def file_values(path):
    """What a config file (plus its _BASE_ chain) says, resolved here independently of detcore."""
    data = yaml.safe_load(Path(path).read_text()) or {}
    base = data.pop("_BASE_", None)
    values = file_values(Path(path).parent / base) if base else {}
    values.update(flatten(data))
    return values


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# --- defaults -------------------------------------------------------------------------------


def test_defaults_hold_exactly_the_key_contract():
    cfg = get_cfg()
    assert isinstance(cfg, CfgNode)
    leaves = flatten(cfg)
    assert sorted(leaves) == sorted(EXPECTED_DEFAULTS)
    for key, expected in EXPECTED_DEFAULTS.items():
        assert leaves[key] == expected, key
        assert type(leaves[key]) is type(expected), key  # builders rely on the types too


def test_get_cfg_returns_independent_copies():
    a = get_cfg()
    a.MODEL.RPN.NMS_THRESH = 0.1
    a.MODEL.RESNETS.OUT_FEATURES.append("stem")
    b = get_cfg()
    assert b.MODEL.RPN.NMS_THRESH == 0.7
    assert b.MODEL.RESNETS.OUT_FEATURES == ["res2", "res3", "res4", "res5"]
    assert isinstance(b.MODEL.RPN, CfgNode)


def test_every_default_key_has_a_comment():
    """Each assignment in defaults.py carries a comment on its line, or belongs to a run of
    assignments right under a comment line (e.g. PIXEL_MEAN / PIXEL_STD)."""
    lines = DEFAULTS_PY.read_text().splitlines()
    assign = re.compile(r"^_C\.[A-Z0-9_.]+ = (?!CN\(\))")
    undocumented = []
    for i, line in enumerate(lines):
        if not assign.match(line) or "#" in line:
            continue
        j = i - 1
        while j >= 0 and assign.match(lines[j]):
            j -= 1
        if j < 0 or not lines[j].lstrip().startswith("#"):
            undocumented.append(line)
    assert not undocumented


# --- the yaml zoo ----------------------------------------------------------------------------


def test_zoo_has_the_documented_configs():
    names = {p.name for p in ZOO}
    for name in [
        "Base-RCNN-FPN.yaml",
        "e2e_faster_rcnn_R_50_FPN_1x.yaml",
        "e2e_mask_rcnn_R_50_FPN_1x.yaml",
        "e2e_mask_rcnn_R_101_FPN_1x.yaml",
        "e2e_mask_rcnn_X_101_32x8d_FPN_1x.yaml",
        "e2e_mask_rcnn_R_18_FPN_shapes.yaml",
        "e2e_mask_rcnn_R_34_FPN_shapes.yaml",
    ]:
        assert name in names


def test_readme_lists_every_config():
    readme = (CONFIG_DIR / "README.md").read_text()
    listed = [str(p.relative_to(CONFIG_DIR)) for p in ZOO]
    missing = [name for name in listed if f"`{name}`" not in readme]
    assert not missing, f"add these to configs/README.md: {missing}"


@pytest.mark.parametrize("path", ZOO, ids=lambda p: str(p.relative_to(CONFIG_DIR)))
def test_zoo_config_merges_to_what_its_files_say(path):
    cfg = get_cfg()
    cfg.merge_from_file(str(path))
    said = file_values(path)
    assert said, f"{path} sets nothing"
    for key, value in said.items():
        got = get(cfg, key)
        if isinstance(value, str) and not isinstance(got, str):
            value = ast.literal_eval(value)  # yacs-style "(800,)" strings
        assert as_lists(got) == as_lists(value), key
        # Types never drift from the defaults (a yaml list lands as the default's tuple, ...).
        assert type(got) is type(EXPECTED_DEFAULTS[key]), key
    # Untouched keys keep their defaults.
    for key, default in EXPECTED_DEFAULTS.items():
        if key not in said:
            assert get(cfg, key) == default, key


@pytest.mark.parametrize("path", ZOO, ids=lambda p: str(p.relative_to(CONFIG_DIR)))
def test_zoo_config_is_self_consistent(path):
    cfg = get_cfg()
    cfg.merge_from_file(str(path))
    m = cfg.MODEL
    retinanet = m.META_ARCHITECTURE == "RetinaNet"
    anchor_levels = m.RETINANET.IN_FEATURES if retinanet else m.RPN.IN_FEATURES
    sizes, ratios = m.ANCHOR_GENERATOR.SIZES, m.ANCHOR_GENERATOR.ASPECT_RATIOS
    levels = len(anchor_levels)
    assert len(sizes) in (1, levels) and len(ratios) in (1, levels)
    flat_sizes = [s for level in sizes for s in level]
    assert flat_sizes == sorted(flat_sizes), "anchor sizes grow with the FPN level"
    if m.BACKBONE.NAME == "ResNet":  # C4: the body's own outputs feed the RPN and the ROI heads
        assert set(m.RPN.IN_FEATURES) <= set(m.RESNETS.OUT_FEATURES)
        assert m.ROI_HEADS.NAME == "Res5ROIHeads" and "res5" not in m.RESNETS.OUT_FEATURES
    else:
        assert set(m.FPN.IN_FEATURES) <= set(m.RESNETS.OUT_FEATURES)
        top = {"maxpool": {"p6"}, "p6p7": {"p6", "p7"}, "p6p7_from_p5": {"p6", "p7"}}.get(m.FPN.TOP_BLOCK, set())
        fpn_outputs = {f"p{int(f[-1])}" for f in m.FPN.IN_FEATURES} | top
        assert set(anchor_levels) <= fpn_outputs
    if retinanet:
        assert not m.MASK_ON
        assert m.RETINANET.TOPK_CANDIDATES_TEST >= cfg.TEST.DETECTIONS_PER_IMAGE
    else:
        assert set(m.ROI_HEADS.IN_FEATURES) <= set(m.RPN.IN_FEATURES)
        assert m.RPN.POST_NMS_TOPK_TEST >= cfg.TEST.DETECTIONS_PER_IMAGE
    assert m.RESNETS.DEPTH in (18, 34, 50, 101, 152)
    if m.RESNETS.DEPTH in (18, 34):
        assert m.RESNETS.RES2_OUT_CHANNELS == 64 and m.RESNETS.NUM_GROUPS == 1
    else:
        assert m.RESNETS.RES2_OUT_CHANNELS == 256
    if m.RESNETS.NORM == "GN":  # GroupNorm uses 32 groups
        assert m.RESNETS.STEM_OUT_CHANNELS % 32 == 0 and m.RESNETS.RES2_OUT_CHANNELS % 32 == 0
    gn_layers = [(m.FPN.NORM, m.FPN.OUT_CHANNELS), (m.ROI_MASK_HEAD.NORM, m.ROI_MASK_HEAD.CONV_DIM),
                 (m.RETINANET.NORM, m.FPN.OUT_CHANNELS)]
    for norm, channels in gn_layers:
        if norm == "GN":
            assert channels % 32 == 0
    assert m.BACKBONE.FREEZE_AT == 0 or m.RESNETS.NORM == "FrozenBN" or m.WEIGHTS
    s = cfg.SOLVER
    assert list(s.STEPS) == sorted(s.STEPS) and s.STEPS[-1] < s.MAX_ITER
    assert s.WARMUP_ITERS < s.STEPS[0]
    assert cfg.INPUT.MIN_SIZE_TEST <= cfg.INPUT.MAX_SIZE_TEST
    assert max(cfg.INPUT.MIN_SIZE_TRAIN) <= cfg.INPUT.MAX_SIZE_TRAIN


def zoo(name):
    cfg = get_cfg()
    cfg.merge_from_file(str(CONFIG_DIR / name))
    return cfg


def test_c4_and_rpn_only_configs_follow_the_published_recipes():
    """detectron2's / Detectron's Base-RCNN-C4 and rpn_R_50_{C4,FPN}_1x settings."""
    for name, mask_on in [("faster_rcnn_R_50_C4_1x.yaml", False), ("mask_rcnn_R_50_C4_1x.yaml", True),
                          ("detectron2/mask_rcnn_R_50_C4_1x.yaml", True)]:
        m = zoo(name).MODEL
        assert (m.META_ARCHITECTURE, m.MASK_ON, m.RESNETS.DEPTH) == ("GeneralizedRCNN", mask_on, 50), name
        assert (m.BACKBONE.NAME, m.RESNETS.OUT_FEATURES, m.RPN.IN_FEATURES) == ("ResNet", ["res4"], ["res4"])
        assert m.ANCHOR_GENERATOR.SIZES == [[32, 64, 128, 256, 512]]
        rpn = m.RPN
        assert (rpn.PRE_NMS_TOPK_TRAIN, rpn.PRE_NMS_TOPK_TEST, rpn.POST_NMS_TOPK_TRAIN, rpn.POST_NMS_TOPK_TEST) == (
            12000, 6000, 2000, 1000)
        assert (m.ROI_HEADS.NAME, m.ROI_HEADS.IN_FEATURES, m.ROI_HEADS.BATCH_SIZE_PER_IMAGE) == ("Res5ROIHeads", ["res4"], 512)
        assert m.ROI_BOX_HEAD.POOLER_RESOLUTION == m.ROI_MASK_HEAD.POOLER_RESOLUTION == 14
        assert (m.ROI_MASK_HEAD.NUM_CONV, m.ROI_MASK_HEAD.CONV_DIM) == (0, 256)
    d2 = zoo("detectron2/mask_rcnn_R_50_C4_1x.yaml")
    assert d2.MODEL.PIXEL_STD == [1.0, 1.0, 1.0] and d2.MODEL.RESNETS.STRIDE_IN_1X1
    assert d2.INPUT.MIN_SIZE_TRAIN == (640, 672, 704, 736, 768, 800)
    for name, backbone, pre, post in [("rpn_R_50_C4_1x.yaml", "ResNet", 12000, 2000),
                                      ("rpn_R_50_FPN_1x.yaml", "FPN", 1000, 2000)]:
        m = zoo(name).MODEL
        assert (m.META_ARCHITECTURE, m.BACKBONE.NAME, m.RESNETS.DEPTH) == ("ProposalNetwork", backbone, 50), name
        assert (m.RPN.PRE_NMS_TOPK_TEST, m.RPN.POST_NMS_TOPK_TEST) == (pre, post), name


def test_coco_configs_follow_the_published_recipe():
    for name, depth, mask_on in [
        ("e2e_faster_rcnn_R_50_FPN_1x.yaml", 50, False),
        ("e2e_mask_rcnn_R_50_FPN_1x.yaml", 50, True),
        ("e2e_mask_rcnn_R_101_FPN_1x.yaml", 101, True),
        ("e2e_mask_rcnn_X_101_32x8d_FPN_1x.yaml", 101, True),
    ]:
        cfg = zoo(name)
        m = cfg.MODEL
        assert (m.RESNETS.DEPTH, m.MASK_ON) == (depth, mask_on), name
        assert cfg.INPUT.MIN_SIZE_TRAIN == (800,) and cfg.INPUT.MAX_SIZE_TRAIN == 1333
        assert (cfg.INPUT.MIN_SIZE_TEST, cfg.INPUT.MAX_SIZE_TEST) == (800, 1333)
        assert m.ANCHOR_GENERATOR.SIZES == [[32], [64], [128], [256], [512]]
        assert m.ANCHOR_GENERATOR.ASPECT_RATIOS == [[0.5, 1.0, 2.0]]
        rpn = m.RPN
        assert (rpn.POST_NMS_TOPK_TRAIN, rpn.POST_NMS_TOPK_TEST, rpn.NMS_THRESH) == (2000, 1000, 0.7)
        assert (m.ROI_HEADS.BATCH_SIZE_PER_IMAGE, m.ROI_HEADS.POSITIVE_FRACTION) == (512, 0.25)
        assert (m.ROI_BOX_HEAD.NUM_FC, m.ROI_BOX_HEAD.FC_DIM) == (2, 1024)
        mask = m.ROI_MASK_HEAD
        assert (mask.NUM_CONV, mask.CONV_DIM, mask.POOLER_RESOLUTION) == (4, 256, 14)
        heads = m.ROI_HEADS
        assert heads.NUM_CLASSES == 80
        assert (heads.SCORE_THRESH_TEST, heads.NMS_THRESH_TEST) == (0.05, 0.5)
        assert cfg.TEST.DETECTIONS_PER_IMAGE == 100
        s = cfg.SOLVER
        assert (s.MAX_ITER, s.STEPS, s.BASE_LR, s.IMS_PER_BATCH) == (90000, (60000, 80000), 0.02, 16)
        assert cfg.DATASETS.TRAIN == ("coco_2017_train",) and cfg.DATASETS.TEST == ("coco_2017_val",)
    x = zoo("e2e_mask_rcnn_X_101_32x8d_FPN_1x.yaml").MODEL.RESNETS
    assert (x.NUM_GROUPS, x.WIDTH_PER_GROUP, x.STRIDE_IN_1X1) == (32, 8, False)
    r = zoo("e2e_mask_rcnn_R_101_FPN_1x.yaml").MODEL.RESNETS
    assert (r.NUM_GROUPS, r.WIDTH_PER_GROUP) == (1, 64)


def test_retinanet_configs_follow_their_sources():
    paper = zoo("retinanet_R_50_FPN_1x.yaml")
    m = paper.MODEL
    assert (m.META_ARCHITECTURE, m.RESNETS.DEPTH, m.MASK_ON, m.FPN.TOP_BLOCK) == ("RetinaNet", 50, False, "p6p7")
    assert m.RESNETS.OUT_FEATURES == m.FPN.IN_FEATURES == ["res3", "res4", "res5"]
    assert m.RETINANET.IN_FEATURES == ["p3", "p4", "p5", "p6", "p7"]
    sizes = m.ANCHOR_GENERATOR.SIZES
    assert [[round(v, 6) for v in level] for level in sizes] == [
        [round(x * 2 ** (k / 3), 6) for k in range(3)] for x in (32, 64, 128, 256, 512)
    ]
    r = m.RETINANET
    assert (r.NUM_CLASSES, r.NUM_CONVS, r.PRIOR_PROB, r.FOCAL_LOSS_ALPHA, r.FOCAL_LOSS_GAMMA) == (80, 4, 0.01, 0.25, 2.0)
    assert (r.IOU_THRESHOLDS, r.IOU_LABELS) == ([0.4, 0.5], [0, -1, 1])
    assert (r.SCORE_THRESH_TEST, r.TOPK_CANDIDATES_TEST, r.NMS_THRESH_TEST) == (0.05, 1000, 0.5)
    s = paper.SOLVER
    assert (s.MAX_ITER, s.STEPS, s.BASE_LR, s.IMS_PER_BATCH) == (90000, (60000, 80000), 0.01, 16)
    assert paper.INPUT.MIN_SIZE_TRAIN == (800,) and paper.TEST.DETECTIONS_PER_IMAGE == 100

    tv = zoo("torchvision/retinanet_R_50_FPN.yaml").MODEL
    assert tv.ANCHOR_GENERATOR.SIZES == [[x, int(x * 2 ** (1 / 3)), int(x * 2 ** (2 / 3))] for x in (32, 64, 128, 256, 512)]
    assert (tv.FPN.TOP_BLOCK, tv.ANCHOR_GENERATOR.CELL_ANCHOR_ORDER, tv.RETINANET.NUM_CLASSES) == ("p6p7_from_p5", "ratio_major", 90)
    assert (tv.RETINANET.LOSS_NORMALIZER, tv.RETINANET.CLIP_BEFORE_NMS) == ("per_image", True)
    d2 = zoo("detectron2/retinanet_R_50_FPN_1x.yaml")
    assert (d2.MODEL.RETINANET.LOSS_NORMALIZER, d2.MODEL.RETINANET.SMOOTH_L1_LOSS_BETA) == ("moving_average", 0.0)
    assert d2.MODEL.PIXEL_STD == [1.0, 1.0, 1.0] and d2.INPUT.MIN_SIZE_TRAIN == (640, 672, 704, 736, 768, 800)

    shapes = zoo("retinanet_R_18_FPN_shapes.yaml")
    m = shapes.MODEL
    assert (m.RESNETS.DEPTH, m.RESNETS.NORM, m.FPN.OUT_CHANNELS, m.RETINANET.NUM_CLASSES) == (18, "GN", 64, 3)
    assert m.WEIGHTS == "" and m.BACKBONE.FREEZE_AT == 0 and m.DEVICE == "cpu"
    assert shapes.INPUT.MIN_SIZE_TRAIN == (96,) and shapes.SOLVER.IMS_PER_BATCH == 2
    assert shapes.DATASETS.TRAIN == ("shapes_train",) and shapes.DATASETS.TEST == ("shapes_val",)


@pytest.mark.parametrize(
    "name,depth", [("e2e_mask_rcnn_R_18_FPN_shapes.yaml", 18), ("e2e_mask_rcnn_R_34_FPN_shapes.yaml", 34)]
)
def test_shapes_configs_are_small_and_from_scratch(name, depth):
    cfg = zoo(name)
    m = cfg.MODEL
    assert m.RESNETS.DEPTH == depth and m.MASK_ON and m.DEVICE == "cpu"
    assert cfg.DATASETS.TRAIN == ("shapes_train",) and cfg.DATASETS.TEST == ("shapes_val",)
    assert m.ROI_HEADS.NUM_CLASSES == 3
    assert m.WEIGHTS == "" and m.BACKBONE.FREEZE_AT == 0 and m.RESNETS.NORM == "GN"
    assert m.RESNETS.RES2_OUT_CHANNELS == 64
    assert cfg.INPUT.MIN_SIZE_TRAIN == (96,) and cfg.INPUT.MAX_SIZE_TRAIN <= 320
    assert m.ROI_HEADS.BATCH_SIZE_PER_IMAGE == 64
    assert m.ANCHOR_GENERATOR.SIZES[0] == [8] and m.ANCHOR_GENERATOR.SIZES[-1] == [128]
    assert (m.FPN.OUT_CHANNELS, m.ROI_BOX_HEAD.FC_DIM, m.ROI_MASK_HEAD.CONV_DIM) == (64, 256, 64)
    assert cfg.SOLVER.IMS_PER_BATCH == 2 and 1000 <= cfg.SOLVER.MAX_ITER <= 10000


# --- _BASE_ ------------------------------------------------------------------------------------


def test_base_chain_applies_farthest_base_first(tmp_path):
    write(tmp_path / "grand.yaml", "MODEL:\n  RPN:\n    NMS_THRESH: 0.1\n    MIN_SIZE: 1.0\nSEED: 1\n")
    parent = "_BASE_: ../grand.yaml\nMODEL:\n  RPN:\n    NMS_THRESH: 0.2\nSEED: 2\n"
    write(tmp_path / "mid" / "parent.yaml", parent)
    child = write(tmp_path / "mid" / "deep" / "child.yaml", "_BASE_: '../parent.yaml'\nSEED: 3\n")
    cfg = get_cfg()
    cfg.merge_from_file(child)  # a pathlib.Path works too
    assert (cfg.MODEL.RPN.MIN_SIZE, cfg.MODEL.RPN.NMS_THRESH, cfg.SEED) == (1.0, 0.2, 3)
    assert cfg.LOG_PERIOD == 20  # untouched


def test_base_may_be_an_absolute_path(tmp_path):
    base = write(tmp_path / "elsewhere" / "base.yaml", "LOG_PERIOD: 7\n")
    child = write(tmp_path / "child.yaml", f"_BASE_: {base}\n")
    cfg = get_cfg()
    cfg.merge_from_file(str(child))
    assert cfg.LOG_PERIOD == 7


def test_missing_base_file_names_both_files(tmp_path):
    child = write(tmp_path / "child.yaml", "_BASE_: nope/base.yaml\nSEED: 3\n")
    cfg = get_cfg()
    with pytest.raises(FileNotFoundError) as e:
        cfg.merge_from_file(str(child))
    assert str(tmp_path / "nope" / "base.yaml") in str(e.value)
    assert str(child) in str(e.value)
    assert cfg.SEED == -1


def test_missing_config_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.yaml"):
        get_cfg().merge_from_file(str(tmp_path / "missing.yaml"))


@pytest.mark.parametrize("self_cycle", [False, True])
def test_base_cycle_is_an_error(tmp_path, self_cycle):
    a = tmp_path / "a.yaml"
    if self_cycle:
        write(a, "_BASE_: a.yaml\n")
    else:
        write(a, "_BASE_: b.yaml\nSEED: 1\n")
        write(tmp_path / "b.yaml", "_BASE_: a.yaml\nSEED: 2\n")
    with pytest.raises(ConfigError, match="cycle") as e:
        get_cfg().merge_from_file(str(a))
    assert str(a) in str(e.value)
    if not self_cycle:
        assert str(tmp_path / "b.yaml") in str(e.value)


def test_bad_base_value_and_non_mapping_file(tmp_path):
    with pytest.raises(ConfigError, match="_BASE_"):
        get_cfg().merge_from_file(str(write(tmp_path / "a.yaml", "_BASE_: [x.yaml, y.yaml]\n")))
    with pytest.raises(ConfigError, match="mapping"):
        get_cfg().merge_from_file(str(write(tmp_path / "b.yaml", "- 1\n- 2\n")))
    cfg = get_cfg()
    cfg.merge_from_file(str(write(tmp_path / "empty.yaml", "")))
    assert cfg == get_cfg()


# --- overrides from a list -----------------------------------------------------------------------


def test_merge_from_list_parses_like_yacs():
    cfg = get_cfg()
    cfg.merge_from_list(
        [
            "MODEL.RPN.NMS_THRESH", "0.6",
            "INPUT.MIN_SIZE_TRAIN", "(640, 672, 704)",
            "SOLVER.STEPS", "[100, 200]",           # list into a tuple key -> tuple
            "MODEL.RESNETS.OUT_FEATURES", "('res4',)",  # tuple into a list key -> list
            "MODEL.MASK_ON", "True",
            "MODEL.RESNETS.NORM", "GN",             # not a literal: stays a string
            "MODEL.WEIGHTS", "'/tmp/w.pth'",
            "OUTPUT_DIR", "2024",                   # a string key keeps the text
            "SOLVER.BASE_LR", "1",                  # int into a float key -> float
            "SOLVER.MAX_ITER", 10,                  # non-strings pass through
        ]
    )  # fmt: skip
    assert cfg.MODEL.RPN.NMS_THRESH == 0.6
    assert cfg.INPUT.MIN_SIZE_TRAIN == (640, 672, 704)
    assert cfg.SOLVER.STEPS == (100, 200)
    assert cfg.MODEL.RESNETS.OUT_FEATURES == ["res4"]
    assert cfg.MODEL.MASK_ON is True
    assert cfg.MODEL.RESNETS.NORM == "GN"
    assert cfg.MODEL.WEIGHTS == "/tmp/w.pth"
    assert cfg.OUTPUT_DIR == "2024"
    assert cfg.SOLVER.BASE_LR == 1.0 and type(cfg.SOLVER.BASE_LR) is float
    assert cfg.SOLVER.MAX_ITER == 10


def test_merge_from_list_after_file(tmp_path):
    cfg = zoo("e2e_mask_rcnn_R_18_FPN_shapes.yaml")
    cfg.merge_from_list(["SOLVER.MAX_ITER", "50", "MODEL.ROI_HEADS.NUM_CLASSES", "5"])
    assert (cfg.SOLVER.MAX_ITER, cfg.MODEL.ROI_HEADS.NUM_CLASSES, cfg.MODEL.RESNETS.DEPTH) == (50, 5, 18)


def test_odd_override_list_is_an_error():
    with pytest.raises(ConfigError, match="pairs"):
        get_cfg().merge_from_list(["MODEL.RPN.NMS_THRESH"])


# --- unknown keys and type mismatches ---------------------------------------------------------


@pytest.mark.parametrize(
    "key,suggestion",
    [
        ("MODEL.RPN.NMS_TRESH", "MODEL.RPN.NMS_THRESH"),
        ("MODEL.RPNN.NMS_THRESH", "MODEL.RPN.NMS_THRESH"),
        ("SOLVER.NUM_WORKERS", "DATALOADER.NUM_WORKERS"),
        ("SOLVER.BASELR", "SOLVER.BASE_LR"),
        ("MODEL.DEVICE.INDEX", "MODEL.DEVICE"),
    ],
)
def test_unknown_key_in_list_suggests_the_closest(key, suggestion):
    cfg = get_cfg()
    with pytest.raises(KeyError) as e:
        cfg.merge_from_list(["SEED", "5", key, "0.6"])
    assert isinstance(e.value, UnknownKeyError)
    msg = str(e.value)
    assert key in msg and f"did you mean {suggestion}?" in msg
    assert cfg.SEED == -1  # all or nothing: the good pair before it was not applied


def test_unknown_key_in_file_names_key_file_and_suggestion(tmp_path):
    bad = write(tmp_path / "bad.yaml", "SEED: 4\nMODEL:\n  RPN:\n    NMS_TRESH: 0.6\n")
    child = write(tmp_path / "child.yaml", "_BASE_: bad.yaml\nSEED: 5\n")
    cfg = get_cfg()
    with pytest.raises(UnknownKeyError) as e:
        cfg.merge_from_file(str(child))
    msg = str(e.value)
    assert "MODEL.RPN.NMS_TRESH" in msg and str(bad) in msg  # the file that holds the typo
    assert "did you mean MODEL.RPN.NMS_THRESH?" in msg
    assert cfg.SEED == -1 and cfg == get_cfg()


def test_unknown_section_in_file_points_at_the_leaf(tmp_path):
    bad = write(tmp_path / "bad.yaml", "MODEL:\n  ROI_HEAD:\n    NUM_CLASSES: 3\n")
    with pytest.raises(UnknownKeyError) as e:
        get_cfg().merge_from_file(str(bad))
    assert "MODEL.ROI_HEAD.NUM_CLASSES" in str(e.value)
    assert "did you mean MODEL.ROI_HEADS.NUM_CLASSES?" in str(e.value)


def test_unknown_key_far_from_everything_says_so():
    with pytest.raises(UnknownKeyError, match="no similar key"):
        get_cfg().merge_from_list(["ZZZZZZZZZZZZ", "1"])


@pytest.mark.parametrize(
    "key,value,expected_type",
    [
        ("MODEL.RPN.NMS_THRESH", "abc", "float"),
        ("SOLVER.MAX_ITER", "1.5", "int"),
        ("MODEL.MASK_ON", "1", "bool"),
        ("SOLVER.MAX_ITER", "True", "int"),  # a bool is not an int here
        ("INPUT.MIN_SIZE_TRAIN", "640", "tuple"),
    ],
)
def test_type_mismatch_in_list_names_key_type_and_value(key, value, expected_type):
    with pytest.raises(ValueError) as e:
        get_cfg().merge_from_list([key, value])
    assert isinstance(e.value, ConfigTypeError)
    msg = str(e.value)
    assert key in msg and f"expected {expected_type}" in msg and value in msg


def test_type_mismatch_in_file_names_the_file(tmp_path):
    bad = write(tmp_path / "bad.yaml", "SOLVER:\n  IMS_PER_BATCH: four\n")
    with pytest.raises(ConfigTypeError) as e:
        get_cfg().merge_from_file(str(bad))
    msg = str(e.value)
    assert "SOLVER.IMS_PER_BATCH" in msg and "expected int" in msg and "'four'" in msg and str(bad) in msg


def test_value_for_a_group_of_keys_is_an_error(tmp_path):
    with pytest.raises(ConfigTypeError, match="group of keys"):
        get_cfg().merge_from_list(["MODEL.RPN", "0.6"])
    with pytest.raises(ConfigTypeError, match="group of keys"):
        get_cfg().merge_from_file(str(write(tmp_path / "a.yaml", "MODEL: 3\n")))
    with pytest.raises(ConfigTypeError, match="SEED"):
        get_cfg().merge_from_file(str(write(tmp_path / "b.yaml", "SEED:\n  X: 1\n")))


# --- yacs behaviour kept -------------------------------------------------------------------------


def test_dump_round_trip_of_defaults_and_every_zoo_config(tmp_path):
    for source in [None, *ZOO]:
        cfg = get_cfg()
        if source is not None:
            cfg.merge_from_file(str(source))
        dumped = write(tmp_path / "dumped.yaml", cfg.dump())
        again = get_cfg()
        again.merge_from_file(str(dumped))
        assert again == cfg, source
        assert flatten(again) == flatten(cfg)
        assert all(type(get(again, k)) is type(v) for k, v in flatten(cfg).items())


def test_merge_from_other_cfg_checks_keys():
    cfg = get_cfg()
    other = CfgNode({"MODEL": {"RPN": {"NMS_THRESH": 0.3}}})
    cfg.merge_from_other_cfg(other)
    assert cfg.MODEL.RPN.NMS_THRESH == 0.3
    with pytest.raises(UnknownKeyError, match="did you mean MODEL.RPN.NMS_THRESH"):
        cfg.merge_from_other_cfg(CfgNode({"MODEL": {"RPN": {"NMS_THRES": 0.3}}}))


def test_merge_keeps_references_to_sub_nodes():
    cfg = get_cfg()
    rpn = cfg.MODEL.RPN
    cfg.merge_from_list(["MODEL.RPN.NMS_THRESH", "0.5"])
    assert rpn is cfg.MODEL.RPN and rpn.NMS_THRESH == 0.5


def test_frozen_config_refuses_merges_and_edits():
    cfg = get_cfg()
    cfg.freeze()
    with pytest.raises(AttributeError, match="frozen"):
        cfg.merge_from_list(["SEED", "1"])
    with pytest.raises(AttributeError):
        cfg.MODEL.RPN.NMS_THRESH = 0.1
    cfg.defrost()
    cfg.merge_from_list(["SEED", "1"])
    assert cfg.SEED == 1


def test_renamed_and_deprecated_keys():
    cfg = get_cfg()
    cfg.register_renamed_key("MODEL.RPN.NMS_THRESHOLD", "MODEL.RPN.NMS_THRESH")
    cfg.register_deprecated_key("MODEL.OLD_FLAG")
    with pytest.raises(KeyError, match="renamed to MODEL.RPN.NMS_THRESH"):
        cfg.merge_from_list(["MODEL.RPN.NMS_THRESHOLD", "0.5"])
    cfg.merge_from_list(["MODEL.OLD_FLAG", "1", "SEED", "3"])  # ignored with a warning
    assert cfg.SEED == 3 and "OLD_FLAG" not in cfg.MODEL


def test_new_allowed_nodes_take_new_keys(tmp_path):
    cfg = get_cfg()
    cfg.MODEL.EXTRA = CfgNode(new_allowed=True)
    text = "MODEL:\n  EXTRA:\n    ALPHA: 0.5\n    SUB: {B: 1}\n"
    cfg.merge_from_file(str(write(tmp_path / "a.yaml", text)))
    assert cfg.MODEL.EXTRA.ALPHA == 0.5 and cfg.MODEL.EXTRA.SUB.B == 1
