import pytest
import torch
from torch import nn

from detcore.layers.batch_norm import FrozenBatchNorm2d, get_norm


def _random_bn(num_features, seed=0):
    """An eval-mode BatchNorm2d with random affine values and running statistics."""
    g = torch.Generator().manual_seed(seed)
    bn = nn.BatchNorm2d(num_features)
    with torch.no_grad():
        bn.weight.copy_(torch.rand(num_features, generator=g) + 0.5)
        bn.bias.copy_(torch.randn(num_features, generator=g))
        bn.running_mean.copy_(torch.randn(num_features, generator=g))
        bn.running_var.copy_(torch.rand(num_features, generator=g) * 2 + 0.1)
    bn.num_batches_tracked.fill_(123)
    return bn.eval()


def test_fresh_frozen_bn_is_identity():
    x = torch.randn(2, 5, 3, 4)
    torch.testing.assert_close(FrozenBatchNorm2d(5)(x), x, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_matches_batchnorm_in_eval(dtype):
    bn = _random_bn(7).to(dtype)
    frozen = FrozenBatchNorm2d(7).to(dtype)
    frozen.load_state_dict(bn.state_dict())  # strict: num_batches_tracked must be accepted
    x = torch.randn(3, 7, 5, 6, dtype=dtype) * 3
    torch.testing.assert_close(frozen(x), bn(x))


def test_state_dict_keys_are_batchnorm_keys_and_nothing_is_a_parameter():
    frozen = FrozenBatchNorm2d(4)
    assert set(frozen.state_dict()) == {"weight", "bias", "running_mean", "running_var"}
    assert list(frozen.parameters()) == []


def test_grad_flows_to_input_not_to_buffers():
    frozen = FrozenBatchNorm2d(3)
    frozen.load_state_dict(_random_bn(3).state_dict())
    x = torch.randn(2, 3, 4, 4, requires_grad=True)
    frozen(x).sum().backward()
    # d/dx of x * scale + shift is the per-channel scale.
    scale = frozen.weight / torch.sqrt(frozen.running_var + frozen.eps)
    torch.testing.assert_close(x.grad, scale.view(1, 3, 1, 1).expand_as(x))
    assert all(b.grad is None for b in frozen.buffers())


def test_training_mode_does_not_change_statistics():
    frozen = FrozenBatchNorm2d(3)
    frozen.load_state_dict(_random_bn(3).state_dict())
    before = {k: v.clone() for k, v in frozen.state_dict().items()}
    frozen.train()
    x = torch.randn(4, 3, 5, 5) * 10 + 3
    y_train = frozen(x)
    for k, v in frozen.state_dict().items():
        torch.testing.assert_close(v, before[k], rtol=0, atol=0)
    torch.testing.assert_close(y_train, frozen.eval()(x))


def test_half_input_stays_half():
    frozen = FrozenBatchNorm2d(3)
    frozen.load_state_dict(_random_bn(3).state_dict())
    x = torch.randn(1, 3, 4, 4)
    y = frozen(x.to(torch.bfloat16))
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), frozen(x), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("shape", [(2, 4, 3), (2, 5, 3, 3)])
def test_bad_input_shape_names_the_argument(shape):
    with pytest.raises(ValueError, match=r"input x must have shape \(N, 4, H, W\)"):
        FrozenBatchNorm2d(4)(torch.randn(*shape))


def test_convert_frozen_batchnorm_recursive():
    model = nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1),
        _random_bn(4, seed=1),
        nn.ReLU(),
        nn.Sequential(nn.Conv2d(4, 6, 1), _random_bn(6, seed=2)),
    ).eval()
    old_bn = model[1]
    x = torch.randn(2, 3, 8, 8)
    expected = model(x)
    converted = FrozenBatchNorm2d.convert_frozen_batchnorm(model)
    assert converted is model  # children replaced in place
    assert isinstance(model[1], FrozenBatchNorm2d) and isinstance(model[3][1], FrozenBatchNorm2d)
    assert not any(isinstance(m, nn.BatchNorm2d) for m in model.modules())
    torch.testing.assert_close(model(x), expected)
    # The conversion copies values: later changes to the old BN do not leak in.
    with torch.no_grad():
        old_bn.weight.fill_(0.0)
    torch.testing.assert_close(model(x), expected)


def test_convert_a_bare_batchnorm_returns_a_new_module():
    bn = _random_bn(5)
    bn.eps = 1e-3
    frozen = FrozenBatchNorm2d.convert_frozen_batchnorm(bn)
    assert isinstance(frozen, FrozenBatchNorm2d) and frozen.eps == 1e-3
    x = torch.randn(2, 5, 3, 3)
    torch.testing.assert_close(frozen(x), bn(x))


def test_convert_syncbatchnorm_and_leave_other_norms():
    sync = nn.SyncBatchNorm(4)
    with torch.no_grad():
        sync.running_mean.fill_(2.0)
        sync.weight.fill_(3.0)
    model = nn.Sequential(sync, nn.GroupNorm(2, 4))
    FrozenBatchNorm2d.convert_frozen_batchnorm(model)
    assert isinstance(model[0], FrozenBatchNorm2d)
    assert torch.all(model[0].running_mean == 2.0) and torch.all(model[0].weight == 3.0)
    assert isinstance(model[1], nn.GroupNorm)


def test_get_norm_names():
    assert isinstance(get_norm("FrozenBN", 8), FrozenBatchNorm2d)
    bn = get_norm("BN", 8)
    assert type(bn) is nn.BatchNorm2d and bn.num_features == 8
    sync = get_norm("SyncBN", 8)
    assert isinstance(sync, nn.SyncBatchNorm) and sync.num_features == 8
    gn = get_norm("GN", 64)
    assert isinstance(gn, nn.GroupNorm) and gn.num_groups == 32 and gn.num_channels == 64
    assert get_norm("", 8) is None
    assert get_norm(None, 8) is None
    custom = get_norm(lambda c: nn.GroupNorm(4, c), 8)
    assert isinstance(custom, nn.GroupNorm) and custom.num_groups == 4


def test_get_norm_unknown_name_lists_the_choices():
    with pytest.raises(ValueError, match="unknown norm 'bn'.*'BN'.*'SyncBN'.*'FrozenBN'.*'GN'"):
        get_norm("bn", 8)
