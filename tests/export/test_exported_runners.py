"""Exports loaded from their folder by ``load_exported`` and run by their own runtime: the OpenVINO
IR (OpenVINO's CPU plugin, float32) gives eager's detections on the VOC photo at sizes not seen
at export, refuses what the graph cannot serve, and is refused with what to install when openvino
is missing; an export of each format evaluated by ``tools/test_net.py --exported`` (through
``ExportedDetector`` and the same evaluator) records the eager model's predictions and AP.

Tolerances, as for ONNX (test_model_export.py): same count and classes, boxes within 1e-3
relative (at least 1e-3 px), scores rtol 1e-4 / atol 1e-6, pasted masks >= 99.5% equal; the
evaluator's recorded predictions likewise, and AP within 0.1 point. The model has seeded random
weights (its AP on the tiny shapes split is near 0, so the recorded predictions, which make the
AP, are what is compared)."""
import json
import os
import sys
import warnings

import numpy as np
import pytest
import torch

import detcore.export
from detcore.export import ExportableDetector, load_exported
from tests.export.test_model_export import CONFIG, ROOT, _assert_same_detections, _cfg, _chw, _model, _photo

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning", "ignore::DeprecationWarning")
TINY = ["DATASETS.TEST", "('tiny_shapes_val',)", "DATALOADER.NUM_WORKERS", 0, "INPUT.MIN_SIZE_TEST", 96,
        "INPUT.MAX_SIZE_TEST", 160, "TEST.DETECTIONS_PER_IMAGE", 20]


def _export(fmt, folder):
    cfg = _cfg()
    cfg.merge_from_list(TINY)
    model = _model(cfg)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        detcore.export.export_model(cfg, model, fmt, str(folder), sample_image=_chw(_photo(160)))
    return cfg, model


@pytest.fixture(scope="module")
def openvino_export(tmp_path_factory):
    pytest.importorskip("openvino")
    pytest.importorskip("onnxscript")
    folder = tmp_path_factory.mktemp("openvino")
    cfg, model = _export("openvino", folder)
    return cfg, model, str(folder)


def test_openvino_export_equals_eager(openvino_export):
    cfg, model, folder = openvino_export
    assert sorted(os.listdir(folder)) == ["export.json", "model.bin", "model.xml"]
    meta = json.load(open(os.path.join(folder, "export.json")))
    assert meta["format"] == "openvino" and meta["file"] == "model.xml" and "INFERENCE_PRECISION_HINT" in meta["load"]
    assert meta["versions"]["openvino"] and meta["onnx_opset"] == detcore.export.OPSET
    runner = load_exported(folder, num_threads=2)
    detector = ExportableDetector(model)
    for short_side in (128, 224):  # the export traced at 160
        image = _chw(_photo(short_side))
        with torch.no_grad():
            _assert_same_detections(runner(image), detector(image), True)
    with pytest.raises(Exception, match=r"input check: the exported detector takes image as a uint8 tensor of shape \[3, >=65, >=65\]"):
        runner(torch.zeros(3, 64, 200, dtype=torch.uint8))
    with pytest.raises(ValueError, match=r"takes a uint8 image of shape \[3, H, W\], got float32"):
        runner(np.zeros((3, 100, 120), np.float32))


def test_openvino_is_refused_without_the_package(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "openvino", None)  # import openvino fails
    with pytest.raises(ImportError, match=r"export_model: the OpenVINO format needs the openvino package.*"
                                          r"pip install 'detcore\[openvino\]'"):
        detcore.export.check_export_request(_cfg(), "openvino", str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def _evaluate_exported(folder, output_dir):
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    try:
        import test_net
    finally:
        sys.path.pop(0)
    args = test_net.parse_args(["--exported", folder, "--threads", "2", "DATASETS.TEST", "('tiny_shapes_val',)",
                                "OUTPUT_DIR", str(output_dir)])
    return test_net.main(args)


def _evaluate_eager(cfg, model, output_dir):
    from detcore.engine import DefaultTrainer

    cfg = cfg.clone()
    cfg.merge_from_list(["OUTPUT_DIR", str(output_dir)])
    return DefaultTrainer.test(cfg, model)


def _recorded(output_dir):
    with open(os.path.join(output_dir, "inference", "tiny_shapes_val", "coco_instances_results.json")) as f:
        return json.load(f)


def _assert_same_evaluation(got, expected, got_dir, expected_dir):
    from pycocotools import mask as mask_util

    mine, theirs = _recorded(got_dir), _recorded(expected_dir)
    assert len(mine) == len(theirs) > 0
    for a, b in zip(mine, theirs):
        assert (a["image_id"], a["category_id"]) == (b["image_id"], b["category_id"])
        box, e_box = np.array(a["bbox"]), np.array(b["bbox"])
        assert np.all(np.abs(box - e_box) <= 1e-3 * np.maximum(np.abs(e_box), 1.0))
        np.testing.assert_allclose(a["score"], b["score"], rtol=1e-4, atol=1e-6)
        assert (mask_util.decode(a["segmentation"]) == mask_util.decode(b["segmentation"])).mean() >= 0.995
    for task in ("bbox", "segm"):
        for metric, value in expected[task].items():
            assert value == pytest.approx(got[task][metric], abs=0.1, nan_ok=True), (task, metric)


def test_test_net_evaluates_the_openvino_export_like_the_model(openvino_export, tiny_cache, tmp_path):
    cfg, model, folder = openvino_export
    eager = _evaluate_eager(cfg, model, tmp_path / "eager")
    exported = _evaluate_exported(folder, tmp_path / "exported")
    _assert_same_evaluation(exported, eager, tmp_path / "exported", tmp_path / "eager")


@pytest.mark.slow  # one export per format (~a minute each on 2 cores)
@pytest.mark.parametrize("fmt", ["torchscript", "exported_program", "onnx"])
def test_test_net_evaluates_every_format_like_the_model(fmt, tiny_cache, tmp_path):
    if fmt == "onnx":
        pytest.importorskip("onnxruntime")
        pytest.importorskip("onnxscript")
    cfg, model = _export(fmt, tmp_path / "export")
    eager = _evaluate_eager(cfg, model, tmp_path / "eager")
    exported = _evaluate_exported(str(tmp_path / "export"), tmp_path / "exported")
    _assert_same_evaluation(exported, eager, tmp_path / "exported", tmp_path / "eager")


def test_an_export_folder_without_export_json_is_named():
    with pytest.raises(FileNotFoundError, match=r"holds no export.json; give the folder tools/export_model.py wrote"):
        load_exported(os.path.dirname(CONFIG))
