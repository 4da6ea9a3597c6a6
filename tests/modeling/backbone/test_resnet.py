import math
import re

import pytest
import torch
from torch import nn

from detcore.config import get_cfg
from detcore.layers.batch_norm import FrozenBatchNorm2d
from detcore.layers.shape_spec import ShapeSpec
from detcore.modeling import build_backbone
from detcore.modeling.backbone.resnet import BasicBlock, ResNet, init_resnet_weights, make_stage

STAGES = ["res2", "res3", "res4", "res5"]


def _randomize_norms(model, seed=0):
    """Give every BatchNorm random affine values and statistics, so that parity tests cannot
    pass by accident of the identity-like default init."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                n = m.num_features
                m.weight.copy_(torch.rand(n, generator=g) * 0.5 + 0.5)
                m.bias.copy_(torch.randn(n, generator=g) * 0.1)
                m.running_mean.copy_(torch.randn(n, generator=g) * 0.1)
                m.running_var.copy_(torch.rand(n, generator=g) + 0.5)
    return model


def _torchvision_to_detcore(state_dict):
    """The renaming documented at the top of resnet.py: conv1/bn1 → stem.*, layer{k} → res{k+1};
    the classifier is dropped."""
    out = {}
    for key, value in state_dict.items():
        if key.startswith("fc."):
            continue
        if key.startswith(("conv1.", "bn1.")):
            key = "stem." + key
        else:
            key = re.sub(r"^layer(\d)\.", lambda m: f"res{int(m.group(1)) + 1}.", key)
        out[key] = value
    return out


def _torchvision_stages(model, x):
    x = model.maxpool(model.relu(model.bn1(model.conv1(x))))
    outs = {}
    for k, name in enumerate(STAGES, start=1):
        x = getattr(model, f"layer{k}")(x)
        outs[name] = x
    return outs


@pytest.mark.parametrize(
    "depth, num_groups, width_per_group, channels",
    [
        (18, 1, 64, [64, 128, 256, 512]),
        (50, 1, 64, [256, 512, 1024, 2048]),
        (101, 32, 8, [256, 512, 1024, 2048]),  # X-101-32x8d
    ],
)
def test_output_names_strides_channels(depth, num_groups, width_per_group, channels):
    model = ResNet(depth, num_groups=num_groups, width_per_group=width_per_group).eval()
    shapes = model.output_shape()
    assert list(shapes) == STAGES
    assert [s.channels for s in shapes.values()] == channels
    assert [s.stride for s in shapes.values()] == [4, 8, 16, 32]
    with torch.no_grad():
        out = model(torch.randn(1, 3, 64, 96))
    assert list(out) == STAGES
    for name, feature in out.items():
        stride = shapes[name].stride
        assert feature.shape == (1, shapes[name].channels, 64 // stride, 96 // stride)


def test_resnext_uses_grouped_3x3():
    model = ResNet(101, num_groups=32, width_per_group=8)
    conv = model.res2[0].conv2
    assert conv.groups == 32 and conv.in_channels == conv.out_channels == 256
    assert model.res5[0].conv2.out_channels == 2048


def test_out_features_subset_builds_only_needed_stages():
    model = ResNet(50, out_features=["res4", "stem"]).eval()
    assert model.stage_names == ["res2", "res3", "res4"]
    assert not hasattr(model, "res5")
    assert list(model.output_shape()) == ["stem", "res4"]
    assert model.output_shape()["stem"] == ShapeSpec(channels=64, stride=4)
    with torch.no_grad():
        out = model(torch.randn(1, 3, 64, 64))
    assert list(out) == ["stem", "res4"]
    assert out["stem"].shape == (1, 64, 16, 16) and out["res4"].shape == (1, 1024, 4, 4)


def test_res5_dilation_keeps_stride_16():
    model = ResNet(50, res5_dilation=2).eval()
    assert model.output_shape()["res5"].stride == 16
    first, later = model.res5[0], model.res5[1]
    assert first.conv2.stride == (1, 1) and first.conv2.dilation == (2, 2)
    assert first.conv2.padding == (2, 2) and later.conv2.dilation == (2, 2)
    with torch.no_grad():
        out = model(torch.randn(1, 3, 64, 96))
    assert out["res5"].shape == (1, 2048, 4, 6)
    assert out["res5"].shape[-2:] == out["res4"].shape[-2:]


@pytest.mark.parametrize("stride_in_1x1", [True, False])
def test_stride_in_1x1_places_the_stride(stride_in_1x1):
    model = ResNet(50, stride_in_1x1=stride_in_1x1)
    for name in ["res3", "res4", "res5"]:
        block = getattr(model, name)[0]
        strides = (block.conv1.stride, block.conv2.stride)
        assert strides == (((2, 2), (1, 1)) if stride_in_1x1 else ((1, 1), (2, 2)))
        assert block.downsample[0].stride == (2, 2)
    assert model.res2[0].conv1.stride == model.res2[0].conv2.stride == (1, 1)


@pytest.mark.parametrize(
    "arch, kwargs",
    [
        ("resnet18", dict(depth=18)),
        ("resnet34", dict(depth=34)),
        ("resnet50", dict(depth=50)),
        ("resnet101", dict(depth=101)),
        ("resnext50_32x4d", dict(depth=50, num_groups=32, width_per_group=4)),
    ],
)
def test_parameter_count_matches_torchvision(arch, kwargs):
    models = pytest.importorskip("torchvision.models")
    reference = getattr(models, arch)(weights=None)
    expected = sum(p.numel() for n, p in reference.named_parameters() if not n.startswith("fc."))
    ours = ResNet(norm="BN", **kwargs)  # FrozenBN holds buffers, not parameters
    assert sum(p.numel() for p in ours.parameters()) == expected


@pytest.mark.parametrize(
    "arch, kwargs",
    [
        ("resnet50", dict(depth=50)),
        ("resnet18", dict(depth=18)),
        ("resnext50_32x4d", dict(depth=50, num_groups=32, width_per_group=4)),
    ],
)
def test_numerical_parity_with_torchvision(arch, kwargs):
    models = pytest.importorskip("torchvision.models")
    torch.manual_seed(0)
    reference = _randomize_norms(getattr(models, arch)(weights=None)).eval()
    ours = ResNet(stride_in_1x1=False, norm="FrozenBN", **kwargs).eval()
    ours.load_state_dict(_torchvision_to_detcore(reference.state_dict()), strict=True)
    x = torch.randn(1, 3, 64, 80)
    with torch.no_grad():
        expected = _torchvision_stages(reference, x)
        actual = ours(x)
    for name in STAGES:
        assert expected[name].abs().max() > 0.1  # activations neither vanished nor all-zero
        torch.testing.assert_close(actual[name], expected[name], rtol=1e-4, atol=1e-4)


def test_stride_in_1x1_changes_the_function_for_the_same_weights():
    models = pytest.importorskip("torchvision.models")
    torch.manual_seed(0)
    reference = _randomize_norms(models.resnet50(weights=None)).eval()
    msra = ResNet(50, stride_in_1x1=True, out_features=["res3"]).eval()
    state = {
        k: v for k, v in _torchvision_to_detcore(reference.state_dict()).items()
        if k.startswith(("stem.", "res2.", "res3."))
    }
    msra.load_state_dict(state)
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        expected = _torchvision_stages(reference, x)["res3"]
        actual = msra(x)["res3"]
    assert actual.shape == expected.shape
    assert not torch.allclose(actual, expected, rtol=1e-2, atol=1e-2)


def _parts(model):
    return [("stem", model.stem)] + [(name, getattr(model, name)) for name in model.stage_names]


@pytest.mark.parametrize("freeze_at", [0, 1, 2, 3, 5])
def test_freeze_at(freeze_at):
    model = ResNet(18, norm="BN", freeze_at=freeze_at)
    for index, (name, part) in enumerate(_parts(model)):
        frozen = index < freeze_at  # stem is index 0, res2 index 1, ...
        assert all(p.requires_grad != frozen for p in part.parameters()), name
        norms = [m for m in part.modules() if isinstance(m, (nn.BatchNorm2d, FrozenBatchNorm2d))]
        assert norms and all(isinstance(m, FrozenBatchNorm2d) == frozen for m in norms), name


def test_freezing_preserves_eval_function_and_stops_statistics_updates():
    torch.manual_seed(0)
    trainable = _randomize_norms(ResNet(18, norm="BN", freeze_at=0)).eval()
    frozen = ResNet(18, norm="BN", freeze_at=2)
    frozen.load_state_dict(trainable.state_dict())  # num_batches_tracked ignored by FrozenBN
    frozen.eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        expected, actual = trainable(x), frozen(x)
    for name in STAGES:
        torch.testing.assert_close(actual[name], expected[name])

    frozen.train()
    before = {k: v.clone() for k, v in frozen.state_dict().items()}
    frozen(x)
    after = frozen.state_dict()
    assert torch.equal(after["stem.bn1.running_mean"], before["stem.bn1.running_mean"])
    assert torch.equal(after["res2.0.bn1.running_mean"], before["res2.0.bn1.running_mean"])
    assert not torch.equal(after["res3.0.bn1.running_mean"], before["res3.0.bn1.running_mean"])


def test_freeze_keeps_group_norm_but_stops_its_gradients():
    model = ResNet(50, norm="GN", freeze_at=2, out_features=["res3"]).eval()
    assert isinstance(model.stem.bn1, nn.GroupNorm) and not model.stem.bn1.weight.requires_grad
    assert isinstance(model.res3[0].bn1, nn.GroupNorm) and model.res3[0].bn1.weight.requires_grad
    with torch.no_grad():
        assert model(torch.randn(1, 3, 32, 32))["res3"].shape == (1, 512, 4, 4)


def test_conv_init_is_kaiming_normal_fan_out():
    torch.manual_seed(0)
    model = ResNet(50)
    conv = model.res4[0].conv2  # 256 → 256, 3×3: fan_out = 256 * 9
    w = conv.weight.detach()
    expected_std = math.sqrt(2.0 / (conv.out_channels * 9))
    assert abs(w.std().item() / expected_std - 1) < 0.02
    assert abs(w.mean().item()) < 0.05 * expected_std
    assert all(m.bias is None for m in model.modules() if isinstance(m, nn.Conv2d))


def test_zero_init_residual_zeroes_the_last_norm_of_each_block():
    for depth, last in [(18, "bn2"), (50, "bn3")]:
        model = ResNet(depth, zero_init_residual=True, out_features=["res3"])
        for name in model.stage_names:
            for block in getattr(model, name):
                assert torch.count_nonzero(getattr(block, last).weight) == 0
                assert torch.all(block.bn1.weight == 1)
    # Without it, all norm weights start at 1.
    assert torch.all(ResNet(50, out_features=["res2"]).res2[0].bn3.weight == 1)


def test_no_norm_gives_biased_convs_and_no_norm_keys():
    model = ResNet(18, norm="").eval()
    assert all(m.bias is not None for m in model.modules() if isinstance(m, nn.Conv2d))
    assert not any(".bn" in k or "downsample.1" in k for k in model.state_dict())
    with torch.no_grad():
        assert model(torch.randn(1, 3, 32, 32))["res5"].shape == (1, 512, 1, 1)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(depth=42), "depth must be one of"),
        (dict(out_features=["res6"]), "out_features must be"),
        (dict(out_features=[]), "out_features must be"),
        (dict(res5_dilation=4), "res5_dilation must be one of \\[1, 2\\]"),
        (dict(freeze_at=6), "freeze_at must be one of \\[0, 1, 2, 3, 4, 5\\]"),
        (dict(depth=18, res2_out_channels=256), "RES2_OUT_CHANNELS"),
        (dict(depth=34, num_groups=32), "num_groups must be 1"),
        (dict(depth=18, res5_dilation=2), "res5_dilation must be 1"),
        (dict(norm="", zero_init_residual=True), "zero_init_residual needs a norm"),
        (dict(norm="LayerNorm"), "unknown norm 'LayerNorm'"),
    ],
)
def test_bad_arguments_raise(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ResNet(**{"depth": 50, **kwargs})


def test_bad_input_raises():
    model = ResNet(18, out_features=["stem"])
    with pytest.raises(ValueError, match=r"input x must have shape \(N, 3, H, W\)"):
        model(torch.randn(1, 1, 32, 32))
    with pytest.raises(ValueError, match="input x"):
        model(torch.randn(3, 32, 32))


def test_build_resnet_backbone_from_config():
    cfg = get_cfg()
    cfg.MODEL.BACKBONE.NAME = "ResNet"
    cfg.MODEL.BACKBONE.FREEZE_AT = 2
    cfg.MODEL.RESNETS.DEPTH = 18
    cfg.MODEL.RESNETS.RES2_OUT_CHANNELS = 64
    cfg.MODEL.RESNETS.OUT_FEATURES = ["res3", "res4"]
    cfg.MODEL.PIXEL_MEAN = [0.0, 0.0, 0.0, 0.0]  # four input channels
    cfg.MODEL.PIXEL_STD = [1.0, 1.0, 1.0, 1.0]
    model = build_backbone(cfg)
    assert isinstance(model, ResNet)
    assert model.stem.conv1.in_channels == 4
    assert model.output_shape() == {
        "res3": ShapeSpec(channels=128, stride=8),
        "res4": ShapeSpec(channels=256, stride=16),
    }
    assert isinstance(model.res2[0].bn1, FrozenBatchNorm2d)
    assert not model.res2[0].conv1.weight.requires_grad and model.res3[0].conv1.weight.requires_grad
    # An explicit input_shape wins over PIXEL_MEAN.
    assert build_backbone(cfg, ShapeSpec(channels=1)).stem.conv1.in_channels == 1


def test_build_defaults_are_the_detection_r50():
    cfg = get_cfg()
    cfg.MODEL.BACKBONE.NAME = "ResNet"
    model = build_backbone(cfg)
    assert [s.channels for s in model.output_shape().values()] == [256, 512, 1024, 2048]
    assert model.res3[0].conv1.stride == (2, 2)  # MSRA default: stride in the 1×1
    assert not any(isinstance(m, nn.BatchNorm2d) for m in model.modules())


# --- the stage builder (shared with the C4 ROI heads) -------------------------------------------
def test_make_stage_builds_resnets_stages():
    body = ResNet(50, stride_in_1x1=True)
    stage, channels = make_stage(50, 3, 1024, first_stride=2, stride_in_1x1=True)
    assert channels == 2048 and len(stage) == 3
    assert {k: v.shape for k, v in stage.state_dict().items()} == {k: v.shape for k, v in body.res5.state_dict().items()}
    assert stage[0].conv1.stride == (2, 2) and stage[0].conv2.stride == (1, 1)
    # Same weights, same function.
    stage.load_state_dict(body.res5.state_dict())
    x = torch.randn(1, 1024, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(stage.eval()(x), body.res5.eval()(x))
    basic, channels = make_stage(18, 2, 128, first_stride=2)
    assert channels == 256 and len(basic) == 2 and isinstance(basic[0], BasicBlock)
    x101, channels = make_stage(101, 3, 1024, num_groups=32, width_per_group=8)
    assert channels == 2048 and x101[0].conv2.groups == 32 and x101[0].conv2.out_channels == 32 * 8 * 8


@pytest.mark.parametrize(
    "args, kwargs, message",
    [
        ((42, 3, 64), {}, "depth must be one of"),
        ((50, 4, 64), {}, "stage_index must be 0..3"),
        ((18, 3, 256), {"num_groups": 32}, "num_groups must be 1"),
        ((34, 3, 256), {"dilation": 2}, "res5_dilation must be 1"),
        ((18, 3, 256), {"deform": True}, "deformable convs"),
        ((50, 3, 1024), {"deform": True, "deform_num_groups": 0}, "deform_num_groups must be >= 1"),
    ],
)
def test_make_stage_refuses_what_the_block_cannot_do(args, kwargs, message):
    with pytest.raises(ValueError, match=message):
        make_stage(*args, **kwargs)


def test_init_resnet_weights_is_resnets_init():
    torch.manual_seed(0)
    stage, _ = make_stage(50, 1, 256)
    init_resnet_weights(stage, zero_init_residual=True)
    conv = stage[0].conv2
    fan_out = conv.out_channels * 9
    assert conv.weight.std().item() == pytest.approx((2.0 / fan_out) ** 0.5, rel=0.05)
    assert all(torch.all(block.bn3.weight == 0) for block in stage)
