import math
from collections import OrderedDict

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from detcore.config import get_cfg
from detcore.layers.conv import Conv2d
from detcore.modeling import build_backbone
from detcore.modeling.backbone.fpn import FPN, LastLevelMaxPool, LastLevelP6P7
from detcore.modeling.backbone.resnet import ResNet

LEVELS = {"res2": 2, "res3": 3, "res4": 4, "res5": 5}


def _fpn_r18(in_features=("res2", "res3", "res4", "res5"), out_channels=32, **kwargs):
    return FPN(ResNet(18), list(in_features), out_channels, **kwargs)


def _randomize_biases(fpn):
    # c2_xavier_fill zeroes biases; random ones let a parity test catch a wrong bias mapping.
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for m in fpn.modules():
            if isinstance(m, nn.Conv2d) and m.bias is not None:
                m.bias.copy_(torch.randn(m.bias.shape, generator=g) * 0.1)


def _copy_into_torchvision(fpn, reference):
    with torch.no_grad():
        for i, f in enumerate(fpn.in_features):
            for ours, theirs in [
                (getattr(fpn, f"fpn_lateral{LEVELS[f]}"), reference.inner_blocks[i][0]),
                (getattr(fpn, f"fpn_output{LEVELS[f]}"), reference.layer_blocks[i][0]),
            ]:
                theirs.weight.copy_(ours.weight)
                theirs.bias.copy_(ours.bias)


def test_default_config_output_shapes_on_odd_input():
    cfg = get_cfg()  # R-50-FPN, top block maxpool
    model = build_backbone(cfg).eval()
    assert isinstance(model, FPN)
    assert model.size_divisibility == 32
    shapes = model.output_shape()
    assert list(shapes) == ["p2", "p3", "p4", "p5", "p6"]
    assert [s.stride for s in shapes.values()] == [4, 8, 16, 32, 64]
    assert all(s.channels == 256 for s in shapes.values())
    with torch.no_grad():
        out = model(torch.randn(1, 3, 100, 150))  # not a multiple of 32
    assert list(out) == list(shapes)
    for name, feature in out.items():
        stride = shapes[name].stride
        assert feature.shape == (1, 256, math.ceil(100 / stride), math.ceil(150 / stride)), name


def test_matches_torchvision_fpn_with_maxpool():
    tv = pytest.importorskip("torchvision.ops.feature_pyramid_network")
    fpn = _fpn_r18(top_block=LastLevelMaxPool()).eval()
    _randomize_biases(fpn)
    in_channels = [fpn.bottom_up.output_shape()[f].channels for f in fpn.in_features]
    reference = tv.FeaturePyramidNetwork(in_channels, 32, extra_blocks=tv.LastLevelMaxPool())
    _copy_into_torchvision(fpn, reference)
    x = torch.randn(2, 3, 97, 131)  # odd sizes: upsampling must go to the lateral's size
    with torch.no_grad():
        c = fpn.bottom_up(x)
        expected = list(reference(OrderedDict((f, c[f]) for f in fpn.in_features)).values())
        actual = fpn(x)
    assert list(actual) == ["p2", "p3", "p4", "p5", "p6"]
    assert len(expected) == 5
    for a, e in zip(actual.values(), expected):
        torch.testing.assert_close(a, e)


def test_matches_torchvision_fpn_with_p6p7_from_c5():
    tv = pytest.importorskip("torchvision.ops.feature_pyramid_network")
    fpn = _fpn_r18(["res3", "res4", "res5"], top_block=LastLevelP6P7(512, 32)).eval()
    _randomize_biases(fpn)
    reference = tv.FeaturePyramidNetwork(
        [128, 256, 512], 32, extra_blocks=tv.LastLevelP6P7(512, 32)
    )
    _copy_into_torchvision(fpn, reference)
    with torch.no_grad():
        for name in ("p6", "p7"):
            getattr(reference.extra_blocks, name).weight.copy_(getattr(fpn.top_block, name).weight)
            getattr(reference.extra_blocks, name).bias.copy_(getattr(fpn.top_block, name).bias)
    x = torch.randn(1, 3, 100, 150)
    with torch.no_grad():
        c = fpn.bottom_up(x)
        expected = list(reference(OrderedDict((f, c[f]) for f in fpn.in_features)).values())
        actual = fpn(x)
    assert list(actual) == ["p3", "p4", "p5", "p6", "p7"]
    assert [s.stride for s in fpn.output_shape().values()] == [8, 16, 32, 64, 128]
    for a, e in zip(actual.values(), expected):
        torch.testing.assert_close(a, e)


def test_p6p7_from_p5():
    fpn = _fpn_r18(top_block=LastLevelP6P7(32, 32, in_feature="p5")).eval()
    with torch.no_grad():
        out = fpn(torch.randn(1, 3, 64, 64))
        expected_p6 = fpn.top_block.p6(out["p5"])
    torch.testing.assert_close(out["p6"], expected_p6)
    assert out["p7"].shape == (1, 32, 1, 1)


def test_avg_fuse_matches_a_plain_reference():
    fpn = _fpn_r18(fuse_type="avg").eval()
    _randomize_biases(fpn)
    x = torch.randn(1, 3, 70, 90)
    with torch.no_grad():
        c = fpn.bottom_up(x)
        expected = {}
        prev = None
        for f in reversed(fpn.in_features):
            lateral_conv = getattr(fpn, f"fpn_lateral{LEVELS[f]}")
            lateral = F.conv2d(c[f], lateral_conv.weight, lateral_conv.bias)
            if prev is not None:
                upsampled = F.interpolate(prev, size=lateral.shape[-2:], mode="nearest")
                lateral = (lateral + upsampled) / 2
            prev = lateral
            out_conv = getattr(fpn, f"fpn_output{LEVELS[f]}")
            expected[f"p{LEVELS[f]}"] = F.conv2d(prev, out_conv.weight, out_conv.bias, padding=1)
        actual = fpn(x)
    assert list(actual) == ["p2", "p3", "p4", "p5"]  # no top block
    for name, value in expected.items():
        torch.testing.assert_close(actual[name], value)


def test_norm_goes_inside_the_convs_and_names_follow_detectron2():
    fpn = _fpn_r18(norm="GN", top_block=LastLevelP6P7(512, 32))
    lateral = fpn.fpn_lateral3
    assert isinstance(lateral.norm, nn.GroupNorm) and lateral.bias is None
    keys = set(fpn.state_dict())
    for key in [
        "fpn_lateral2.weight", "fpn_lateral2.norm.weight", "fpn_output5.norm.bias",
        "top_block.p6.weight", "top_block.p7.bias", "bottom_up.res2.0.conv1.weight",
    ]:
        assert key in keys, key
    with torch.no_grad():
        assert fpn.eval()(torch.randn(1, 3, 64, 64))["p2"].shape == (1, 32, 16, 16)


def test_init_is_kaiming_uniform_a1_with_zero_bias():
    torch.manual_seed(0)
    fpn = FPN(ResNet(50), ["res2", "res3", "res4", "res5"], 256, top_block=LastLevelP6P7(2048, 256))
    for conv in [fpn.fpn_lateral5, fpn.fpn_output2, fpn.top_block.p6]:
        fan_in = conv.weight[0].numel()
        bound = math.sqrt(3.0 / fan_in)
        w = conv.weight.detach()
        assert w.abs().max() <= bound and w.abs().max() > 0.99 * bound
        assert abs(w.std().item() / (bound / math.sqrt(3)) - 1) < 0.02  # uniform, not normal
        assert torch.count_nonzero(conv.bias) == 0


@pytest.mark.parametrize(
    "in_features, kwargs, message",
    [
        (["res2", "res4"], {}, "must double"),
        (["res4", "res3"], {}, "must double"),
        (["res2", "res6"], {}, "in_features must be"),
        ([], {}, "in_features must be"),
        (["res2", "res3"], dict(fuse_type="max"), r"fuse_type must be one of \['sum', 'avg'\]"),
        (["res3", "res4"], dict(top_block=LastLevelMaxPool("p7")), "top_block.in_feature 'p7'"),
        (["res3", "res4"], dict(top_block=LastLevelP6P7(256, 32)), "expects 256 input channels"),
    ],
)
def test_bad_arguments_raise(in_features, kwargs, message):
    with pytest.raises(ValueError, match=message):
        _fpn_r18(in_features, **kwargs)


def test_bottom_up_must_be_a_backbone():
    with pytest.raises(TypeError, match="bottom_up must be a Backbone"):
        FPN(nn.Conv2d(3, 3, 1), ["res2"], 8)


def test_top_block_from_config():
    cfg = get_cfg()
    cfg.MODEL.RESNETS.DEPTH = 18
    cfg.MODEL.RESNETS.RES2_OUT_CHANNELS = 64
    cfg.MODEL.FPN.OUT_CHANNELS = 16
    cfg.MODEL.FPN.TOP_BLOCK = ""
    assert list(build_backbone(cfg).output_shape()) == ["p2", "p3", "p4", "p5"]
    cfg.MODEL.FPN.TOP_BLOCK = "p6p7"
    model = build_backbone(cfg)
    assert list(model.output_shape()) == ["p2", "p3", "p4", "p5", "p6", "p7"]
    assert model.top_block.in_feature == "res5" and model.top_block.p6.in_channels == 512
    cfg.MODEL.FPN.TOP_BLOCK = "p6p7_from_p5"
    model = build_backbone(cfg)
    assert list(model.output_shape()) == ["p2", "p3", "p4", "p5", "p6", "p7"]
    assert model.top_block.in_feature == "p5" and model.top_block.p6.in_channels == 16
    cfg.MODEL.FPN.TOP_BLOCK = "pool"
    with pytest.raises(ValueError, match="MODEL.FPN.TOP_BLOCK must be"):
        build_backbone(cfg)


def test_retinanet_builder():
    cfg = get_cfg()
    cfg.MODEL.BACKBONE.NAME = "build_retinanet_resnet_fpn_backbone"
    cfg.MODEL.RESNETS.DEPTH = 18
    cfg.MODEL.RESNETS.RES2_OUT_CHANNELS = 64
    cfg.MODEL.RESNETS.OUT_FEATURES = ["res3", "res4", "res5"]
    cfg.MODEL.FPN.IN_FEATURES = ["res3", "res4", "res5"]
    cfg.MODEL.FPN.OUT_CHANNELS = 16
    model = build_backbone(cfg).eval()
    shapes = model.output_shape()
    assert list(shapes) == ["p3", "p4", "p5", "p6", "p7"]
    assert [s.stride for s in shapes.values()] == [8, 16, 32, 64, 128]
    with torch.no_grad():
        out = model(torch.randn(1, 3, 128, 128))
    assert [tuple(v.shape[-2:]) for v in out.values()] == [(16, 16), (8, 8), (4, 4), (2, 2), (1, 1)]

    cfg.MODEL.RESNETS.OUT_FEATURES = ["res3", "res4"]
    cfg.MODEL.FPN.IN_FEATURES = ["res3", "res4"]
    with pytest.raises(ValueError, match="add it to MODEL.RESNETS.OUT_FEATURES"):
        build_backbone(cfg)


# detcore.layers.conv.Conv2d: FPN is its first user.


def test_conv2d_with_norm_and_activation_equals_the_composition():
    torch.manual_seed(0)
    norm = nn.GroupNorm(2, 4)
    conv = Conv2d(3, 4, 3, padding=1, bias=False, norm=norm, activation=F.relu)
    x = torch.randn(2, 3, 6, 7)
    expected = F.relu(norm(F.conv2d(x, conv.weight, None, padding=1)))
    torch.testing.assert_close(conv(x), expected)
    assert "norm.weight" in conv.state_dict()


def test_conv2d_plain_equals_nn_conv2d_including_padding_mode():
    torch.manual_seed(0)
    ours = Conv2d(3, 5, 3, stride=2, padding=1, padding_mode="reflect")
    theirs = nn.Conv2d(3, 5, 3, stride=2, padding=1, padding_mode="reflect")
    theirs.load_state_dict(ours.state_dict())
    x = torch.randn(1, 3, 9, 8)
    torch.testing.assert_close(ours(x), theirs(x))
