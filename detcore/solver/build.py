"""The optimizer (SGD with per-parameter-group LR / weight decay) and gradient clipping.

Parameter groups follow detectron2's recipe: normalization layers' scale and shift get
``weight_decay_norm`` (decaying them towards 0 fights the normalization); every bias (a norm
layer's shift included) gets ``base_lr * bias_lr_factor``, and other layers' biases
``weight_decay_bias``; everything else ``base_lr`` and ``weight_decay``. Parameters with the same settings share one group, so the optimizer has a
handful of groups rather than one per tensor.
"""
from typing import Callable, Dict, Iterable, List, Optional

import torch
from torch import nn

from detcore.config.choices import CLIP_TYPES
from detcore.layers import FrozenBatchNorm2d

__all__ = ["get_default_optimizer_params", "build_optimizer", "build_gradient_clipper", "NORM_MODULE_TYPES"]

# Modules whose parameters are a normalization's scale / shift.
NORM_MODULE_TYPES = (
    nn.modules.batchnorm._BatchNorm,  # BatchNorm1d/2d/3d and SyncBatchNorm
    nn.GroupNorm,
    nn.LayerNorm,
    nn.LocalResponseNorm,
    nn.modules.instancenorm._InstanceNorm,
    FrozenBatchNorm2d,
)


def get_default_optimizer_params(
    model: nn.Module,
    base_lr: float,
    weight_decay: float,
    weight_decay_norm: float,
    bias_lr_factor: float = 1.0,
    weight_decay_bias: Optional[float] = None,
) -> List[Dict]:
    """Parameter groups (dicts with "params", "lr", "weight_decay") of ``model``'s trainable
    parameters; a parameter shared by several modules appears once."""
    if weight_decay_bias is None:
        weight_decay_bias = weight_decay
    groups: Dict[tuple, List[nn.Parameter]] = {}
    seen = set()
    for module in model.modules():
        is_norm = isinstance(module, NORM_MODULE_TYPES)
        for name, param in module.named_parameters(recurse=False):
            if not param.requires_grad or id(param) in seen:
                continue
            seen.add(id(param))
            is_bias = name == "bias"
            lr = base_lr * bias_lr_factor if is_bias else base_lr
            if is_norm:
                decay = weight_decay_norm
            else:
                decay = weight_decay_bias if is_bias else weight_decay
            groups.setdefault((lr, decay), []).append(param)
    if not groups:
        raise ValueError("get_default_optimizer_params: the model has no parameter with requires_grad=True")
    return [{"params": params, "lr": lr, "weight_decay": decay} for (lr, decay), params in groups.items()]


def build_optimizer(cfg, model: nn.Module) -> torch.optim.Optimizer:
    """SGD over ``get_default_optimizer_params`` with the SOLVER.* settings."""
    s = cfg.SOLVER
    params = get_default_optimizer_params(
        model,
        base_lr=s.BASE_LR,
        weight_decay=s.WEIGHT_DECAY,
        weight_decay_norm=s.WEIGHT_DECAY_NORM,
        bias_lr_factor=s.BIAS_LR_FACTOR,
    )
    if s.NESTEROV and s.MOMENTUM <= 0:
        raise ValueError(f"SOLVER.NESTEROV needs SOLVER.MOMENTUM > 0, got {s.MOMENTUM}")
    return torch.optim.SGD(params, lr=s.BASE_LR, momentum=s.MOMENTUM, nesterov=s.NESTEROV, weight_decay=s.WEIGHT_DECAY)


def build_gradient_clipper(cfg) -> Optional[Callable[[Iterable[torch.Tensor]], None]]:
    """``clip(parameters)`` from SOLVER.CLIP_GRADIENTS, or None when clipping is disabled.

    "norm" rescales all gradients together so that their NORM_TYPE-norm is at most CLIP_VALUE;
    "value" clamps every element to [-CLIP_VALUE, CLIP_VALUE]. The trainer calls it after the
    backward pass (and after unscaling, with AMP), before the optimizer step.
    """
    c = cfg.SOLVER.CLIP_GRADIENTS
    if not c.ENABLED:
        return None
    clip_value = float(c.CLIP_VALUE)
    if clip_value <= 0:
        raise ValueError(f"SOLVER.CLIP_GRADIENTS.CLIP_VALUE must be > 0, got {clip_value}")
    if c.CLIP_TYPE == "norm":
        norm_type = float(c.NORM_TYPE)

        def clip_norm(parameters):
            torch.nn.utils.clip_grad_norm_(list(parameters), clip_value, norm_type)

        return clip_norm
    if c.CLIP_TYPE == "value":

        def clip_value_(parameters):
            torch.nn.utils.clip_grad_value_(list(parameters), clip_value)

        return clip_value_
    raise ValueError(f"SOLVER.CLIP_GRADIENTS.CLIP_TYPE must be one of {list(CLIP_TYPES)}, got {c.CLIP_TYPE!r}")
