"""Resuming an optimizer and an LR schedule: the checkpoint gives the state, the config the
settings.

A checkpoint's optimizer holds state (SGD's momentum buffers) and settings (each parameter
group's lr, momentum, weight decay...); its schedule holds its position (``last_epoch``) and its
settings (base LRs, steps, gamma, warmup...). torch's ``load_state_dict`` takes both from the
file, so a resumed run silently kept the old LR whatever the command line said. Here the
settings stay those the optimizer and schedule were built with (this run's config) and only the
state and the position come from the checkpoint; the LR of the resumed iteration is then
recomputed from the schedule's closed form. With an unchanged config that is exactly the LR the
uninterrupted run used (the same formula of the same iteration); with a changed one (a lower
SOLVER.BASE_LR after a divergence), it is what the user asked for. Each function returns the
differences, for the caller to report.
"""
from typing import Any, Dict, List

import torch

__all__ = ["load_optimizer_state", "load_scheduler_state"]

# Parts of a parameter group that are not settings: the tensors, and what the schedule sets.
_NOT_SETTINGS = ("params", "lr", "initial_lr")
# Parts of an LR schedule's state that say where it is, not how it is set.
_POSITION = ("last_epoch", "_step_count", "_last_lr", "_get_lr_called_within_step", "_is_initial")


def load_optimizer_state(optimizer: torch.optim.Optimizer, state: Dict[str, Any]) -> List[str]:
    """Load ``state`` (an optimizer ``state_dict``) into ``optimizer`` keeping the settings of its
    parameter groups (all but "params", "lr" and "initial_lr", which the schedule owns). Returns
    "name: checkpoint -> now" for each setting that differs from the checkpoint's."""
    settings = [{k: v for k, v in g.items() if k not in _NOT_SETTINGS} for g in optimizer.param_groups]
    optimizer.load_state_dict(state)
    changes = []
    for i, (group, mine) in enumerate(zip(optimizer.param_groups, settings)):
        for key, value in mine.items():
            if group.get(key) != value:
                changes.append(f"param_groups[{i}].{key}: {group.get(key)!r} -> {value!r}")
            group[key] = value
    return changes


def load_scheduler_state(scheduler: Any, state: Dict[str, Any]) -> List[str]:
    """Move ``scheduler`` (a torch ``LRScheduler``) to the position saved in ``state`` keeping
    its own settings, and set its optimizer's LRs to those of that position. Returns
    "name: checkpoint -> now" for each setting that differs.

    A schedule without a closed form (its LR is only known by stepping from the start) cannot
    keep its settings at another position: it is loaded whole, the checkpoint's settings
    included, and the returned list says so when they differ."""
    mine = scheduler.state_dict()
    changes = [
        f"{key}: {state[key]!r} -> {value!r}"
        for key, value in mine.items()
        if key not in _POSITION and key in state and state[key] != value
    ]
    closed_form = getattr(scheduler, "_get_closed_form_lr", None)
    if closed_form is None:
        scheduler.load_state_dict(state)
        if changes:
            changes.append(f"({type(scheduler).__name__} has no closed form: the checkpoint's settings were kept)")
        return changes
    scheduler.load_state_dict({**mine, **{k: state[k] for k in _POSITION if k in state}})
    optimizer = scheduler.optimizer
    for group, base_lr in zip(optimizer.param_groups, scheduler.base_lrs):
        group["initial_lr"] = base_lr
    lrs = closed_form()
    for group, lr in zip(optimizer.param_groups, lrs):
        group["lr"] = lr
    scheduler._last_lr = [group["lr"] for group in optimizer.param_groups]
    return changes
