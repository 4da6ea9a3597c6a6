"""Anchors: the reference boxes the RPN scores and regresses, one set per feature level.

Each level has a few "cell anchors" (one per size × aspect ratio) centered at the origin; they
are copied to every feature map location, whose center in input pixels is
``((x + offset) * stride, (y + offset) * stride)``. With FPN every level usually has one size
(32 on p2 ... 512 on p6) and three aspect ratios.

Three options reproduce torchvision's ``AnchorGenerator`` exactly (for its checkpoints):
``round_cell_anchors`` rounds the cell anchors' corners to whole pixels, and
``strides_from_image_size`` takes each level's stride, per axis, as ``padded image size //
feature map size`` instead of the nominal stride. The two differ where a map size was rounded up:
an 800 px high input has a 25-row p5 and a 13-row p6, whose stride is then 800 // 13 = 61, not 64.
``cell_anchor_order="ratio_major"`` orders a location's anchors ratio by ratio (all sizes of the
first ratio, then of the next) as torchvision does, instead of size by size (Detectron, detectron2):
the same with one size per level (the R-CNN FPN models), not with RetinaNet's 3 sizes x 3 ratios,
whose head predicts anchor a in channel block a.

``generate_detectron_cell_anchors`` reproduces Detectron's ``generate_anchors`` (maskrcnn-benchmark uses
it too): each ratio's width and height are rounded to whole pixels on a stride x stride box, then
scaled to the size, so a ratio-0.5 anchor of size 32 on stride 4 is 48 x 24, not 45.25 x 22.6.
Its anchors are centered on the cell (offset 0.5; at (stride - 1) / 2 in its "+1" pixel
convention) and ordered ratio-major, as its RPN heads' outputs are.
"""
import math
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import nn

from detcore.config.choices import CELL_ANCHOR_ORDERS
from detcore.layers.shape_spec import ShapeSpec
from detcore.structures import Boxes
from detcore.structures.image_list import size_int
from detcore.utils.registry import Registry

__all__ = ["ANCHOR_GENERATOR_REGISTRY", "DefaultAnchorGenerator", "build_anchor_generator"]

# Anchor generators: `from_config(cfg, input_shapes)` gets one ShapeSpec per feature level.
ANCHOR_GENERATOR_REGISTRY = Registry("ANCHOR_GENERATOR", "MODEL.ANCHOR_GENERATOR.NAME")


def _per_level(values, num_levels: int, name: str) -> List[List[float]]:
    """Accept one list per level ([[32], [64]]) or one list shared by all levels ([[32, 64]], or
    flat: [32, 64]), as detectron2 does."""
    if not isinstance(values, (list, tuple)) or len(values) == 0:
        raise ValueError(f"DefaultAnchorGenerator: {name} must be a non-empty list, got {values!r}")
    if not isinstance(values[0], (list, tuple)):
        values = [values]
    if len(values) == 1:
        values = list(values) * num_levels
    if len(values) != num_levels:
        raise ValueError(
            f"DefaultAnchorGenerator: {name} has {len(values)} lists for {num_levels} feature levels "
            "(give one list per level, or one list for all)"
        )
    return [[float(v) for v in level] for level in values]


def generate_cell_anchors(
    sizes: Sequence[float], aspect_ratios: Sequence[float], round_corners: bool = False, order: str = "size_major"
) -> torch.Tensor:
    """``[len(sizes) * len(aspect_ratios), 4]`` xyxy anchors centered at (0, 0).

    An anchor of size ``s`` and ratio ``r`` (height / width) has area ``s**2``:
    ``w = s / sqrt(r)``, ``h = s * sqrt(r)``. ``round_corners`` rounds the corners to integers
    (half to even), computed in float32 as torchvision does so that the rounding agrees.
    ``order``: "size_major" (anchor ``i * len(aspect_ratios) + j`` has size i, ratio j) or
    "ratio_major" (anchor ``j * len(sizes) + i``, torchvision's).
    """
    if order not in CELL_ANCHOR_ORDERS:
        raise ValueError(f"generate_cell_anchors: order must be one of {list(CELL_ANCHOR_ORDERS)}, got {order!r}")
    if order == "size_major":
        pairs = [(size, ratio) for size in sizes for ratio in aspect_ratios]
    else:
        pairs = [(size, ratio) for ratio in aspect_ratios for size in sizes]
    anchors = []
    for size, ratio in pairs:
        if size <= 0 or ratio <= 0:
            raise ValueError(f"anchor sizes and aspect ratios must be positive, got size {size}, ratio {ratio}")
        if round_corners:
            h_ratio = torch.sqrt(torch.tensor(ratio, dtype=torch.float32))
            w = (1 / h_ratio) * size
            h = h_ratio * size
            anchors.append(torch.stack([-w, -h, w, h]) / 2)
        else:
            w = size / math.sqrt(ratio)
            h = size * math.sqrt(ratio)
            anchors.append(torch.tensor([-w / 2.0, -h / 2.0, w / 2.0, h / 2.0]))
    anchors = torch.stack(anchors).to(torch.float32)
    return anchors.round() if round_corners else anchors


def generate_detectron_cell_anchors(stride: int, sizes: Sequence[float], aspect_ratios: Sequence[float]) -> torch.Tensor:
    """``[len(aspect_ratios) * len(sizes), 4]`` xyxy anchors centered at (0, 0), ratio-major, as
    Detectron's ``generate_anchors(stride, sizes, aspect_ratios)`` makes them (in float64, numpy's
    half-to-even rounding), written as detcore boxes (its inclusive corners + 1)."""
    ratios = np.asarray(aspect_ratios, dtype=np.float64)
    if (ratios <= 0).any() or any(s <= 0 for s in sizes):
        raise ValueError(f"anchor sizes and aspect ratios must be positive, got {list(sizes)}, {list(aspect_ratios)}")
    widths = np.round(np.sqrt(stride * stride / ratios))
    heights = np.round(widths * ratios)
    anchors = []
    for w, h in zip(widths, heights):
        for size in sizes:
            half_w, half_h = w * size / stride / 2, h * size / stride / 2
            anchors.append([-half_w, -half_h, half_w, half_h])
    return torch.tensor(anchors, dtype=torch.float64).to(torch.float32)


@ANCHOR_GENERATOR_REGISTRY.register()
class DefaultAnchorGenerator(nn.Module):
    """Args:
        sizes: per level, the anchor sizes (sqrt of area) in input pixels; see ``_per_level`` for
            the accepted shapes.
        aspect_ratios: per level (or one list for all), height / width ratios.
        strides: per level, input pixels per feature map pixel.
        offset: anchor center within its cell, in ``[0, 1)``: 0.0 puts it on the cell's top-left
            corner (Detectron), 0.5 at the cell's center.
        round_cell_anchors: round the cell anchors' corners to integers (torchvision).
        strides_from_image_size: per level and axis, use ``padded image size // feature map
            size`` as the stride (torchvision); ``forward`` then needs ``image_size``.
        detectron_cell_anchors: Detectron's rounded, ratio-major cell anchors (see
            `generate_detectron_cell_anchors`; use with ``offset=0.5``;
            they come in Detectron's own order, ``cell_anchor_order`` does not apply).
        cell_anchor_order: "size_major" or "ratio_major" (torchvision): the order of a
            location's anchors, see ``generate_cell_anchors``.
    """

    def __init__(
        self,
        sizes: Sequence,
        aspect_ratios: Sequence,
        strides: Sequence[int],
        offset: float = 0.0,
        round_cell_anchors: bool = False,
        strides_from_image_size: bool = False,
        detectron_cell_anchors: bool = False,
        cell_anchor_order: str = "size_major",
    ):
        super().__init__()
        if round_cell_anchors and detectron_cell_anchors:
            raise ValueError(
                "DefaultAnchorGenerator: round_cell_anchors (torchvision) and detectron_cell_anchors (Detectron) "
                "are two different roundings; choose one"
            )
        strides = [int(s) for s in strides]
        if len(strides) == 0 or any(s <= 0 for s in strides):
            raise ValueError(f"DefaultAnchorGenerator: strides must be positive ints, one per level, got {strides}")
        if not 0.0 <= offset < 1.0:
            raise ValueError(f"DefaultAnchorGenerator: offset must lie in [0, 1), got {offset}")
        self.strides = strides
        self.num_levels = len(strides)
        self.offset = float(offset)
        self.sizes = _per_level(sizes, self.num_levels, "sizes")
        self.aspect_ratios = _per_level(aspect_ratios, self.num_levels, "aspect_ratios")
        self.round_cell_anchors = bool(round_cell_anchors)
        self.strides_from_image_size = bool(strides_from_image_size)
        if cell_anchor_order not in CELL_ANCHOR_ORDERS:
            raise ValueError(
                f"DefaultAnchorGenerator: cell_anchor_order must be one of {list(CELL_ANCHOR_ORDERS)}, "
                f"got {cell_anchor_order!r}"
            )
        self.cell_anchor_order = cell_anchor_order
        self.detectron_cell_anchors = bool(detectron_cell_anchors)
        # Non-persistent buffers: they follow .to(device) but stay out of checkpoints
        # (they are a pure function of the constructor arguments).
        for i, (s, r) in enumerate(zip(self.sizes, self.aspect_ratios)):
            if self.detectron_cell_anchors:
                cell = generate_detectron_cell_anchors(self.strides[i], s, r)
            else:
                cell = generate_cell_anchors(s, r, round_corners=self.round_cell_anchors, order=cell_anchor_order)
            self.register_buffer(f"cell_anchors_{i}", cell, persistent=False)

    @classmethod
    def from_config(cls, cfg, input_shapes: Sequence[ShapeSpec]):
        anchors = cfg.MODEL.ANCHOR_GENERATOR
        return {
            "sizes": anchors.SIZES,
            "aspect_ratios": anchors.ASPECT_RATIOS,
            "strides": [shape.stride for shape in input_shapes],
            "offset": anchors.OFFSET,
            "round_cell_anchors": anchors.ROUND_CELL_ANCHORS,
            "strides_from_image_size": anchors.STRIDES_FROM_IMAGE_SIZE,
            "detectron_cell_anchors": anchors.DETECTRON_CELL_ANCHORS,
            "cell_anchor_order": anchors.CELL_ANCHOR_ORDER,
        }

    @property
    def cell_anchors(self) -> List[torch.Tensor]:
        return [getattr(self, f"cell_anchors_{i}") for i in range(self.num_levels)]

    @property
    def num_cell_anchors(self) -> List[int]:
        """Anchors per feature map location, per level (the RPN head's A)."""
        return [len(s) * len(r) for s, r in zip(self.sizes, self.aspect_ratios)]

    def grid_anchors(
        self, grid_sizes: Sequence[Sequence[int]], strides: Optional[Sequence[Tuple[int, int]]] = None
    ) -> List[torch.Tensor]:
        """``[Hi * Wi * A, 4]`` anchors per level for feature maps of the given ``(Hi, Wi)``;
        ``strides`` gives ``(stride_y, stride_x)`` per level (default: the nominal strides)."""
        if strides is None:
            strides = [(s, s) for s in self.strides]
        anchors = []
        for (height, width), (stride_y, stride_x), base in zip(grid_sizes, strides, self.cell_anchors):
            # Integer grid times stride, then the offset: exact for the usual power-of-two strides.
            xs = (torch.arange(width, device=base.device, dtype=torch.float32) + self.offset) * stride_x
            ys = (torch.arange(height, device=base.device, dtype=torch.float32) + self.offset) * stride_y
            shift_y, shift_x = torch.meshgrid(ys, xs, indexing="ij")
            shift_x = shift_x.reshape(-1)
            shift_y = shift_y.reshape(-1)
            shifts = torch.stack((shift_x, shift_y, shift_x, shift_y), dim=1)
            # Location-major: the A cell anchors of location 0, then of location 1, ...
            anchors.append((shifts[:, None, :] + base[None, :, :]).reshape(-1, 4))
        return anchors

    def forward(self, features: List[torch.Tensor], image_size: Optional[Tuple[int, int]] = None) -> List[Boxes]:
        """Args:
            features: one ``[B, C, Hi, Wi]`` map per level (only their sizes are read).
            image_size: ``(H, W)`` of the padded input batch; needed (and only read) with
                ``strides_from_image_size``.

        Returns:
            one ``Boxes`` of ``Hi * Wi * A`` anchors per level, shared by all images of the batch.
        """
        if len(features) != self.num_levels:
            raise ValueError(
                f"DefaultAnchorGenerator: got {len(features)} feature maps, built for {self.num_levels} levels"
            )
        grid_sizes = []
        for i, f in enumerate(features):
            if f.dim() < 2:
                raise ValueError(f"DefaultAnchorGenerator: features[{i}] must be [..., H, W], got {tuple(f.shape)}")
            grid_sizes.append(tuple(f.shape[-2:]))
        strides = None
        if self.strides_from_image_size:
            if image_size is None or len(image_size) != 2:
                raise ValueError(
                    "DefaultAnchorGenerator: strides_from_image_size needs image_size=(H, W) of the padded "
                    f"batch, got {image_size!r}"
                )
            strides = [(size_int(image_size[0]) // h, size_int(image_size[1]) // w) for h, w in grid_sizes]
        return [Boxes(a) for a in self.grid_anchors(grid_sizes, strides)]

    def extra_repr(self) -> str:
        extra = ""
        if self.round_cell_anchors:
            extra += ", round_cell_anchors=True"
        if self.strides_from_image_size:
            extra += ", strides_from_image_size=True"
        if self.detectron_cell_anchors:
            extra += ", detectron_cell_anchors=True"
        if self.cell_anchor_order != "size_major":
            extra += f", cell_anchor_order={self.cell_anchor_order!r}"
        return (
            f"sizes={self.sizes}, aspect_ratios={self.aspect_ratios}, strides={self.strides}, "
            f"offset={self.offset}{extra}"
        )


def build_anchor_generator(cfg, input_shapes: Sequence[ShapeSpec]) -> nn.Module:
    """The anchor generator named by cfg.MODEL.ANCHOR_GENERATOR.NAME for feature maps described
    by ``input_shapes``."""
    return ANCHOR_GENERATOR_REGISTRY.build(cfg, input_shapes)
