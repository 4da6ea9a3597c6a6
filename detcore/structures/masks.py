"""Instance masks as polygons (COCO style) or as bitmaps, and the Mask R-CNN training targets.

``crop_and_resize(boxes, M)`` is the reason these types exist: for each instance it returns the
part of its mask inside its (proposal) box, resampled to ``M x M`` -- the target the mask head
learns. Both kinds follow one geometry: mask cell ``(i, j)`` stands for the point
``(x1 + (j + 0.5) * w / M, y1 + (i + 0.5) * h / M)`` of the box, and image pixel ``(r, c)`` has its
center at ``(c + 0.5, r + 0.5)``.

Polygons are rasterized with pycocotools, so they follow COCO's own convention (the one
``COCO.annToMask`` uses): a pixel is set when its center falls inside the polygon.
"""
import numbers
from typing import List, Sequence, Union

import numpy as np
import pycocotools.mask as mask_util
import torch

from .boxes import Boxes

__all__ = ["BitMasks", "PolygonMasks", "polygons_to_bitmask"]


# --- polygon helpers ----------------------------------------------------------------------------
def _as_polygon(poly, where: str) -> np.ndarray:
    arr = np.asarray(poly.cpu() if isinstance(poly, torch.Tensor) else poly, dtype=np.float64).reshape(-1)
    # A polygon needs 3 points; pycocotools would even read a 4-number list as a box.
    if arr.size < 6 or arr.size % 2 != 0:
        raise ValueError(
            f"{where}: a polygon must be a flat [x0, y0, x1, y1, ...] list of at least 3 points "
            f"(an even count >= 6 of numbers), got {arr.size} numbers"
        )
    return arr


def _rasterize(polygons_per_instance: Sequence[Sequence[np.ndarray]], height: int, width: int) -> torch.Tensor:
    """``[N, height, width]`` bool: instance ``i`` is the union of its polygons."""
    out = torch.zeros((len(polygons_per_instance), height, width), dtype=torch.bool)
    rles, owners = [], []
    for i, polys in enumerate(polygons_per_instance):
        if len(polys) == 0:
            continue
        # frPyObjects wants plain float lists or float64 arrays; merge is the union of the parts.
        rles.append(mask_util.merge(mask_util.frPyObjects([np.asarray(p, dtype=np.float64) for p in polys], height, width)))
        owners.append(i)
    if rles and height > 0 and width > 0:
        decoded = mask_util.decode(rles)  # [height, width, K] uint8, Fortran order
        # transpose(2, 1, 0) of a Fortran array is a C-contiguous [K, width, height]: no copy.
        out[owners] = torch.from_numpy(np.ascontiguousarray(decoded.transpose(2, 1, 0))).transpose(1, 2).bool()
    return out


def polygons_to_bitmask(polygons: Sequence, height: int, width: int) -> torch.Tensor:
    """Rasterize the union of one instance's polygons into a ``[height, width]`` bool tensor."""
    polys = [_as_polygon(p, "polygons_to_bitmask") for p in polygons]
    return _rasterize([polys], height, width)[0]


def _polygon_area(poly: np.ndarray) -> float:
    x, y = poly[0::2], poly[1::2]
    # Shoelace formula; abs makes it independent of the winding direction.
    return 0.5 * abs(float(np.dot(x, np.roll(y, 1)) - np.dot(y, np.roll(x, 1))))


def _box_tensor(boxes, n: int, where: str) -> torch.Tensor:
    t = boxes.tensor if isinstance(boxes, Boxes) else boxes
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{where}: boxes must be Boxes or an [N, 4] tensor, got {type(boxes).__name__}")
    if t.numel() == 0:
        t = t.reshape(0, 4)
    if t.dim() != 2 or t.shape[1] != 4 or t.shape[0] != n:
        raise ValueError(f"{where}: boxes must have shape [{n}, 4] (one per mask), got {tuple(t.shape)}")
    return t


def _check_mask_size(mask_size, where: str) -> int:
    if not isinstance(mask_size, numbers.Integral) or mask_size <= 0:
        raise ValueError(f"{where}: mask_size must be a positive int, got {mask_size!r}")
    return int(mask_size)


def _index_to_list(item, n: int) -> List[int]:
    if isinstance(item, slice):
        return list(range(n))[item]
    if isinstance(item, np.ndarray):
        item = torch.from_numpy(item)
    if isinstance(item, torch.Tensor):
        if item.dtype == torch.bool:
            if item.shape != (n,):
                raise IndexError(f"PolygonMasks: bool index of shape {tuple(item.shape)} for {n} masks")
            item = item.nonzero().flatten()
        return item.reshape(-1).tolist()
    if isinstance(item, (list, tuple)):
        if item and all(isinstance(x, bool) for x in item):
            return _index_to_list(torch.tensor(item), n)
        return [int(i) for i in item]
    raise TypeError(f"PolygonMasks: cannot index with {type(item).__name__}")


# --- polygon masks ------------------------------------------------------------------------------
class PolygonMasks:
    """``polygons[i]`` is the list of flat ``[x0, y0, x1, y1, ...]`` polygons of instance ``i``
    (several when the object is split by an occluder), stored as float64 numpy arrays."""

    def __init__(self, polygons: Sequence[Sequence]):
        if isinstance(polygons, PolygonMasks):
            polygons = polygons.polygons
        if not isinstance(polygons, (list, tuple)):
            raise TypeError(f"PolygonMasks: expected a list (per instance) of lists of polygons, got {type(polygons).__name__}")
        self.polygons: List[List[np.ndarray]] = []
        for i, polys in enumerate(polygons):
            if not isinstance(polys, (list, tuple)) or (len(polys) > 0 and isinstance(polys[0], numbers.Number)):
                # The common slip is passing one flat polygon where a list of polygons is expected.
                got = "a flat list of numbers" if isinstance(polys, (list, tuple)) else type(polys).__name__
                raise TypeError(
                    f"PolygonMasks: instance {i} must be a list of polygons [[x0, y0, x1, y1, ...], ...], got {got}"
                )
            self.polygons.append([_as_polygon(p, f"PolygonMasks (instance {i})") for p in polys])

    def __len__(self) -> int:
        return len(self.polygons)

    def __getitem__(self, item) -> "PolygonMasks":
        if isinstance(item, numbers.Integral):
            return PolygonMasks([self.polygons[item]])
        return PolygonMasks([self.polygons[i] for i in _index_to_list(item, len(self))])

    def __iter__(self):
        yield from self.polygons

    def __repr__(self) -> str:
        return f"PolygonMasks(num_instances={len(self)})"

    @classmethod
    def cat(cls, masks_list: Sequence["PolygonMasks"]) -> "PolygonMasks":
        for m in masks_list:
            if not isinstance(m, PolygonMasks):
                raise TypeError(f"PolygonMasks.cat: every element must be PolygonMasks, got {type(m).__name__}")
        return cls([polys for m in masks_list for polys in m.polygons])

    def to(self, device) -> "PolygonMasks":
        # Polygons stay on the host (they are rasterized by pycocotools); outputs go to the device asked.
        return self

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def nonempty(self) -> torch.Tensor:
        """``[N]`` bool: True for instances with at least one polygon."""
        return torch.tensor([len(p) > 0 for p in self.polygons], dtype=torch.bool)

    def area(self) -> torch.Tensor:
        """``[N]`` float32: sum of the polygons' areas (overlapping parts count twice, as in COCO)."""
        return torch.tensor([sum(_polygon_area(p) for p in polys) for polys in self.polygons], dtype=torch.float32)

    def get_bounding_boxes(self) -> Boxes:
        """Tight xyxy boxes around every instance's polygons (zeros for an instance without any)."""
        boxes = torch.zeros((len(self), 4), dtype=torch.float32)
        for i, polys in enumerate(self.polygons):
            if polys:
                xy = np.concatenate(polys).reshape(-1, 2)
                boxes[i] = torch.from_numpy(np.concatenate([xy.min(0), xy.max(0)]).astype(np.float32))
        return Boxes(boxes)

    def crop_and_resize(self, boxes: Union[Boxes, torch.Tensor], mask_size: int) -> torch.Tensor:
        """``[N, M, M]`` bool mask targets on ``boxes``' device: instance ``i``'s polygons moved into
        ``boxes[i]``'s frame, scaled to ``M x M`` and rasterized (pixel set when its center is inside)."""
        m = _check_mask_size(mask_size, "PolygonMasks.crop_and_resize")
        box_t = _box_tensor(boxes, len(self), "PolygonMasks.crop_and_resize")
        device = box_t.device
        box_np = box_t.detach().cpu().double().numpy()
        scaled = []
        for polys, (x1, y1, x2, y2) in zip(self.polygons, box_np):
            # 0.1 guards degenerate boxes; their target is meaningless anyway but must not be NaN.
            scale = np.array([m / max(x2 - x1, 0.1), m / max(y2 - y1, 0.1)])
            origin = np.array([x1, y1])
            scaled.append([((p.reshape(-1, 2) - origin) * scale).reshape(-1) for p in polys])
        return _rasterize(scaled, m, m).to(device)


# --- bitmaps ------------------------------------------------------------------------------------
class BitMasks:
    """``tensor``: ``[N, H, W]`` bool, one full-image bitmap per instance."""

    def __init__(self, tensor):
        if isinstance(tensor, np.ndarray):
            tensor = torch.from_numpy(np.ascontiguousarray(tensor))
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"BitMasks: expected an [N, H, W] tensor or array, got {type(tensor).__name__}")
        if tensor.dim() != 3:
            raise ValueError(f"BitMasks: tensor must have shape [N, H, W], got {tuple(tensor.shape)}")
        self.tensor = tensor if tensor.dtype == torch.bool else tensor.to(torch.bool)

    @classmethod
    def from_polygons(cls, polygon_masks: Union[PolygonMasks, Sequence], height: int, width: int) -> "BitMasks":
        """Rasterize every instance of ``polygon_masks`` into an ``height x width`` bitmap."""
        if not isinstance(polygon_masks, PolygonMasks):
            polygon_masks = PolygonMasks(polygon_masks)
        return cls(_rasterize(polygon_masks.polygons, int(height), int(width)))

    @property
    def image_size(self):
        return tuple(self.tensor.shape[1:])

    @property
    def device(self) -> torch.device:
        return self.tensor.device

    def __len__(self) -> int:
        return self.tensor.shape[0]

    def __getitem__(self, item) -> "BitMasks":
        if isinstance(item, numbers.Integral):
            return BitMasks(self.tensor[int(item)].unsqueeze(0))
        selected = self.tensor[item]
        if selected.dim() != 3:
            raise IndexError(f"BitMasks: indexing with {item!r} did not give an [K, H, W] tensor")
        return BitMasks(selected)

    def __iter__(self):
        yield from self.tensor

    def __repr__(self) -> str:
        return f"BitMasks(num_instances={len(self)}, image_size={self.image_size})"

    @classmethod
    def cat(cls, masks_list: Sequence["BitMasks"]) -> "BitMasks":
        if len(masks_list) == 0:
            raise ValueError("BitMasks.cat: need at least one BitMasks (the image size is unknown otherwise)")
        for m in masks_list:
            if not isinstance(m, BitMasks):
                raise TypeError(f"BitMasks.cat: every element must be BitMasks, got {type(m).__name__}")
            if m.image_size != masks_list[0].image_size:
                raise ValueError(f"BitMasks.cat: image sizes differ ({m.image_size} vs {masks_list[0].image_size})")
        return cls(torch.cat([m.tensor for m in masks_list], dim=0))

    def to(self, *args, **kwargs) -> "BitMasks":
        return BitMasks(self.tensor.to(*args, **kwargs))

    def nonempty(self) -> torch.Tensor:
        """``[N]`` bool: True for masks with at least one pixel set."""
        return self.tensor.flatten(1).any(dim=1)

    def area(self) -> torch.Tensor:
        """``[N]`` float32 pixel counts."""
        return self.tensor.flatten(1).sum(dim=1).to(torch.float32)

    def get_bounding_boxes(self) -> Boxes:
        """Tight xyxy boxes around the set pixels (pixel ``j`` spans ``[j, j + 1)``); zeros if empty."""
        n, h, w = self.tensor.shape
        boxes = torch.zeros((n, 4), dtype=torch.float32, device=self.device)
        if n == 0 or h == 0 or w == 0:
            return Boxes(boxes)
        cols = self.tensor.any(dim=1).to(torch.uint8)  # [N, W]
        rows = self.tensor.any(dim=2).to(torch.uint8)  # [N, H]
        nonempty = cols.any(dim=1)
        # argmax returns the first maximal index: first set column from the left / from the right.
        boxes[:, 0] = cols.argmax(dim=1).float()
        boxes[:, 2] = (w - cols.flip(1).argmax(dim=1)).float()
        boxes[:, 1] = rows.argmax(dim=1).float()
        boxes[:, 3] = (h - rows.flip(1).argmax(dim=1)).float()
        return Boxes(boxes * nonempty[:, None])

    def crop_and_resize(self, boxes: Union[Boxes, torch.Tensor], mask_size: int) -> torch.Tensor:
        """``[N, M, M]`` bool mask targets: each bitmap sampled bilinearly at the centers of an
        ``M x M`` grid over its box (ROIAlign ``aligned=True`` geometry, one sample per cell,
        zero outside the image) and thresholded at 0.5.

        Only the 4 taps of each sample are gathered from the bool bitmaps, so no float copy of
        the full-image masks is ever made.
        """
        m = _check_mask_size(mask_size, "BitMasks.crop_and_resize")
        box_t = _box_tensor(boxes, len(self), "BitMasks.crop_and_resize")
        n, h, w = self.tensor.shape
        if n == 0 or h == 0 or w == 0:
            return torch.zeros((n, m, m), dtype=torch.bool, device=self.device)
        box_t = box_t.to(device=self.device, dtype=torch.float32)
        cell = (torch.arange(m, device=self.device, dtype=torch.float32) + 0.5) / m  # [M]
        # Continuous image coordinates of the cell centers, minus 0.5 to index pixel centers.
        xs = box_t[:, 0:1] + cell * (box_t[:, 2:3] - box_t[:, 0:1]) - 0.5  # [N, M]
        ys = box_t[:, 1:2] + cell * (box_t[:, 3:4] - box_t[:, 1:2]) - 0.5
        x_idx, x_wt = _taps(xs, w)  # [N, M, 2] each
        y_idx, y_wt = _taps(ys, h)
        n_idx = torch.arange(n, device=self.device)[:, None, None]
        out = torch.zeros((n, m, m), dtype=torch.float32, device=self.device)
        for a in range(2):
            for b in range(2):
                vals = self.tensor[n_idx, y_idx[:, :, a, None], x_idx[:, None, :, b]]  # [N, M, M]
                out += vals * (y_wt[:, :, a, None] * x_wt[:, None, :, b])
        return out >= 0.5


def _taps(coords: torch.Tensor, size: int):
    """Bilinear taps along one axis: indices (clamped, so always valid to gather) and weights
    (zeroed for taps outside ``[0, size)``, i.e. zero padding)."""
    lo = coords.floor()
    frac = coords - lo
    lo = lo.long()
    idx = torch.stack([lo, lo + 1], dim=-1)
    wt = torch.stack([1.0 - frac, frac], dim=-1)
    wt = wt * ((idx >= 0) & (idx < size))
    return idx.clamp(0, max(size - 1, 0)), wt
