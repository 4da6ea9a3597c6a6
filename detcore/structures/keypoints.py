"""Keypoints of instances (``[N, K, 3]``: x, y, visibility) and the heatmap coding of Keypoint R-CNN.

Coordinates are continuous, as for boxes: pixel ``j`` covers ``[j, j + 1)``, so the center of
pixel ``(r, c)`` is ``(c + 0.5, r + 0.5)``. (COCO json stores keypoints as pixel indices; the
loader adds 0.5 and the evaluator takes it off again.) Visibility follows COCO: 0 not labeled (x
and y are then 0), 1 labeled but occluded, 2 labeled and visible. Training uses every labeled
point (v > 0), as COCO's evaluation does.

The heatmap coding is the one of Detectron, detectron2, maskrcnn-benchmark and torchvision, so
their weights predict the same points here. A box is cut into S x S cells; a keypoint is
the index of the cell it falls in (``floor((x - x1) * S / w)``; a point on the right or bottom
edge goes to the last cell). Decoding resizes each box's S x S logits bicubically to the box's own
size in pixels (rounded up), takes the best pixel of each map, and returns that pixel's center
(Heckbert's "c = d + 0.5"): sub-pixel positions without a learned offset.
"""
import numbers
from typing import Dict, List, Sequence, Tuple, Union

import numpy as np
import torch
import torch.nn.functional as F

from .boxes import Boxes

__all__ = ["Keypoints", "keypoints_to_heatmap", "heatmaps_to_keypoints", "flip_indices", "swap_flip_pairs"]


def _as_keypoint_tensor(keypoints, where: str) -> torch.Tensor:
    t = keypoints if isinstance(keypoints, torch.Tensor) else torch.as_tensor(np.asarray(keypoints, dtype=np.float32))
    if not t.is_floating_point():
        t = t.to(torch.float32)
    if t.dim() != 3 or t.shape[2] != 3:
        raise ValueError(f"{where}: keypoints must have shape [N, K, 3] (x, y, visibility), got {tuple(t.shape)}")
    return t


class Keypoints:
    """N instances' K keypoints as one ``[N, K, 3]`` float tensor (``.tensor``): x, y, v.

    Indexing keeps the type (an int gives one instance, shape ``[1, K, 3]``), so an ``Instances``
    holding ``gt_keypoints`` can be sliced and matched like its boxes.
    """

    def __init__(self, tensor):
        self.tensor = _as_keypoint_tensor(tensor, "Keypoints")

    def __len__(self) -> int:
        return self.tensor.shape[0]

    @property
    def num_keypoints(self) -> int:
        return self.tensor.shape[1]

    def __getitem__(self, item) -> "Keypoints":
        if isinstance(item, numbers.Integral):
            return Keypoints(self.tensor[int(item)][None])
        selected = self.tensor[item]
        if selected.dim() != 3:
            raise IndexError(f"Keypoints: indexing with {item!r} did not give an [N, K, 3] tensor")
        return Keypoints(selected)

    def __repr__(self) -> str:
        return f"Keypoints(num_instances={len(self)}, num_keypoints={self.num_keypoints})"

    @classmethod
    def cat(cls, keypoints_list: Sequence["Keypoints"]) -> "Keypoints":
        if not isinstance(keypoints_list, (list, tuple)) or not keypoints_list:
            raise ValueError("Keypoints.cat: expected a non-empty list of Keypoints")
        for k in keypoints_list:
            if not isinstance(k, Keypoints):
                raise TypeError(f"Keypoints.cat: every element must be Keypoints, got {type(k).__name__}")
        counts = {k.num_keypoints for k in keypoints_list}
        if len(counts) != 1:
            raise ValueError(f"Keypoints.cat: the elements have different keypoint counts {sorted(counts)}")
        return cls(torch.cat([k.tensor for k in keypoints_list], dim=0))

    def to(self, *args, **kwargs) -> "Keypoints":
        return Keypoints(self.tensor.to(*args, **kwargs))

    @property
    def device(self) -> torch.device:
        return self.tensor.device

    def visible(self) -> torch.Tensor:
        """``[N, K]`` bool: the labeled points (v > 0)."""
        return self.tensor[..., 2] > 0

    def scale(self, scale_x: float, scale_y: float) -> "Keypoints":
        """Multiply x by ``scale_x`` and y by ``scale_y`` in place (a resize of the image)."""
        self.tensor[..., 0] *= scale_x
        self.tensor[..., 1] *= scale_y
        return self

    def hflip(self, width: float, flip_indices: Sequence[int]) -> "Keypoints":
        """The keypoints of the image mirrored left-right (``x -> width - x``), with every point
        renamed to its mirror partner (see ``swap_flip_pairs``): a new object."""
        t = self.tensor.clone()
        t[..., 0] = torch.where(t[..., 2] > 0, width - t[..., 0], t[..., 0])
        return Keypoints(swap_flip_pairs(t, flip_indices))

    def to_heatmap(self, boxes, heatmap_size: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """The heatmap targets of these keypoints in ``boxes`` (one box per instance); see
        ``keypoints_to_heatmap``."""
        return keypoints_to_heatmap(self.tensor, boxes, heatmap_size)


def flip_indices(names: Sequence[str], flip_map: Sequence[Tuple[str, str]]) -> List[int]:
    """``[K]`` indices such that point ``i`` of a mirrored instance is point ``flip_indices[i]`` of
    the original: each name of a ``flip_map`` pair (e.g. ("left_eye", "right_eye")) takes its
    partner's index, unpaired points (e.g. "nose") keep their own."""
    names = list(names)
    index = {n: i for i, n in enumerate(names)}
    if len(index) != len(names):
        raise ValueError(f"flip_indices: keypoint names must be unique, got {names}")
    partner: Dict[str, str] = {}
    for pair in flip_map:
        if len(pair) != 2:
            raise ValueError(f"flip_indices: every flip_map entry must be a (left, right) pair of names, got {pair!r}")
        a, b = pair
        for n in (a, b):
            if n not in index:
                raise ValueError(f"flip_indices: flip_map names '{n}', which is not a keypoint name {names}")
            if n in partner:
                raise ValueError(f"flip_indices: keypoint '{n}' is in more than one flip_map pair")
        partner[a], partner[b] = b, a
    return [index[partner.get(n, n)] for n in names]


def swap_flip_pairs(keypoints: torch.Tensor, flip_indices: Sequence[int]) -> torch.Tensor:
    """The left/right swap a mirror image needs: ``[N, K, 3]`` keypoints reordered so that each
    left point takes its right partner's row and vice versa (coordinates are not changed: the
    geometric flip is the transform's job)."""
    idx = torch.as_tensor(list(flip_indices), dtype=torch.long, device=keypoints.device)
    if idx.numel() != keypoints.shape[1] or sorted(idx.tolist()) != list(range(keypoints.shape[1])):
        raise ValueError(
            f"swap_flip_pairs: flip_indices must be a permutation of 0..{keypoints.shape[1] - 1}, got {list(flip_indices)}"
        )
    return keypoints[:, idx]


def _roi_tensor(rois: Union[Boxes, torch.Tensor], n: int, where: str) -> torch.Tensor:
    t = rois.tensor if isinstance(rois, Boxes) else rois
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{where}: rois must be Boxes or an [N, 4] tensor, got {type(rois).__name__}")
    if t.numel() == 0:
        t = t.reshape(0, 4)
    if t.dim() != 2 or t.shape[1] != 4 or t.shape[0] != n:
        raise ValueError(f"{where}: rois must have shape [{n}, 4] (one xyxy box per instance), got {tuple(t.shape)}")
    return t


def keypoints_to_heatmap(
    keypoints: torch.Tensor, rois: Union[Boxes, torch.Tensor], heatmap_size: int
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Training targets of the keypoint head: for each instance and keypoint, the index of the
    heatmap cell holding it.

    Args:
        keypoints: ``[N, K, 3]`` (x, y, v) in image coordinates.
        rois: ``[N, 4]`` xyxy boxes, one per instance (the ROIs the head sees).
        heatmap_size: S, the side of the square heatmap.

    Returns:
        ``(targets, valid)``: int64 ``[N, K]`` indices ``row * S + col`` in ``[0, S*S)`` (0 where
        not valid), and bool ``[N, K]``: labeled (v > 0) and inside the ROI (its right and bottom
        edges included, in the last cell).
    """
    keypoints = _as_keypoint_tensor(keypoints, "keypoints_to_heatmap")
    if not isinstance(heatmap_size, numbers.Integral) or heatmap_size <= 0:
        raise ValueError(f"keypoints_to_heatmap: heatmap_size must be a positive int, got {heatmap_size!r}")
    rois = _roi_tensor(rois, keypoints.shape[0], "keypoints_to_heatmap").to(keypoints)
    x1, y1, x2, y2 = (rois[:, i : i + 1] for i in range(4))
    x, y = keypoints[..., 0], keypoints[..., 1]
    # Multiply by S / w (not divide by w / S): the same float rounding as the reference codes.
    col = ((x - x1) * (heatmap_size / (x2 - x1))).floor().long()
    row = ((y - y1) * (heatmap_size / (y2 - y1))).floor().long()
    # A point exactly on the right / bottom edge belongs to the box: the last cell.
    col[x == x2] = heatmap_size - 1
    row[y == y2] = heatmap_size - 1
    inside = (col >= 0) & (row >= 0) & (col < heatmap_size) & (row < heatmap_size)
    valid = inside & (keypoints[..., 2] > 0)
    targets = torch.where(valid, row * heatmap_size + col, torch.zeros_like(col))
    return targets, valid


def heatmaps_to_keypoints(maps: torch.Tensor, rois: Union[Boxes, torch.Tensor]) -> torch.Tensor:
    """Keypoints of the head's heatmap logits, in the coordinates of ``rois``.

    Args:
        maps: ``[R, K, S, S]`` logits, one set per ROI.
        rois: ``[R, 4]`` xyxy boxes the maps were predicted in.

    Returns:
        float32 ``[R, K, 3]``: x, y and the score, the (bicubically resized) logit at the chosen
        pixel; torchvision calls it ``keypoints_scores``, Detectron the keypoint's logit.
    """
    if maps.dim() != 4 or maps.shape[2] != maps.shape[3]:
        raise ValueError(f"heatmaps_to_keypoints: maps must be [R, K, S, S], got {tuple(maps.shape)}")
    rois = _roi_tensor(rois, maps.shape[0], "heatmaps_to_keypoints").to(device=maps.device, dtype=torch.float32)
    maps = maps.to(torch.float32)
    num_rois, num_keypoints = maps.shape[:2]
    out = torch.zeros((num_rois, num_keypoints, 3), dtype=torch.float32, device=maps.device)
    if num_rois == 0:
        return out
    widths = (rois[:, 2] - rois[:, 0]).clamp(min=1)
    heights = (rois[:, 3] - rois[:, 1]).clamp(min=1)
    widths_ceil, heights_ceil = widths.ceil(), heights.ceil()
    keypoint_index = torch.arange(num_keypoints, device=maps.device)
    for i in range(num_rois):
        # Each box's maps at the box's own pixel size: the argmax is then a pixel of the image.
        out_w, out_h = int(widths_ceil[i]), int(heights_ceil[i])
        roi_map = F.interpolate(maps[i][:, None], size=(out_h, out_w), mode="bicubic", align_corners=False)[:, 0]
        pos = roi_map.reshape(num_keypoints, -1).argmax(dim=1)
        col = pos % out_w
        row = torch.div(pos - col, out_w, rounding_mode="floor")
        # The pixel's center, scaled back from the rounded-up size to the box's true size.
        out[i, :, 0] = (col.float() + 0.5) * (widths[i] / out_w) + rois[i, 0]
        out[i, :, 1] = (row.float() + 0.5) * (heights[i] / out_h) + rois[i, 1]
        out[i, :, 2] = roi_map[keypoint_index, row, col]
    return out
