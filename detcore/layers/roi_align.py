"""ROIAlign, drop-in for torchvision.ops.roi_align / RoIAlign (forward and backward).

Written so that TorchScript can compile it (torch.jit.script), like torchvision's.
"""
from typing import List, Tuple, Union

import torch
from torch import Tensor, nn
from torch.jit.annotations import BroadcastingList2
from torch.nn.modules.utils import _pair

from ._extension import OpArgumentError, check_int64, ensure_loaded


def _check_box_list(boxes, op: str = "roi_align") -> None:
    """Eager-mode validation of a per-image box list, with errors that name the op and the entry."""
    if len(boxes) == 0:
        raise OpArgumentError(f"{op}: boxes is an empty list; give one Tensor[L, 4] per image")
    for i, b in enumerate(boxes):
        if not isinstance(b, Tensor) or b.dim() != 2 or b.size(1) != 4:
            shape = tuple(b.shape) if isinstance(b, Tensor) else type(b).__name__
            raise OpArgumentError(f"{op}: boxes[{i}] must be a Tensor[L, 4], got {shape}")


def convert_boxes_to_roi_format(boxes: List[Tensor]) -> Tensor:
    """A list of per-image Tensor[L_i, 4] boxes → Tensor[K, 5] rows (batch_index, x1, y1, x2, y2)."""
    if not torch.jit.is_scripting():
        _check_box_list(boxes)
    concat = torch.cat(boxes, dim=0)
    index = torch.cat(
        [torch.full((b.size(0), 1), float(i), dtype=concat.dtype, device=concat.device) for i, b in enumerate(boxes)]
    )
    return torch.cat([index, concat], dim=1)


def rois_and_output_size(boxes: Union[Tensor, List[Tensor]], size: List[int], op: str) -> Tuple[Tensor, List[int]]:
    """A pooling op's boxes as rois Tensor[K, 5] and its output size as (height, width), checked
    with errors that name the op (roi_align, roi_pool)."""
    if isinstance(boxes, Tensor):
        rois = boxes
    else:
        if not torch.jit.is_scripting():
            _check_box_list(boxes, op)
        rois = convert_boxes_to_roi_format(boxes)
    if rois.dim() != 2 or rois.size(1) != 5:
        raise OpArgumentError(
            op + ": boxes must be a Tensor[K, 5] (batch_index, x1, y1, x2, y2) or a list of "
            "Tensor[L, 4], got a tensor of shape " + str(rois.shape)
        )
    if len(size) != 2:
        raise OpArgumentError(op + ": output_size must be an int or (height, width), got " + str(size))
    if not torch.jit.is_scripting():
        check_int64(op, output_height=size[0], output_width=size[1])
    return rois, size


def roi_align(
    input: Tensor,
    boxes: Union[Tensor, List[Tensor]],
    output_size: BroadcastingList2[int],
    spatial_scale: float = 1.0,
    sampling_ratio: int = -1,
    aligned: bool = False,
) -> Tensor:
    """Bilinearly pools each box of `boxes` from `input` into an `output_size` grid.

    Args:
        input: Tensor[N, C, H, W] feature maps.
        boxes: Tensor[K, 5] of (batch_index, x1, y1, x2, y2), or a list of N Tensor[L_i, 4].
            Coordinates are in the image frame; `spatial_scale` maps them onto `input`.
        output_size: int or (height, width) of the pooled output.
        spatial_scale: feature-map size / image size (e.g. 1/4 for stride 4).
        sampling_ratio: samples per bin side; <= 0 picks ceil(roi size / output size) per roi.
        aligned: shift boxes by -0.5 pixel so that pixel centers line up (use True for new models).

    Returns:
        Tensor[K, C, output_height, output_width].
    """
    if not torch.jit.is_scripting():  # TorchScript cannot read the loader's state
        ensure_loaded()
    rois, size = rois_and_output_size(boxes, _pair(output_size), "roi_align")
    if not torch.jit.is_scripting():
        check_int64("roi_align", sampling_ratio=int(sampling_ratio))
    return torch.ops.detcore.roi_align(
        input, rois, float(spatial_scale), size[0], size[1], int(sampling_ratio), bool(aligned)
    )


# A leaf for torch.fx symbolic tracing (its argument checks call len() on a list of boxes, which
# a tracer cannot follow), as torchvision does: feature extractors built with torch.fx keep it whole.
torch.fx.wrap("roi_align")


class ROIAlign(nn.Module):
    """nn.Module form of `roi_align` with fixed arguments (``output_size`` kept as given, and the
    repr in torchvision's form)."""

    def __init__(
        self,
        output_size: BroadcastingList2[int],
        spatial_scale: float,
        sampling_ratio: int,
        aligned: bool = False,
    ):
        super().__init__()
        self.output_size = output_size
        self.spatial_scale = float(spatial_scale)
        self.sampling_ratio = int(sampling_ratio)
        self.aligned = bool(aligned)

    def forward(self, input: Tensor, rois: Union[Tensor, List[Tensor]]) -> Tensor:
        return roi_align(input, rois, self.output_size, self.spatial_scale, self.sampling_ratio, self.aligned)

    def extra_repr(self) -> str:
        return (
            f"output_size={self.output_size}, spatial_scale={self.spatial_scale}, "
            f"sampling_ratio={self.sampling_ratio}, aligned={self.aligned}"
        )


class RoIAlign(ROIAlign):
    """torchvision's spelling of ``ROIAlign``, so that swapping ``torchvision.ops`` for
    ``detcore.layers`` needs no renaming."""
