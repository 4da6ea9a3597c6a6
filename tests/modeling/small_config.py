"""A config from configs/ shrunk into a fast test model: the same structure with narrow layers and
few proposals / ROIs, keeping every detection (random weights score everything low)."""
from pathlib import Path

from detcore.config import get_cfg

CONFIGS = Path(__file__).resolve().parents[2] / "configs"

SMALL_MODEL = {
    "MODEL.DEVICE": "cpu",
    "MODEL.FPN.OUT_CHANNELS": 32,
    "MODEL.ROI_BOX_HEAD.FC_DIM": 32,
    "MODEL.ROI_MASK_HEAD.CONV_DIM": 32,
    "MODEL.ROI_MASK_HEAD.NUM_CONV": 1,
    "MODEL.ROI_KEYPOINT_HEAD.CONV_DIMS": [32, 32],
    "MODEL.RPN.PRE_NMS_TOPK_TRAIN": 200,
    "MODEL.RPN.POST_NMS_TOPK_TRAIN": 50,
    "MODEL.RPN.PRE_NMS_TOPK_TEST": 200,
    "MODEL.RPN.POST_NMS_TOPK_TEST": 50,
    "MODEL.RPN.BATCH_SIZE_PER_IMAGE": 64,
    "MODEL.ROI_HEADS.BATCH_SIZE_PER_IMAGE": 32,
    "MODEL.ROI_HEADS.SCORE_THRESH_TEST": 0.0,
    "TEST.DETECTIONS_PER_IMAGE": 20,
}


def small_cfg(config="e2e_mask_rcnn_R_18_FPN_shapes.yaml", **overrides):
    """`configs/<config>` with SMALL_MODEL and then `overrides` (KEY=value, dots as in yaml) merged in."""
    cfg = get_cfg()
    cfg.merge_from_file(str(CONFIGS / config))
    settings = {**SMALL_MODEL, **overrides}
    cfg.merge_from_list([item for pair in settings.items() for item in pair])
    return cfg
