"""conv_norm: a FrozenBatchNorm2d folded into the conv must equal the conv followed by the norm,
in the output and in the gradients of the conv's weight, bias and input."""
import pytest
import torch
from torch import nn

from detcore.layers import Conv2d, FrozenBatchNorm2d
from detcore.layers.conv import conv_norm


def random_frozen_bn(channels, seed=0):
    g = torch.Generator().manual_seed(seed)
    bn = FrozenBatchNorm2d(channels)
    bn.weight.copy_(torch.rand(channels, generator=g) + 0.5)
    bn.bias.copy_(torch.randn(channels, generator=g))
    bn.running_mean.copy_(torch.randn(channels, generator=g))
    bn.running_var.copy_(torch.rand(channels, generator=g) + 0.1)
    return bn


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("stride,groups", [(1, 1), (2, 1), (1, 4)])
def test_folded_frozen_bn_equals_conv_then_norm(bias, stride, groups):
    torch.manual_seed(0)
    conv = nn.Conv2d(8, 12, 3, stride=stride, padding=1, groups=groups, bias=bias).double()
    bn = random_frozen_bn(12).double()
    x = torch.randn(2, 8, 9, 11, dtype=torch.float64, requires_grad=True)

    folded = conv_norm(conv, bn, x)
    folded_grads = torch.autograd.grad(folded.square().sum(), [x] + list(conv.parameters()))
    plain = bn(conv(x))
    plain_grads = torch.autograd.grad(plain.square().sum(), [x] + list(conv.parameters()))

    torch.testing.assert_close(folded, plain, rtol=1e-12, atol=1e-12)
    for got, expected in zip(folded_grads, plain_grads):
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)
    # The norm's tensors are buffers: folding must not make them trainable or change them.
    assert not any(t.requires_grad for t in bn.buffers())


def test_other_norms_and_none_run_after_the_conv():
    torch.manual_seed(0)
    conv = nn.Conv2d(4, 8, 1)
    x = torch.randn(1, 4, 5, 5)
    gn = nn.GroupNorm(2, 8)
    torch.testing.assert_close(conv_norm(conv, gn, x), gn(conv(x)))
    torch.testing.assert_close(conv_norm(conv, None, x), conv(x))


def test_conv2d_module_folds_its_frozen_norm_and_keeps_half_precision():
    torch.manual_seed(0)
    conv = Conv2d(4, 6, 3, padding=1, bias=False, norm=random_frozen_bn(6), activation=torch.relu)
    x = torch.randn(1, 4, 7, 7)
    expected = torch.relu(conv.norm(nn.functional.conv2d(x, conv.weight, padding=1)))
    torch.testing.assert_close(conv(x), expected, rtol=1e-5, atol=1e-5)
    assert conv.to(torch.bfloat16)(x.to(torch.bfloat16)).dtype == torch.bfloat16
