"""The keypoint head: its layers, its loss against a plain-PyTorch computation written here, both
normalizations, inference, and the keypoint branch of StandardROIHeads (training, eval, decoding
in the postprocessing)."""
import math

import pytest
import torch

from detcore.config import get_cfg
from detcore.layers import ShapeSpec
from detcore.modeling.postprocessing import detector_postprocess
from detcore.modeling.roi_heads import (
    ROI_KEYPOINT_HEAD_REGISTRY,
    KRCNNConvDeconvUpsampleHead,
    build_keypoint_head,
    build_roi_heads,
    keypoint_rcnn_loss,
    select_proposals_with_visible_keypoints,
)
from detcore.structures import Boxes, ImageList, Instances, Keypoints, heatmaps_to_keypoints

K = 4


def _head(**kwargs):
    return KRCNNConvDeconvUpsampleHead(ShapeSpec(channels=6), num_keypoints=K, conv_dims=[8, 8], **kwargs)


def test_layers_and_shapes():
    head = _head()
    assert [n for n, _ in head.named_children()] == ["conv_fcn1", "conv_fcn2", "score_lowres"]
    deconv = head.score_lowres
    assert deconv.kernel_size == (4, 4) and deconv.stride == (2, 2) and deconv.padding == (1, 1)
    assert head.layers(torch.randn(3, 6, 14, 14)).shape == (3, K, 56, 56)
    assert head.layers(torch.randn(0, 6, 14, 14)).shape == (0, K, 56, 56)
    assert head.conv_fcn1.bias.abs().sum() == 0 and head.score_lowres.bias.abs().sum() == 0


def test_layers_are_convs_relu_deconv_and_bilinear_upsampling():
    """The head's output, recomputed with plain torch.nn.functional calls."""
    torch.manual_seed(0)
    head = _head()
    x = torch.randn(2, 6, 14, 14)
    y = x
    for conv in (head.conv_fcn1, head.conv_fcn2):
        y = torch.relu(torch.nn.functional.conv2d(y, conv.weight, conv.bias, padding=1))
    y = torch.nn.functional.conv_transpose2d(y, head.score_lowres.weight, head.score_lowres.bias, stride=2, padding=1)
    y = torch.nn.functional.interpolate(y, size=(56, 56), mode="bilinear", align_corners=False)
    torch.testing.assert_close(head.layers(x), y)


def test_builder_reads_config():
    cfg = get_cfg()
    cfg.MODEL.ROI_KEYPOINT_HEAD.NUM_KEYPOINTS = 9
    cfg.MODEL.ROI_KEYPOINT_HEAD.CONV_DIMS = [16, 16, 16]
    head = build_keypoint_head(cfg, ShapeSpec(channels=4, height=14, width=14))
    assert isinstance(head, KRCNNConvDeconvUpsampleHead) and "KRCNNConvDeconvUpsampleHead" in ROI_KEYPOINT_HEAD_REGISTRY
    assert head.score_lowres.out_channels == 9 and len(head.convs) == 3 and head.loss_normalizer == "visible"
    cfg.MODEL.ROI_KEYPOINT_HEAD.NORMALIZE_LOSS_BY_VISIBLE_KEYPOINTS = False
    cfg.MODEL.ROI_HEADS.BATCH_SIZE_PER_IMAGE = 512
    # Detectron's published normalizer: K x ROIs per image x foreground fraction (9 x 512 x 0.25).
    assert build_keypoint_head(cfg, ShapeSpec(channels=4)).loss_normalizer == 9 * 512 * 0.25
    defaults = get_cfg().MODEL.ROI_KEYPOINT_HEAD
    assert (defaults.POOLER_RESOLUTION, list(defaults.CONV_DIMS), defaults.NUM_KEYPOINTS) == (14, [512] * 8, 17)


def test_constructor_checks():
    with pytest.raises(ValueError, match="loss_normalizer must be 'visible' or a positive number"):
        _head(loss_normalizer="all")
    with pytest.raises(ValueError, match="conv_dims needs at least one entry"):
        KRCNNConvDeconvUpsampleHead(ShapeSpec(channels=6), num_keypoints=K, conv_dims=[])


# --- the loss -------------------------------------------------------------------------------------
def _rois_with_keypoints():
    """Two images: 2 ROIs and 1 ROI, each with its matched GT keypoints (some invalid)."""
    boxes = [torch.tensor([[0.0, 0.0, 56.0, 56.0], [10.0, 20.0, 38.0, 48.0]]), torch.tensor([[5.0, 5.0, 61.0, 33.0]])]
    kps = [
        torch.tensor(
            [
                [[3.5, 7.2, 2], [55.9, 0.1, 1], [20.0, 30.0, 0], [60.0, 10.0, 2]],  # 2 valid (v=0, outside)
                [[10.0, 20.0, 2], [38.0, 48.0, 2], [24.1, 33.9, 2], [9.0, 30.0, 2]],  # 3 valid (edges inside)
            ]
        ),
        torch.tensor([[[5.0, 5.0, 2], [60.9, 32.9, 1], [33.0, 19.0, 2], [30.0, 4.0, 2]]]),  # 3 valid
    ]
    return [Instances((64, 64), proposal_boxes=Boxes(b), gt_keypoints=Keypoints(k)) for b, k in zip(boxes, kps)]


def _reference_terms(logits, instances):
    """Per counted keypoint: -log softmax of its cell, the cell found by walking the S x S grid."""
    size = logits.shape[-1]
    terms, r = [], 0
    for inst in instances:
        for box, kps in zip(inst.proposal_boxes.tensor.tolist(), inst.gt_keypoints.tensor.tolist()):
            x1, y1, x2, y2 = box
            for k, (x, y, v) in enumerate(kps):
                if v <= 0 or not (x1 <= x <= x2 and y1 <= y <= y2):
                    continue
                col = size - 1 if x == x2 else next(c for c in range(size) if x < x1 + (c + 1) * (x2 - x1) / size)
                row = size - 1 if y == y2 else next(c for c in range(size) if y < y1 + (c + 1) * (y2 - y1) / size)
                terms.append(-torch.log_softmax(logits[r, k].reshape(-1), 0)[row * size + col])
            r += 1
    return torch.stack(terms)


def test_loss_is_the_mean_cross_entropy_over_valid_keypoints():
    torch.manual_seed(0)
    instances = _rois_with_keypoints()
    logits = torch.randn(3, K, 56, 56, requires_grad=True)
    terms = _reference_terms(logits, instances)
    assert len(terms) == 8
    loss = keypoint_rcnn_loss(logits, instances)
    torch.testing.assert_close(loss, terms.mean())
    # The published normalization: the sum over a fixed count.
    torch.testing.assert_close(keypoint_rcnn_loss(logits, instances, normalizer=100.0), terms.sum() / 100)
    loss.backward()
    assert logits.grad.abs().sum() > 0


def test_head_forward_uses_its_normalizer():
    torch.manual_seed(0)
    instances = _rois_with_keypoints()
    x = torch.randn(3, 6, 14, 14)
    visible = _head().train()
    published = _head(loss_normalizer=8.0, loss_weight=4.0).train()
    published.load_state_dict(visible.state_dict())
    terms = _reference_terms(visible.layers(x), instances)
    torch.testing.assert_close(visible(x, instances)["loss_keypoint"], terms.mean())
    # 8 per image, 2 images.
    torch.testing.assert_close(published(x, instances)["loss_keypoint"], 4.0 * terms.sum() / 16)


def test_loss_without_valid_keypoints_is_a_connected_zero():
    logits = torch.randn(1, K, 56, 56, requires_grad=True)
    inst = Instances((64, 64), proposal_boxes=Boxes(torch.tensor([[0.0, 0.0, 10.0, 10.0]])))
    inst.gt_keypoints = Keypoints(torch.tensor([[[50.0, 50.0, 2], [1.0, 1.0, 0], [0, 0, 0], [0, 0, 0]]]))
    loss = keypoint_rcnn_loss(logits, [inst])
    assert loss.item() == 0.0
    loss.backward()
    assert logits.grad is not None
    empty = Instances((64, 64), proposal_boxes=Boxes(torch.zeros(0, 4)), gt_keypoints=Keypoints(torch.zeros(0, K, 3)))
    assert keypoint_rcnn_loss(torch.zeros(0, K, 56, 56), [empty]).item() == 0.0


def test_loss_errors_name_the_mismatch():
    instances = _rois_with_keypoints()
    with pytest.raises(ValueError, match="2 heatmap sets for 3 ROIs"):
        keypoint_rcnn_loss(torch.zeros(2, K, 56, 56), instances)
    with pytest.raises(ValueError, match=r"predicts 5 keypoints \(MODEL.ROI_KEYPOINT_HEAD.NUM_KEYPOINTS\) but the ground truth has 4"):
        keypoint_rcnn_loss(torch.zeros(3, 5, 56, 56), instances)


def test_select_proposals_with_visible_keypoints():
    inst = Instances((64, 64), proposal_boxes=Boxes(torch.tensor([[0.0, 0.0, 10.0, 10.0], [20.0, 20.0, 30.0, 30.0], [0, 0, 64, 64]])))
    inst.gt_keypoints = Keypoints(
        torch.tensor(
            [
                [[10.0, 10.0, 1], [0, 0, 0]],  # on the corner: kept
                [[25.0, 25.0, 0], [50.0, 50.0, 2]],  # unlabeled inside, labeled outside: dropped
                [[0, 0, 0], [0, 0, 0]],  # nothing labeled: dropped
            ]
        )
    )
    kept = select_proposals_with_visible_keypoints([inst])[0]
    assert kept.proposal_boxes.tensor.tolist() == [[0.0, 0.0, 10.0, 10.0]]


# --- in the ROI heads -----------------------------------------------------------------------------
CHANNELS = 8


def _roi_cfg():
    cfg = get_cfg()
    cfg.MODEL.KEYPOINT_ON = True
    cfg.MODEL.ROI_HEADS.NUM_CLASSES = 1
    cfg.MODEL.ROI_HEADS.BATCH_SIZE_PER_IMAGE = 16
    cfg.MODEL.ROI_BOX_HEAD.FC_DIM = 16
    cfg.MODEL.ROI_KEYPOINT_HEAD.NUM_KEYPOINTS = K
    cfg.MODEL.ROI_KEYPOINT_HEAD.CONV_DIMS = [8, 8]
    return cfg


def _features(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {f"p{k}": torch.randn(2, CHANNELS, 64 >> k, 64 >> k, generator=g) for k in range(2, 7)}


def _targets():
    t0 = Instances((64, 64), gt_boxes=Boxes(torch.tensor([[4.0, 6.0, 30.0, 40.0]])), gt_classes=torch.tensor([0]))
    t0.gt_keypoints = Keypoints(torch.tensor([[[10.0, 10.0, 2], [20.0, 30.0, 2], [25.0, 8.0, 1], [0, 0, 0]]]))
    t1 = Instances((60, 50), gt_boxes=Boxes(torch.zeros(0, 4)), gt_classes=torch.zeros(0, dtype=torch.int64))
    t1.gt_keypoints = Keypoints(torch.zeros(0, K, 3))
    return [t0, t1]


def _proposals(count=20, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for h, w in [(64, 64), (60, 50)]:
        xy = torch.rand(count, 2, generator=g) * 20
        boxes = torch.cat([xy, xy + torch.rand(count, 2, generator=g) * 30 + 4], dim=1)
        out.append(Instances((h, w), proposal_boxes=Boxes(boxes), objectness_logits=torch.randn(count, generator=g)))
    return out


def _images():
    return ImageList(torch.zeros(2, 3, 64, 64), [(64, 64), (60, 50)])


def _input_shape():
    return {f"p{k}": ShapeSpec(channels=CHANNELS, stride=2**k) for k in range(2, 7)}


def test_roi_heads_train_the_keypoint_branch():
    torch.manual_seed(0)
    heads = build_roi_heads(_roi_cfg(), _input_shape()).train()
    assert heads.keypoint_on and not heads.mask_on
    _, losses = heads(_images(), _features(), _proposals(), _targets())
    assert set(losses) == {"loss_cls", "loss_box_reg", "loss_keypoint"}
    # Near-uniform heatmaps at init: the cross entropy of 56 x 56 cells.
    assert losses["loss_keypoint"].item() == pytest.approx(math.log(56 * 56), rel=0.05)
    losses["loss_keypoint"].backward()
    assert heads.keypoint_head.score_lowres.weight.grad.abs().sum() > 0


def test_roi_heads_need_keypoint_targets():
    heads = build_roi_heads(_roi_cfg(), _input_shape()).train()
    targets = _targets()
    targets[0].remove("gt_keypoints")
    with pytest.raises(ValueError, match="MODEL.KEYPOINT_ON needs gt_keypoints"):
        heads(_images(), _features(), _proposals(), targets)


def test_tiny_training_lowers_the_keypoint_loss():
    torch.manual_seed(0)
    heads = build_roi_heads(_roi_cfg(), _input_shape()).train()
    opt = torch.optim.SGD(heads.parameters(), lr=0.02, momentum=0.9)
    history = []
    for _ in range(25):
        _, losses = heads(_images(), _features(), _proposals(), _targets())
        opt.zero_grad()
        losses["loss_keypoint"].backward()
        opt.step()
        history.append(losses["loss_keypoint"].item())
    assert history[-1] < 0.6 * history[0], history


def test_eval_gives_heatmaps_and_postprocessing_decodes_them():
    cfg = _roi_cfg()
    cfg.TEST.DETECTIONS_PER_IMAGE = 5
    heads = build_roi_heads(cfg, _input_shape()).eval()
    with torch.no_grad():
        results, _ = heads(_images(), _features(), _proposals())
    res = results[0]
    assert res.pred_keypoint_heatmaps.shape == (len(res), K, 56, 56) and len(res) > 0
    # Decoded in the boxes' frame, then scaled with them to an image twice as large.
    final = detector_postprocess(res, 128, 128)
    assert not final.has("pred_keypoint_heatmaps")
    expected = heatmaps_to_keypoints(res.pred_keypoint_heatmaps, res.pred_boxes.tensor)
    expected[..., :2] *= 2
    torch.testing.assert_close(final.pred_keypoints, expected[res.pred_boxes.nonempty()])
