"""Exporting detcore: detectors to torch.export's ExportedProgram, TorchScript and ONNX
(``export_model``, ``tools/export_model.py``), and the ops alone to ONNX.

Importing this package teaches torch.onnx's TorchScript-based exporter detcore's ops; for the
current exporter (dynamo=True) use ``export_onnx`` or pass ``onnx_translation_table()`` as its
``custom_translation_table``.
"""
from .input_checks import InputContract, input_contracts
from .model_export import FORMATS, check_export_request, export_model, program_to_onnx, trace_detector
from .onnx_ops import OPSET, export_onnx, onnx_translation_table, register_onnx_symbolics, split_roi_pool
from .torchscript import script_exported_program
from .wrapper import ExportableDetector, decode_keypoints, paste_masks, resize_for_model

register_onnx_symbolics()

__all__ = [
    "ExportableDetector",
    "FORMATS",
    "InputContract",
    "OPSET",
    "check_export_request",
    "decode_keypoints",
    "export_model",
    "export_onnx",
    "input_contracts",
    "onnx_translation_table",
    "paste_masks",
    "program_to_onnx",
    "register_onnx_symbolics",
    "resize_for_model",
    "script_exported_program",
    "split_roi_pool",
    "trace_detector",
]
