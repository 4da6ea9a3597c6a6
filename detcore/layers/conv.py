"""A Conv2d that carries its normalization and activation, and the two caffe2-style inits.

Heads and FPN stack many "conv → norm → activation" units; keeping the norm inside the conv
module gives them one name each (`fpn_lateral2`, `fpn_lateral2.norm`), the detectron2 layout.
"""
from torch import nn

from .batch_norm import FrozenBatchNorm2d

__all__ = ["Conv2d", "conv_norm", "c2_xavier_fill", "c2_msra_fill"]


def conv_norm(conv, norm, x):
    """`norm(conv(x))` for an `nn.Conv2d` and a norm module (or None).

    A FrozenBatchNorm2d is folded into the convolution instead of run after it: its per-channel
    scale multiplies the weight (a weight-sized product) and its shift becomes the bias, which
    saves two passes over the output, forward and backward. The result is the same up to float
    rounding, and gradients still reach the conv's weight (through the product).
    """
    if isinstance(norm, FrozenBatchNorm2d):
        scale, shift = norm.scale_and_shift(conv.weight.dtype)
        weight = conv.weight * scale.reshape(-1, 1, 1, 1)
        bias = shift if conv.bias is None else conv.bias * scale + shift
        return conv._conv_forward(x, weight, bias)
    x = conv._conv_forward(x, conv.weight, conv.bias)
    return x if norm is None else norm(x)


class Conv2d(nn.Conv2d):
    """`nn.Conv2d` followed by an optional `norm` module and `activation` callable.

    Takes every argument of `nn.Conv2d`, plus keyword-only `norm` (a module or None) and
    `activation` (a callable such as `torch.nn.functional.relu`, or None).
    """

    def __init__(self, *args, norm=None, activation=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.norm = norm
        self.activation = activation

    def forward(self, x):
        # _conv_forward honours padding_mode (zeros, reflect, ...), plain F.conv2d does not.
        x = conv_norm(self, self.norm, x)
        if self.activation is not None:
            x = self.activation(x)
        return x


def c2_xavier_fill(module):
    """Caffe2's XavierFill: uniform in ±sqrt(3 / fan_in), i.e. kaiming_uniform with a=1; bias 0.

    The init of FPN and of most detection heads (detectron2, torchvision)."""
    nn.init.kaiming_uniform_(module.weight, a=1)
    if module.bias is not None:
        nn.init.zeros_(module.bias)


def c2_msra_fill(module):
    """Caffe2's MSRAFill: normal with std sqrt(2 / fan_out) (kaiming_normal, fan_out, relu);
    bias 0. The init of ResNet convs trained from scratch."""
    nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
    if module.bias is not None:
        nn.init.zeros_(module.bias)
