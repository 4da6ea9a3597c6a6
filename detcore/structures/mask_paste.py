"""Paste the mask head's ``M x M`` probabilities back into full-image boolean masks.

Two geometries:

* ``mode="aligned"`` (default), the inverse of ``crop_and_resize``: image pixel ``(r, c)`` has
  its center at ``(c + 0.5, r + 0.5)``; when that point lies in the box (``x1 <= c + 0.5 < x2``,
  same for y) it maps to mask coordinate ``(c + 0.5 - x1) * M / (x2 - x1)`` (and likewise in y),
  where mask cell ``j`` has its center at ``j + 0.5``; the mask is sampled there bilinearly, with
  samples past the outer cell centers taking the edge cell's value. Pixels outside the box are 0.
* ``mode="torchvision"`` reproduces ``torchvision.models.detection.roi_heads.paste_masks_in_image``:
  the mask is padded by one zero cell on each side, the box grown by ``(M + 2) / M`` about its
  center and truncated to integers ``(bx1, by1, bx2, by2)``, the padded mask resized with bilinear
  ``interpolate(align_corners=False)`` to ``(by2 - by1 + 1) x (bx2 - bx1 + 1)`` and written at
  ``(by1, bx1)``, clipped to the image.

How it is vectorized: bilinear resampling is separable, so a mask's pasted values over a block
of rows ``R`` and columns ``C`` are ``Wy @ mask @ Wx.T`` with ``Wy: [R, M]`` and ``Wx: [C, M]`` the
per-axis interpolation weights (two non-zeros a row; all-zero rows for pixels outside the box).
Each mask only needs the block covering its box, so masks are sorted by block size and batched
into chunks whose blocks share one padded size (bounded to ~1 GB of float32 per chunk, and to
at most ~2x the real block area); each chunk is two batched matmuls and one threshold, then one
rectangle copy per mask into the output. There is no Python loop over pixels. (On a GPU with
TF32 matmuls enabled, only pixels within ~1e-3 of the threshold can flip.)

Its speed against torchvision's per-mask loop: docs/benchmarks.md, "Figures behind code choices".
"""
from typing import List, Tuple, Union

import torch
import torch.nn.functional as F
from detcore.config.choices import MASK_PASTE_MODES
from detcore.layers.autocast import full_precision

from .boxes import Boxes

__all__ = ["paste_masks_in_image"]

# Largest float32 block (masks x rows x cols) computed at once: 2**28 floats = 1 GiB.
_CHUNK_FLOATS = 1 << 28
# Small blocks are grouped even when padding them costs more than 2x (launch overhead dominates).
_MIN_BLOCK_AREA = 64 * 64


def paste_masks_in_image(
    masks: torch.Tensor,
    boxes: Union[Boxes, torch.Tensor],
    image_size: Tuple[int, int],
    threshold: float = 0.5,
    mode: str = "aligned",
) -> torch.Tensor:
    """Paste ``masks`` (``[N, M, M]`` or ``[N, 1, M, M]`` float probabilities) into ``boxes``
    (``[N, 4]`` xyxy, image coordinates) on an image of ``image_size = (h, w)``.

    Returns ``[N, h, w]`` bool on ``masks``' device: ``pasted_probability >= threshold``.
    """
    if mode not in MASK_PASTE_MODES:
        raise ValueError(f"paste_masks_in_image: mode must be one of {list(MASK_PASTE_MODES)}, got {mode!r}")
    if not isinstance(masks, torch.Tensor):
        raise TypeError(f"paste_masks_in_image: masks must be a tensor, got {type(masks).__name__}")
    if masks.dim() == 4 and masks.shape[1] == 1:
        masks = masks[:, 0]
    if masks.dim() != 3 or masks.shape[1] != masks.shape[2] or not masks.is_floating_point():
        raise ValueError(
            "paste_masks_in_image: masks must be float [N, M, M] or [N, 1, M, M], got "
            f"{masks.dtype} {tuple(masks.shape)}"
        )
    box_t = boxes.tensor if isinstance(boxes, Boxes) else boxes
    if not isinstance(box_t, torch.Tensor) or box_t.dim() != 2 or box_t.shape != (masks.shape[0], 4):
        shape = tuple(box_t.shape) if isinstance(box_t, torch.Tensor) else type(box_t).__name__
        raise ValueError(f"paste_masks_in_image: boxes must be [{masks.shape[0]}, 4] (one per mask), got {shape}")
    if len(image_size) != 2:
        raise ValueError(f"paste_masks_in_image: image_size must be (h, w), got {image_size!r}")
    height, width = int(image_size[0]), int(image_size[1])

    device = masks.device
    n = masks.shape[0]
    out = torch.zeros((n, height, width), dtype=torch.bool, device=device)
    if n == 0 or height == 0 or width == 0:
        return out
    # detach: the output is bool, a graph through the matmuls would only hold memory.
    masks = masks.detach().to(torch.float32)
    box_t = box_t.detach().to(device=device, dtype=torch.float32)

    if mode == "aligned":
        axes = [_AlignedAxis(box_t[:, 0], box_t[:, 2], masks.shape[-1], width),
                _AlignedAxis(box_t[:, 1], box_t[:, 3], masks.shape[-1], height)]
    else:
        masks = F.pad(masks, (1, 1, 1, 1))
        int_boxes = _torchvision_int_boxes(box_t, masks.shape[-1])
        axes = [_TorchvisionAxis(int_boxes[:, 0], int_boxes[:, 2], masks.shape[-1], width),
                _TorchvisionAxis(int_boxes[:, 1], int_boxes[:, 3], masks.shape[-1], height)]
    x_axis, y_axis = axes

    # The only host sync: block bounds are needed to size the chunks and place the blocks.
    bounds = torch.stack([x_axis.start, x_axis.stop, y_axis.start, y_axis.stop], dim=1).cpu()
    cols = (bounds[:, 1] - bounds[:, 0]).clamp(min=0).tolist()
    rows = (bounds[:, 3] - bounds[:, 2]).clamp(min=0).tolist()
    x_start, y_start = bounds[:, 0].tolist(), bounds[:, 2].tolist()
    for index, n_rows, n_cols in _plan_chunks(rows, cols):
        # Shift blocks that would overhang the image back inside: the extra pixels belong to
        # the same mask and come out 0 (outside its box), so each block is a plain sub-rectangle.
        y0 = [min(y_start[i], height - n_rows) for i in index]
        x0 = [min(x_start[i], width - n_cols) for i in index]
        idx = torch.tensor(index, device=device)
        ys = torch.tensor(y0, device=device)[:, None] + torch.arange(n_rows, device=device)  # [c, R]
        xs = torch.tensor(x0, device=device)[:, None] + torch.arange(n_cols, device=device)  # [c, C]
        wy = y_axis.weights(idx, ys)  # [c, R, P]
        wx = x_axis.weights(idx, xs)  # [c, C, P]
        # float32 even under bfloat16 autocast (TEST.PRECISION): bfloat16 matmuls moved the
        # blended values of edge pixels across the threshold (see detcore/layers/autocast.py).
        with full_precision(device):
            block = torch.bmm(torch.bmm(wy, masks[idx]), wx.transpose(1, 2)) >= threshold  # [c, R, C]
        # One rectangle copy per mask: on the CPU far faster than one indexed write of the chunk.
        for k, i in enumerate(index):
            out[i, y0[k] : y0[k] + n_rows, x0[k] : x0[k] + n_cols] = block[k]
    return out


def _plan_chunks(rows: List[int], cols: List[int]) -> List[Tuple[List[int], int, int]]:
    """Group masks (largest block first) into chunks of (indices, padded rows, padded cols)."""
    order = sorted(range(len(rows)), key=lambda i: rows[i] * cols[i], reverse=True)
    chunks, current, cur_r, cur_c = [], [], 0, 0
    for i in order:
        area = rows[i] * cols[i]
        if area == 0:
            continue  # box misses the image: its output stays all False
        new_r, new_c = max(cur_r, rows[i]), max(cur_c, cols[i])
        too_big = (len(current) + 1) * new_r * new_c > _CHUNK_FLOATS
        too_padded = new_r * new_c > 2 * max(area, _MIN_BLOCK_AREA)
        if current and (too_big or too_padded):
            chunks.append((current, cur_r, cur_c))
            current, new_r, new_c = [], rows[i], cols[i]
        current.append(i)
        cur_r, cur_c = new_r, new_c
    if current:
        chunks.append((current, cur_r, cur_c))
    return chunks


def _interp_matrix(src: torch.Tensor, valid: torch.Tensor, size: int) -> torch.Tensor:
    """``[c, L, size]`` bilinear weights sampling a length-``size`` axis at ``src`` (in
    ``[0, size - 1]``, cell centers at integers); rows where ``valid`` is False are zero."""
    # Invalid entries may hold anything (NaN from a broken box); park them on cell 0, then zero.
    src = torch.where(valid, src, torch.zeros_like(src))
    lo = src.floor().clamp(0, size - 1)
    frac = src - lo
    lo = lo.long()
    hi = (lo + 1).clamp(max=size - 1)
    mat = torch.zeros(src.shape + (size,), dtype=src.dtype, device=src.device)
    mat.scatter_add_(2, lo[..., None], (1.0 - frac)[..., None])
    mat.scatter_add_(2, hi[..., None], frac[..., None])
    return mat * valid[..., None].to(mat.dtype)


class _AlignedAxis:
    """One axis of the aligned geometry: box ``[lo, hi)`` in pixels, ``m`` mask cells."""

    def __init__(self, lo: torch.Tensor, hi: torch.Tensor, m: int, size: int):
        self.lo, self.hi, self.m = lo, hi, m
        # A superset of the pixels whose center is in [lo, hi); the exact test is in weights().
        # nan_to_num keeps the int conversion defined for broken boxes (they paste nothing).
        lo_px = torch.nan_to_num(lo - 0.5, nan=0.0).clamp(-1, size + 1).floor().long()
        hi_px = torch.nan_to_num(hi - 0.5, nan=0.0).clamp(-1, size + 1).ceil().long() + 1
        self.start = lo_px.clamp(0, size)
        self.stop = hi_px.clamp(0, size)

    def weights(self, idx: torch.Tensor, pixels: torch.Tensor) -> torch.Tensor:
        lo, hi = self.lo[idx, None], self.hi[idx, None]
        centers = pixels.to(torch.float32) + 0.5
        valid = (centers >= lo) & (centers < hi)
        # Tiny widths only occur with valid == False everywhere; the clamp just avoids inf * 0.
        src = (centers - lo) * (self.m / (hi - lo).clamp(min=1e-6)) - 0.5
        return _interp_matrix(src.clamp(0, self.m - 1), valid, self.m)


def _torchvision_int_boxes(boxes: torch.Tensor, padded_size: int) -> torch.Tensor:
    """torchvision's ``expand_boxes`` then ``.to(int64)``, with the same float32 operations so
    the truncated integers match bit for bit."""
    m = padded_size - 2
    scale = float(padded_size) / m
    w_half = (boxes[:, 2] - boxes[:, 0]) * 0.5
    h_half = (boxes[:, 3] - boxes[:, 1]) * 0.5
    x_c = (boxes[:, 2] + boxes[:, 0]) * 0.5
    y_c = (boxes[:, 3] + boxes[:, 1]) * 0.5
    w_half = w_half * scale
    h_half = h_half * scale
    expanded = torch.stack([x_c - w_half, y_c - h_half, x_c + w_half, y_c + h_half], dim=1)
    # Broken (NaN / inf) boxes become boxes far outside the image instead of undefined integers.
    expanded = torch.nan_to_num(expanded, nan=-1e9, posinf=1e9, neginf=-1e9).clamp(-1e9, 1e9)
    return expanded.to(torch.int64)  # truncation toward zero, as torchvision does


class _TorchvisionAxis:
    """One axis of torchvision's geometry: integer box ``[lo, hi]`` (inclusive), padded mask of
    ``p`` cells resized to ``max(hi - lo + 1, 1)`` pixels."""

    def __init__(self, lo: torch.Tensor, hi: torch.Tensor, p: int, size: int):
        self.lo, self.hi, self.p = lo, hi, p
        self.length = (hi - lo + 1).clamp(min=1)
        self.start = lo.clamp(0, size)
        self.stop = (hi + 1).clamp(0, size)

    def weights(self, idx: torch.Tensor, pixels: torch.Tensor) -> torch.Tensor:
        lo, hi = self.lo[idx, None], self.hi[idx, None]
        valid = (pixels >= lo) & (pixels <= hi)
        # interpolate(align_corners=False): src = (in / out) * (dst + 0.5) - 0.5, floored at 0,
        # in float32 like the CPU/CUDA kernels; in / out is a true division (``float / tensor``
        # would multiply by a reciprocal and round differently).
        length = self.length[idx, None].to(torch.float32)
        scale = torch.full_like(length, float(self.p)) / length
        dst = (pixels - lo).to(torch.float32)
        src = (scale * (dst + 0.5) - 0.5).clamp(0, self.p - 1)
        return _interp_matrix(src, valid, self.p)
