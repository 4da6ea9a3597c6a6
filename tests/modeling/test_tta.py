"""Test-time augmentation: mapping back is exact, one plain scale is plain inference, a symmetric
image's flip merges as a hand-written reference says, box voting as computed by hand."""
import cv2
import numpy as np
import pytest
import torch
from torch import nn

from detcore.config.choices import TTA_MERGE_MODES
from detcore.data.transforms import HFlipTransform, ResizeShortestEdge, ResizeTransform
from detcore.layers import roi_align
from detcore.modeling import GeneralizedRCNNWithTTA, build_model
from detcore.modeling.tta import box_voting, merge_detections
from detcore.structures import Boxes, ImageList, Instances, pairwise_iou, paste_masks_in_image
from detcore.utils.registry import build_from_config

from .small_config import small_cfg


# --- a detector whose answer is known: the box (and mask) of the bright pixels --------------------
class BrightBoxDetector(nn.Module):
    """Finds the pixels above 128 in its input and reports their box with score 0.9 (class 1);
    its mask head returns the image itself sampled over the box (so an asymmetric object has an
    asymmetric mask). Implements what GeneralizedRCNNWithTTA needs of a detector."""

    mask_threshold, paste_mode = 0.5, "aligned"

    def __init__(self, mask_size=28):
        super().__init__()
        self.roi_heads = _BrightBoxHeads(mask_size)
        self.backbone = lambda tensor: {"image": tensor}
        self.proposal_generator = lambda images, features, targets: (None, {})
        self.seen_sizes = []

    def preprocess_image(self, batched_inputs):
        images = [x["image"].float() for x in batched_inputs]
        self.seen_sizes.extend(tuple(im.shape[-2:]) for im in images)
        return ImageList.from_tensors(images)


class _BrightBoxHeads(nn.Module):
    num_classes = 3

    def __init__(self, mask_size):
        super().__init__()
        self.mask_on, self.mask_size = True, mask_size

    def forward(self, images, features, proposals, targets):
        out = []
        for i, (h, w) in enumerate(images.image_sizes):
            ys, xs = torch.nonzero(features["image"][i, 0, :h, :w] > 128, as_tuple=True)
            inst = Instances((h, w))
            inst.pred_boxes = Boxes(torch.tensor([[xs.min(), ys.min(), xs.max() + 1, ys.max() + 1]], dtype=torch.float32))
            inst.scores = torch.tensor([0.9])
            inst.pred_classes = torch.tensor([1])
            out.append(inst)
        return (self.forward_with_given_boxes(features, out) if self.mask_on else out), {}

    def forward_with_given_boxes(self, features, instances):
        image = features["image"][:, :1] / 255.0
        for i, inst in enumerate(instances):
            rois = torch.cat([torch.full((len(inst), 1), float(i)), inst.pred_boxes.tensor], dim=1)
            inst.pred_masks = roi_align(image, rois, (self.mask_size, self.mask_size), 1.0, 2, True)
        return instances


def l_shape_image(h=40, w=60):
    """An L (vertical bar x 8..14, y 12..32 plus foot x 14..28, y 26..32) on a dark image."""
    image = np.full((h, w, 3), 20, np.uint8)
    image[12:32, 8:14] = 250
    image[26:32, 14:28] = 250
    return image


def as_input(image, **extra):
    return {"image": torch.from_numpy(np.ascontiguousarray(image.transpose(2, 0, 1))), **extra}


@pytest.mark.parametrize("flip", [False, True])
@pytest.mark.parametrize("min_sizes", [(40,), (20, 40, 80), (80, 160)])
def test_detections_and_masks_come_back_exactly_to_the_original_image(flip, min_sizes):
    """At whole-pixel scales (x0.5, x1, x2, x4) the object's box is found exactly in every
    augmentation, so the merged box must be the object's box in the original image; the mask
    must be the L, not the L and its mirror (un-flipping the probabilities matters)."""
    image = l_shape_image()
    model = BrightBoxDetector()
    tta = GeneralizedRCNNWithTTA(model, min_sizes=min_sizes, max_size=1000, flip=flip).eval()
    (out,) = tta([as_input(image, height=40, width=60)])
    inst = out["instances"]
    assert inst.image_size == (40, 60)
    assert inst.pred_boxes.tensor.tolist() == [[8.0, 12.0, 28.0, 32.0]]
    assert inst.scores.tolist() == [pytest.approx(0.9)] and inst.pred_classes.tolist() == [1]
    truth = torch.from_numpy(image[:, :, 0] > 128)
    assert (inst.pred_masks[0] ^ truth).sum() <= 0.05 * truth.sum()  # the outline only
    sizes = {(round(40 * s / 40), round(60 * s / 40)) for s in min_sizes}
    assert set(model.seen_sizes) == sizes and len(model.seen_sizes) == len(min_sizes) * (2 if flip else 1)


def test_a_detector_without_masks_gets_boxes_only():
    model = BrightBoxDetector()
    model.roi_heads.mask_on = False
    tta = GeneralizedRCNNWithTTA(model, min_sizes=(20, 40), max_size=1000, flip=True).eval()
    inst = tta([as_input(l_shape_image(), height=40, width=60)])[0]["instances"]
    assert inst.pred_boxes.tensor.tolist() == [[8.0, 12.0, 28.0, 32.0]] and not inst.has("pred_masks")
    assert model.roi_heads.mask_on is False


def test_a_keypoint_detector_is_refused_naming_the_options():
    model = BrightBoxDetector()
    model.roi_heads.keypoint_on = True
    with pytest.raises(ValueError, match="TEST.AUG.ENABLED False or MODEL.KEYPOINT_ON False"):
        GeneralizedRCNNWithTTA(model, min_sizes=(20,), max_size=1000)


def test_a_resized_input_still_comes_back_in_height_x_width():
    """The loader may have resized the image already (x2 here): detections go to height x width."""
    image = l_shape_image()
    big = np.repeat(np.repeat(image, 2, axis=0), 2, axis=1)
    tta = GeneralizedRCNNWithTTA(BrightBoxDetector(), min_sizes=(40, 80), max_size=1000, flip=True).eval()
    inst = tta([as_input(big, height=40, width=60)])[0]["instances"]
    assert inst.image_size == (40, 60) and inst.pred_boxes.tensor.tolist() == [[8.0, 12.0, 28.0, 32.0]]


def test_augment_transforms_map_boxes_there_and_back():
    tta = GeneralizedRCNNWithTTA(BrightBoxDetector(), min_sizes=(50, 75), max_size=120, flip=True)
    augmented = tta.augment(np.zeros((100, 200, 3), np.uint8), (100, 200))
    assert [a[0].shape[:2] for a in augmented] == [(50, 100), (50, 100), (60, 120), (60, 120)]  # 75 capped by 120
    resize, flipped = augmented[1][1].transforms
    assert isinstance(resize, ResizeTransform) and isinstance(flipped, HFlipTransform) and flipped.width == 100
    box = np.array([[10.0, 20.0, 30.0, 40.0]])
    assert augmented[0][1].apply_box(box).tolist() == [[5.0, 10.0, 15.0, 20.0]]
    assert augmented[1][1].apply_box(box).tolist() == [[85.0, 10.0, 95.0, 20.0]]  # 100 - 15, 100 - 5
    rng = np.random.default_rng(0)
    boxes = np.sort(rng.uniform(0, 100, (50, 2, 2)), axis=1).transpose(0, 2, 1).reshape(-1, 4)[:, [0, 2, 1, 3]]
    for _, t in augmented:
        np.testing.assert_allclose(t.inverse().apply_box(t.apply_box(boxes)), boxes, rtol=0, atol=1e-12)


# --- a real Mask R-CNN (random weights) --------------------------------------------------------
@pytest.fixture(scope="module")
def model(single_thread):
    torch.manual_seed(0)
    m = build_model(small_cfg(**{"MODEL.ROI_HEADS.SCORE_THRESH_TEST": 0.05}))
    return m.eval()


def random_image(h, w, seed=0, symmetric=False):
    rng = np.random.default_rng(seed)
    image = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    image = cv2.GaussianBlur(image, (0, 0), 3)  # smooth: objects the RPN can like
    if symmetric:
        image[:, w - w // 2 :] = image[:, : w // 2][:, ::-1]
    return image


def plain(model, image, size, max_size):
    h, w = image.shape[:2]
    resized = ResizeShortestEdge.test_transform(h, w, size, max_size).apply_image(image)
    with torch.no_grad():
        return model([as_input(resized, height=h, width=w)])[0]["instances"]


def test_one_scale_without_flip_is_plain_inference(model):
    image = random_image(60, 80)  # -> 48 x 64: the same scale on both axes
    reference = plain(model, image, 48, 96)
    tta = GeneralizedRCNNWithTTA(model, min_sizes=(48,), max_size=96, flip=False, detections_per_image=20)
    got = tta([as_input(image, height=60, width=80)])[0]["instances"]
    assert len(reference) > 3  # random weights still detect things above 0.05
    torch.testing.assert_close(got.scores, reference.scores, rtol=0, atol=0)
    assert torch.equal(got.pred_classes, reference.pred_classes)
    torch.testing.assert_close(got.pred_boxes.tensor, reference.pred_boxes.tensor, rtol=0, atol=1e-4)
    # Masks: the mask head ran on the boxes mapped there and back (1e-6 px apart).
    assert (got.pred_masks ^ reference.pred_masks).sum() <= 2


@pytest.mark.parametrize("resize_mode, legacy_plus_one", [("torchvision", False), ("maskrcnn_benchmark", True)])
def test_one_scale_is_plain_inference_with_the_presets_resize_and_boxes(single_thread, resize_mode, legacy_plus_one):
    # A preset's INPUT.RESIZE_MODE (torchvision's float resize, maskrcnn-benchmark's PIL one) and
    # "+1" boxes (inclusive corners scaled back to the image) hold under TTA as in the loader.
    torch.manual_seed(0)
    overrides = {"MODEL.ROI_HEADS.SCORE_THRESH_TEST": 0.05, "INPUT.RESIZE_MODE": resize_mode}
    if legacy_plus_one:
        overrides["MODEL.BOX_LEGACY_PLUS_ONE"] = "True"
    cfg = small_cfg(**overrides)
    preset_model = build_model(cfg).eval()
    image = random_image(60, 80)  # -> 45 x 60
    resize = ResizeShortestEdge.test_transform(60, 80, 45, 96, resize_mode)
    with torch.no_grad():
        reference = preset_model([as_input(resize.apply_image(image), height=60, width=80)])[0]["instances"]
    cfg.merge_from_list(["TEST.AUG.MIN_SIZES", "(45,)", "TEST.AUG.MAX_SIZE", "96", "TEST.AUG.FLIP", "False"])
    tta = build_from_config(GeneralizedRCNNWithTTA, cfg, preset_model)
    assert tta.resize_mode == resize_mode and tta.legacy_plus_one == legacy_plus_one
    got = tta([as_input(image, height=60, width=80)])[0]["instances"]
    assert len(reference) > 3
    torch.testing.assert_close(got.scores, reference.scores, rtol=0, atol=0)
    torch.testing.assert_close(got.pred_boxes.tensor, reference.pred_boxes.tensor, rtol=0, atol=1e-4)
    assert (got.pred_masks ^ reference.pred_masks).sum() <= 2


def greedy_nms(boxes, scores, classes, thresh, topk):
    """Reference merge: by decreasing score (ties: earlier first), drop a box overlapping a kept
    box of its class by more than thresh."""
    order = sorted(range(len(scores)), key=lambda i: (-float(scores[i]), i))
    iou = pairwise_iou(boxes, boxes)
    kept = []
    for i in order:
        if all(classes[j] != classes[i] or iou[i, j] <= thresh for j in kept):
            kept.append(i)
    return kept[:topk]


def test_flip_only_tta_of_a_symmetric_image(model):
    """The flipped image is the image: its detections are the plain ones mirrored. TTA must keep
    exactly what NMS keeps of both sets, with each mask the mean of the plain mask on the box and
    the un-flipped mask on its mirror."""
    image = random_image(48, 64, seed=1, symmetric=True)
    assert np.array_equal(image, image[:, ::-1])
    ref = plain(model, image, 48, 96)  # no resize: the frame is the image's
    boxes = ref.pred_boxes.tensor
    mirrored = torch.stack([64 - boxes[:, 2], boxes[:, 1], 64 - boxes[:, 0], boxes[:, 3]], dim=1)
    pool_boxes = torch.cat([boxes, mirrored])
    pool_scores = torch.cat([ref.scores, ref.scores])
    pool_classes = torch.cat([ref.pred_classes, ref.pred_classes])
    kept = greedy_nms(pool_boxes, pool_scores, pool_classes, 0.5, 20)
    assert len(ref) > 3

    tta = GeneralizedRCNNWithTTA(model, min_sizes=(48,), max_size=96, flip=True, detections_per_image=20)
    got = tta([as_input(image, height=48, width=64)])[0]["instances"]
    assert len(kept) > len(ref) // 2
    torch.testing.assert_close(got.pred_boxes.tensor, pool_boxes[kept], rtol=0, atol=1e-4)
    torch.testing.assert_close(got.scores, pool_scores[kept], rtol=0, atol=0)
    assert torch.equal(got.pred_classes, pool_classes[kept])

    # Masks: mean of the mask head on each kept box and (un-flipped) on its mirror, same features.
    with torch.no_grad():
        inputs = model.preprocess_image([as_input(image)])
        features = model.backbone(inputs.tensor)
        kept_boxes = pool_boxes[kept]
        mirror = torch.stack([64 - kept_boxes[:, 2], kept_boxes[:, 1], 64 - kept_boxes[:, 0], kept_boxes[:, 3]], 1)
        probs = []
        for b in (kept_boxes, mirror):
            inst = Instances((48, 64), pred_boxes=Boxes(b), pred_classes=pool_classes[kept])
            probs.append(model.roi_heads.forward_with_given_boxes(features, [inst])[0].pred_masks)
        mean = (probs[0] + probs[1].flip(-1)) / 2
    expected = paste_masks_in_image(mean[:, 0], kept_boxes, (48, 64), threshold=0.5)
    assert (got.pred_masks ^ expected).sum() <= 2


# --- merging --------------------------------------------------------------------------------------
def test_box_voting_by_hand():
    # Class 0: A (0.9) and B (0.6, IoU 0.818 with A) vote; D (0.5, IoU 0.54) is suppressed by the
    # NMS but does not vote (< 0.8). Class 1: C overlaps A but is another class.
    boxes = torch.tensor([[0, 0, 10, 10], [1, 0, 11, 10], [3, 0, 13, 10], [0, 0, 10, 12]], dtype=torch.float32)
    scores = torch.tensor([0.9, 0.6, 0.5, 0.3])
    classes = torch.tensor([0, 0, 0, 1])
    merged = merge_detections(boxes, scores, classes, (50, 50), 2, 0.5, 10)
    assert merged.pred_boxes.tensor.tolist() == [[0, 0, 10, 10], [0, 0, 10, 12]]
    assert merged.pred_classes.tolist() == [0, 1]
    voted = box_voting(merged.pred_boxes.tensor, merged.pred_classes, boxes, scores, classes, 0.8)
    torch.testing.assert_close(voted, torch.tensor([[0.4, 0.0, 10.4, 10.0], [0.0, 0.0, 10.0, 12.0]]))
    # At IoU 0.5, D votes too: (0.9 A + 0.6 B + 0.5 D) / 2.0.
    voted = box_voting(merged.pred_boxes.tensor, merged.pred_classes, boxes, scores, classes, 0.5)
    torch.testing.assert_close(voted[0], torch.tensor([(0.6 + 1.5) / 2.0, 0.0, (9 + 6.6 + 6.5) / 2.0, 10.0]))
    assert box_voting(boxes[:0], classes[:0], boxes, scores, classes, 0.8).shape == (0, 4)


def test_box_voting_mode_moves_the_kept_box(model):
    image = random_image(48, 64, seed=2)
    args = dict(min_sizes=(40, 48), max_size=96, flip=True, detections_per_image=20)
    nms = GeneralizedRCNNWithTTA(model, merge="nms", **args)([as_input(image, height=48, width=64)])[0]["instances"]
    vote = GeneralizedRCNNWithTTA(model, merge="box_voting", box_voting_iou=0.5, **args)(
        [as_input(image, height=48, width=64)]
    )[0]["instances"]
    assert torch.equal(nms.scores, vote.scores) and torch.equal(nms.pred_classes, vote.pred_classes)
    moved = (nms.pred_boxes.tensor - vote.pred_boxes.tensor).abs().amax(dim=1)
    assert (moved > 1e-3).any() and moved.max() < 40


@pytest.mark.parametrize("min_sizes, max_size", [((1,), 100), ((48,), 1), ((1, 48), 1)])
def test_one_pixel_scales_run_as_plain_inference_does(min_sizes, max_size, single_thread):
    # A flipped 1-pixel-wide scale once failed with numpy's negative-strides error, where plain
    # inference at that size runs. (64 FPN channels: the small model's GN of 32 groups on 32
    # channels cannot normalize the 1 x 1 p5 of a 32 x 32 padded image, in plain inference too.)
    torch.manual_seed(0)
    model = build_model(small_cfg(**{"MODEL.FPN.OUT_CHANNELS": 64})).eval()
    image = random_image(60, 80)
    plain(model, image, min_sizes[0], max_size)  # runs
    tta = GeneralizedRCNNWithTTA(model, min_sizes=min_sizes, max_size=max_size, flip=True)
    (out,) = tta([as_input(image, height=60, width=80)])
    inst = out["instances"]
    assert inst.image_size == (60, 80) and inst.pred_masks.shape[1:] == (60, 80)
    assert torch.isfinite(inst.pred_boxes.tensor).all()


def test_from_config_and_bad_arguments(model):
    cfg = small_cfg(**{"TEST.AUG.MIN_SIZES": "(64, 96)", "TEST.AUG.MERGE": "box_voting", "TEST.AUG.FLIP": "False"})
    tta = build_from_config(GeneralizedRCNNWithTTA, cfg, model)
    assert (tta.min_sizes, tta.flip, tta.merge, tta.detections_per_image) == ((64, 96), False, "box_voting", 20)
    assert not tta.training  # follows the model's mode
    assert set(TTA_MERGE_MODES) == {"nms", "box_voting"}
    with pytest.raises(TypeError, match="has no"):
        GeneralizedRCNNWithTTA(nn.Linear(2, 2), min_sizes=(96,), max_size=100)
    with pytest.raises(ValueError, match="merge must be one of"):
        GeneralizedRCNNWithTTA(model, min_sizes=(96,), max_size=100, merge="wbf")
    with pytest.raises(ValueError, match="min_sizes"):
        GeneralizedRCNNWithTTA(model, min_sizes=(), max_size=100)
    with pytest.raises(ValueError, match="resize_mode must be one of"):
        GeneralizedRCNNWithTTA(model, min_sizes=(96,), max_size=100, resize_mode="pil")
    with pytest.raises(ValueError, match=r"batched_inputs\[0\]\['image'\] must be a Tensor\[C, H, W\]"):
        tta([{"image": np.zeros((4, 4, 3))}])
    tta.train()
    with pytest.raises(RuntimeError, match="eval"):
        tta([as_input(random_image(32, 32))])
    tta.eval()


def test_box_voting_stays_float32_under_bfloat16_autocast():
    """TEST.PRECISION bfloat16 runs TTA under autocast; the voting matmul must not round the
    corners to bfloat16 (a 4 px step at 900 px)."""
    g = torch.Generator().manual_seed(0)
    xy = torch.rand(40, 2, generator=g) * 50 + 900
    boxes = torch.cat([xy, xy + 20 + torch.rand(40, 2, generator=g) * 5], dim=1)
    scores, classes = torch.rand(40, generator=g), torch.zeros(40, dtype=torch.int64)
    expected = box_voting(boxes[:5], classes[:5], boxes, scores, classes, 0.3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = box_voting(boxes[:5], classes[:5], boxes, scores, classes, 0.3)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-3)
