"""Each torchvision-compatibility option against the torchvision component it reproduces, on
inputs chosen where the option matters (the whole-model parity test may not reach those cases:
p6 anchors clipped by a small image, boxes right at a level boundary, sub-pixel detections)."""
import pytest
import torch

from detcore.modeling.anchor_generator import DefaultAnchorGenerator
from detcore.modeling.box_regression import Box2BoxTransform
from detcore.modeling.poolers import assign_boxes_to_levels
from detcore.modeling.roi_heads.fast_rcnn import FastRCNNOutputLayers
from detcore.modeling.roi_heads.mask_head import mask_rcnn_loss
from detcore.structures import BitMasks, Boxes, Instances

torchvision = pytest.importorskip("torchvision")
from torchvision.models.detection import roi_heads as tv_roi_heads  # noqa: E402
from torchvision.models.detection.anchor_utils import AnchorGenerator  # noqa: E402
from torchvision.models.detection.image_list import ImageList as TVImageList  # noqa: E402
from torchvision.ops.poolers import LevelMapper  # noqa: E402

SIZES = [[32], [64], [128], [256], [512]]
RATIOS = [[0.5, 1.0, 2.0]]


def test_anchors_match_torchvision_with_odd_map_sizes():
    # An 800 x 1067 image padded to 800 x 1088: p5 is 25 x 34, p6 13 x 17 (stride 61 in y).
    padded = (800, 1088)
    grids = [(200, 272), (100, 136), (50, 68), (25, 34), (13, 17)]
    feats = [torch.zeros(1, 1, h, w) for h, w in grids]
    tv = AnchorGenerator(sizes=tuple((s[0],) for s in SIZES), aspect_ratios=((0.5, 1.0, 2.0),) * 5)
    expected = tv(TVImageList(torch.zeros(1, 3, *padded), [(800, 1067)]), feats)[0]

    ours = DefaultAnchorGenerator(SIZES, RATIOS, [4, 8, 16, 32, 64], round_cell_anchors=True, strides_from_image_size=True)
    got = torch.cat([b.tensor for b in ours(feats, image_size=padded)])
    assert torch.equal(got, expected)
    # Each option matters here: without either the anchors differ.
    for kwargs in ({"round_cell_anchors": True}, {"strides_from_image_size": True}):
        other = DefaultAnchorGenerator(SIZES, RATIOS, [4, 8, 16, 32, 64], **kwargs)
        assert not torch.equal(torch.cat([b.tensor for b in other(feats, image_size=padded)]), expected)
    with pytest.raises(ValueError, match="image_size"):
        ours(feats)


def test_level_assignment_matches_torchvision_at_boundaries():
    g = torch.Generator().manual_seed(0)
    sides = torch.cat(
        [
            torch.rand(500, generator=g) * 900 + 1,
            # sqrt(area) a hair below / at / above the 112, 224, 448 px boundaries
            torch.tensor([112.0, 224.0, 448.0]).repeat_interleave(5)
            * torch.tensor([1 - 4e-7, 1 - 1e-7, 1.0, 1 + 1e-7, 1 + 1e-6]).repeat(3),
        ]
    )
    x1 = torch.rand(len(sides), generator=g) * 50
    boxes = torch.stack([x1, x1, x1 + sides, x1 + sides], dim=1)
    expected = LevelMapper(2, 5, canonical_scale=224, canonical_level=4, eps=1e-6)([boxes])
    got = assign_boxes_to_levels([Boxes(boxes)], 2, 5, 224, 4, level_mapper="torchvision")
    assert torch.equal(got, expected)
    default = assign_boxes_to_levels([Boxes(boxes)], 2, 5, 224, 4)
    assert (default != expected).any()  # the boxes just below a boundary


def _tv_roi_heads():
    # Only the inference settings matter for postprocess_detections (no top-k cap here).
    return tv_roi_heads.RoIHeads(None, None, None, 0.5, 0.5, 512, 0.25, None, 0.05, 0.5, 10**4)


def test_box_inference_matches_torchvision_with_tiny_boxes():
    g = torch.Generator().manual_seed(1)
    num_classes = 6  # foreground; torchvision has 7 outputs with background first
    proposals = torch.rand(60, 2, generator=g) * 200
    sides = torch.rand(60, 2, generator=g) * 80 + 2
    sides[:10] = 0.004  # sub-pixel proposals: their detections stay below 0.01 px
    proposals = torch.cat([proposals, proposals + sides], 1)
    logits = torch.randn(60, num_classes + 1, generator=g) * 2
    logits[:10, 1] += 6  # make the tiny ones score high
    deltas = torch.randn(60, 4 * (num_classes + 1), generator=g) * 0.1
    deltas[:10] = 0
    boxes_tv, scores_tv, labels_tv = _tv_roi_heads().postprocess_detections(logits, deltas, [proposals], [(240, 320)])

    layer = FastRCNNOutputLayers(
        1024,
        box2box_transform=Box2BoxTransform((10.0, 10.0, 5.0, 5.0)),
        num_classes=num_classes,
        test_score_thresh=0.05,
        test_nms_thresh=0.5,
        test_topk_per_image=10**4,
        test_min_box_size=0.01,
    )
    ours_logits = torch.cat([logits[:, 1:], logits[:, :1]], 1)  # background last
    props = Instances((240, 320), proposal_boxes=Boxes(proposals))
    result = layer.inference((ours_logits, deltas[:, 4:]), [props])[0][0]
    assert len(result) == len(boxes_tv[0]) > 0
    torch.testing.assert_close(result.pred_boxes.tensor, boxes_tv[0])
    torch.testing.assert_close(result.scores, scores_tv[0])
    assert torch.equal(result.pred_classes, labels_tv[0] - 1)
    layer.test_min_box_size = 0.0
    assert len(layer.inference((ours_logits, deltas[:, 4:]), [props])[0][0]) > len(result)


def test_mask_targets_and_loss_match_torchvision():
    g = torch.Generator().manual_seed(2)
    masks = torch.rand(3, 50, 70, generator=g) > 0.6
    xy = torch.rand(12, 2, generator=g) * 40
    proposals = torch.cat([xy, xy + torch.rand(12, 2, generator=g) * 30 + 1], 1)
    matched = torch.randint(0, 3, (12,), generator=g)
    labels = torch.tensor([2, 5, 1])
    logits = torch.randn(12, 6, 28, 28, generator=g)
    expected = tv_roi_heads.maskrcnn_loss(logits, [proposals], [masks], [labels], [matched])

    inst = Instances((50, 70), proposal_boxes=Boxes(proposals), gt_classes=labels[matched] - 1)
    inst.gt_masks = BitMasks(masks[matched])
    got = mask_rcnn_loss(logits[:, 1:], [inst], target_mode="torchvision")  # no background mask
    torch.testing.assert_close(got, expected)
    assert not torch.allclose(mask_rcnn_loss(logits[:, 1:], [inst]), expected)


def test_rpn_proposals_match_torchvision_when_objectness_saturates():
    # Logits of +-20 std: sigmoid rounds most of the top ones to exactly 1.0, so they tie, and
    # torchvision's batched_nms (per-level NMS, then an unstable sort of the survivors) decides
    # which pass the per-image top-k. Same inputs here and there: the same proposals, in order.
    from torchvision.models.detection.rpn import RegionProposalNetwork

    from detcore.modeling.proposal_generator.rpn import find_top_rpn_proposals

    g = torch.Generator().manual_seed(0)
    height, width = 160, 224
    boxes, logits = [], []
    for h, w in [(40, 56), (20, 28), (10, 14), (5, 7), (3, 4)]:
        n = h * w * 3
        centers = torch.rand(1, n, 2, generator=g) * torch.tensor([width, height])
        sides = torch.rand(1, n, 2, generator=g) * 60 + 2
        boxes.append(torch.cat([centers - sides / 2, centers + sides / 2], 2))
        logits.append(torch.randn(1, n, generator=g) * 20)
    rpn = RegionProposalNetwork(None, None, 0.7, 0.3, 256, 0.5, {"testing": 600}, {"testing": 300}, 0.7).eval()
    tv_boxes, tv_scores = rpn.filter_proposals(
        torch.cat(boxes, 1), torch.cat(logits, 1), [(height, width)], [b.shape[1] for b in boxes]
    )

    def ours(ranking):
        out = find_top_rpn_proposals(
            [b.clone() for b in boxes], logits, [(height, width)], 0.7, 600, 300, 1e-3, ranking=ranking
        )[0]
        return out.proposal_boxes.tensor, torch.sigmoid(out.objectness_logits)

    got_boxes, got_scores = ours("torchvision")
    # Every kept proposal ties with many others left out.
    assert bool((got_scores == 1).all()) and int((torch.sigmoid(torch.cat(logits, 1)) == 1).sum()) > 2 * 300
    assert torch.equal(got_boxes, tv_boxes[0]) and torch.equal(got_scores, tv_scores[0])
    for ranking in ("logit", "sigmoid"):  # the other rankings keep other proposals
        other, _ = ours(ranking)
        assert len(other) == len(got_boxes) and not torch.equal(other, got_boxes), ranking


@pytest.mark.parametrize("size", [(375, 500), (500, 1500), (641, 427), (800, 1067), (33, 47)])
def test_resize_matches_torchvision_transform(size):
    # GeneralizedRCNNTransform resizes the float image (after normalizing, which commutes with
    # bilinear interpolation up to rounding) and its masks; min_size 800, max_size 1333.
    from torchvision.models.detection.transform import _resize_image_and_masks

    from detcore.data.transforms import ResizeShortestEdge

    g = torch.Generator().manual_seed(3)
    h, w = size
    image = torch.randint(0, 256, (h, w, 3), generator=g, dtype=torch.uint8)
    masks = torch.rand(2, h, w, generator=g) > 0.5
    expected, target = _resize_image_and_masks(
        image.permute(2, 0, 1).float(), 800, 1333, {"masks": masks.to(torch.uint8)}
    )
    t = ResizeShortestEdge.test_transform(h, w, 800, 1333, mode="torchvision")
    got = torch.from_numpy(t.apply_image(image.numpy())).permute(2, 0, 1)
    assert got.dtype == torch.float32 and torch.equal(got, expected)
    got_masks = torch.stack([torch.from_numpy(t.apply_segmentation(m.numpy())) for m in masks])
    assert torch.equal(got_masks.to(torch.uint8), target["masks"])
    if size == (375, 500):  # cv2 rounds the width to 1067 and its uint8 output to 0-255 steps
        default = ResizeShortestEdge.test_transform(h, w, 800, 1333).apply_image(image.numpy())
        assert default.shape == (800, 1067, 3) and tuple(got.shape[1:]) == (800, 1066)
