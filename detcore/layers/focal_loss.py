"""Sigmoid focal loss, drop-in for torchvision.ops.sigmoid_focal_loss (RetinaNet's class loss).

One fused op (torch.ops.detcore.sigmoid_focal_loss): no sigmoid, cross-entropy or modulating
factor tensors in between, stable for logits of any size, gradients for inputs and targets.
Written so that TorchScript can compile it, like torchvision's.
"""
from typing import Sequence

import torch
from torch import Tensor

from ._extension import ensure_loaded
from .value_checks import ValueChecks, value_checks_enabled


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


def sigmoid_focal_loss_per_image(
    logits: Sequence[Tensor], labels: Tensor, alpha: float = 0.25, gamma: float = 2.0
) -> Tensor:
    """Each image's summed sigmoid focal loss over anchors labelled by class index, the way
    RetinaNet trains: equal to ``sigmoid_focal_loss(x[valid], one_hot(labels[valid]), alpha,
    gamma, "sum")`` per image, without concatenating the levels, gathering the valid anchors or
    building one-hot targets in int64: each of those is a pass over a ``[B, R, K]`` tensor (70 MB
    per image at 800x1333), in the forward and again in the backward: a visible share of a R-50
    RetinaNet training step on the CPU (docs/benchmarks.md, "Figures behind code choices").

    Args:
        logits: per level ``[B, R_l, K]`` float logits (contiguous ones are read in place).
        labels: ``[B, sum(R_l)]`` integer labels over the levels in order: a class in
            ``[0, K)``, ``K`` for background (all K targets 0), ``-1`` for ignored (no loss, zero
            gradient).
        alpha, gamma: as for ``sigmoid_focal_loss``.

    Returns:
        ``[B]`` per image sums, differentiable with respect to the logits. The gradient is
        the fused op's, scaled per image by the incoming gradient; ignored anchors get exactly 0.
    """
    logits = list(logits)
    if not logits or labels.dim() != 2:
        raise ValueError(
            f"sigmoid_focal_loss_per_image: need at least one level of logits and labels [B, R], got "
            f"{len(logits)} level(s) and labels of shape {tuple(labels.shape)}"
        )
    num_images, num_classes = labels.shape[0], logits[0].shape[-1]
    for i, x in enumerate(logits):
        if x.dim() != 3 or x.shape[0] != num_images or x.shape[2] != num_classes or not x.is_floating_point():
            raise ValueError(
                f"sigmoid_focal_loss_per_image: logits[{i}] must be a float [B={num_images}, R_l, K={num_classes}] "
                f"tensor, got {x.dtype} {tuple(x.shape)}"
            )
    total = sum(x.shape[1] for x in logits)
    if labels.shape[1] != total or labels.is_floating_point():
        raise ValueError(
            f"sigmoid_focal_loss_per_image: labels must be integers of shape [B={num_images}, R={total}] (the "
            f"levels' anchors), got {labels.dtype} {tuple(labels.shape)}"
        )
    # A value check (two syncs on a GPU), skipped inside trusted_inputs(); labels out of range
    # index nothing: a class >= K counts as background, one < 0 as ignored.
    check_values = not labels.is_cuda or value_checks_enabled()
    if check_values and labels.numel() and (int(labels.min()) < -1 or int(labels.max()) > num_classes):
        raise ValueError(
            f"sigmoid_focal_loss_per_image: labels must lie in [-1, {num_classes}] (-1 ignored, {num_classes} "
            f"background), got values in [{int(labels.min())}, {int(labels.max())}]"
        )
    # Half-precision logits (AMP) are summed in float32, as the fused op's autocast rule does; the
    # cast is outside the Function, so their gradient goes back in their own dtype.
    logits = [x.float() if x.dtype in (torch.float16, torch.bfloat16) else x for x in logits]
    ensure_loaded()
    return _FocalLossPerImage.apply(labels, float(alpha), float(gamma), *logits)


class _FocalLossPerImage(torch.autograd.Function):
    """sigmoid_focal_loss_per_image's autograd: per level, float targets (zeros, a 1 at each
    foreground anchor's class) and the fused op on each image's rows in place; the ignored
    anchors' loss is taken off again (they are few) and their gradient rows set to 0. The
    backward is one op call per level, giving that level's gradient in its own layout."""

    @staticmethod
    def forward(ctx, labels, alpha, gamma, *logits):
        num_images, num_classes = labels.shape[0], logits[0].shape[-1]
        per_image = logits[0].new_zeros(num_images)
        saved, ignored, start = [], [], 0
        for x in logits:
            x = x.contiguous()
            level_labels = labels[:, start : start + x.shape[1]]
            start += x.shape[1]
            targets = torch.zeros_like(x)
            image, anchor = ((level_labels >= 0) & (level_labels < num_classes)).nonzero(as_tuple=True)
            targets[image, anchor, level_labels[image, anchor]] = 1
            for i in range(num_images if x.numel() else 0):
                per_image[i] += torch.ops.detcore.sigmoid_focal_loss(x[i], targets[i], alpha, gamma, "sum")
            image, anchor = (level_labels < 0).nonzero(as_tuple=True)
            if len(image):
                rows = torch.ops.detcore.sigmoid_focal_loss(
                    x[image, anchor], targets[image, anchor], alpha, gamma, "none"
                ).sum(dim=1)
                per_image.index_add_(0, image, rows, alpha=-1)
            saved += [x, targets]
            ignored.append((image, anchor))
        ctx.save_for_backward(*saved)
        ctx.ignored, ctx.alpha, ctx.gamma = ignored, alpha, gamma
        ctx.value_checks = value_checks_enabled()  # the backward checks as the forward did
        return per_image

    @staticmethod
    def backward(ctx, grad):
        with ValueChecks(ctx.value_checks):
            return _FocalLossPerImage._backward(ctx, grad)

    @staticmethod
    def _backward(ctx, grad):
        saved = ctx.saved_tensors
        # One value for all images (a plain sum or a shared normalizer): the op scales by it;
        # otherwise each image's rows are scaled after (d * 1 * w: the same product).
        uniform = bool((grad == grad[:1]).all())  # (True without images: no level has rows then)
        scale = grad[0] if uniform and len(grad) else torch.ones((), dtype=grad.dtype, device=grad.device)
        grads = []
        for (x, targets), (image, anchor) in zip(zip(saved[0::2], saved[1::2]), ctx.ignored):
            if x.numel() == 0:  # a level without anchors (tiny images): no kernel launch
                grads.append(torch.zeros_like(x))
                continue
            g, _ = torch.ops.detcore._sigmoid_focal_loss_backward(
                scale, x, targets, ctx.alpha, ctx.gamma, "sum", False
            )
            if not uniform:
                g.mul_(grad.to(g.dtype).view(-1, 1, 1))
            g[image, anchor] = 0
            grads.append(g)
        return (None, None, None, *grads)
