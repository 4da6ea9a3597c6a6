"""Evaluation of model predictions: the evaluator protocol, COCO box / mask AP, proposal recall,
Pascal VOC AP and Cityscapes instance AP."""
from .cityscapes_evaluation import CityscapesInstanceEvaluator
from .coco_evaluation import METRICS_FILE, RESULTS_FILE, COCOEvaluator, instances_to_coco_json
from .evaluator import DatasetEvaluator, DatasetEvaluators
from .pascal_voc_evaluation import PascalVOCDetectionEvaluator
from .proposal_recall import greedy_proposal_overlaps, proposal_recall, proposal_recall_metrics

# The values of a dataset's metadata ``evaluator_type`` that DefaultTrainer.build_evaluator knows.
EVALUATOR_TYPES = ("coco", "pascal_voc", "cityscapes_instance")

__all__ = [
    "EVALUATOR_TYPES",
    "CityscapesInstanceEvaluator",
    "COCOEvaluator",
    "PascalVOCDetectionEvaluator",
    "DatasetEvaluator",
    "DatasetEvaluators",
    "greedy_proposal_overlaps",
    "instances_to_coco_json",
    "proposal_recall",
    "proposal_recall_metrics",
    "RESULTS_FILE",
    "METRICS_FILE",
]
