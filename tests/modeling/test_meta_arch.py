"""GeneralizedRCNN end to end: preprocessing, training losses, eval outputs in the original image
size (boxes rescaled, masks pasted), input checks, and the Faster R-CNN (no mask) variant."""
import copy

import pytest
import torch
import torch.nn.functional as F

from detcore.modeling import GeneralizedRCNN, build_model
from detcore.structures import Boxes, Instances, PolygonMasks

from .small_config import small_cfg as _cfg

LOSS_NAMES = {"loss_rpn_cls", "loss_rpn_loc", "loss_cls", "loss_box_reg", "loss_mask"}


pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def mask_model():
    torch.manual_seed(0)
    return build_model(_cfg()).eval()


def _image(h, w, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (3, h, w), dtype=torch.uint8, generator=g)


def _gt(h, w):
    boxes = [[6.0, 8.0, 30.0, 36.0], [34.0, 12.0, 60.0, 40.0]]
    polygons = [[[x1, y1, x2, y1, x2, y2, x1, y2]] for x1, y1, x2, y2 in boxes]
    return Instances(
        (h, w),
        gt_boxes=Boxes(torch.tensor(boxes)),
        gt_classes=torch.tensor([0, 2]),
        gt_masks=PolygonMasks(polygons),
    )


# --- preprocessing ----------------------------------------------------------------------------------
def test_preprocess_normalizes_and_pads_to_32(mask_model):
    a, b = _image(50, 70, seed=1), _image(65, 40, seed=2)
    images = mask_model.preprocess_image([{"image": a}, {"image": b}])
    assert images.tensor.shape == (2, 3, 96, 96)  # max(50, 65) -> 96, max(70, 40) -> 96
    assert images.image_sizes == [(50, 70), (65, 40)]
    mean = torch.tensor([103.530, 116.280, 123.675]).view(3, 1, 1)
    std = torch.tensor([57.375, 57.120, 58.395]).view(3, 1, 1)
    torch.testing.assert_close(images.tensor[0, :, :50, :70], (a.float() - mean) / std)
    torch.testing.assert_close(images.tensor[1, :, :65, :40], (b.float() - mean) / std)
    # Padding is zero after normalization: the mean colour, i.e. "no signal".
    assert images.tensor[0, :, 50:].abs().max() == 0 and images.tensor[0, :, :, 70:].abs().max() == 0
    assert images.tensor[1, :, 65:].abs().max() == 0 and images.tensor[1, :, :, 40:].abs().max() == 0


def test_preprocess_accepts_float_images_like_uint8(mask_model):
    a = _image(40, 40)
    u = mask_model.preprocess_image([{"image": a}])
    f = mask_model.preprocess_image([{"image": a.float()}])
    torch.testing.assert_close(u.tensor, f.tensor)


def test_size_divisibility_follows_config():
    cfg = _cfg(**{"INPUT.SIZE_DIVISIBILITY": 64})
    model = build_model(cfg)
    assert model.size_divisibility == 64
    assert model.preprocess_image([{"image": _image(70, 33)}]).tensor.shape[-2:] == (128, 64)
    # 0 = "no extra constraint": the FPN's own stride-32 requirement still holds.
    model = build_model(_cfg(**{"INPUT.SIZE_DIVISIBILITY": 0}))
    assert model.preprocess_image([{"image": _image(70, 33)}]).tensor.shape[-2:] == (96, 64)


def test_pixel_mean_std_are_buffers_outside_the_state_dict(mask_model):
    names = {n for n, _ in mask_model.named_buffers()}
    assert {"pixel_mean", "pixel_std"} <= names
    assert "pixel_mean" not in mask_model.state_dict()
    assert mask_model.device == torch.device("cpu")


# --- bad input ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "bad",
    [
        _image(32, 32).numpy(),  # not a tensor
        torch.zeros(32, 32, dtype=torch.uint8),  # no channel axis
        torch.zeros(1, 32, 32, dtype=torch.uint8),  # wrong channel count
        torch.zeros(32, 32, 3, dtype=torch.uint8),  # HWC instead of CHW
        None,
    ],
)
def test_bad_image_is_rejected_with_the_expected_shape(mask_model, bad):
    with pytest.raises(ValueError, match=r"\['image'\] must be a Tensor\[3, H, W\]"):
        mask_model([{"image": bad, "height": 32, "width": 32}])


def test_training_requires_instances():
    model = build_model(_cfg()).train()
    with pytest.raises(ValueError, match="instances"):
        model([{"image": _image(64, 64)}])


def test_mismatched_pixel_mean_and_std_are_rejected(mask_model):
    with pytest.raises(ValueError, match="pixel_mean and pixel_std"):
        GeneralizedRCNN(
            backbone=mask_model.backbone,
            proposal_generator=mask_model.proposal_generator,
            roi_heads=mask_model.roi_heads,
            pixel_mean=[0.0, 0.0, 0.0],
            pixel_std=[1.0, 1.0],
        )


# --- training -----------------------------------------------------------------------------------------
def test_training_returns_finite_scalar_losses_that_backpropagate():
    torch.manual_seed(0)
    model = build_model(_cfg()).train()
    inputs = [
        {"image": _image(64, 80, seed=3), "instances": _gt(64, 80)},
        {"image": _image(72, 64, seed=4), "instances": _gt(72, 64)},
    ]
    losses = model(inputs)
    assert set(losses) == LOSS_NAMES
    for name, value in losses.items():
        assert value.dim() == 0 and torch.isfinite(value), name
    sum(losses.values()).backward()
    # Every part of the model gets a gradient (FREEZE_AT 0 in this config: the stem trains too).
    for part in ("backbone", "proposal_generator", "roi_heads"):
        grads = [p.grad for p in getattr(model, part).parameters() if p.requires_grad]
        assert grads and all(g is not None for g in grads), part
        assert any(g.abs().sum() > 0 for g in grads), part


# --- inference --------------------------------------------------------------------------------------
def _paste_reference(masks, boxes, height, width, threshold=0.5):
    """Plain-PyTorch "aligned" paste: pixel centres inside the box sample the M x M mask bilinearly
    at (c + 0.5 - x1) * M / (x2 - x1) (cell centres at j + 0.5, edge cells extended)."""
    out = torch.zeros(len(masks), height, width, dtype=torch.bool)
    cx = torch.arange(width, dtype=torch.float64) + 0.5
    cy = torch.arange(height, dtype=torch.float64) + 0.5
    for i, (m, (x1, y1, x2, y2)) in enumerate(zip(masks, boxes.double())):
        size = m.shape[-1]
        u = (cx - x1) / (x2 - x1) * size  # mask coordinate in cells
        v = (cy - y1) / (y2 - y1) * size
        # grid_sample with align_corners=False: normalized g <-> cell coordinate (g + 1) * M / 2.
        grid = torch.stack(torch.meshgrid(v / size * 2 - 1, u / size * 2 - 1, indexing="ij")[::-1], dim=-1)
        sampled = F.grid_sample(
            m.double().view(1, 1, size, size), grid[None], mode="bilinear", padding_mode="border", align_corners=False
        )[0, 0]
        inside = ((cy >= y1) & (cy < y2))[:, None] & ((cx >= x1) & (cx < x2))[None, :]
        out[i] = (sampled >= threshold) & inside
    return out


def test_inference_rescales_boxes_and_pastes_masks_in_the_original_size(mask_model):
    # Random init gives mask probabilities within 0.005 of 0.5; spread them so that the pasted
    # masks have structure worth comparing.
    mask_model = copy.deepcopy(mask_model)
    with torch.no_grad():
        mask_model.roi_heads.mask_head.predictor.weight.mul_(300)
    image = _image(64, 96, seed=5)
    inputs = [{"image": image, "height": 128, "width": 200}]  # as if the loader halved a 128x200 image
    raw = mask_model.inference(inputs, do_postprocess=False)[0]
    out = mask_model(inputs)
    assert isinstance(out, list) and len(out) == 1 and set(out[0]) == {"instances"}
    inst = out[0]["instances"]
    assert inst.image_size == (128, 200)
    assert set(inst.fields()) == {"pred_boxes", "scores", "pred_classes", "pred_masks"}
    assert 0 < len(inst) <= 20
    assert inst.scores.dtype == torch.float32 and inst.pred_classes.dtype == torch.int64
    assert inst.pred_masks.dtype == torch.bool and inst.pred_masks.shape == (len(inst), 128, 200)

    # Boxes: the raw detections (in the 64x96 input) scaled by (200/96, 128/64), clipped.
    assert raw.image_size == (64, 96) and raw.pred_masks.shape[1:] == (1, 28, 28)
    scale = torch.tensor([200 / 96, 128 / 64, 200 / 96, 128 / 64])
    expected = raw.pred_boxes.tensor * scale
    expected[:, 0::2] = expected[:, 0::2].clamp(0, 200)
    expected[:, 1::2] = expected[:, 1::2].clamp(0, 128)
    keep = (expected[:, 2] > expected[:, 0]) & (expected[:, 3] > expected[:, 1])
    torch.testing.assert_close(inst.pred_boxes.tensor, expected[keep])
    torch.testing.assert_close(inst.scores, raw.scores[keep])
    assert torch.equal(inst.pred_classes, raw.pred_classes[keep])

    # Masks: the 28x28 probabilities pasted into the rescaled boxes of the full-size image.
    ref = _paste_reference(raw.pred_masks[keep, 0], expected[keep], 128, 200)
    differ = (ref != inst.pred_masks).sum().item()
    # Only pixels whose probability sits on the threshold (float32 vs float64) may differ.
    assert differ <= max(5, 1e-4 * ref.numel()), differ
    assert inst.pred_masks.any()
    probabilities = raw.pred_masks[keep]
    assert (probabilities < 0.4).any() and (probabilities > 0.6).any()


def test_inference_without_height_width_keeps_the_input_size(mask_model):
    out = mask_model([{"image": _image(64, 96)}])[0]["instances"]
    assert out.image_size == (64, 96) and out.pred_masks.shape[1:] == (64, 96)


def test_batched_inference_gives_each_image_its_own_size(mask_model):
    inputs = [
        {"image": _image(64, 96, seed=6), "height": 64, "width": 96},
        {"image": _image(80, 48, seed=7), "height": 160, "width": 96},
    ]
    batched = mask_model(inputs)
    assert [o["instances"].image_size for o in batched] == [(64, 96), (160, 96)]
    for o in batched:
        h, w = o["instances"].image_size
        boxes = o["instances"].pred_boxes.tensor
        assert o["instances"].pred_masks.shape[1:] == (h, w)
        assert (boxes[:, 0::2] <= w).all() and (boxes[:, 1::2] <= h).all() and (boxes >= 0).all()


def test_inference_with_no_detection_has_empty_fields_of_the_right_shape():
    model = build_model(_cfg(**{"MODEL.ROI_HEADS.SCORE_THRESH_TEST": 1.0})).eval()
    inst = model([{"image": _image(64, 64), "height": 100, "width": 90}])[0]["instances"]
    assert len(inst) == 0 and inst.image_size == (100, 90)
    assert inst.pred_boxes.tensor.shape == (0, 4)
    assert inst.pred_masks.shape == (0, 100, 90) and inst.pred_masks.dtype == torch.bool


def test_inference_does_not_build_a_graph(mask_model):
    with torch.enable_grad():
        inst = mask_model([{"image": _image(64, 64)}])[0]["instances"]
    assert not inst.scores.requires_grad and not inst.pred_boxes.tensor.requires_grad


# --- Faster R-CNN -----------------------------------------------------------------------------------
def test_faster_rcnn_config_has_no_mask_branch():
    torch.manual_seed(0)
    cfg = _cfg("e2e_faster_rcnn_R_50_FPN_1x.yaml", **{"MODEL.ROI_BOX_HEAD.FC_DIM": 32})
    model = build_model(cfg)
    assert not model.roi_heads.mask_on
    assert not any("mask" in name for name, _ in model.named_parameters())

    model.train()
    gt = _gt(64, 64)
    gt.remove("gt_masks")  # the data loader gives no masks when MASK_ON is False
    losses = model([{"image": _image(64, 64), "instances": gt}])
    assert set(losses) == LOSS_NAMES - {"loss_mask"}
    assert all(torch.isfinite(v) for v in losses.values())

    model.eval()
    inst = model([{"image": _image(64, 64), "height": 96, "width": 96}])[0]["instances"]
    assert set(inst.fields()) == {"pred_boxes", "scores", "pred_classes"}
    assert inst.image_size == (96, 96) and len(inst) > 0
    boxes = inst.pred_boxes.tensor
    assert (boxes >= 0).all() and (boxes <= 96).all()


def test_channels_last_model_gives_the_same_results(mask_model):
    # The R-50 body with FrozenBN: the folded-norm convs and the bottleneck in-place adds run in NHWC.
    cfg = _cfg("e2e_mask_rcnn_R_50_FPN_1x.yaml", **{"MODEL.RESNETS.NORM": "FrozenBN", "MODEL.CHANNELS_LAST": False})
    torch.manual_seed(0)
    nchw = build_model(cfg).eval()
    assert nchw.backbone.bottom_up.res2[0].conv1.weight.is_contiguous()
    cfg.merge_from_list(["MODEL.CHANNELS_LAST", True])
    nhwc = build_model(cfg).eval()
    nhwc.load_state_dict(nchw.state_dict())
    assert nhwc.backbone.bottom_up.res2[0].conv1.weight.is_contiguous(memory_format=torch.channels_last)
    inputs = [{"image": _image(64, 96, seed=3)}]
    images = nhwc.preprocess_image(inputs)
    assert images.tensor.is_contiguous(memory_format=torch.channels_last)
    features = nhwc.backbone(images.tensor)
    assert all(f.is_contiguous(memory_format=torch.channels_last) for f in features.values())
    torch.testing.assert_close(features, nchw.backbone(nchw.preprocess_image(inputs).tensor), rtol=1e-4, atol=1e-4)
    got, expected = nhwc(inputs)[0]["instances"], nchw(inputs)[0]["instances"]
    assert len(got) == len(expected) > 0
    torch.testing.assert_close(got.scores, expected.scores, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(got.pred_boxes.tensor, expected.pred_boxes.tensor, rtol=1e-4, atol=1e-3)

    # Training: the same losses, and gradients in the weights' own layout.
    nhwc.train()
    nchw.train()
    batch = [{"image": _image(64, 96, seed=4), "instances": _gt(64, 96)}]
    torch.manual_seed(1)
    losses = nhwc(batch)
    torch.manual_seed(1)
    reference = nchw(batch)
    for name, value in reference.items():
        torch.testing.assert_close(losses[name], value, rtol=1e-4, atol=1e-5, msg=lambda m: f"{name}: {m}")
    sum(losses.values()).backward()
    conv = nhwc.backbone.bottom_up.res3[0].conv2
    assert conv.weight.grad is not None and torch.isfinite(conv.weight.grad).all()
