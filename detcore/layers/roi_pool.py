"""ROIPool (Fast R-CNN's max pooling of quantized bins), drop-in for torchvision.ops.roi_pool /
RoIPool, forward and backward.

Written so that TorchScript can compile it (torch.jit.script), like torchvision's.
"""
from typing import List, Union

import torch
from torch import Tensor, nn
from torch.jit.annotations import BroadcastingList2
from torch.nn.modules.utils import _pair

from ._extension import ensure_loaded
from .roi_align import rois_and_output_size


def roi_pool(
    input: Tensor,
    boxes: Union[Tensor, List[Tensor]],
    output_size: BroadcastingList2[int],
    spatial_scale: float = 1.0,
) -> Tensor:
    """Max-pools each box of `boxes` from `input` into an `output_size` grid of bins.

    The box corners, scaled by `spatial_scale`, are rounded to whole pixels; the box is split
    into bins of whole pixels (floor of each bin's start, ceil of its end, clipped to the map),
    and each bin gives the largest value in it (0 for a bin outside the map). The gradient of a
    bin goes to the pixel that held its maximum (the first one, row by row, among equal values).

    Args:
        input: Tensor[N, C, H, W] feature maps.
        boxes: Tensor[K, 5] of (batch_index, x1, y1, x2, y2), or a list of N Tensor[L_i, 4].
            Coordinates are in the image frame; `spatial_scale` maps them onto `input`.
        output_size: int or (height, width) of the pooled output.
        spatial_scale: feature-map size / image size (e.g. 1/16 for stride 16).

    Returns:
        Tensor[K, C, output_height, output_width].
    """
    if not torch.jit.is_scripting():  # TorchScript cannot read the loader's state
        ensure_loaded()
    rois, size = rois_and_output_size(boxes, _pair(output_size), "roi_pool")
    output, _ = torch.ops.detcore.roi_pool(input, rois, float(spatial_scale), size[0], size[1])
    return output


# A leaf for torch.fx symbolic tracing, as roi_align (and torchvision's roi_pool) are.
torch.fx.wrap("roi_pool")


class ROIPool(nn.Module):
    """nn.Module form of `roi_pool` with fixed arguments (``output_size`` kept as given, and the
    repr in torchvision's form)."""

    def __init__(self, output_size: BroadcastingList2[int], spatial_scale: float):
        super().__init__()
        self.output_size = output_size
        self.spatial_scale = float(spatial_scale)

    def forward(self, input: Tensor, rois: Union[Tensor, List[Tensor]]) -> Tensor:
        return roi_pool(input, rois, self.output_size, self.spatial_scale)

    def extra_repr(self) -> str:
        return f"output_size={self.output_size}, spatial_scale={self.spatial_scale}"


class RoIPool(ROIPool):
    """torchvision's spelling of ``ROIPool``, so that swapping ``torchvision.ops`` for
    ``detcore.layers`` needs no renaming."""
