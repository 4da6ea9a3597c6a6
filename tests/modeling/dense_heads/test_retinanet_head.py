"""RetinaNetHead on its own: output shapes per level, the paper's initialization, detectron2's
module names (with and without GroupNorm), the towers computed as a plain conv stack, errors."""
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from detcore.config import get_cfg
from detcore.layers import ShapeSpec
from detcore.modeling import RetinaNetHead
from detcore.utils.registry import build_from_config


def test_output_shapes_per_level():
    head = RetinaNetHead(in_channels=16, num_anchors=9, num_classes=5, num_convs=2)
    feats = [torch.randn(2, 16, 12, 18), torch.randn(2, 16, 6, 9), torch.randn(2, 16, 1, 2)]
    logits, deltas = head(feats)
    assert [tuple(x.shape) for x in logits] == [(2, 45, 12, 18), (2, 45, 6, 9), (2, 45, 1, 2)]
    assert [tuple(x.shape) for x in deltas] == [(2, 36, 12, 18), (2, 36, 6, 9), (2, 36, 1, 2)]


def test_init_prior_probability_and_small_weights():
    torch.manual_seed(0)
    head = RetinaNetHead(in_channels=64, num_anchors=9, num_classes=80, prior_prob=0.01)
    # Every class starts at probability 0.01 on any input, up to the small random weights.
    torch.testing.assert_close(torch.sigmoid(head.cls_score.bias), torch.full((720,), 0.01))
    assert torch.count_nonzero(head.bbox_pred.bias) == 0
    convs = [m for m in head.modules() if isinstance(m, nn.Conv2d)]
    assert len(convs) == 4 + 4 + 2
    for conv in convs:
        assert abs(conv.weight.std().item() - 0.01) < 0.001 and abs(conv.weight.mean().item()) < 0.001
    for conv in convs[:-2] + [head.bbox_pred]:
        assert torch.count_nonzero(conv.bias) == 0
    with torch.no_grad():
        logits, _ = head([torch.randn(1, 64, 8, 8)])
    assert (torch.sigmoid(logits[0]) - 0.01).abs().max() < 0.005


def test_names_follow_detectron2_without_and_with_gn():
    plain = set(RetinaNetHead(in_channels=32, num_anchors=9, num_classes=3).state_dict())
    assert plain == {
        f"{tower}.{i}.{leaf}" for tower in ("cls_subnet", "bbox_subnet") for i in (0, 2, 4, 6) for leaf in ("weight", "bias")
    } | {f"{p}.{leaf}" for p in ("cls_score", "bbox_pred") for leaf in ("weight", "bias")}
    gn = RetinaNetHead(in_channels=32, num_anchors=9, num_classes=3, norm="GN")
    assert isinstance(gn.cls_subnet[1], nn.GroupNorm) and gn.cls_subnet[1].num_groups == 32
    assert [type(m).__name__ for m in gn.bbox_subnet[:3]] == ["Conv2d", "GroupNorm", "ReLU"]
    assert "cls_subnet.9.weight" in gn.state_dict() and "cls_subnet.10.weight" in gn.state_dict()


@pytest.mark.parametrize("norm", ["", "GN"])
def test_towers_are_plain_conv_stacks(norm):
    torch.manual_seed(1)
    head = RetinaNetHead(in_channels=32, num_anchors=2, num_classes=3, num_convs=3, norm=norm)
    for p in head.parameters():  # non-trivial weights, so every layer matters
        nn.init.normal_(p, std=0.2)
    x = torch.randn(2, 32, 5, 7)

    def tower(layers, x):
        for layer in layers:
            if isinstance(layer, nn.Conv2d):
                x = F.conv2d(x, layer.weight, layer.bias, padding=1)
            elif isinstance(layer, nn.GroupNorm):
                x = F.group_norm(x, 32, layer.weight, layer.bias, layer.eps)
            else:
                x = x.clamp(min=0)
        return x

    with torch.no_grad():
        logits, deltas = head([x])
        expected_logits = F.conv2d(tower(head.cls_subnet, x), head.cls_score.weight, head.cls_score.bias, padding=1)
        expected_deltas = F.conv2d(tower(head.bbox_subnet, x), head.bbox_pred.weight, head.bbox_pred.bias, padding=1)
    torch.testing.assert_close(logits[0], expected_logits)
    torch.testing.assert_close(deltas[0], expected_deltas)


def test_from_config_reads_the_anchors_and_retinanet_keys():
    cfg = get_cfg()
    cfg.merge_from_list([
        "MODEL.ANCHOR_GENERATOR.SIZES", "[[32, 40, 50], [64, 80, 101]]",
        "MODEL.RETINANET.NUM_CLASSES", "7", "MODEL.RETINANET.NUM_CONVS", "2", "MODEL.RETINANET.NORM", "GN",
        "MODEL.RETINANET.PRIOR_PROB", "0.05",
    ])
    shapes = [ShapeSpec(channels=32, stride=8), ShapeSpec(channels=32, stride=16)]
    head = build_from_config(RetinaNetHead, cfg, shapes)
    assert (head.in_channels, head.num_anchors, head.num_classes) == (32, 9, 7)
    assert len(head.cls_subnet) == 6
    assert math.isclose(torch.sigmoid(head.cls_score.bias[0]).item(), 0.05, rel_tol=1e-5)
    with pytest.raises(ValueError, match="same channels"):
        build_from_config(RetinaNetHead, cfg, [ShapeSpec(channels=32, stride=8), ShapeSpec(channels=16, stride=16)])
    cfg.merge_from_list(["MODEL.ANCHOR_GENERATOR.SIZES", "[[32, 40], [64]]"])
    with pytest.raises(ValueError, match="same number of anchors per location"):
        build_from_config(RetinaNetHead, cfg, shapes)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(num_classes=0), "num_classes must be >= 1"),
        (dict(num_convs=-1), "num_convs must be >= 0"),
        (dict(norm="BN"), r"norm must be one of \['', 'GN', None\]"),
        (dict(prior_prob=1.0), r"prior_prob must lie in \(0, 1\)"),
    ],
)
def test_bad_arguments_are_named(kwargs, message):
    args = dict(in_channels=8, num_anchors=9, num_classes=3)
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        RetinaNetHead(**args)


def test_wrong_feature_shape_is_named():
    head = RetinaNetHead(in_channels=8, num_anchors=1, num_classes=2)
    with pytest.raises(ValueError, match=r"features\[1\] must be \[B, 8, H, W\], got \(1, 4, 3, 3\)"):
        head([torch.randn(1, 8, 3, 3), torch.randn(1, 4, 3, 3)])
