"""Exporting detcore: detectors to torch.export's ExportedProgram, TorchScript, ONNX and the
OpenVINO IR (``export_model``, ``tools/export_model.py``), and the ops alone to ONNX; exports
loaded and run (``load_exported``) and evaluated like the model (``ExportedDetector``,
``tools/test_net.py --exported``).

Importing this package teaches torch.onnx's TorchScript-based exporter detcore's ops; for the
current exporter (dynamo=True) use ``export_onnx`` or pass ``onnx_translation_table()`` as its
``custom_translation_table``.
"""
from .exported_detector import ExportedDetector, exported_config
from .input_checks import InputContract, input_contracts
from .model_export import FORMATS, INPUT_CONTRACTS, check_export_request, export_model, program_to_onnx, trace_detector
from .onnx_ops import OPSET, export_onnx, onnx_translation_table, register_onnx_symbolics, split_roi_pool
from .raw_image import RawImageIO, resized_size
from .runners import ExportedRunner, load_exported, read_export_metadata
from .torchscript import script_exported_program
from .wrapper import ExportableDetector, decode_keypoints, paste_masks, resize_for_model

register_onnx_symbolics()

__all__ = [
    "ExportableDetector",
    "ExportedDetector",
    "ExportedRunner",
    "FORMATS",
    "INPUT_CONTRACTS",
    "InputContract",
    "OPSET",
    "check_export_request",
    "decode_keypoints",
    "export_model",
    "export_onnx",
    "exported_config",
    "input_contracts",
    "load_exported",
    "onnx_translation_table",
    "paste_masks",
    "program_to_onnx",
    "RawImageIO",
    "read_export_metadata",
    "register_onnx_symbolics",
    "resize_for_model",
    "resized_size",
    "script_exported_program",
    "split_roi_pool",
    "trace_detector",
]
