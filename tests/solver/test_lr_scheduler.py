"""LR schedule values at chosen iterations, against the formulas written out here."""
import math

import pytest
import torch

from detcore.config import get_cfg
from detcore.solver import WarmupCosineLR, WarmupMultiStepLR, build_lr_scheduler


def make_optimizer(base_lrs=(1.0,)):
    groups = [{"params": [torch.nn.Parameter(torch.zeros(1))], "lr": lr} for lr in base_lrs]
    return torch.optim.SGD(groups, lr=base_lrs[0], momentum=0.9)


def lrs_over(scheduler, optimizer, iters, group=0):
    """LR in effect at iterations 0..iters-1, stepping after each, as the trainer does."""
    out = []
    for _ in range(iters):
        out.append(optimizer.param_groups[group]["lr"])
        optimizer.step()
        scheduler.step()
    return out


def reference_multistep(it, base, steps, gamma, warmup_iters, warmup_factor, method):
    if it < warmup_iters:
        if method == "linear":
            a = it / warmup_iters
            w = warmup_factor * (1 - a) + a
        else:
            w = warmup_factor
    else:
        w = 1.0
    return base * w * gamma ** sum(1 for s in steps if s <= it)


@pytest.mark.parametrize("method", ["linear", "constant"])
def test_multistep_with_warmup(method):
    opt = make_optimizer((0.02,))
    sched = WarmupMultiStepLR(opt, milestones=[30, 45], gamma=0.1, warmup_factor=0.001, warmup_iters=10, warmup_method=method)
    got = lrs_over(sched, opt, 60)
    expected = [reference_multistep(i, 0.02, [30, 45], 0.1, 10, 0.001, method) for i in range(60)]
    assert got == pytest.approx(expected, rel=1e-9)
    # Spot values, by hand.
    assert got[0] == pytest.approx(0.02 * 0.001)
    if method == "linear":
        assert got[5] == pytest.approx(0.02 * (0.001 * 0.5 + 0.5))
    else:
        assert got[9] == pytest.approx(0.02 * 0.001)
    assert got[10] == pytest.approx(0.02)
    assert got[29] == pytest.approx(0.02)
    assert got[30] == pytest.approx(0.002)
    assert got[45] == pytest.approx(0.0002)


def test_per_group_base_lrs_scale_together():
    opt = make_optimizer((0.1, 0.2))  # e.g. a bias group with BIAS_LR_FACTOR 2
    sched = WarmupMultiStepLR(opt, [3], gamma=0.5, warmup_factor=0.5, warmup_iters=2)
    g0 = lrs_over(sched, opt, 5, group=0)
    opt2 = make_optimizer((0.1, 0.2))
    sched2 = WarmupMultiStepLR(opt2, [3], gamma=0.5, warmup_factor=0.5, warmup_iters=2)
    g1 = lrs_over(sched2, opt2, 5, group=1)
    assert g1 == pytest.approx([2 * v for v in g0])
    assert g0 == pytest.approx([0.05, 0.075, 0.1, 0.05, 0.05])


def test_cosine():
    opt = make_optimizer((1.0,))
    sched = WarmupCosineLR(opt, max_iters=100, warmup_factor=0.1, warmup_iters=10)
    got = lrs_over(sched, opt, 101)
    for it in (0, 5, 10, 50, 99, 100):
        w = 1.0 if it >= 10 else 0.1 * (1 - it / 10) + it / 10
        assert got[it] == pytest.approx(w * 0.5 * (1 + math.cos(math.pi * it / 100)), abs=1e-12)


def test_state_dict_round_trip_resumes_the_same_values():
    opt = make_optimizer((0.5,))
    sched = WarmupMultiStepLR(opt, [4, 8], warmup_iters=3, warmup_factor=0.2)
    lrs_over(sched, opt, 6)
    state, opt_state = sched.state_dict(), opt.state_dict()
    rest = lrs_over(sched, opt, 6)

    opt2 = make_optimizer((0.5,))
    sched2 = WarmupMultiStepLR(opt2, [4, 8], warmup_iters=3, warmup_factor=0.2)
    opt2.load_state_dict(opt_state)
    sched2.load_state_dict(state)
    assert lrs_over(sched2, opt2, 6) == pytest.approx(rest)


def test_build_from_cfg_and_errors():
    cfg = get_cfg()
    cfg.SOLVER.BASE_LR = 0.01
    cfg.SOLVER.STEPS = (5,)
    cfg.SOLVER.MAX_ITER = 10
    cfg.SOLVER.WARMUP_ITERS = 0
    opt = make_optimizer((0.01,))
    sched = build_lr_scheduler(cfg, opt)
    assert isinstance(sched, WarmupMultiStepLR)
    assert lrs_over(sched, opt, 7) == pytest.approx([0.01] * 5 + [0.001] * 2)

    cfg.SOLVER.LR_SCHEDULER_NAME = "WarmupCosineLR"
    assert isinstance(build_lr_scheduler(cfg, make_optimizer()), WarmupCosineLR)
    cfg.SOLVER.LR_SCHEDULER_NAME = "Poly"
    with pytest.raises(ValueError, match="LR_SCHEDULER_NAME"):
        build_lr_scheduler(cfg, make_optimizer())
    with pytest.raises(ValueError, match="increasing"):
        WarmupMultiStepLR(make_optimizer(), [8, 4])
    with pytest.raises(ValueError, match="WARMUP_METHOD"):
        WarmupMultiStepLR(make_optimizer(), [4], warmup_method="exp")
