"""Configuration: `get_cfg()` gives the defaults, yaml files and KEY VALUE lists change them.

    from detcore.config import get_cfg
    cfg = get_cfg()
    cfg.merge_from_file("configs/e2e_mask_rcnn_R_50_FPN_1x.yaml")  # follows _BASE_
    cfg.merge_from_list(["MODEL.RPN.NMS_THRESH", "0.6"])
    cfg.freeze()

A config file may also be named relative to the presets' folder, from a clone or a wheel:
``cfg.merge_from_file("torchvision/mask_rcnn_R_50_FPN.yaml")`` (presets.py).
"""
from .config import BASE_KEY, CfgNode, ConfigError, ConfigTypeError, UnknownKeyError
from .defaults import get_cfg
from .presets import list_presets, resolve_config_file

__all__ = [
    "BASE_KEY",
    "CfgNode",
    "ConfigError",
    "ConfigTypeError",
    "UnknownKeyError",
    "get_cfg",
    "list_presets",
    "resolve_config_file",
]
