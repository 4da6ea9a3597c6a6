"""The standard training hooks. ``DefaultTrainer.build_hooks`` registers them in this order:

IterationTimer -> LRScheduler -> PeriodicCheckpointer -> EvalHook -> PeriodicWriter -> LossCurvePlotter

(checkpoint before evaluation, so a crash in evaluation does not cost the checkpoint; writers
after evaluation, so evaluation results reach metrics.json in the same write; the plot after
the writers, so it reads what they just wrote).
"""
import datetime
import logging
import math
import os
import time
from typing import Callable, Dict, List, Optional, Sequence

from detcore.utils import comm

from .checkpoint import Checkpointer
from .events import EventWriter, JSONWriter
from .train_loop import HookBase

__all__ = [
    "IterationTimer",
    "LRScheduler",
    "PeriodicCheckpointer",
    "EvalHook",
    "PeriodicWriter",
    "LossCurvePlotter",
    "flatten_results",
]

logger = logging.getLogger(__name__)


class IterationTimer(HookBase):
    """Puts each step's wall time into the storage as "time"; logs the total at the end."""

    def __init__(self):
        self._step_start = 0.0
        self._train_start = 0.0

    def before_train(self) -> None:
        self._train_start = time.perf_counter()

    def before_step(self) -> None:
        self._step_start = time.perf_counter()

    def after_step(self) -> None:
        self.trainer.storage.put_scalar("time", time.perf_counter() - self._step_start)

    def after_train(self) -> None:
        total = time.perf_counter() - self._train_start
        done = self.trainer.iter - self.trainer.start_iter
        if done > 0:
            logger.info(
                "Training time: %s for %d iterations (%.4f s / it, hooks included)",
                datetime.timedelta(seconds=int(total)), done, total / done,
            )


class LRScheduler(HookBase):
    """Records the LR used by the step that just ran, then steps the scheduler (every iteration)."""

    def __init__(self, optimizer, scheduler):
        self.optimizer = optimizer
        self.scheduler = scheduler
        # The group with the most parameters stands for "the" LR (bias groups may be scaled).
        self._group = max(range(len(optimizer.param_groups)), key=lambda i: len(optimizer.param_groups[i]["params"]))

    def after_step(self) -> None:
        lr = self.optimizer.param_groups[self._group]["lr"]
        self.trainer.storage.put_scalar("lr", lr, smoothing_hint=False)
        self.scheduler.step()


class PeriodicCheckpointer(HookBase):
    """Saves ``model_<iter:07d>.pth`` after every ``period``-th iteration and ``model_final.pth``
    when the run completes (never after a failed step). Runs on every rank (saving gathers RNG
    states); rank 0 writes.

    ``before_save``: called first, e.g. to write the iteration's metrics: a run killed right
    after the save resumes after this iteration, and would otherwise never log it."""

    def __init__(self, checkpointer: Checkpointer, period: int, before_save: Optional[Callable[[], None]] = None):
        if period <= 0:
            raise ValueError(f"SOLVER.CHECKPOINT_PERIOD must be > 0, got {period}")
        self.checkpointer = checkpointer
        self.period = period
        self.before_save = before_save

    def after_step(self) -> None:
        it = self.trainer.iter
        if (it + 1) % self.period == 0 and it + 1 < self.trainer.max_iter:
            if self.before_save is not None:
                self.before_save()
            self.checkpointer.save(f"model_{it:07d}", iteration=it)

    def after_train(self) -> None:
        if self.trainer.completed and self.trainer.max_iter > self.trainer.start_iter:
            self.checkpointer.save("model_final", iteration=self.trainer.max_iter - 1)


def flatten_results(results: Dict, prefix: str = "") -> Dict[str, float]:
    """``{"bbox": {"AP": 1.0}}`` -> ``{"bbox/AP": 1.0}`` (any depth)."""
    flat = {}
    for key, value in results.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten_results(value, name + "/"))
        else:
            flat[name] = value
    return flat


class EvalHook(HookBase):
    """Calls ``eval_function()`` (returning nested ``{task: {metric: value}}``) every ``period``
    iterations (0: never periodically) and once when the run completes; puts the finite numbers
    into the storage (so writers record them) and keeps them as ``trainer.last_eval_results``."""

    def __init__(self, period: int, eval_function: Callable[[], Dict], eval_at_end: bool = True):
        if period < 0:
            raise ValueError(f"TEST.EVAL_PERIOD must be >= 0, got {period}")
        self.period = period
        self.eval_function = eval_function
        self.eval_at_end = eval_at_end

    def _do_eval(self) -> None:
        results = self.eval_function() or {}
        flat = flatten_results(results)
        numbers = {}
        for key, value in flat.items():
            try:
                value = float(value)
            except (TypeError, ValueError):
                raise TypeError(f"EvalHook: evaluation result '{key}' is {value!r}, not a number") from None
            if math.isfinite(value):  # NaN (e.g. AP of an empty size bucket) is not valid JSON
                numbers[key] = value
        if numbers:
            self.trainer.storage.put_scalars(**numbers, smoothing_hint=False)
        self.trainer.last_eval_results = results
        # Ranks wait for each other, so none runs ahead into the next step during evaluation.
        comm.synchronize()

    def after_step(self) -> None:
        it = self.trainer.iter
        if self.period > 0 and (it + 1) % self.period == 0 and it + 1 < self.trainer.max_iter:
            self._do_eval()

    def after_train(self) -> None:
        if self.eval_at_end and self.trainer.completed:
            self._do_eval()


class PeriodicWriter(HookBase):
    """Runs the writers every ``period`` iterations, at the last iteration and at the end.
    A ``JSONWriter`` first forgets lines of iterations a resumed run is about to redo."""

    def __init__(self, writers: Sequence[EventWriter], period: int):
        if period <= 0:
            raise ValueError(f"LOG_PERIOD must be > 0, got {period}")
        self.writers: List[EventWriter] = list(writers)
        self.period = period

    def before_train(self) -> None:
        for w in self.writers:
            if isinstance(w, JSONWriter):
                w.drop_from(self.trainer.start_iter)

    def after_step(self) -> None:
        it = self.trainer.iter
        if (it + 1) % self.period == 0 or it == self.trainer.max_iter - 1:
            for w in self.writers:
                w.write()

    def after_train(self) -> None:
        for w in self.writers:
            w.write()
            w.close()


class LossCurvePlotter(HookBase):
    """Draws ``metrics_file``'s loss curves into ``out_png`` every ``period`` iterations (with the
    checkpoints) and when the run completes. A plotting problem is logged, never fatal."""

    def __init__(self, metrics_file: str, out_png: str, period: int):
        self.metrics_file = metrics_file
        self.out_png = out_png
        self.period = period

    def _plot(self) -> None:
        from detcore.utils.plotting import plot_loss_curves

        if not os.path.isfile(self.metrics_file):
            return
        try:
            plot_loss_curves(self.metrics_file, self.out_png)
        except (ValueError, OSError) as e:
            logger.warning("Could not draw the loss curves: %s", e)
            return
        logger.info("Loss curves: %s", self.out_png)

    def after_step(self) -> None:
        it = self.trainer.iter
        if self.period > 0 and (it + 1) % self.period == 0 and it + 1 < self.trainer.max_iter:
            self._plot()

    def after_train(self) -> None:
        if self.trainer.completed:
            self._plot()
