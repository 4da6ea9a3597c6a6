"""inference_on_dataset: eval mode inside, mode restored, every batch to the evaluator, progress."""
import logging

import pytest
import torch
from torch import nn

from detcore.evaluation import DatasetEvaluator
from detcore.engine import format_results, inference_context, inference_on_dataset


class Doubler(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(1, 1)
        self.modes = []

    def forward(self, inputs):
        self.modes.append((self.training, torch.is_grad_enabled()))
        return [{"value": 2 * x["value"]} for x in inputs]


class SumEvaluator(DatasetEvaluator):
    def __init__(self, task="sum"):
        self.task = task
        self.reset_calls = 0
        self.seen = []

    def reset(self):
        self.reset_calls += 1
        self.seen = []

    def process(self, inputs, outputs):
        self.seen += [(i["value"], o["value"]) for i, o in zip(inputs, outputs)]

    def evaluate(self):
        return {self.task: {"total": float(sum(o for _, o in self.seen)), "count": len(self.seen)}}


def test_runs_every_batch_in_eval_mode_and_restores_train_mode(caplog):
    model = Doubler().train()
    loader = [[{"value": 1}, {"value": 2}], [{"value": 3}], [{"value": 4}]]
    evaluator = SumEvaluator()
    evaluator.seen = ["stale"]
    with caplog.at_level(logging.INFO, logger="detcore.engine.inference"):
        results = inference_on_dataset(model, loader, evaluator, log_period_s=0)
    assert results == {"sum": {"total": 20.0, "count": 4}}
    assert evaluator.reset_calls == 1
    assert model.modes == [(False, False)] * 3
    assert model.training
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("Inference done 1/3.") and "ETA=" in m for m in messages)
    assert any("Inference on 4 images took" in m for m in messages)


def test_several_evaluators_and_model_left_in_eval_mode_if_it_was():
    model = Doubler().eval()
    results = inference_on_dataset(model, [[{"value": 5}]], [SumEvaluator("a"), SumEvaluator("b")])
    assert results == {"a": {"total": 10.0, "count": 1}, "b": {"total": 10.0, "count": 1}}
    assert not model.training


def test_inference_context_restores_mode_on_error():
    model = Doubler().train()
    with pytest.raises(ValueError):
        with inference_context(model):
            assert not model.training
            raise ValueError
    assert model.training


def test_format_results():
    text = format_results({"bbox": {"AP": 50.0, "AP50": 75.123, "AP-circle": 40.0, "AP-square": float("nan")}})
    assert text.splitlines() == [
        "bbox: AP 50.00  AP50 75.12",
        "      per category AP: circle 40.00  square nan",
    ]


class AutocastRecorder(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 2)
        self.seen = []

    def forward(self, inputs):
        self.seen.append((torch.is_autocast_enabled("cpu"), self.lin(torch.ones(1, 2)).dtype))
        return [{"value": x["value"]} for x in inputs]


class AutocastEvaluator(SumEvaluator):
    def process(self, inputs, outputs):
        self.seen.append(torch.is_autocast_enabled("cpu"))

    def evaluate(self):
        return {"autocast": self.seen}


@pytest.mark.parametrize("precision, dtype", [("float32", torch.float32), ("bfloat16", torch.bfloat16)])
def test_precision_runs_the_model_under_autocast_and_the_evaluator_outside(precision, dtype):
    model = AutocastRecorder()
    results = inference_on_dataset(model, [[{"value": 1}], [{"value": 2}]], AutocastEvaluator(), precision=precision)
    assert model.seen == [(precision == "bfloat16", dtype)] * 2
    assert results == {"autocast": [False, False]}
    with pytest.raises(ValueError, match="TEST.PRECISION must be one of"):
        inference_on_dataset(model, [[{"value": 1}]], AutocastEvaluator(), precision="half")


def test_the_trainers_evaluation_runs_in_test_precision(monkeypatch):
    from detcore.config import get_cfg
    from detcore.engine import DefaultTrainer, defaults

    calls = []
    monkeypatch.setattr(defaults, "inference_on_dataset", lambda *args, **kwargs: calls.append(kwargs) or {})
    monkeypatch.setattr(DefaultTrainer, "build_test_loader", classmethod(lambda cls, cfg, name: []))
    cfg = get_cfg()
    cfg.merge_from_list(["TEST.PRECISION", "bfloat16", "DATASETS.TEST", "('a', 'b')"])
    DefaultTrainer.test(cfg, Doubler(), evaluators=[SumEvaluator(), SumEvaluator()])
    assert calls == [{"precision": "bfloat16"}] * 2
