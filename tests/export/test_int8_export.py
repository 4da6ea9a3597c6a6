"""int8 exports (detcore/export/quantize.py): ONNX quantized by onnxruntime, the OpenVINO IR by
NNCF, both calibrated on a registered dataset (the tiny shapes split), run by their runtime on the
VOC photo at sizes not seen at export or calibration.

Tolerance: of the detections eager scores above SCORE, at least MATCHED have an int8 detection
of the same class whose box overlaps at IoU >= MIN_IOU, and every one has one at IoU >=
MIN_IOU_ALL. int8 moves scores a little (about 0.01-0.05 here), so the int8 side is searched among
its detections above SCORE - SCORE_SLACK. Chosen from what was measured: on the seeded random
model these tests use (fast, no training), 13 of 15 / 8 of 8 (ONNX) and 14 of 15 / 8 of 8
(OpenVINO) confident detections match at IoU 0.98-0.999, the others at IoU 0.32-0.33: where two
overlapping boxes score nearly the same, int8 flips which one NMS keeps. On the trained R-18
shapes model (1000 iterations) every detection above 0.05 matched at IoU 0.95-0.999 with the same
class. Calibrating ONNX on black images fails the ONNX test (IoU 0 for most); letting NNCF
quantize every operator type it can fails the OpenVINO test; giving RoiAlign, the RPN's outputs
and the mask logits onnxruntime's int8-rounded tensors fails the ONNX graph check.

The graphs are also checked for what stays in float32: no quantized tensor feeds NMS, ROIAlign or
the box head's last layers, and convolutions are quantized.
"""
import json
import logging
import os
import sys
import warnings

import numpy as np
import pytest
import torch

import detcore.export
from detcore.export import ExportableDetector, load_exported
from detcore.export import quantize as int8_quantization
from detcore.structures import Boxes, pairwise_iou
from detcore.utils import precision
from tests.export.test_model_export import _cfg, _chw, _model, _photo

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning", "ignore::DeprecationWarning")
TINY = ["DATASETS.TEST", "('tiny_shapes_val',)", "DATALOADER.NUM_WORKERS", 0, "INPUT.MIN_SIZE_TEST", 96,
        "INPUT.MAX_SIZE_TEST", 160, "TEST.DETECTIONS_PER_IMAGE", 20]
SCORE, SCORE_SLACK = 0.3, 0.1
MIN_IOU, MATCHED, MIN_IOU_ALL = 0.9, 0.8, 0.25


def _export_int8(fmt, folder):
    cfg = _cfg()
    cfg.merge_from_list(TINY)
    model = _model(cfg)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        detcore.export.export_model(
            cfg, model, fmt, str(folder), sample_image=_chw(_photo(160)), int8=True,
            calibration_dataset="tiny_shapes_val", calibration_images=6,
        )
    return model, str(folder)


@pytest.fixture(scope="module")
def onnx_int8(tiny_cache, tmp_path_factory):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    return _export_int8("onnx", tmp_path_factory.mktemp("onnx_int8"))


@pytest.fixture(scope="module")
def openvino_int8(tiny_cache, tmp_path_factory):
    pytest.importorskip("openvino")
    pytest.importorskip("nncf")
    pytest.importorskip("onnxscript")
    return _export_int8("openvino", tmp_path_factory.mktemp("openvino_int8"))


def assert_int8_detections_match(got, expected):
    """Of the eager detections above SCORE, at least MATCHED have an int8 one of the same class at
    IoU >= MIN_IOU, and every one has one at IoU >= MIN_IOU_ALL (NMS kept a neighbour instead)."""
    boxes, scores, classes = (torch.as_tensor(np.asarray(t)) for t in got[:3])
    e_boxes, e_scores, e_classes = expected[:3]
    confident = e_scores > SCORE
    assert confident.sum() > 0, "the test needs eager detections above SCORE"
    candidates = scores > SCORE - SCORE_SLACK
    iou = pairwise_iou(Boxes(e_boxes[confident]), Boxes(boxes[candidates]))
    same_class = e_classes[confident][:, None] == classes[candidates][None, :]
    best = (iou * same_class).max(dim=1).values if candidates.any() else torch.zeros(int(confident.sum()))
    message = f"best same-class IoU per confident eager detection: {[round(x, 3) for x in best.tolist()]}"
    print(message)
    assert (best >= MIN_IOU).float().mean() >= MATCHED and bool((best >= MIN_IOU_ALL).all()), message


def _check_runs_like_eager(model, folder, fmt):
    meta = json.load(open(os.path.join(folder, "export.json")))
    assert meta["format"] == fmt
    assert meta["int8"]["calibration_dataset"] == "tiny_shapes_val" and meta["int8"]["calibration_images"] == 6
    assert "roi_heads.box_predictor.cls_score" in meta["int8"]["float32"]
    assert meta["versions"]["onnxruntime" if fmt == "onnx" else "nncf"]
    runner = load_exported(folder, num_threads=2)
    detector = ExportableDetector(model)
    for short_side in (128, 224):  # traced at 160, calibrated on 96 px shapes
        image = _chw(_photo(short_side))
        with torch.no_grad():
            assert_int8_detections_match(runner(image), detector(image))


def test_int8_onnx_gives_eagers_detections(onnx_int8):
    model, folder = onnx_int8
    _check_runs_like_eager(model, folder, "onnx")


def test_int8_onnx_keeps_nms_roialign_and_the_predictor_in_float(onnx_int8):
    import onnx

    model = onnx.load(os.path.join(onnx_int8[1], "model.onnx"))
    dequantized = {n.output[0] for n in model.graph.node if n.op_type == "DequantizeLinear"}
    quantized_consumers = {n.op_type for n in model.graph.node if set(n.input) & dequantized}
    assert "Conv" in quantized_consumers
    # NMS, RoiAlign, box decoding, softmax: no int8-rounded tensor reaches them. Shape reads no
    # value; GroupNorm's first Reshape (into InstanceNormalization) normalizes a rounded conv output.
    assert quantized_consumers - {"Reshape"} <= set(int8_quantization.ONNX_INT8_OPS) | {
        "Relu", "Add", "MaxPool", "Resize", "Shape"}, quantized_consumers
    consumers = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node.op_type)
    for node in model.graph.node:
        if node.op_type == "Reshape" and set(node.input) & dequantized:
            assert consumers[node.output[0]] == ["InstanceNormalization"], consumers[node.output[0]]
    kept = set(int8_quantization.onnx_nodes_of(model, ["roi_heads.box_predictor.cls_score"]))
    assert kept and not any(set(n.input) & dequantized for n in model.graph.node if n.name in kept)


def test_int8_onnx_convolutions_run_in_onnxruntimes_int8_kernel(onnx_int8, tmp_path):
    """onnxruntime runs a convolution in int8 only where it fuses DequantizeLinear -> Conv ->
    QuantizeLinear into QLinearConv; a group it cannot fuse stays a float Conv that dequantizes its
    weights on every run, slower than the float model. Its optimized graph has QLinearConv, and no
    Conv whose output is only quantized again or normalized by GroupNorm (an unfused group)."""
    import onnx
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    onnxruntime.InferenceSession(os.path.join(onnx_int8[1], "model.onnx"), options, providers=["CPUExecutionProvider"])
    graph = onnx.load(options.optimized_model_filepath).graph
    consumers = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    group_norm = {n.name for n in graph.node if n.op_type == "Reshape" and [
        c.op_type for c in consumers.get(n.output[0], [])] == ["InstanceNormalization"]}
    unfused = [n.name for n in graph.node if n.op_type == "Conv" and all(
        c.op_type in ("QuantizeLinear", "Shape") or c.name in group_norm for c in consumers.get(n.output[0], []))]
    fused = [n.name for n in graph.node if n.op_type == "QLinearConv"]
    print(f"{len(fused)} QLinearConv, {len(unfused)} unfused Conv")
    assert fused and not unfused, unfused


def test_int8_openvino_gives_eagers_detections(openvino_int8):
    model, folder = openvino_int8
    _check_runs_like_eager(model, folder, "openvino")


def test_int8_openvino_quantizes_only_convolutions_and_matmuls(openvino_int8):
    ov = detcore.export.openvino_format.import_openvino()
    model = ov.Core().read_model(os.path.join(openvino_int8[1], "model.xml"))
    consumers = set()
    for op in model.get_ordered_ops():
        if op.get_type_name() == "FakeQuantize":
            for target in op.output(0).get_target_inputs():
                consumers.add(target.get_node().get_type_name())
    assert "Convolution" in consumers
    # A weight's FakeQuantize may be folded into a Convert / Multiply chain; an activation's feeds
    # the convolution or matrix product itself.
    assert not consumers & {"NonMaxSuppression", "ROIAlign", "ROIPooling", "Exp", "TopK", "Softmax"}, consumers


@pytest.mark.parametrize("fmt", ["torchscript", "exported_program"])
def test_int8_is_refused_for_torch_formats(fmt, tmp_path):
    with pytest.raises(ValueError, match=r"int8 quantization is available for the formats \('onnx', 'openvino'\), "
                                         f"not '{fmt}'"):
        detcore.export.check_export_request(_cfg(), fmt, str(tmp_path / "out"), int8=True,
                                            calibration_dataset="shapes_val")
    assert not (tmp_path / "out").exists()


def test_int8_needs_a_calibration_dataset_and_a_positive_count(tmp_path):
    with pytest.raises(ValueError, match=r"int8 needs a calibration dataset.*--calibration-dataset NAME"):
        detcore.export.check_export_request(_cfg(), "onnx", str(tmp_path / "out"), int8=True)
    with pytest.raises(ValueError, match=r"calibration_images must be a positive integer, got 0"):
        detcore.export.check_export_request(_cfg(), "onnx", str(tmp_path / "out"), int8=True,
                                            calibration_dataset="shapes_val", calibration_images=0)


def test_int8_refuses_an_unknown_calibration_dataset_before_tracing(tmp_path):
    with pytest.raises(ValueError, match=r"export_model: calibration dataset: .*'no_such_set'"):
        detcore.export.check_export_request(_cfg(), "onnx", str(tmp_path / "out"), int8=True,
                                            calibration_dataset="no_such_set")
    assert not (tmp_path / "out").exists()


def test_a_calibration_dataset_without_int8_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"calibration dataset \('shapes_val'\) is used only by an int8 export"):
        detcore.export.check_export_request(_cfg(), "onnx", str(tmp_path / "out"), calibration_dataset="shapes_val")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("fmt, missing, hint", [
    ("onnx", "onnxruntime.quantization", r"pip install 'detcore\[export\]'"),
    ("openvino", "nncf", r"pip install 'detcore\[openvino\]' \(or: pip install nncf\)"),
])
def test_int8_is_refused_without_the_quantizer(fmt, missing, hint, monkeypatch, tmp_path):
    pytest.importorskip("openvino") if fmt == "openvino" else None
    monkeypatch.setitem(sys.modules, missing, None)  # the import fails
    with pytest.raises(ImportError, match=f"export_model: int8 .* not installed.*{hint}"):
        detcore.export.check_export_request(_cfg(), fmt, str(tmp_path / "out"), int8=True,
                                            calibration_dataset="shapes_val")


@pytest.mark.parametrize("capabilities, warns", [({"avx512_vnni": True}, False), ({"avx2": True}, True)])
def test_int8_warns_where_the_cpu_emulates_it(capabilities, warns, monkeypatch, caplog):
    monkeypatch.setattr(precision, "_cpu_capabilities", lambda: dict(capabilities))
    with caplog.at_level(logging.WARNING, logger="detcore.export.quantize"):
        int8_quantization.warn_if_int8_emulated()
    assert ("without AVX512-VNNI, AVX-VNNI or AMX" in caplog.text) == warns


def _frozen_batchnorm_conv_onnx(path):
    """A conv with FrozenBatchNorm as ONNX: the conv scales its weight in the graph
    (layers/conv.py's conv_norm), a product torch.onnx leaves unfolded at this size. Returns the
    module, its FrozenBatchNorm2d and calibration inputs."""
    from detcore.layers import Conv2d, FrozenBatchNorm2d

    torch.manual_seed(0)
    norm = FrozenBatchNorm2d(64)
    norm.weight.uniform_(0.5, 2.0)
    norm.running_var.uniform_(0.5, 2.0)
    model = torch.nn.Sequential(Conv2d(64, 64, 3, padding=1, bias=False, norm=norm), torch.nn.ReLU()).eval()
    image = torch.rand(1, 64, 16, 16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (image,), path, dynamo=True, input_names=["x"])
    return model, norm, [image.numpy(), 2 * image.numpy()]


def test_int8_onnx_quantizes_frozen_batchnorm_convs_weights_per_channel(tmp_path):
    """quantize_onnx_file folds a FrozenBatchNorm conv's weight product, so the weight is
    quantized as a weight (int8 constant, a scale per output channel, zero point 0), not
    calibrated per tensor as an activation."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    import onnx
    from onnx import numpy_helper

    float_path, int8_path = str(tmp_path / "float.onnx"), str(tmp_path / "int8.onnx")
    model, norm, inputs = _frozen_batchnorm_conv_onnx(float_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        int8_quantization.quantize_onnx_file(float_path, int8_path, inputs, [])
    graph = onnx.load(int8_path).graph
    producer = {out: node for node in graph.node for out in node.output}
    initializers = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    (conv,) = [n for n in graph.node if n.op_type == "Conv"]
    dequantize = producer[conv.input[1]]
    assert dequantize.op_type == "DequantizeLinear" and dequantize.input[0] in initializers, dequantize
    weight, scale, zero_point = (initializers[name] for name in dequantize.input)
    assert weight.dtype == np.int8 and scale.shape == (64,) and not zero_point.any()
    with torch.no_grad():
        folded = (model[0].weight * norm.scale_and_shift()[0][:, None, None, None]).numpy()
    np.testing.assert_allclose(weight * scale[:, None, None, None], folded, atol=float(scale.max()))


def test_int8_openvino_quantizes_frozen_batchnorm_convs(tmp_path):
    """NNCF quantizes a convolution only if its weight is a constant: quantize_openvino_model
    folds the FrozenBatchNorm product first, so the conv's weight comes from an int8 constant (or
    a FakeQuantize), not from a float Multiply."""
    pytest.importorskip("onnxscript")
    ov = pytest.importorskip("openvino")
    pytest.importorskip("nncf")
    path = str(tmp_path / "float.onnx")
    _, _, inputs = _frozen_batchnorm_conv_onnx(path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quantized = int8_quantization.quantize_openvino_model(ov.Core().read_model(path), inputs, [])
    (conv,) = [op for op in quantized.get_ordered_ops() if op.get_type_name() == "Convolution"]
    weight_path, node = [], conv.input_value(1).get_node()
    while True:
        weight_path.append(f"{node.get_type_name()}:{node.get_output_element_type(0).get_type_name()}")
        if node.get_type_name() in ("Constant", "FakeQuantize") or node.get_input_size() == 0:
            break
        node = node.input_value(0).get_node()
    assert weight_path[-1] in ("Constant:i8", "FakeQuantize:f32"), weight_path
