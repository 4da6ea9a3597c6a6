"""Res5ROIHeads (the C4 ROI heads): res5 is ResNet's own stage, built by the same builder; box and
mask predictions equal a hand pipeline of torchvision's roi_align, that res5 and the predictors;
the mask branch in training reuses the box branch's features of the foreground ROIs."""
import pytest
import torch
import torchvision

from detcore.config import get_cfg
from detcore.layers import ShapeSpec
from detcore.modeling.backbone import BasicBlock, BottleneckBlock, ResNet
from detcore.modeling.roi_heads import Res5ROIHeads, build_roi_heads, mask_rcnn_loss
from detcore.structures import Boxes, ImageList, Instances, PolygonMasks

from ..small_config import CONFIGS

pytestmark = pytest.mark.usefixtures("single_thread")

STRIDE = 16
IMAGE = 128  # res4 is 8 x 8


def _cfg(config="mask_rcnn_R_18_C4_shapes.yaml", **overrides):
    cfg = get_cfg()
    cfg.merge_from_file(str(CONFIGS / config))
    opts = ["MODEL.DEVICE", "cpu", "MODEL.ROI_HEADS.SCORE_THRESH_TEST", 0.0]
    for key, value in overrides.items():
        opts += [key, value]
    cfg.merge_from_list(opts)
    return cfg


def _heads(cfg, channels=256):
    torch.manual_seed(0)
    return build_roi_heads(cfg, {"res4": ShapeSpec(channels=channels, stride=STRIDE)})


def _features(channels=256, batch=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {"res4": torch.randn(batch, channels, IMAGE // STRIDE, IMAGE // STRIDE, generator=g)}


def _images(batch=2):
    return ImageList(torch.zeros(batch, 3, IMAGE, IMAGE), [(128, 128), (120, 100)][:batch])


def _proposals(seed=0, count=24):
    g = torch.Generator().manual_seed(seed)
    out = []
    for h, w in [(128, 128), (120, 100)]:
        xy = torch.rand(count, 2, generator=g) * torch.tensor([w - 40.0, h - 40.0])
        wh = 8 + torch.rand(count, 2, generator=g) * 32
        out.append(Instances((h, w), proposal_boxes=Boxes(torch.cat([xy, xy + wh], 1)), objectness_logits=torch.zeros(count)))
    return out


def _targets():
    boxes = [[[4.0, 6.0, 40.0, 44.0], [60.0, 20.0, 100.0, 70.0]], [[10.0, 10.0, 50.0, 30.0]]]
    classes = [[2, 0], [1]]
    out = []
    for size, b, c in zip([(128, 128), (120, 100)], boxes, classes):
        t = Instances(size, gt_boxes=Boxes(torch.tensor(b)), gt_classes=torch.tensor(c))
        t.gt_masks = PolygonMasks([[[x1, y1, x2, y1, x2, y2, x1, y2]] for x1, y1, x2, y2 in b])
        out.append(t)
    return out


def _reference_res5_features(heads, features, boxes):
    """torchvision's roi_align (aligned, 1/16, adaptive sampling) then the heads' res5."""
    rois = torch.cat([torch.cat([torch.full((len(b), 1), float(i)), b.tensor], 1) for i, b in enumerate(boxes)])
    res = heads.pooler.output_size
    pooled = torchvision.ops.roi_align(features["res4"], rois, res, 1.0 / STRIDE, 0, aligned=True)
    return heads.res5(pooled)


@pytest.mark.parametrize(
    "config, depth, block",
    [("mask_rcnn_R_50_C4_1x.yaml", 50, BottleneckBlock), ("mask_rcnn_R_18_C4_shapes.yaml", 18, BasicBlock)],
)
def test_res5_is_resnets_own_stage_with_stride_2(config, depth, block):
    cfg = _cfg(config)
    channels = 1024 if depth == 50 else 256
    heads = _heads(cfg, channels)
    assert isinstance(heads, Res5ROIHeads)
    # The same parameter names and shapes as the res5 of a full ResNet of these settings.
    r = cfg.MODEL.RESNETS
    body = ResNet(depth, norm=r.NORM, stride_in_1x1=r.STRIDE_IN_1X1, res2_out_channels=r.RES2_OUT_CHANNELS)
    expected = {k: v.shape for k, v in body.res5.state_dict().items()}
    assert {k: v.shape for k, v in heads.res5.state_dict().items()} == expected
    assert all(isinstance(b, block) for b in heads.res5)
    # Stride 2 on the first block: a 14 (or 8) pooled grid becomes 7 (or 4).
    res = cfg.MODEL.ROI_BOX_HEAD.POOLER_RESOLUTION
    with torch.no_grad():
        out = heads.res5(torch.zeros(2, channels, res, res))
    assert out.shape == (2, 2048 if depth == 50 else 512, res // 2, res // 2)
    assert heads.box_predictor.cls_score.in_features == out.shape[1]
    assert heads.mask_head.deconv.in_channels == out.shape[1]
    # ResNet's initialization (MSRA fill: std sqrt(2 / fan_out)), not PyTorch's default.
    conv = heads.res5[1].conv2
    fan_out = conv.out_channels * conv.kernel_size[0] * conv.kernel_size[1]
    assert conv.weight.std().item() == pytest.approx((2.0 / fan_out) ** 0.5, rel=0.05)


def test_inference_equals_roi_align_res5_mean_and_predictors():
    heads = _heads(_cfg()).eval()
    torch.nn.init.normal_(heads.mask_head.predictor.weight, std=0.05)  # masks far from 0.5
    features, proposals = _features(), _proposals()
    seen = {}

    def record(name):
        def hook(module, args, output):
            seen[name] = args[0]
        return hook

    heads.box_predictor.register_forward_hook(record("box_in"))
    heads.mask_head.register_forward_hook(record("mask_in"))
    with torch.no_grad():
        detections, losses = heads(_images(), features, proposals)
        assert losses == {}
        expected_box_in = _reference_res5_features(heads, features, [p.proposal_boxes for p in proposals]).mean(dim=(2, 3))
        torch.testing.assert_close(seen["box_in"], expected_box_in, rtol=1e-4, atol=1e-5)
        # Masks: the detections pooled again and run through res5; probabilities of their class.
        expected_mask_in = _reference_res5_features(heads, features, [d.pred_boxes for d in detections])
        torch.testing.assert_close(seen["mask_in"], expected_mask_in, rtol=1e-4, atol=1e-5)
        logits = heads.mask_head.layers(expected_mask_in)
    classes = torch.cat([d.pred_classes for d in detections])
    assert len(classes) > 0
    expected_masks = logits[torch.arange(len(classes)), classes].sigmoid()
    torch.testing.assert_close(torch.cat([d.pred_masks[:, 0] for d in detections]), expected_masks, rtol=1e-4, atol=1e-5)
    res = _cfg().MODEL.ROI_BOX_HEAD.POOLER_RESOLUTION
    assert detections[0].pred_masks.shape[1:] == (1, res, res)  # deconv doubles res5's grid


def test_training_losses_and_the_mask_branch_on_the_foreground_features():
    heads = _heads(_cfg()).train()
    # Logits near 0 (the predictor's init) give a loss of log 2 whatever the features: widen them.
    torch.nn.init.normal_(heads.mask_head.predictor.weight, std=0.05)
    features = {k: v.requires_grad_() for k, v in _features().items()}
    sampled = {}
    sample = heads.label_and_sample_proposals
    heads.label_and_sample_proposals = lambda p, t: sampled.setdefault("rois", sample(p, t))
    _, losses = heads(_images(), features, _proposals(), _targets())
    assert set(losses) == {"loss_cls", "loss_box_reg", "loss_mask"}
    assert all(torch.isfinite(v) and v.dim() == 0 for v in losses.values())
    # Independently: pool the sampled foreground ROIs, res5, the mask head, the mask loss.
    rois = sampled["rois"]
    foreground = [r[(r.gt_classes >= 0) & (r.gt_classes < 3)] for r in rois]
    assert sum(len(f) for f in foreground) > 0
    with torch.no_grad():
        x = _reference_res5_features(heads, features, [f.proposal_boxes for f in foreground])
        expected = mask_rcnn_loss(heads.mask_head.layers(x), foreground)
    assert abs(expected.item() - 0.6931) > 0.01
    torch.testing.assert_close(losses["loss_mask"].detach(), expected, rtol=1e-4, atol=1e-6)
    sum(losses.values()).backward()
    assert features["res4"].grad.abs().sum() > 0  # through the pooler into the backbone's map
    assert all(p.grad is not None for p in heads.parameters() if p.requires_grad)


def test_no_detection_gives_empty_masks():
    heads = _heads(_cfg(**{"MODEL.ROI_HEADS.SCORE_THRESH_TEST": 1.0})).eval()
    with torch.no_grad():
        detections, _ = heads(_images(), _features(), _proposals())
    res = heads.pooler.output_size[0]
    assert all(len(d) == 0 and d.pred_masks.shape == (0, 1, res, res) for d in detections)


def test_faster_rcnn_c4_has_no_mask_branch():
    heads = _heads(_cfg(**{"MODEL.MASK_ON": False})).eval()
    assert not heads.mask_on and not hasattr(heads, "mask_head")
    with torch.no_grad():
        detections, _ = heads(_images(), _features(), _proposals())
    assert "pred_masks" not in detections[0].fields()


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"MODEL.ROI_HEADS.IN_FEATURES": ["res3", "res4"]}, r"MODEL.ROI_HEADS.IN_FEATURES must name one"),
        ({"MODEL.ROI_HEADS.IN_FEATURES": ["p4"]}, r"MODEL.ROI_HEADS.IN_FEATURES must name one"),
        ({"MODEL.ROI_MASK_HEAD.POOLER_RESOLUTION": 14}, r"MODEL.ROI_MASK_HEAD.POOLER_RESOLUTION \(14\) must equal"),
        ({"MODEL.ROI_MASK_HEAD.POOLER_ALIGNED": False}, r"MODEL.ROI_MASK_HEAD.POOLER_ALIGNED"),
        ({"MODEL.ROI_BOX_HEAD.POOLER_RESOLUTION": 7, "MODEL.ROI_MASK_HEAD.POOLER_RESOLUTION": 7}, "must be even"),
        ({"MODEL.RESNETS.RES5_DILATION": 2, "MODEL.RESNETS.DEPTH": 50, "MODEL.RESNETS.RES2_OUT_CHANNELS": 256},
         "RES5_DILATION must be 1"),
        ({"MODEL.RESNETS.NUM_GROUPS": 32}, "num_groups must be 1"),
        ({"MODEL.KEYPOINT_ON": True}, "MODEL.KEYPOINT_ON has no C4 keypoint branch"),
    ],
)
def test_bad_settings_are_named(overrides, message):
    with pytest.raises(ValueError, match=message):
        _heads(_cfg(**overrides))


def test_bad_inputs_are_named():
    heads = _heads(_cfg()).train()
    with pytest.raises(ValueError, match="Res5ROIHeads: targets are required"):
        heads(_images(), _features(), _proposals())
    with pytest.raises(KeyError, match=r"Res5ROIHeads: features \['res4'\] missing"):
        heads.eval()(_images(), {"res5": torch.zeros(2, 256, 4, 4)}, _proposals())
    with pytest.raises(ValueError, match="1 proposal sets for 2 images"):
        heads.eval()(_images(), _features(), _proposals()[:1])
