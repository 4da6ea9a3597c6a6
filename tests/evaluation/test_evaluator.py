import pytest

from detcore.evaluation import DatasetEvaluator, DatasetEvaluators


class Counter(DatasetEvaluator):
    def __init__(self, task):
        self.task = task
        self.reset()

    def reset(self):
        self.images = 0

    def process(self, inputs, outputs):
        self.images += len(inputs)

    def evaluate(self):
        return {self.task: {"images": self.images}}


def test_evaluators_are_fed_the_same_batches_and_merged():
    both = DatasetEvaluators([Counter("a"), Counter("b")])
    both.reset()
    both.process([{}, {}], [{}, {}])
    both.process([{}], [{}])
    assert both.evaluate() == {"a": {"images": 3}, "b": {"images": 3}}
    both.reset()
    assert both.evaluate() == {"a": {"images": 0}, "b": {"images": 0}}


def test_duplicate_task_names_raise():
    with pytest.raises(KeyError, match="'a'"):
        DatasetEvaluators([Counter("a"), Counter("a")]).evaluate()


def test_base_class_requires_process_and_evaluate():
    with pytest.raises(NotImplementedError):
        DatasetEvaluator().process([], [])
    with pytest.raises(NotImplementedError):
        DatasetEvaluator().evaluate()
