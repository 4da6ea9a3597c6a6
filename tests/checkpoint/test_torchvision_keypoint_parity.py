"""detcore with converted torchvision weights must BE torchvision's Keypoint R-CNN: same
detections, same keypoints (within 1e-2 px) and keypoint scores, same training losses, on a real
photo (see test_torchvision_parity.py for the weights, the image and why detections are paired
rather than compared position by position).

The keypoint head gets seeded random weights too (torchvision's init, then random biases), so its
heatmaps have peaks all over the boxes and every keypoint is decoded from a different spot.
"""
import pathlib

import numpy as np
import pytest
import torch

from detcore.checkpoint import convert_state_dict
from detcore.config import get_cfg
from detcore.modeling import build_model
from detcore.modeling.postprocessing import detector_postprocess
from detcore.structures import BitMasks, Boxes, Instances, Keypoints

from .test_torchvision_parity import EVERYTHING, MEAN, STD, _randomize, pair_detections, real_image

torchvision = pytest.importorskip("torchvision")

REPO = pathlib.Path(__file__).resolve().parents[2]
NUM_KEYPOINTS = 17
SCORE_THRESH = 0.2


def build_pair(height, width, pixels, proposals):
    """(torchvision keypointrcnn_resnet50_fpn, detcore model with its converted weights), eval mode."""
    torch.manual_seed(0)
    pre, post = proposals
    tv = torchvision.models.detection.keypointrcnn_resnet50_fpn(
        weights=None,
        weights_backbone=None,
        num_classes=91,  # many classes: several score above the threshold with random weights
        min_size=height,
        max_size=max(width, 1333),
        image_mean=MEAN,
        image_std=STD,
        rpn_pre_nms_top_n_train=pre,
        rpn_pre_nms_top_n_test=pre,
        rpn_post_nms_top_n_train=post,
        rpn_post_nms_top_n_test=post,
        rpn_batch_size_per_image=EVERYTHING,
        box_batch_size_per_image=EVERYTHING,
        # Every detection above the score threshold: a cut at 100 would fall between near-ties.
        # The threshold keeps ~80 (the 8 x 512 keypoint head runs on each).
        box_detections_per_img=EVERYTHING,
        box_score_thresh=SCORE_THRESH,
    )
    tv.transform.torch_choice = lambda sizes: sizes[0]
    _randomize(tv, pixels)
    tv.eval()

    cfg = get_cfg()
    cfg.merge_from_file(str(REPO / "configs" / "torchvision" / "keypoint_rcnn_R_50_FPN.yaml"))
    cfg.merge_from_list(
        [
            "MODEL.DEVICE", "cpu", "MODEL.ROI_HEADS.NUM_CLASSES", 90,
            "MODEL.RPN.PRE_NMS_TOPK_TRAIN", pre, "MODEL.RPN.PRE_NMS_TOPK_TEST", pre,
            "MODEL.RPN.POST_NMS_TOPK_TRAIN", post, "MODEL.RPN.POST_NMS_TOPK_TEST", post,
            "MODEL.RPN.BATCH_SIZE_PER_IMAGE", EVERYTHING,
            "MODEL.ROI_HEADS.BATCH_SIZE_PER_IMAGE", EVERYTHING,
            "TEST.DETECTIONS_PER_IMAGE", EVERYTHING, "MODEL.ROI_HEADS.SCORE_THRESH_TEST", SCORE_THRESH,
        ]
    )  # fmt: skip
    ours = build_model(cfg)
    state_dict, report = convert_state_dict(tv.state_dict(), ours)
    assert report.complete, report.table()
    ours.load_state_dict(state_dict, strict=True)
    return tv, ours.eval()


def gt_keypoints(masks, seed=0):
    """17 points per instance: most on its mask, some in its box off the mask, a few unlabeled."""
    rng = np.random.default_rng(seed)
    out = np.zeros((len(masks), NUM_KEYPOINTS, 3), dtype=np.float32)
    for i, mask in enumerate(masks):
        ys, xs = np.nonzero(mask)
        pick = rng.integers(len(xs), size=NUM_KEYPOINTS)
        out[i, :, 0] = xs[pick] + rng.uniform(0, 1, NUM_KEYPOINTS)
        out[i, :, 1] = ys[pick] + rng.uniform(0, 1, NUM_KEYPOINTS)
        out[i, :, 2] = rng.choice([0, 1, 2], size=NUM_KEYPOINTS, p=[0.2, 0.3, 0.5])
        out[i, 3, :2] = [xs.min(), ys.max() + 1]  # on the box's bottom edge
    out[out[..., 2] == 0] = 0
    return out


def check_keypoints(got, expected, boxes, tv_maps, source):
    """``got`` and ``expected`` [N, K, 3] (x, y, score) agree: points within 1e-2 px, scores
    within 1e-3. Random heatmaps have several peaks; where two are level to float rounding, the
    two models may pick different ones. Each point that differs must be such a tie: in
    torchvision's own resized heatmap, our pixel scores its maximum to 1e-4; such points stay
    under 1% of all."""
    err = (got[..., :2] - expected[..., :2]).abs().amax(dim=2)
    flipped = (err > 1e-2).nonzero().tolist()
    assert len(flipped) <= 0.01 * err.numel(), f"{len(flipped)} of {err.numel()} keypoints differ ({source})"
    for i, k in flipped:
        box = boxes[i]
        w, h = (box[2:] - box[:2]).clamp(min=1).tolist()
        resized = torch.nn.functional.interpolate(
            tv_maps[i, k][None, None], size=(int(np.ceil(h)), int(np.ceil(w))), mode="bicubic", align_corners=False
        )[0, 0]
        col = int(round(float((got[i, k, 0] - box[0]) * np.ceil(w) / w - 0.5)))
        row = int(round(float((got[i, k, 1] - box[1]) * np.ceil(h) / h - 0.5)))
        assert resized.max() - resized[row, col] <= 1e-4 * (1 + resized.max().abs()), (i, k, err[i, k])
    same = err <= 1e-2
    torch.testing.assert_close(got[..., 2][same], expected[..., 2][same], rtol=1e-3, atol=1e-3)
    return len(flipped)


def check_keypoint_parity(height, width, proposals):
    rgb, masks, labels, source = real_image(height, width)
    image = torch.from_numpy(rgb).permute(2, 0, 1).contiguous()
    pixels = image.float()
    tv, ours = build_pair(height, width, pixels, proposals)

    tv_maps = []
    hook = tv.roi_heads.keypoint_predictor.register_forward_hook(lambda m, i, out: tv_maps.append(out))
    with torch.no_grad():
        expected = tv([pixels])[0]
        got = ours([{"image": image, "height": height, "width": width}])[0]["instances"]
        # Our keypoint branch on torchvision's own boxes: the keypoint head and decoding alone.
        features = ours.backbone(ours.preprocess_image([{"image": image}]).tensor)
        given = Instances((height, width), pred_boxes=Boxes(expected["boxes"].clone()))
        given.pred_classes, given.scores = expected["labels"] - 1, expected["scores"]
        on_tv_boxes = detector_postprocess(ours.roi_heads.forward_with_given_boxes(features, [given])[0], height, width)
    hook.remove()
    n = len(expected["boxes"])
    assert n >= 5, f"too few detections to compare ({source})"
    assert len(got) == n and len(on_tv_boxes) == n
    tv_keypoints = torch.cat([expected["keypoints"][..., :2], expected["keypoints_scores"][..., None]], dim=2)

    # Same boxes: same keypoints and scores.
    check_keypoints(on_tv_boxes.pred_keypoints, tv_keypoints, expected["boxes"], tv_maps[0], source)

    # End to end: detections paired as in the Mask R-CNN test, then their keypoints. A box whose
    # float-rounded width or height crosses a whole pixel is decoded on a grid one pixel larger
    # (the decoding resizes to the box's size rounded up); those may be ~1% of boxes at most.
    order = pair_detections(expected, got)
    ours_boxes = got.pred_boxes.tensor[order]
    same_grid = ((ours_boxes[:, 2:] - ours_boxes[:, :2]).clamp(min=1).ceil() ==
                 (expected["boxes"][:, 2:] - expected["boxes"][:, :2]).clamp(min=1).ceil()).all(dim=1)  # fmt: skip
    assert (~same_grid).sum() <= max(1, 0.01 * n), f"{int((~same_grid).sum())} of {n} boxes round to another size"
    keypoints = got.pred_keypoints[order]
    # Keypoints spread over the boxes (random heatmaps), not piled on one spot.
    assert keypoints[..., 0].std() > 5
    check_keypoints(keypoints[same_grid], tv_keypoints[same_grid], expected["boxes"][same_grid], tv_maps[0][same_grid], source)

    # One training step's losses on the same batch, keypoints included.
    gt_boxes = BitMasks(torch.from_numpy(masks)).get_bounding_boxes().tensor
    kp = torch.from_numpy(gt_keypoints(masks))
    target = {"boxes": gt_boxes.clone(), "labels": torch.from_numpy(labels), "keypoints": kp.clone()}
    instances = Instances(
        (height, width), gt_boxes=Boxes(gt_boxes.clone()), gt_classes=torch.from_numpy(labels - 1),
        gt_keypoints=Keypoints(kp.clone()),
    )  # fmt: skip
    tv.train()
    ours.train()
    with torch.no_grad():
        tv_losses = tv([pixels], [target])
        our_losses = ours([{"image": image, "height": height, "width": width, "instances": instances}])
    names = {"loss_objectness": "loss_rpn_cls", "loss_rpn_box_reg": "loss_rpn_loc", "loss_classifier": "loss_cls",
             "loss_box_reg": "loss_box_reg", "loss_keypoint": "loss_keypoint"}  # fmt: skip
    assert set(our_losses) == {names[k] for k in tv_losses}
    for tv_name, value in tv_losses.items():
        assert value > 0
        torch.testing.assert_close(our_losses[names[tv_name]], value, rtol=1e-3, atol=1e-6, msg=lambda m: f"{tv_name}: {m}")


@pytest.mark.slow  # ~20 s of CPU (two R-50 models with 8 x conv 512 heads); the mappings and the
# heatmap decoding against torchvision's are checked fast in test_keypoint_mappings / test_keypoints
def test_keypoint_rcnn_matches_torchvision_small_image():
    check_keypoint_parity(256, 352, proposals=(600, 300))


@pytest.mark.slow
def test_keypoint_rcnn_matches_torchvision_full_size():
    check_keypoint_parity(800, 1067, proposals=(1000, 1000))
