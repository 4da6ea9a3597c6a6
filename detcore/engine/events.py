"""Training metrics: an in-memory ``EventStorage`` and the writers that drain it.

The trainer puts scalars (losses, LR, timings, evaluation results) into the storage under the
current iteration; the ``PeriodicWriter`` hook runs the writers (on rank 0: every LOG_PERIOD
iterations, at checkpoints, after evaluations) and they send what is new to:

- ``JSONWriter``: ``metrics.json``, one JSON object per iteration written
  (``{"iteration": 99, "total_loss": 1.2, "loss_cls": 0.3, ..., "lr": 0.01, "time": 0.4, ...}``);
- ``CommonMetricPrinter``: one log line with ETA, losses, iteration time and LR;
- ``TensorboardWriter``: TensorBoard event files, when the ``tensorboard`` package is importable.

Values a producer marks as noisy (``smoothing_hint=True``, the default: losses, timings) are
written as the median of the last ``window_size`` values; others (LR, AP) as they are.
"""
import datetime
import json
import logging
import os
from collections import defaultdict, deque
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch

from detcore.utils import strict_json

__all__ = [
    "HistoryBuffer",
    "EventStorage",
    "get_event_storage",
    "EventWriter",
    "JSONWriter",
    "CommonMetricPrinter",
    "TensorboardWriter",
]

logger = logging.getLogger(__name__)

_STORAGE_STACK: List["EventStorage"] = []


def get_event_storage() -> "EventStorage":
    """The storage of the innermost ``with EventStorage(...)`` block (the trainer opens one)."""
    if not _STORAGE_STACK:
        raise RuntimeError("get_event_storage() called outside of a `with EventStorage(...)` block")
    return _STORAGE_STACK[-1]


class HistoryBuffer:
    """The last ``max_length`` (value, iteration) pairs of a scalar, plus its all-time mean."""

    def __init__(self, max_length: int = 1000):
        self._data: deque = deque(maxlen=max_length)
        self._count = 0
        self._total = 0.0

    def update(self, value: float, iteration: int) -> None:
        self._data.append((value, iteration))
        self._count += 1
        self._total += value

    def latest(self) -> float:
        return self._data[-1][0]

    def median(self, window: int) -> float:
        return float(np.median([v for v, _ in list(self._data)[-window:]]))

    def avg(self, window: int) -> float:
        return float(np.mean([v for v, _ in list(self._data)[-window:]]))

    def global_avg(self) -> float:
        return self._total / max(self._count, 1)

    def values(self) -> List[Tuple[float, int]]:
        return list(self._data)


class EventStorage:
    """Scalars by name, with their iteration; a context manager that makes itself current."""

    def __init__(self, start_iter: int = 0):
        self.iter = start_iter
        self._history: Dict[str, HistoryBuffer] = defaultdict(HistoryBuffer)
        self._smoothing_hints: Dict[str, bool] = {}
        self._latest: Dict[str, Tuple[float, int]] = {}
        self.num_puts = 0  # grows with every put: tells a writer whether anything came since it ran

    def put_scalar(self, name: str, value, smoothing_hint: bool = True, cur_iter: Optional[int] = None) -> None:
        if isinstance(value, torch.Tensor):
            value = value.detach().item()
        value = float(value)
        it = self.iter if cur_iter is None else int(cur_iter)
        self._history[name].update(value, it)
        self._latest[name] = (value, it)
        self.num_puts += 1
        previous = self._smoothing_hints.setdefault(name, smoothing_hint)
        if previous != smoothing_hint:
            raise ValueError(f"EventStorage: scalar '{name}' was put with smoothing_hint={previous} before")

    def put_scalars(self, *, smoothing_hint: bool = True, cur_iter: Optional[int] = None, **kwargs) -> None:
        for name, value in kwargs.items():
            self.put_scalar(name, value, smoothing_hint=smoothing_hint, cur_iter=cur_iter)

    def history(self, name: str) -> HistoryBuffer:
        if name not in self._history:
            raise KeyError(f"EventStorage: no scalar named '{name}' (have {sorted(self._history)})")
        return self._history[name]

    def has(self, name: str) -> bool:
        return name in self._history

    def latest(self) -> Dict[str, Tuple[float, int]]:
        """``{name: (latest value, its iteration)}``."""
        return dict(self._latest)

    def latest_with_smoothing_hint(self, window_size: int = 20) -> Dict[str, Tuple[float, int]]:
        """Like ``latest`` but noisy scalars as the median of their last ``window_size`` values."""
        out = {}
        for name, (value, it) in self._latest.items():
            if self._smoothing_hints[name]:
                value = self._history[name].median(window_size)
            out[name] = (value, it)
        return out

    def step(self) -> None:
        self.iter += 1

    def __enter__(self) -> "EventStorage":
        _STORAGE_STACK.append(self)
        return self

    def __exit__(self, *exc) -> None:
        assert _STORAGE_STACK[-1] is self
        _STORAGE_STACK.pop()


class EventWriter:
    """Sends the storage's new scalars somewhere. ``resume_from(start_iter)`` is called once
    before training: a writer whose output persists across runs forgets iterations >=
    ``start_iter`` there (a resumed run redoes them)."""

    def resume_from(self, start_iter: int) -> None:
        pass

    def write(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


class JSONWriter(EventWriter):
    """Appends one JSON line per iteration that has new scalars to ``json_file``.

    A scalar is new if its name has not been written for its iteration yet, so values put after
    an iteration's line was written (an evaluation run after an early write) get a line of their
    own for that iteration instead of being dropped. Every line is flushed and fsynced, so a run
    killed at any moment keeps all lines written before (at worst the last line is cut short;
    ``detcore.utils.plotting.read_metrics`` skips it).

    ``records`` holds what the file holds since ``resume_from`` (the lines kept, then the lines
    written), so readers such as the loss-curve plot need not read the file back.
    """

    def __init__(self, json_file: str, window_size: int = 20):
        self._path = json_file
        self._window_size = window_size
        self._kept = set()  # (iteration, name) already in the file from before this run
        self._written: Dict[str, int] = {}  # scalar name -> last iteration written
        self.records: List[dict] = []
        os.makedirs(os.path.dirname(os.path.abspath(json_file)), exist_ok=True)
        self._file = open(json_file, "a", encoding="utf-8")

    @property
    def path(self) -> str:
        return self._path

    def resume_from(self, start_iter: int) -> None:
        """Forget lines of iterations >= ``start_iter`` (and unreadable lines): a resumed run
        redoes those iterations, and their old values would make the curves zigzag."""
        self._file.close()
        kept = []
        with open(self._path, encoding="utf-8") as f:
            for line in f:
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if isinstance(record, dict) and record.get("iteration", -1) < start_iter:
                    kept.append(record)
        tmp = self._path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write("".join(strict_json.dumps(record) + "\n" for record in kept))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self._path)
        self._file = open(self._path, "a", encoding="utf-8")
        self._kept = {(r["iteration"], k) for r in kept if "iteration" in r for k in r if k != "iteration"}
        self._written.clear()
        self.records = kept

    def write(self) -> None:
        storage = get_event_storage()
        by_iter: Dict[int, Dict[str, float]] = defaultdict(dict)
        for name, (value, it) in storage.latest_with_smoothing_hint(self._window_size).items():
            if it > self._written.get(name, -1) and (it, name) not in self._kept:
                by_iter[it][name] = value
        if not by_iter:
            return
        for it in sorted(by_iter):
            record = {"iteration": it, **by_iter[it]}
            self._file.write(strict_json.dumps(record) + "\n")
            self.records.append(record)
            for name in by_iter[it]:
                self._written[name] = it
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        self._file.close()


class CommonMetricPrinter(EventWriter):
    """Logs ``eta  iter  total_loss  loss_*  time  data_time  lr  [max_mem]`` at INFO level, once
    per training iteration at most (the iteration of the latest losses)."""

    def __init__(self, max_iter: int, window_size: int = 20):
        self._max_iter = max_iter
        self._window_size = window_size
        self._logger = logging.getLogger("detcore.engine.train")
        self._last_printed = -1

    def _eta(self, storage: EventStorage, it: int) -> str:
        if not storage.has("time"):
            return "N/A"
        remaining = self._max_iter - it - 1
        seconds = storage.history("time").median(1000) * remaining
        return str(datetime.timedelta(seconds=int(seconds)))

    def write(self) -> None:
        storage = get_event_storage()
        latest = storage.latest()
        it = latest["total_loss"][1] if "total_loss" in latest else storage.iter
        if it >= self._max_iter or it <= self._last_printed:
            return  # nothing trained since the last line (e.g. only an evaluation ran)
        self._last_printed = it
        w = self._window_size
        parts = [f"eta: {self._eta(storage, it)}", f"iter: {it + 1}/{self._max_iter}"]
        losses = sorted((k for k in latest if "loss" in k), key=lambda k: (k != "total_loss", k))
        parts += [f"{k}: {storage.history(k).median(w):.4f}" for k in losses]
        for key in ("time", "data_time"):
            if storage.has(key):
                parts.append(f"{key}: {storage.history(key).avg(w):.4f}")
        if "lr" in latest:
            parts.append(f"lr: {latest['lr'][0]:.6g}")
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            parts.append(f"max_mem: {torch.cuda.max_memory_allocated() / 2**20:.0f}M")
        self._logger.info("  ".join(parts))


class TensorboardWriter(EventWriter):
    """Scalars into TensorBoard event files under ``log_dir``. Build it with ``create``, which
    returns None when the ``tensorboard`` package is missing (it is optional)."""

    def __init__(self, summary_writer, window_size: int = 20):
        self._writer = summary_writer
        self._window_size = window_size
        self._written: Dict[str, int] = {}  # scalar name -> last iteration written

    @classmethod
    def create(cls, log_dir: str, window_size: int = 20) -> Optional["TensorboardWriter"]:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            return None
        return cls(SummaryWriter(log_dir), window_size)

    def write(self) -> None:
        storage = get_event_storage()
        for name, (value, it) in storage.latest_with_smoothing_hint(self._window_size).items():
            if it > self._written.get(name, -1):  # per name: evaluations come after the losses
                self._writer.add_scalar(name, value, it)
                self._written[name] = it

    def close(self) -> None:
        self._writer.close()

