"""RetinaNet's head (Lin et al., 2017): two towers of 3×3 convs shared by every FPN level, one
predicting K class logits per anchor, the other 4 box deltas per anchor.

Module names follow detectron2 (``cls_subnet.{i}``, ``bbox_subnet.{i}``, ``cls_score``,
``bbox_pred``; with a norm, each tower layer is conv, norm, ReLU at indices 3j, 3j+1, 3j+2,
without one conv, ReLU at 2j, 2j+1), so its RetinaNet checkpoints load by name.
"""
import math
from typing import List, Sequence, Tuple

import torch
from torch import nn

from detcore.config.choices import RETINANET_HEAD_NORMS
from detcore.layers import get_norm
from detcore.layers.shape_spec import ShapeSpec

from ..anchor_generator import build_anchor_generator

__all__ = ["RetinaNetHead"]


class RetinaNetHead(nn.Module):
    """Args:
        in_channels: channels of every input level (one set of weights serves them all).
        num_anchors: A, anchors per location (the same on every level).
        num_classes: K, foreground classes; each gets its own sigmoid (no background output).
        num_convs: 3×3 conv + ReLU layers per tower (4 in the paper).
        norm: "" / None, or "GN" (32 groups) after each tower conv, shared by all levels.
        prior_prob: the foreground probability every class starts at: the classification bias
            is ``-log((1 - p) / p)``, so that the ~100k background anchors do not swamp the
            first iterations' loss (the paper's 0.01).
    """

    def __init__(
        self,
        *,
        in_channels: int,
        num_anchors: int,
        num_classes: int,
        num_convs: int = 4,
        norm: str = "",
        prior_prob: float = 0.01,
    ):
        super().__init__()
        for name, value in (("in_channels", in_channels), ("num_anchors", num_anchors), ("num_classes", num_classes)):
            if int(value) < 1:
                raise ValueError(f"RetinaNetHead: {name} must be >= 1, got {value}")
        if num_convs < 0:
            raise ValueError(f"RetinaNetHead: num_convs must be >= 0, got {num_convs}")
        if norm not in RETINANET_HEAD_NORMS:
            raise ValueError(f"RetinaNetHead: norm must be one of {list(RETINANET_HEAD_NORMS)}, got {norm!r}")
        if not 0.0 < prior_prob < 1.0:
            raise ValueError(f"RetinaNetHead: prior_prob must lie in (0, 1), got {prior_prob}")
        self.in_channels = int(in_channels)
        self.num_anchors = int(num_anchors)
        self.num_classes = int(num_classes)
        towers = []
        for _ in range(2):
            layers = []
            for _ in range(num_convs):
                layers.append(nn.Conv2d(in_channels, in_channels, kernel_size=3, stride=1, padding=1))
                if norm:
                    layers.append(get_norm(norm, in_channels))
                layers.append(nn.ReLU(inplace=True))
            towers.append(nn.Sequential(*layers))
        self.cls_subnet, self.bbox_subnet = towers
        self.cls_score = nn.Conv2d(in_channels, num_anchors * num_classes, kernel_size=3, stride=1, padding=1)
        self.bbox_pred = nn.Conv2d(in_channels, num_anchors * 4, kernel_size=3, stride=1, padding=1)
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.normal_(module.weight, std=0.01)
                nn.init.zeros_(module.bias)
        nn.init.constant_(self.cls_score.bias, -math.log((1.0 - prior_prob) / prior_prob))

    @classmethod
    def from_config(cls, cfg, input_shapes: Sequence[ShapeSpec]):
        channels = {s.channels for s in input_shapes}
        if len(channels) != 1:
            raise ValueError(
                f"RetinaNetHead: every level of MODEL.RETINANET.IN_FEATURES needs the same channels, got {sorted(channels)}"
            )
        # The anchor generator is the authority on A; build one just to ask it.
        num_anchors = set(build_anchor_generator(cfg, input_shapes).num_cell_anchors)
        if len(num_anchors) != 1:
            raise ValueError(
                "RetinaNetHead: every level needs the same number of anchors per location, got "
                f"{sorted(num_anchors)}; check MODEL.ANCHOR_GENERATOR.SIZES / ASPECT_RATIOS"
            )
        r = cfg.MODEL.RETINANET
        return {
            "in_channels": channels.pop(),
            "num_anchors": num_anchors.pop(),
            "num_classes": r.NUM_CLASSES,
            "num_convs": r.NUM_CONVS,
            "norm": r.NORM,
            "prior_prob": r.PRIOR_PROB,
        }

    def forward(self, features: List[torch.Tensor]) -> Tuple[List[torch.Tensor], List[torch.Tensor]]:
        """Args:
            features: per level, ``[B, in_channels, Hi, Wi]``.

        Returns:
            per level, class logits ``[B, A * K, Hi, Wi]`` (channel ``a * K + k``: anchor a,
            class k) and box deltas ``[B, A * 4, Hi, Wi]`` (channel ``a * 4 + j``).
        """
        logits, deltas = [], []
        for i, x in enumerate(features):
            if x.dim() != 4 or x.shape[1] != self.in_channels:
                raise ValueError(
                    f"RetinaNetHead: features[{i}] must be [B, {self.in_channels}, H, W], got {tuple(x.shape)}"
                )
            logits.append(self.cls_score(self.cls_subnet(x)))
            deltas.append(self.bbox_pred(self.bbox_subnet(x)))
        return logits, deltas
