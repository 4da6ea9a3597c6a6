"""A tiny stand-in detector and tiny datasets for the engine and tools tests.

The engine does not care what the model is, only that it returns a dict of losses in training
and ``[{"instances": ...}]`` in eval. ``ToyDetector`` does that in milliseconds (a conv, a
GroupNorm, two linear heads), so trainer mechanics (checkpoints, resume, NaN stop, DDP) can be
tested without paying for a Mask R-CNN forward pass. Importing this module registers it as
MODEL.META_ARCHITECTURE "ToyDetector" and registers the tiny shapes splits.
"""
import os

import torch
import torch.nn.functional as F
from torch import nn

from detcore.data import DatasetCatalog, register_shapes
from detcore.data.datasets import ShapesSpec
from detcore.modeling import META_ARCH_REGISTRY
from detcore.structures import Boxes, Instances

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
R18_CONFIG = os.path.join(REPO, "configs", "e2e_mask_rcnn_R_18_FPN_shapes.yaml")
TINY_TRAIN, TINY_VAL = "tiny_shapes_train", "tiny_shapes_val"

# Overrides that make the R-18 shapes config a toy-sized run: tiny datasets, small images,
# few proposals and ROIs, narrow heads, main-process loading.
TINY_DATA = [
    "DATASETS.TRAIN", f"('{TINY_TRAIN}',)", "DATASETS.TEST", f"('{TINY_VAL}',)",
    "DATALOADER.NUM_WORKERS", "0", "SOLVER.IMS_PER_BATCH", "2", "SEED", "7",
    "INPUT.MIN_SIZE_TRAIN", "(64,)", "INPUT.MAX_SIZE_TRAIN", "96",
    "INPUT.MIN_SIZE_TEST", "64", "INPUT.MAX_SIZE_TEST", "96",
]
TINY_RCNN = TINY_DATA + [
    "MODEL.RPN.PRE_NMS_TOPK_TRAIN", "200", "MODEL.RPN.POST_NMS_TOPK_TRAIN", "50",
    "MODEL.RPN.PRE_NMS_TOPK_TEST", "100", "MODEL.RPN.POST_NMS_TOPK_TEST", "30",
    "MODEL.ROI_HEADS.BATCH_SIZE_PER_IMAGE", "32", "MODEL.FPN.OUT_CHANNELS", "32",
    "MODEL.ROI_BOX_HEAD.FC_DIM", "64", "MODEL.ROI_MASK_HEAD.CONV_DIM", "32", "MODEL.ROI_MASK_HEAD.NUM_CONV", "1",
    "TEST.DETECTIONS_PER_IMAGE", "20",
]
TOY = TINY_DATA + ["MODEL.META_ARCHITECTURE", "ToyDetector", "MODEL.MASK_ON", "False"]


def register_tiny_datasets(cache_dir=None):
    """Register the tiny splits (8 training and 6 validation images of 64-96 px); idempotent."""
    cache_dir = cache_dir or os.environ.get("DETCORE_CACHE")
    for name, spec in (
        (TINY_TRAIN, ShapesSpec(split="train", num_images=8, seed=11, min_size=64, max_size=96, max_shapes=3)),
        (TINY_VAL, ShapesSpec(split="val", num_images=6, seed=12, min_size=64, max_size=96, max_shapes=3)),
    ):
        if name not in DatasetCatalog:
            register_shapes(name, spec, cache_dir=cache_dir)


class ToyDetector(nn.Module):
    """Predicts one box and class per image from a 16x16 thumbnail; trains on the first object,
    with dropout on its features (torch's RNG: the trainer's random streams matter to the toy as
    the sampling of anchors and proposals does to the real detectors)."""

    def __init__(self, num_classes, pixel_mean, pixel_std):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.norm = nn.GroupNorm(2, 8)
        self.cls = nn.Linear(8, num_classes)
        self.box = nn.Linear(8, 4)
        self.register_buffer("pixel_mean", torch.tensor(pixel_mean).view(-1, 1, 1), False)
        self.register_buffer("pixel_std", torch.tensor(pixel_std).view(-1, 1, 1), False)

    @classmethod
    def from_config(cls, cfg):
        return {
            "num_classes": cfg.MODEL.ROI_HEADS.NUM_CLASSES,
            "pixel_mean": cfg.MODEL.PIXEL_MEAN,
            "pixel_std": cfg.MODEL.PIXEL_STD,
        }

    def features(self, batched_inputs):
        images = [(x["image"].float() - self.pixel_mean) / self.pixel_std for x in batched_inputs]
        x = torch.stack([F.interpolate(im[None], size=(16, 16), mode="bilinear", align_corners=False)[0] for im in images])
        return F.relu(self.norm(self.conv(x))).mean(dim=(2, 3))

    def forward(self, batched_inputs):
        feats = self.features(batched_inputs)
        if self.training:
            feats = F.dropout(feats, 0.25)
            targets = [x["instances"] for x in batched_inputs]
            classes = torch.stack([t.gt_classes[0] for t in targets])
            boxes = torch.stack([
                t.gt_boxes.tensor[0] / torch.tensor([t.image_size[1], t.image_size[0]] * 2) for t in targets
            ])
            return {
                "loss_cls": F.cross_entropy(self.cls(feats), classes),
                "loss_box_reg": F.smooth_l1_loss(torch.sigmoid(self.box(feats)), boxes),
            }
        results = []
        for x, f in zip(batched_inputs, feats):
            h, w = x["height"], x["width"]
            xyxy = torch.sigmoid(self.box(f)) * torch.tensor([w, h, w, h], dtype=torch.float32)
            x1, x2 = torch.minimum(xyxy[0], xyxy[2]), torch.maximum(xyxy[0], xyxy[2]) + 1
            y1, y2 = torch.minimum(xyxy[1], xyxy[3]), torch.maximum(xyxy[1], xyxy[3]) + 1
            prob = F.softmax(self.cls(f), dim=0)
            results.append({"instances": Instances(
                (h, w),
                pred_boxes=Boxes(torch.stack([x1, y1, x2, y2])[None]),
                scores=prob.max()[None],
                pred_classes=prob.argmax()[None],
            )})
        return results


if "ToyDetector" not in META_ARCH_REGISTRY:
    META_ARCH_REGISTRY.register(ToyDetector)


def make_cfg(output_dir, opts=(), config_file=R18_CONFIG):
    """The R-18 shapes config with ``opts`` and OUTPUT_DIR applied (not frozen)."""
    from detcore.config import get_cfg

    cfg = get_cfg()
    cfg.merge_from_file(config_file)
    cfg.merge_from_list(list(opts) + ["OUTPUT_DIR", str(output_dir)])
    return cfg


def subprocess_env(cache_dir):
    """Environment for tool subprocesses: the tests' data cache, one thread per process (the
    machine is small and shared), the repository importable."""
    env = dict(os.environ)
    env.update(DETCORE_CACHE=str(cache_dir), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONPATH=REPO)
    return env


_SESSION_CACHE = []


def session_cache(tmp_path_factory):
    """One data cache per test session (shared by the engine and tools tests), holding the tiny
    splits, generated once; $DETCORE_CACHE points at it so subprocesses find it."""
    if not _SESSION_CACHE:
        cache = str(tmp_path_factory.mktemp("detcore_cache"))
        os.environ["DETCORE_CACHE"] = cache
        register_tiny_datasets(cache)
        DatasetCatalog.get(TINY_TRAIN), DatasetCatalog.get(TINY_VAL)  # generate now, not in a subprocess race
        _SESSION_CACHE.append(cache)
    return _SESSION_CACHE[0]
