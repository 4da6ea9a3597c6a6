"""Export a detcore detector to a file: torch.export's ExportedProgram (.pt2), TorchScript (.ts),
ONNX (.onnx) or the OpenVINO IR (.xml + .bin), with a JSON beside it that says how to feed it and
read its outputs (runners.py loads and runs any of them from that JSON).

The graph is ``ExportableDetector`` (see wrapper.py): one uint8 image of any height and width in,
boxes / scores / classes (and M×M mask probabilities, S×S keypoint heatmaps) out; for a
ProposalNetwork, proposal boxes and their objectness logits. TorchScript and ONNX are converted
from the same ExportedProgram: TorchScript prints its graph (torchscript.py), ONNX translates it,
with detcore's ops as NonMaxSuppression / RoiAlign (onnx_ops.py); OpenVINO converts that ONNX
graph (openvino_format.py).

The input contract (export.json's ``input.contract``): "resized_image", the graph takes images
already resized as export.json's ``resize_before`` says and gives detections in their pixels; or
"raw_image" (ONNX and OpenVINO), the resize and the mapping of the boxes back to the input's pixels
are put around the traced graph (raw_image.py), so a deploy side needs only the runtime and numpy.

TEST.PRECISION bfloat16 exports the graph autocast makes: bfloat16 convolutions and matrix
products, float32 where the model keeps float32, the weights stored in float32 and cast in the
graph (as autocast does in every eager call), float32 outputs. ExportedProgram and TorchScript
hold it; ONNX and OpenVINO are refused (onnxruntime cannot load a bfloat16 Conv; OpenVINO's
CPU plugin chooses its precision at compile time, not from the graph).

Every format refuses the inputs the graph cannot serve (wrong dtype or shape, an image below the
smallest side), each as far as it can: see input_checks.py. What export_model refuses before
tracing: TEST.AUG.ENABLED (the graph runs the model once; test-time augmentation resizes to several
scales, which the graph leaves to the caller), a folder that already holds an export (unless
``overwrite``), and a folder it cannot write to.
"""
import errno
import os
import platform
import tempfile
from typing import Dict, Optional, Sequence

import torch

import detcore
from detcore.utils import strict_json

from .input_checks import add_onnx_input_checks, input_contracts
from .onnx_ops import OPSET, onnx_translation_table, split_roi_pool
from .openvino_format import import_openvino, onnx_to_openvino, openvino_version
from . import quantize as int8_quantization
from .raw_image import RawImageIO, add_onnx_raw_image_io, describe_resize
from .torchscript import script_exported_program
from .wrapper import ExportableDetector

__all__ = ["FORMATS", "INPUT_CONTRACTS", "check_export_request", "export_model", "program_to_onnx", "trace_detector"]

FORMATS = ("torchscript", "exported_program", "onnx", "openvino")
# What the graph takes: the image at the model's resolution (the caller resizes and maps the boxes
# back), or the raw image (the graph does both; raw_image.py).
INPUT_CONTRACTS = ("resized_image", "raw_image")
_HOW_TO_LOAD = {
    "torchscript": "import detcore (registers its ops), then torch.jit.load(file)",
    "exported_program": "import detcore (registers its ops), then torch.export.load(file).module()",
    "onnx": "onnxruntime.InferenceSession(file): standard ONNX ops only, no detcore needed",
    "openvino": "openvino.Core().compile_model(file, 'CPU', {'INFERENCE_PRECISION_HINT': 'f32'}) (model.bin beside "
    "it; without the hint the CPU plugin runs bfloat16 on CPUs that have it); no detcore needed",
}
_FILE_NAMES = {"torchscript": "model.ts", "exported_program": "model.pt2", "onnx": "model.onnx", "openvino": "model.xml"}
# Files a format writes besides its model file and export.json.
_EXTRA_FILES = {"openvino": ("model.bin",)}
# How each format refuses an input outside the rule (dtype, shape, smallest side): input_checks.py.
_INPUT_CHECKS = {
    "torchscript": "in the graph: a ValueError saying what it takes",
    "exported_program": "by torch before the graph runs (torch's messages: 'Tensor dtype mismatch', "
    "'Guard failed: image.size()[1] >= min_side')",
    "onnx": "dtype, rank and channels by onnxruntime; sizes in the graph: the run fails at the node "
    "named 'input check: ...'",
    "openvino": "rank and channels by OpenVINO; dtype by detcore.export.load_exported's runner (OpenVINO's Python "
    "API converts another dtype to uint8 silently: feed uint8); sizes in the graph: the run fails at the Reshape "
    "node named 'input check: ...'",
}


def _example_image(cfg, input_layout: str, min_side: int) -> torch.Tensor:
    """A uint8 image of the model's test resolution, or of the smallest size the graph serves if
    that is larger (the graph keeps height and width dynamic)."""
    side = max(int(cfg.INPUT.MIN_SIZE_TEST) or 256, min_side)
    generator = torch.Generator().manual_seed(0)
    image = torch.randint(0, 256, (3, side, side * 4 // 3), generator=generator, dtype=torch.uint8)
    return image.permute(1, 2, 0).contiguous() if input_layout == "HWC" else image


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


def program_to_onnx(
    program: torch.export.ExportedProgram, args: tuple, output_names: Optional[Sequence[str]] = None,
    raw_image: Optional[RawImageIO] = None,
):
    """The ExportedProgram as a ``torch.onnx.ONNXProgram`` (``.save(path)`` writes it): detcore's
    ops in standard ONNX, inputs named as the program names them, and the program's input rule
    checked in the graph (a run with an image below the smallest side fails; input_checks.py).

    ``raw_image`` (``RawImageIO.of(detector, cfg)``): the graph then takes the raw image, resizes it
    itself and gives detections in its pixels (raw_image.py); its rule (the resized image's
    smallest side) replaces the program's."""
    onnx_program = torch.onnx.export(
        split_roi_pool(program), args, dynamo=True, opset_version=OPSET,
        custom_translation_table=onnx_translation_table(), input_names=list(program.graph_signature.user_inputs),
        output_names=list(output_names) if output_names is not None else None, verbose=False,
    )
    if raw_image is None:
        add_onnx_input_checks(onnx_program.model, input_contracts(program))
    else:
        add_onnx_raw_image_io(onnx_program.model, raw_image)
    return onnx_program


def _existing_export(output_dir: str, fmt: str) -> list:
    """The files of an export that writing ``fmt`` into ``output_dir`` would replace."""
    names = (_FILE_NAMES[fmt],) + _EXTRA_FILES.get(fmt, ()) + ("export.json",)
    return [name for name in names if os.path.lexists(os.path.join(output_dir, name))]


def _prepare_output_dir(output_dir: str, fmt: str, overwrite: bool) -> None:
    """Refuse, before anything is traced, a folder holding an export (unless ``overwrite``) and one
    that cannot be written to; create it if missing."""
    folder = output_dir or "."
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise NotADirectoryError(f"export_model: the output {output_dir!r} exists and is not a folder")
    existing = _existing_export(folder, fmt) if os.path.isdir(folder) else []
    if existing and not overwrite:
        raise FileExistsError(
            f"export_model: {output_dir!r} already holds an export ({', '.join(existing)}); nothing was changed. "
            "Choose another folder, or replace it with overwrite=True (tools/export_model.py: --overwrite)"
        )
    try:
        os.makedirs(folder, exist_ok=True)
        # Whether a file can be made there, rather than the permission bits: root, ACLs,
        # read-only mounts.
        probe, probe_path = tempfile.mkstemp(dir=folder, prefix=".export_model_probe.")
        os.close(probe)
        os.unlink(probe_path)
    except OSError as e:
        denied = isinstance(e, PermissionError) or e.errno == errno.EROFS
        raise (PermissionError if denied else OSError)(
            f"export_model: cannot write into the output folder {output_dir!r} ({e.strerror or e}); "
            "choose a folder you can write to"
        ) from e


def _write_atomically(path: str, write) -> None:
    """``write(temporary_path)``, then the file renamed to ``path``: whole or not at all. The
    temporary name keeps the extension (torch.export.save expects .pt2)."""
    folder, name = os.path.split(path)
    temporary = os.path.join(folder, ".partial." + name)
    try:
        write(temporary)
        os.replace(temporary, path)
    finally:
        if os.path.lexists(temporary):
            os.unlink(temporary)


def _write_openvino_atomically(onnx_program, xml_path: str, transform=None) -> None:
    """The IR under temporary names, then renamed: the weights first, the .xml (what a reader
    opens) last. The .xml finds its weights by its own name, so both keep the same stem."""
    folder, name = os.path.split(xml_path)
    stem = os.path.splitext(name)[0]
    temporary = os.path.join(folder, ".partial." + name)
    pairs = [(temporary[: -len(".xml")] + ".bin", os.path.join(folder, stem + ".bin")), (temporary, xml_path)]
    try:
        onnx_to_openvino(onnx_program, temporary, transform)
        for source, target in pairs:
            os.replace(source, target)
    finally:
        for source, _ in pairs:
            if os.path.lexists(source):
                os.unlink(source)


def check_export_request(
    cfg, fmt: str, output_dir: str, overwrite: bool = False, input_contract: str = "resized_image",
    int8: bool = False, calibration_dataset: Optional[str] = None, calibration_images: int = 100,
) -> None:
    """What ``export_model`` refuses before tracing, checked on its own (tools/export_model.py
    calls it before building the model): the format, a precision or TEST.AUG setting the graph
    cannot hold, an input contract the format or model cannot have, an int8 request a format or the
    installed packages cannot serve (quantize.py), a folder that already holds an
    export (unless ``overwrite``) or cannot be written to. Creates ``output_dir`` if missing."""
    if fmt not in FORMATS:
        raise ValueError(f"export_model: format must be one of {FORMATS}, got {fmt!r}")
    if input_contract not in INPUT_CONTRACTS:
        raise ValueError(f"export_model: input_contract must be one of {INPUT_CONTRACTS}, got {input_contract!r}")
    if input_contract == "raw_image" and int(cfg.INPUT.MIN_SIZE_TEST) > 0:
        if fmt not in ("onnx", "openvino"):
            # torch.export would carry the resize's size rule through every shape of the network
            # (tracing ten times slower); ONNX gets the resize put around the traced graph.
            raise ValueError(
                f"export_model: the raw_image input contract is available for --format onnx and openvino, not {fmt}; "
                "export with input_contract 'resized_image' (tools/export_model.py --input-contract resized_image) "
                "and resize with detcore.export.resize_for_model"
            )
        if cfg.MODEL.KEYPOINT_ON:
            raise ValueError(f"export_model: {RawImageIO.KEYPOINTS_REFUSED}")
    if int8:
        int8_quantization.check_int8_request(fmt, calibration_dataset, calibration_images)
    elif calibration_dataset:
        raise ValueError(
            f"export_model: a calibration dataset ({calibration_dataset!r}) is used only by an int8 export; "
            "add int8 (tools/export_model.py --int8) or drop the calibration dataset"
        )
    if fmt == "openvino":
        try:  # refused now, with what to install, rather than after tracing
            import_openvino()
        except ImportError as e:
            raise ImportError(f"export_model: {e}") from None
        if any(cfg.MODEL.RESNETS.DEFORM_ON_PER_STAGE):
            raise ValueError(
                "export_model: OpenVINO cannot convert this model: MODEL.RESNETS.DEFORM_ON_PER_STAGE puts deformable "
                "convolutions in it, exported as ONNX DeformConv, for which OpenVINO's ONNX frontend has no conversion. "
                "Use --format onnx (onnxruntime runs DeformConv) or exported_program / torchscript."
            )
    if fmt in ("onnx", "openvino") and cfg.TEST.PRECISION != "float32":
        # Measured: the graph converts, but onnxruntime refuses to load it (its CPU provider has
        # no bfloat16 Conv; the standard's Conv takes none before opset 22, detcore writes OPSET).
        raise ValueError(
            f"export_model: {'ONNX' if fmt == 'onnx' else 'OpenVINO'} in TEST.PRECISION {cfg.TEST.PRECISION} is not "
            "supported: onnxruntime has no bfloat16 Conv, so it cannot load such a model (and OpenVINO, converted "
            "from that ONNX, picks its precision when it compiles). Export with TEST.PRECISION float32, or use "
            "--format exported_program / torchscript, which keep the bfloat16 graph."
        )
    if cfg.TEST.AUG.ENABLED:
        raise ValueError(
            "export_model: TEST.AUG.ENABLED is True, but an exported graph runs the model once, without test-time "
            "augmentation (TTA resizes each image to several scales and flips, which a graph taking one image of "
            "the caller's size cannot hold). Export with TEST.AUG.ENABLED False, or run TTA in Python "
            "(detcore.engine.Predictor, tools/test_net.py)"
        )
    _prepare_output_dir(output_dir, fmt, overwrite)


def export_model(
    cfg, model, fmt: str, output_dir: str, sample_image: Optional[torch.Tensor] = None,
    input_layout: str = "CHW", class_names=None, batch_size: Optional[int] = None, overwrite: bool = False,
    input_contract: str = "resized_image",
    int8: bool = False, calibration_dataset: Optional[str] = None, calibration_images: int = 100,
) -> Dict[str, str]:
    """Writes ``output_dir/model.ts``, ``model.pt2``, ``model.onnx`` or ``model.xml`` (+ ``model.bin``)
    and ``output_dir/export.json``.

    Args:
        cfg: the config the model was built from (kept in the JSON).
        model: a detector (GeneralizedRCNN, RetinaNet, ProposalNetwork) with its weights loaded.
        fmt: one of FORMATS.
        sample_image: a uint8 image in ``input_layout`` to trace with (a random one at the
            config's test size otherwise); any size works afterwards.
        class_names: names of the classes, by class id (for the JSON).
        batch_size: None for a graph taking one image; B for one taking B equally sized images
            at once (the sample image is repeated to trace it).
        overwrite: replace the model file and export.json of an earlier export in ``output_dir``
            (refused otherwise); other files there are left as they are.
        input_contract: "resized_image": the graph takes images already resized as export.json's
            ``resize_before`` says and gives detections in their pixels; "raw_image" (ONNX and
            OpenVINO): the graph takes the image as it is, resizes it itself and gives detections
            in its pixels (raw_image.py). The sample image is at the model's resolution either way.
        int8: quantize the ONNX or OpenVINO export to int8 (quantize.py), calibrated on the first
            ``calibration_images`` images of the registered dataset ``calibration_dataset``.

    Returns:
        ``{"model": path, "metadata": path}``.
    """
    detector = ExportableDetector(model, input_layout, batch_size, cfg.TEST.PRECISION)
    image = sample_image if sample_image is not None else _example_image(cfg, input_layout, detector.min_side)
    if batch_size is not None:
        image = image.unsqueeze(0).repeat(batch_size, *([1] * image.dim()))
    try:
        detector.check_input(image)
    except (ValueError, RuntimeError) as e:  # torch._check raises RuntimeError
        raise ValueError(f"export_model: sample_image does not fit the graph: {e}") from None
    check_export_request(
        cfg, fmt, output_dir, overwrite, input_contract, int8, calibration_dataset, calibration_images
    )
    raw_image = None
    if input_contract == "raw_image" and int(cfg.INPUT.MIN_SIZE_TEST) > 0:  # else the model takes it as it is
        raw_image = RawImageIO.of(detector, cfg)
    int8_entry, quantize = None, None
    if int8:
        int8_entry, quantize = _int8_plan(
            cfg, model, fmt, detector, calibration_dataset, calibration_images, resized=raw_image is None
        )
    program = trace_detector(detector, image.to(detector.model.device))
    path = os.path.join(output_dir, _FILE_NAMES[fmt])
    if fmt == "exported_program":
        _write_atomically(path, lambda temporary: torch.export.save(program, temporary))
    elif fmt == "torchscript":
        scripted = script_exported_program(program)
        _write_atomically(path, lambda temporary: torch.jit.save(scripted, temporary))
    elif fmt == "onnx":
        onnx_program = program_to_onnx(program, (image,), detector.output_names, raw_image)
        _write_atomically(path, quantize(onnx_program) if quantize else onnx_program.save)
    else:
        onnx_program = program_to_onnx(program, (image,), detector.output_names, raw_image)
        _write_openvino_atomically(onnx_program, path, quantize(onnx_program) if quantize else None)
    metadata_path = os.path.join(output_dir, "export.json")
    metadata = _metadata(cfg, detector, fmt, os.path.basename(path), class_names, input_contract)
    metadata["int8"] = int8_entry
    if int8:
        metadata["versions"].update(int8_quantization.quantizer_versions(fmt))
    text = strict_json.dumps(metadata, indent=2)

    def write_metadata(temporary):
        with open(temporary, "w") as f:
            f.write(text)

    _write_atomically(metadata_path, write_metadata)
    return {"model": path, "metadata": metadata_path}


def _int8_plan(cfg, model, fmt, detector, calibration_dataset, calibration_images, resized=True):
    """export.json's ``int8`` entry and the step that quantizes the written graph: for ONNX a
    writer of the int8 file from the float ONNXProgram, for OpenVINO a transform of the ov.Model.
    Warns where this CPU would emulate int8. ``resized``: the graph takes resized images (the
    raw_image contract's graph resizes them itself)."""
    int8_quantization.warn_if_int8_emulated()
    inputs = int8_quantization.calibration_inputs(
        cfg, calibration_dataset, calibration_images, detector.input_layout, detector.batch_size, detector.min_side,
        resize=resized,
    )
    keep_float = int8_quantization.float_layers(model)
    entry = int8_quantization.int8_metadata(fmt, calibration_dataset, len(inputs), calibration_images, keep_float)
    if fmt == "openvino":
        def transform_for(onnx_program):
            nodes = int8_quantization.onnx_nodes_of(onnx_program.model_proto, list(keep_float))
            return lambda ov_model: int8_quantization.quantize_openvino_model(ov_model, inputs, nodes)

        return entry, transform_for

    def write_int8_onnx(onnx_program):
        def write(temporary):
            with tempfile.TemporaryDirectory(prefix="detcore_float_onnx_") as folder:
                float_path = os.path.join(folder, "model.onnx")
                onnx_program.save(float_path)
                int8_quantization.quantize_onnx_file(float_path, temporary, inputs, list(keep_float))

        return write

    return entry, write_int8_onnx


def _score_threshold(cfg) -> float:
    """The test score threshold of the config's architecture."""
    if cfg.MODEL.META_ARCHITECTURE == "RetinaNet":
        return cfg.MODEL.RETINANET.SCORE_THRESH_TEST
    return cfg.MODEL.ROI_HEADS.SCORE_THRESH_TEST


def _metadata(cfg, detector: ExportableDetector, fmt: str, file_name: str, class_names, input_contract: str) -> dict:
    min_size, max_size = int(cfg.INPUT.MIN_SIZE_TEST), int(cfg.INPUT.MAX_SIZE_TEST)
    opencv_note = (
        f" (OpenCV's uint8 resize: the config's INPUT.RESIZE_MODE '{cfg.INPUT.RESIZE_MODE}' is not reproduced for the "
        "graph's uint8 input)" if min_size > 0 and cfg.INPUT.RESIZE_MODE != "opencv" else ""
    )
    if input_contract == "raw_image":
        size = (
            f"any height and width whose resize leaves at least {detector.min_side} px on each side (a sides' ratio "
            f"up to about {max_size / detector.min_side:.0f})" if min_size > 0
            else f"any height and width of at least {detector.min_side} px"
        )
        resize_before = "none: the image as it is"
        resize_in_graph = (describe_resize(min_size, max_size) + opencv_note) if min_size > 0 else "none"
        pixels = "the input image's pixels (boxes mapped back from the model's resolution, clipped, empty ones dropped)"
    else:
        size = f"any height and width of at least {detector.min_side} px"
        resize_before = (
            f"shortest edge to {min_size}, longest at most {max_size} (detcore.export.resize_for_model); "
            "boxes come out in the pixels of the image given" if min_size > 0 else "none"
        ) + opencv_note
        resize_in_graph = "none"
        pixels = "the pixels of the image given (the resized image: scale them back to the original)"
    return {
        "format": fmt,
        "file": file_name,
        "input": {
            "name": "image",
            "dtype": "uint8",
            "layout": detector.input_layout,
            "shape": detector.input_shape,
            "channel_order": cfg.INPUT.FORMAT,
            "contract": input_contract,
            "size": size,
            "min_side": detector.min_side,
            "max_side": None,
            "checked": _INPUT_CHECKS[fmt],
            "resize_before": resize_before,
            "resize_in_graph": resize_in_graph,
            "min_size_test": min_size,
            "max_size_test": max_size,
        },
        "boxes_in": pixels,
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
        "onnx_opset": OPSET if fmt in ("onnx", "openvino") else None,
        "config": cfg.dump(),
        "versions": {
            "detcore": detcore.__version__,
            "torch": torch.__version__,
            "python": platform.python_version(),
            **({"openvino": openvino_version()} if fmt == "openvino" else {}),
        },
    }
