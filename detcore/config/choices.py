"""What config values may be: one source for the code that checks an argument and for the config.

Each tuple is what the code accepts (the constructors and builders test their arguments against
it), and `CHOICES` maps the config keys that take one of them to it, so that a value outside
the set fails when it is merged into a config (naming the key and the allowed values), not
later inside `build_model`. The comment above each key in defaults.py lists the same values; a
test checks that they agree. `RANGES` does the same for numbers that must lie in an interval
(an IoU threshold of 5.0 would silently suppress nothing), and `MODEL.DEVICE` must be a device
name torch knows.
"""
import math

# "" and None (yaml null) both mean no normalization.
NORMS = ("", "BN", "SyncBN", "FrozenBN", "GN", None)
RESNET_DEPTHS = (18, 34, 50, 101, 152)
RES5_DILATIONS = (1, 2)
FREEZE_AT_STAGES = (0, 1, 2, 3, 4, 5)
# A list-valued key: each of its elements must be one of these.
RESNET_OUT_FEATURES = ("stem", "res2", "res3", "res4", "res5")
FPN_FUSE_TYPES = ("sum", "avg")
# "none" is a spelling of "" (no extra level).
FPN_TOP_BLOCKS = ("maxpool", "p6p7", "p6p7_from_p5", "", "none")
CELL_ANCHOR_ORDERS = ("size_major", "ratio_major")
BOX_REG_LOSS_TYPES = ("smooth_l1", "l1", "giou")
RPN_LOSS_NORMALIZERS = ("batch_size", "num_sampled")
RPN_PROPOSAL_RANKINGS = ("logit", "sigmoid", "torchvision")
RETINANET_LOSS_NORMALIZERS = ("moving_average", "num_foreground", "per_image")
# The head's norm is shared by all levels: only a per-sample norm (GN) makes sense there.
RETINANET_HEAD_NORMS = ("", "GN", None)
LEVEL_MAPPERS = ("detectron2", "torchvision", "maskrcnn_benchmark")
MASK_TARGET_MODES = ("aligned", "torchvision")
MASK_PASTE_MODES = ("aligned", "torchvision")
RESIZE_SAMPLING_STYLES = ("choice", "range")
RESIZE_MODES = ("opencv", "torchvision", "maskrcnn_benchmark")
IMAGE_FORMATS = ("BGR", "RGB")
MASK_FORMATS = ("polygon", "bitmask")
FLIP_DIRECTIONS = ("none", "horizontal", "vertical")
CROP_TYPES = ("relative_range", "relative", "absolute", "absolute_range")
TTA_MERGE_MODES = ("nms", "box_voting")
TRAIN_SAMPLERS = ("TrainingSampler",)
LR_SCHEDULERS = ("WarmupMultiStepLR", "WarmupCosineLR")
WARMUP_METHODS = ("linear", "constant")
CLIP_TYPES = ("norm", "value")
AMP_DTYPES = ("float16", "bfloat16")
INFERENCE_PRECISIONS = ("float32", "bfloat16")

CHOICES = {
    "MODEL.BACKBONE.FREEZE_AT": FREEZE_AT_STAGES,
    "MODEL.RESNETS.DEPTH": RESNET_DEPTHS,
    "MODEL.RESNETS.OUT_FEATURES": RESNET_OUT_FEATURES,
    "MODEL.RESNETS.NORM": NORMS,
    "MODEL.RESNETS.RES5_DILATION": RES5_DILATIONS,
    "MODEL.FPN.NORM": NORMS,
    "MODEL.FPN.FUSE_TYPE": FPN_FUSE_TYPES,
    "MODEL.FPN.TOP_BLOCK": FPN_TOP_BLOCKS,
    "MODEL.ANCHOR_GENERATOR.CELL_ANCHOR_ORDER": CELL_ANCHOR_ORDERS,
    "MODEL.RPN.BBOX_REG_LOSS_TYPE": BOX_REG_LOSS_TYPES,
    "MODEL.RPN.LOSS_NORMALIZER": RPN_LOSS_NORMALIZERS,
    "MODEL.RPN.PROPOSAL_RANKING": RPN_PROPOSAL_RANKINGS,
    "MODEL.RETINANET.NORM": RETINANET_HEAD_NORMS,
    "MODEL.RETINANET.BBOX_REG_LOSS_TYPE": BOX_REG_LOSS_TYPES,
    "MODEL.RETINANET.LOSS_NORMALIZER": RETINANET_LOSS_NORMALIZERS,
    "MODEL.ROI_HEADS.LEVEL_MAPPER": LEVEL_MAPPERS,
    "MODEL.ROI_BOX_HEAD.NORM": NORMS,
    "MODEL.ROI_BOX_HEAD.BBOX_REG_LOSS_TYPE": BOX_REG_LOSS_TYPES,
    "MODEL.ROI_MASK_HEAD.NORM": NORMS,
    "MODEL.ROI_MASK_HEAD.TARGET_MODE": MASK_TARGET_MODES,
    "MODEL.ROI_MASK_HEAD.PASTE_MODE": MASK_PASTE_MODES,
    "INPUT.MIN_SIZE_TRAIN_SAMPLING": RESIZE_SAMPLING_STYLES,
    "INPUT.RESIZE_MODE": RESIZE_MODES,
    "INPUT.FORMAT": IMAGE_FORMATS,
    "INPUT.MASK_FORMAT": MASK_FORMATS,
    "INPUT.RANDOM_FLIP": FLIP_DIRECTIONS,
    "INPUT.CROP.TYPE": CROP_TYPES,
    "TEST.AUG.MERGE": TTA_MERGE_MODES,
    "DATALOADER.SAMPLER_TRAIN": TRAIN_SAMPLERS,
    "SOLVER.LR_SCHEDULER_NAME": LR_SCHEDULERS,
    "SOLVER.WARMUP_METHOD": WARMUP_METHODS,
    "SOLVER.CLIP_GRADIENTS.CLIP_TYPE": CLIP_TYPES,
    "SOLVER.AMP.DTYPE": AMP_DTYPES,
    "TEST.PRECISION": INFERENCE_PRECISIONS,
}


# key -> (lowest, highest) allowed, inclusive; for a list-valued key, each element.
INF = float("inf")
RANGES = {
    "MODEL.BACKBONE.FREEZE_AT": (0, 5),
    "MODEL.ANCHOR_GENERATOR.OFFSET": (0.0, 1.0),
    "MODEL.RPN.IOU_THRESHOLDS": (0.0, 1.0),
    "MODEL.RPN.BATCH_SIZE_PER_IMAGE": (1, INF),
    "MODEL.RPN.POSITIVE_FRACTION": (0.0, 1.0),
    "MODEL.RPN.SMOOTH_L1_BETA": (0.0, INF),
    "MODEL.RPN.PRE_NMS_TOPK_TRAIN": (1, INF),
    "MODEL.RPN.PRE_NMS_TOPK_TEST": (1, INF),
    "MODEL.RPN.POST_NMS_TOPK_TRAIN": (1, INF),
    "MODEL.RPN.POST_NMS_TOPK_TEST": (1, INF),
    "MODEL.RPN.NMS_THRESH": (0.0, 1.0),
    "MODEL.RPN.MIN_SIZE": (0.0, INF),
    "MODEL.RETINANET.NUM_CLASSES": (1, INF),
    "MODEL.RETINANET.NUM_CONVS": (0, INF),
    "MODEL.RETINANET.PRIOR_PROB": (1e-6, 1.0 - 1e-6),
    "MODEL.RETINANET.IOU_THRESHOLDS": (0.0, 1.0),
    "MODEL.RETINANET.FOCAL_LOSS_ALPHA": (0.0, 1.0),
    "MODEL.RETINANET.FOCAL_LOSS_GAMMA": (0.0, INF),
    "MODEL.RETINANET.SMOOTH_L1_LOSS_BETA": (0.0, INF),
    "MODEL.RETINANET.SCORE_THRESH_TEST": (0.0, 1.0),
    "MODEL.RETINANET.TOPK_CANDIDATES_TEST": (1, INF),
    "MODEL.RETINANET.NMS_THRESH_TEST": (0.0, 1.0),
    "MODEL.ROI_HEADS.NUM_CLASSES": (1, INF),
    "MODEL.ROI_HEADS.IOU_THRESHOLDS": (0.0, 1.0),
    "MODEL.ROI_HEADS.BATCH_SIZE_PER_IMAGE": (1, INF),
    "MODEL.ROI_HEADS.POSITIVE_FRACTION": (0.0, 1.0),
    "MODEL.ROI_HEADS.SCORE_THRESH_TEST": (0.0, 1.0),
    "MODEL.ROI_HEADS.NMS_THRESH_TEST": (0.0, 1.0),
    "MODEL.ROI_HEADS.MIN_BOX_SIZE_TEST": (0.0, INF),
    "MODEL.ROI_BOX_HEAD.POOLER_RESOLUTION": (1, INF),
    "MODEL.ROI_BOX_HEAD.POOLER_SAMPLING_RATIO": (0, 64),
    "MODEL.ROI_BOX_HEAD.SMOOTH_L1_BETA": (0.0, INF),
    "MODEL.ROI_MASK_HEAD.POOLER_RESOLUTION": (1, INF),
    "MODEL.ROI_MASK_HEAD.POOLER_SAMPLING_RATIO": (0, 64),
    "MODEL.ROI_MASK_HEAD.MASK_THRESHOLD": (0.0, 1.0),
    "MODEL.ROI_KEYPOINT_HEAD.NUM_KEYPOINTS": (1, INF),
    "MODEL.ROI_KEYPOINT_HEAD.CONV_DIMS": (1, INF),
    "MODEL.ROI_KEYPOINT_HEAD.POOLER_RESOLUTION": (1, INF),
    "MODEL.ROI_KEYPOINT_HEAD.POOLER_SAMPLING_RATIO": (0, 64),
    "MODEL.ROI_KEYPOINT_HEAD.LOSS_WEIGHT": (0.0, INF),
    "MODEL.RESNETS.DEFORM_NUM_GROUPS": (1, INF),
    "INPUT.SIZE_DIVISIBILITY": (0, INF),
    "INPUT.COLOR_JITTER.BRIGHTNESS": (0.0, 1.0),
    "INPUT.COLOR_JITTER.CONTRAST": (0.0, 1.0),
    "INPUT.COLOR_JITTER.SATURATION": (0.0, 1.0),
    "INPUT.COLOR_JITTER.LIGHTING": (0.0, INF),
    "INPUT.CROP.SIZE": (0.0, INF),
    "INPUT.LARGE_SCALE_JITTER.OUTPUT_SIZE": (1, INF),
    "INPUT.LARGE_SCALE_JITTER.SCALE_RANGE": (0.0, INF),
    "DATALOADER.NUM_WORKERS": (0, INF),
    "DATALOADER.MIN_KEYPOINTS_PER_IMAGE": (0, INF),
    "SOLVER.IMS_PER_BATCH": (1, INF),
    "TEST.IMS_PER_BATCH": (1, INF),
    "SOLVER.BASE_LR": (0.0, INF),
    "SOLVER.MOMENTUM": (0.0, 1.0),
    "SOLVER.WEIGHT_DECAY": (0.0, INF),
    "SOLVER.WEIGHT_DECAY_NORM": (0.0, INF),
    "SOLVER.MAX_ITER": (0, INF),
    "SOLVER.GAMMA": (0.0, INF),
    "SOLVER.WARMUP_FACTOR": (0.0, 1.0),
    "SOLVER.WARMUP_ITERS": (0, INF),
    "SOLVER.CHECKPOINT_PERIOD": (1, INF),
    "SOLVER.CLIP_GRADIENTS.CLIP_VALUE": (0.0, INF),
    "TEST.DETECTIONS_PER_IMAGE": (1, INF),
    "TEST.EVAL_PERIOD": (0, INF),
    "TEST.AUG.MIN_SIZES": (0, INF),
    "TEST.AUG.MAX_SIZE": (1, INF),
    "TEST.AUG.BOX_VOTING_IOU": (0.0, 1.0),
    "LOG_PERIOD": (1, INF),
}


def device_problem(value) -> "str | None":
    """Why ``value`` is not a device name torch knows ("cpu", "cuda", "cuda:1", ...), or None.
    (Whether that device exists here is checked when the model is built.)"""
    import torch

    try:
        torch.device(value)
    except (RuntimeError, TypeError, ValueError) as e:
        return f"must be a torch device such as 'cpu', 'cuda' or 'cuda:1' ({e})"
    return None


def _in_range(value, bounds) -> bool:
    if isinstance(value, (list, tuple)):
        return all(_in_range(v, bounds) for v in value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return True  # the type check of the merge reports wrong types
    return not math.isnan(value) and bounds[0] <= value <= bounds[1]


def find_problems(cfg):
    """``[(key, message)]`` for every value of ``cfg`` outside its set, range or kind."""
    problems = [(key, f"must be one of {list(allowed)}, got {value!r}") for key, allowed, value in find_violations(cfg)]
    for key, bounds in RANGES.items():
        value = _lookup(cfg, key)
        if value is not _MISSING and not _in_range(value, bounds):
            lo, hi = bounds
            hi = "inf" if hi == INF else hi
            problems.append((key, f"must lie in [{lo}, {hi}], got {value!r}"))
    device = _lookup(cfg, "MODEL.DEVICE")
    problem = None if device is _MISSING else device_problem(device)
    if problem:
        problems.append(("MODEL.DEVICE", f"{problem}, got {device!r}"))
    return problems


_MISSING = object()


def _lookup(cfg, key):
    node = cfg
    for part in key.split("."):
        if part not in node:
            return _MISSING
        node = node[part]
    return node


def _allowed(value, allowed) -> bool:
    if isinstance(value, (list, tuple)):  # a list-valued key: every element
        return all(_allowed(v, allowed) for v in value)
    return value in allowed and type(value) is not bool  # True == 1 must not pass for an int


def find_violations(cfg):
    """``[(key, allowed, value)]`` for the keys of `CHOICES` whose value in `cfg` is not allowed."""
    found = []
    for key, allowed in CHOICES.items():
        value = _lookup(cfg, key)
        if value is not _MISSING and not _allowed(value, allowed):
            found.append((key, allowed, value))
    return found
