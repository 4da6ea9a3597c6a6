"""COCO-style box, mask and keypoint AP of a model's predictions, computed with pycocotools, and
the recall of proposals (AR@100 / AR@1000, see proposal_recall.py).

Flow: ``process`` turns each image's predicted ``Instances`` into COCO result dicts (xywh boxes,
dataset category ids, RLE masks, keypoints) right away, so only small json-ready records are kept
and gathered across ranks; ``evaluate`` runs ``COCOeval`` once per task on rank 0 and reports
AP, AP50, AP75, APs, APm, APl (keypoints: AP, AP50, AP75, APm, APl, as COCO has no small
persons with keypoints) and per-category AP, in percent. Keypoint AP ranks detections by object
keypoint similarity (OKS) with the dataset's per-keypoint constants (``keypoint_oks_sigmas``).

The ground truth is a COCO json file, given directly or found through the metadata of a dataset
name (``MetadataCatalog``, or a ``metadata_fn`` given instead). Its unusable annotations (non-finite or absurd
coordinates, empty boxes, no real polygon) are dropped with a logged count before pycocotools
sees them, by the same rule as in training (``detcore.data.datasets.annotation_checks``). With no
detections at all, AP is 0 wherever there is ground truth to miss.
"""
import contextlib
import copy
import io
import json
import logging
import math
import os
from collections import OrderedDict
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import pycocotools.mask as mask_util
import torch

from detcore.data.datasets.annotation_checks import filter_coco_dataset
from detcore.data.datasets.coco_conversion import annotation_area, convert_to_coco_json
from detcore.data.datasets.keypoint_meta import keypoint_metadata_from_categories
from detcore.utils.cache import get_cache_dir
from detcore.structures import Boxes, Instances
from detcore.utils import strict_json

from .error_analysis import precision_recall
from .evaluator import DatasetEvaluator, predictions_to_evaluate
from .proposal_recall import LIMITS, proposal_recall_metrics

__all__ = ["COCOEvaluator", "instances_to_coco_json", "RESULTS_FILE", "METRICS_FILE"]

logger = logging.getLogger(__name__)

RESULTS_FILE = "coco_instances_results.json"
METRICS_FILE = "coco_eval_metrics.json"
_TASKS = ("bbox", "segm", "keypoints", "box_proposals")
# Which model output each task reads: detections (Instances with pred_*) or proposals (Instances
# with proposal_boxes and objectness_logits, as ProposalNetwork returns them).
_OUTPUT_OF_TASK = {"bbox": "instances", "segm": "instances", "keypoints": "instances", "box_proposals": "proposals"}
# COCOeval.stats[0:6] (bbox, segm) or [0:5] (keypoints), in order.
_AP_NAMES = ("AP", "AP50", "AP75", "APs", "APm", "APl")
_KEYPOINT_AP_NAMES = ("AP", "AP50", "AP75", "APm", "APl")


def _coco_api(use_fast_impl: bool):
    """``(COCO, COCOeval, backend name)``: faster_coco_eval when wanted and importable.

    faster_coco_eval mirrors pycocotools' API (``COCO(path)``, ``loadRes(list)``,
    ``COCOeval_faster(gt, dt, iouType)``, ``evaluate/accumulate/summarize``, ``stats[:12]`` and
    ``eval["precision"]`` in the same order), so everything below works with either. Its COCO
    class must load the ground truth too: its evaluator reads indexes pycocotools' COCO lacks.
    """
    if use_fast_impl:
        try:
            from faster_coco_eval import COCO, COCOeval_faster
        except ImportError:
            pass
        else:
            return COCO, COCOeval_faster, "faster_coco_eval"
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    return COCO, COCOeval, "pycocotools"


def _load_ground_truth(COCO, json_file: str):
    """A COCO API object of ``json_file`` without its unusable annotations."""
    with open(json_file) as f:
        data = json.load(f)
    data, _ = filter_coco_dataset(data, json_file)
    _fill_missing_areas(data)
    # pycocotools prints while indexing; keep stdout for the metric tables.
    with contextlib.redirect_stdout(io.StringIO()):
        coco = COCO()
        coco.dataset = data
        coco.createIndex()
    return coco


def _fill_missing_areas(data: dict) -> None:
    """COCOeval buckets ground truth by its "area", which hand-made jsons often leave out:
    take the segmentation's area (the box's for box-only annotations), as COCO defines it.
    Likewise its keypoint evaluation ignores ground truth by "num_keypoints": count them."""
    sizes = {img["id"]: (img["height"], img["width"]) for img in data.get("images", [])}
    for ann in data.get("annotations", []):
        if "keypoints" in ann and "num_keypoints" not in ann:
            ann["num_keypoints"] = sum(1 for v in ann["keypoints"][2::3] if v > 0)
        if "area" not in ann:
            ann["area"] = annotation_area(ann.get("segmentation"), ann["bbox"], *sizes[ann["image_id"]])


def _meta_get(metadata: Any, key: str, default: Any = None) -> Any:
    """Read ``key`` from a metadata object (attributes) or a plain dict."""
    if isinstance(metadata, dict):
        return metadata.get(key, default)
    return getattr(metadata, key, default)


def instances_to_coco_json(
    instances: Instances, image_id: int, contiguous_to_dataset_id: Optional[Dict[int, int]] = None
) -> List[dict]:
    """COCO result dicts for one image's predictions.

    ``instances`` holds ``pred_boxes`` (xyxy), ``scores``, ``pred_classes`` (contiguous
    ``0..K-1``) and optionally ``pred_masks`` (bool ``[N, H, W]`` at ``instances.image_size``)
    and ``pred_keypoints`` (``[N, K, 3]`` x, y, score). Boxes become ``[x, y, w, h]``; classes
    become dataset ids through ``contiguous_to_dataset_id`` (identity when None); masks become
    compressed RLE with ``counts`` as str (json-ready); keypoints become COCO's flat
    ``[x1, y1, s1, ...]`` in pixel indices (x - 0.5, y - 0.5: the inverse of the loader's +0.5).
    """
    n = len(instances)
    if n == 0:
        return []
    for field in ("pred_boxes", "scores", "pred_classes"):
        if not instances.has(field):
            raise ValueError(f"instances_to_coco_json: instances need field '{field}' (have {list(instances.fields())})")
    boxes = instances.pred_boxes
    boxes = boxes.tensor if isinstance(boxes, Boxes) else torch.as_tensor(boxes)
    if boxes.shape != (n, 4):
        raise ValueError(f"instances_to_coco_json: pred_boxes must be [N, 4] xyxy, got {tuple(boxes.shape)}")
    boxes = boxes.detach().cpu().to(torch.float64).numpy().copy()
    boxes[:, 2:] -= boxes[:, :2]  # xyxy -> xywh
    scores = instances.scores.detach().cpu().tolist()
    classes = instances.pred_classes.detach().cpu().tolist()

    rles = None
    if instances.has("pred_masks"):
        rles = _encode_masks(instances.pred_masks, instances.image_size)
    keypoints = None
    if instances.has("pred_keypoints"):
        keypoints = instances.pred_keypoints.detach().cpu().to(torch.float64)
        if keypoints.dim() != 3 or keypoints.shape[0] != n or keypoints.shape[2] != 3:
            raise ValueError(
                f"instances_to_coco_json: pred_keypoints must be [N, K, 3] (x, y, score), got {tuple(keypoints.shape)}"
            )
        keypoints = keypoints.clone()
        keypoints[..., :2] -= 0.5

    results = []
    for i in range(n):
        cls = int(classes[i])
        if contiguous_to_dataset_id is None:
            category_id = cls
        elif cls in contiguous_to_dataset_id:
            category_id = contiguous_to_dataset_id[cls]
        else:
            raise ValueError(
                f"instances_to_coco_json: pred_classes holds {cls}, but the dataset has "
                f"{len(contiguous_to_dataset_id)} categories (contiguous ids 0..{len(contiguous_to_dataset_id) - 1})"
            )
        result = {
            "image_id": int(image_id),
            "category_id": int(category_id),
            "bbox": [float(v) for v in boxes[i]],
            "score": float(scores[i]),
        }
        if rles is not None:
            result["segmentation"] = rles[i]
        if keypoints is not None:
            result["keypoints"] = keypoints[i].reshape(-1).tolist()
        results.append(result)
    return results


def _encode_masks(masks, image_size: Tuple[int, int]) -> List[dict]:
    if isinstance(masks, torch.Tensor):
        masks = masks.detach().cpu().numpy()
    masks = np.asarray(masks)
    if masks.ndim != 3 or tuple(masks.shape[1:]) != tuple(image_size):
        raise ValueError(
            f"instances_to_coco_json: pred_masks must be bool [N, H, W] pasted at the image size "
            f"{tuple(image_size)}, got shape {tuple(masks.shape)} (paste [N, 1, M, M] mask "
            f"probabilities into the image first)"
        )
    if masks.dtype != np.bool_ and masks.dtype != np.uint8:
        raise ValueError(
            f"instances_to_coco_json: pred_masks must be bool (or uint8 0/1), got {masks.dtype}; "
            f"threshold mask probabilities first"
        )
    rles = []
    for mask in masks:
        # One instance at a time: a [H, W, N] Fortran copy of all masks can be hundreds of MB.
        rle = mask_util.encode(np.asfortranarray(mask[:, :, None].astype(np.uint8)))[0]
        rle["counts"] = rle["counts"].decode("utf-8")  # bytes are not json-serializable
        rles.append(rle)
    return rles


def _proposal_boxes(proposals: Instances) -> np.ndarray:
    """The ``[P, 4]`` xyxy float32 boxes of one image's proposals by decreasing objectness, at
    most as many as the largest AR limit."""
    for field in ("proposal_boxes", "objectness_logits"):
        if not proposals.has(field):
            raise ValueError(
                f"COCOEvaluator: 'proposals' need field '{field}' (have {list(proposals.fields())})"
            )
    boxes = proposals.proposal_boxes
    boxes = (boxes.tensor if isinstance(boxes, Boxes) else torch.as_tensor(boxes)).detach().cpu()
    order = torch.argsort(proposals.objectness_logits.detach().cpu(), descending=True, stable=True)
    return boxes[order[: max(LIMITS)]].to(torch.float32).numpy()


class COCOEvaluator(DatasetEvaluator):
    """COCO box / mask / keypoint AP of instance predictions against a COCO json ground truth.

    Args:
        dataset_name: path to the COCO json, or the name of a dataset: registered in
            ``DatasetCatalog`` (``coco:JSON[:IMAGE_ROOT]`` / ``voc:FOLDER[:SPLIT]`` names register
            themselves), or one that ``metadata_fn`` resolves.
        tasks: any of ``"bbox"``, ``"segm"``, ``"keypoints"``, ``"box_proposals"``. ``"segm"``
            (``"keypoints"``) is skipped (with a warning) when the predictions carry no masks
            (keypoints) or the ground truth has no segmentations (keypoints).
            ``"box_proposals"`` reads each output's ``"proposals"`` (a ProposalNetwork's) and
            reports AR@100 / AR@1000, all and by object size.
        output_dir: where ``coco_instances_results.json`` and ``coco_eval_metrics.json`` go
            (nothing is written when None).
        distributed: gather predictions from all ranks to rank 0 when torch.distributed is
            initialized; only rank 0 evaluates (the others return an empty dict).
        metadata_fn: ``name -> metadata`` (object or dict) with ``json_file`` and optionally
            ``thing_dataset_id_to_contiguous_id``; default ``MetadataCatalog.get``. A dataset whose
            metadata names no ``json_file`` (one registered from code) is converted to a COCO
            json from its records (``convert_to_coco_json``), cached in ``output_dir`` (else in
            the detcore cache folder) and reused while the records stay the same.
        records_fn: ``name -> records`` for that conversion; default ``DatasetCatalog.get``.
        dataset_id_to_contiguous_id: ``{json category id: model class index}``. Default: the
            metadata's, else the json's category ids in sorted order -> ``0..K-1``.
        per_category_ap: also report ``"AP-<category name>"`` per task.
        use_fast_impl: use faster_coco_eval when it is importable (same numbers, faster).
        kpt_oks_sigmas: the K per-keypoint OKS constants. Default: the metadata's
            ``keypoint_oks_sigmas``, else the json's (its categories' ``keypoint_oks_sigmas``, or
            COCO's for COCO's 17 person keypoints).
        pictures: also draw the evaluation's pictures into ``output_dir`` (``pictures.py``:
            precision-recall curves, per-category AP, confusion matrix, a gallery of the images
            with the most errors, read from each input's ``file_name``).

    Only images passed to ``process`` are evaluated, so a run on part of a dataset is scored
    on that part (an image processed with zero detections still counts its ground truth).
    """

    def __init__(
        self,
        dataset_name: Union[str, os.PathLike],
        tasks: Union[str, Sequence[str]] = ("bbox", "segm"),
        output_dir: Optional[str] = None,
        distributed: bool = True,
        *,
        metadata_fn: Optional[Callable[[str], Any]] = None,
        records_fn: Optional[Callable[[str], List[dict]]] = None,
        dataset_id_to_contiguous_id: Optional[Dict[int, int]] = None,
        per_category_ap: bool = True,
        use_fast_impl: bool = True,
        kpt_oks_sigmas: Optional[Sequence[float]] = None,
        pictures: bool = True,
    ):
        if isinstance(tasks, str):
            tasks = (tasks,)
        tasks = tuple(tasks)
        bad = [t for t in tasks if t not in _TASKS]
        if bad or not tasks:
            raise ValueError(f"COCOEvaluator: tasks must be a non-empty subset of {_TASKS}, got {tasks}")
        self._tasks = tasks
        self._output_dir = output_dir
        self._distributed = distributed
        self._per_category_ap = per_category_ap
        self._pictures = pictures
        self._coco_evals: Dict[str, Any] = {}  # task -> its COCOeval, kept for the pictures

        json_file, metadata = self._resolve_json(dataset_name, metadata_fn, records_fn, output_dir)
        self._json_file = json_file
        self._image_root = _meta_get(metadata, "image_root") if metadata is not None else None
        COCO, self._cocoeval_cls, self.backend = _coco_api(use_fast_impl)
        self._coco_gt = _load_ground_truth(COCO, json_file)

        if dataset_id_to_contiguous_id is None and metadata is not None:
            dataset_id_to_contiguous_id = _meta_get(metadata, "thing_dataset_id_to_contiguous_id")
        self._dataset_id_to_contiguous_id = self._check_mapping(dataset_id_to_contiguous_id)
        self._contiguous_to_dataset_id = {v: k for k, v in self._dataset_id_to_contiguous_id.items()}
        if kpt_oks_sigmas is None and metadata is not None:
            kpt_oks_sigmas = _meta_get(metadata, "keypoint_oks_sigmas")
        if kpt_oks_sigmas is None:
            kpt_oks_sigmas = keypoint_metadata_from_categories(
                self._coco_gt.dataset.get("categories", []), json_file
            ).get("keypoint_oks_sigmas")
        self._kpt_oks_sigmas = None if kpt_oks_sigmas is None else [float(v) for v in kpt_oks_sigmas]
        self._predictions: List[dict] = []

    # --- setup ----------------------------------------------------------------------------------
    @staticmethod
    def _resolve_json(dataset_name, metadata_fn, records_fn, output_dir) -> Tuple[str, Any]:
        name = os.fspath(dataset_name)
        if os.path.isfile(name):
            return name, None
        if metadata_fn is None:
            from detcore.data import DatasetCatalog, MetadataCatalog

            known = name in MetadataCatalog
            metadata = MetadataCatalog.get(name)  # registers a coco: / voc: name on first use
            if name not in DatasetCatalog and not metadata.has("json_file"):
                if not known:
                    MetadataCatalog.remove(name)  # the empty entry that get just made
                raise ValueError(
                    f"COCOEvaluator: '{name}' is neither a json file nor a registered dataset; pass the path of a "
                    f"COCO json, a name registered in DatasetCatalog (or a coco:JSON[:IMAGE_ROOT] / "
                    f"voc:FOLDER[:SPLIT] name), or metadata_fn (name -> metadata with json_file)"
                )
        else:
            metadata = metadata_fn(name)
        json_file = _meta_get(metadata, "json_file")
        if not json_file:
            # A dataset registered from code: score it against its own records.
            if records_fn is None:
                from detcore.data import DatasetCatalog

                records_fn = DatasetCatalog.get
            cache_dir = output_dir or os.path.join(get_cache_dir(), "coco_json")
            return convert_to_coco_json(name, cache_dir, records_fn(name), metadata), metadata
        if not os.path.isfile(json_file):
            raise ValueError(
                f"COCOEvaluator: the metadata of dataset '{name}' names json_file {json_file!r}, "
                f"which does not exist"
            )
        return json_file, metadata

    def _check_mapping(self, mapping: Optional[Dict[int, int]]) -> Dict[int, int]:
        json_ids = sorted(self._coco_gt.getCatIds())
        if mapping is None:
            return {cat_id: i for i, cat_id in enumerate(json_ids)}
        mapping = {int(k): int(v) for k, v in mapping.items()}
        unknown = sorted(set(mapping) - set(json_ids))
        if unknown:
            raise ValueError(
                f"COCOEvaluator: dataset_id_to_contiguous_id has category ids {unknown} that are "
                f"not in {self._json_file} (its ids: {json_ids})"
            )
        if sorted(mapping.values()) != list(range(len(mapping))):
            raise ValueError(
                f"COCOEvaluator: dataset_id_to_contiguous_id values must be 0..{len(mapping) - 1}, "
                f"each once; got {sorted(mapping.values())}"
            )
        return mapping

    @property
    def dataset_id_to_contiguous_id(self) -> Dict[int, int]:
        return dict(self._dataset_id_to_contiguous_id)

    # --- DatasetEvaluator -----------------------------------------------------------------------
    def reset(self) -> None:
        self._predictions = []

    def process(self, inputs: List[dict], outputs: List[dict]) -> None:
        if len(inputs) != len(outputs):
            raise ValueError(f"COCOEvaluator.process: {len(inputs)} inputs but {len(outputs)} outputs")
        needed = sorted({_OUTPUT_OF_TASK[t] for t in self._tasks})
        for inp, out in zip(inputs, outputs):
            if "image_id" not in inp:
                raise ValueError(f"COCOEvaluator.process: each input needs 'image_id'; got keys {sorted(inp)}")
            missing = [key for key in needed if key not in out]
            if missing:
                raise ValueError(
                    f"COCOEvaluator.process: tasks {list(self._tasks)} need {missing} in each output; got keys "
                    f"{sorted(out)} (a ProposalNetwork gives 'proposals', a detector 'instances')"
                )
            image_id = int(inp["image_id"])
            record = {"image_id": image_id, "instances": [], "file_name": inp.get("file_name")}
            if "instances" in needed:
                record["instances"] = instances_to_coco_json(out["instances"], image_id, self._contiguous_to_dataset_id)
            if "proposals" in needed:
                record["proposals"] = _proposal_boxes(out["proposals"])
            self._predictions.append(record)

    def evaluate(self) -> "OrderedDict[str, Dict[str, float]]":
        predictions = predictions_to_evaluate(self._predictions, self._distributed, "COCOEvaluator")
        if predictions is None:
            return OrderedDict()

        image_ids, coco_results, records = self._unique_images(predictions)
        if self._output_dir:
            os.makedirs(self._output_dir, exist_ok=True)
        if self._output_dir and any(_OUTPUT_OF_TASK[t] == "instances" for t in self._tasks):
            path = os.path.join(self._output_dir, RESULTS_FILE)
            with open(path, "w") as f:
                f.write(strict_json.dumps(coco_results))
            logger.info("COCOEvaluator: saved %d predictions to %s", len(coco_results), path)

        results = OrderedDict()
        self._coco_evals = {}
        for task in self._tasks:
            if task == "box_proposals":
                metrics = self._evaluate_box_proposals(records)
            else:
                metrics = self._evaluate_task(task, coco_results, image_ids)
            if metrics is not None:
                results[task] = metrics

        if self._output_dir:
            with open(os.path.join(self._output_dir, METRICS_FILE), "w") as f:
                f.write(strict_json.dumps(results, indent=2))
            if self._pictures and self._coco_evals:
                self._draw_pictures(coco_results, image_ids, records)
        self._coco_evals = {}
        return results

    def _draw_pictures(self, coco_results: List[dict], image_ids: List[int], records: List[dict]) -> None:
        """The evaluation pictures next to the metrics; a drawing problem is logged, never fatal
        (the numbers are written already)."""
        from .pictures import write_evaluation_pictures

        cat_ids = [self._contiguous_to_dataset_id[k] for k in range(len(self._contiguous_to_dataset_id))]
        files = {r["image_id"]: r["file_name"] for r in records if r.get("file_name")}
        try:
            write_evaluation_pictures(
                self._output_dir, self._coco_gt, coco_results, self._coco_evals, image_ids, cat_ids, files,
                self._image_root,
            )
        except Exception:  # a picture must never cost the evaluation's results
            logger.exception("COCOEvaluator: could not draw the evaluation pictures")

    # --- evaluation -----------------------------------------------------------------------------
    def _unique_images(self, predictions: List[dict]) -> Tuple[List[int], List[dict], List[dict]]:
        """Image ids, flat results and the records, each image once (samplers may pad with
        repeated images)."""
        seen, coco_results, records = set(), [], []
        for record in predictions:
            if record["image_id"] in seen:
                continue
            seen.add(record["image_id"])
            coco_results.extend(record["instances"])
            records.append(record)
        if len(seen) != len(predictions):
            logger.warning(
                "COCOEvaluator: %d images were processed more than once; their first predictions are used.",
                len(predictions) - len(seen),
            )
        unknown = sorted(seen - set(self._coco_gt.getImgIds()))
        if unknown:
            raise ValueError(
                f"COCOEvaluator: image ids {unknown[:10]} were processed but are not in {self._json_file}"
            )
        return sorted(seen), coco_results, records

    def _evaluate_box_proposals(self, records: List[dict]) -> Dict[str, float]:
        """AR@100 / AR@1000 (all, small, medium, large) of the processed images' proposals."""
        gt = self._coco_gt
        images = []
        for record in records:
            anns = [a for a in gt.loadAnns(gt.getAnnIds(imgIds=[record["image_id"]])) if not a.get("iscrowd", 0)]
            boxes = np.array([a["bbox"] for a in anns], dtype=np.float64).reshape(-1, 4)
            boxes[:, 2:] += boxes[:, :2]  # xywh -> xyxy
            images.append((record["proposals"], boxes, np.array([a["area"] for a in anns], dtype=np.float64)))
        metrics = proposal_recall_metrics(images)
        logger.info("Proposal recall: %s", "  ".join(f"{k} {v:.2f}" for k, v in metrics.items()))
        return metrics

    def _evaluate_task(self, task: str, coco_results: List[dict], image_ids: List[int]) -> Optional[Dict[str, float]]:
        if task == "segm":
            if any("segmentation" not in r for r in coco_results):
                logger.warning("COCOEvaluator: predictions have no pred_masks; skipping 'segm'.")
                return None
            if any("segmentation" not in a for a in self._coco_gt.dataset.get("annotations", [])):
                logger.warning("COCOEvaluator: ground truth lacks 'segmentation'; skipping 'segm'.")
                return None
        if task == "keypoints":
            if any("keypoints" not in r for r in coco_results):
                logger.warning("COCOEvaluator: predictions have no pred_keypoints; skipping 'keypoints'.")
                return None
            if not any("keypoints" in a for a in self._coco_gt.dataset.get("annotations", [])):
                logger.warning("COCOEvaluator: ground truth has no 'keypoints'; skipping 'keypoints'.")
                return None
            sigmas = self._oks_sigmas(coco_results)
        if not coco_results:
            logger.warning("COCOEvaluator: the model made no predictions; '%s' AP is 0 where there is ground truth.", task)
            return self._no_detection_metrics(task, image_ids)

        # loadRes edits the dicts it gets, and takes each detection's area (small / medium /
        # large) from the first of box, mask or keypoints it finds. Keep only what the task
        # reads: the mask's area for segm, as for the ground truth; for keypoints COCO's
        # results format (no box: the area spanned by the keypoints).
        other = {"bbox": ("segmentation", "keypoints"), "segm": ("bbox", "keypoints"), "keypoints": ("bbox", "segmentation")}
        dets = [{k: copy.deepcopy(v) for k, v in r.items() if k not in other[task]} for r in coco_results]
        with contextlib.redirect_stdout(io.StringIO()) as chatter:
            coco_dt = self._coco_gt.loadRes(dets)
            coco_eval = self._cocoeval_cls(self._coco_gt, coco_dt, task)
            coco_eval.params.imgIds = list(image_ids)
            if task == "keypoints":
                coco_eval.params.kpt_oks_sigmas = np.asarray(sigmas, dtype=np.float64)
            coco_eval.evaluate()
            coco_eval.accumulate()
        logger.debug("COCOeval (%s): %s", task, chatter.getvalue())
        self._coco_evals[task] = coco_eval
        n = len(image_ids)
        print(f"COCO {task} evaluation ({self.backend}, {n} image{'s' if n != 1 else ''}):")
        coco_eval.summarize()  # prints the 12-number table

        # COCOeval uses -1 for "no ground truth in this bucket"; report that as NaN.
        metrics = {
            name: float(coco_eval.stats[i] * 100) if coco_eval.stats[i] >= 0 else float("nan")
            for i, name in enumerate(_KEYPOINT_AP_NAMES if task == "keypoints" else _AP_NAMES)
        }
        logger.info(
            "COCO %s: %s", task, "  ".join(f"{k} {v:.2f}" for k, v in metrics.items())
        )
        if self._per_category_ap:
            per_category = self._per_category(coco_eval)
            metrics.update(per_category)
        return metrics

    def _oks_sigmas(self, coco_results: List[dict]) -> List[float]:
        num_keypoints = len(coco_results[0]["keypoints"]) // 3 if coco_results else None
        if self._kpt_oks_sigmas is None:
            raise ValueError(
                f"COCOEvaluator: keypoint AP needs one OKS constant per keypoint, and neither the dataset's "
                f"metadata (keypoint_oks_sigmas) nor the categories of {self._json_file} (keypoint_oks_sigmas; "
                "only COCO's 17 person keypoints have known ones) give them; pass kpt_oks_sigmas"
            )
        if num_keypoints is not None and num_keypoints != len(self._kpt_oks_sigmas):
            raise ValueError(
                f"COCOEvaluator: the predictions have {num_keypoints} keypoints but there are "
                f"{len(self._kpt_oks_sigmas)} OKS sigmas (keypoint_oks_sigmas)"
            )
        return self._kpt_oks_sigmas

    def _no_detection_metrics(self, task: str, image_ids: List[int]) -> Dict[str, float]:
        """What COCOeval would report for an empty detection list (it cannot take one): 0 for
        every metric with ground truth to miss, NaN (no ground truth) elsewhere."""
        gt = self._coco_gt
        anns = [a for a in gt.loadAnns(gt.getAnnIds(imgIds=image_ids)) if not a.get("iscrowd", 0)]
        if task == "keypoints":  # COCOeval ignores persons without labeled keypoints
            anns = [a for a in anns if a.get("num_keypoints", 0) > 0]
        areas = [float(a.get("area", a["bbox"][2] * a["bbox"][3])) for a in anns]
        # COCOeval's area ranges (inclusive), in the order of the names.
        if task == "keypoints":
            names, ranges = _KEYPOINT_AP_NAMES, [(0, 1e10)] * 3 + [(32**2, 96**2), (96**2, 1e10)]
        else:
            names, ranges = _AP_NAMES, [(0, 1e10)] * 3 + [(0, 32**2), (32**2, 96**2), (96**2, 1e10)]
        metrics = {
            name: 0.0 if any(lo <= area <= hi for area in areas) else float("nan")
            for name, (lo, hi) in zip(names, ranges)
        }
        if self._per_category_ap:
            present = {a["category_id"] for a in anns}
            for cat_id in sorted(gt.getCatIds()):
                metrics[f"AP-{gt.cats[cat_id]['name']}"] = 0.0 if cat_id in present else float("nan")
        return metrics

    def _per_category(self, coco_eval) -> Dict[str, float]:
        pr = precision_recall(coco_eval)
        out = {f"AP-{name}": float(ap) for name, ap in zip(pr.names, pr.ap)}
        if out:
            logger.info(
                "Per-category %s AP: %s", coco_eval.params.iouType,
                ", ".join(f"{k[3:]} {v:.2f}" for k, v in out.items() if not math.isnan(v)),
            )
        return out
