"""The rows of the deploy table (benchmark_export.py): each way a user runs Mask R-CNN on a CPU,
made once into a folder and loadable from it again, in the benchmark's process or in a worker
(for its own peak memory).

Rows (ROWS, in the table's order): torchvision's ``maskrcnn_resnet50_fpn`` eager in float32 (the
anchor) and exported to ONNX by torchvision's own route (``torch.onnx.export``'s TorchScript
exporter, opset 11) run by onnxruntime, the deploy path users take today; detcore eager in
float32 and in bfloat16 autocast; its exports as users make them (``export_model``): the
ExportedProgram, TorchScript, ONNX in onnxruntime and the OpenVINO IR, each in float32, the last
two also int8 (calibrated on a registered dataset).

A row's runner has ``one(image)`` (one uint8 CHW image: the detections) and ``batch(images)``
(several equally sized ones): the eager models take a batch in one call, the exported graphs
(one image each) take the images one after another. torchvision's models take the image as
float in [0, 1], so their runner converts it inside the timed call, as a caller would.
"""
import os
from typing import Callable, Dict, List, Tuple

import numpy as np
import torch

ROWS = (
    "torchvision_eager", "torchvision_onnxruntime", "eager", "eager_bfloat16", "exported_program", "torchscript",
    "onnxruntime", "onnxruntime_int8", "openvino", "openvino_int8",
)
LABELS = {
    "torchvision_eager": "torchvision eager float32 (anchor)",
    "torchvision_onnxruntime": "torchvision ONNX in onnxruntime float32",
    "eager": "detcore eager float32",
    "eager_bfloat16": "detcore eager bfloat16",
    "exported_program": "detcore ExportedProgram float32",
    "torchscript": "detcore TorchScript float32",
    "onnxruntime": "detcore ONNX in onnxruntime float32",
    "onnxruntime_int8": "detcore ONNX in onnxruntime int8",
    "openvino": "detcore OpenVINO float32",
    "openvino_int8": "detcore OpenVINO int8",
}
# The detcore rows that are exports: (export_model's format, int8).
EXPORTS = {
    "exported_program": ("exported_program", False),
    "torchscript": ("torchscript", False),
    "onnxruntime": ("onnx", False),
    "onnxruntime_int8": ("onnx", True),
    "openvino": ("openvino", False),
    "openvino_int8": ("openvino", True),
}
DETCORE_EAGER = {"eager": "float32", "eager_bfloat16": "bfloat16"}
TORCHVISION = ("torchvision_eager", "torchvision_onnxruntime")
# The Python packages a row needs beyond torch and detcore.
PACKAGES = {
    "torchvision_eager": ("torchvision",),
    "torchvision_onnxruntime": ("torchvision", "onnx", "onnxruntime"),
    "onnxruntime": ("onnx", "onnxscript", "onnxruntime"),
    "onnxruntime_int8": ("onnx", "onnxscript", "onnxruntime"),
    "openvino": ("onnx", "onnxscript", "openvino"),
    "openvino_int8": ("onnx", "onnxscript", "openvino", "nncf"),
}


def missing_packages(rows) -> List[str]:
    """The packages ``rows`` need that are not installed, so that a run stops before its exports."""
    import importlib.util

    needed = sorted({name for row in rows for name in PACKAGES.get(row, ())})
    return [name for name in needed if importlib.util.find_spec(name) is None]


def detcore_config(config_file: str, opts=()):
    """The benchmark's detcore config: every run carries 100 detections through the mask head
    (score threshold 0), whatever the weights score."""
    from detcore.config import get_cfg

    cfg = get_cfg()
    cfg.merge_from_file(config_file)
    cfg.merge_from_list(["MODEL.DEVICE", "cpu", "MODEL.ROI_HEADS.SCORE_THRESH_TEST", 0.0, "TEST.DETECTIONS_PER_IMAGE", 100])
    cfg.merge_from_list(list(opts))
    return cfg


def torchvision_model(size: Tuple[int, int]):
    """torchvision's Mask R-CNN R-50-FPN, random seeded weights (no download), set up as detcore's:
    score threshold 0 and 100 detections; its own resize (800 x 1333 by default) set to the
    benchmark's image ``size`` (H, W), so that it is a no-op as in detcore's graphs."""
    import torchvision

    torch.manual_seed(0)
    return torchvision.models.detection.maskrcnn_resnet50_fpn(
        weights=None, weights_backbone=None, box_score_thresh=0.0, box_detections_per_img=100,
        min_size=min(size), max_size=max(size),
    ).eval()


def prepare(folder: str, rows, cfg, model, image: torch.Tensor, calibration: Tuple[str, int]) -> None:
    """Writes what ``rows`` need into ``folder``: the image, detcore's weights and config, its
    exports (one folder per row, by export_model), torchvision's weights and its ONNX file."""
    torch.save(image, os.path.join(folder, "image.pt"))
    torch.save(model.state_dict(), os.path.join(folder, "detcore.pth"))
    with open(os.path.join(folder, "detcore.yaml"), "w") as f:
        f.write(cfg.dump())
    for row in rows:
        if row in EXPORTS:
            export_row(cfg, model, row, folder, calibration, sample_image=image)
    if any(row in TORCHVISION for row in rows):
        tv = torchvision_model(tuple(image.shape[-2:]))
        torch.save(tv.state_dict(), os.path.join(folder, "torchvision.pth"))
        if "torchvision_onnxruntime" in rows:
            # torchvision's documented export: the TorchScript-based exporter, opset 11, H and W dynamic.
            torch.onnx.export(
                tv, ([_torchvision_input(image)],), os.path.join(folder, "torchvision.onnx"), opset_version=11,
                input_names=["image"], dynamic_axes={"image": [1, 2]}, dynamo=False,
            )


def export_row(cfg, model, row: str, folder: str, calibration: Tuple[str, int], sample_image=None) -> str:
    """``model``'s export for the export row ``row`` into ``folder/row``, as ``detcore export`` writes
    it (int8 rows calibrated on ``calibration``: dataset name, image count); that folder."""
    from detcore.export import export_model

    fmt, int8 = EXPORTS[row]
    extra = dict(int8=True, calibration_dataset=calibration[0], calibration_images=calibration[1]) if int8 else {}
    out = os.path.join(folder, row)
    export_model(cfg, model, fmt, out, sample_image=sample_image, **extra)
    return out


class Runner:
    """``one(image)`` -> the detections (a sequence whose first item has one row per detection);
    ``batch(images)`` -> nothing (timed only)."""

    def __init__(self, one: Callable, batch: Callable):
        self.one = one
        self.batch = batch


def load(folder: str, row: str, threads: int) -> Runner:
    """The runner of ``row`` from ``folder`` (prepare's), on ``threads`` CPU threads."""
    torch.set_num_threads(threads)
    if row in DETCORE_EAGER:
        return _detcore_eager(folder, DETCORE_EAGER[row])
    if row in EXPORTS:
        from detcore.export import load_exported

        runner = load_exported(os.path.join(folder, row), num_threads=threads)
        return Runner(runner, lambda images: [runner(image) for image in images])
    if row == "torchvision_eager":
        model = torchvision_model(tuple(torch.load(os.path.join(folder, "image.pt")).shape[-2:]))
        model.load_state_dict(torch.load(os.path.join(folder, "torchvision.pth")))

        def one(image):
            with torch.no_grad():
                out = model([_torchvision_input(image)])[0]
            return out["boxes"], out["scores"], out["labels"], out["masks"]

        def batch(images):
            with torch.no_grad():
                model([_torchvision_input(image) for image in images])

        return Runner(one, batch)
    if row == "torchvision_onnxruntime":
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        session = onnxruntime.InferenceSession(
            os.path.join(folder, "torchvision.onnx"), options, providers=["CPUExecutionProvider"]
        )

        def one(image):
            return session.run(None, {"image": _torchvision_input(image).numpy()})

        return Runner(one, lambda images: [one(image) for image in images])
    raise ValueError(f"unknown row {row!r}; the rows are {', '.join(ROWS)}")


def _detcore_eager(folder: str, precision: str) -> Runner:
    from detcore.config import get_cfg
    from detcore.export import ExportableDetector
    from detcore.modeling import build_model

    cfg = get_cfg()
    cfg.merge_from_file(os.path.join(folder, "detcore.yaml"))
    model = build_model(cfg)
    model.load_state_dict(torch.load(os.path.join(folder, "detcore.pth")))
    single = ExportableDetector(model.eval(), precision=precision)
    batched: Dict[int, ExportableDetector] = {}

    def one(image):
        with torch.no_grad():
            return single(image)

    def batch(images: List[torch.Tensor]):
        detector = batched.setdefault(len(images), ExportableDetector(model, batch_size=len(images), precision=precision))
        with torch.no_grad():
            detector(torch.stack(images))

    return Runner(one, batch)


def _torchvision_input(image: torch.Tensor) -> torch.Tensor:
    return image.float().div_(255)


def detections(outputs) -> int:
    """How many detections a runner's ``one`` gave (its first output's rows)."""
    first = outputs[0]
    return int(first.shape[0] if isinstance(first, (torch.Tensor, np.ndarray)) else len(first))
