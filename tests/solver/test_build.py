"""Optimizer parameter groups (norm / bias factors) and gradient clipping."""
import math

import pytest
import torch
from torch import nn

from detcore.config import get_cfg
from detcore.layers import FrozenBatchNorm2d
from detcore.solver import build_gradient_clipper, build_optimizer, get_default_optimizer_params


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)  # weight + bias
        self.gn = nn.GroupNorm(2, 4)  # norm weight + bias
        self.bn = nn.BatchNorm2d(4)  # norm weight + bias
        self.frozen = FrozenBatchNorm2d(4)  # buffers only
        self.fc = nn.Linear(4, 2, bias=False)
        self.frozen_fc = nn.Linear(2, 2)
        for p in self.frozen_fc.parameters():
            p.requires_grad_(False)
        self.shared = self.fc  # the same module twice: its weight must appear once


def settings_of(groups):
    """{param id: (lr, weight_decay)} from optimizer-style groups."""
    out = {}
    for g in groups:
        for p in g["params"]:
            assert id(p) not in out, "a parameter appears in two groups"
            out[id(p)] = (g["lr"], g["weight_decay"])
    return out


def test_param_groups_norm_and_bias_factors():
    net = Net()
    groups = get_default_optimizer_params(net, base_lr=0.1, weight_decay=1e-4, weight_decay_norm=0.0, bias_lr_factor=2.0)
    got = settings_of(groups)
    expected = {
        id(net.conv.weight): (0.1, 1e-4),
        id(net.conv.bias): (0.2, 1e-4),
        id(net.gn.weight): (0.1, 0.0),
        id(net.gn.bias): (0.2, 0.0),
        id(net.bn.weight): (0.1, 0.0),
        id(net.bn.bias): (0.2, 0.0),
        id(net.fc.weight): (0.1, 1e-4),
    }
    assert got == pytest.approx(expected)
    # Same settings share a group: 4 distinct (lr, wd) pairs above.
    assert len(groups) == 4


def test_weight_decay_bias_separate_from_norm():
    net = Net()
    groups = get_default_optimizer_params(
        net, base_lr=1.0, weight_decay=0.5, weight_decay_norm=0.25, bias_lr_factor=1.0, weight_decay_bias=0.0
    )
    got = settings_of(groups)
    assert got[id(net.conv.bias)] == (1.0, 0.0)
    assert got[id(net.gn.bias)] == (1.0, 0.25)
    assert got[id(net.conv.weight)] == (1.0, 0.5)


def test_no_trainable_parameters_is_an_error():
    net = nn.Linear(2, 2).requires_grad_(False)
    with pytest.raises(ValueError, match="requires_grad"):
        get_default_optimizer_params(net, 0.1, 0.0, 0.0)


def test_build_optimizer_from_cfg():
    cfg = get_cfg()
    cfg.SOLVER.BASE_LR = 0.05
    cfg.SOLVER.MOMENTUM = 0.8
    cfg.SOLVER.NESTEROV = True
    cfg.SOLVER.WEIGHT_DECAY = 1e-3
    cfg.SOLVER.WEIGHT_DECAY_NORM = 0.0
    cfg.SOLVER.BIAS_LR_FACTOR = 2.0
    net = Net()
    opt = build_optimizer(cfg, net)
    assert isinstance(opt, torch.optim.SGD)
    for g in opt.param_groups:
        assert g["momentum"] == 0.8 and g["nesterov"] is True
    got = settings_of(opt.param_groups)
    assert got[id(net.conv.bias)] == pytest.approx((0.1, 1e-3))
    assert got[id(net.gn.weight)] == pytest.approx((0.05, 0.0))
    # One plain SGD step with nesterov momentum and weight decay, written out by hand.
    net.zero_grad()
    x = torch.randn(2, 3, 5, 5)
    before = net.conv.weight.detach().clone()
    net.fc(net.conv(x).mean(dim=(2, 3))).sum().backward()
    grad = net.conv.weight.grad.clone()
    opt.step()
    d = grad + 1e-3 * before  # weight decay
    buf = d  # first step: momentum buffer = d
    expected = before - 0.05 * (d + 0.8 * buf)  # nesterov
    torch.testing.assert_close(net.conv.weight.detach(), expected)


def _grads(values):
    params = [nn.Parameter(torch.zeros(len(v))) for v in values]
    for p, v in zip(params, values):
        p.grad = torch.tensor(v, dtype=torch.float32)
    return params


def test_clip_by_norm():
    cfg = get_cfg()
    cfg.SOLVER.CLIP_GRADIENTS.ENABLED = True
    cfg.SOLVER.CLIP_GRADIENTS.CLIP_TYPE = "norm"
    cfg.SOLVER.CLIP_GRADIENTS.CLIP_VALUE = 1.0
    params = _grads([[3.0, 0.0], [4.0]])  # total L2 norm 5
    build_gradient_clipper(cfg)(params)
    total = math.sqrt(sum(float((p.grad**2).sum()) for p in params))
    assert total == pytest.approx(1.0, rel=1e-4)
    torch.testing.assert_close(params[0].grad, torch.tensor([0.6, 0.0]), rtol=1e-4, atol=1e-6)


def test_clip_by_value():
    cfg = get_cfg()
    cfg.SOLVER.CLIP_GRADIENTS.ENABLED = True
    cfg.SOLVER.CLIP_GRADIENTS.CLIP_TYPE = "value"
    cfg.SOLVER.CLIP_GRADIENTS.CLIP_VALUE = 0.5
    params = _grads([[3.0, -2.0, 0.1]])
    build_gradient_clipper(cfg)(params)
    torch.testing.assert_close(params[0].grad, torch.tensor([0.5, -0.5, 0.1]))


def test_clipper_disabled_and_bad_type():
    cfg = get_cfg()
    assert build_gradient_clipper(cfg) is None
    cfg.SOLVER.CLIP_GRADIENTS.ENABLED = True
    cfg.SOLVER.CLIP_GRADIENTS.CLIP_TYPE = "full_model"
    with pytest.raises(ValueError, match="CLIP_TYPE"):
        build_gradient_clipper(cfg)
