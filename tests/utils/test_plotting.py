"""plotting: loss / LR curves and run comparisons drawn by matplotlib into PNGs."""
import json
import logging
import math

import cv2
import numpy as np
import pytest

from detcore.utils import plotting
from detcore.utils.plotting import plot_loss_curves, read_metrics

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


def rgb(hex_colour):
    return tuple(int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))


def has_colour(img, hex_colour, tol=40):
    bgr = np.array(rgb(hex_colour)[::-1], dtype=np.int64)
    return bool((np.abs(img.astype(np.int64) - bgr).sum(-1) < tol).any())


def test_writes_a_png_with_curves_and_lr_panel(tmp_path):
    src = write_metrics(tmp_path / "metrics.json")
    out = plot_loss_curves(src, str(tmp_path / "plots" / "loss.png"))  # the folder is created
    img = load_png(out)
    assert img.shape == (700, 1000, 3)  # 10 x 7 inches at 100 dpi: large enough to read
    # One colour per curve: total_loss first, then the others in sorted order.
    for colour in plotting.PALETTE[:3]:
        assert has_colour(img, colour)
    assert not has_colour(img, plotting.PALETTE[3])  # only three loss curves
    # Without an "lr" key there is no learning-rate panel.
    img = load_png(plot_loss_curves(write_metrics(tmp_path / "no_lr.json", with_lr=False), str(tmp_path / "b.png")))
    assert img.shape == (500, 1000, 3)


def test_curve_follows_the_data(tmp_path):
    # A falling total loss: its colour appears high on the left and low on the right.
    img = load_png(plot_loss_curves(write_metrics(tmp_path / "m.json", with_lr=False), str(tmp_path / "a.png"), keys=["total_loss"]))
    bgr = np.array(rgb(plotting.PALETTE[0])[::-1])
    ys, xs = np.nonzero((np.abs(img.astype(np.int64) - bgr).sum(-1) < 40))
    curve = ~((xs > 800) & (ys < 120))  # not the legend's sample line (upper right)
    xs, ys = xs[curve], ys[curve]
    left = ys[xs < np.percentile(xs, 10)].mean()
    right = ys[xs > np.percentile(xs, 90)].mean()
    assert left < right - 100  # image rows grow downwards


def test_bad_lines_and_records_without_iteration_are_skipped(tmp_path, caplog):
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


def test_single_point_and_constant_curves_are_drawn(tmp_path):
    src = tmp_path / "one.json"
    src.write_text(json.dumps({"iteration": 0, "total_loss": 1.0, "lr": 0.01}) + "\n")
    img = load_png(plot_loss_curves(str(src), str(tmp_path / "one.png")))
    # A marker in each panel, not only the legend's sample line (upper right).
    assert has_colour(img[:480, :700], plotting.PALETTE[0])  # the loss panel
    assert has_colour(img[500:, :700], plotting.PALETTE[0])  # the learning-rate panel


def test_no_loss_values_raises(tmp_path):
    src = tmp_path / "m.json"
    src.write_text(json.dumps({"iteration": 1, "lr": 0.1}) + "\n")
    with pytest.raises(ValueError, match="no lines"):
        plot_loss_curves(str(src), str(tmp_path / "a.png"))
    with pytest.raises(FileNotFoundError):
        plot_loss_curves(str(tmp_path / "missing.json"), str(tmp_path / "a.png"))


def test_runs_compared_draws_one_curve_per_run(tmp_path):
    a = write_metrics(tmp_path / "a.json", with_lr=False)
    b = write_metrics(tmp_path / "b.json", iterations=range(9, 200, 10), with_lr=False)
    no_total = tmp_path / "c.json"
    no_total.write_text(json.dumps({"iteration": 5, "loss_cls": 1.0}) + "\n")
    out = plotting.plot_runs_compared({"pretrained": a, "scratch": b, "empty": str(no_total)}, str(tmp_path / "cmp.png"))
    img = load_png(out)
    assert has_colour(img, plotting.PALETTE[0]) and has_colour(img, plotting.PALETTE[1])
    assert not has_colour(img, plotting.PALETTE[2])  # the run without total_loss is left out
    with pytest.raises(ValueError, match="total_loss"):
        plotting.plot_runs_compared({"empty": str(no_total)}, str(tmp_path / "none.png"))


def test_new_figure_needs_no_display_and_save_figure_creates_the_folder(tmp_path):
    fig = plotting.new_figure(4, 3, dpi=50)
    fig.subplots().plot([0, 1], [1, 0], color=plotting.PALETTE[1])
    out = plotting.save_figure(fig, str(tmp_path / "a" / "b" / "f.png"))
    img = load_png(out)
    assert img.shape == (150, 200, 3) and has_colour(img, plotting.PALETTE[1])
    assert (img[0, 0] == 255).all()  # a white background, not transparent
