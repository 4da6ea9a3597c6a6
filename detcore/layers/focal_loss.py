"""Sigmoid focal loss, drop-in for torchvision.ops.sigmoid_focal_loss (RetinaNet's class loss).

One fused op (torch.ops.detcore.sigmoid_focal_loss): no sigmoid, cross-entropy or modulating
factor tensors in between, stable for logits of any size, gradients for inputs and targets.
Written so that TorchScript can compile it, like torchvision's.
"""
import torch
from torch import Tensor

from ._extension import ensure_loaded


def sigmoid_focal_loss(
    inputs: Tensor,
    targets: Tensor,
    alpha: float = 0.25,
    gamma: float = 2,
    reduction: str = "none",
) -> Tensor:
    """The focal loss of Lin et al. (2017), https://arxiv.org/abs/1708.02002, with sigmoid
    probabilities: ``a_t * BCE(inputs, targets) * (1 - p_t) ** gamma`` elementwise.

    Args:
        inputs: float tensor of any shape, the logits.
        targets: tensor of the same shape: probabilities in [0, 1] (1 for the positive class,
            0 for the negative one, or anything between for soft targets). Other values, NaN
            included, are an error that names the element.
        alpha: weight of the positives in [0, 1] (negatives get 1 - alpha); negative (-1) for
            no weighting.
        gamma: exponent (>= 0) of the modulating factor (1 - p_t); 0 gives the cross-entropy.
        reduction: ``"none"`` (the loss per element), ``"mean"`` or ``"sum"``.

    Returns:
        The loss, of the shape of ``inputs`` for ``"none"``, else a scalar. Bad arguments raise
        ``OpArgumentError`` (a ``ValueError``, as torchvision raises for a bad reduction).

    Differences from torchvision: the same values to rounding, computed in one pass; finite
    gradients where torchvision's autograd gives NaN (gamma < 1 at saturated logits); any
    negative alpha means no weighting (torchvision accepts -1 only); targets outside [0, 1]
    are refused instead of giving a meaningless loss.
    """
    if not torch.jit.is_scripting():  # TorchScript cannot read the loader's state
        ensure_loaded()
    if inputs.dtype != targets.dtype and inputs.is_floating_point() and targets.is_floating_point():
        # torchvision's arithmetic promotes mixed float dtypes (float32 logits, float64 targets).
        dtype = torch.promote_types(inputs.dtype, targets.dtype)
        inputs, targets = inputs.to(dtype), targets.to(dtype)
    return torch.ops.detcore.sigmoid_focal_loss(inputs, targets, float(alpha), float(gamma), reduction)
