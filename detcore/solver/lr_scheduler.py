"""Iteration-based learning-rate schedules with warmup.

The trainer steps the scheduler once per iteration, after the optimizer step, so the LR used at
iteration ``i`` (0-based) is ``base_lr * warmup(i) * decay(i)``:

- warmup: for ``i < warmup_iters``, "linear" ramps the factor from ``warmup_factor`` at ``i = 0``
  towards 1 (``warmup_factor * (1 - a) + a`` with ``a = i / warmup_iters``); "constant" holds
  ``warmup_factor``; from ``warmup_iters`` on it is 1.
- WarmupMultiStepLR decay: ``gamma ** (number of milestones <= i)``.
- WarmupCosineLR decay: ``0.5 * (1 + cos(pi * i / max_iters))``.

The factor is computed from the iteration alone (not multiplied step by step), so a schedule
restored from a checkpoint lands on exactly the same values.
"""
import bisect
import logging
import math
from typing import List, Optional, Sequence

import torch
from torch.optim.lr_scheduler import LRScheduler
from detcore.config.choices import LR_SCHEDULERS, WARMUP_METHODS

__all__ = ["WarmupMultiStepLR", "WarmupCosineLR", "warmup_factor_at_iter", "build_lr_scheduler"]

logger = logging.getLogger(__name__)

_WARMUP_METHODS = WARMUP_METHODS


def warmup_factor_at_iter(method: str, it: int, warmup_iters: int, warmup_factor: float) -> float:
    """The warmup multiplier at iteration ``it`` (see the module docstring)."""
    if it >= warmup_iters:
        return 1.0
    if method == "constant":
        return warmup_factor
    if method == "linear":
        alpha = it / warmup_iters
        return warmup_factor * (1 - alpha) + alpha
    raise ValueError(f"warmup method must be one of {_WARMUP_METHODS}, got {method!r}")


def _check_warmup(method: str, warmup_iters: int, warmup_factor: float) -> None:
    if method not in _WARMUP_METHODS:
        raise ValueError(f"SOLVER.WARMUP_METHOD must be one of {_WARMUP_METHODS}, got {method!r}")
    if warmup_iters < 0:
        raise ValueError(f"SOLVER.WARMUP_ITERS must be >= 0, got {warmup_iters}")
    if not 0 <= warmup_factor <= 1:
        raise ValueError(f"SOLVER.WARMUP_FACTOR must be in [0, 1], got {warmup_factor}")


class _WarmupSchedule(LRScheduler):
    """The LR is ``base_lr * factor_at(iteration)``; subclasses give the decay, this adds warmup."""

    def __init__(self, optimizer, warmup_factor: float, warmup_iters: int, warmup_method: str, last_epoch: int):
        _check_warmup(warmup_method, warmup_iters, warmup_factor)
        self.warmup_factor = float(warmup_factor)
        self.warmup_iters = int(warmup_iters)
        self.warmup_method = warmup_method
        super().__init__(optimizer, last_epoch)

    def decay_at(self, it: int) -> float:
        raise NotImplementedError

    def factor_at(self, it: int) -> float:
        warmup = warmup_factor_at_iter(self.warmup_method, it, self.warmup_iters, self.warmup_factor)
        return warmup * self.decay_at(it)

    def get_lr(self) -> List[float]:
        factor = self.factor_at(self.last_epoch)
        return [base_lr * factor for base_lr in self.base_lrs]

    def _get_closed_form_lr(self) -> List[float]:
        return self.get_lr()


class WarmupMultiStepLR(_WarmupSchedule):
    """Warmup, then the LR multiplied by ``gamma`` at each milestone iteration."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        milestones: Sequence[int],
        gamma: float = 0.1,
        warmup_factor: float = 0.001,
        warmup_iters: int = 1000,
        warmup_method: str = "linear",
        max_iters: Optional[int] = None,
        last_epoch: int = -1,
    ):
        milestones = [int(m) for m in milestones]
        if milestones != sorted(milestones) or len(set(milestones)) != len(milestones):
            raise ValueError(f"SOLVER.STEPS must be strictly increasing iterations, got {milestones}")
        if max_iters is not None and any(m > max_iters for m in milestones):
            logger.warning("SOLVER.STEPS %s has steps beyond SOLVER.MAX_ITER %d; they never apply", milestones, max_iters)
        self.milestones = milestones
        self.gamma = float(gamma)
        super().__init__(optimizer, warmup_factor, warmup_iters, warmup_method, last_epoch)

    def decay_at(self, it: int) -> float:
        return self.gamma ** bisect.bisect_right(self.milestones, it)


class WarmupCosineLR(_WarmupSchedule):
    """Warmup, then a half cosine from the base LR (iteration 0) to 0 (``max_iters``)."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        max_iters: int,
        warmup_factor: float = 0.001,
        warmup_iters: int = 1000,
        warmup_method: str = "linear",
        last_epoch: int = -1,
    ):
        if max_iters <= 0:
            raise ValueError(f"SOLVER.MAX_ITER must be > 0, got {max_iters}")
        self.max_iters = int(max_iters)
        super().__init__(optimizer, warmup_factor, warmup_iters, warmup_method, last_epoch)

    def decay_at(self, it: int) -> float:
        return 0.5 * (1.0 + math.cos(math.pi * min(it, self.max_iters) / self.max_iters))


def build_lr_scheduler(cfg, optimizer: torch.optim.Optimizer) -> LRScheduler:
    """The schedule named by ``cfg.SOLVER.LR_SCHEDULER_NAME``, to be stepped every iteration."""
    s = cfg.SOLVER
    name = s.LR_SCHEDULER_NAME
    if name == "WarmupMultiStepLR":
        return WarmupMultiStepLR(
            optimizer, s.STEPS, s.GAMMA, s.WARMUP_FACTOR, s.WARMUP_ITERS, s.WARMUP_METHOD, max_iters=s.MAX_ITER
        )
    if name == "WarmupCosineLR":
        return WarmupCosineLR(optimizer, s.MAX_ITER, s.WARMUP_FACTOR, s.WARMUP_ITERS, s.WARMUP_METHOD)
    raise ValueError(
        f"SOLVER.LR_SCHEDULER_NAME: unknown scheduler {name!r}; available: {list(LR_SCHEDULERS)}"
    )
