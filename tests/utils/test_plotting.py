import json
import logging
import math
import sys

import cv2
import numpy as np
import pytest

from detcore.utils import plotting
from detcore.utils.plotting import plot_loss_curves, read_metrics

_MPL_MODULES = ("matplotlib", "matplotlib.figure", "matplotlib.backends", "matplotlib.backends.backend_agg")


@pytest.fixture
def no_matplotlib(monkeypatch):
    """Make every matplotlib import fail, as on a machine without it."""
    for name in _MPL_MODULES:
        monkeypatch.setitem(sys.modules, name, None)


def write_metrics(path, iterations=range(19, 400, 20), with_lr=True, extra_lines=()):
    with open(path, "w") as f:
        for it in iterations:
            rec = {
                "iteration": it,
                "total_loss": 3.0 * math.exp(-it / 150) + 0.5,
                "loss_cls": 1.0 * math.exp(-it / 100) + 0.2,
                "loss_box_reg": 0.8 * math.exp(-it / 200) + 0.3,
                "time": 0.25,
            }
            if with_lr:
                rec["lr"] = 0.02 * min(1.0, (it + 1) / 100)
            f.write(json.dumps(rec) + "\n")
        for line in extra_lines:
            f.write(line + "\n")
    return str(path)


def load_png(path):
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    img = cv2.imread(str(path))
    assert img is not None and img.ndim == 3 and img.dtype == np.uint8
    return img


def has_colour(img, rgb, tol=40):
    bgr = np.array(rgb[::-1], dtype=np.int64)
    return bool((np.abs(img.astype(np.int64) - bgr).sum(-1) < tol).any())


def test_cv2_fallback_writes_a_png_with_curves_and_lr_panel(tmp_path, no_matplotlib):
    src = write_metrics(tmp_path / "metrics.json")
    out = plot_loss_curves(src, str(tmp_path / "plots" / "loss.png"))  # the folder is created
    img = load_png(out)
    assert img.shape == (720, 1000, 3)
    # One colour per curve: total_loss first, then the others in sorted order.
    for rgb in plotting._PALETTE[:3]:
        assert has_colour(img, rgb)
    assert not has_colour(img, plotting._PALETTE[3])  # only three loss curves
    # Without an "lr" key there is no learning-rate panel.
    img = load_png(plot_loss_curves(write_metrics(tmp_path / "no_lr.json", with_lr=False), str(tmp_path / "b.png")))
    assert img.shape == (520, 1000, 3)


def test_curve_follows_the_data_in_the_fallback(tmp_path, no_matplotlib):
    # A falling total loss: its colour appears high on the left and low on the right.
    img = load_png(plot_loss_curves(write_metrics(tmp_path / "m.json", with_lr=False), str(tmp_path / "a.png"), keys=["total_loss"]))
    bgr = np.array(plotting._PALETTE[0][::-1])
    ys, xs = np.nonzero((np.abs(img.astype(np.int64) - bgr).sum(-1) < 40))
    curve = (xs > 100) & ~((xs > 800) & (ys < 100))  # right of the y axis, not the legend sample
    xs, ys = xs[curve], ys[curve]
    left = ys[xs < np.percentile(xs, 10)].mean()
    right = ys[xs > np.percentile(xs, 90)].mean()
    assert left < right - 100  # image rows grow downwards


def test_matplotlib_path_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    out = plot_loss_curves(write_metrics(tmp_path / "metrics.json"), str(tmp_path / "loss.png"))
    img = load_png(out)
    assert img.shape[0] > 200 and img.shape[1] > 200
    assert has_colour(img, plotting._PALETTE[0])


def test_bad_lines_and_records_without_iteration_are_skipped(tmp_path, caplog, no_matplotlib):
    src = write_metrics(
        tmp_path / "m.json",
        iterations=[19, 39],
        extra_lines=[json.dumps({"bbox/AP": 30.0}), json.dumps({"iteration": 59, "total_loss": float("nan")}), '{"iteration": 79, "total_l'],
    )
    with caplog.at_level(logging.WARNING):
        records = read_metrics(src)
    assert len(records) == 4 and "skipped 1" in caplog.text
    series = plotting._series(records, "total_loss")
    assert series[1].tolist() == [19.0, 39.0]  # NaN point and iteration-less record dropped
    load_png(plot_loss_curves(src, str(tmp_path / "a.png")))


def test_single_point_and_constant_curves_are_drawn(tmp_path, no_matplotlib):
    src = tmp_path / "one.json"
    src.write_text(json.dumps({"iteration": 0, "total_loss": 1.0, "lr": 0.01}) + "\n")
    img = load_png(plot_loss_curves(str(src), str(tmp_path / "one.png")))
    assert has_colour(img, plotting._PALETTE[0])


def test_no_loss_values_raises(tmp_path):
    src = tmp_path / "m.json"
    src.write_text(json.dumps({"iteration": 1, "lr": 0.1}) + "\n")
    with pytest.raises(ValueError, match="no lines"):
        plot_loss_curves(str(src), str(tmp_path / "a.png"))
    with pytest.raises(FileNotFoundError):
        plot_loss_curves(str(tmp_path / "missing.json"), str(tmp_path / "a.png"))


@pytest.mark.parametrize("lo,hi", [(0.0, 1.0), (0.013, 0.0207), (-3.2, 17.9), (19, 3000), (1e-6, 2e-5)])
def test_nice_ticks_are_round_and_cover_the_range(lo, hi):
    ticks = plotting._nice_ticks(lo, hi)
    assert 2 <= len(ticks) <= 12
    assert all(lo - 1e-12 <= t <= hi + 1e-12 for t in ticks)
    steps = np.diff(ticks)
    assert np.allclose(steps, steps[0])
    mantissa = steps[0] / 10 ** math.floor(math.log10(steps[0]))
    assert any(math.isclose(mantissa, m) for m in (1, 2, 5))
    assert ticks[0] - lo < steps[0] + 1e-12 and hi - ticks[-1] < steps[0] + 1e-12


def test_runs_compared_draws_one_curve_per_run(tmp_path, no_matplotlib):
    a = write_metrics(tmp_path / "a.json", with_lr=False)
    b = write_metrics(tmp_path / "b.json", iterations=range(9, 200, 10), with_lr=False)
    no_total = tmp_path / "c.json"
    no_total.write_text(json.dumps({"iteration": 5, "loss_cls": 1.0}) + "\n")
    out = plotting.plot_runs_compared({"pretrained": a, "scratch": b, "empty": str(no_total)}, str(tmp_path / "cmp.png"))
    img = load_png(out)
    assert has_colour(img, plotting._PALETTE[0]) and has_colour(img, plotting._PALETTE[1])
    assert not has_colour(img, plotting._PALETTE[2])  # the run without total_loss is left out
    with pytest.raises(ValueError, match="total_loss"):
        plotting.plot_runs_compared({"empty": str(no_total)}, str(tmp_path / "none.png"))
