import pytest
import torch

from detcore.config import get_cfg
from detcore.layers import ShapeSpec
from detcore.modeling.roi_heads import (
    ROI_BOX_HEAD_REGISTRY,
    FastRCNNConvFCHead,
    FastRCNNOutputLayers,
    build_box_head,
    build_box_predictor,
)
from detcore.modeling.box_regression import Box2BoxTransform


def test_fc_head_shapes_and_plain_recomputation():
    torch.manual_seed(0)
    head = FastRCNNConvFCHead(ShapeSpec(channels=4, height=5, width=5), conv_dims=[], fc_dims=[16, 8])
    assert head.output_shape == ShapeSpec(channels=8)
    x = torch.randn(6, 4, 5, 5)
    out = head(x)
    assert out.shape == (6, 8)
    expected = torch.relu(head.fc2(torch.relu(head.fc1(x.flatten(1)))))
    torch.testing.assert_close(out, expected)


def test_conv_fc_head_shapes():
    head = FastRCNNConvFCHead(ShapeSpec(channels=4, height=7, width=7), conv_dims=[6, 6], fc_dims=[10])
    assert [n for n, _ in head.named_children()] == ["conv1", "conv2", "flatten", "fc1", "fc_relu1"]
    assert head.fc1.in_features == 6 * 7 * 7
    assert head(torch.randn(3, 4, 7, 7)).shape == (3, 10)
    assert (head(torch.randn(3, 4, 7, 7)) >= 0).all()  # ends with a ReLU


def test_conv_only_head_keeps_spatial_output():
    head = FastRCNNConvFCHead(ShapeSpec(channels=4, height=7, width=7), conv_dims=[5], fc_dims=[])
    assert head.output_shape == ShapeSpec(channels=5, height=7, width=7)
    assert head(torch.randn(2, 4, 7, 7)).shape == (2, 5, 7, 7)


def test_head_init_and_errors():
    head = FastRCNNConvFCHead(ShapeSpec(channels=8, height=7, width=7), conv_dims=[8], fc_dims=[64])
    assert head.fc1.bias.abs().sum() == 0 and head.conv1.bias.abs().sum() == 0
    # c2_xavier_fill: uniform within +-sqrt(3 / fan_in).
    assert head.fc1.weight.abs().max() <= (3 / head.fc1.in_features) ** 0.5
    with pytest.raises(ValueError, match="at least one"):
        FastRCNNConvFCHead(ShapeSpec(channels=8, height=7, width=7), conv_dims=[], fc_dims=[])
    with pytest.raises(ValueError, match="height and width"):
        FastRCNNConvFCHead(ShapeSpec(channels=8), conv_dims=[], fc_dims=[4])
    with pytest.raises(ValueError, match=r"\[R, C, S, S\]"):
        head(torch.randn(2, 8 * 49))


def test_predictor_shapes_and_init():
    torch.manual_seed(0)
    pred = FastRCNNOutputLayers(ShapeSpec(channels=256), box2box_transform=Box2BoxTransform((10, 10, 5, 5)), num_classes=80)
    scores, deltas = pred(torch.randn(5, 256))
    assert scores.shape == (5, 81) and deltas.shape == (5, 320)
    assert 0.008 < pred.cls_score.weight.std() < 0.012
    assert 0.0008 < pred.bbox_pred.weight.std() < 0.0012
    assert pred.cls_score.bias.abs().sum() == 0 and pred.bbox_pred.bias.abs().sum() == 0

    agnostic = FastRCNNOutputLayers(
        ShapeSpec(channels=3, height=2, width=2),
        box2box_transform=Box2BoxTransform((10, 10, 5, 5)),
        num_classes=4,
        cls_agnostic_bbox_reg=True,
    )
    scores, deltas = agnostic(torch.randn(2, 3, 2, 2))  # flattened inside
    assert scores.shape == (2, 5) and deltas.shape == (2, 4)


def test_builders_read_config():
    cfg = get_cfg()
    cfg.MODEL.ROI_BOX_HEAD.NUM_CONV = 1
    cfg.MODEL.ROI_BOX_HEAD.CONV_DIM = 8
    cfg.MODEL.ROI_BOX_HEAD.NUM_FC = 1
    cfg.MODEL.ROI_BOX_HEAD.FC_DIM = 12
    cfg.MODEL.ROI_HEADS.NUM_CLASSES = 3
    cfg.MODEL.ROI_HEADS.SCORE_THRESH_TEST = 0.3
    cfg.TEST.DETECTIONS_PER_IMAGE = 7
    head = build_box_head(cfg, ShapeSpec(channels=4, height=7, width=7))
    assert isinstance(head, FastRCNNConvFCHead) and head.conv1.out_channels == 8
    assert head.output_shape.channels == 12
    pred = build_box_predictor(cfg, head.output_shape)
    assert pred.cls_score.out_features == 4 and pred.bbox_pred.out_features == 12
    assert pred.test_score_thresh == 0.3 and pred.test_topk_per_image == 7
    assert pred.box2box_transform.weights == (10.0, 10.0, 5.0, 5.0)
    assert "FastRCNNConvFCHead" in ROI_BOX_HEAD_REGISTRY
    cfg.MODEL.ROI_BOX_HEAD.NAME = "FastRCNNConvFCHaed"
    with pytest.raises(KeyError, match="Did you mean"):
        build_box_head(cfg, ShapeSpec(channels=4, height=7, width=7))
