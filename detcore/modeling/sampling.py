"""Balanced sampling of positive and negative training examples (anchors or proposals)."""
from typing import Tuple

import torch

__all__ = ["subsample_labels"]


def subsample_labels(
    labels: torch.Tensor, num_samples: int, positive_fraction: float, bg_label: int
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Pick at most ``num_samples`` examples, of which at most ``positive_fraction`` are positive;
    when positives run short the remainder is filled with negatives.

    Args:
        labels: int ``[N]``; ``-1`` ignore, ``bg_label`` negative, any other value >= 0 positive.
        num_samples: total examples to return (fewer when there are not enough).
        positive_fraction: the largest share of positives, in ``[0, 1]``.
        bg_label: the label of negatives (0 for the RPN, NUM_CLASSES for the ROI heads).

    Returns:
        ``(pos_idx, neg_idx)``: int64 indices into ``labels``, chosen uniformly at random
        (``torch.randperm``, so ``torch.manual_seed`` makes them reproducible).
    """
    if not isinstance(labels, torch.Tensor) or labels.dim() != 1:
        shape = tuple(labels.shape) if isinstance(labels, torch.Tensor) else type(labels).__name__
        raise ValueError(f"subsample_labels: labels must be a 1-D int Tensor[N], got {shape}")
    if labels.is_floating_point():
        raise TypeError(f"subsample_labels: labels must be an integer tensor, got {labels.dtype}")
    if not 0.0 <= positive_fraction <= 1.0:
        raise ValueError(f"subsample_labels: positive_fraction must lie in [0, 1], got {positive_fraction}")
    if num_samples < 0:
        raise ValueError(f"subsample_labels: num_samples must be >= 0, got {num_samples}")

    positive = torch.nonzero((labels != -1) & (labels != bg_label), as_tuple=True)[0]
    negative = torch.nonzero(labels == bg_label, as_tuple=True)[0]

    num_pos = min(int(num_samples * positive_fraction), positive.numel())
    num_neg = min(num_samples - num_pos, negative.numel())

    # randperm on the labels' device: no host round trip on GPU.
    perm_pos = torch.randperm(positive.numel(), device=labels.device)[:num_pos]
    perm_neg = torch.randperm(negative.numel(), device=labels.device)[:num_neg]
    return positive[perm_pos], negative[perm_neg]
