"""An exported artefact loaded from its folder and run: one callable per format, image in, the
graph's outputs out.

    runner = load_exported("exported/", num_threads=2)
    boxes, scores, classes, mask_probs = runner(image)   # image as export.json's "input" says

``load_exported`` reads export.json (the contract every format shares) and picks the runtime the
format needs: torch.jit for TorchScript, torch.export for the ExportedProgram, onnxruntime for
ONNX, OpenVINO's CPU plugin for the IR. Every runner takes the image (a uint8 tensor or array in
the export's layout: already resized as export.json's ``resize_before`` says, or as it is for an
export whose ``input.contract`` is "raw_image") and returns the
outputs named in export.json's ``outputs``, in that order, as torch tensors. Nothing else happens
here: what the graph refuses it refuses (input_checks.py), and postprocessing (rescaling, mask
pasting) is the model's own (exported_detector.py), so the equality tests and the evaluation of
an artefact run exactly the same code around the runtime.
"""
import json
import os
from typing import Optional, Tuple

import numpy as np
import torch

from .openvino_format import compile_openvino

__all__ = ["ExportedRunner", "load_exported", "read_export_metadata"]


def read_export_metadata(folder: str) -> dict:
    """export.json of an export folder, with a clear error where there is none."""
    path = os.path.join(folder, "export.json")
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"load_exported: {folder!r} holds no export.json; give the folder tools/export_model.py wrote (--output)"
        )
    with open(path) as f:
        return json.load(f)


class ExportedRunner:
    """Base of the runners: ``metadata`` (export.json), ``output_names``, and ``__call__(image)``
    returning the outputs as torch tensors."""

    def __init__(self, metadata: dict, path: str):
        self.metadata = metadata
        self.path = path
        self.output_names = tuple(metadata["outputs"])

    @property
    def format(self) -> str:
        return self.metadata["format"]

    def __call__(self, image) -> Tuple[torch.Tensor, ...]:
        outputs = self._run(image)
        if len(outputs) != len(self.output_names):
            raise RuntimeError(
                f"{type(self).__name__}: {self.path} returned {len(outputs)} outputs, export.json names "
                f"{len(self.output_names)} ({', '.join(self.output_names)})"
            )
        return tuple(torch.as_tensor(np.asarray(o)) if not isinstance(o, torch.Tensor) else o for o in outputs)

    def _run(self, image):
        raise NotImplementedError

    def __repr__(self):
        return f"{type(self).__name__}({self.path!r})"


def _as_tensor(image) -> torch.Tensor:
    return image if isinstance(image, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(image))


def _as_array(image) -> np.ndarray:
    return np.ascontiguousarray(image.numpy() if isinstance(image, torch.Tensor) else image)


class TorchScriptRunner(ExportedRunner):
    def __init__(self, metadata, path, num_threads=None):
        super().__init__(metadata, path)
        import detcore.layers  # noqa: F401  (registers detcore's ops, which the graph calls)

        self.module = torch.jit.load(path, map_location="cpu")
        self.num_threads = num_threads

    def _run(self, image):
        with torch.no_grad(), _torch_threads(self.num_threads):
            return self.module(_as_tensor(image))


class ExportedProgramRunner(TorchScriptRunner):
    def __init__(self, metadata, path, num_threads=None):
        ExportedRunner.__init__(self, metadata, path)
        import detcore.layers  # noqa: F401

        self.module = torch.export.load(path).module()
        self.num_threads = num_threads


class OnnxRunner(ExportedRunner):
    def __init__(self, metadata, path, num_threads=None):
        super().__init__(metadata, path)
        try:
            import onnxruntime
        except ImportError:
            raise ImportError(
                "load_exported: an ONNX export runs in onnxruntime, which is not installed: "
                "pip install 'detcore[export]' (or: pip install onnxruntime)"
            ) from None
        options = onnxruntime.SessionOptions()
        if num_threads is not None:
            options.intra_op_num_threads = int(num_threads)
            options.inter_op_num_threads = 1
        self.session = onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        self.input_name = self.session.get_inputs()[0].name

    def _run(self, image):
        return self.session.run(None, {self.input_name: _as_array(image)})


class OpenVinoRunner(ExportedRunner):
    def __init__(self, metadata, path, num_threads=None):
        super().__init__(metadata, path)
        self.compiled = compile_openvino(path, num_threads)

    def _run(self, image):
        array = _as_array(image)
        if array.dtype != np.uint8:
            # OpenVINO converts another dtype to the input's silently; the graph takes uint8 only.
            raise ValueError(
                f"OpenVinoRunner: the graph takes a uint8 image of shape {self.metadata['input']['shape']}, got "
                f"{array.dtype} of shape {tuple(array.shape)}"
            )
        results = self.compiled(array)
        return [results[port] for port in self.compiled.outputs]


_RUNNERS = {
    "torchscript": TorchScriptRunner,
    "exported_program": ExportedProgramRunner,
    "onnx": OnnxRunner,
    "openvino": OpenVinoRunner,
}


def load_exported(folder: str, num_threads: Optional[int] = None) -> ExportedRunner:
    """The export in ``folder`` (export.json and the model file it names), ready to run on
    ``num_threads`` CPU threads (None: the runtime's default)."""
    metadata = read_export_metadata(folder)
    fmt = metadata.get("format")
    if fmt not in _RUNNERS:
        raise ValueError(f"load_exported: {folder}/export.json has format {fmt!r}; known: {tuple(_RUNNERS)}")
    if num_threads is not None and num_threads < 1:
        raise ValueError(f"load_exported: num_threads must be >= 1 or None, got {num_threads}")
    path = os.path.join(folder, metadata["file"])
    if not os.path.isfile(path):
        raise FileNotFoundError(f"load_exported: export.json names {metadata['file']!r}, which is not in {folder!r}")
    return _RUNNERS[fmt](metadata, path, num_threads)


class _torch_threads:
    """torch's intra-op threads set for a block (torch has one global setting), then restored."""

    def __init__(self, num_threads):
        self.num_threads = num_threads

    def __enter__(self):
        self.previous = torch.get_num_threads()
        if self.num_threads is not None:
            torch.set_num_threads(self.num_threads)

    def __exit__(self, *exc):
        torch.set_num_threads(self.previous)
