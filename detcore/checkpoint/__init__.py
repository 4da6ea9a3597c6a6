"""Loading the checkpoints people have: detcore's own; torchvision, detectron2, maskrcnn-benchmark
and Detectron (caffe2) detection models; and ImageNet ResNets (torchvision, caffe2 / MSRA, or
wrapped under a prefix). layouts.LAYOUTS lists them all.

`load_converted_state_dict(path, model)` reads a file safely, recognizes its format by content,
renames and reorders its tensors for `model`, and returns them with a `LoadReport` of every key.
"""
from .io import read_checkpoint, safe_pickle_load
from .loader import PREDICTOR_PREFIXES, convert_state_dict, load_converted_state_dict
from .layouts import FORMATS, LAYOUTS, Layout, convert_keys, detect_format
from .mappings import ConvertedCheckpoint
from .report import LoadReport

__all__ = [
    "FORMATS",
    "LAYOUTS",
    "Layout",
    "PREDICTOR_PREFIXES",
    "ConvertedCheckpoint",
    "LoadReport",
    "convert_keys",
    "convert_state_dict",
    "detect_format",
    "load_converted_state_dict",
    "read_checkpoint",
    "safe_pickle_load",
]
