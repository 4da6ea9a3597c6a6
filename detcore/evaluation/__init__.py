"""Evaluation of model predictions: the evaluator protocol and COCO box / mask AP."""
from .coco_evaluation import METRICS_FILE, RESULTS_FILE, COCOEvaluator, instances_to_coco_json
from .evaluator import DatasetEvaluator, DatasetEvaluators

__all__ = [
    "COCOEvaluator",
    "DatasetEvaluator",
    "DatasetEvaluators",
    "instances_to_coco_json",
    "RESULTS_FILE",
    "METRICS_FILE",
]
