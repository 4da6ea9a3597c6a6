"""Pictures of a COCO evaluation, written next to its ``coco_eval_metrics.json``.

Per task (``bbox``, ``segm``, ``keypoints``), from the numbers of ``error_analysis``:

- ``<task>_pr_curves.png``: each class's precision-recall curves (COCOeval's, at IoU 0.5, 0.75
  and the 0.5:0.95 mean), one panel per class, its AP in the panel's title;
- ``<task>_per_category_ap.png``: each class's AP as a bar, best first, values written;
- ``<task>_confusion_matrix.png`` (boxes and masks): counts at IoU >= 0.5 and score >= 0.5
  with a background row (false positives) and column (misses), coloured by the share of the
  row;

and once, from the box matching (masks when there are no boxes), ``error_gallery.png``: the
images with the most misses, false positives and wrong classes, the ground truth beside the
detections (``error_gallery.py``).

Each ``plot_*`` function returns the matplotlib figure it saved, so its content can be checked.
"""
import logging
import math
import os
import time
from typing import Dict, List, Mapping, Optional, Sequence

import numpy as np

from detcore.utils.plotting import PALETTE, new_figure, save_figure

from .error_analysis import IOU_THRESHOLD, SCORE_THRESHOLD, PrecisionRecall, confusion_matrix, match_coco
from .error_analysis import precision_recall

__all__ = ["plot_pr_curves", "plot_per_category_ap", "plot_confusion_matrix", "write_evaluation_pictures"]

logger = logging.getLogger(__name__)

_TASK_NAMES = {"bbox": "box", "segm": "mask", "keypoints": "keypoint"}
# Beyond this many classes a chart keeps the worst ones (by AP), so it stays readable.
MAX_CLASSES_DRAWN = 80


def _worst(ap: np.ndarray, limit: int) -> np.ndarray:
    """Indices of the ``limit`` classes of lowest AP (those without ground truth last), in
    their original order; all of them when there are no more than ``limit``."""
    if len(ap) <= limit:
        return np.arange(len(ap))
    order = np.argsort(np.where(np.isnan(ap), np.inf, ap), kind="stable")
    return np.sort(order[:limit])


def _most_errors(matrix: np.ndarray, limit: int) -> np.ndarray:
    """Indices of the ``limit`` classes of a ``[K + 1, K + 1]`` confusion matrix with the most
    errors (their row and column less the diagonal), in their original order; all of them when
    there are no more than ``limit``."""
    k = matrix.shape[0] - 1
    if k <= limit:
        return np.arange(k)
    diagonal = np.diag(matrix)[:k]
    errors = matrix.sum(axis=0)[:k] + matrix.sum(axis=1)[:k] - 2 * diagonal
    return np.sort(np.argsort(-errors, kind="stable")[:limit])


def plot_pr_curves(pr: PrecisionRecall, out_png: str, task: str = "bbox"):
    """One panel per class: precision against recall at IoU 0.5, 0.75 and the 0.5:0.95 mean, the
    class's AP in its title. With more than ``MAX_CLASSES_DRAWN`` classes, the worst ones."""
    shown = _worst(pr.ap, MAX_CLASSES_DRAWN)
    k = len(shown)
    cols = min(k, max(3, math.ceil(math.sqrt(k * 1.5))))
    rows = math.ceil(k / cols)
    panel = 3.0 if k <= 12 else 2.3
    fig = new_figure(cols * panel + 0.4, rows * panel + 1.0, layout="constrained")
    axes = fig.subplots(rows, cols, sharex=True, sharey=True, squeeze=False).reshape(-1)
    styles = [dict(color=PALETTE[0], linewidth=1.5), dict(color=PALETTE[3], linewidth=1.5, linestyle="--"),
              dict(color="black", linewidth=2.0)]
    for ax, c in zip(axes, shown):
        for curve, style, label in zip(pr.precision[:, c], styles, pr.curves):
            if not np.isnan(curve).all():
                ax.plot(pr.recall, curve, label=label, **style)
        ap = pr.ap[c]
        ax.set_title(f"{pr.names[c]}: AP {ap:.1f}" if not np.isnan(ap) else f"{pr.names[c]}: no ground truth",
                     fontsize=11 if k <= 12 else 8)
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1.02)
        ax.grid(True, alpha=0.3)
        ax.tick_params(labelsize=8)
    for ax in axes[k:]:
        ax.set_visible(False)
    for ax in axes.reshape(rows, cols)[-1]:
        ax.set_xlabel("recall", fontsize=9)
    for ax in axes.reshape(rows, cols)[:, 0]:
        ax.set_ylabel("precision", fontsize=9)
    more = f", the {k} of lowest AP of {len(pr.ap)}" if k < len(pr.ap) else ""
    fig.suptitle(f"{_TASK_NAMES.get(task, task)} precision-recall per class{more} (COCOeval: area all, "
                 f"largest maxDets)", fontsize=12)
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], label=label, **style) for style, label in zip(styles, pr.curves)]
    fig.legend(handles=handles, loc="outside lower center", ncol=3, fontsize=9, frameon=False)
    save_figure(fig, out_png)
    return fig


def plot_per_category_ap(ap: Sequence[float], names: Sequence[str], out_png: str, task: str = "bbox"):
    """Horizontal bars of each class's AP (percent), best at the top, each with its value;
    classes without ground truth (NaN) listed below the bars. With more than
    ``MAX_CLASSES_DRAWN`` classes, the worst ones."""
    ap = np.asarray(ap, dtype=np.float64)
    if len(ap) != len(names):
        raise ValueError(f"plot_per_category_ap: {len(ap)} AP values for {len(names)} names")
    valid = np.flatnonzero(~np.isnan(ap))
    shown = valid[_worst(ap[valid], MAX_CLASSES_DRAWN)]
    shown = shown[np.argsort(-ap[shown], kind="stable")]  # best first = top
    absent = [names[i] for i in np.flatnonzero(np.isnan(ap))]
    fig = new_figure(8, max(2.5, 0.32 * len(shown) + 1.6))
    ax = fig.subplots()
    y = np.arange(len(shown))
    ax.barh(y, ap[shown], color=PALETTE[0], height=0.7)
    ax.set_yticks(y, [names[i] for i in shown], fontsize=9 if len(shown) <= 40 else 7)
    ax.invert_yaxis()
    for yi, v in zip(y, ap[shown]):
        ax.text(v + 0.8, yi, f"{v:.1f}", va="center", fontsize=9 if len(shown) <= 40 else 7)
    if len(valid):
        mean = float(np.mean(ap[valid]))
        ax.axvline(mean, color="black", linestyle="--", linewidth=1, label=f"mean {mean:.1f}")
        ax.legend(loc="lower right", fontsize=9)
    ax.set_xlim(0, 108)
    ax.set_xlabel("AP (IoU 0.5:0.95, percent)")
    ax.grid(True, axis="x", alpha=0.3)
    more = f", the {len(shown)} of lowest AP of {len(valid)}" if len(shown) < len(valid) else ""
    ax.set_title(f"{_TASK_NAMES.get(task, task)} AP per category{more}", fontsize=12)
    if absent:
        shown_names = ", ".join(absent[:8]) + (f" and {len(absent) - 8} more" if len(absent) > 8 else "")
        fig.text(0.01, 0.005, f"no ground truth: {shown_names}", fontsize=8, va="bottom")
    fig.tight_layout(rect=(0, 0.03 if absent else 0, 1, 1))
    save_figure(fig, out_png)
    return fig


def plot_confusion_matrix(
    matrix: np.ndarray,
    names: Sequence[str],
    out_png: str,
    task: str = "bbox",
    iou_threshold: float = IOU_THRESHOLD,
    score_threshold: float = SCORE_THRESHOLD,
):
    """The ``[K + 1, K + 1]`` matrix of ``error_analysis.confusion_matrix``: rows the ground
    truth, columns the detections, the last of each "background"; each cell's count written in
    it (every count up to 30 classes, the non-zero ones beyond), coloured by its share of the
    row. With more than ``MAX_CLASSES_DRAWN`` classes, those with the most errors (off the
    diagonal, in their row or column), each row still coloured by its share of the whole row."""
    matrix = np.asarray(matrix)
    k = len(names)
    if matrix.shape != (k + 1, k + 1):
        raise ValueError(f"plot_confusion_matrix: the matrix must be [{k + 1}, {k + 1}] for {k} names, got {matrix.shape}")
    rows = matrix.sum(axis=1, keepdims=True)
    share = np.divide(matrix, rows, out=np.zeros(matrix.shape, dtype=np.float64), where=rows > 0)
    shown = _most_errors(matrix, MAX_CLASSES_DRAWN)
    if len(shown) < k:
        cells = np.ix_(np.append(shown, k), np.append(shown, k))
        matrix, share, names = matrix[cells], share[cells], [names[i] for i in shown]
    more = f" ({len(shown)} of {k} classes: those with the most errors)" if len(shown) < k else ""
    k = len(names)
    labels = list(names) + ["background"]
    cell = float(np.clip(9.0 / (k + 1), 0.3, 1.1))
    side = cell * (k + 1)
    fig = new_figure(side + 2.8, side + 2.4)
    ax = fig.subplots()
    image = ax.imshow(share, cmap="Blues", vmin=0.0, vmax=1.0)
    font = float(np.clip(cell * 14, 5, 12))
    for (i, j), count in np.ndenumerate(matrix):
        if count == 0 and (k > 30 or i == j == k):
            continue
        ax.text(j, i, str(int(count)), ha="center", va="center", fontsize=font,
                color="white" if share[i, j] > 0.55 else "black")
    tick_font = float(np.clip(cell * 14, 6, 11))
    ax.set_xticks(np.arange(k + 1), labels, rotation=45 if k > 4 else 0, ha="right" if k > 4 else "center",
                  fontsize=tick_font)
    ax.set_yticks(np.arange(k + 1), labels, fontsize=tick_font)
    ax.set_xlabel("detected class (background: ground truth missed)")
    ax.set_ylabel("ground-truth class (background: false positives)")
    # The background row and column are of another kind: set them apart.
    ax.axhline(k - 0.5, color="gray", linewidth=1.5)
    ax.axvline(k - 0.5, color="gray", linewidth=1.5)
    bar = fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    bar.set_label("share of the row", fontsize=9)
    ax.set_title(
        f"{_TASK_NAMES.get(task, task)} confusion matrix: IoU >= {iou_threshold:g}, score >= {score_threshold:g}{more}\n"
        f"(counts; greedy by score, each detection to the unmatched ground truth of highest IoU)",
        fontsize=10,
    )
    fig.tight_layout()
    save_figure(fig, out_png)
    return fig


def write_evaluation_pictures(
    output_dir: str,
    coco_gt,
    results: List[dict],
    coco_evals: Mapping[str, object],
    image_ids: Sequence[int],
    cat_ids: Sequence[int],
    image_files: Optional[Mapping[int, str]] = None,
    image_root: Optional[str] = None,
    max_gallery_images: int = 6,
) -> Dict[str, str]:
    """Draw the pictures of the module's docstring into ``output_dir``; returns ``{file name:
    path}``.

    ``coco_gt``: the ground truth (pycocotools ``COCO``); ``results``: the COCO result dicts;
    ``coco_evals``: task -> its accumulated ``COCOeval``; ``cat_ids``: the json category id of
    each model class, in class order (class k's colour and name); ``image_files``: image id ->
    image path for the gallery, other images are read from the json's ``file_name`` (under
    ``image_root`` when relative).
    """
    start = time.perf_counter()
    names = [str(coco_gt.cats[c]["name"]) for c in cat_ids]
    written = {}

    def path(name):
        return os.path.join(output_dir, name)

    gallery_matches = None
    for task, coco_eval in coco_evals.items():
        pr = precision_recall(coco_eval, cat_ids)
        for name, draw in ((f"{task}_pr_curves.png", lambda p: plot_pr_curves(pr, p, task)),
                           (f"{task}_per_category_ap.png", lambda p: plot_per_category_ap(pr.ap, names, p, task))):
            draw(path(name))
            written[name] = path(name)
        if task in ("bbox", "segm"):
            matches = match_coco(coco_gt, results, image_ids, cat_ids, task)
            name = f"{task}_confusion_matrix.png"
            plot_confusion_matrix(confusion_matrix(matches, len(cat_ids)), names, path(name), task)
            written[name] = path(name)
            if gallery_matches is None or task == "bbox":
                gallery_matches = (task, matches)
    if gallery_matches is not None and max_gallery_images > 0:
        from .error_gallery import GALLERY_FILE, draw_error_gallery

        task, matches = gallery_matches
        fig = draw_error_gallery(
            path(GALLERY_FILE), coco_gt, results, matches, cat_ids, image_files or {}, task, max_gallery_images,
            image_root,
        )
        if fig is not None:
            written[GALLERY_FILE] = path(GALLERY_FILE)
    logger.info(
        "Evaluation pictures (%.1f s): %s", time.perf_counter() - start,
        ", ".join(os.path.join(output_dir, n) for n in written),
    )
    return written
