"""Resuming an optimizer and a schedule: the checkpoint gives the state (momentum, position),
the optimizer and schedule keep the settings they were built with, and the LR of the resumed
iteration is recomputed: exactly the uninterrupted LR with unchanged settings, the new one with
changed settings."""
import pytest
import torch
from torch import nn

from detcore.solver import WarmupCosineLR, WarmupMultiStepLR
from detcore.solver.resume import load_optimizer_state, load_scheduler_state


def parts(lr=0.1, momentum=0.9, milestones=(6,), schedule=WarmupMultiStepLR):
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum, weight_decay=1e-4)
    if schedule is WarmupMultiStepLR:
        sched = WarmupMultiStepLR(opt, list(milestones), gamma=0.1, warmup_iters=3)
    else:
        sched = WarmupCosineLR(opt, max_iters=10, warmup_iters=3)
    return model, opt, sched


def step(model, opt, sched):
    opt.zero_grad()
    model(torch.ones(4, 3)).sum().backward()
    opt.step()
    sched.step()


@pytest.mark.parametrize("schedule", [WarmupMultiStepLR, WarmupCosineLR])
def test_unchanged_settings_resume_the_exact_lr_and_momentum(schedule):
    model, opt, sched = parts(schedule=schedule)
    for _ in range(4):
        step(model, opt, sched)
    saved_opt, saved_sched = opt.state_dict(), sched.state_dict()
    lrs = []
    for _ in range(5):
        lrs.append(opt.param_groups[0]["lr"])
        step(model, opt, sched)

    model2, opt2, sched2 = parts(schedule=schedule)
    assert load_optimizer_state(opt2, saved_opt) == []
    assert load_scheduler_state(sched2, saved_sched) == []
    assert sched2.last_epoch == 4
    for k, v in saved_opt["state"].items():
        assert torch.equal(opt2.state_dict()["state"][k]["momentum_buffer"], v["momentum_buffer"])
    resumed = []
    for _ in range(5):
        resumed.append(opt2.param_groups[0]["lr"])
        step(model2, opt2, sched2)
    assert resumed == lrs  # bit for bit, across the milestone at 6


def test_changed_settings_apply_from_the_resumed_iteration_and_are_reported():
    model, opt, sched = parts()
    for _ in range(4):
        step(model, opt, sched)
    saved_opt, saved_sched = opt.state_dict(), sched.state_dict()

    _, opt2, sched2 = parts(lr=0.001, momentum=0.5, milestones=(5,))
    opt_changes = load_optimizer_state(opt2, saved_opt)
    sched_changes = load_scheduler_state(sched2, saved_sched)
    assert opt_changes == ["param_groups[0].momentum: 0.9 -> 0.5"]
    assert sched_changes == ["milestones: [6] -> [5]", "base_lrs: [0.1] -> [0.001]"]
    assert opt2.param_groups[0]["lr"] == 0.001  # iteration 4: after warmup, before the new milestone
    assert opt2.param_groups[0]["initial_lr"] == 0.001 and opt2.param_groups[0]["momentum"] == 0.5
    assert "momentum_buffer" in opt2.state_dict()["state"][0]  # the state still comes from the checkpoint
    sched2.step()
    assert opt2.param_groups[0]["lr"] == pytest.approx(0.0001)  # the new milestone


def test_a_schedule_without_a_closed_form_is_loaded_whole_and_says_so():
    model = nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda it: 0.5**it)
    for _ in range(3):
        opt.step()
        sched.step()
    saved = sched.state_dict()
    opt2 = torch.optim.SGD(model.parameters(), lr=0.2)
    sched2 = torch.optim.lr_scheduler.LambdaLR(opt2, lambda it: 0.5**it)
    changes = load_scheduler_state(sched2, saved)
    assert sched2.last_epoch == 3 and sched2.base_lrs == [0.1]
    assert changes[0] == "base_lrs: [0.1] -> [0.2]" and "no closed form" in changes[-1]
