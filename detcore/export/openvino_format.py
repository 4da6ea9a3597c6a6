"""The OpenVINO IR (model.xml + model.bin): the exported ONNX graph converted by OpenVINO's ONNX
frontend, run by OpenVINO's CPU plugin.

Why from the ONNX and not the ExportedProgram: onnx_ops.py already writes detcore's ops as
standard ONNX ops, which the ONNX frontend maps to OpenVINO's own (NonMaxSuppression →
NonMaxSuppression-9, RoiAlign → ROIAlign-9, MaxRoiPool → ROIPooling); OpenVINO's PyTorch
frontend does not know detcore's custom ops. ONNX's DeformConv has no conversion in the ONNX
frontend ("No conversion rule found for operations: DeformConv-19"), so deformable models are
refused (model_export.check_export_request).

ROIAlign semantics (checked op by op in tests/export/test_openvino_export.py): ONNX's
coordinate_transformation_mode half_pixel (detcore's aligned=True) arrives as aligned_mode
"half_pixel_for_nn", which shifts the box corners by -0.5 pixel after scaling, as detcore's
aligned=True; output_half_pixel (aligned=False) as "asymmetric", no shift and box sizes of at least
one pixel, as detcore's aligned=False. sampling_ratio 0 is adaptive (ceil(box side / output
side) samples per bin) in both; mode "avg" averages the bilinear samples as detcore does.

Ties: ONNX's TopK puts equal values in the order of their position (onnx_ops.py relies on it to
order batched_nms's kept boxes by decreasing score, ties by lower index, as detcore does); the
ONNX frontend makes TopK-11 with ``stable`` false, which orders ties arbitrarily, and the CPU
plugin's stable TopK is slow, so ``onnx_to_openvino`` rewrites each TopK whose indices are used
into unstable TopKs that give ONNX's order (openvino_topk.py).

The CPU plugin picks its own precision: on CPUs with bfloat16 units (AMX, AVX512-BF16) it runs a
float32 IR in bfloat16 unless told otherwise. ``compile_openvino`` asks for float32
(INFERENCE_PRECISION_HINT f32), so the IR gives the float32 model's detections; export.json's
``load`` says the same to users.

openvino is an optional dependency (``pip install 'detcore[openvino]'``): without it the format is
refused before anything is traced.
"""
import contextlib
import os
import sys
import tempfile
import warnings
from typing import Optional

from .openvino_topk import replace_stable_topks

__all__ = ["INSTALL_HINT", "compile_openvino", "import_openvino", "onnx_to_openvino", "openvino_version"]

INSTALL_HINT = "pip install 'detcore[openvino]' (or: pip install openvino)"
# The CPU plugin's settings for a float32 export: OpenVINO's names.
_FLOAT32 = {"INFERENCE_PRECISION_HINT": "f32"}


def import_openvino():
    """The ``openvino`` module, or an ImportError saying what to install.

    Imported with openvino-telemetry hidden: ``import openvino`` (through openvino.tools.ovc)
    otherwise sends a usage event to Intel over the network unless the user opted out, and
    detcore must not reach the internet unasked. Hidden, OpenVINO falls back to its own no-op
    telemetry stub for this process. Where openvino was imported before, nothing changes."""
    try:
        if "openvino" in sys.modules:
            import openvino
        else:
            with _telemetry_hidden():
                import openvino
    except ImportError as e:
        raise ImportError(
            f"the OpenVINO format needs the openvino package, which is not installed ({e}). Install it with: "
            f"{INSTALL_HINT}"
        ) from None
    return openvino


@contextlib.contextmanager
def _telemetry_hidden():
    # A None entry in sys.modules makes `import openvino_telemetry` raise ImportError.
    missing = object()
    saved = sys.modules.get("openvino_telemetry", missing)
    sys.modules["openvino_telemetry"] = None
    try:
        yield
    finally:
        if saved is missing:
            del sys.modules["openvino_telemetry"]
        else:
            sys.modules["openvino_telemetry"] = saved


def openvino_version() -> Optional[str]:
    try:
        return import_openvino().get_version()
    except ImportError:
        return None


def onnx_to_openvino(onnx_program, xml_path: str, transform=None) -> None:
    """Write ``xml_path`` and the weights beside it (same name, .bin) from a
    ``torch.onnx.ONNXProgram``: float32 weights (OpenVINO's saver would halve them to float16
    by default). ``transform``: a function of the converted ov.Model returning the model to
    save (the int8 quantization, quantize.py)."""
    ov = import_openvino()
    with tempfile.TemporaryDirectory(prefix="detcore_openvino_") as folder:
        onnx_path = os.path.join(folder, "model.onnx")
        onnx_program.save(onnx_path)
        # The runtime's ONNX frontend, not ov.convert_model: the same conversion, without
        # convert_model's usage reports (openvino-telemetry, see import_openvino).
        model = ov.Core().read_model(onnx_path)
    _, left_stable = replace_stable_topks(model)
    if left_stable:
        warnings.warn(
            f"onnx_to_openvino: {left_stable} TopK(s) of this graph keep OpenVINO's stable TopK (about n x k "
            "on the CPU): their shape, mode or type is not one openvino_topk.py rewrites", stacklevel=2)
    if transform is not None:
        model = transform(model)
    ov.save_model(model, xml_path, compress_to_fp16=False)


def compile_openvino(xml_path: str, num_threads: Optional[int] = None):
    """The IR compiled for OpenVINO's CPU plugin in float32, on ``num_threads`` threads (None:
    OpenVINO's choice). Call the result with the input array; it returns the outputs by port."""
    ov = import_openvino()
    config = dict(_FLOAT32)
    if num_threads is not None:
        if num_threads < 1:
            raise ValueError(f"compile_openvino: num_threads must be >= 1 or None, got {num_threads}")
        config["INFERENCE_NUM_THREADS"] = int(num_threads)
    return ov.Core().compile_model(xml_path, "CPU", config)
