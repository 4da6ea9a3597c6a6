"""RPN heads: per feature level, an objectness logit and 4 box deltas for every anchor."""
from typing import List, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from detcore.layers.shape_spec import ShapeSpec
from detcore.utils.registry import Registry

from ..anchor_generator import build_anchor_generator

__all__ = ["RPN_HEAD_REGISTRY", "StandardRPNHead", "build_rpn_head"]

# RPN heads: `from_config(cfg, input_shapes)` gets one ShapeSpec per RPN input level.
RPN_HEAD_REGISTRY = Registry("RPN_HEAD", "MODEL.RPN.HEAD_NAME")


@RPN_HEAD_REGISTRY.register()
class StandardRPNHead(nn.Module):
    """Faster R-CNN's head, shared by all levels: a 3×3 conv + ReLU, then two sibling 1×1 convs
    giving A objectness logits and A * box_dim deltas per location.

    Args:
        in_channels: channels of every input feature map (all levels must agree, since the
            weights are shared).
        num_anchors: A, the anchors per location (the same on every level).
        box_dim: numbers per box delta (4).
    """

    def __init__(self, in_channels: int, num_anchors: int, box_dim: int = 4):
        super().__init__()
        if in_channels <= 0 or num_anchors <= 0 or box_dim <= 0:
            raise ValueError(
                f"StandardRPNHead: in_channels ({in_channels}), num_anchors ({num_anchors}) and "
                f"box_dim ({box_dim}) must be positive"
            )
        self.in_channels = in_channels
        self.num_anchors = num_anchors
        self.box_dim = box_dim
        self.conv = nn.Conv2d(in_channels, in_channels, kernel_size=3, stride=1, padding=1)
        self.objectness_logits = nn.Conv2d(in_channels, num_anchors, kernel_size=1)
        self.anchor_deltas = nn.Conv2d(in_channels, num_anchors * box_dim, kernel_size=1)
        for layer in (self.conv, self.objectness_logits, self.anchor_deltas):
            nn.init.normal_(layer.weight, std=0.01)
            nn.init.constant_(layer.bias, 0.0)

    @classmethod
    def from_config(cls, cfg, input_shapes: Sequence[ShapeSpec]):
        channels = {s.channels for s in input_shapes}
        if len(channels) != 1:
            raise ValueError(f"StandardRPNHead: every RPN input level needs the same channels, got {sorted(channels)}")
        # The anchor generator is the authority on A; build one just to ask it.
        num_anchors = set(build_anchor_generator(cfg, input_shapes).num_cell_anchors)
        if len(num_anchors) != 1:
            raise ValueError(
                "StandardRPNHead: every level needs the same number of anchors per location, got "
                f"{sorted(num_anchors)}; check MODEL.ANCHOR_GENERATOR.SIZES / ASPECT_RATIOS"
            )
        return {"in_channels": channels.pop(), "num_anchors": num_anchors.pop()}

    def forward(self, features: List[torch.Tensor]) -> Tuple[List[torch.Tensor], List[torch.Tensor]]:
        """Args:
            features: per level, ``[B, in_channels, Hi, Wi]``.

        Returns:
            objectness logits per level ``[B, A, Hi, Wi]``, and deltas per level
            ``[B, A * box_dim, Hi, Wi]`` (channel ``a * box_dim + j`` is delta j of anchor a).
        """
        logits, deltas = [], []
        for i, x in enumerate(features):
            if x.dim() != 4 or x.shape[1] != self.in_channels:
                raise ValueError(
                    f"StandardRPNHead: features[{i}] must be [B, {self.in_channels}, H, W], got {tuple(x.shape)}"
                )
            t = F.relu_(self.conv(x))
            logits.append(self.objectness_logits(t))
            deltas.append(self.anchor_deltas(t))
        return logits, deltas


def build_rpn_head(cfg, input_shapes: Sequence[ShapeSpec]) -> nn.Module:
    """Build the head named by cfg.MODEL.RPN.HEAD_NAME for the RPN's input levels."""
    return RPN_HEAD_REGISTRY.build(cfg, input_shapes)
