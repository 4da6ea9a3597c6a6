"""From a checkpoint of any known format to a state dict in the model's own names, with a report.

    state_dict, report = load_converted_state_dict("model_final_f10217.pkl", model)
    model.load_state_dict(state_dict, strict=False)   # the report says what strict=False allows
    logger.info("%s", report)

Matching against the model decides each converted tensor's fate: loaded when the model has the
name and the shape; re-initialized when it is a class-count dependent predictor layer of another
class count (COCO weights fine-tuned on a 3-class dataset); otherwise reported as a shape
mismatch or unexpected. Model entries nobody provides are reported missing.
"""
from typing import Dict, Optional, Tuple

import torch
from torch import nn

from detcore.modeling.backbone.resnet import BottleneckBlock

from .io import read_checkpoint
from .layouts import convert_keys, layout
from .mappings import ConvertedCheckpoint
from .report import LoadReport

__all__ = ["convert_state_dict", "load_converted_state_dict", "PREDICTOR_PREFIXES"]

# Layers whose output size is the class count: they cannot carry over to another class count.
PREDICTOR_PREFIXES = (
    "roi_heads.box_predictor.cls_score.",
    "roi_heads.box_predictor.bbox_pred.",
    "roi_heads.mask_head.predictor.",
    "head.cls_score.",  # RetinaNet's classifier (its box deltas do not depend on the classes)
)
# Where backbone-only weights go when no model is given: the body of detcore's ResNet-FPN.
_DEFAULT_BODY_PREFIX = "backbone.bottom_up."
_BODY_ANCHOR = "stem.conv1.weight"
_STEP_COUNTER = "BatchNorm step counter (FrozenBN keeps none)"


def _shape(t: torch.Tensor) -> Tuple[int, ...]:
    return tuple(int(s) for s in t.shape)


def _body_prefix(model_keys) -> Optional[str]:
    found = sorted((k[: -len(_BODY_ANCHOR)] for k in model_keys if k.endswith(_BODY_ANCHOR)), key=len)
    return found[0] if found else None


def _num_classes(state: Dict[str, torch.Tensor]) -> Optional[int]:
    """The foreground classes a state dict (in detcore names) predicts: the R-CNN classifier's
    rows less background, or RetinaNet's rows per anchor (anchors: its box rows / 4)."""
    if PREDICTOR_PREFIXES[0] + "bias" in state:
        return int(state[PREDICTOR_PREFIXES[0] + "bias"].shape[0]) - 1
    if "head.cls_score.bias" in state and "head.bbox_pred.bias" in state:
        num_anchors = int(state["head.bbox_pred.bias"].shape[0]) // 4
        return int(state["head.cls_score.bias"].shape[0]) // max(num_anchors, 1)
    return None


def _stage_homes(model_keys, body_prefix: str) -> Dict[str, str]:
    """For each ResNet stage the body lacks but the model has elsewhere (a C4 model's res5, in
    its ROI heads), the prefix it lives under there."""
    homes = {}
    for stage in ("res2", "res3", "res4", "res5"):
        anchor = f"{stage}.0."
        if any(k.startswith(body_prefix + anchor) for k in model_keys):
            continue
        found = {k[: k.index(anchor)] for k in model_keys if k.startswith(anchor) or f".{anchor}" in k}
        if len(found) == 1:
            homes[stage] = found.pop()
    return homes


def _place(converted: ConvertedCheckpoint, prefix: str, stage_homes: Optional[Dict[str, str]] = None) -> ConvertedCheckpoint:
    """Prefix the names of backbone-only weights with the model's body path (or, for a stage in
    `stage_homes`, with the path where the model keeps that stage)."""
    stage_homes = stage_homes or {}
    placed = ConvertedCheckpoint(
        format=converted.format,
        dropped=list(converted.dropped),
        unknown=dict(converted.unknown),
        notes=list(converted.notes),
    )
    def where(name):
        return stage_homes.get(name.split(".", 1)[0], prefix) + name

    for name, tensor in converted.tensors.items():
        placed.add(where(name), tensor, converted.sources[name])
    placed.synthesized = {where(n) for n in converted.synthesized}
    return placed


def _setting_notes(fmt: str, model: nn.Module) -> list:
    """Warn about model settings that do not fit weights of this format (both give a model that
    runs, and quietly computes something else)."""
    row = layout(fmt)
    notes = []
    wanted = row.stride_in_1x1
    for module in model.modules():
        # The first block of a downsampling stage shows where the stride sits.
        if wanted is not None and isinstance(module, BottleneckBlock) and module.downsample is not None:
            if module.downsample[0].stride == (2, 2):
                in_1x1 = module.conv1.stride == (2, 2)
                if in_1x1 != wanted:
                    notes.append(
                        f"{fmt} weights stride on the {'1x1' if wanted else '3x3'} conv but the model on the "
                        f"{'1x1' if in_1x1 else '3x3'}: set MODEL.RESNETS.STRIDE_IN_1X1 {wanted}"
                    )
                break
    input_format = getattr(model, "input_format", None)
    if input_format is not None and row.input_format is not None and input_format != row.input_format:
        notes.append(
            f"{fmt} weights expect {row.input_format} images but the model takes {input_format} (INPUT.FORMAT); "
            "check INPUT.FORMAT, MODEL.PIXEL_MEAN and MODEL.PIXEL_STD"
        )
    if notes and row.presets:
        notes.append(f"{' or '.join(row.presets)} runs {fmt} weights as their source does")
    return notes


def _names_the_model(state_dict, model_state) -> bool:
    """Whether most of the checkpoint's keys (less a DDP "module." prefix) are the model's own."""
    keys = [k[len("module."):] if k.startswith("module.") else k for k in state_dict]
    return bool(keys) and 2 * sum(k in model_state for k in keys) >= len(keys)


def convert_state_dict(
    state_dict: Dict[str, torch.Tensor],
    model: Optional[nn.Module] = None,
    *,
    format: str = "auto",
    source: str = "<state dict>",
) -> Tuple[Dict[str, torch.Tensor], LoadReport]:
    """Rename `state_dict` (any format of detcore.checkpoint.FORMATS) to detcore names.

    With `model`, keep only what fits it (see the module docstring) and report every key; without
    one, return every converted tensor (backbone-only weights placed under the ResNet-FPN body,
    "backbone.bottom_up.") and report only the renaming.

    Returns:
        (detcore name -> tensor, LoadReport). Load with ``model.load_state_dict(sd, strict=False)``.
    """
    model_state = model.state_dict() if model is not None else None
    if format == "auto" and model_state is not None and _names_the_model(state_dict, model_state):
        format = "detcore"  # any model's own checkpoint, not only the R-CNNs detect_format knows
    try:
        converted = convert_keys(state_dict, format)
    except ValueError as e:  # the format cannot be told, keys collide, ...: say which file
        raise ValueError(f"{source}: {e}") from None
    report = LoadReport(source=source, format=converted.format, notes=list(converted.notes))
    report.dropped.extend(converted.dropped)

    if model is None:
        if converted.body_relative:
            converted = _place(converted, _DEFAULT_BODY_PREFIX)
        report.unexpected.extend((k, k, shape) for k, shape in converted.unknown.items())
        out = {}
        for name, tensor in converted.tensors.items():
            if name.endswith(".num_batches_tracked"):
                report.dropped.append((converted.sources[name], _STEP_COUNTER))
            else:
                out[name] = tensor
                report.mapped.append((converted.sources[name], name, _shape(tensor)))
        return out, report

    if converted.body_relative:
        prefix = _body_prefix(model_state)
        if prefix is None:
            report.notes.append("backbone-only weights, but the model has no ResNet body (no '*stem.conv1.weight')")
            prefix = "<no body>."
        homes = _stage_homes(model_state, prefix)
        converted = _place(converted, prefix, homes)
        report.notes.append(f"backbone-only weights: placed under '{prefix}'; the rest keeps its initialization")
        for stage, home in homes.items():
            report.notes.append(f"the body has no {stage}: the model's '{home}{stage}' takes it")

    tensors = converted.tensors
    # Predictor layers of another class count are left to the model's initialization, all together.
    predictor = [n for n in tensors if n.startswith(PREDICTOR_PREFIXES) and n in model_state]
    if any(_shape(tensors[n]) != _shape(model_state[n]) for n in predictor):
        ckpt_k = _num_classes(tensors)
        model_k = _num_classes(model_state)
        for n in predictor:
            report.reinitialized.append(
                (converted.sources[n], n, _shape(tensors[n]), _shape(model_state[n]))
            )
        report.notes.append(
            f"the checkpoint predicts {ckpt_k} classes and the model {model_k}: its predictor layers "
            f"({', '.join(sorted({n.rsplit('.', 1)[0] for n in predictor}))}) keep their fresh initialization"
        )
        reinit = set(predictor)
    else:
        reinit = set()

    out = {}
    for name, tensor in tensors.items():
        src = converted.sources[name]
        if name in reinit:
            continue
        if name not in model_state:
            if name in converted.synthesized:
                continue
            if name.endswith(".num_batches_tracked"):
                report.dropped.append((src, _STEP_COUNTER))
            else:
                report.unexpected.append((src, name, _shape(tensor)))
            continue
        if _shape(tensor) != _shape(model_state[name]):
            report.shape_mismatch.append((src, name, _shape(tensor), _shape(model_state[name])))
            continue
        out[name] = tensor
        report.mapped.append((src, name, _shape(tensor)))
    report.unexpected.extend((k, k, shape) for k, shape in converted.unknown.items())
    provided = set(out) | reinit | {name for _, name, _, _ in report.shape_mismatch}
    report.missing.extend((k, _shape(v)) for k, v in model_state.items() if k not in provided)
    report.notes.extend(_setting_notes(converted.format, model))
    if not out:
        raise ValueError(
            f"no tensor of {source} fits the model (format {converted.format}):\n{report.table()}"
        )
    return out, report


def load_converted_state_dict(
    path, model: nn.Module, *, format: str = "auto"
) -> Tuple[Dict[str, torch.Tensor], LoadReport]:
    """Read the checkpoint at `path` safely, recognize its format by content and convert it for
    `model` (see `convert_state_dict`). Returns (model name -> tensor, LoadReport); load with
    ``model.load_state_dict(state_dict, strict=False)``."""
    state_dict, skipped = read_checkpoint(path)
    out, report = convert_state_dict(state_dict, model, format=format, source=str(path))
    report.dropped.extend((k, f"skipped: {why}") for k, why in skipped)
    return out, report
