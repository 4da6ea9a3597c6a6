"""Box heads: turn each pooled ROI feature grid into one feature vector for the box predictor."""
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from detcore.layers import Conv2d, ShapeSpec, c2_msra_fill, c2_xavier_fill, get_norm
from detcore.utils.registry import Registry

__all__ = ["ROI_BOX_HEAD_REGISTRY", "FastRCNNConvFCHead", "build_box_head"]

# Box heads: `from_config(cfg, input_shape)` returns the constructor arguments (the one rule of
# detcore.utils.registry). They take the pooled [R, C, S, S] features and expose `output_shape` (a
# ShapeSpec) for the predictor.
ROI_BOX_HEAD_REGISTRY = Registry("ROI_BOX_HEAD", "MODEL.ROI_BOX_HEAD.NAME")


@ROI_BOX_HEAD_REGISTRY.register()
class FastRCNNConvFCHead(nn.Sequential):
    """`len(conv_dims)` 3×3 convs (+norm, ReLU), then `len(fc_dims)` fully connected layers
    (ReLU). With no conv and two 1024-wide FCs it is the "2fc" head of FPN Faster R-CNN.

    Args:
        input_shape: channels, height and width of the pooled features.
        conv_dims: output channels of each conv.
        fc_dims: output size of each FC layer.
        conv_norm: normalization of the convs ("" for none, "BN", "GN", ...; see `get_norm`).
    """

    def __init__(self, input_shape: ShapeSpec, *, conv_dims: Sequence[int], fc_dims: Sequence[int], conv_norm=""):
        super().__init__()
        if len(conv_dims) + len(fc_dims) == 0:
            raise ValueError("FastRCNNConvFCHead: needs at least one conv or FC layer (conv_dims and fc_dims are empty)")
        if input_shape.channels is None:
            raise ValueError(f"FastRCNNConvFCHead: input_shape must give channels, got {input_shape}")
        channels, height, width = input_shape.channels, input_shape.height, input_shape.width
        if fc_dims and (height is None or width is None):
            raise ValueError(f"FastRCNNConvFCHead: FC layers need the pooled height and width, got {input_shape}")

        self.conv_norm_relus = []
        for k, dim in enumerate(conv_dims):
            conv = Conv2d(
                channels,
                dim,
                kernel_size=3,
                padding=1,
                bias=not conv_norm,  # a norm layer brings its own shift
                norm=get_norm(conv_norm, dim),
                activation=F.relu_,  # in place: the conv (or norm) output is not needed again
            )
            c2_msra_fill(conv)
            self.add_module(f"conv{k + 1}", conv)
            self.conv_norm_relus.append(conv)
            channels = dim

        self.fcs = []
        if fc_dims:
            self.add_module("flatten", nn.Flatten())
            in_dim = channels * height * width
            for k, dim in enumerate(fc_dims):
                fc = nn.Linear(in_dim, dim)
                c2_xavier_fill(fc)
                self.add_module(f"fc{k + 1}", fc)
                self.add_module(f"fc_relu{k + 1}", nn.ReLU(inplace=True))
                self.fcs.append(fc)
                in_dim = dim
            self._output_size = in_dim
        else:
            self._output_size = (channels, height, width)

    @classmethod
    def from_config(cls, cfg, input_shape: ShapeSpec):
        head = cfg.MODEL.ROI_BOX_HEAD
        return {
            "input_shape": input_shape,
            "conv_dims": [head.CONV_DIM] * head.NUM_CONV,
            "fc_dims": [head.FC_DIM] * head.NUM_FC,
            "conv_norm": head.NORM,
        }

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4:
            raise ValueError(f"FastRCNNConvFCHead: expected pooled features [R, C, S, S], got {tuple(x.shape)}")
        return super().forward(x)

    @property
    def output_shape(self) -> ShapeSpec:
        """A ShapeSpec of the output: channels only for a vector, (C, H, W) after convs alone."""
        if isinstance(self._output_size, int):
            return ShapeSpec(channels=self._output_size)
        c, h, w = self._output_size
        return ShapeSpec(channels=c, height=h, width=w)


def build_box_head(cfg, input_shape: ShapeSpec) -> nn.Module:
    """Build the box head named by cfg.MODEL.ROI_BOX_HEAD.NAME for pooled features of `input_shape`."""
    return ROI_BOX_HEAD_REGISTRY.build(cfg, input_shape)
