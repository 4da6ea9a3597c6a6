"""Generated checkpoint files in the layouts of the catalog's publishers, and the catalog entries
that serve them: the real entries with their checksum replaced by the generated file's (a
generated file cannot have the publisher's digest), for the download tests."""
import hashlib
import io
import pickle
from dataclasses import replace

import numpy as np
import torch

from detcore.checkpoint.catalog import CATALOG, Checksum

from .zoo_names import (
    detectron2_imagenet_resnet50_shapes,
    detectron2_mask_rcnn_r50_fpn_shapes,
    torchvision_maskrcnn_v1_shapes,
)

TORCHVISION = "torchvision/mask_rcnn_R_50_FPN"
DETECTRON2 = "detectron2/COCO-InstanceSegmentation/mask_rcnn_R_50_FPN_3x"
MSRA = "detectron2/ImageNetPretrained/MSRA/R-50"
# Format detection and the download checks read names, not shapes: one number per tensor keeps
# the files small (each tensor holds its index, so two files of one layout differ by seed).


def torchvision_pth(seed=0) -> bytes:
    """A torchvision maskrcnn_resnet50_fpn state dict, saved as its .pth is."""
    state = {k: torch.full((1,), float(i + seed)) for i, k in enumerate(torchvision_maskrcnn_v1_shapes())}
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def detectron2_pkl(seed=0) -> bytes:
    """A detectron2 model zoo model_final_*.pkl: {"model": numpy arrays, "__author__": ...}."""
    arrays = {k: np.full((1,), i + seed, np.float32) for i, k in enumerate(detectron2_mask_rcnn_r50_fpn_shapes())}
    return pickle.dumps({"model": arrays, "__author__": "Detectron2 Model Zoo"})


def msra_pkl(seed=0) -> bytes:
    """detectron2's ImageNetPretrained/MSRA/R-50.pkl: caffe2 blob names, BatchNorm unfused."""
    arrays = {k: np.full((1,), i + seed, np.float32) for i, k in enumerate(detectron2_imagenet_resnet50_shapes())}
    return pickle.dumps(arrays, protocol=2)


GENERATORS = {TORCHVISION: torchvision_pth, DETECTRON2: detectron2_pkl, MSRA: msra_pkl}


def url_path(name: str) -> str:
    """The path of an entry's URL (what a mirror serves)."""
    url = CATALOG[name].url
    return "/" + url.split("://", 1)[1].split("/", 1)[1]


def entry_for(name: str, data: bytes):
    """The catalog entry ``name`` checked against ``data`` instead of the publisher's file: its
    checksum (same algorithm as the publisher's) becomes the generated file's; an entry the
    publisher gives no checksum keeps none (its layout is checked)."""
    entry = CATALOG[name]
    if entry.checksum is None:
        return entry
    algorithm = entry.checksum.algorithm
    digest = hashlib.new(algorithm, data).hexdigest()
    return replace(entry, checksum=Checksum(algorithm, digest[: len(entry.checksum.prefix)]))
