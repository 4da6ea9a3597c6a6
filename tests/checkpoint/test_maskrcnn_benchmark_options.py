"""Each maskrcnn-benchmark / Detectron compatibility option against a reference written here from
their code (maskrcnn_benchmark/modeling, structures; Detectron's generate_anchors), on inputs where
the option matters: anchors, "+1" clipping, ROIAlign on inclusive corners, the level rule, the
rescale to the original image and the mask paste."""
import numpy as np
import pytest
import torch

from detcore.modeling.anchor_generator import DefaultAnchorGenerator, generate_detectron_cell_anchors
from detcore.modeling.poolers import ROIPooler, assign_boxes_to_levels
from detcore.modeling.postprocessing import detector_postprocess
from detcore.modeling.proposal_generator.rpn import find_top_rpn_proposals
from detcore.modeling.roi_heads.fast_rcnn import fast_rcnn_inference
from detcore.structures import Boxes, Instances

torchvision = pytest.importorskip("torchvision")


# --- references, in their inclusive ("+1") corners --------------------------------------------------
def reference_generate_anchors(stride, sizes, ratios):
    """Detectron's generate_anchors: ratios enumerated on the (0, 0, stride - 1, stride - 1)
    window (widths rounded), each then scaled; inclusive corners, ratio-major."""

    def whctrs(a):
        w, h = a[2] - a[0] + 1, a[3] - a[1] + 1
        return w, h, a[0] + 0.5 * (w - 1), a[1] + 0.5 * (h - 1)

    def mkanchors(ws, hs, x, y):
        return np.stack([x - 0.5 * (ws - 1), y - 0.5 * (hs - 1), x + 0.5 * (ws - 1), y + 0.5 * (hs - 1)], 1)

    w, h, x, y = whctrs(np.array([0, 0, stride - 1, stride - 1], dtype=np.float64))
    ws = np.round(np.sqrt(w * h / np.asarray(ratios, dtype=np.float64)))
    hs = np.round(ws * np.asarray(ratios, dtype=np.float64))
    out = []
    for a in mkanchors(ws, hs, x, y):
        w, h, x, y = whctrs(a)
        scales = np.asarray(sizes, dtype=np.float64) / stride
        out.append(mkanchors(w * scales, h * scales, x, y))
    return np.concatenate(out)


def legacy_clip(boxes, h, w):
    """BoxList.clip_to_image of ``[..., 4]`` boxes on their inclusive corners, back in detcore's
    boxes."""
    legacy = torch.cat([boxes[..., :2], boxes[..., 2:] - 1], -1)
    legacy[..., 0::2] = legacy[..., 0::2].clamp(0, w - 1)
    legacy[..., 1::2] = legacy[..., 1::2].clamp(0, h - 1)
    return torch.cat([legacy[..., :2], legacy[..., 2:] + 1], -1)


# --- anchors ----------------------------------------------------------------------------------------
def test_detectron_anchors_are_the_published_ones():
    # Detectron's generate_anchors docstring: stride 16, sizes (128, 256, 512), ratios (0.5, 1, 2),
    # as Shaoqing Ren's MATLAB code printed them (1-based pixel indices: +1 on every corner).
    published = np.array(
        [[-83, -39, 100, 56], [-175, -87, 192, 104], [-359, -183, 376, 200],
         [-55, -55, 72, 72], [-119, -119, 136, 136], [-247, -247, 264, 264],
         [-35, -79, 52, 96], [-79, -167, 96, 184], [-167, -343, 184, 360]], dtype=np.float64)  # fmt: skip
    reference = reference_generate_anchors(16, (128, 256, 512), (0.5, 1, 2))
    assert np.array_equal(reference + 1, published)
    # detcore's cell anchors are centered at 0 in detcore's boxes; the cell's center is stride / 2.
    ours = generate_detectron_cell_anchors(16, (128, 256, 512), (0.5, 1, 2)).double().numpy()
    assert np.array_equal(ours + 8 - np.array([0, 0, 1, 1]), reference)


def test_detectron_anchor_grid_matches_maskrcnn_benchmark():
    strides, sizes = [4, 8, 16, 32, 64], [[32], [64], [128], [256], [512]]
    grids = [(24, 32), (12, 16), (6, 8), (3, 4), (2, 2)]
    gen = DefaultAnchorGenerator(sizes, [[0.5, 1.0, 2.0]], strides, offset=0.5, detectron_cell_anchors=True)
    got = gen([torch.zeros(1, 1, h, w) for h, w in grids])
    for (h, w), stride, size, boxes in zip(grids, strides, sizes, got):
        # maskrcnn-benchmark's grid_anchors: shifts (x * stride, y * stride), location-major.
        cell = torch.from_numpy(reference_generate_anchors(stride, size, (0.5, 1, 2))).float()
        ys, xs = torch.meshgrid(torch.arange(h) * stride, torch.arange(w) * stride, indexing="ij")
        shifts = torch.stack([xs, ys, xs, ys], -1).reshape(-1, 1, 4).float()
        expected = (shifts + cell[None]).reshape(-1, 4)
        assert torch.equal(boxes.tensor, torch.cat([expected[:, :2], expected[:, 2:] + 1], 1))
    plain = DefaultAnchorGenerator(sizes, [[0.5, 1.0, 2.0]], strides, offset=0.5)
    assert not torch.equal(plain([torch.zeros(1, 1, 24, 32)] * 5)[0].tensor, got[0].tensor[: 24 * 32 * 3])
    with pytest.raises(ValueError, match="choose one"):
        DefaultAnchorGenerator(sizes, [[1.0]], strides, round_cell_anchors=True, detectron_cell_anchors=True)


# --- clipping ---------------------------------------------------------------------------------------
def test_legacy_clip_in_rpn_and_box_inference():
    h, w = 50, 70
    g = torch.Generator().manual_seed(0)
    xy = torch.rand(40, 2, generator=g) * 90 - 10
    boxes = torch.cat([xy, xy + torch.rand(40, 2, generator=g) * 30 + 0.5], 1)
    boxes[:4] = torch.tensor([[69.5, 49.7, 75.0, 60.0], [-5.0, -3.0, 0.4, 0.7], [68.9, 10, 69.6, 20], [3, 48.5, 9, 49.8]])
    logits = torch.linspace(5, -5, 40)[None]
    props = find_top_rpn_proposals([boxes[None]], [logits], [(h, w)], 1.0, 100, 100, legacy_plus_one=True)[0]
    assert torch.equal(props.proposal_boxes.tensor, legacy_clip(boxes, h, w))
    default = find_top_rpn_proposals([boxes[None]], [logits], [(h, w)], 1.0, 100, 100)[0].proposal_boxes.tensor
    assert not torch.equal(default[:4], legacy_clip(boxes, h, w)[:4])

    scores = torch.full((40, 2), 0.5)  # one class, background last
    dets, _ = fast_rcnn_inference([boxes], [scores], [(h, w)], 0.05, 1.0, -1, legacy_plus_one=True)
    assert torch.equal(dets[0].pred_boxes.tensor, legacy_clip(boxes, h, w))


# --- pooling ----------------------------------------------------------------------------------------
def reference_pooler(features, boxes, output_size, sampling_ratio):
    """maskrcnn-benchmark's Pooler: LevelMapper on "+1" areas, floor(4 + log2(s / 224 + 1e-6)),
    and Detectron's ROIAlign (torchvision's aligned=False) on inclusive corners."""
    legacy = torch.cat([boxes[:, :2], boxes[:, 2:] - 1], 1)
    area = (legacy[:, 2] - legacy[:, 0] + 1) * (legacy[:, 3] - legacy[:, 1] + 1)
    levels = torch.floor(4 + torch.log2(torch.sqrt(area) / 224 + 1e-6)).clamp(2, 5).long() - 2
    rois = torch.cat([torch.zeros(len(boxes), 1), legacy], 1)
    out = torch.zeros(len(boxes), features[0].shape[1], output_size, output_size)
    for level, x in enumerate(features):
        idx = torch.nonzero(levels == level).squeeze(1)
        out[idx] = torchvision.ops.roi_align(x, rois[idx], output_size, 1 / 2 ** (level + 2), sampling_ratio, aligned=False)
    return out


def test_legacy_pooler_matches_maskrcnn_benchmark():
    g = torch.Generator().manual_seed(1)
    features = [torch.randn(1, 4, 64 // 2**k, 96 // 2**k, generator=g) for k in range(4)]
    xy = torch.rand(60, 2, generator=g) * 200
    boxes = torch.cat([xy, xy + torch.rand(60, 2, generator=g) * 150 + 1], 1)
    # sqrt(area) a hair below / at / above 112 and 224, where the eps decides the level
    sides = torch.tensor([112.0, 224.0]).repeat_interleave(3) * torch.tensor([1 - 5e-7, 1.0, 1 + 5e-7]).repeat(2)
    boxes = torch.cat([boxes, torch.stack([torch.zeros(6), torch.zeros(6), sides, sides], 1)])
    pooler = ROIPooler(7, (1 / 4, 1 / 8, 1 / 16, 1 / 32), 2, aligned=False, level_mapper="maskrcnn_benchmark", legacy_plus_one=True)
    expected = reference_pooler(features, boxes, 7, 2)
    torch.testing.assert_close(pooler(features, [Boxes(boxes)]), expected, rtol=1e-5, atol=1e-6)
    for kwargs in ({"level_mapper": "maskrcnn_benchmark"}, {"legacy_plus_one": True}):  # each matters
        other = ROIPooler(7, (1 / 4, 1 / 8, 1 / 16, 1 / 32), 2, aligned=False, **kwargs)
        assert not torch.allclose(other(features, [Boxes(boxes)]), expected, rtol=1e-5, atol=1e-6), kwargs


def test_maskrcnn_benchmark_level_rule():
    sides = torch.tensor([56.0, 112.0, 224.0, 448.0]).repeat_interleave(4) * torch.tensor([1 - 2e-6, 1 - 5e-7, 1.0, 1 + 1e-7]).repeat(4)
    boxes = Boxes(torch.stack([torch.zeros(16), torch.zeros(16), sides, sides], 1))
    expected = torch.floor(4 + torch.log2(sides / 224 + 1e-6)).clamp(2, 5).long() - 2
    assert torch.equal(assign_boxes_to_levels([boxes], 2, 5, 224, 4, "maskrcnn_benchmark"), expected)
    assert not torch.equal(assign_boxes_to_levels([boxes], 2, 5, 224, 4, "detectron2"), expected)


# --- rescale and paste ------------------------------------------------------------------------------
def test_legacy_rescale_and_paste_match_maskrcnn_benchmark():
    from torchvision.models.detection.roi_heads import paste_masks_in_image as tv_paste

    g = torch.Generator().manual_seed(2)
    in_h, in_w, out_h, out_w = 64, 96, 45, 70  # the input was resized from 45 x 70
    xy = torch.rand(12, 2, generator=g) * 60
    boxes = legacy_clip(torch.cat([xy, xy + torch.rand(12, 2, generator=g) * 40 + 2], 1), in_h, in_w)
    probs = torch.rand(12, 1, 28, 28, generator=g)
    result = Instances((in_h, in_w), pred_boxes=Boxes(boxes.clone()), scores=torch.rand(12), pred_masks=probs)
    result.pred_classes = torch.zeros(12, dtype=torch.int64)
    got = detector_postprocess(result, out_h, out_w, paste_mode="torchvision", legacy_plus_one=True)

    # BoxList.resize scales the inclusive corners; Masker pastes into them and keeps p > 0.5.
    legacy = torch.cat([boxes[:, :2], boxes[:, 2:] - 1], 1) * torch.tensor([out_w / in_w, out_h / in_h] * 2)
    expected_boxes = torch.cat([legacy[:, :2], legacy[:, 2:] + 1], 1)
    expected_masks = tv_paste(probs, legacy, (out_h, out_w), padding=1)[:, 0] > 0.5
    assert len(got) == 12
    torch.testing.assert_close(got.pred_boxes.tensor, expected_boxes)
    assert torch.equal(got.pred_masks, expected_masks)
    plain = detector_postprocess(result, out_h, out_w, paste_mode="torchvision")
    assert not torch.allclose(plain.pred_boxes.tensor, expected_boxes)
    assert not torch.equal(plain.pred_masks, expected_masks)


# --- proposal ranking --------------------------------------------------------------------------------
def test_sigmoid_ranking_keeps_saturated_ties_in_level_order():
    # maskrcnn-benchmark ranks proposals by sigmoid(objectness): saturated ones tie at 1.0. Here
    # ties keep the order of the per-level candidates (p2 first, each level by logit), which is
    # what a stable sort of its concatenated levels gives.
    g = torch.Generator().manual_seed(4)
    height, width = 120, 160
    boxes, logits = [], []
    for h, w in [(30, 40), (15, 20), (8, 10)]:
        n = h * w * 3
        centers = torch.rand(1, n, 2, generator=g) * torch.tensor([width, height])
        sides = torch.rand(1, n, 2, generator=g) * 40 + 2
        boxes.append(torch.cat([centers - sides / 2, centers + sides / 2], 2))
        logits.append(torch.randn(1, n, generator=g) * 20)
    pre, post = 300, 200
    got = find_top_rpn_proposals([b.clone() for b in boxes], logits, [(height, width)], 0.7, pre, post, ranking="sigmoid")[0]

    cand_boxes, cand_probs = [], []
    for b, lg in zip(boxes, logits):
        top = lg[0].topk(min(pre, lg.shape[1])).indices
        level_boxes = torchvision.ops.clip_boxes_to_image(b[0, top], (height, width))
        level_probs = torch.sigmoid(lg[0, top])
        kept = torchvision.ops.nms(level_boxes, level_probs, 0.7)  # stable: ties by index
        cand_boxes.append(level_boxes[kept])
        cand_probs.append(level_probs[kept])
    probs = torch.cat(cand_probs)
    order = torch.sort(probs, descending=True, stable=True).indices[:post]
    assert int((probs[order] == 1).sum()) == post  # every kept proposal is a tie
    assert torch.equal(got.proposal_boxes.tensor, torch.cat(cand_boxes)[order])
    by_logit = find_top_rpn_proposals([b.clone() for b in boxes], logits, [(height, width)], 0.7, pre, post)[0]
    assert not torch.equal(by_logit.proposal_boxes.tensor, got.proposal_boxes.tensor)
