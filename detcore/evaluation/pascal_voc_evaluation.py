"""Pascal VOC detection AP, computed as the VOC devkit does.

Per class, detections of all images are ranked by score; each is matched to the ground-truth box
of its image it overlaps most. Overlap above the threshold (0.5 for VOC) makes it a true
positive, unless that box is *difficult* (the detection is then ignored: neither true nor false)
or already taken by a higher-ranked detection (a false positive, even when another box would
have matched). Recall counts the non-difficult boxes only. The precision / recall curve gives:

- the VOC2007 **11-point** AP: the mean over recall levels 0, 0.1, ..., 1 of the best precision
  at a recall at least that level (levels taken as ``np.arange(0, 1.1, 0.1)``, like the
  devkit's Python port that detectron2 and py-faster-rcnn use);
- the VOC2010+ **area** AP: the area under the curve after making precision non-increasing.

Reported (percent), under task ``"bbox"``: ``AP50-11point`` and ``AP50-area`` (means over
classes) and per class ``AP50-11point-<class>`` / ``AP50-area-<class>``; and, as detectron2
reports, ``AP`` (mean over IoU 0.5:0.95 in steps of 0.05), ``AP50`` and ``AP75`` with the
dataset year's metric (11-point for 2007, area otherwise). A class with no non-difficult box
in the evaluated images has no AP (NaN) and is left out of the means.

Boxes: the devkit's boxes are 1-based inclusive with "+1" widths; detcore's records hold them
continuous (``xmin - 1, ymin - 1, xmax, ymax``) and predictions are continuous too, so plain
IoU here equals the devkit's on its own coordinates. Only the images passed to ``process`` are
scored.
"""
import logging
import math
import os
from collections import OrderedDict
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from detcore.structures import Boxes
from detcore.utils import strict_json

from .evaluator import DatasetEvaluator, predictions_to_evaluate

__all__ = ["PascalVOCDetectionEvaluator", "voc_ap", "voc_precision_recall", "METRICS_FILE"]

logger = logging.getLogger(__name__)

METRICS_FILE = "pascal_voc_metrics.json"
_COCO_STYLE_THRESHOLDS = tuple(range(50, 100, 5))  # percent


def voc_ap(recall: np.ndarray, precision: np.ndarray, use_07_metric: bool) -> float:
    """AP of a precision / recall curve (in ranking order), as a fraction."""
    recall, precision = np.asarray(recall, np.float64), np.asarray(precision, np.float64)
    if use_07_metric:
        ap = 0.0
        for t in np.arange(0.0, 1.1, 0.1):
            reached = recall >= t
            ap += (precision[reached].max() if reached.any() else 0.0) / 11.0
        return float(ap)
    mrec = np.concatenate(([0.0], recall, [1.0]))
    mpre = np.concatenate(([0.0], precision, [0.0]))
    mpre = np.maximum.accumulate(mpre[::-1])[::-1]  # the best precision at this recall or beyond
    steps = np.flatnonzero(mrec[1:] != mrec[:-1])
    return float(np.sum((mrec[steps + 1] - mrec[steps]) * mpre[steps + 1]))


def _iou(box: np.ndarray, gt: np.ndarray) -> np.ndarray:
    """IoU of one xyxy box with each row of ``gt`` (continuous coordinates, no +1)."""
    iw = np.maximum(np.minimum(gt[:, 2], box[2]) - np.maximum(gt[:, 0], box[0]), 0.0)
    ih = np.maximum(np.minimum(gt[:, 3], box[3]) - np.maximum(gt[:, 1], box[1]), 0.0)
    inter = iw * ih
    union = (box[2] - box[0]) * (box[3] - box[1]) + (gt[:, 2] - gt[:, 0]) * (gt[:, 3] - gt[:, 1]) - inter
    return inter / np.maximum(union, np.finfo(np.float64).eps)


def voc_precision_recall(
    detections: Sequence[Tuple[Any, float, np.ndarray]],
    ground_truth: Dict[Any, Tuple[np.ndarray, np.ndarray]],
    iou_threshold: float,
) -> Tuple[np.ndarray, np.ndarray, int]:
    """Precision and recall along the ranking of one class's detections.

    ``detections``: ``(image key, score, xyxy box)``; ``ground_truth``: image key ->
    (``[N, 4]`` boxes, ``[N]`` difficult flags) of this class. Returns ``(recall, precision,
    number of non-difficult boxes)``; ignored detections (matching a difficult box) are not in
    the curve. Equal scores keep the order of ``detections``.
    """
    num_positive = int(sum(int((~difficult).sum()) for _, difficult in ground_truth.values()))
    order = sorted(range(len(detections)), key=lambda i: -detections[i][1])
    taken = {key: np.zeros(len(boxes), dtype=bool) for key, (boxes, _) in ground_truth.items()}
    flags = []  # 1 true positive, 0 false positive
    for i in order:
        key, _, box = detections[i]
        boxes, difficult = ground_truth.get(key, (np.zeros((0, 4)), np.zeros(0, dtype=bool)))
        if len(boxes):
            overlaps = _iou(np.asarray(box, np.float64), boxes)
            best = int(np.argmax(overlaps))
            if overlaps[best] > iou_threshold:
                if difficult[best]:
                    continue
                if not taken[key][best]:
                    taken[key][best] = True
                    flags.append(1)
                    continue
        flags.append(0)
    tp = np.cumsum(np.asarray(flags, np.float64))
    fp = np.cumsum(1.0 - np.asarray(flags, np.float64))
    recall = tp / num_positive if num_positive else np.full(len(tp), np.nan)
    precision = tp / np.maximum(tp + fp, np.finfo(np.float64).eps)
    return recall, precision, num_positive


class PascalVOCDetectionEvaluator(DatasetEvaluator):
    """VOC box AP of instance predictions (see the module docstring for what is reported).

    Args:
        dataset_name: a registered dataset (e.g. ``voc_2007_test``); its records give the
            ground truth (boxes, classes, ``difficult``), its metadata ``thing_classes`` and
            ``year``.
        output_dir: where ``pascal_voc_metrics.json`` goes (nothing is written when None).
        distributed: gather predictions to rank 0, which alone evaluates.
        metadata_fn, records_fn: name -> metadata / records; default ``MetadataCatalog.get``
            and ``DatasetCatalog.get``.
        use_07_metric: the metric of ``AP`` / ``AP50`` / ``AP75``; default: 11-point when the
            metadata's year is 2007.
    """

    def __init__(
        self,
        dataset_name: str,
        output_dir: Optional[str] = None,
        distributed: bool = True,
        *,
        metadata_fn: Optional[Callable[[str], Any]] = None,
        records_fn: Optional[Callable[[str], List[dict]]] = None,
        use_07_metric: Optional[bool] = None,
    ):
        if metadata_fn is None or records_fn is None:
            from detcore.data import DatasetCatalog, MetadataCatalog

            metadata_fn = metadata_fn or MetadataCatalog.get
            records_fn = records_fn or DatasetCatalog.get
        metadata = metadata_fn(dataset_name)
        get = metadata.get if isinstance(metadata, dict) else lambda k: getattr(metadata, k, None)
        classes = get("thing_classes")
        if not classes:
            raise ValueError(f"PascalVOCDetectionEvaluator: dataset '{dataset_name}' has no thing_classes in its metadata")
        self._dataset_name = dataset_name
        self._class_names = list(classes)
        year = get("year")
        self._use_07_metric = bool(use_07_metric) if use_07_metric is not None else year == 2007
        self._output_dir = output_dir
        self._distributed = distributed
        self._ground_truth = self._read_ground_truth(records_fn(dataset_name))
        self._predictions: List[Tuple[Any, np.ndarray, np.ndarray, np.ndarray]] = []

    def _read_ground_truth(self, records: List[dict]) -> Dict[Any, Tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """image_id -> (boxes [N, 4], classes [N], difficult [N] bool)."""
        out = {}
        k = len(self._class_names)
        for index, record in enumerate(records):
            image_id = record.get("image_id")
            where = f"PascalVOCDetectionEvaluator: '{self._dataset_name}' record #{index} ({record.get('file_name')})"
            if image_id is None or image_id in out:
                raise ValueError(f"{where}: needs a unique 'image_id', got {image_id!r}")
            anns = [a for a in record.get("annotations", []) if not a.get("iscrowd", 0)]
            boxes = np.asarray([a["bbox"] for a in anns], np.float64).reshape(-1, 4)
            classes = np.asarray([a["category_id"] for a in anns], np.int64)
            if ((classes < 0) | (classes >= k)).any():
                raise ValueError(f"{where}: category_id outside [0, {k}): {sorted(set(classes.tolist()))}")
            difficult = np.asarray([bool(a.get("difficult", 0)) for a in anns], bool)
            out[image_id] = (boxes, classes, difficult)
        return out

    def reset(self) -> None:
        self._predictions = []

    def process(self, inputs: List[dict], outputs: List[dict]) -> None:
        if len(inputs) != len(outputs):
            raise ValueError(f"PascalVOCDetectionEvaluator.process: {len(inputs)} inputs but {len(outputs)} outputs")
        for inp, out in zip(inputs, outputs):
            image_id = inp.get("image_id")
            if image_id not in self._ground_truth:
                raise ValueError(
                    f"PascalVOCDetectionEvaluator: image_id {image_id!r} ({inp.get('file_name')}) is not in "
                    f"dataset '{self._dataset_name}'"
                )
            inst = out["instances"]
            boxes = inst.pred_boxes.tensor if isinstance(inst.pred_boxes, Boxes) else torch.as_tensor(inst.pred_boxes)
            classes = inst.pred_classes.detach().cpu().numpy().astype(np.int64)
            if len(classes) and (classes.min() < 0 or classes.max() >= len(self._class_names)):
                raise ValueError(
                    f"PascalVOCDetectionEvaluator: pred_classes holds {int(classes.max())}, but the dataset has "
                    f"{len(self._class_names)} classes"
                )
            self._predictions.append(
                (
                    image_id,
                    boxes.detach().cpu().to(torch.float64).numpy().reshape(-1, 4),
                    inst.scores.detach().cpu().to(torch.float64).numpy(),
                    classes,
                )
            )

    def evaluate(self) -> "OrderedDict[str, Dict[str, float]]":
        predictions = predictions_to_evaluate(self._predictions, self._distributed, "PascalVOCDetectionEvaluator")
        if predictions is None:
            return OrderedDict()
        first = {}
        for p in predictions:  # samplers may pad with repeated images: the first one counts
            first.setdefault(p[0], p)
        image_ids = sorted(first, key=str)

        # Per class: detections of every evaluated image, and its ground truth there.
        ap = {t: [] for t in _COCO_STYLE_THRESHOLDS}
        ap50 = {"11point": [], "area": []}
        for c in range(len(self._class_names)):
            detections = []
            for image_id in image_ids:
                _, boxes, scores, classes = first[image_id]
                detections.extend((image_id, float(s), b) for b, s in zip(boxes[classes == c], scores[classes == c]))
            gt = {}
            for image_id in image_ids:
                boxes, classes, difficult = self._ground_truth[image_id]
                gt[image_id] = (boxes[classes == c], difficult[classes == c])
            for t in _COCO_STYLE_THRESHOLDS:
                recall, precision, npos = voc_precision_recall(detections, gt, t / 100.0)
                if t == 50:
                    for metric in ap50:
                        ap50[metric].append(voc_ap(recall, precision, metric == "11point") * 100 if npos else math.nan)
                ap[t].append(voc_ap(recall, precision, self._use_07_metric) * 100 if npos else math.nan)

        def mean(values):
            values = [v for v in values if not math.isnan(v)]
            return float(np.mean(values)) if values else math.nan

        mean_ap = {t: mean(v) for t, v in ap.items()}
        metrics = OrderedDict(
            AP=mean(list(mean_ap.values())),
            AP50=mean_ap[50],
            AP75=mean_ap[75],
        )
        metrics["AP50-11point"] = mean(ap50["11point"])
        metrics["AP50-area"] = mean(ap50["area"])
        for metric, values in ap50.items():
            for name, value in zip(self._class_names, values):
                metrics[f"AP50-{metric}-{name}"] = value
        n = len(image_ids)
        logger.info(
            "Pascal VOC (%d image%s, %s metric for AP/AP50/AP75): AP %.2f  AP50 %.2f  AP75 %.2f  "
            "AP50-11point %.2f  AP50-area %.2f", n, "s" if n != 1 else "",
            "11-point" if self._use_07_metric else "area", metrics["AP"], metrics["AP50"], metrics["AP75"],
            metrics["AP50-11point"], metrics["AP50-area"],
        )
        results = OrderedDict(bbox=dict(metrics))
        if self._output_dir:
            os.makedirs(self._output_dir, exist_ok=True)
            with open(os.path.join(self._output_dir, METRICS_FILE), "w") as f:
                f.write(strict_json.dumps(results, indent=2))
        return results
