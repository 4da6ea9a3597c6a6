"""Multi-level ROI pooling: each box is pooled from the FPN level that matches its size.

Boxes are assigned with the FPN paper's rule (eq. 1): a box of the canonical size (224, an
ImageNet crop) goes to the canonical level (4, i.e. p4), and every halving of its side moves it one
level down (finer). Each level is pooled with one `roi_align` call on the boxes it got, and the
results are scattered back so the output rows follow the input boxes' order.

The pooler builds the rois itself (each box's batch index is its image's), so its roi_align calls
skip the value checks that cost a GPU sync (`detcore.layers.trusted_inputs`); a box with a NaN or
infinite corner pools zeros there instead of raising.
"""
import math
from typing import List, Sequence

import torch
from torch import Tensor, nn

from detcore.layers import roi_align, trusted_inputs
from detcore.structures import Boxes, to_legacy_plus_one
from detcore.config.choices import LEVEL_MAPPERS

__all__ = ["ROIPooler", "assign_boxes_to_levels"]


_LEVEL_MAPPERS = LEVEL_MAPPERS


def assign_boxes_to_levels(
    box_lists: Sequence[Boxes],
    min_level: int,
    max_level: int,
    canonical_box_size: float,
    canonical_level: int,
    level_mapper: str = "detectron2",
) -> Tensor:
    """Pick a pyramid level for every box of every image.

    Level = floor(canonical_level + log2(sqrt(area) / canonical_box_size + 1e-8)), clamped to
    [min_level, max_level]. ``level_mapper="torchvision"`` puts the eps outside the log instead,
    floor(canonical_level + log2(sqrt(area) / canonical_box_size) + 1e-6), as torchvision's
    LevelMapper does; "maskrcnn_benchmark" keeps it inside, 1e-6 (its LevelMapper). A box exactly
    at a level boundary (e.g. 112 px) lands on the same level either way; one just below a
    boundary may go one level up.

    Returns:
        int64 Tensor[R] (R: boxes over all images, in order) of level indices *relative to
        min_level*, i.e. an index into the list of feature maps.
    """
    if level_mapper not in _LEVEL_MAPPERS:
        raise ValueError(f"assign_boxes_to_levels: level_mapper must be one of {_LEVEL_MAPPERS}, got {level_mapper!r}")
    box_sizes = torch.sqrt(torch.cat([boxes.area() for boxes in box_lists]))
    if level_mapper == "torchvision":
        eps = torch.tensor(1e-6, dtype=box_sizes.dtype, device=box_sizes.device)
        levels = torch.floor(canonical_level + torch.log2(box_sizes / canonical_box_size) + eps)
    else:
        # eps keeps log2 finite for zero-area boxes (they land on the finest level).
        eps = 1e-6 if level_mapper == "maskrcnn_benchmark" else 1e-8
        levels = torch.floor(canonical_level + torch.log2(box_sizes / canonical_box_size + eps))
    levels = torch.clamp(levels, min=min_level, max=max_level)
    return levels.to(torch.int64) - min_level


def _boxes_to_rois(box_lists: Sequence[Boxes]) -> Tensor:
    """List of per-image Boxes → Tensor[R, 5] rows (batch_index, x1, y1, x2, y2)."""
    tensors = [b.tensor for b in box_lists]
    device, dtype = tensors[0].device, tensors[0].dtype
    index = torch.cat(
        [torch.full((t.shape[0], 1), i, dtype=dtype, device=device) for i, t in enumerate(tensors)]
    )
    return torch.cat([index, torch.cat(tensors)], dim=1)


def _level_of_scale(scale: float) -> int:
    level = -math.log2(scale)
    if abs(level - round(level)) > 1e-6:
        raise ValueError(f"ROIPooler: scales must be powers of 1/2 (1/stride), got {scale}")
    return int(round(level))


class ROIPooler(nn.Module):
    """Pools a fixed-size feature grid for every box from a list of feature maps.

    Args:
        output_size: int or (height, width) of the pooled grid.
        scales: one spatial scale per feature map (1 / stride), finest first, e.g.
            (1/4, 1/8, 1/16, 1/32) for p2..p5. Consecutive maps must differ by a factor of 2.
        sampling_ratio: `roi_align` samples per bin side (0: adaptive).
        aligned: `roi_align`'s half-pixel correction (True for models with xyxy, no +1 boxes).
        canonical_box_size, canonical_level, level_mapper: the level-assignment rule (see
            `assign_boxes_to_levels`).
        legacy_plus_one: pool each box as Detectron's ROIAlign sees it, ``(x1, y1, x2 - 1,
            y2 - 1)`` (its inclusive corners; with ``aligned=False``, as theirs). The level still
            comes from the box's own area, which is theirs with the "+1".
    """

    def __init__(
        self,
        output_size,
        scales: Sequence[float],
        sampling_ratio: int,
        aligned: bool = True,
        canonical_box_size: float = 224,
        canonical_level: int = 4,
        level_mapper: str = "detectron2",
        legacy_plus_one: bool = False,
    ):
        super().__init__()
        if isinstance(output_size, int):
            output_size = (output_size, output_size)
        output_size = tuple(int(s) for s in output_size)
        if len(output_size) != 2:
            raise ValueError(f"ROIPooler: output_size must be an int or (height, width), got {output_size}")
        if len(scales) == 0:
            raise ValueError("ROIPooler: scales is empty; give one 1/stride per feature map")
        if canonical_box_size <= 0:
            raise ValueError(f"ROIPooler: canonical_box_size must be > 0, got {canonical_box_size}")
        levels = [_level_of_scale(s) for s in scales]
        if levels != list(range(levels[0], levels[0] + len(levels))):
            raise ValueError(
                f"ROIPooler: scales must go from fine to coarse by factors of 2, got {list(scales)}"
            )
        self.output_size = output_size
        self.scales = tuple(float(s) for s in scales)
        self.sampling_ratio = int(sampling_ratio)
        self.aligned = bool(aligned)
        self.min_level = levels[0]
        self.max_level = levels[-1]
        self.canonical_box_size = float(canonical_box_size)
        self.canonical_level = int(canonical_level)
        if level_mapper not in _LEVEL_MAPPERS:
            raise ValueError(f"ROIPooler: level_mapper must be one of {_LEVEL_MAPPERS}, got {level_mapper!r}")
        self.level_mapper = level_mapper
        self.legacy_plus_one = bool(legacy_plus_one)

    def forward(self, x: List[Tensor], box_lists: List[Boxes]) -> Tensor:
        """
        Args:
            x: one Tensor[N, C, H_l, W_l] per scale, in the order of `scales`.
            box_lists: N Boxes (one per image), in image coordinates.

        Returns:
            Tensor[R, C, output_h, output_w], R = total number of boxes; row i is box i of the
            concatenated box_lists.
        """
        if not isinstance(x, (list, tuple)) or len(x) != len(self.scales):
            got = len(x) if isinstance(x, (list, tuple)) else type(x).__name__
            raise ValueError(f"ROIPooler: x must be a list of {len(self.scales)} feature maps (one per scale), got {got}")
        if not isinstance(box_lists, (list, tuple)) or not all(isinstance(b, Boxes) for b in box_lists):
            raise TypeError("ROIPooler: box_lists must be a list of Boxes, one per image")
        if len(box_lists) != x[0].size(0):
            raise ValueError(
                f"ROIPooler: got {len(box_lists)} box lists for a batch of {x[0].size(0)} feature maps"
            )
        channels = x[0].size(1)
        if len(box_lists) == 0:
            return x[0].new_zeros((0, channels) + self.output_size)

        rois = _boxes_to_rois(box_lists).to(device=x[0].device)
        if self.legacy_plus_one:
            rois = torch.cat([rois[:, :1], to_legacy_plus_one(rois[:, 1:])], dim=1)
        if len(self.scales) == 1:
            return self._pool(x[0], rois, self.scales[0])

        levels = assign_boxes_to_levels(
            box_lists,
            self.min_level,
            self.max_level,
            self.canonical_box_size,
            self.canonical_level,
            self.level_mapper,
        ).to(rois.device)
        output = x[0].new_zeros((rois.size(0), channels) + self.output_size)
        for level, (features, scale) in enumerate(zip(x, self.scales)):
            inds = torch.nonzero(levels == level).squeeze(1)
            # Pooled even when no box chose this level: the (empty) result still links the level to
            # the graph, so every FPN output gets a gradient (DDP wants all parameters used).
            pooled = self._pool(features, rois[inds], scale)
            # index_put (not in-place slicing of a view) keeps autograd to every level's features.
            output = output.index_put((inds,), pooled.to(output.dtype))
        return output

    def _pool(self, features: Tensor, rois: Tensor, scale: float) -> Tensor:
        with trusted_inputs():  # rois made by forward: no value checks (see the module's docstring)
            if features.dtype in (torch.float16, torch.bfloat16):
                # Box coordinates of a large image do not fit half precision (a 0.5 px step at
                # 1000), so pool in float32 and hand back the features' dtype.
                return roi_align(
                    features.float(), rois.float(), self.output_size, scale, self.sampling_ratio, self.aligned
                ).to(features.dtype)
            return roi_align(features, rois.to(features.dtype), self.output_size, scale, self.sampling_ratio, self.aligned)

    def extra_repr(self) -> str:
        return (
            f"output_size={self.output_size}, scales={self.scales}, sampling_ratio={self.sampling_ratio}, "
            f"aligned={self.aligned}, canonical_box_size={self.canonical_box_size}, "
            f"canonical_level={self.canonical_level}, level_mapper={self.level_mapper!r}"
            + (", legacy_plus_one=True" if self.legacy_plus_one else "")
        )
