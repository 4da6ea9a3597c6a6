"""Non-maximum suppression, drop-in for torchvision.ops.nms / batched_nms."""
import torch
from torch import Tensor

from ._extension import ensure_loaded


def nms(boxes: Tensor, scores: Tensor, iou_threshold: float) -> Tensor:
    """Greedy NMS.

    Args:
        boxes: Tensor[N, 4] of float (x1, y1, x2, y2) boxes, width = x2 - x1.
        scores: Tensor[N] of the boxes' scores.
        iou_threshold: a box is dropped when its IoU with a kept, higher-scoring box is
            strictly greater than this.

    Returns:
        int64 Tensor of the kept boxes' indices, by decreasing score (ties: lower index first).

    A box with a NaN or infinite coordinate is kept and suppresses no other box: its IoU with
    any box is NaN or 0, never above an ``iou_threshold`` >= 0. That is torchvision's CPU
    answer, through the same arithmetic (followed bit for bit for every threshold, negative ones
    included), on the CPU and CUDA alike; such boxes cost no more than others. On the CPU a
    long call stops at Ctrl-C with KeyboardInterrupt (README, "Using the ops").
    """
    if not torch.jit.is_scripting():  # TorchScript cannot read the loader's state
        ensure_loaded()
    return torch.ops.detcore.nms(boxes, scores, float(iou_threshold))


def batched_nms(boxes: Tensor, scores: Tensor, idxs: Tensor, iou_threshold: float) -> Tensor:
    """NMS done independently per category: boxes of different `idxs` never suppress each other.

    Args:
        boxes: Tensor[N, 4] float (x1, y1, x2, y2).
        scores: Tensor[N].
        idxs: Tensor[N] of integer category ids.
        iou_threshold: as in `nms`.

    Returns:
        int64 Tensor of kept indices, by decreasing score.

    Exact per category, NaN and infinite boxes included (kept, suppressing nothing, as in
    `nms`): torchvision's per-category answer. (torchvision's coordinate-offset path, which it
    takes up to 1000 boxes, makes every box NaN when one coordinate is NaN or infinite, and
    keeps them all.)

    Memory on CUDA: NMS there builds a mask of which box suppresses which, a bit per pair. Up to
    5000 boxes (and always for `nms`) it is one mask over all boxes, N * ceil(N / 64) 8-byte
    words: at most 3.2 MB here. Above 5000 boxes (where torchvision's batched_nms changes strategy
    too) only the pairs inside each category are tested and stored: for categories of m boxes
    each, at most the sum of m * ceil(m / 64) words (about m**2 / 16 bytes per category), plus
    O(N) for the sorting. 80 categories of 1000 boxes thus take 5.6 MB instead of 800 MB; one
    category of N boxes still takes about N**2 / 16 bytes. Both ways give the same answer.
    """
    if not torch.jit.is_scripting():  # TorchScript cannot read the loader's state
        ensure_loaded()
    # As torchvision: no boxes, nothing to check about the other arguments. A traced count
    # (symbolic in torch.export, a tensor in torch.jit.trace) is not branched on: the op itself
    # handles the empty case.
    if torch.jit.is_scripting():
        if boxes.numel() == 0:
            return torch.empty((0,), dtype=torch.int64, device=boxes.device)
    elif _is_concrete_zero(boxes.numel()):
        return torch.empty((0,), dtype=torch.int64, device=boxes.device)
    return torch.ops.detcore.batched_nms(boxes, scores, idxs, float(iou_threshold))


def _is_concrete_zero(count) -> bool:
    return type(count) is int and count == 0
