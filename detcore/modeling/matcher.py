"""Matcher: assigns every prediction (anchor or proposal) to a ground-truth box and labels it.

Each prediction takes the ground truth it overlaps most; the size of that overlap decides its label
through a list of thresholds, e.g. thresholds ``[0.3, 0.7]`` with labels ``[0, -1, 1]``:

    IoU < 0.3 -> 0 (negative),  0.3 <= IoU < 0.7 -> -1 (ignored),  IoU >= 0.7 -> 1 (positive)
"""
import math
from typing import List, Sequence, Tuple

import torch

__all__ = ["Matcher"]


class Matcher:
    """Args:
        thresholds: increasing IoU cut points; interval ``[t_{i-1}, t_i)`` gets ``labels[i]``.
        labels: ``len(thresholds) + 1`` values from ``{-1, 0, 1}`` (ignore, negative, positive).
        allow_low_quality_matches: also make positive, for each ground truth, the predictions
            that overlap it most (ties included), so that a ground truth no prediction reaches
            the top threshold for still gets trained on (Faster R-CNN's RPN rule).
    """

    def __init__(self, thresholds: Sequence[float], labels: Sequence[int], allow_low_quality_matches: bool = False):
        thresholds = [float(t) for t in thresholds]
        labels = [int(lab) for lab in labels]
        if any(a > b for a, b in zip(thresholds[:-1], thresholds[1:])):
            raise ValueError(f"Matcher: thresholds must be increasing, got {thresholds}")
        if len(labels) != len(thresholds) + 1:
            raise ValueError(
                f"Matcher: need len(thresholds) + 1 = {len(thresholds) + 1} labels, got {len(labels)} ({labels})"
            )
        if any(lab not in (-1, 0, 1) for lab in labels):
            raise ValueError(f"Matcher: labels must be -1, 0 or 1, got {labels}")
        # Sentinels make every interval closed on both sides, so all scores get a label.
        self.thresholds: List[float] = [-math.inf] + thresholds + [math.inf]
        self.labels: List[int] = labels
        self.allow_low_quality_matches = bool(allow_low_quality_matches)

    def __call__(self, match_quality_matrix: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """Args:
            match_quality_matrix: ``[M, N]`` pairwise quality (IoU) of M ground truths with N
                predictions.

        Returns:
            matches: int64 ``[N]``, the index of the matched ground truth (0 when M == 0).
            match_labels: int8 ``[N]``, each prediction's label from ``labels``.
        """
        if not isinstance(match_quality_matrix, torch.Tensor) or match_quality_matrix.dim() != 2:
            shape = (
                tuple(match_quality_matrix.shape)
                if isinstance(match_quality_matrix, torch.Tensor)
                else type(match_quality_matrix).__name__
            )
            raise ValueError(f"Matcher: match_quality_matrix must be [M ground truths, N predictions], got {shape}")
        num_gt, num_pred = match_quality_matrix.shape
        device = match_quality_matrix.device
        if num_gt == 0:
            # Nothing to match: everything is background (labels[0]).
            matches = torch.zeros(num_pred, dtype=torch.int64, device=device)
            match_labels = torch.full((num_pred,), self.labels[0], dtype=torch.int8, device=device)
            return matches, match_labels
        if num_pred == 0:
            empty = torch.empty(0, dtype=torch.int64, device=device)
            return empty, empty.to(torch.int8)

        matched_vals, matches = match_quality_matrix.max(dim=0)
        match_labels = torch.empty(num_pred, dtype=torch.int8, device=device)
        for label, low, high in zip(self.labels, self.thresholds[:-1], self.thresholds[1:]):
            in_interval = (matched_vals >= low) & (matched_vals < high)
            match_labels[in_interval] = label

        if self.allow_low_quality_matches:
            self._set_low_quality_matches(match_labels, match_quality_matrix)
        return matches, match_labels

    @staticmethod
    def _set_low_quality_matches(match_labels: torch.Tensor, match_quality_matrix: torch.Tensor) -> None:
        # For every ground truth, the predictions reaching its best quality (all of them on ties).
        # The prediction keeps its own argmax ground truth in `matches`, as in Detectron.
        best_per_gt = match_quality_matrix.max(dim=1, keepdim=True).values
        # A ground truth that overlaps nothing (best 0) would otherwise make every prediction with
        # quality 0 positive; skip it.
        is_best = (match_quality_matrix == best_per_gt) & (best_per_gt > 0)
        match_labels[is_best.any(dim=0)] = 1
