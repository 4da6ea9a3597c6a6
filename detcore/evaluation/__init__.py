"""Evaluation of model predictions: the evaluator protocol, COCO box / mask AP, Pascal VOC AP and
Cityscapes instance AP."""
from .cityscapes_evaluation import CityscapesInstanceEvaluator
from .coco_evaluation import METRICS_FILE, RESULTS_FILE, COCOEvaluator, instances_to_coco_json
from .evaluator import DatasetEvaluator, DatasetEvaluators
from .pascal_voc_evaluation import PascalVOCDetectionEvaluator

# The values of a dataset's metadata ``evaluator_type`` that DefaultTrainer.build_evaluator knows.
EVALUATOR_TYPES = ("coco", "pascal_voc", "cityscapes_instance")

__all__ = [
    "EVALUATOR_TYPES",
    "CityscapesInstanceEvaluator",
    "COCOEvaluator",
    "PascalVOCDetectionEvaluator",
    "DatasetEvaluator",
    "DatasetEvaluators",
    "instances_to_coco_json",
    "RESULTS_FILE",
    "METRICS_FILE",
]
