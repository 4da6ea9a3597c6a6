"""Running a model over a dataset and handing its outputs to an evaluator.

    results = inference_on_dataset(model, build_detection_test_loader(cfg, "shapes_val"),
                                   COCOEvaluator("shapes_val"))
    print(format_results(results))

Each rank runs its shard of the loader; the evaluator gathers (COCOEvaluator with
``distributed=True`` does) and rank 0 gets the metrics.
"""
import datetime
import logging
import math
import time
from contextlib import contextmanager
from typing import Dict, Iterable, Sequence, Union

import torch
from torch import nn

from detcore.evaluation import DatasetEvaluator, DatasetEvaluators
from detcore.utils.precision import inference_autocast

__all__ = ["inference_on_dataset", "inference_context", "format_results"]

logger = logging.getLogger(__name__)


@contextmanager
def inference_context(model: nn.Module):
    """``model.eval()`` inside the block; the previous train / eval mode restored after it."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def inference_on_dataset(
    model: nn.Module,
    data_loader: Iterable,
    evaluator: Union[DatasetEvaluator, Sequence[DatasetEvaluator]],
    log_period_s: float = 5.0,
    precision: str = "float32",
) -> Dict:
    """Run ``model`` in eval mode on every batch of ``data_loader``, feed the evaluator and
    return ``evaluator.evaluate()`` ({} on ranks that get no results).

    ``precision`` (TEST.PRECISION): "float32", or "bfloat16" to run the model under
    ``torch.autocast`` (see ``detcore.utils.precision``).

    Progress (images done, seconds per image, ETA) is logged at most every ``log_period_s``
    seconds; the first few batches are left out of the speed figure (warm-up).
    """
    if not isinstance(evaluator, DatasetEvaluator):
        evaluator = DatasetEvaluators(list(evaluator))
    try:
        total = len(data_loader)
    except TypeError:
        total = None
    autocast = inference_autocast(precision, _device_of(model))
    logger.info(
        "Running inference on %s batches in %s", total if total is not None else "an unknown number of", precision
    )
    evaluator.reset()
    num_warmup = min(5, total - 1) if total else 0
    start = time.perf_counter()
    timed_start, timed_images, images = start, 0, 0
    last_log = start
    with inference_context(model), torch.no_grad():
        for idx, inputs in enumerate(data_loader):
            if idx == num_warmup:
                timed_start, timed_images = time.perf_counter(), 0
            with autocast:  # the model only: the evaluator sees its float32 outputs
                outputs = model(inputs)
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                torch.cuda.synchronize()  # honest timings: wait for the GPU
            evaluator.process(inputs, outputs)
            images += len(inputs)
            timed_images += len(inputs)
            now = time.perf_counter()
            if now - last_log >= log_period_s and idx + 1 < (total or math.inf):
                per_image = (now - timed_start) / max(timed_images, 1)
                eta = ""
                if total is not None:
                    eta = f" ETA={datetime.timedelta(seconds=int(per_image * (total - idx - 1) * len(inputs)))}"
                logger.info("Inference done %d/%s. %.4f s / img.%s", idx + 1, total, per_image, eta)
                last_log = now
    elapsed = time.perf_counter() - start
    logger.info(
        "Inference on %d images took %s (%.4f s / img on this process)",
        images, datetime.timedelta(seconds=int(elapsed)), elapsed / max(images, 1),
    )
    results = evaluator.evaluate()
    return results if results is not None else {}


def _device_of(model: nn.Module) -> torch.device:
    tensor = next(model.parameters(), None)
    if tensor is None:
        tensor = next(model.buffers(), None)
    return tensor.device if tensor is not None else torch.device("cpu")


def format_results(results: Dict) -> str:
    """``{task: {metric: value}}`` as a small text table (one row per task), per-category APs
    on a second line of each task."""
    lines = []
    for task, metrics in results.items():
        if not isinstance(metrics, dict):
            lines.append(f"{task}: {metrics}")
            continue
        main = {k: v for k, v in metrics.items() if not str(k).startswith("AP-")}
        per_cat = {k[3:]: v for k, v in metrics.items() if str(k).startswith("AP-")}
        lines.append(f"{task}: " + "  ".join(f"{k} {_fmt(v)}" for k, v in main.items()))
        if per_cat:
            lines.append(f"{' ' * len(task)}  per category AP: " + "  ".join(f"{k} {_fmt(v)}" for k, v in per_cat.items()))
    return "\n".join(lines)


def _fmt(value) -> str:
    try:
        return f"{float(value):.2f}"
    except (TypeError, ValueError):
        return str(value)
