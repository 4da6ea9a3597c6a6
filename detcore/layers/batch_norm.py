"""Normalization layers for backbones and heads, and the name → layer table used by configs.

Detection trains with a few images per GPU, far too few for batch statistics; so backbones
pretrained on ImageNet keep their BatchNorm statistics *and* affine parameters fixed:
`FrozenBatchNorm2d`. It holds the four BatchNorm tensors as buffers (not parameters), so an
optimizer never sees them and checkpoints of `nn.BatchNorm2d` load into it unchanged.
"""
import torch
from torch import nn


class FrozenBatchNorm2d(nn.Module):
    """BatchNorm2d with fixed statistics and affine parameters: y = (x - mean) / sqrt(var + eps)
    * weight + bias, computed as one per-channel scale and shift.

    Its state-dict keys are those of `nn.BatchNorm2d` (weight, bias, running_mean, running_var);
    a `num_batches_tracked` entry in a loaded state dict is ignored.
    """

    def __init__(self, num_features, eps=1e-5):
        super().__init__()
        self.num_features = num_features
        self.eps = eps
        self.register_buffer("weight", torch.ones(num_features))
        self.register_buffer("bias", torch.zeros(num_features))
        self.register_buffer("running_mean", torch.zeros(num_features))
        # 1 - eps makes a fresh layer an exact identity (scale = 1).
        self.register_buffer("running_var", torch.ones(num_features) - eps)

    def forward(self, x):
        if x.dim() != 4 or x.shape[1] != self.num_features:
            raise ValueError(
                f"FrozenBatchNorm2d: input x must have shape (N, {self.num_features}, H, W), "
                f"got {tuple(x.shape)}"
            )
        scale, shift = self.scale_and_shift(x.dtype)
        return x * scale.reshape(1, -1, 1, 1) + shift.reshape(1, -1, 1, 1)

    def scale_and_shift(self, dtype=None):
        """The per-channel (scale, shift) this layer applies, y = x * scale + shift, both of
        shape (C,), cast to `dtype` if given (so half-precision inputs stay half precision)."""
        scale = self.weight * (self.running_var + self.eps).rsqrt()
        shift = self.bias - self.running_mean * scale
        if dtype is not None:
            scale, shift = scale.to(dtype), shift.to(dtype)
        return scale, shift

    def _load_from_state_dict(
        self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
    ):
        # BatchNorm2d checkpoints carry a step counter that means nothing for a frozen layer.
        state_dict.pop(prefix + "num_batches_tracked", None)
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )

    def extra_repr(self):
        return f"{self.num_features}, eps={self.eps}"

    @classmethod
    def convert_frozen_batchnorm(cls, module):
        """Return `module` with every BatchNorm2d / SyncBatchNorm inside it replaced by a
        FrozenBatchNorm2d holding the same statistics and affine values.

        Children are replaced in place; if `module` itself is a batch norm, a new module is
        returned, so always use the return value.
        """
        if isinstance(module, (nn.BatchNorm2d, nn.SyncBatchNorm)):
            tensors = [t for t in (module.weight, module.running_mean) if t is not None]
            frozen = cls(module.num_features, eps=module.eps)
            if tensors:
                frozen = frozen.to(tensors[0].device)
            with torch.no_grad():
                if module.affine:
                    frozen.weight.copy_(module.weight.detach())
                    frozen.bias.copy_(module.bias.detach())
                if module.track_running_stats:
                    frozen.running_mean.copy_(module.running_mean)
                    frozen.running_var.copy_(module.running_var)
            return frozen
        for name, child in module.named_children():
            new_child = cls.convert_frozen_batchnorm(child)
            if new_child is not child:
                module.add_module(name, new_child)
        return module


def _group_norm_32(num_channels):
    return nn.GroupNorm(32, num_channels)


_NORMS = {
    "BN": nn.BatchNorm2d,
    "SyncBN": nn.SyncBatchNorm,
    "FrozenBN": FrozenBatchNorm2d,
    "GN": _group_norm_32,
}


def get_norm(norm, out_channels):
    """Build the normalization layer named `norm` for `out_channels` channels.

    `norm` is one of "BN", "SyncBN", "FrozenBN", "GN" (32 groups), "" or None (no norm: returns
    None), or a callable taking the channel count and returning a module.
    """
    if norm is None or norm == "":
        return None
    if callable(norm):
        return norm(out_channels)
    if norm not in _NORMS:
        raise ValueError(
            f"get_norm: unknown norm '{norm}'; expected one of "
            f"{', '.join(repr(k) for k in _NORMS)}, '' or a callable"
        )
    return _NORMS[norm](out_channels)
