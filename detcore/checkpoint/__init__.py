"""Loading the checkpoints people have: detcore's own; torchvision, detectron2, maskrcnn-benchmark
and Detectron (caffe2) detection models; and ImageNet ResNets (torchvision, caffe2 / MSRA, or
wrapped under a prefix). layouts.LAYOUTS lists them all.

`load_converted_state_dict(path, model)` reads a file safely, recognizes its format by content,
renames and reorders its tensors for `model`, and returns them with a `LoadReport` of every key.

The model zoo (catalog.py: published weights by name; model_zoo.py: names and URLs to files and
presets; download.py: the verified, cached download): `resolve_weights("torchvision/mask_rcnn_R_50_FPN")`
gives the file, `model_zoo.get_config(name)` its preset.
"""
from .io import read_checkpoint, safe_pickle_load
from .loader import PREDICTOR_PREFIXES, convert_state_dict, load_converted_state_dict
from .layouts import FORMATS, LAYOUTS, Layout, convert_keys, detect_format
from .mappings import ConvertedCheckpoint
from .report import LoadReport
from . import model_zoo
from .catalog import CATALOG, Checksum, ZooEntry
from .download import DownloadError
from .model_zoo import get_config, resolve_weights

__all__ = [
    "FORMATS",
    "LAYOUTS",
    "Layout",
    "PREDICTOR_PREFIXES",
    "CATALOG",
    "Checksum",
    "ConvertedCheckpoint",
    "DownloadError",
    "LoadReport",
    "convert_keys",
    "convert_state_dict",
    "detect_format",
    "get_config",
    "load_converted_state_dict",
    "model_zoo",
    "read_checkpoint",
    "resolve_weights",
    "safe_pickle_load",
    "ZooEntry",
]
