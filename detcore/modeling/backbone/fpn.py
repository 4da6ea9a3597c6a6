"""Feature Pyramid Network (Lin et al., 2017) on top of a bottom-up backbone.

Every selected backbone level gets a 1×1 lateral conv to `out_channels`; starting from the
coarsest, each level adds the nearest-neighbour upsampled level above it, and a 3×3 output conv
smooths the sum. Levels are named p{k} for stride 2**k (res2 → p2 at stride 4, ...). A top
block adds coarser levels: P6 by subsampling P5 (Mask R-CNN's RPN) or P6/P7 by strided convs
(RetinaNet: from C5 in the paper and detectron2, from P5 in torchvision's retinanet_resnet50_fpn).

Module names follow detectron2 (`fpn_lateral{k}`, `fpn_output{k}`, each with a `.norm` when one
is used, `top_block.p6/.p7`, and the body under `bottom_up`), so its FPN checkpoints map onto
this one with only the ResNet renaming documented in resnet.py.
"""
import math

import torch.nn.functional as F
from torch import nn

from detcore.layers.batch_norm import get_norm
from detcore.layers.conv import Conv2d, c2_xavier_fill

from detcore.config.choices import FPN_FUSE_TYPES, FPN_TOP_BLOCKS
from detcore.utils.registry import build_from_config

from .backbone import Backbone
from .build import BACKBONE_REGISTRY
from .resnet import ResNet

__all__ = [
    "FPN",
    "FPN_FUSE_TYPES",
    "FPN_TOP_BLOCKS",
    "LastLevelMaxPool",
    "LastLevelP6P7",
    "RetinaNetFPN",
    "build_top_block",
]


class LastLevelMaxPool(nn.Module):
    """P6 = P5 subsampled by 2 (max pool with a 1×1 window, as in Detectron and torchvision)."""

    num_levels = 1

    def __init__(self, in_feature="p5"):
        super().__init__()
        self.in_feature = in_feature

    def forward(self, x):
        return [F.max_pool2d(x, kernel_size=1, stride=2, padding=0)]


class LastLevelP6P7(nn.Module):
    """RetinaNet's extra levels: P6 = 3×3/2 conv of `in_feature` (C5 by default, or P5), P7 =
    3×3/2 conv of relu(P6)."""

    num_levels = 2

    def __init__(self, in_channels, out_channels, in_feature="res5"):
        super().__init__()
        self.in_channels = in_channels
        self.in_feature = in_feature
        self.p6 = nn.Conv2d(in_channels, out_channels, 3, stride=2, padding=1)
        self.p7 = nn.Conv2d(out_channels, out_channels, 3, stride=2, padding=1)
        for conv in (self.p6, self.p7):
            c2_xavier_fill(conv)

    def forward(self, x):
        p6 = self.p6(x)
        return [p6, self.p7(F.relu(p6))]


@BACKBONE_REGISTRY.register()
class FPN(Backbone):
    """FPN over `bottom_up` (a Backbone; from a config, the ResNet of MODEL.RESNETS).

    Args:
        bottom_up: backbone whose outputs include `in_features`.
        in_features: bottom-up feature names, finest first, strides doubling from one to the next.
        out_channels: channels of every pyramid level.
        norm: norm of the lateral and output convs ("" for none, then the convs have a bias).
        top_block: None, or a module with `num_levels`, `in_feature` (a bottom-up or pyramid
            feature name) and forward(x) → list of `num_levels` maps, each at twice the stride
            of the previous level.
        fuse_type: "sum" (lateral + upsampled) or "avg" (their mean).
    """

    def __init__(
        self, bottom_up, in_features, out_channels, *, norm="", top_block=None, fuse_type="sum"
    ):
        super().__init__()
        if not isinstance(bottom_up, Backbone):
            raise TypeError(f"FPN: bottom_up must be a Backbone, got {type(bottom_up).__name__}")
        if fuse_type not in FPN_FUSE_TYPES:
            raise ValueError(f"FPN: fuse_type must be one of {list(FPN_FUSE_TYPES)}, got {fuse_type!r}")
        in_features = list(in_features)
        input_shapes = bottom_up.output_shape()
        missing = [f for f in in_features if f not in input_shapes]
        if not in_features or missing:
            raise ValueError(
                f"FPN: in_features must be a non-empty list of the bottom-up outputs "
                f"{list(input_shapes)}, got {in_features}"
            )
        strides = [input_shapes[f].stride for f in in_features]
        for f, s in zip(in_features, strides):
            if s < 1 or 2 ** int(round(math.log2(s))) != s:
                raise ValueError(f"FPN: stride of '{f}' must be a power of 2, got {s}")
        if any(b != 2 * a for a, b in zip(strides, strides[1:])):
            raise ValueError(
                f"FPN: strides of in_features {in_features} must double from one to the next, "
                f"got {strides}"
            )

        self.bottom_up = bottom_up
        self.in_features = in_features
        self.fuse_type = fuse_type
        self._levels = [int(round(math.log2(s))) for s in strides]
        for f, level in zip(in_features, self._levels):
            # A conv followed by a norm needs no bias: the norm's shift replaces it.
            lateral = Conv2d(
                input_shapes[f].channels,
                out_channels,
                1,
                bias=not norm,
                norm=get_norm(norm, out_channels),
            )
            output = Conv2d(
                out_channels,
                out_channels,
                3,
                padding=1,
                bias=not norm,
                norm=get_norm(norm, out_channels),
            )
            c2_xavier_fill(lateral)
            c2_xavier_fill(output)
            self.add_module(f"fpn_lateral{level}", lateral)
            self.add_module(f"fpn_output{level}", output)

        self._out_features = [f"p{level}" for level in self._levels]
        self._out_feature_strides = {f"p{level}": 2**level for level in self._levels}
        self.top_block = top_block
        if top_block is not None:
            source = top_block.in_feature
            if source not in input_shapes and source not in self._out_features:
                raise ValueError(
                    f"FPN: top_block.in_feature '{source}' is neither a bottom-up output "
                    f"{list(input_shapes)} nor a pyramid level {self._out_features}"
                )
            if source in input_shapes:
                source_channels = input_shapes[source].channels
            else:
                source_channels = out_channels
            expected = getattr(top_block, "in_channels", source_channels)
            if expected != source_channels:
                raise ValueError(
                    f"FPN: top_block expects {expected} input channels but '{source}' has "
                    f"{source_channels}"
                )
            last = self._levels[-1]
            for k in range(1, top_block.num_levels + 1):
                self._out_features.append(f"p{last + k}")
                self._out_feature_strides[f"p{last + k}"] = 2 ** (last + k)
        self._out_feature_channels = {name: out_channels for name in self._out_features}
        self._size_divisibility = strides[-1]

    @classmethod
    def from_config(cls, cfg, input_shape, top_block=None):
        """``top_block``: the extra levels' name (see ``build_top_block``) when a subclass fixes
        it; None takes MODEL.FPN.TOP_BLOCK."""
        bottom_up = build_from_config(ResNet, cfg, input_shape)
        fpn = cfg.MODEL.FPN
        top_block = fpn.TOP_BLOCK if top_block is None else top_block
        return {
            "bottom_up": bottom_up,
            "in_features": fpn.IN_FEATURES,
            "out_channels": fpn.OUT_CHANNELS,
            "norm": fpn.NORM,
            "top_block": build_top_block(top_block, bottom_up.output_shape(), fpn.OUT_CHANNELS),
            "fuse_type": fpn.FUSE_TYPE,
        }

    @property
    def size_divisibility(self):
        return self._size_divisibility

    def forward(self, x):
        bottom_up_features = self.bottom_up(x)
        results = []
        prev = None
        for name, level in zip(reversed(self.in_features), reversed(self._levels)):
            lateral = getattr(self, f"fpn_lateral{level}")(bottom_up_features[name])
            if prev is None:
                prev = lateral
            else:
                # Upsample to the lateral's own size, not by exactly 2: inputs whose size is not
                # a multiple of the coarsest stride give odd-sized maps (e.g. 13 above 25).
                prev = lateral + F.interpolate(prev, size=lateral.shape[-2:], mode="nearest")
                if self.fuse_type == "avg":
                    prev = prev / 2
            results.insert(0, getattr(self, f"fpn_output{level}")(prev))
        if self.top_block is not None:
            source = self.top_block.in_feature
            if source in bottom_up_features:
                top_input = bottom_up_features[source]
            else:
                top_input = results[self._out_features.index(source)]
            results.extend(self.top_block(top_input))
        return dict(zip(self._out_features, results))


def build_top_block(name, bottom_up_shapes, out_channels):
    """The FPN's extra levels by name: "maxpool" (P6 from P5, Faster/Mask R-CNN), "p6p7" (P6/P7
    from C5, RetinaNet), "p6p7_from_p5" (P6/P7 from P5, torchvision's RetinaNet) or "" / "none"
    (no extra level)."""
    if name == "maxpool":
        return LastLevelMaxPool()
    if name == "p6p7":
        if "res5" not in bottom_up_shapes:
            raise ValueError("FPN top block 'p6p7' is computed from res5: add it to MODEL.RESNETS.OUT_FEATURES")
        return LastLevelP6P7(bottom_up_shapes["res5"].channels, out_channels, in_feature="res5")
    if name == "p6p7_from_p5":
        return LastLevelP6P7(out_channels, out_channels, in_feature="p5")
    if name in ("", "none"):
        return None
    raise ValueError(f"MODEL.FPN.TOP_BLOCK must be one of {list(FPN_TOP_BLOCKS)}, got {name!r}")


@BACKBONE_REGISTRY.register()
class RetinaNetFPN(FPN):
    """ResNet + FPN with RetinaNet's P6/P7 from C5, whatever MODEL.FPN.TOP_BLOCK says."""

    @classmethod
    def from_config(cls, cfg, input_shape):
        return super().from_config(cfg, input_shape, top_block="p6p7")


# detectron2's names for the same backbones, so its configs select them unchanged.
BACKBONE_REGISTRY.register_alias("build_resnet_fpn_backbone", "FPN")
BACKBONE_REGISTRY.register_alias("build_retinanet_resnet_fpn_backbone", "RetinaNetFPN")
