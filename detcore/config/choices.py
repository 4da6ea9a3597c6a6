"""The closed sets of values: one source for the code that checks an argument and for the config.

Each tuple is what the code accepts (the constructors and builders test their arguments against
it), and `CHOICES` maps the config keys that take one of them to it, so that a value outside
the set fails when it is merged into a config (naming the key and the allowed values), not
later inside `build_model`. The comment above each key in defaults.py lists the same values; a
test checks that they agree.
"""

# "" and None (yaml null) both mean no normalization.
NORMS = ("", "BN", "SyncBN", "FrozenBN", "GN", None)
RESNET_DEPTHS = (18, 34, 50, 101, 152)
RES5_DILATIONS = (1, 2)
FREEZE_AT_STAGES = (0, 1, 2, 3, 4, 5)
# A list-valued key: each of its elements must be one of these.
RESNET_OUT_FEATURES = ("stem", "res2", "res3", "res4", "res5")
FPN_FUSE_TYPES = ("sum", "avg")
# "none" is a spelling of "" (no extra level).
FPN_TOP_BLOCKS = ("maxpool", "p6p7", "", "none")
BOX_REG_LOSS_TYPES = ("smooth_l1", "l1", "giou")
RPN_LOSS_NORMALIZERS = ("batch_size", "num_sampled")
LEVEL_MAPPERS = ("detectron2", "torchvision")
MASK_TARGET_MODES = ("aligned", "torchvision")
MASK_PASTE_MODES = ("aligned", "torchvision")
RESIZE_SAMPLING_STYLES = ("choice", "range")
IMAGE_FORMATS = ("BGR", "RGB")
MASK_FORMATS = ("polygon", "bitmask")
FLIP_DIRECTIONS = ("none", "horizontal", "vertical")
TRAIN_SAMPLERS = ("TrainingSampler",)
LR_SCHEDULERS = ("WarmupMultiStepLR", "WarmupCosineLR")
WARMUP_METHODS = ("linear", "constant")
CLIP_TYPES = ("norm", "value")
AMP_DTYPES = ("float16", "bfloat16")

CHOICES = {
    "MODEL.BACKBONE.FREEZE_AT": FREEZE_AT_STAGES,
    "MODEL.RESNETS.DEPTH": RESNET_DEPTHS,
    "MODEL.RESNETS.OUT_FEATURES": RESNET_OUT_FEATURES,
    "MODEL.RESNETS.NORM": NORMS,
    "MODEL.RESNETS.RES5_DILATION": RES5_DILATIONS,
    "MODEL.FPN.NORM": NORMS,
    "MODEL.FPN.FUSE_TYPE": FPN_FUSE_TYPES,
    "MODEL.FPN.TOP_BLOCK": FPN_TOP_BLOCKS,
    "MODEL.RPN.BBOX_REG_LOSS_TYPE": BOX_REG_LOSS_TYPES,
    "MODEL.RPN.LOSS_NORMALIZER": RPN_LOSS_NORMALIZERS,
    "MODEL.ROI_HEADS.LEVEL_MAPPER": LEVEL_MAPPERS,
    "MODEL.ROI_BOX_HEAD.NORM": NORMS,
    "MODEL.ROI_BOX_HEAD.BBOX_REG_LOSS_TYPE": BOX_REG_LOSS_TYPES,
    "MODEL.ROI_MASK_HEAD.NORM": NORMS,
    "MODEL.ROI_MASK_HEAD.TARGET_MODE": MASK_TARGET_MODES,
    "MODEL.ROI_MASK_HEAD.PASTE_MODE": MASK_PASTE_MODES,
    "INPUT.MIN_SIZE_TRAIN_SAMPLING": RESIZE_SAMPLING_STYLES,
    "INPUT.FORMAT": IMAGE_FORMATS,
    "INPUT.MASK_FORMAT": MASK_FORMATS,
    "INPUT.RANDOM_FLIP": FLIP_DIRECTIONS,
    "DATALOADER.SAMPLER_TRAIN": TRAIN_SAMPLERS,
    "SOLVER.LR_SCHEDULER_NAME": LR_SCHEDULERS,
    "SOLVER.WARMUP_METHOD": WARMUP_METHODS,
    "SOLVER.CLIP_GRADIENTS.CLIP_TYPE": CLIP_TYPES,
    "SOLVER.AMP.DTYPE": AMP_DTYPES,
}


def _allowed(value, allowed) -> bool:
    if isinstance(value, (list, tuple)):  # a list-valued key: every element
        return all(_allowed(v, allowed) for v in value)
    return value in allowed and type(value) is not bool  # True == 1 must not pass for an int


def find_violations(cfg):
    """``[(key, allowed, value)]`` for the keys of `CHOICES` whose value in `cfg` is not allowed."""
    found = []
    for key, allowed in CHOICES.items():
        node = cfg
        for part in key.split("."):
            if part not in node:
                break
            node = node[part]
        else:
            if not _allowed(node, allowed):
                found.append((key, allowed, node))
    return found
