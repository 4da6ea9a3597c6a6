"""Evaluation of model predictions: the evaluator protocol, COCO box / mask AP and proposal recall."""
from .coco_evaluation import METRICS_FILE, RESULTS_FILE, COCOEvaluator, instances_to_coco_json
from .evaluator import DatasetEvaluator, DatasetEvaluators
from .proposal_recall import greedy_proposal_overlaps, proposal_recall, proposal_recall_metrics

__all__ = [
    "COCOEvaluator",
    "DatasetEvaluator",
    "DatasetEvaluators",
    "greedy_proposal_overlaps",
    "instances_to_coco_json",
    "proposal_recall",
    "proposal_recall_metrics",
    "RESULTS_FILE",
    "METRICS_FILE",
]
