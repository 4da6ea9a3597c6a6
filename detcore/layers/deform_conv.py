"""Deformable convolution (v1, and v2 "modulated" with a mask), drop-in for
torchvision.ops.deform_conv2d / DeformConv2d.

Written so that TorchScript can compile it (torch.jit.script), like torchvision's.
"""
import math
from typing import Optional, Tuple

import torch
from torch import Tensor, nn
from torch.nn import init
from torch.nn.modules.utils import _pair

from ._extension import OpArgumentError, check_int64, ensure_loaded


def deform_conv2d(
    input: Tensor,
    offset: Tensor,
    weight: Tensor,
    bias: Optional[Tensor] = None,
    stride: Tuple[int, int] = (1, 1),
    padding: Tuple[int, int] = (0, 0),
    dilation: Tuple[int, int] = (1, 1),
    mask: Optional[Tensor] = None,
) -> Tensor:
    """Deformable convolution: each kernel tap samples the input bilinearly at its regular
    position plus a learned offset (and, with ``mask``, scales the sample: DCN v2).

    Args:
        input: Tensor[N, C, H, W].
        offset: Tensor[N, 2 * offset_groups * kh * kw, out_h, out_w], (y, x) pairs per tap in
            row-major tap order; offset_groups (which split the input channels) is inferred
            from its channels.
        weight: Tensor[out_channels, C / groups, kh, kw]; groups is inferred from C.
        bias: optional Tensor[out_channels].
        stride, padding, dilation: int or (h, w), as in nn.Conv2d.
        mask: optional Tensor[N, offset_groups * kh * kw, out_h, out_w] of modulation scalars.

    Samples outside the map read as zero. Returns Tensor[N, out_channels, out_h, out_w].

    At a sampling point on an integer coordinate (where the bilinear blend has a kink) the offset
    gradient is the right derivative, as torchvision's, also at the border: a tap exactly at -1
    (zero offsets over the padding: a freshly initialised offset conv) gets the slope towards the
    map, where mmcv gives 0; a tap at H or W gets 0.
    """
    if not torch.jit.is_scripting():  # TorchScript cannot read the loader's state
        ensure_loaded()
    if input.dim() != 4:
        raise OpArgumentError("deform_conv2d: input must have shape [N, C, H, W], got " + str(input.shape))
    if weight.dim() != 4 or weight.shape[1] == 0:
        raise OpArgumentError(
            "deform_conv2d: weight must have shape [out_channels, in_channels / groups, kh, kw], got "
            + str(weight.shape)
        )
    if offset.dim() != 4:
        raise OpArgumentError(
            "deform_conv2d: the shape of the offset is not valid: offset must have shape "
            "[N, 2 * offset_groups * kh * kw, out_h, out_w], got "
            + str(offset.shape)
        )
    stride_h, stride_w = _pair(stride)
    pad_h, pad_w = _pair(padding)
    dil_h, dil_w = _pair(dilation)
    if not torch.jit.is_scripting():
        check_int64(
            "deform_conv2d", stride_h=stride_h, stride_w=stride_w, pad_h=pad_h, pad_w=pad_w, dilation_h=dil_h, dilation_w=dil_w
        )
    kernel_h, kernel_w = weight.shape[2], weight.shape[3]
    offset_groups = offset.shape[1] // (2 * kernel_h * kernel_w)
    groups = input.shape[1] // weight.shape[1]
    if offset_groups == 0:
        raise OpArgumentError(
            "deform_conv2d: the shape of the offset is not valid: offset.shape[1] must be a positive "
            "multiple of 2 * kh * kw = "
            + str(2 * kernel_h * kernel_w) + ", got " + str(offset.shape[1])
        )
    return torch.ops.detcore.deform_conv2d(
        input, weight, offset, mask, bias, stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, groups, offset_groups
    )


class DeformConv2d(nn.Module):
    """nn.Module form of `deform_conv2d` with its weight and bias (torchvision's constructor,
    initialization and repr); ``forward(input, offset, mask=None)``."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size,
        stride=1,
        padding=0,
        dilation=1,
        groups: int = 1,
        bias: bool = True,
    ):
        super().__init__()
        if in_channels % groups != 0:
            raise OpArgumentError(f"DeformConv2d: in_channels ({in_channels}) must be divisible by groups ({groups})")
        if out_channels % groups != 0:
            raise OpArgumentError(f"DeformConv2d: out_channels ({out_channels}) must be divisible by groups ({groups})")
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.kernel_size = _pair(kernel_size)
        self.stride = _pair(stride)
        self.padding = _pair(padding)
        self.dilation = _pair(dilation)
        self.groups = groups
        self.weight = nn.Parameter(
            torch.empty(out_channels, in_channels // groups, self.kernel_size[0], self.kernel_size[1])
        )
        if bias:
            self.bias = nn.Parameter(torch.empty(out_channels))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # nn.Conv2d's (and torchvision's) initialization.
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            fan_in, _ = init._calculate_fan_in_and_fan_out(self.weight)
            bound = 1 / math.sqrt(fan_in)
            init.uniform_(self.bias, -bound, bound)

    def forward(self, input: Tensor, offset: Tensor, mask: Optional[Tensor] = None) -> Tensor:
        return deform_conv2d(
            input, offset, self.weight, self.bias, stride=self.stride, padding=self.padding,
            dilation=self.dilation, mask=mask,
        )

    def __repr__(self) -> str:
        s = f"{self.__class__.__name__}({self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}"
        if self.padding != (0, 0):
            s += f", padding={self.padding}"
        if self.dilation != (1, 1):
            s += f", dilation={self.dilation}"
        if self.groups != 1:
            s += f", groups={self.groups}"
        if self.bias is None:
            s += ", bias=False"
        return s + ")"
