"""Optimizer, gradient clipping and learning-rate schedule builders."""
from .build import NORM_MODULE_TYPES, build_gradient_clipper, build_optimizer, get_default_optimizer_params
from .lr_scheduler import WarmupCosineLR, WarmupMultiStepLR, build_lr_scheduler, warmup_factor_at_iter

__all__ = [
    "NORM_MODULE_TYPES",
    "build_gradient_clipper",
    "build_lr_scheduler",
    "build_optimizer",
    "get_default_optimizer_params",
    "warmup_factor_at_iter",
    "WarmupCosineLR",
    "WarmupMultiStepLR",
]
