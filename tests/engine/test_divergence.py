"""DivergenceGuard's rules on hand-made losses and weights: NaN / inf, a loss past
MAX_LOSS_GROWTH times the run's first one, weights past MAX_WEIGHT_GROWTH times their starting
norm; which iteration's weights each verdict blames; the references surviving a checkpoint.
Then the shapes recipe itself (slow): its normal first iterations stay far from both bounds,
and with SOLVER.BASE_LR 1e4 it stops, keeps no diverged weights as the last good state, and
resumes with the recipe's LR without diverging again. The toy trainer's behaviour (stop, the
checkpoint set aside, resume with another LR) is in test_defaults.py."""
import math
import os

import pytest
import torch
from torch import nn

from detcore.engine import DefaultTrainer, seed_all_rng
from detcore.engine.divergence import DivergenceGuard, TrainingDiverged, weight_norm
from detcore.engine.train_loop import HookBase

from .toy_model import R18_CONFIG, make_cfg


def model_with(*values):
    model = nn.Linear(len(values), 1, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([values]))
    return model


def test_weight_norm_is_the_l2_norm_of_all_parameters_together_without_overflow():
    model = nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 1))
    expected = math.sqrt(sum(float((p.detach().double() ** 2).sum()) for p in model.parameters()))
    assert weight_norm(list(model.parameters())) == pytest.approx(expected, rel=1e-12)
    huge = [torch.full((4,), 3e38)]  # float32 squares overflow; the float64 sum does not
    assert weight_norm(huge) == pytest.approx(6e38, rel=1e-6)
    assert weight_norm([]) == 0.0


def test_non_finite_losses_blame_the_weights_of_the_previous_iteration():
    guard = DivergenceGuard()
    guard.check_losses(0, {"a": 1.0})
    with pytest.raises(TrainingDiverged, match=r"Loss became infinite or NaN at iteration=5: b=nan\. .*--resume SOLVER\.BASE_LR") as info:
        guard.check_losses(5, {"a": 1.0, "b": float("nan")})
    assert info.value.bad_weights_iteration == 4
    assert isinstance(info.value, FloatingPointError)


def test_a_loss_past_max_loss_growth_times_the_first_one_stops_training():
    guard = DivergenceGuard(max_loss_growth=100)
    guard.check_losses(0, {"a": 2.0, "b": 0.5})  # the first total loss: 2.5
    guard.check_losses(1, {"a": 200.0, "b": 50.0})  # 250 = 100 x 2.5: still allowed
    with pytest.raises(TrainingDiverged, match=r"iteration=2: the total loss is 250\.1, more than .*MAX_LOSS_GROWTH=100 times the run's first loss 2\.5") as info:
        guard.check_losses(2, {"a": 200.1, "b": 50.0})
    assert info.value.bad_weights_iteration == 1
    off = DivergenceGuard(max_loss_growth=0)  # off: any finite loss passes
    off.check_losses(0, {"a": 1.0})
    off.check_losses(1, {"a": 1e30})


def test_weights_past_max_weight_growth_times_their_starting_norm_are_not_saved():
    guard = DivergenceGuard(max_weight_growth=10)
    guard.start(model_with(3.0, 4.0))  # norm 5
    guard.start(model_with(300.0, 400.0))  # only the first call counts
    guard.check_weights(3, model_with(30.0, 40.0))  # 50 = 10 x 5
    with pytest.raises(TrainingDiverged, match=r"by iteration=4: the weights' norm is 50\.01, more than .*MAX_WEIGHT_GROWTH=10 times their norm when the run started \(5\)") as info:
        guard.check_weights(4, model_with(30.0, 40.01))
    assert info.value.bad_weights_iteration == 4  # these weights themselves
    with pytest.raises(TrainingDiverged, match=r"infinite or NaN weights \(weight\)"):
        DivergenceGuard().check_weights(1, model_with(1.0, float("inf")))
    off = DivergenceGuard(max_weight_growth=0)
    off.start(model_with(3.0, 4.0))
    off.check_weights(1, model_with(3e9, 4e9))


def test_non_finite_gradients_name_the_parameters():
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 1))
    model(torch.ones(1, 2)).sum().backward()
    model[1].weight.grad[0, 0] = float("inf")
    params = [p for p in model.parameters() if p.grad is not None]
    with pytest.raises(TrainingDiverged, match=r"Gradients became infinite or NaN at iteration=3 \(losses: a=1\) in 1\.weight\.") as info:
        DivergenceGuard().check_gradients(3, {"a": 1.0}, params, model)
    assert info.value.bad_weights_iteration == 2


def test_the_references_travel_in_the_state_dict():
    guard = DivergenceGuard(max_loss_growth=10, max_weight_growth=10)
    guard.start(model_with(3.0, 4.0))
    guard.check_losses(0, {"a": 2.0})
    resumed = DivergenceGuard(max_loss_growth=10, max_weight_growth=10)
    resumed.load_state_dict(guard.state_dict())
    resumed.start(model_with(300.0, 400.0))  # a resumed run keeps the original start
    assert resumed.state_dict() == {"first_loss": 2.0, "first_weight_norm": 5.0}
    with pytest.raises(TrainingDiverged, match="first loss 2"):
        resumed.check_losses(7, {"a": 20.5})
    old = DivergenceGuard()
    old.load_state_dict({})  # a checkpoint from before the references: they are taken anew
    assert old.state_dict() == {"first_loss": None, "first_weight_norm": None}


@pytest.mark.parametrize("bad", [-1.0, float("nan"), "10", True])
def test_bad_bounds_are_refused(bad):
    with pytest.raises(ValueError, match="max_loss_growth must be a number >= 0"):
        DivergenceGuard(max_loss_growth=bad)


class _Record(HookBase):
    """Each iteration's total loss, and the weights' norm after it."""

    def __init__(self):
        self.losses, self.norms = {}, {}

    def after_step(self):
        self.losses[self.trainer.iter] = self.trainer.storage.history("total_loss").latest()
        self.norms[self.trainer.iter] = weight_norm(list(self.trainer.model.parameters()))


def recipe(out, *opts):
    """The shapes recipe as shipped (its data, model, LR schedule, gradient clipping), loading in
    the main process and evaluating nothing."""
    cfg = make_cfg(out, ["SEED", "7", "DATALOADER.NUM_WORKERS", "0", "DATASETS.TEST", "()", *opts], R18_CONFIG)
    cfg.freeze()
    seed_all_rng(7)
    return cfg


@pytest.mark.slow
def test_the_shapes_recipe_first_iterations_stay_far_from_both_bounds(tiny_cache, tmp_path, single_thread):
    cfg = recipe(tmp_path, "SOLVER.MAX_ITER", "100", "SOLVER.CHECKPOINT_PERIOD", "25")
    trainer = DefaultTrainer(cfg)
    trainer.resume_or_load(resume=False)
    record = _Record()
    trainer.register_hooks([record])
    trainer.train()  # no TrainingDiverged: every checkpoint was written
    assert sorted(f for f in os.listdir(tmp_path) if f.endswith(".pth"))[-1] == "model_final.pth"
    guard = trainer._trainer.guard
    loss_growth = max(record.losses.values()) / guard.first_loss
    weight_growth = max(record.norms.values()) / guard.first_weight_norm
    # Margins, not just "it did not fire": a tenth of the loss bound, a fifth of the weight bound.
    assert loss_growth < cfg.SOLVER.DIVERGENCE.MAX_LOSS_GROWTH / 10, record.losses
    assert weight_growth < cfg.SOLVER.DIVERGENCE.MAX_WEIGHT_GROWTH / 5, record.norms


@pytest.mark.slow
def test_the_shapes_recipe_at_base_lr_1e4_stops_and_resumes_at_its_own_lr(tiny_cache, tmp_path, single_thread):
    # The reproducer of the divergence finding: its last checkpoint held weights of 5e15, and
    # --resume SOLVER.BASE_LR 0.02 diverged again at once.
    opts = ["SOLVER.MAX_ITER", "12", "SOLVER.CHECKPOINT_PERIOD", "1"]
    trainer = DefaultTrainer(recipe(tmp_path, *opts, "SOLVER.BASE_LR", "1e4"))
    trainer.resume_or_load(resume=False)
    with pytest.raises(TrainingDiverged, match="--resume SOLVER.BASE_LR <lower>"):
        trainer.train()
    again = DefaultTrainer(recipe(tmp_path, *opts, "SOLVER.BASE_LR", "0.02"))
    again.resume_or_load(resume=True)
    if again.start_iter > 0:  # the last good state: weights within the bound
        guard = again._trainer.guard
        assert weight_norm(list(again.model.parameters())) <= 10 * guard.first_weight_norm
    record = _Record()
    again.register_hooks([record])
    again.train()  # the recipe's LR from the last good state: no divergence
    # and no wrecked weights to recover from: the losses stay near the run's first one.
    assert max(record.losses.values()) < 10 * again._trainer.guard.first_loss, record.losses
