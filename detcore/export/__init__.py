"""Exporting detcore: its ops in ONNX (and, in later steps, whole models to TorchScript,
torch.export and ONNX).

Importing this package teaches torch.onnx's TorchScript-based exporter detcore's ops; for the
current exporter (dynamo=True) use ``export_onnx`` or pass ``onnx_translation_table()`` as its
``custom_translation_table``.
"""
from .onnx_ops import OPSET, export_onnx, onnx_translation_table, register_onnx_symbolics

register_onnx_symbolics()

__all__ = ["OPSET", "export_onnx", "onnx_translation_table", "register_onnx_symbolics"]
