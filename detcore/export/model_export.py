"""Export a detcore detector to a file: torch.export's ExportedProgram (.pt2), TorchScript (.ts)
or ONNX (.onnx), with a JSON beside it that says how to feed it and read its outputs.

The graph is ``ExportableDetector`` (see wrapper.py): one uint8 image of any height and width in,
boxes / scores / classes (and M×M mask probabilities, S×S keypoint heatmaps) out; for a
ProposalNetwork, proposal boxes and their objectness logits. TorchScript and ONNX are converted
from the same ExportedProgram: TorchScript prints its graph (torchscript.py), ONNX translates it,
with detcore's ops as NonMaxSuppression / RoiAlign (onnx_ops.py).

TEST.PRECISION bfloat16 exports the graph autocast makes: bfloat16 convolutions and matrix
products, float32 where the model keeps float32, the weights stored in float32 and cast in the
graph (as autocast does in every eager call), float32 outputs. ExportedProgram and TorchScript
hold it; ONNX is refused (onnxruntime cannot load a bfloat16 Conv).
"""
import os
import platform
from typing import Dict, Optional

import torch

import detcore
from detcore.utils import strict_json

from .onnx_ops import OPSET, onnx_translation_table, split_roi_pool
from .torchscript import script_exported_program
from .wrapper import ExportableDetector

__all__ = ["FORMATS", "export_model", "trace_detector"]

FORMATS = ("torchscript", "exported_program", "onnx")
_HOW_TO_LOAD = {
    "torchscript": "import detcore (registers its ops), then torch.jit.load(file)",
    "exported_program": "import detcore (registers its ops), then torch.export.load(file).module()",
    "onnx": "onnxruntime.InferenceSession(file): standard ONNX ops only, no detcore needed",
}
_FILE_NAMES = {"torchscript": "model.ts", "exported_program": "model.pt2", "onnx": "model.onnx"}


def _example_image(cfg, input_layout: str, min_side: int) -> torch.Tensor:
    """A uint8 image of the model's test resolution, or of the smallest size the graph serves if
    that is larger (the graph keeps height and width dynamic)."""
    side = max(int(cfg.INPUT.MIN_SIZE_TEST) or 256, min_side)
    generator = torch.Generator().manual_seed(0)
    image = torch.randint(0, 256, (3, side, side * 4 // 3), generator=generator, dtype=torch.uint8)
    return image.permute(1, 2, 0).contiguous() if input_layout == "HWC" else image


def _expected_shape(detector: ExportableDetector) -> str:
    image = "[H, W, 3]" if detector.input_layout == "HWC" else "[3, H, W]"
    return image if detector.batch_size is None else f"[{detector.batch_size}, {image[1:]}"


def trace_detector(detector: ExportableDetector, image: torch.Tensor) -> torch.export.ExportedProgram:
    """torch.export of the detector, with the images' height and width left dynamic."""
    spatial = (0, 1) if detector.input_layout == "HWC" else (1, 2)
    if detector.batch_size is not None:
        spatial = tuple(axis + 1 for axis in spatial)
    dynamic = {axis: torch.export.Dim.AUTO for axis in spatial}
    with torch.no_grad():
        program = torch.export.export(detector, (image,), dynamic_shapes=(dynamic,), strict=False)
    if detector.precision != "float32":
        # The autocast region is one higher-order op in the exported graph; inlined, it becomes the
        # plain casts autocast made (bfloat16 convs and matmuls, float32 where the model asks),
        # which every format can hold.
        program = program.run_decompositions({})
    return program


def export_model(
    cfg, model, fmt: str, output_dir: str, sample_image: Optional[torch.Tensor] = None,
    input_layout: str = "CHW", class_names=None, batch_size: Optional[int] = None,
) -> Dict[str, str]:
    """Writes ``output_dir/model.ts``, ``model.pt2`` or ``model.onnx`` and ``output_dir/export.json``.

    Args:
        cfg: the config the model was built from (kept in the JSON).
        model: a detector (GeneralizedRCNN, RetinaNet, ProposalNetwork) with its weights loaded.
        fmt: one of FORMATS.
        sample_image: a uint8 image in ``input_layout`` to trace with (a random one at the
            config's test size otherwise); any size works afterwards.
        class_names: names of the classes, by class id (for the JSON).
        batch_size: None for a graph taking one image; B for one taking B equally sized images
            at once (the sample image is repeated to trace it).

    Returns:
        ``{"model": path, "metadata": path}``.
    """
    if fmt not in FORMATS:
        raise ValueError(f"export_model: format must be one of {FORMATS}, got {fmt!r}")
    if fmt == "onnx" and cfg.TEST.PRECISION != "float32":
        # Measured: the graph converts, but onnxruntime refuses to load it (its CPU provider has
        # no bfloat16 Conv; the standard's Conv takes none before opset 22, detcore writes OPSET).
        raise ValueError(
            f"export_model: ONNX in TEST.PRECISION {cfg.TEST.PRECISION} is not supported: onnxruntime has no "
            "bfloat16 Conv, so it cannot load such a model. Export ONNX with TEST.PRECISION float32, or use "
            "--format exported_program / torchscript, which keep the bfloat16 graph."
        )
    detector = ExportableDetector(model, input_layout, batch_size, cfg.TEST.PRECISION)
    image = sample_image if sample_image is not None else _example_image(cfg, input_layout, detector.min_side)
    expected_channels_axis = -1 if input_layout == "HWC" else 0
    if image.dtype != torch.uint8 or image.dim() != 3 or image.shape[expected_channels_axis] != 3:
        raise ValueError(
            f"export_model: sample_image must be a uint8 {input_layout} image with 3 channels, got "
            f"{image.dtype} of shape {tuple(image.shape)}"
        )
    spatial = image.shape[:2] if input_layout == "HWC" else image.shape[1:]
    if min(spatial) < detector.min_side:
        raise ValueError(
            f"export_model: sample_image is {spatial[0]} x {spatial[1]} px; this model's graph needs images of at "
            f"least {detector.min_side} px on each side (its coarsest feature map must be 2 x 2 or larger)"
        )
    if batch_size is not None:
        image = image.unsqueeze(0).repeat(batch_size, *([1] * image.dim()))
    os.makedirs(output_dir, exist_ok=True)
    program = trace_detector(detector, image.to(detector.model.device))
    path = os.path.join(output_dir, _FILE_NAMES[fmt])
    temporary = path + ".tmp"
    if fmt == "exported_program":
        torch.export.save(program, temporary)
    elif fmt == "torchscript":
        torch.jit.save(script_exported_program(program), temporary)
    else:
        onnx_program = torch.onnx.export(
            split_roi_pool(program), (image,), dynamo=True, opset_version=OPSET,
            custom_translation_table=onnx_translation_table(), input_names=["image"],
            output_names=list(detector.output_names), verbose=False,
        )
        onnx_program.save(temporary)
    os.replace(temporary, path)  # whole or not at all
    metadata_path = os.path.join(output_dir, "export.json")
    with open(metadata_path + ".tmp", "w") as f:
        f.write(strict_json.dumps(_metadata(cfg, detector, fmt, os.path.basename(path), class_names), indent=2))
    os.replace(metadata_path + ".tmp", metadata_path)
    return {"model": path, "metadata": metadata_path}


def _score_threshold(cfg) -> float:
    """The test score threshold of the config's architecture."""
    if cfg.MODEL.META_ARCHITECTURE == "RetinaNet":
        return cfg.MODEL.RETINANET.SCORE_THRESH_TEST
    return cfg.MODEL.ROI_HEADS.SCORE_THRESH_TEST


def _metadata(cfg, detector: ExportableDetector, fmt: str, file_name: str, class_names) -> dict:
    min_size, max_size = int(cfg.INPUT.MIN_SIZE_TEST), int(cfg.INPUT.MAX_SIZE_TEST)
    return {
        "format": fmt,
        "file": file_name,
        "input": {
            "name": "image",
            "dtype": "uint8",
            "layout": detector.input_layout,
            "shape": _expected_shape(detector),
            "channel_order": cfg.INPUT.FORMAT,
            "size": f"any height and width of at least {detector.min_side} px",
            "min_side": detector.min_side,
            "resize_before": (
                f"shortest edge to {min_size}, longest at most {max_size} (detcore.export.resize_for_model); "
                "boxes come out in the pixels of the image given" if min_size > 0 else "none"
            )
            + (
                f" (OpenCV's uint8 resize: the config's INPUT.RESIZE_MODE '{cfg.INPUT.RESIZE_MODE}' is not "
                "reproduced for the graph's uint8 input)"
                if min_size > 0 and cfg.INPUT.RESIZE_MODE != "opencv"
                else ""
            ),
            "min_size_test": min_size,
            "max_size_test": max_size,
        },
        "precision": detector.precision,
        "outputs": list(detector.output_names),
        "load": _HOW_TO_LOAD[fmt],
        "class_names": list(class_names) if class_names else None,
        "score_threshold": None if detector.proposals_only else float(_score_threshold(cfg)),
        "mask_threshold": float(cfg.MODEL.ROI_MASK_HEAD.MASK_THRESHOLD) if detector.mask_on else None,
        "mask_paste_mode": cfg.MODEL.ROI_MASK_HEAD.PASTE_MODE if detector.mask_on else None,
        "keypoint_decode": (
            "detcore.export.decode_keypoints(keypoint_heatmaps, boxes): per box, the heatmaps resized "
            "bicubically to the box's size in pixels (rounded up), the best pixel's center and logit"
            if detector.keypoint_on else None
        ),
        "box_legacy_plus_one": bool(cfg.MODEL.BOX_LEGACY_PLUS_ONE),
        "onnx_opset": OPSET if fmt == "onnx" else None,
        "config": cfg.dump(),
        "versions": {
            "detcore": detcore.__version__,
            "torch": torch.__version__,
            "python": platform.python_version(),
        },
    }
