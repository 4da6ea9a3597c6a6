"""The hook protocol, one training step (NaN stop, AMP, gradient clipping)."""
import math

import pytest
import torch
from torch import nn

from detcore.engine import HookBase, SimpleTrainer, TrainerBase


class Recorder(HookBase):
    def __init__(self, log, name):
        self.log, self.name = log, name

    def before_train(self):
        self.log.append((self.name, "before_train", self.trainer.iter))

    def before_step(self):
        self.log.append((self.name, "before_step", self.trainer.iter))

    def after_step(self):
        self.log.append((self.name, "after_step", self.trainer.iter))

    def after_train(self):
        self.log.append((self.name, "after_train", self.trainer.iter, self.trainer.completed))


class CountingTrainer(TrainerBase):
    def __init__(self, log, fail_at=None):
        super().__init__()
        self.log, self.fail_at = log, fail_at

    def run_step(self):
        if self.iter == self.fail_at:
            raise RuntimeError("step failed")
        self.log.append(("step", self.iter))


def test_hooks_run_in_order_around_each_step():
    log = []
    trainer = CountingTrainer(log)
    trainer.register_hooks([Recorder(log, "a"), None, Recorder(log, "b")])
    trainer.train(3, 5)
    assert log == [
        ("a", "before_train", 3), ("b", "before_train", 3),
        ("a", "before_step", 3), ("b", "before_step", 3), ("step", 3), ("a", "after_step", 3), ("b", "after_step", 3),
        ("a", "before_step", 4), ("b", "before_step", 4), ("step", 4), ("a", "after_step", 4), ("b", "after_step", 4),
        ("a", "after_train", 5, True), ("b", "after_train", 5, True),
    ]
    assert trainer.storage.iter == 5


def test_after_train_runs_on_failure_and_says_so():
    log = []
    trainer = CountingTrainer(log, fail_at=1)
    trainer.register_hooks([Recorder(log, "a")])
    with pytest.raises(RuntimeError, match="step failed"):
        trainer.train(0, 4)
    assert log[-1] == ("a", "after_train", 1, False)
    assert ("step", 2) not in log


def test_register_hooks_rejects_other_objects():
    with pytest.raises(TypeError, match="HookBase"):
        CountingTrainer([]).register_hooks([object()])


class Quadratic(nn.Module):
    """loss_a = (w - 3)^2 summed, loss_b = |b|; a scripted loss can be injected per call."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(4))
        self.b = nn.Parameter(torch.ones(1))
        self.calls = 0
        self.poison = {}  # call index -> {loss name: value}
        self.seen_dtype = None

    def forward(self, batch):
        x = torch.as_tensor(batch, dtype=torch.float32)
        h = self.w * x
        self.seen_dtype = (h[None] @ torch.ones(4, 1)).dtype  # matmul: autocast changes its dtype
        losses = {"loss_a": ((h - 3) ** 2).sum(), "loss_b": self.b.abs().sum()}
        for name, value in self.poison.get(self.calls, {}).items():
            losses[name] = losses[name] * value
        self.calls += 1
        return losses


def endless(value=1.0):
    while True:
        yield [value] * 4


def test_step_updates_parameters_and_records_losses():
    model = Quadratic()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    trainer = SimpleTrainer(model, endless(), opt)
    trainer.train(0, 3)
    # w -> w - 0.1 * 2 (w - 3), three times from 0: 0.6, 1.08, 1.464
    torch.testing.assert_close(model.w.detach(), torch.full((4,), 1.464))
    hist = trainer.storage.history("total_loss").values()
    assert [it for _, it in hist] == [0, 1, 2]
    assert hist[0][0] == pytest.approx(4 * 9.0 + 1.0)
    assert trainer.storage.latest()["loss_a"][0] == pytest.approx(4 * (3 - 1.08) ** 2)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_loss_stops_before_the_update(bad):
    model = Quadratic()
    model.poison = {2: {"loss_b": bad}}
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    trainer = SimpleTrainer(model, endless(), opt)

    snapshot = {}

    class Snapshot(HookBase):
        def after_step(self):
            snapshot.update({k: v.detach().clone() for k, v in model.state_dict().items()})

    trainer.register_hooks([Snapshot()])
    with pytest.raises(FloatingPointError) as info:
        trainer.train(0, 10)
    message = str(info.value)
    assert "iteration=2" in message and "loss_b" in message and "loss_a" not in message
    for k, v in model.state_dict().items():  # the bad step changed nothing
        torch.testing.assert_close(v, snapshot[k], rtol=0, atol=0)
    assert model.calls == 3


def test_bfloat16_autocast_on_cpu():
    model = Quadratic()
    trainer = SimpleTrainer(model, endless(), torch.optim.SGD(model.parameters(), lr=0.01), amp_enabled=True, amp_dtype="bfloat16")
    assert trainer.grad_scaler is None
    trainer.train(0, 2)
    assert model.seen_dtype == torch.bfloat16
    assert model.w.dtype == torch.float32  # master weights stay float32


def test_float16_uses_a_grad_scaler_and_clips_unscaled_gradients():
    model = Quadratic()
    seen_norms = []

    def clipper(params):
        params = list(params)
        seen_norms.append(math.sqrt(sum(float((p.grad**2).sum()) for p in params)))
        torch.nn.utils.clip_grad_norm_(params, 1.0)

    trainer = SimpleTrainer(
        model, endless(), torch.optim.SGD(model.parameters(), lr=0.1), grad_clipper=clipper,
        amp_enabled=True, amp_dtype="float16",
    )
    assert isinstance(trainer.grad_scaler, torch.amp.GradScaler)
    trainer.train(0, 1)
    assert model.seen_dtype == torch.float16
    # True gradient at w = 0: dL/dw = 2 (w - 3) = -6 per element, db = 1 -> norm sqrt(4*36 + 1).
    assert seen_norms[0] == pytest.approx(math.sqrt(145), rel=1e-2)
    # Clipped to norm 1 before the step: w moved by lr * 6 / sqrt(145) per element.
    torch.testing.assert_close(model.w.detach(), torch.full((4,), 0.6 / math.sqrt(145)), rtol=1e-2, atol=1e-4)


def test_bad_amp_dtype_and_eval_mode_model():
    with pytest.raises(ValueError, match="AMP.DTYPE"):
        SimpleTrainer(Quadratic(), endless(), None, amp_enabled=True, amp_dtype="float8")
    model = Quadratic().eval()
    trainer = SimpleTrainer(model, endless(), torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(RuntimeError, match="eval mode"):
        trainer.train(0, 1)


class _InfiniteGradient(torch.autograd.Function):
    """Identity forward; the backward returns an infinite gradient (a loss that is finite while
    its gradient overflows, as with a huge learning rate)."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad * float("inf")


class BlowsUpInBackward(Quadratic):
    def forward(self, batch):
        losses = super().forward(batch)
        if self.calls == 3:  # the third step (calls counts the finished forward passes)
            losses["loss_b"] = _InfiniteGradient.apply(self.b).abs().sum()
        return losses


@pytest.mark.parametrize("clip", [False, True])
def test_non_finite_gradients_stop_before_the_step_and_name_the_parameters(clip):
    from detcore.config import get_cfg
    from detcore.solver import build_gradient_clipper

    cfg = get_cfg()
    cfg.SOLVER.CLIP_GRADIENTS.ENABLED = clip  # clipping an infinite norm would write NaN everywhere
    model = BlowsUpInBackward()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    trainer = SimpleTrainer(model, endless(), opt, grad_clipper=build_gradient_clipper(cfg))
    before = {}

    class Snapshot(HookBase):
        def after_step(self):
            before.update({k: v.detach().clone() for k, v in model.state_dict().items()})

    trainer.register_hooks([Snapshot()])
    with pytest.raises(FloatingPointError, match=r"Gradients became infinite or NaN at iteration=2 .*loss_a=.*in b\b"):
        trainer.train(0, 10)
    for k, v in model.state_dict().items():
        assert torch.isfinite(v).all()
        torch.testing.assert_close(v, before[k], rtol=0, atol=0)


def test_a_model_that_raises_floating_point_error_is_reported_with_the_iteration():
    class Diverges(Quadratic):
        def forward(self, batch):
            if self.calls == 1:
                raise FloatingPointError("RPN predicted non-finite boxes or objectness logits")
            return super().forward(batch)

    model = Diverges()
    trainer = SimpleTrainer(model, endless(), torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(FloatingPointError, match=r"Training diverged at iteration=1: RPN predicted non-finite"):
        trainer.train(0, 5)
