"""Predictor: numpy BGR image in, numpy detections in original pixels out; preprocessing
(channel order, test-time resize), weight loading, input checks."""

import logging

import cv2
import numpy as np
import pytest
import torch

from detcore.engine.predictor import Predictor

from tests.modeling.small_config import small_cfg



pytestmark = pytest.mark.usefixtures("single_thread")


def _cfg(**overrides):
    """The R-18 shapes config, narrowed for speed, testing at short side 64 (long side <= 100)."""
    test_size = {"TEST.DETECTIONS_PER_IMAGE": 10, "INPUT.MIN_SIZE_TEST": 64, "INPUT.MAX_SIZE_TEST": 100}
    return small_cfg(**{**test_size, **overrides})


def _bgr(h, w, seed=0):
    return np.random.default_rng(seed).integers(0, 256, size=(h, w, 3), dtype=np.uint8)


@pytest.fixture(scope="module")
def predictor():
    torch.manual_seed(0)
    return Predictor(_cfg())


def _record_model_input(predictor):
    """Capture the image tensor the model is called with."""
    seen = []
    handle = predictor.model.register_forward_pre_hook(lambda module, args: seen.append(args[0][0]))
    return seen, handle


def test_output_keys_shapes_and_dtypes(predictor):
    image = _bgr(96, 80)
    out = predictor(image)
    assert set(out) == {"boxes", "scores", "labels", "masks", "instances"}
    n = len(out["instances"])
    assert 0 < n <= 10
    assert out["boxes"].shape == (n, 4) and out["boxes"].dtype == np.float32
    assert out["scores"].shape == (n,) and out["scores"].dtype == np.float32
    assert out["labels"].shape == (n,) and out["labels"].dtype == np.int64
    assert out["masks"].shape == (n, 96, 80) and out["masks"].dtype == np.bool_
    assert ((out["labels"] >= 0) & (out["labels"] < 3)).all()
    assert out["instances"].image_size == (96, 80)
    np.testing.assert_array_equal(out["boxes"], out["instances"].pred_boxes.tensor.numpy())


def test_model_input_is_the_resized_image_and_outputs_are_in_original_pixels(predictor):
    image = _bgr(96, 160, seed=1)
    seen, handle = _record_model_input(predictor)
    try:
        out = predictor(image)
    finally:
        handle.remove()
    (inputs,) = seen
    # Long side capped: scale = min(64 / 96, 100 / 160) = 0.625 -> 60 x 100.
    assert tuple(inputs["image"].shape) == (3, 60, 100) and inputs["image"].dtype == torch.uint8
    assert (inputs["height"], inputs["width"]) == (96, 160)
    expected = cv2.resize(image, (100, 60), interpolation=cv2.INTER_LINEAR).transpose(2, 0, 1)
    np.testing.assert_array_equal(inputs["image"].numpy(), expected)

    # The same detections as the model run on that input, i.e. rescaled from 60x100 to 96x160.
    with torch.no_grad():
        raw = predictor.model.inference([{"image": inputs["image"]}], do_postprocess=False)[0]
    boxes = raw.pred_boxes.tensor.numpy() * np.array([1.6, 1.6, 1.6, 1.6], dtype=np.float32)
    boxes[:, 0::2] = boxes[:, 0::2].clip(0, 160)
    boxes[:, 1::2] = boxes[:, 1::2].clip(0, 96)
    keep = (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])
    np.testing.assert_allclose(out["boxes"], boxes[keep], rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(out["scores"], raw.scores.numpy()[keep])
    assert out["masks"].shape[1:] == (96, 160)
    assert (out["boxes"][:, 0::2] <= 160).all() and (out["boxes"][:, 1::2] <= 96).all()


def test_min_size_test_zero_means_no_resize():
    p = Predictor(_cfg(**{"INPUT.MIN_SIZE_TEST": 0}))
    image = _bgr(70, 90, seed=2)
    assert torch.equal(p.preprocess(image), torch.as_tensor(image.transpose(2, 0, 1).copy()))
    assert p(image)["masks"].shape[1:] == (70, 90)


def test_rgb_input_format_flips_the_channels():
    image = _bgr(64, 64, seed=3)
    bgr = Predictor(_cfg())
    rgb = Predictor(
        _cfg(
            **{
                "INPUT.FORMAT": "RGB",
                "MODEL.PIXEL_MEAN": [123.675, 116.28, 103.53],
                "MODEL.PIXEL_STD": [58.395, 57.12, 57.375],
            }
        )
    )
    assert rgb.model.input_format == "RGB"
    np.testing.assert_array_equal(bgr.preprocess(image).numpy(), image.transpose(2, 0, 1))
    np.testing.assert_array_equal(rgb.preprocess(image).numpy(), image[:, :, ::-1].transpose(2, 0, 1))
    # An RGB model whose first conv has its input channels reversed, and mean/std reversed, sees
    # exactly what the BGR model sees: the predictions agree.
    state = bgr.model.state_dict()
    stem = "backbone.bottom_up.stem.conv1.weight"
    state[stem] = state[stem].flip(1)
    rgb.model.load_state_dict(state)
    a, b = bgr(image), rgb(image)
    np.testing.assert_allclose(a["boxes"], b["boxes"], rtol=1e-4, atol=1e-3)
    np.testing.assert_array_equal(a["labels"], b["labels"])


def test_faster_rcnn_output_has_no_masks():
    out = Predictor(_cfg(**{"MODEL.MASK_ON": False}))(_bgr(64, 64))
    assert set(out) == {"boxes", "scores", "labels", "instances"}


def test_keypoint_rcnn_output_has_keypoints_in_original_pixels():
    cfg = _cfg(**{"MODEL.MASK_ON": False, "MODEL.KEYPOINT_ON": True, "MODEL.ROI_KEYPOINT_HEAD.NUM_KEYPOINTS": 5,
                  "MODEL.ROI_KEYPOINT_HEAD.CONV_DIMS": [8]})
    predictor = Predictor(cfg)
    out = predictor(_bgr(128, 96))  # resized to 85 x 64 for the model
    n = len(out["instances"])
    assert set(out) == {"boxes", "scores", "labels", "keypoints", "instances"} and n > 0
    assert out["keypoints"].shape == (n, 5, 3) and out["keypoints"].dtype == np.float32
    boxes, kp = out["boxes"], out["keypoints"]
    # Each keypoint lies in its box (decoded in it), in the 128 x 96 original frame.
    assert (kp[..., 0] >= boxes[:, None, 0] - 1e-3).all() and (kp[..., 0] <= boxes[:, None, 2] + 1e-3).all()
    assert (kp[..., 1] >= boxes[:, None, 1] - 1e-3).all() and (kp[..., 1] <= boxes[:, None, 3] + 1e-3).all()
    cfg.merge_from_list(["MODEL.ROI_HEADS.SCORE_THRESH_TEST", 1.0])
    assert Predictor(cfg)(_bgr(50, 70))["keypoints"].shape == (0, 5, 3)


def test_no_detection_gives_empty_arrays_of_the_right_shape():
    out = Predictor(_cfg(**{"MODEL.ROI_HEADS.SCORE_THRESH_TEST": 1.0}))(_bgr(50, 70))
    assert out["boxes"].shape == (0, 4) and out["scores"].shape == (0,) and out["labels"].shape == (0,)
    assert out["masks"].shape == (0, 50, 70) and out["masks"].dtype == np.bool_


def test_prediction_does_not_touch_numpy_global_rng(predictor):
    np.random.seed(123)
    before = np.random.get_state()[1].copy()
    predictor(_bgr(64, 64))
    np.testing.assert_array_equal(np.random.get_state()[1], before)


@pytest.mark.parametrize(
    "bad, error",
    [
        ([[0, 0, 0]], TypeError),  # not an array
        (torch.zeros(32, 32, 3, dtype=torch.uint8), TypeError),  # a tensor, not numpy
        (np.zeros((32, 32, 3), np.float32), ValueError),  # not uint8
        (np.zeros((32, 32), np.uint8), ValueError),  # grayscale without channel axis
        (np.zeros((32, 32, 4), np.uint8), ValueError),  # BGRA
        (np.zeros((3, 32, 32), np.uint8), ValueError),  # CHW
        (np.zeros((0, 32, 3), np.uint8), ValueError),  # empty
    ],
)
def test_bad_input_is_rejected_naming_the_expectation(predictor, bad, error):
    with pytest.raises(error, match=r"uint8 array \[H, W, 3\] in BGR order"):
        predictor(bad)


def test_unknown_input_format_is_rejected():
    with pytest.raises(ValueError, match="INPUT.FORMAT"):
        Predictor(_cfg(**{"INPUT.FORMAT": "YUV"}))


# --- weights ---------------------------------------------------------------------------------------
def test_loads_weights_from_a_state_dict_and_a_trainer_checkpoint(tmp_path, predictor):
    image = _bgr(64, 80, seed=4)
    expected = predictor(image)
    plain, wrapped = tmp_path / "model.pth", tmp_path / "model_final.pth"
    torch.save(predictor.model.state_dict(), plain)
    torch.save({"model": predictor.model.state_dict(), "iteration": 7}, wrapped)
    for path in (plain, wrapped):
        torch.manual_seed(1)  # a different initialization, overwritten by the file
        loaded = Predictor(_cfg(**{"MODEL.WEIGHTS": str(path)}))
        assert loaded.load_report is not None and loaded.load_report.complete
        out = loaded(image)
        np.testing.assert_allclose(out["boxes"], expected["boxes"], rtol=1e-5, atol=1e-4)
        np.testing.assert_array_equal(out["labels"], expected["labels"])
        np.testing.assert_array_equal(out["masks"], expected["masks"])


def test_missing_weights_file_is_a_clear_error(tmp_path):
    missing = tmp_path / "nope.pth"
    with pytest.raises(FileNotFoundError, match="nope.pth"):
        Predictor(_cfg(**{"MODEL.WEIGHTS": str(missing)}))


def test_a_list_of_images_is_one_batch_with_the_one_by_one_detections(predictor):
    # Sizes that resize to different padded sizes (64x85 and 64x64 → 64x96 and 64x64) and two of
    # the same: the batch must not change what each image gets.
    images = [_bgr(60, 80, seed=1), _bgr(90, 90, seed=2), _bgr(75, 100, seed=3), _bgr(48, 64, seed=4)]
    calls = []
    handle = predictor.model.backbone.register_forward_pre_hook(lambda module, args: calls.append(args[0].shape[0]))
    try:
        batched = predictor(images)
    finally:
        handle.remove()
    assert sorted(calls) == [1, 3]  # one backbone call per padded size, not one per image
    assert len(batched) == len(images)
    for image, got in zip(images, batched):
        alone = predictor(image)
        assert len(alone["boxes"]) > 0 and np.array_equal(got["labels"], alone["labels"])
        np.testing.assert_allclose(got["boxes"], alone["boxes"], rtol=1e-4, atol=1e-3)
        np.testing.assert_allclose(got["scores"], alone["scores"], rtol=1e-4, atol=1e-6)
        assert (got["masks"] == alone["masks"]).mean() >= 0.999
    assert predictor([]) == []


def test_test_time_augmentation_runs_the_tta_wrapper_on_the_unresized_image(predictor):
    """TEST.AUG.ENABLED: the same weights answer through GeneralizedRCNNWithTTA, fed the image as
    given; with one scale at MIN_SIZE_TEST and no flip that is the plain prediction."""
    from detcore.modeling import GeneralizedRCNNWithTTA

    cfg = _cfg(**{"TEST.AUG.ENABLED": True, "TEST.AUG.MIN_SIZES": (64,), "TEST.AUG.MAX_SIZE": 100, "TEST.AUG.FLIP": False})
    tta = Predictor(cfg)
    tta.model.load_state_dict(predictor.model.state_dict())
    assert isinstance(tta.runner, GeneralizedRCNNWithTTA) and tta.runner.model is tta.model
    image = _bgr(80, 120, seed=3)
    assert tuple(tta.preprocess(image).shape) == (3, 80, 120)
    plain, augmented = predictor(image), tta(image)
    assert len(plain["boxes"]) > 0
    np.testing.assert_allclose(augmented["boxes"], plain["boxes"], rtol=0, atol=1e-3)
    np.testing.assert_array_equal(augmented["scores"], plain["scores"])
    assert (augmented["masks"] ^ plain["masks"]).sum() <= 2


@pytest.mark.parametrize("native", [True, False], ids=["native_bfloat16_cpu", "emulating_cpu"])
def test_bfloat16_precision_runs_the_network_in_bfloat16_and_answers_in_float32(predictor, monkeypatch, caplog, native):
    """TEST.PRECISION bfloat16 on a CPU with native bfloat16 and on one that emulates it (the
    detection monkeypatched): the same computation on both, a one-line warning on the second."""
    from detcore.utils import precision

    monkeypatch.setattr(precision, "_cpu_capabilities", lambda: {"avx512_bf16": native, "amx_bf16": False})
    precision._warn_emulated.cache_clear()
    bf16 = Predictor(_cfg(**{"TEST.PRECISION": "bfloat16"}))
    bf16.model.load_state_dict(predictor.model.state_dict())
    features = []
    handle = bf16.model.backbone.register_forward_hook(lambda m, args, out: features.append({v.dtype for v in out.values()}))
    image = _bgr(96, 80)
    try:
        with caplog.at_level(logging.WARNING, logger="detcore"):
            out = bf16(image)
    finally:
        handle.remove()
        precision._warn_emulated.cache_clear()
    assert features == [{torch.bfloat16}]
    warnings = [r.getMessage() for r in caplog.records if "bfloat16" in r.getMessage()]
    assert len(warnings) == (0 if native else 1)
    reference = predictor(image)
    n = len(reference["boxes"])
    assert len(out["boxes"]) == n > 0
    assert out["boxes"].dtype == out["scores"].dtype == np.float32 and out["masks"].shape == (n, 96, 80)
    assert out["instances"].pred_boxes.tensor.dtype == torch.float32
    # Random weights score every box alike, so bfloat16 may reorder them; the scores stay close.
    np.testing.assert_allclose(np.sort(out["scores"]), np.sort(reference["scores"]), atol=0.02)


def test_unknown_precision_is_refused_naming_the_key():
    cfg = _cfg()
    cfg.TEST.PRECISION = "float16"  # bypasses the merge check
    with pytest.raises(ValueError, match="TEST.PRECISION must be one of"):
        Predictor(cfg)


@pytest.mark.parametrize(
    "config, overrides",
    [
        ("rpn_R_18_FPN_shapes.yaml", {}),  # ProposalNetwork
        ("mask_rcnn_R_18_C4_shapes.yaml", {}),  # Res5ROIHeads
        ("keypoint_rcnn_R_18_FPN_figures.yaml", {}),  # keypoint head
        # RetinaNet: its prior (0.01) keeps random weights under the 0.05 threshold
        ("retinanet_R_18_FPN_shapes.yaml", {"MODEL.RETINANET.SCORE_THRESH_TEST": 0.0}),
        ("e2e_mask_rcnn_R_18_FPN_shapes.yaml", {"TEST.AUG.ENABLED": True, "TEST.AUG.MIN_SIZES": (48, 64),
                                                "TEST.AUG.MAX_SIZE": 100, "TEST.AUG.MERGE": "box_voting"}),
    ],
    ids=["proposal_network", "c4", "keypoints", "retinanet", "tta_box_voting"],
)
def test_bfloat16_precision_with_every_meta_architecture_and_tta(config, overrides):
    """TEST.PRECISION bfloat16 reaches the network through whatever runs it (a ProposalNetwork, C4
    heads, a keypoint head, RetinaNet, the TTA wrapper): bfloat16 features, float32 answers close
    to float32 inference."""
    torch.manual_seed(0)
    fp32 = Predictor(small_cfg(config, **{"INPUT.MIN_SIZE_TEST": 64, "INPUT.MAX_SIZE_TEST": 100, **overrides}))
    bf16 = Predictor(small_cfg(config, **{"INPUT.MIN_SIZE_TEST": 64, "INPUT.MAX_SIZE_TEST": 100,
                                          "TEST.PRECISION": "bfloat16", **overrides}))
    bf16.model.load_state_dict(fp32.model.state_dict())
    dtypes = []
    handle = bf16.model.backbone.register_forward_hook(lambda m, args, out: dtypes.append({v.dtype for v in out.values()}))
    image = _bgr(80, 96, seed=4)
    try:
        got = bf16(image)
    finally:
        handle.remove()
    expected = fp32(image)
    assert dtypes and all(d == {torch.bfloat16} for d in dtypes)
    assert got["boxes"].dtype == np.float32 and got["boxes"].shape == expected["boxes"].shape
    assert len(expected["boxes"]) > 0
    # Random weights: near-equal scores may swap places in bfloat16; compare sorted values.
    key = "objectness_logits" if "objectness_logits" in expected else "scores"
    assert got[key].dtype == np.float32
    np.testing.assert_allclose(np.sort(got[key]), np.sort(expected[key]), atol=0.05 if key == "scores" else 0.5)
    if "keypoints" in expected:  # decoded in float32, in the original image's pixels
        assert got["keypoints"].dtype == np.float32 and got["keypoints"].shape == expected["keypoints"].shape
