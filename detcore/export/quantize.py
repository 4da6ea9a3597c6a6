"""int8 post-training quantization of an export (``export_model(..., int8=True)``,
``tools/export_model.py --int8 --calibration-dataset NAME``): ONNX through onnxruntime's static
QDQ quantization, the OpenVINO IR through NNCF's ``nncf.quantize``.

Both calibrate on images of a registered dataset (any name ``DatasetCatalog`` accepts, including
``coco:JSON[:IMAGE_ROOT]``), fed exactly as the exported graph takes them: read in INPUT.FORMAT,
resized by ``resize_for_model`` to the test size, in the export's layout (repeated to the batch
size of a batched export).

What is quantized: the convolutions and matrix products (backbone, FPN, RPN head, box and mask
heads), weights per output channel, activations per tensor, from the calibration's min / max.
For ONNX the graph is laid out so that onnxruntime fuses each quantized convolution into its int8
kernel (QLinearConv), or int8 does not pay: weights folded into constants first, uint8
activations, the quantized outputs reaching GroupNorm (quantize_onnx_file, _float_for_the_rest).
Everything else stays in float32, because its rounding would move or drop boxes rather than blur
features: box decoding and clipping, NMS and the top-k before it, ROIAlign / ROIPool and the
FPN level assignment, the softmax and the score threshold; the mask paste happens outside the
graph. In ONNX terms only the operator types in ``ONNX_INT8_OPS`` get QuantizeLinear /
DequantizeLinear pairs; NNCF is told to ignore every other operator type of the model
(``IgnoredScope``), which leaves it the same convolutions and matrix products. The two layers that
write the box head's class scores and box deltas are kept in float32 too: their outputs are the
detections' scores and coordinates (``float_layers``).

int8 pays where the CPU has int8 dot-product instructions (AVX512-VNNI, AVX-VNNI, AMX): elsewhere
the runtimes emulate them, and an int8 model may be slower than float32 (``warn_if_int8_emulated``).
"""
import logging
from collections import defaultdict
from typing import Dict, Iterator, List, Optional

import numpy as np

from .openvino_format import _telemetry_hidden, import_openvino

__all__ = [
    "INT8_FORMATS",
    "ONNX_INT8_OPS",
    "calibration_inputs",
    "check_int8_request",
    "int8_metadata",
    "quantize_onnx_file",
    "quantizer_versions",
    "quantize_openvino_model",
    "warn_if_int8_emulated",
]

logger = logging.getLogger(__name__)

INT8_FORMATS = ("onnx", "openvino")
# The ONNX operator types that run in int8 (onnxruntime's op_types_to_quantize).
ONNX_INT8_OPS = ("Conv", "ConvTranspose", "MatMul", "Gemm")
# Operators that may take the int8-rounded tensor onnxruntime shares between an int8 operator and
# its other consumers (so that its runtime fuses Conv / Relu / Add chains into int8 kernels);
# every other consumer (reshapes toward box decoding, RoiAlign, the mask logits' gather, softmax)
# is given the float tensor back (_float_for_the_rest). Shape reads no value. A Reshape that
# feeds InstanceNormalization is GroupNorm's (torch.onnx writes GN as Reshape, InstanceNormalization,
# Reshape, Mul, Add): normalizing the rounded convolution output is what a GN model's int8 conv
# costs, and onnxruntime fuses a convolution into its int8 kernel only where its one consumer is
# the output's QuantizeLinear.
_ONNX_INT8_NEIGHBOURS = ("Relu", "Add", "MaxPool", "Resize", "Shape")
# OpenVINO's names for the same operators: NNCF ignores every other type in the model.
_OPENVINO_INT8_OPS = ("Convolution", "GroupConvolution", "ConvolutionBackpropData", "MatMul")
_ORT_HINT = "pip install 'detcore[export]' (or: pip install onnxruntime)"
_NNCF_HINT = "pip install 'detcore[openvino]' (or: pip install nncf)"


def check_int8_request(fmt: str, calibration_dataset: Optional[str], calibration_images: int) -> None:
    """What an int8 export refuses before anything is traced: a format that cannot hold it, no
    calibration dataset, a non-positive image count, the quantizer not installed."""
    if fmt not in INT8_FORMATS:
        raise ValueError(
            f"export_model: int8 quantization is available for the formats {INT8_FORMATS}, not {fmt!r} "
            "(TorchScript and the ExportedProgram run detcore's float32 or bfloat16 graph in torch). "
            "Use --format onnx or --format openvino with --int8."
        )
    if not calibration_dataset:
        raise ValueError(
            "export_model: int8 needs a calibration dataset: give calibration_dataset (tools/export_model.py: "
            "--calibration-dataset NAME), a registered dataset name such as shapes_val or coco:path/to/val.json"
        )
    if isinstance(calibration_images, bool) or not isinstance(calibration_images, int) or calibration_images < 1:
        raise ValueError(f"export_model: calibration_images must be a positive integer, got {calibration_images!r}")
    if fmt == "onnx":
        try:
            import onnxruntime.quantization  # noqa: F401
        except ImportError as e:
            raise ImportError(
                f"export_model: int8 ONNX is quantized by onnxruntime, which is not installed ({e}). Install it "
                f"with: {_ORT_HINT}"
            ) from None
    else:
        _import_nncf()
    from detcore.data import DatasetCatalog

    try:
        DatasetCatalog.check_known(calibration_dataset)
    except KeyError as e:
        raise ValueError(f"export_model: calibration dataset: {e.args[0] if e.args else e}") from None


def _import_nncf():
    """``nncf``, imported with openvino-telemetry hidden (NNCF reports usage through it, as
    openvino does: see openvino_format.import_openvino), or an ImportError saying what to install."""
    import_openvino()
    try:
        with _telemetry_hidden():
            import nncf
    except ImportError as e:
        raise ImportError(
            f"export_model: int8 OpenVINO is quantized by NNCF, which is not installed ({e}). Install it with: "
            f"{_NNCF_HINT}"
        ) from None
    return nncf


def calibration_inputs(
    cfg, dataset_name: str, num_images: int, input_layout: str, batch_size: Optional[int], min_side: int,
    resize: bool = True,
) -> List[np.ndarray]:
    """The first ``num_images`` images of ``dataset_name`` as the exported graph takes them
    (uint8, INPUT.FORMAT channel order, resized as export.json's ``resize_before`` says, in
    ``input_layout``; a batched graph gets each image repeated ``batch_size`` times; ``resize``
    False for a graph that resizes the image itself, the raw_image contract). Images
    smaller than the graph's smallest side after resizing are skipped, as the graph refuses them."""
    from detcore.data import DatasetCatalog
    from detcore.data.detection_utils import read_image

    from .wrapper import resize_for_model

    records = DatasetCatalog.get(dataset_name)
    inputs = []
    for record in records:
        if len(inputs) == num_images:
            break
        image = read_image(record["file_name"], cfg.INPUT.FORMAT)
        if resize and int(cfg.INPUT.MIN_SIZE_TEST) > 0:
            image = resize_for_model(image, int(cfg.INPUT.MIN_SIZE_TEST), int(cfg.INPUT.MAX_SIZE_TEST))[0].numpy()
        if min(image.shape[:2]) < min_side:
            continue
        if input_layout == "CHW":
            image = image.transpose(2, 0, 1)
        image = np.ascontiguousarray(image)
        if batch_size is not None:
            image = np.repeat(image[None], batch_size, axis=0)
        inputs.append(image)
    if not inputs:
        raise ValueError(
            f"export_model: the calibration dataset {dataset_name!r} has no image the graph takes "
            f"({len(records)} records, none at least {min_side} px on its short side after resizing)"
        )
    if len(inputs) < num_images:
        logger.warning(
            "int8 calibration: %s gave %d images, fewer than the %d asked for", dataset_name, len(inputs), num_images
        )
    return inputs


def float_layers(model) -> Dict[str, str]:
    """The detector's layers kept in float32 in an int8 export, by module name -> why: the box
    head's last layers, whose outputs are the class scores and box deltas themselves."""
    layers = {}
    predictor = getattr(getattr(model, "roi_heads", None), "box_predictor", None)
    for name in ("cls_score", "bbox_pred"):
        if predictor is not None and hasattr(predictor, name):
            layers[f"roi_heads.box_predictor.{name}"] = "writes the detections' " + (
                "scores" if name == "cls_score" else "box deltas"
            )
    return layers


def onnx_nodes_of(onnx_model, module_names) -> List[str]:
    """The names of the ONNX nodes torch.onnx wrote for the detector's modules ``module_names``
    (it records each node's module path, under the wrapper's ``model.``, in the
    ``pkg.torch.onnx.name_scopes`` metadata)."""
    wanted = {"model." + name for name in module_names}
    nodes = []
    for node in onnx_model.graph.node:
        props = {p.key: p.value for p in node.metadata_props}
        scopes = {s.strip(" '") for s in props.get("pkg.torch.onnx.name_scopes", "").strip("[]").split(",")}
        if scopes & wanted:
            nodes.append(node.name)
    return nodes


class _Reader:
    """onnxruntime's CalibrationDataReader protocol over the calibration inputs."""

    def __init__(self, input_name: str, inputs: List[np.ndarray]):
        self._items: Iterator = iter([{input_name: x} for x in inputs])

    def get_next(self):
        return next(self._items, None)


def _check_found(keep_float: List[str], found: List[str]) -> None:
    if keep_float and not found:
        raise RuntimeError(f"int8 export: found no node of {keep_float} to keep in float32 (torch.onnx's metadata changed?)")


def quantize_onnx_file(float_path: str, int8_path: str, inputs: List[np.ndarray], keep_float: List[str]) -> None:
    """``int8_path``: the float ONNX at ``float_path`` with QuantizeLinear / DequantizeLinear around
    ``ONNX_INT8_OPS`` (weights per channel), calibrated on ``inputs``; the layers named in
    ``keep_float`` (module names) stay in float32."""
    import onnx
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    model = onnx.load(float_path)
    _fold_constant_weights(model)
    excluded = onnx_nodes_of(model, keep_float)
    _check_found(keep_float, excluded)
    input_name = model.graph.input[0].name
    reader = type("CalibrationReader", (_Reader, CalibrationDataReader), {})(input_name, inputs)
    # uint8 activations, int8 weights (U8S8): onnxruntime's x86 int8 kernels take uint8 inputs.
    # With int8 activations (S8S8) its CPU provider converts the QuantizeLinear / DequantizeLinear
    # pairs to uint8 one by one, leaves some (after MaxPool and ReLU) in int8, and a convolution
    # whose input and output types then differ stays a float Conv with its weights dequantized on
    # every run: slower than the float model. U8S8 can saturate on x86 CPUs without VNNI, where
    # int8 does not pay anyway (warn_if_int8_emulated).
    quantize_static(
        model, int8_path, reader, quant_format=QuantFormat.QDQ, op_types_to_quantize=list(ONNX_INT8_OPS),
        per_channel=True, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, nodes_to_exclude=excluded,
    )
    quantized = onnx.load(int8_path)
    _float_for_the_rest(quantized.graph)
    onnx.save(quantized, int8_path)


def _fold_constant_weights(model) -> None:
    """Compute in place the nodes of ``model`` whose inputs are all constants, whatever their size.
    detcore's convolutions scale their weights by FrozenBatchNorm's per-channel scale in the graph
    (layers/conv.py's conv_norm), and torch.onnx folds only small constants: a weight left as a
    Mul output is an activation to the quantizer (calibrated per tensor, with a zero point)
    instead of a weight quantized per output channel."""
    from onnxscript.optimizer import fold_constants

    fold_constants(model, input_size_limit=1 << 62, output_size_limit=1 << 62)


def _takes_int8(node, consumers) -> bool:
    """Whether ``node`` may read the int8-rounded copy of a tensor (see _ONNX_INT8_NEIGHBOURS)."""
    if node.op_type in ONNX_INT8_OPS + _ONNX_INT8_NEIGHBOURS + ("QuantizeLinear", "DequantizeLinear"):
        return True
    return node.op_type == "Reshape" and any(c.op_type == "InstanceNormalization" for c in consumers[node.output[0]])


def _float_for_the_rest(graph) -> None:
    """onnxruntime quantizes a tensor once (QuantizeLinear → DequantizeLinear) and feeds the
    rounded copy to all its consumers, and it quantizes a Conv's output as well as its inputs: the
    RPN's logits and deltas, the features RoiAlign samples, the mask logits would arrive rounded to
    int8. Consumers outside ONNX_INT8_OPS and _ONNX_INT8_NEIGHBOURS get the float tensor instead;
    QuantizeLinear / DequantizeLinear pairs left without consumers are removed, and their scales."""
    producer = {out: node for node in graph.node for out in node.output}
    consumers = defaultdict(list)
    for node in graph.node:
        for name in node.input:
            consumers[name].append(node)
    for node in graph.node:
        if _takes_int8(node, consumers):
            continue
        for i, name in enumerate(node.input):
            dequantize = producer.get(name)
            if dequantize is None or dequantize.op_type != "DequantizeLinear":
                continue
            quantize = producer.get(dequantize.input[0])
            if quantize is not None and quantize.op_type == "QuantizeLinear":
                node.input[i] = quantize.input[0]
    outputs = {o.name for o in graph.output}
    while True:
        used = {name for node in graph.node for name in node.input} | outputs
        dead = [n for n in graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear") and n.output[0] not in used]
        if not dead:
            break
        for node in dead:
            graph.node.remove(node)
    used = {name for node in graph.node for name in node.input}
    for initializer in [i for i in graph.initializer if i.name not in used]:
        graph.initializer.remove(initializer)


def quantize_openvino_model(ov_model, inputs: List[np.ndarray], keep_float_nodes: List[str]):
    """The ov.Model quantized by NNCF on ``inputs``: convolutions and matrix products in int8,
    every other operator type ignored, and the operators converted from the ONNX nodes
    ``keep_float_nodes`` (``onnx_nodes_of``) too."""
    nncf = _import_nncf()
    _fold_openvino_constants(ov_model)
    quantizable = set(_OPENVINO_INT8_OPS)
    ignored_types = sorted({op.get_type_name() for op in ov_model.get_ordered_ops()} - quantizable)
    # OpenVINO's ONNX frontend names an operator after its ONNX node: "node_linear_2", and
    # "node_linear_2/WithoutBiases" for the MatMul of a Gemm.
    ignored_names = [
        op.get_friendly_name() for op in ov_model.get_ordered_ops()
        if op.get_type_name() in quantizable and op.get_friendly_name().split("/")[0] in set(keep_float_nodes)
    ]
    _check_found(keep_float_nodes, ignored_names)
    scope = nncf.IgnoredScope(types=ignored_types, names=ignored_names, validate=False)
    nncf_logger = logging.getLogger("nncf")
    level = nncf_logger.level
    nncf_logger.setLevel(logging.WARNING)  # NNCF logs a line per operator it leaves alone
    try:
        return nncf.quantize(ov_model, nncf.Dataset(inputs), subset_size=len(inputs), ignored_scope=scope)
    finally:
        nncf_logger.setLevel(level)


def _fold_openvino_constants(ov_model) -> None:
    """Compute in place the operators of ``ov_model`` whose inputs are all constants: the
    FrozenBatchNorm scaling of a conv's weight (as in _fold_constant_weights). NNCF quantizes a
    convolution only if its weight is a constant; it leaves one whose weight is a Multiply in
    float32, with its input quantized and dequantized for nothing."""
    from openvino.passes import ConstantFolding, Manager

    manager = Manager()
    manager.register_pass(ConstantFolding())
    manager.run_passes(ov_model)


def int8_metadata(fmt: str, dataset_name: str, num_used: int, num_asked: int, keep_float: Dict[str, str]) -> dict:
    """export.json's ``int8`` entry."""
    return {
        "quantizer": "onnxruntime.quantization.quantize_static (QDQ)" if fmt == "onnx" else "nncf.quantize",
        "calibration_dataset": dataset_name,
        "calibration_images": num_used,
        "calibration_images_asked": num_asked,
        "int8_ops": list(ONNX_INT8_OPS if fmt == "onnx" else _OPENVINO_INT8_OPS),
        "weights": "int8, symmetric, per output channel",
        "activations": ("uint8" if fmt == "onnx" else "int8") + ", per tensor, calibration min / max",
        "float32": "every other operator (box decoding, NMS, ROIAlign, softmax, ...) and "
        + ", ".join(f"{name} ({why})" for name, why in keep_float.items()),
    }


def warn_if_int8_emulated() -> None:
    """A warning where this CPU has no int8 dot-product instructions (int8 is then emulated)."""
    from detcore.utils.precision import cpu_int8_features

    if not cpu_int8_features():
        logger.warning(
            "int8 export on a CPU without AVX512-VNNI, AVX-VNNI or AMX: int8 runs emulated here and may be "
            "slower than float32 (the artefact itself is the same, and fast on a CPU that has them)"
        )


def quantizer_versions(fmt: str) -> Dict[str, str]:
    """The quantizer's version, for export.json's ``versions``."""
    if fmt == "onnx":
        import onnxruntime

        return {"onnxruntime": onnxruntime.__version__}
    return {"nncf": _import_nncf().__version__}
