"""What config values may be: one source for the code that checks an argument and for the config.

Each tuple is what the code accepts (the constructors and builders test their arguments against
it), and `CHOICES` maps the config keys that take one of them to it, so that a value outside
the set fails when it is merged into a config (naming the key and the allowed values), not
later inside `build_model`. The comment above each key in defaults.py lists the same values; a
test checks that they agree. The same merge check covers:

- numbers: NaN is never a config value, nor is infinity except where `INFINITY_ALLOWED` says
  (a p-norm); `RANGES` gives the interval of numbers that must lie in one (an IoU threshold of
  5.0 would silently suppress nothing), for a list-valued key each of its numbers;
- lists: `LIST_SHAPES` says what the elements of every list-valued key are (a nested list among
  dataset names once failed as "unhashable type: 'list'"), its length where it has one, and
  whether it must increase (LR steps);
- `MODEL.DEVICE` must be a device detcore's ops run on ("cpu", "cuda", "cuda:N").

`number_problem` is the one rule for a number against an interval, used by the command-line
options too (detcore.utils.argtypes).
"""
import math
from typing import NamedTuple, Optional

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


INF = float("inf")


class Interval(NamedTuple):
    """Numbers from ``lo`` to ``hi``, both included unless ``lo_open`` (then ``lo`` is not);
    ``hi`` INF means no upper bound."""

    lo: float
    hi: float = INF
    lo_open: bool = False

    def __str__(self) -> str:
        hi = "inf)" if self.hi == INF else f"{self.hi}]"
        return f"{'(' if self.lo_open else '['}{self.lo}, {hi}"


POSITIVE = Interval(0.0, INF, lo_open=True)


def number_problem(value, bounds=None, allow_inf: bool = False) -> Optional[str]:
    """Why the number ``value`` is not allowed (NaN; infinite unless ``allow_inf``; an integer
    beyond 64 bits; outside ``bounds``, an `Interval` or a ``(lo, hi)`` pair), or None."""
    bounds = Interval(*bounds) if bounds is not None else None
    if isinstance(value, int) and not -(2**63) <= value < 2**63:
        # torch and the compiled ops take 64-bit integers (and floats cannot hold more).
        return f"must be a 64-bit integer, got one of {len(str(abs(value)))} digits"
    if isinstance(value, float) and (math.isnan(value) or (math.isinf(value) and not allow_inf)):
        return f"must be a finite number{f' in {bounds}' if bounds else ''}, got {value!r}"
    if bounds is None:
        return None
    low_ok = value > bounds.lo if bounds.lo_open else value >= bounds.lo
    if not (low_ok and value <= bounds.hi):
        return f"must lie in {bounds}, got {value!r}"
    return None


# Keys whose numbers may be infinite (never NaN).
INFINITY_ALLOWED = ("SOLVER.CLIP_GRADIENTS.NORM_TYPE",)

# key -> Interval, or (lowest, highest) both included; for a list-valued key, each number in it.
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
    "SOLVER.DIVERGENCE.MAX_LOSS_GROWTH": (0.0, INF),
    "SOLVER.DIVERGENCE.MAX_WEIGHT_GROWTH": (0.0, INF),
    "SOLVER.CLIP_GRADIENTS.CLIP_VALUE": (0.0, INF),
    "TEST.DETECTIONS_PER_IMAGE": (1, INF),
    "TEST.EVAL_PERIOD": (0, INF),
    "TEST.AUG.MIN_SIZES": (0, INF),
    "TEST.AUG.MAX_SIZE": (1, INF),
    "TEST.AUG.BOX_VOTING_IOU": (0.0, 1.0),
    "LOG_PERIOD": (1, INF),
    "MODEL.PIXEL_STD": POSITIVE,
    "MODEL.RESNETS.NUM_GROUPS": (1, INF),
    "MODEL.RESNETS.WIDTH_PER_GROUP": (1, INF),
    "MODEL.RESNETS.STEM_OUT_CHANNELS": (1, INF),
    "MODEL.RESNETS.RES2_OUT_CHANNELS": (1, INF),
    "MODEL.FPN.OUT_CHANNELS": (1, INF),
    "MODEL.ANCHOR_GENERATOR.SIZES": POSITIVE,
    "MODEL.ANCHOR_GENERATOR.ASPECT_RATIOS": POSITIVE,
    "MODEL.RPN.BBOX_REG_WEIGHTS": POSITIVE,
    "MODEL.RPN.LOSS_WEIGHT": (0.0, INF),
    "MODEL.ROI_HEADS.CANONICAL_BOX_SIZE": POSITIVE,
    "MODEL.ROI_BOX_HEAD.NUM_CONV": (0, INF),
    "MODEL.ROI_BOX_HEAD.CONV_DIM": (1, INF),
    "MODEL.ROI_BOX_HEAD.NUM_FC": (0, INF),
    "MODEL.ROI_BOX_HEAD.FC_DIM": (1, INF),
    "MODEL.ROI_BOX_HEAD.BBOX_REG_WEIGHTS": POSITIVE,
    "MODEL.ROI_MASK_HEAD.NUM_CONV": (0, INF),
    "MODEL.ROI_MASK_HEAD.CONV_DIM": (1, INF),
    "MODEL.RETINANET.BBOX_REG_WEIGHTS": POSITIVE,
    "INPUT.MIN_SIZE_TRAIN": (0, INF),
    "INPUT.MAX_SIZE_TRAIN": (1, INF),
    "INPUT.MIN_SIZE_TEST": (0, INF),
    "INPUT.MAX_SIZE_TEST": (1, INF),
    "SOLVER.BIAS_LR_FACTOR": (0.0, INF),
    "SOLVER.STEPS": (1, INF),
    "SOLVER.CLIP_GRADIENTS.NORM_TYPE": POSITIVE,
}


class ListShape(NamedTuple):
    """What a list-valued key holds: elements of ``kind`` ("str", "number", "bool", or
    "number or numbers": numbers, or lists of numbers as the anchor sizes of several levels),
    exactly ``length`` of them when given, strictly increasing when ``increasing``."""

    kind: str
    length: Optional[int] = None
    increasing: bool = False


NAMES = ListShape("str")
NUMBERS = ListShape("number")
LIST_SHAPES = {
    "MODEL.PIXEL_MEAN": NUMBERS,
    "MODEL.PIXEL_STD": NUMBERS,
    "MODEL.RESNETS.OUT_FEATURES": NAMES,
    "MODEL.RESNETS.DEFORM_ON_PER_STAGE": ListShape("bool", 4),
    "MODEL.FPN.IN_FEATURES": NAMES,
    "MODEL.ANCHOR_GENERATOR.SIZES": ListShape("number or numbers"),
    "MODEL.ANCHOR_GENERATOR.ASPECT_RATIOS": ListShape("number or numbers"),
    "MODEL.RPN.IN_FEATURES": NAMES,
    "MODEL.RPN.IOU_THRESHOLDS": NUMBERS,
    "MODEL.RPN.IOU_LABELS": NUMBERS,
    "MODEL.RPN.BBOX_REG_WEIGHTS": ListShape("number", 4),
    "MODEL.ROI_HEADS.IN_FEATURES": NAMES,
    "MODEL.ROI_HEADS.IOU_THRESHOLDS": NUMBERS,
    "MODEL.ROI_HEADS.IOU_LABELS": NUMBERS,
    "MODEL.ROI_BOX_HEAD.BBOX_REG_WEIGHTS": ListShape("number", 4),
    "MODEL.ROI_KEYPOINT_HEAD.CONV_DIMS": NUMBERS,
    "MODEL.RETINANET.IN_FEATURES": NAMES,
    "MODEL.RETINANET.IOU_THRESHOLDS": NUMBERS,
    "MODEL.RETINANET.IOU_LABELS": NUMBERS,
    "MODEL.RETINANET.BBOX_REG_WEIGHTS": ListShape("number", 4),
    "INPUT.MIN_SIZE_TRAIN": NUMBERS,
    "INPUT.CROP.SIZE": ListShape("number", 2),
    "INPUT.LARGE_SCALE_JITTER.OUTPUT_SIZE": ListShape("number", 2),
    "INPUT.LARGE_SCALE_JITTER.SCALE_RANGE": ListShape("number", 2),
    "DATASETS.TRAIN": NAMES,
    "DATASETS.TEST": NAMES,
    "SOLVER.STEPS": ListShape("number", increasing=True),
    "TEST.AUG.MIN_SIZES": NUMBERS,
}


# The devices detcore's compiled ops have kernels for.
DEVICE_TYPES = ("cpu", "cuda")


def device_problem(value) -> "str | None":
    """Why ``value`` is not a device detcore runs on ("cpu", "cuda", "cuda:1", ...), or None.
    (Whether that device exists here is checked when the model is built.)"""
    import torch

    try:
        device = torch.device(value)
    except (RuntimeError, TypeError, ValueError) as e:
        return f"must be a torch device such as 'cpu', 'cuda' or 'cuda:1' ({e})"
    if device.type not in DEVICE_TYPES:
        return f"must be 'cpu' or 'cuda' (or 'cuda:N'): detcore's ops have no {device.type} kernels"
    return None


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _numbers(value):
    """The numbers in a value, lists flattened (other types are the type check's business)."""
    if isinstance(value, (list, tuple)):
        return [n for v in value for n in _numbers(v)]
    return [value] if _is_number(value) else []


_KINDS = {
    "str": lambda v: isinstance(v, str),
    "number": _is_number,
    "bool": lambda v: isinstance(v, bool),
    "number or numbers": lambda v: _is_number(v) or (isinstance(v, (list, tuple)) and all(_is_number(x) for x in v)),
}


def list_shape_problem(value, shape: ListShape) -> Optional[str]:
    """Why a list-valued key's ``value`` does not have ``shape``, or None."""
    if not isinstance(value, (list, tuple)):
        return None  # the type check of the merge reports it
    if not all(_KINDS[shape.kind](v) for v in value):
        kind = {"str": "strings", "number": "numbers", "bool": "bools"}.get(shape.kind, "numbers or lists of numbers")
        return f"must be a list of {kind}, got {value!r}"
    if shape.length is not None and len(value) != shape.length:
        return f"must hold {shape.length} values, got {len(value)}: {value!r}"
    if shape.increasing and any(a >= b for a, b in zip(value[:-1], value[1:])):
        return f"must be strictly increasing, got {value!r}"
    return None


def _leaves(node, prefix=""):
    for k, v in node.items():
        if isinstance(v, dict):
            yield from _leaves(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}", v


def find_problems(cfg):
    """``[(key, message)]`` for every value of ``cfg`` outside its set, range, shape or kind."""
    problems = [(key, f"must be one of {list(allowed)}, got {value!r}") for key, allowed, value in find_violations(cfg)]
    misshapen = set()
    for key, shape in LIST_SHAPES.items():
        value = _lookup(cfg, key)
        problem = None if value is _MISSING else list_shape_problem(value, shape)
        if problem:
            problems.append((key, problem))
            misshapen.add(key)
    for key, value in _leaves(cfg):
        if key in misshapen:
            continue
        for number in _numbers(value):
            problem = number_problem(number, RANGES.get(key), allow_inf=key in INFINITY_ALLOWED)
            if problem:
                problems.append((key, problem))
                break
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
