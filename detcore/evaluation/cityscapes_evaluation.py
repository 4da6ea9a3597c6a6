"""Cityscapes instance-level AP and AP50, computed by the official cityscapesScripts.

The benchmark's evaluation reads files: per image, one binary PNG per predicted instance and a
text file listing ``<png> <label id> <score>`` lines; the ground truth is the image's
``*_gtFine_instanceIds.png``. ``process`` keeps each prediction as RLE (small, gathered to
rank 0); ``evaluate`` writes those files into a temporary folder, makes the instance-id PNG from
the polygon json for images that have none (with cityscapesScripts' own drawing function), and
runs cityscapesScripts' matching and AP (``evalInstanceLevelSemanticLabeling``: overlap
thresholds 0.5:0.95, instances under 100 pixels and groups ignored). Its own driver, which
looks for results through environment variables and writes ``matches.json`` into the current
folder, is not used: its steps are called in order on our file lists.

cityscapesScripts' ``evaluateMatches`` crashes (``IndexError: index -1 is out of bounds``) when,
for one class and overlap threshold, there is ground truth and there are predictions, but every
prediction is ignored (it lies mostly on void pixels, a group or an instance under 100 pixels)
and no ground truth is matched: its list of scored predictions is empty (cityscapesScripts issue
89, open). Small splits, and ground truth whose unlabeled background is void, meet it at once.
No ground truth is found there, so that class's AP at that threshold is 0, the value the tool
gives a class with ground truth and no predictions; ``_evaluate_matches`` fills those in and
keeps the tool's own numbers for every other class and threshold.

Reported under task ``"cityscapes"`` (percent): ``AP``, ``AP50`` and ``AP-<class>``.
"""
import contextlib
import copy
import io
import logging
import os
import tempfile
from collections import OrderedDict
from typing import Any, Callable, Dict, List, Optional

import numpy as np
import pycocotools.mask as mask_util
from PIL import Image

from detcore.data.datasets.cityscapes import (
    CITYSCAPES_INSTANCE_CLASSES,
    CITYSCAPES_INSTANCE_LABEL_IDS,
    cityscapes_scripts,
    polygons_to_instance_ids,
)
from detcore.utils import strict_json

from .evaluator import DatasetEvaluator, predictions_to_evaluate

__all__ = ["CityscapesInstanceEvaluator", "METRICS_FILE"]

logger = logging.getLogger(__name__)

METRICS_FILE = "cityscapes_instance_metrics.json"
_IMAGE_SUFFIX = "_leftImg8bit.png"


class _NumpyWithIn1d:
    """numpy, plus ``in1d`` (removed in numpy 2.4), which cityscapesScripts' matching calls."""

    def __getattr__(self, name: str) -> Any:
        return getattr(np, name)

    @staticmethod
    def in1d(a, b):
        return np.isin(np.ravel(a), b)


def _cityscapes_eval_module():
    cityscapes_scripts()  # the install hint, if missing
    from cityscapesscripts.evaluation import evalInstanceLevelSemanticLabeling as cs_eval

    if not hasattr(cs_eval.np, "in1d"):
        cs_eval.np = _NumpyWithIn1d()
    return cs_eval


class CityscapesInstanceEvaluator(DatasetEvaluator):
    """Cityscapes instance AP / AP50 of mask predictions on a Cityscapes-layout dataset.

    Args:
        dataset_name: a registered Cityscapes dataset (``cityscapes_fine_instance_seg_val``);
            its records name each image's ground-truth files.
        output_dir: where ``cityscapes_instance_metrics.json`` goes (nothing when None).
        distributed: gather predictions to rank 0, which alone evaluates.
        records_fn: name -> records; default ``DatasetCatalog.get``.
    """

    def __init__(
        self,
        dataset_name: str,
        output_dir: Optional[str] = None,
        distributed: bool = True,
        *,
        records_fn: Optional[Callable[[str], List[dict]]] = None,
    ):
        if records_fn is None:
            from detcore.data import DatasetCatalog

            records_fn = DatasetCatalog.get
        self._dataset_name = dataset_name
        self._output_dir = output_dir
        self._distributed = distributed
        self._images: Dict[Any, dict] = {}
        for record in records_fn(dataset_name):
            missing = [k for k in ("file_name", "gt_polygons_file", "gt_instance_ids_file") if k not in record]
            if missing:
                raise ValueError(
                    f"CityscapesInstanceEvaluator: '{dataset_name}' is not a Cityscapes dataset: its record of "
                    f"{record.get('file_name')} has no {missing} (load it with load_cityscapes_instances)"
                )
            self._images[record["image_id"]] = record
        self._predictions: List[dict] = []

    def reset(self) -> None:
        self._predictions = []

    def process(self, inputs: List[dict], outputs: List[dict]) -> None:
        for inp, out in zip(inputs, outputs):
            image_id = inp.get("image_id")
            if image_id not in self._images:
                raise ValueError(
                    f"CityscapesInstanceEvaluator: image_id {image_id!r} ({inp.get('file_name')}) is not in "
                    f"dataset '{self._dataset_name}'"
                )
            inst = out["instances"]
            if len(inst) and not inst.has("pred_masks"):
                raise ValueError("CityscapesInstanceEvaluator: Cityscapes AP needs pred_masks (MODEL.MASK_ON True)")
            masks = inst.pred_masks.detach().cpu().numpy().astype(np.uint8) if len(inst) else []
            rles = [mask_util.encode(np.asfortranarray(m)) for m in masks]
            classes = inst.pred_classes.detach().cpu().tolist() if len(inst) else []
            scores = inst.scores.detach().cpu().tolist() if len(inst) else []
            self._predictions.append({"image_id": image_id, "rles": rles, "classes": classes, "scores": scores})

    def evaluate(self) -> "OrderedDict[str, Dict[str, float]]":
        predictions = predictions_to_evaluate(self._predictions, self._distributed, "CityscapesInstanceEvaluator")
        if predictions is None:
            return OrderedDict()
        first = {}
        for p in predictions:
            first.setdefault(p["image_id"], p)

        cs_eval = _cityscapes_eval_module()
        with tempfile.TemporaryDirectory(prefix="detcore_cityscapes_") as tmp:
            pred_dir, gt_dir = os.path.join(tmp, "pred"), os.path.join(tmp, "gt")
            os.makedirs(pred_dir)
            os.makedirs(gt_dir)
            pred_files, gt_files = [], []
            for image_id, pred in first.items():
                record = self._images[image_id]
                pred_files.append(self._write_prediction(pred, record, pred_dir))
                gt_files.append(self._ground_truth_png(record, gt_dir))
            averages = self._run(cs_eval, pred_dir, pred_files, gt_files, os.path.join(tmp, "gtInstances.json"))

        metrics = OrderedDict(AP=float(averages["allAp"]) * 100, AP50=float(averages["allAp50%"]) * 100)
        for name in CITYSCAPES_INSTANCE_CLASSES:
            metrics[f"AP-{name}"] = float(averages["classes"][name]["ap"]) * 100
        logger.info(
            "Cityscapes instance segmentation (%d images): AP %.2f  AP50 %.2f", len(first), metrics["AP"], metrics["AP50"]
        )
        results = OrderedDict(cityscapes=dict(metrics))
        if self._output_dir:
            os.makedirs(self._output_dir, exist_ok=True)
            with open(os.path.join(self._output_dir, METRICS_FILE), "w") as f:
                f.write(strict_json.dumps(results, indent=2))
        return results

    # --- the benchmark's files ------------------------------------------------------------------
    @staticmethod
    def _write_prediction(pred: dict, record: dict, pred_dir: str) -> str:
        """The masks as PNGs and the list file of one image; returns the list file's path."""
        base = os.path.basename(record["file_name"])
        base = base[: -len(_IMAGE_SUFFIX)] if base.endswith(_IMAGE_SUFFIX) else os.path.splitext(base)[0]
        lines = []
        for k, (rle, cls, score) in enumerate(zip(pred["rles"], pred["classes"], pred["scores"])):
            png = f"{base}_{k}_{CITYSCAPES_INSTANCE_CLASSES[cls]}.png"
            Image.fromarray(mask_util.decode(rle) * 255).save(os.path.join(pred_dir, png))
            lines.append(f"{png} {CITYSCAPES_INSTANCE_LABEL_IDS[cls]} {score:.8f}\n")
        path = os.path.join(pred_dir, f"{base}_pred.txt")
        with open(path, "w") as f:
            f.write("".join(lines))
        return path

    @staticmethod
    def _ground_truth_png(record: dict, gt_dir: str) -> str:
        """The image's instance-id PNG, drawn from its polygon json when it has none."""
        if os.path.isfile(record["gt_instance_ids_file"]):
            return os.path.abspath(record["gt_instance_ids_file"])
        path = os.path.join(gt_dir, os.path.basename(record["gt_instance_ids_file"]))
        Image.fromarray(polygons_to_instance_ids(record["gt_polygons_file"]).astype(np.uint16)).save(path)
        return path

    @staticmethod
    def _run(cs_eval, pred_dir: str, pred_files: List[str], gt_files: List[str], gt_cache: str) -> dict:
        args = cs_eval.args
        args.predictionPath = os.path.abspath(pred_dir)
        args.predictionWalk = None
        args.gtInstancesFile = gt_cache  # its own cache of the ground truth: fresh every time
        args.JSONOutput = False
        args.quiet = True
        args.colorized = False
        chatter = io.StringIO()
        try:
            with contextlib.redirect_stdout(chatter):
                cs_eval.setInstanceLabels(args)
                gt_instances = cs_eval.getGtInstances(gt_files, args)
                matches = cs_eval.matchGtWithPreds(pred_files, gt_files, gt_instances, args)
                ap_scores = _evaluate_matches(cs_eval, matches, args)
                return cs_eval.computeAverages(ap_scores, args)
        except SystemExit:  # its printError exits the process
            raise RuntimeError(f"cityscapesScripts' evaluation failed: {chatter.getvalue().strip()}") from None


def _evaluate_matches(cs_eval, matches: dict, args) -> np.ndarray:
    """cityscapesScripts' AP array ``[distance, class, overlap]`` of ``matches``, with AP 0 where
    its evaluateMatches would index an empty array (see the module docstring)."""
    try:
        return cs_eval.evaluateMatches(matches, args)
    except IndexError:
        pass
    # Class by class and threshold by threshold: the tool's own code for each, 0 where it fails.
    columns = {}
    for li, label in enumerate(args.instLabels):
        for oi, overlap in enumerate(args.overlaps):
            one = copy.copy(args)
            one.instLabels, one.overlaps = [label], np.asarray([overlap])
            try:
                columns[li, oi] = cs_eval.evaluateMatches(matches, one)[:, 0, 0]
            except IndexError:
                columns[li, oi] = None
    depth = next((len(c) for c in columns.values() if c is not None), 1)
    ap = np.zeros((depth, len(args.instLabels), len(args.overlaps)), float)
    for (li, oi), column in columns.items():
        ap[:, li, oi] = 0.0 if column is None else column
    return ap
