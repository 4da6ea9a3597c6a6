"""The interface an inference loop drives: ``reset()`` once, ``process()`` per batch, ``evaluate()``.

Keeping evaluators behind this small protocol lets one loop feed several of them (COCO AP, a
custom metric, a prediction dumper) without knowing what each computes.
"""
import logging
from collections import OrderedDict
from typing import Dict, List, Optional, Sequence, Tuple

import torch.distributed as dist

__all__ = ["DatasetEvaluator", "DatasetEvaluators", "gather_to_main", "predictions_to_evaluate"]

logger = logging.getLogger(__name__)


def gather_to_main(records: List) -> Tuple[List, bool]:
    """All ranks' records on rank 0; ``(records, is_main)``. No-op when not distributed."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return records, True
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, records)
    if dist.get_rank() != 0:
        return [], False
    return [r for part in gathered for r in part], True


def predictions_to_evaluate(records: List, distributed: bool, evaluator_name: str) -> Optional[List]:
    """What ``evaluate()`` works on: every rank's records on rank 0 when ``distributed``, else this
    process's; ``None`` where there is nothing to do here (another rank, or no images processed,
    which is logged naming the evaluator), so that ``evaluate()`` returns no results."""
    if distributed:
        records, is_main = gather_to_main(records)
        if not is_main:
            return None
    if not records:
        logger.warning("%s: no images were processed; nothing to evaluate.", evaluator_name)
        return None
    return records


class DatasetEvaluator:
    """Accumulates (inputs, outputs) pairs over a dataset and turns them into metrics.

    Subclasses implement ``process`` and ``evaluate``; ``reset`` clears what ``process``
    accumulated so that one evaluator object can be reused for several evaluation rounds.
    """

    def reset(self) -> None:
        """Forget everything processed so far (called before each evaluation round)."""

    def process(self, inputs: List[dict], outputs: List[dict]) -> None:
        """Record one batch: ``inputs`` as given to the model, ``outputs`` as it returned them."""
        raise NotImplementedError

    def evaluate(self) -> Dict[str, Dict[str, float]]:
        """Metrics as ``{task: {metric: value}}``; may be empty on non-main ranks."""
        raise NotImplementedError


class DatasetEvaluators(DatasetEvaluator):
    """Several evaluators fed the same batches; their results merged into one dict."""

    def __init__(self, evaluators: Sequence[DatasetEvaluator]):
        self._evaluators = list(evaluators)

    def reset(self) -> None:
        for evaluator in self._evaluators:
            evaluator.reset()

    def process(self, inputs: List[dict], outputs: List[dict]) -> None:
        for evaluator in self._evaluators:
            evaluator.process(inputs, outputs)

    def evaluate(self) -> Dict[str, Dict[str, float]]:
        results = OrderedDict()
        for evaluator in self._evaluators:
            for task, metrics in (evaluator.evaluate() or {}).items():
                # Silently overwriting would report one evaluator's numbers under another's name.
                if task in results:
                    raise KeyError(
                        f"DatasetEvaluators: two evaluators both returned results for task '{task}'"
                    )
                results[task] = metrics
        return results
