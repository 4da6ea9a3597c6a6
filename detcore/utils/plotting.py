"""Loss / learning-rate curves from a training ``metrics.json`` (one JSON object per line) as PNG.

matplotlib draws them when it is importable (through its Agg canvas: no window, no global
pyplot state). It is not a dependency, so an OpenCV drawing with axes, ticks, labels and a
legend stands in when it is missing.
"""
import json
import logging
import math
import os
from typing import List, Optional, Sequence, Tuple

import cv2
import numpy as np

__all__ = ["read_metrics", "plot_loss_curves", "plot_loss_records", "plot_runs_compared"]

logger = logging.getLogger(__name__)

# RGB; distinct on white, shared by both backends so the two pictures look alike.
_PALETTE = [
    (31, 119, 180), (214, 39, 40), (44, 160, 44), (255, 127, 14), (148, 103, 189),
    (140, 86, 75), (227, 119, 194), (23, 190, 207), (127, 127, 127), (188, 189, 34),
]

Series = Tuple[str, np.ndarray, np.ndarray]  # (name, iterations, values)


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
    return _render(losses, lr, title, out_png, "loss")


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
    return _render(curves, None, title or f"{key} by run", out_png, ylabel or key)


def _render(curves: List[Series], lr: Optional[Series], title: str, out_png: str, ylabel: str) -> str:
    """Draw with matplotlib when it is importable, else with OpenCV; creates the folder."""
    os.makedirs(os.path.dirname(os.path.abspath(out_png)), exist_ok=True)
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        _plot_cv2(curves, lr, title, out_png, ylabel)
    else:
        _plot_matplotlib(Figure, FigureCanvasAgg, curves, lr, title, out_png, ylabel)
    return out_png


# --- matplotlib -----------------------------------------------------------------------------------
def _plot_matplotlib(Figure, FigureCanvasAgg, losses: List[Series], lr: Optional[Series], title: str, out_png: str, ylabel="loss"):
    rows = 2 if lr is not None else 1
    fig = Figure(figsize=(10, 7 if lr is not None else 5), dpi=100)
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, 1, sharex=True, squeeze=False, gridspec_kw={"height_ratios": [3, 1][:rows]})[:, 0]
    for j, (name, xs, ys) in enumerate(losses):
        color = tuple(c / 255 for c in _PALETTE[j % len(_PALETTE)])
        axes[0].plot(xs, ys, label=name, color=color, linewidth=2.0 if name == "total_loss" else 1.2)
    axes[0].set_ylabel(ylabel)
    axes[0].legend(loc="upper right", fontsize=9)
    axes[0].set_title(title)
    if lr is not None:
        axes[1].plot(lr[1], lr[2], color=tuple(c / 255 for c in _PALETTE[0]), linewidth=1.2)
        axes[1].set_ylabel("learning rate")
    axes[-1].set_xlabel("iteration")
    for ax in axes:
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(out_png)


# --- OpenCV fallback ------------------------------------------------------------------------------
_FONT = cv2.FONT_HERSHEY_SIMPLEX
_BLACK, _GRID, _WHITE = (0, 0, 0), (225, 225, 225), (255, 255, 255)


def _nice_ticks(lo: float, hi: float, count: int = 6) -> List[float]:
    """Round tick values (steps of 1, 2 or 5 x 10^k) covering [lo, hi]."""
    raw = (hi - lo) / max(1, count - 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step - 1e-9) * step
    ticks, t = [], first
    while t <= hi + step * 1e-9:
        ticks.append(0.0 if abs(t) < step * 1e-9 else t)
        t += step
    return ticks


def _fmt(v: float) -> str:
    return f"{v:.3g}"


def _fmt_iteration(v: float) -> str:
    # Iterations are integers; "1e+03" reads badly, and 90000 fits better as "90k".
    if abs(v) >= 10000:
        return f"{v / 1000:g}k"
    return f"{v:.0f}" if float(v).is_integer() else f"{v:g}"


def _value_range(arrays: List[np.ndarray]) -> Tuple[float, float]:
    lo = min(float(a.min()) for a in arrays)
    hi = max(float(a.max()) for a in arrays)
    if hi - lo < 1e-12 * max(1.0, abs(hi)):
        pad = abs(hi) * 0.1 or 1.0
        return lo - pad, hi + pad
    pad = (hi - lo) * 0.05
    return lo - pad, hi + pad


def _put_vertical_text(canvas: np.ndarray, text: str, center: Tuple[int, int], scale: float) -> None:
    (tw, th), base = cv2.getTextSize(text, _FONT, scale, 1)
    patch = np.full((th + base + 4, tw + 4, 3), 255, np.uint8)
    cv2.putText(patch, text, (2, th + 2), _FONT, scale, _BLACK, 1, cv2.LINE_AA)
    patch = cv2.rotate(patch, cv2.ROTATE_90_COUNTERCLOCKWISE)
    ph, pw = patch.shape[:2]
    y0 = max(0, center[1] - ph // 2)
    x0 = max(0, center[0] - pw // 2)
    region = canvas[y0:y0 + ph, x0:x0 + pw]
    np.minimum(region, patch[: region.shape[0], : region.shape[1]], out=region)  # dark text wins


def _draw_panel(canvas, rect, series: List[Series], colors, x_range, ylabel: str, show_x_labels: bool, legend: bool):
    left, top, right, bottom = rect
    x_lo, x_hi = x_range
    y_lo, y_hi = _value_range([ys for _, _, ys in series])

    def to_px(xs, ys):
        px = left + (xs - x_lo) / (x_hi - x_lo) * (right - left)
        py = bottom - (ys - y_lo) / (y_hi - y_lo) * (bottom - top)
        return np.stack([px, py], axis=1)

    for t in _nice_ticks(y_lo, y_hi):
        y = int(round(bottom - (t - y_lo) / (y_hi - y_lo) * (bottom - top)))
        cv2.line(canvas, (left, y), (right, y), _GRID, 1)
        label = _fmt(t)
        (tw, th), _ = cv2.getTextSize(label, _FONT, 0.42, 1)
        cv2.putText(canvas, label, (left - tw - 6, y + th // 2), _FONT, 0.42, _BLACK, 1, cv2.LINE_AA)
    for t in _nice_ticks(x_lo, x_hi, 8):
        x = int(round(left + (t - x_lo) / (x_hi - x_lo) * (right - left)))
        cv2.line(canvas, (x, top), (x, bottom), _GRID, 1)
        if show_x_labels:
            label = _fmt_iteration(t)
            (tw, th), _ = cv2.getTextSize(label, _FONT, 0.42, 1)
            cv2.putText(canvas, label, (x - tw // 2, bottom + th + 8), _FONT, 0.42, _BLACK, 1, cv2.LINE_AA)
    cv2.rectangle(canvas, (left, top), (right, bottom), _BLACK, 1)
    _put_vertical_text(canvas, ylabel, (left - 62, (top + bottom) // 2), 0.5)

    for (name, xs, ys), color in zip(series, colors):
        pts = to_px(xs, ys)
        if len(pts) == 1:
            cv2.circle(canvas, tuple(int(round(v)) for v in pts[0]), 3, color, -1, cv2.LINE_AA)
            continue
        width = 2 if name == "total_loss" else 1
        # polylines takes fixed point: shift=4 keeps sub-pixel positions (coordinates x 16).
        cv2.polylines(canvas, [np.round(pts * 16).astype(np.int32)], False, color, width, cv2.LINE_AA, shift=4)

    if legend:
        rows = [(name, color) for (name, _, _), color in zip(series, colors)]
        sizes = [cv2.getTextSize(name, _FONT, 0.45, 1)[0] for name, _ in rows]
        row_h = max(h for _, h in sizes) + 10
        box_w = max(w for w, _ in sizes) + 46
        x0, y0 = right - box_w - 10, top + 10
        cv2.rectangle(canvas, (x0, y0), (x0 + box_w, y0 + row_h * len(rows) + 6), _WHITE, -1)
        cv2.rectangle(canvas, (x0, y0), (x0 + box_w, y0 + row_h * len(rows) + 6), (160, 160, 160), 1)
        for k, ((name, color), (_, h)) in enumerate(zip(rows, sizes)):
            yc = y0 + 6 + row_h * k + row_h // 2
            cv2.line(canvas, (x0 + 8, yc), (x0 + 34, yc), color, 2, cv2.LINE_AA)
            cv2.putText(canvas, name, (x0 + 40, yc + h // 2), _FONT, 0.45, _BLACK, 1, cv2.LINE_AA)


def _plot_cv2(losses: List[Series], lr: Optional[Series], title: str, out_png: str, ylabel="loss") -> None:
    width, height = 1000, 720 if lr is not None else 520
    canvas = np.full((height, width, 3), 255, np.uint8)
    bgr = [tuple(reversed(c)) for c in _PALETTE]
    all_x = [xs for _, xs, _ in losses] + ([lr[1]] if lr is not None else [])
    x_lo = min(float(x.min()) for x in all_x)
    x_hi = max(float(x.max()) for x in all_x)
    if x_hi <= x_lo:
        x_lo, x_hi = x_lo - 1, x_hi + 1

    left, right = 100, width - 25
    (tw, th), _ = cv2.getTextSize(title, _FONT, 0.6, 1)
    cv2.putText(canvas, title, ((width - tw) // 2, 14 + th), _FONT, 0.6, _BLACK, 1, cv2.LINE_AA)
    loss_bottom = height - 70 if lr is None else int(height * 0.64)
    loss_colors = [bgr[j % len(bgr)] for j in range(len(losses))]
    _draw_panel(canvas, (left, 45, right, loss_bottom), losses, loss_colors, (x_lo, x_hi), ylabel,
                show_x_labels=lr is None, legend=True)
    last_bottom = loss_bottom
    if lr is not None:
        last_bottom = height - 70
        _draw_panel(canvas, (left, loss_bottom + 25, right, last_bottom), [lr], [bgr[0]], (x_lo, x_hi),
                    "learning rate", show_x_labels=True, legend=False)
    (tw, th), _ = cv2.getTextSize("iteration", _FONT, 0.5, 1)
    cv2.putText(canvas, "iteration", ((left + right - tw) // 2, last_bottom + 50), _FONT, 0.5, _BLACK, 1, cv2.LINE_AA)
    if not cv2.imwrite(out_png, canvas):
        raise OSError(f"plot_loss_curves: could not write {out_png} (is the extension .png?)")
