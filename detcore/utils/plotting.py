"""Charts as PNG files, drawn by matplotlib on its Agg canvas (no window, no pyplot state).

Every chart detcore draws goes through ``new_figure`` and ``save_figure`` here: the loss and
learning-rate curves of a training run's ``metrics.json`` (``plot_loss_curves``), one metric of
several runs side by side (``plot_runs_compared``), and the evaluation pictures
(``detcore.evaluation.pictures``).
"""
import json
import logging
import math
import os
from typing import List, Optional, Sequence, Tuple

import numpy as np

__all__ = [
    "read_metrics", "plot_loss_curves", "plot_loss_records", "plot_runs_compared", "new_figure", "save_figure",
    "PALETTE",
]

logger = logging.getLogger(__name__)

# Line colours (matplotlib's "tab10"): distinct on white, the first for the curve that matters most.
PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"]

Series = Tuple[str, np.ndarray, np.ndarray]  # (name, iterations, values)


def new_figure(width: float, height: float, dpi: int = 100, layout: Optional[str] = None):
    """A matplotlib ``Figure`` of ``width`` x ``height`` inches on an Agg canvas. Built without
    pyplot, so nothing needs a display and no figure is kept alive by a global registry.
    ``layout``: matplotlib's layout engine ("constrained", "tight") or None."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=dpi, layout=layout)
    FigureCanvasAgg(fig)
    return fig


def save_figure(fig, out_png: str) -> str:
    """Write ``fig`` to ``out_png`` (its folder is created); returns the path."""
    folder = os.path.dirname(os.path.abspath(out_png))
    os.makedirs(folder, exist_ok=True)
    fig.savefig(out_png, facecolor="white")
    return out_png


def read_metrics(path: str) -> List[dict]:
    """The JSON objects of a JSON-lines file; lines that do not parse are skipped with a warning
    (a run killed mid-write leaves a truncated last line)."""
    records, bad = [], 0
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                bad += 1
                continue
            if isinstance(record, dict):
                records.append(record)
            else:
                bad += 1
    if bad:
        logger.warning("read_metrics: skipped %d unreadable line(s) of %s", bad, path)
    return records


def _series(records: List[dict], key: str) -> Optional[Series]:
    pts = [
        (float(r["iteration"]), float(r[key]))
        for r in records
        if "iteration" in r and isinstance(r.get(key), (int, float)) and math.isfinite(r[key])
    ]
    if not pts:
        return None
    pts.sort(key=lambda p: p[0])
    xs, ys = zip(*pts)
    return key, np.asarray(xs), np.asarray(ys)


def _loss_keys(records: List[dict]) -> List[str]:
    keys = sorted({k for r in records for k, v in r.items() if "loss" in k and isinstance(v, (int, float))})
    # The total first: it is the curve one looks at, and it gets the first colour.
    return sorted(keys, key=lambda k: (k != "total_loss", k))


def plot_loss_curves(
    metrics_jsonl_path: str,
    out_png: str,
    keys: Optional[Sequence[str]] = None,
    title: Optional[str] = None,
) -> str:
    """Draw the loss curves (and the learning rate, below them) of a metrics file into ``out_png``.

    ``keys``: the loss keys to draw; default every key containing "loss" ("total_loss" first).
    Records without "iteration" (e.g. evaluation results) and non-finite values are skipped.
    Returns ``out_png``.
    """
    records = read_metrics(metrics_jsonl_path)
    title = title or f"Training curves: {os.path.basename(metrics_jsonl_path)}"
    return plot_loss_records(records, out_png, keys, title, source=metrics_jsonl_path)


def plot_loss_records(
    records: List[dict],
    out_png: str,
    keys: Optional[Sequence[str]] = None,
    title: str = "Training curves",
    source: str = "the metrics",
) -> str:
    """``plot_loss_curves`` of metrics records already in memory (a JSONWriter's ``records``)."""
    keys = list(keys) if keys is not None else _loss_keys(records)
    losses = [s for s in (_series(records, k) for k in keys) if s is not None]
    if not losses:
        raise ValueError(
            f"plot_loss_curves: {source} has no lines with 'iteration' and a finite "
            f"value for any of the keys {keys}"
        )
    lr = _series(records, "lr")
    return save_figure(_curves_figure(losses, lr, title, "loss"), out_png)


def plot_runs_compared(
    metrics_paths: dict, out_png: str, key: str = "total_loss", title: Optional[str] = None, ylabel: Optional[str] = None
) -> str:
    """Draw one metric (``key``: a loss, "bbox/AP", ...) of several training runs on one axis, a curve per run.

    ``metrics_paths``: run name -> its metrics.json. Runs whose file has no finite ``key`` are
    left out; if none has it, ValueError. Returns ``out_png``.
    """
    curves = []
    for name, path in metrics_paths.items():
        series = _series(read_metrics(path), key)
        if series is not None:
            curves.append((name, series[1], series[2]))
    if not curves:
        raise ValueError(f"plot_runs_compared: none of {list(metrics_paths.values())} has a finite '{key}'")
    return save_figure(_curves_figure(curves, None, title or f"{key} by run", ylabel or key), out_png)


def _curves_figure(curves: List[Series], lr: Optional[Series], title: str, ylabel: str):
    """Curves against the iteration, a point marker where a curve has a single point; the
    learning rate in a shorter panel below when given."""
    rows = 2 if lr is not None else 1
    fig = new_figure(10, 7 if lr is not None else 5)
    axes = fig.subplots(rows, 1, sharex=True, squeeze=False, gridspec_kw={"height_ratios": [3, 1][:rows]})[:, 0]
    for j, (name, xs, ys) in enumerate(curves):
        axes[0].plot(
            xs, ys, label=name, color=PALETTE[j % len(PALETTE)], linewidth=2.0 if name == "total_loss" else 1.2,
            marker="o" if len(xs) == 1 else None,
        )
    axes[0].set_ylabel(ylabel)
    axes[0].legend(loc="upper right", fontsize=9)
    axes[0].set_title(title)
    if lr is not None:
        axes[1].plot(lr[1], lr[2], color=PALETTE[0], linewidth=1.2, marker="o" if len(lr[1]) == 1 else None)
        axes[1].set_ylabel("learning rate")
    axes[-1].set_xlabel("iteration")
    for ax in axes:
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    return fig
