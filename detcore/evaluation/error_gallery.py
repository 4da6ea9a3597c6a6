"""``error_gallery.png``: the evaluated images with the most errors, ground truth beside detections.

Errors are those of ``error_analysis.match_coco`` (IoU >= 0.5, score >= 0.5): ground truth no
detection took (missed), detections that took nothing (false positives) and detections that
took ground truth of another class (wrong class). The images with the most of them (ties: the
lower image id) are drawn by detcore's visualizer: on the left the ground truth, on the right the
detections at or above the score threshold, each instance in its class's colour, and every
error framed by a red dashed box. Small images are enlarged by a whole factor as the demo does
(``upscale_factor``), large ones shrunk, so that a panel's short side is about 480 pixels.

The pixels are laid out on one canvas and put 1:1 into a matplotlib figure, which adds the text
and the frames; nothing is resampled after drawing except images larger than a panel.
"""
import logging
import os
from typing import List, Mapping, Optional, Sequence, Tuple

import cv2
import numpy as np
import pycocotools.mask as mask_util
import torch

from detcore.structures import Boxes, Instances
from detcore.utils.plotting import new_figure, save_figure
from detcore.utils.visualizer import draw_instances, upscale_factor

from .error_analysis import IOU_THRESHOLD, SCORE_THRESHOLD, ImageMatches

__all__ = ["GALLERY_FILE", "worst_images", "draw_error_gallery"]

logger = logging.getLogger(__name__)

GALLERY_FILE = "error_gallery.png"
_PANEL_SHORT_SIDE = 480  # pixels, as the demo's pictures
_PANEL_LONG_SIDE = 900  # larger images are shrunk to this
_GAP, _MARGIN = 16, 24  # pixels between the two panels of an image / between images
_HEADER = 64  # pixels of text above each image's panels
_TITLE = 70  # pixels of text at the top
_MAX_WIDTH = 2700  # images go two to a row while that fits
_ERROR_COLOR = "#ff1a1a"
_DPI = 100


def worst_images(matches: Sequence[ImageMatches], count: int) -> List[ImageMatches]:
    """The ``count`` images with the most errors (``ImageMatches.num_errors`` > 0), most first,
    ties by image id."""
    ranked = sorted((m for m in matches if m.num_errors > 0), key=lambda m: (-m.num_errors, m.image_id))
    return ranked[:count]


def _xyxy(xywh) -> np.ndarray:
    b = np.asarray(xywh, dtype=np.float64).reshape(-1, 4).copy()
    b[:, 2:] += b[:, :2]
    return b


def _instances(coco_gt, image_id: int, m: ImageMatches, results: List[dict], cat_ids: Sequence[int]):
    """The image's non-crowd ground truth and its detections above the threshold as
    ``Instances`` for the visualizer, and their boxes (xyxy, for the error frames)."""
    info = coco_gt.imgs[image_id]
    h, w = int(info["height"]), int(info["width"])
    anns = coco_gt.imgToAnns.get(image_id, [])
    index = {int(c): k for k, c in enumerate(cat_ids)}
    gt_keep = np.flatnonzero(~m.gt_crowd)
    gt_anns = [anns[m.gt_index[j]] for j in gt_keep]
    gt = Instances((h, w), gt_boxes=Boxes(torch.as_tensor(_xyxy([a["bbox"] for a in gt_anns]), dtype=torch.float32)),
                   gt_classes=torch.as_tensor([index[int(a["category_id"])] for a in gt_anns], dtype=torch.int64))
    if gt_anns and all("segmentation" in a for a in gt_anns):
        gt.gt_masks = torch.as_tensor(np.stack([coco_gt.annToMask(a) for a in gt_anns]).astype(bool))
    image_results = [r for r in results if int(r["image_id"]) == image_id and int(r["category_id"]) in index]
    dts = [image_results[i] for i in m.dt_index]
    dt = Instances((h, w), pred_boxes=Boxes(torch.as_tensor(_xyxy([d["bbox"] for d in dts]), dtype=torch.float32)),
                   scores=torch.as_tensor([float(d["score"]) for d in dts], dtype=torch.float32),
                   pred_classes=torch.as_tensor(m.dt_classes, dtype=torch.int64))
    # Masks are drawn from RLE (what the evaluator writes); pycocotools' loadRes adds box polygons
    # to box results, which are no masks.
    if dts and all(isinstance(d.get("segmentation"), dict) for d in dts):
        dt.pred_masks = torch.as_tensor(mask_util.decode([d["segmentation"] for d in dts]).transpose(2, 0, 1).astype(bool))
    # Frames around the errors: missed ground truth (left), false positives and wrong classes (right).
    position = {int(j): p for p, j in enumerate(gt_keep)}
    missed = gt.gt_boxes.tensor.numpy()[[position[int(j)] for j in m.missed]].reshape(-1, 4)
    wrong = np.concatenate([m.false_positives, m.wrong_class]).astype(np.int64)
    return gt, dt, missed, dt.pred_boxes.tensor.numpy()[wrong].reshape(-1, 4)


def _read(image_id: int, coco_gt, image_files: Mapping[int, str], image_root: Optional[str]) -> Optional[np.ndarray]:
    path = image_files.get(image_id)
    if path is None:
        path = coco_gt.imgs[image_id].get("file_name", "")
        if image_root and not os.path.isabs(path):
            path = os.path.join(image_root, path)
    image = cv2.imread(path, cv2.IMREAD_COLOR) if path and os.path.isfile(path) else None
    if image is None:
        logger.warning("error gallery: cannot read the image of image id %d (%r); it is left out", image_id, path)
    return image


def _panel(image: np.ndarray, instances: Instances, names: Sequence[str]) -> Tuple[np.ndarray, float]:
    """The drawn, resized panel and its scale (panel pixels per image pixel)."""
    h, w = image.shape[:2]
    k = upscale_factor(h, w, _PANEL_SHORT_SIDE)
    drawn = draw_instances(image, instances, class_names=names, score_threshold=0.0, scale=k)
    shrink = min(1.0, _PANEL_LONG_SIDE / max(drawn.shape[:2]))
    if shrink < 1.0:
        drawn = cv2.resize(drawn, (round(drawn.shape[1] * shrink), round(drawn.shape[0] * shrink)),
                           interpolation=cv2.INTER_AREA)
    return drawn, k * shrink


def draw_error_gallery(
    out_png: str,
    coco_gt,
    results: List[dict],
    matches: Sequence[ImageMatches],
    cat_ids: Sequence[int],
    image_files: Mapping[int, str],
    task: str = "bbox",
    max_images: int = 6,
    image_root: Optional[str] = None,
    iou_threshold: float = IOU_THRESHOLD,
    score_threshold: float = SCORE_THRESHOLD,
):
    """Draw the gallery of the ``max_images`` worst images of ``matches`` (from ``match_coco`` with
    the same thresholds) into ``out_png``; returns the figure, or None (nothing written) when no
    image has an error or none can be read. ``image_files``: image id -> path; other images are
    read from the json's ``file_name`` (under ``image_root`` when relative)."""
    names = [str(coco_gt.cats[c]["name"]) for c in cat_ids]
    cells = []
    for m in worst_images(matches, max_images):
        image = _read(m.image_id, coco_gt, image_files, image_root)
        if image is None:
            continue
        gt, dt, missed, wrong = _instances(coco_gt, m.image_id, m, results, cat_ids)
        left, scale = _panel(image, gt, names)
        right, _ = _panel(image, dt, names)
        cells.append((m, left, right, missed * scale, wrong * scale))
    if not cells:
        logger.info("error gallery: no evaluated image has a miss, false positive or wrong class; none drawn")
        return None

    pair_w = max(c[1].shape[1] * 2 + _GAP for c in cells)
    cols = 2 if len(cells) > 1 and 2 * pair_w + 3 * _MARGIN <= _MAX_WIDTH else 1
    grid = [cells[i:i + cols] for i in range(0, len(cells), cols)]
    heights = [_HEADER + max(c[1].shape[0] for c in row) for row in grid]
    width = cols * pair_w + (cols + 1) * _MARGIN
    height = _TITLE + sum(heights) + len(grid) * _MARGIN
    canvas = np.full((height, width, 3), 255, dtype=np.uint8)
    texts, frames = [], []
    y = _TITLE
    for row, row_h in zip(grid, heights):
        for j, (m, left, right, missed, wrong) in enumerate(row):
            x = _MARGIN + j * (pair_w + _MARGIN)
            ph, pw = left.shape[:2]
            top = y + _HEADER
            canvas[top:top + ph, x:x + pw] = left
            canvas[top:top + ph, x + pw + _GAP:x + 2 * pw + _GAP] = right
            file_name = os.path.basename(str(coco_gt.imgs[m.image_id].get("file_name", "")))
            counts = [(len(m.missed), "missed"), (len(m.false_positives), "false positive"),
                      (len(m.wrong_class), "wrong class")]
            summary = ", ".join(f"{n} {what}" + ("s" if n > 1 and what == "false positive" else "")
                                for n, what in counts if n)
            texts.append((x, y + 4, f"image {m.image_id} ({file_name}): {summary}", 13, "bold"))
            texts.append((x, y + 30, "ground truth", 12, "normal"))
            texts.append((x + pw + _GAP, y + 30, f"detections, score >= {score_threshold:g}", 12, "normal"))
            frames += [(x + b[0], top + b[1], b[2] - b[0], b[3] - b[1]) for b in missed]
            frames += [(x + pw + _GAP + b[0], top + b[1], b[2] - b[0], b[3] - b[1]) for b in wrong]
        y += row_h + _MARGIN

    # figimage puts the canvas's pixels 1:1 into the figure (no resampling); text and frames are
    # placed in the same pixels (display coordinates: y grows upwards, hence height - y).
    fig = new_figure(width / _DPI, height / _DPI, dpi=_DPI)
    fig.figimage(canvas[:, :, ::-1], xo=0, yo=0, origin="upper")
    from matplotlib.patches import Rectangle

    pad = 4
    for fx, fy, fw, fh in frames:
        fig.patches.append(Rectangle((fx - pad, height - (fy + fh + pad)), fw + 2 * pad, fh + 2 * pad, fill=False,
                                     edgecolor=_ERROR_COLOR, linewidth=2.5, linestyle=(0, (4, 3)), transform=None))
    for tx, ty, text, size, weight in texts:
        fig.text(tx, height - ty, text, fontsize=size, fontweight=weight, va="top", ha="left", transform=None)
    kind = {"bbox": "box", "segm": "mask"}.get(task, task)
    fig.text(_MARGIN, height - 8, f"The {len(cells)} images with the most errors ({kind} IoU >= {iou_threshold:g}, "
             f"score >= {score_threshold:g})", fontsize=15, fontweight="bold", va="top", transform=None)
    fig.text(_MARGIN, height - 38, "red dashes: ground truth missed (left); false positives and wrong classes (right)",
             fontsize=12, va="top", color="#b00000", transform=None)
    save_figure(fig, out_png)
    return fig
