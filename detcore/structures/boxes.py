"""Axis-aligned boxes: the ``Boxes`` container, pairwise IoU / IoA, and xywh <-> xyxy conversions.

One convention everywhere: float ``(x1, y1, x2, y2)`` with width = x2 - x1 and height = y2 - y1
(no legacy "+1"). A pixel with integer index ``j`` covers ``[j, j + 1)``, so a box that exactly
covers pixels 3..5 is ``x1 = 3, x2 = 6``. COCO json stores ``(x, y, w, h)``; convert at the border
with :func:`xywh_to_xyxy` / :func:`xyxy_to_xywh`.

Detectron and maskrcnn-benchmark count a box's pixels inclusively (width = x2 - x1 + 1, so the
same box is ``x2 = 5`` there): their box coder, IoU and NMS give the same numbers on detcore's
boxes, but clipping, ROIAlign, mask pasting and rescaling do not. Models that run their weights
(MODEL.BOX_LEGACY_PLUS_ONE) keep detcore's boxes and use :func:`clip_limits` and
:func:`to_legacy_plus_one` / :func:`from_legacy_plus_one` where those differ.
"""
import numbers
from typing import Sequence, Tuple, Union

import numpy as np
import torch

__all__ = [
    "Boxes",
    "clip_limits",
    "from_legacy_plus_one",
    "to_legacy_plus_one",
    "pairwise_intersection",
    "pairwise_iou",
    "pairwise_ioa",
    "xywh_to_xyxy",
    "xyxy_to_xywh",
]


class Boxes:
    """A list of N boxes stored as one ``[N, 4]`` float tensor (``.tensor``) in xyxy format.

    Indexing always returns ``Boxes`` (an int gives one box, shape ``[1, 4]``), so per-instance
    fields stay Boxes when an ``Instances`` is sliced. ``clip`` and ``scale`` work in place (they
    also return ``self``), mirroring how the model edits its proposals.
    """

    def __init__(self, tensor):
        if not isinstance(tensor, torch.Tensor):
            tensor = torch.as_tensor(np.asarray(tensor, dtype=np.float32))
        if not tensor.is_floating_point():
            tensor = tensor.to(torch.float32)
        if (tensor.dim() != 2 or tensor.shape[-1] != 4) and tensor.numel() == 0:
            # Keeps "no boxes" uniform whatever shape the empty input had (e.g. [0] from a list).
            # (Shape first: a traced [N, 4] with a data-dependent N is never asked if N == 0.)
            tensor = tensor.reshape(0, 4)
        if tensor.dim() != 2 or tensor.shape[-1] != 4:
            raise ValueError(f"Boxes: tensor must have shape [N, 4], got {tuple(tensor.shape)}")
        self.tensor = tensor

    # --- container protocol -------------------------------------------------------------------
    def __len__(self) -> int:
        return self.tensor.shape[0]

    def __getitem__(self, item) -> "Boxes":
        if isinstance(item, numbers.Integral):
            return Boxes(self.tensor[int(item)].view(1, 4))
        selected = self.tensor[item]
        if selected.dim() != 2:
            raise IndexError(f"Boxes: indexing with {item!r} did not give an [K, 4] tensor")
        return Boxes(selected)

    def __iter__(self):
        # Rows as [4] tensors, like iterating the tensor itself.
        yield from self.tensor

    def __repr__(self) -> str:
        return f"Boxes({self.tensor})"

    @classmethod
    def cat(cls, boxes_list: Sequence["Boxes"]) -> "Boxes":
        if not isinstance(boxes_list, (list, tuple)):
            raise TypeError(f"Boxes.cat: expected a list of Boxes, got {type(boxes_list).__name__}")
        if len(boxes_list) == 0:
            return cls(torch.empty(0, 4))
        for b in boxes_list:
            if not isinstance(b, Boxes):
                raise TypeError(f"Boxes.cat: every element must be Boxes, got {type(b).__name__}")
        return cls(torch.cat([b.tensor for b in boxes_list], dim=0))

    def clone(self) -> "Boxes":
        return Boxes(self.tensor.clone())

    def to(self, *args, **kwargs) -> "Boxes":
        """Same arguments as ``torch.Tensor.to`` (device and/or dtype); returns new Boxes."""
        return Boxes(self.tensor.to(*args, **kwargs))

    @property
    def device(self) -> torch.device:
        return self.tensor.device

    # --- geometry -----------------------------------------------------------------------------
    def widths(self) -> torch.Tensor:
        return self.tensor[:, 2] - self.tensor[:, 0]

    def heights(self) -> torch.Tensor:
        return self.tensor[:, 3] - self.tensor[:, 1]

    def area(self) -> torch.Tensor:
        """``[N]`` areas; a box with x2 < x1 gives a negative number (use ``nonempty`` to filter)."""
        return self.widths() * self.heights()

    def get_centers(self) -> torch.Tensor:
        """``[N, 2]`` box centers as (x, y)."""
        return (self.tensor[:, :2] + self.tensor[:, 2:]) * 0.5

    def clip(self, image_size: Tuple[int, int], legacy_plus_one: bool = False) -> "Boxes":
        """Clamp x into ``[0, w]`` and y into ``[0, h]`` in place; ``image_size`` is ``(h, w)``
        (see :func:`clip_limits` for ``legacy_plus_one``)."""
        limits = clip_limits(_check_image_size(image_size, "Boxes.clip"), legacy_plus_one)
        t = self.tensor
        # Clamp each coordinate separately: torch.clamp with tensor bounds would need broadcasting
        # tensors on the boxes' device for nothing.
        for i, (lo, hi) in enumerate(limits):
            t[:, i].clamp_(min=lo, max=hi)
        return self

    def nonempty(self, threshold: float = 0.0) -> torch.Tensor:
        """``[N]`` bool: True where both width and height are strictly greater than ``threshold``."""
        return (self.widths() > threshold) & (self.heights() > threshold)

    def inside_box(self, box_size: Tuple[int, int], boundary_threshold: float = 0.0) -> torch.Tensor:
        """``[N]`` bool: True for boxes lying inside ``[0, w] x [0, h]``, allowing ``boundary_threshold``
        pixels of overhang on every side (``box_size`` is ``(h, w)``)."""
        h, w = _check_image_size(box_size, "Boxes.inside_box")
        t = self.tensor
        return (
            (t[:, 0] >= -boundary_threshold)
            & (t[:, 1] >= -boundary_threshold)
            & (t[:, 2] <= w + boundary_threshold)
            & (t[:, 3] <= h + boundary_threshold)
        )

    def scale(self, scale_x: float, scale_y: float) -> "Boxes":
        """Multiply x coordinates by ``scale_x`` and y coordinates by ``scale_y`` in place."""
        self.tensor[:, 0::2] *= scale_x
        self.tensor[:, 1::2] *= scale_y
        return self


def clip_limits(image_size: Tuple[int, int], legacy_plus_one: bool = False) -> Tuple[Tuple[int, int], ...]:
    """(lowest, highest) of x1, y1, x2, y2 for boxes clipped to an image of ``(h, w)``: x in
    ``[0, w]``, y in ``[0, h]``. With ``legacy_plus_one``, Detectron's clip of its inclusive
    corners to ``[0, w - 1]``: x1 in ``[0, w - 1]``, x2 in ``[1, w]`` (and so for y)."""
    h, w = image_size
    if legacy_plus_one:
        return (0, w - 1), (0, h - 1), (1, w), (1, h)
    return (0, w), (0, h), (0, w), (0, h)


def to_legacy_plus_one(boxes: torch.Tensor) -> torch.Tensor:
    """``[..., 4]`` detcore boxes as Detectron writes them: ``(x1, y1, x2 - 1, y2 - 1)``."""
    return torch.cat([boxes[..., :2], boxes[..., 2:] - 1], dim=-1)


def from_legacy_plus_one(boxes: torch.Tensor) -> torch.Tensor:
    """Detectron's inclusive ``(x1, y1, x2, y2)`` as detcore boxes: ``(x1, y1, x2 + 1, y2 + 1)``."""
    return torch.cat([boxes[..., :2], boxes[..., 2:] + 1], dim=-1)


def _check_image_size(image_size, name: str) -> Tuple[int, int]:
    if len(image_size) != 2:
        raise ValueError(f"{name}: image_size must be (height, width), got {image_size!r}")
    return image_size[0], image_size[1]


def _as_box_tensor(boxes: Union[Boxes, torch.Tensor], name: str) -> torch.Tensor:
    if isinstance(boxes, Boxes):
        return boxes.tensor
    if not isinstance(boxes, torch.Tensor):
        raise TypeError(f"{name} must be Boxes or an [N, 4] tensor, got {type(boxes).__name__}")
    if boxes.numel() == 0:
        return boxes.reshape(0, 4)
    if boxes.dim() != 2 or boxes.shape[1] != 4:
        raise ValueError(f"{name} must have shape [N, 4], got {tuple(boxes.shape)}")
    return boxes


def pairwise_intersection(boxes1, boxes2) -> torch.Tensor:
    """``[N, M]`` intersection areas of every box in ``boxes1`` with every box in ``boxes2``."""
    a = _as_box_tensor(boxes1, "boxes1")
    b = _as_box_tensor(boxes2, "boxes2")
    top_left = torch.maximum(a[:, None, :2], b[None, :, :2])
    bottom_right = torch.minimum(a[:, None, 2:], b[None, :, 2:])
    wh = (bottom_right - top_left).clamp(min=0)
    return wh[..., 0] * wh[..., 1]


def pairwise_iou(boxes1, boxes2) -> torch.Tensor:
    """``[N, M]`` IoU matrix. Pairs whose union is empty (two degenerate boxes) get 0, not NaN."""
    a = _as_box_tensor(boxes1, "boxes1")
    b = _as_box_tensor(boxes2, "boxes2")
    inter = pairwise_intersection(a, b)
    area_a = (a[:, 2] - a[:, 0]) * (a[:, 3] - a[:, 1])
    area_b = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    union = area_a[:, None] + area_b[None, :] - inter
    return torch.where(union > 0, inter / union.clamp(min=torch.finfo(inter.dtype).tiny), torch.zeros_like(inter))


def pairwise_ioa(boxes1, boxes2) -> torch.Tensor:
    """``[N, M]`` intersection over the area of the ``boxes2`` box (0 where that area is 0).

    Used to ask "how much of region j is covered by box i", e.g. for crowd regions.
    """
    a = _as_box_tensor(boxes1, "boxes1")
    b = _as_box_tensor(boxes2, "boxes2")
    inter = pairwise_intersection(a, b)
    area_b = ((b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1]))[None, :]
    return torch.where(area_b > 0, inter / area_b.clamp(min=torch.finfo(inter.dtype).tiny), torch.zeros_like(inter))


def _convert(boxes, to_xyxy: bool):
    if isinstance(boxes, torch.Tensor):
        if boxes.shape[-1:] != (4,):
            raise ValueError(f"boxes must have shape [..., 4], got {tuple(boxes.shape)}")
        first, size = boxes[..., :2], boxes[..., 2:]
        other = first + size if to_xyxy else size - first
        return torch.cat([first, other], dim=-1)
    if isinstance(boxes, np.ndarray):
        return _convert(torch.from_numpy(boxes), to_xyxy).numpy()
    # A plain sequence of 4 numbers, as in a COCO json "bbox".
    if len(boxes) != 4:
        raise ValueError(f"boxes must be 4 numbers or a [..., 4] tensor/array, got {boxes!r}")
    x, y, c, d = (float(v) for v in boxes)
    return [x, y, x + c, y + d] if to_xyxy else [x, y, c - x, d - y]


def xywh_to_xyxy(boxes):
    """``(x, y, w, h) -> (x1, y1, x2, y2)``. Takes a ``[..., 4]`` tensor or array (same type back)
    or a sequence of 4 numbers (a list back)."""
    return _convert(boxes, to_xyxy=True)


def xyxy_to_xywh(boxes):
    """``(x1, y1, x2, y2) -> (x, y, w, h)``; same input types as :func:`xywh_to_xyxy`."""
    return _convert(boxes, to_xyxy=False)
