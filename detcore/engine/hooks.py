"""The standard training hooks. ``DefaultTrainer.build_hooks`` registers them in this order:

IterationTimer -> LRScheduler -> PeriodicWriter -> PeriodicCheckpointer -> LossCurvePlotter -> EvalHook

The metrics flow one way: hooks put scalars into the trainer's storage; ``PeriodicWriter``, the
only hook that runs writers, drains it into the console, metrics.json and TensorBoard; the loss
curves are drawn from the JSON writer's in-memory records. The writer runs before the
checkpointer and writes at every checkpoint iteration too, so a run killed right after a save
has every iteration it will not redo in metrics.json. Checkpoint before evaluation, so a crash
in evaluation does not cost the checkpoint; what the evaluation put into the storage is written
before the next step starts (``PeriodicWriter.before_step``), or when training ends.
"""
import datetime
import logging
import math
import os
import time
from typing import Callable, Dict, List, Optional, Sequence

from detcore.utils import comm

from .checkpointer import Checkpointer
from .events import EventWriter, JSONWriter
from .train_loop import HookBase, TrainingDiverged

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


def is_checkpoint_iteration(it: int, period: int, max_iter: int) -> bool:
    """Whether a checkpoint is saved after iteration ``it`` (0-based): every ``period``-th, and
    the last one (``model_final``). The writer flushes at the same iterations."""
    return (it + 1) % period == 0 or it == max_iter - 1


class PeriodicCheckpointer(HookBase):
    """Saves ``model_<iter:07d>.pth`` after every ``period``-th iteration and ``model_final.pth``
    after the last one (a step that raised never reaches ``after_step``, so a failed run gets no
    final checkpoint). Runs on every rank (saving gathers RNG states); rank 0 writes.

    ``check_weights()``, when given, runs before each save and raises ``TrainingDiverged`` for
    weights that must not be saved (``SimpleTrainer.check_weights``). When training stops with
    ``TrainingDiverged`` whose bad weights are those of this run's latest save (the step right
    after a checkpoint diverged: resuming from it would meet the same loss on the same batch),
    ``last_checkpoint`` goes back to the checkpoint before (see ``detcore.engine.divergence``)."""

    def __init__(self, checkpointer: Checkpointer, period: int, check_weights: Optional[Callable[[], None]] = None):
        if period <= 0:
            raise ValueError(f"SOLVER.CHECKPOINT_PERIOD must be > 0, got {period}")
        self.checkpointer = checkpointer
        self.period = period
        self.check_weights = check_weights
        self._last_saved_iter: Optional[int] = None

    def _save(self, name: str, it: int) -> None:
        if self.check_weights is not None:
            self.check_weights()
        self.checkpointer.save(name, iteration=it)
        self._last_saved_iter = it

    def after_step(self) -> None:
        it = self.trainer.iter
        if it == self.trainer.max_iter - 1:
            self._save("model_final", it)
        elif is_checkpoint_iteration(it, self.period, self.trainer.max_iter):
            self._save(f"model_{it:07d}", it)

    def after_train(self) -> None:
        failure = self.trainer.failure
        if not isinstance(failure, TrainingDiverged) or failure.bad_weights_iteration != self._last_saved_iter:
            return
        set_aside, now = self.checkpointer.set_aside_last_save()
        if set_aside is not None:
            logger.warning(
                "%s holds the weights that diverged at iteration %d, so last_checkpoint no longer names it (the file "
                "stays): %s", set_aside, self._last_saved_iter + 1,
                f"it names {now}, the last good state" if now else "no checkpoint is left, so --resume starts from the beginning",
            )
        self._last_saved_iter = None


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
    iterations (0: never periodically) and after the last iteration (or, for a resumed run that
    has no iteration left, before training); puts the finite numbers into the storage (so the
    writers record them) and keeps the results as ``trainer.last_eval_results``."""

    def __init__(self, period: int, eval_function: Callable[[], Dict], eval_at_end: bool = True):
        if period < 0:
            raise ValueError(f"TEST.EVAL_PERIOD must be >= 0, got {period}")
        self.period = period
        self.eval_function = eval_function
        self.eval_at_end = eval_at_end

    def _do_eval(self, iteration: int) -> None:
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
            self.trainer.storage.put_scalars(**numbers, smoothing_hint=False, cur_iter=iteration)
        self.trainer.last_eval_results = results
        # Ranks wait for each other, so none runs ahead into the next step during evaluation.
        comm.synchronize()

    def before_train(self) -> None:
        if self.eval_at_end and self.trainer.start_iter >= self.trainer.max_iter:
            # A finished run, resumed: evaluate its final model again. If metrics.json already
            # has that iteration's results the JSON writer leaves them as they are (it never
            # rewrites what the file holds); if the run died in that evaluation, they land now.
            self._do_eval(self.trainer.max_iter - 1)

    def after_step(self) -> None:
        it = self.trainer.iter
        if it == self.trainer.max_iter - 1:
            if self.eval_at_end:
                self._do_eval(it)
        elif self.period > 0 and (it + 1) % self.period == 0:
            self._do_eval(it)


class PeriodicWriter(HookBase):
    """Runs the writers every ``period`` iterations, at every checkpoint iteration (every
    ``checkpoint_period``-th and the last), and when training ends. Before training each writer
    forgets what a resumed run is about to redo (``EventWriter.resume_from``)."""

    def __init__(self, writers: Sequence[EventWriter], period: int, checkpoint_period: int):
        if period <= 0:
            raise ValueError(f"LOG_PERIOD must be > 0, got {period}")
        if checkpoint_period <= 0:
            raise ValueError(f"SOLVER.CHECKPOINT_PERIOD must be > 0, got {checkpoint_period}")
        self.writers: List[EventWriter] = list(writers)
        self.period = period
        self.checkpoint_period = checkpoint_period

    def before_train(self) -> None:
        for w in self.writers:
            w.resume_from(self.trainer.start_iter)
        self._puts_seen = self.trainer.storage.num_puts

    def _write(self) -> None:
        for w in self.writers:
            w.write()
        self._puts_seen = self.trainer.storage.num_puts

    def before_step(self) -> None:
        # Scalars put after this hook ran in the previous iteration (an evaluation's results).
        if self.trainer.storage.num_puts != self._puts_seen:
            self._write()

    def after_step(self) -> None:
        it = self.trainer.iter
        if (it + 1) % self.period == 0 or is_checkpoint_iteration(it, self.checkpoint_period, self.trainer.max_iter):
            self._write()
        self._puts_seen = self.trainer.storage.num_puts

    def after_train(self) -> None:
        for w in self.writers:
            w.write()
            w.close()


class LossCurvePlotter(HookBase):
    """Draws the loss curves of ``json_writer``'s records (what metrics.json holds) into
    ``out_png`` at every checkpoint iteration (every ``period``-th and the last, after the writer
    has written them). A plotting problem is logged, never fatal."""

    def __init__(self, json_writer: JSONWriter, out_png: str, period: int):
        if period <= 0:
            raise ValueError(f"LossCurvePlotter: period (SOLVER.CHECKPOINT_PERIOD) must be > 0, got {period}")
        self.json_writer = json_writer
        self.out_png = out_png
        self.period = period

    def _plot(self) -> None:
        from detcore.utils.plotting import plot_loss_records

        if not self.json_writer.records:
            return
        try:
            plot_loss_records(
                self.json_writer.records,
                self.out_png,
                title=f"Training curves: {os.path.basename(self.json_writer.path)}",
                source=self.json_writer.path,
            )
        except (ValueError, OSError) as e:
            logger.warning("Could not draw the loss curves: %s", e)
            return
        logger.info("Loss curves: %s", self.out_png)

    def after_step(self) -> None:
        if is_checkpoint_iteration(self.trainer.iter, self.period, self.trainer.max_iter):
            self._plot()
