"""maskrcnn-benchmark's checkpoints and the Detectron (caffe2) detection checkpoints it loads.

    format               where it comes from                          names
    "maskrcnn-benchmark" maskrcnn-benchmark training (.pth: "model",  backbone.body.stem.conv1, backbone.fpn.fpn_inner2,
                         "optimizer", "scheduler", "iteration")      rpn.head.conv, roi_heads.box.feature_extractor.fc6
                                                                     (C4: roi_heads.box.feature_extractor.head.layer4)
    "caffe2-detection"   Detectron's model zoo (model_final.pkl:      res2_0_branch2a_w, fpn_inner_res5_2_sum_w,
                         "blobs", "cfg")                             conv_rpn_fpn2_w, fc6_w, _[mask]_fcn1_w
                                                                     (C4: conv_rpn_w, res5_* as the box head)

Both come from one code lineage (maskrcnn-benchmark re-implemented Detectron in PyTorch and
loads its .pkl files): a Mask R-CNN (FPN or C4) with a ResNet body that strides on the 1x1
conv, sees BGR 0-255 pixels, and works in the legacy "+1" box convention; configs/maskrcnn_benchmark/
reproduces those settings (e2e_mask_rcnn_R_50_FPN_1x.yaml, e2e_mask_rcnn_R_50_C4_1x.yaml).
A file without FPN weights is a C4 model: its body (stem .. res4) is detcore's whole backbone
and its res5 stage, the box head there, becomes the ROI heads' ``roi_heads.res5``.
maskrcnn-benchmark's C4 mask head shares the box head's feature extractor
(SHARE_BOX_FEATURE_EXTRACTOR), so its .pth holds the res5 tensors twice, also under
``roi_heads.mask.feature_extractor.head``: the copy is dropped once checked equal (detcore's
Res5ROIHeads has one res5 for both). maskrcnn-benchmark's body is torchvision-named under
``backbone.body`` but keeps its stem apart (``stem.conv1``, ``stem.bn1``), which is what tells it
from a torchvision detection checkpoint.

Both put background first in the classifier (as torchvision): moved last here. FPN levels:
maskrcnn-benchmark numbers its lateral / output convs from 1 for the finest body stage (res2 ->
``fpn_inner1``), Detectron names them by the body output they read (``fpn_inner_res4_5_sum_lateral``
is the res4 lateral of an R-50, ``fpn_res4_5_sum`` its output conv).

Norms: maskrcnn-benchmark's FrozenBatchNorm2d has no eps (scale = weight / sqrt(running_var)),
detcore's adds 1e-5, so running_var is lowered by 1e-5 to compute the same scale. Detectron's
norms are caffe2 AffineChannel (scale and shift only).
"""
import re

import torch

from .mappings import (
    FROZEN_BN_EPS,
    ConvertedCheckpoint,
    convert_caffe2_blobs,
    move_background_last,
    rule,
    torchvision_resnet_name,
)

__all__ = ["convert_caffe2_detection", "convert_maskrcnn_benchmark"]

_FPN_BODY = "backbone.bottom_up."  # an FPN model's ResNet body
_C4_BODY = "backbone."  # a C4 model's: the backbone is the body
_C4_RES5 = "roi_heads."  # where a C4 model keeps res5

# --- maskrcnn-benchmark (.pth) --------------------------------------------------------------------

_MB_RULES = [
    rule(r"^backbone\.fpn\.fpn_inner(\d)\.(weight|bias)$", lambda m: f"backbone.fpn_lateral{int(m[1]) + 1}.{m[2]}"),
    rule(r"^backbone\.fpn\.fpn_layer(\d)\.(weight|bias)$", lambda m: f"backbone.fpn_output{int(m[1]) + 1}.{m[2]}"),
    rule(r"^rpn\.head\.conv\.(weight|bias)$", lambda m: f"proposal_generator.rpn_head.conv.{m[1]}"),
    rule(r"^rpn\.head\.cls_logits\.(weight|bias)$", lambda m: f"proposal_generator.rpn_head.objectness_logits.{m[1]}"),
    rule(r"^rpn\.head\.bbox_pred\.(weight|bias)$", lambda m: f"proposal_generator.rpn_head.anchor_deltas.{m[1]}"),
    rule(r"^roi_heads\.box\.feature_extractor\.fc(6|7)\.(weight|bias)$",
         lambda m: f"roi_heads.box_head.fc{int(m[1]) - 5}.{m[2]}"),
    rule(r"^roi_heads\.box\.predictor\.(cls_score|bbox_pred)\.(weight|bias)$",
         lambda m: f"roi_heads.box_predictor.{m[1]}.{m[2]}"),
    rule(r"^roi_heads\.mask\.feature_extractor\.mask_fcn(\d+)\.(weight|bias)$",
         lambda m: f"roi_heads.mask_head.mask_fcn{m[1]}.{m[2]}"),
    rule(r"^roi_heads\.mask\.predictor\.conv5_mask\.(weight|bias)$", lambda m: f"roi_heads.mask_head.deconv.{m[1]}"),
    rule(r"^roi_heads\.mask\.predictor\.mask_fcn_logits\.(weight|bias)$",
         lambda m: f"roi_heads.mask_head.predictor.{m[1]}"),
]  # fmt: skip
_MB_DERIVED = re.compile(r"^rpn\.anchor_generator\.cell_anchors\.\d+$")
_MB_C4_BOX_RES5 = "roi_heads.box.feature_extractor.head."
_MB_C4_MASK_RES5 = "roi_heads.mask.feature_extractor.head."
_MB_STEM = re.compile(r"^stem\.(conv1\.weight|bn1\.(weight|bias|running_mean|running_var))$")


def _body_name(key: str, prefix: str):
    """(detcore name, reason to drop) of a key under backbone.body (either may be None)."""
    if _MB_STEM.match(key):
        return prefix + key, None
    if key.startswith(("conv1.", "bn1.")):
        return None, None  # torchvision's stem names: not maskrcnn-benchmark's
    name, why = torchvision_resnet_name(key)
    return (None if name is None else prefix + name), why


def _res5_head_name(key: str):
    """(detcore name, None) of a C4 box head key (its ResNetHead's ``layer4.*``), else (None, None)."""
    if not key.startswith("layer4."):
        return None, None
    name, _ = torchvision_resnet_name(key)
    return (None if name is None else _C4_RES5 + name), None


def _shared_res5_copy(key: str, tensor, state_dict):
    """The reason to drop a C4 mask head's res5 key: the same tensor as the box head's."""
    twin = _MB_C4_BOX_RES5 + key[len(_MB_C4_MASK_RES5):]
    if twin not in state_dict:
        return None
    if not torch.equal(tensor, state_dict[twin]):
        raise ValueError(
            f"'{key}' differs from '{twin}': the mask head has a res5 of its own (SHARE_BOX_FEATURE_EXTRACTOR "
            "False), which detcore's Res5ROIHeads cannot hold (one res5 serves boxes and masks)"
        )
    return f"the box head's res5 ('{twin}'): the mask head shares it (SHARE_BOX_FEATURE_EXTRACTOR)"


def convert_maskrcnn_benchmark(state_dict, out: ConvertedCheckpoint) -> None:
    lowered = 0
    body = _FPN_BODY if any(k.startswith("backbone.fpn.") for k in state_dict) else _C4_BODY
    for key, tensor in state_dict.items():
        if _MB_DERIVED.match(key):
            out.dropped.append((key, "anchors: derived from the config (the anchor generator recomputes them)"))
            continue
        if key.startswith(_MB_C4_MASK_RES5):
            why = _shared_res5_copy(key, tensor, state_dict)
            if why is not None:
                out.dropped.append((key, why))
            else:
                out.unknown[key] = tuple(tensor.shape)
            continue
        if key.startswith(("backbone.body.", _MB_C4_BOX_RES5)):
            if key.startswith("backbone.body."):
                name, why = _body_name(key[len("backbone.body."):], body)
            else:
                name, why = _res5_head_name(key[len(_MB_C4_BOX_RES5):])
            if name is not None and name.endswith(".running_var"):
                tensor = tensor - FROZEN_BN_EPS
                lowered += 1
        else:
            name, why = None, None
            for pattern, rename in _MB_RULES:
                m = pattern.match(key)
                if m:
                    name = rename(m)
                    break
        if name is not None:
            out.add(name, tensor, key)
        elif why is not None:
            out.dropped.append((key, why))
        else:
            out.unknown[key] = tuple(tensor.shape)
    if lowered:
        out.notes.append(
            f"maskrcnn-benchmark's FrozenBatchNorm2d has no eps: {lowered} running_var tensors lowered by "
            f"{FROZEN_BN_EPS} so that detcore's sqrt(var + eps) gives the same scale"
        )
    move_background_last(out)


# --- Detectron (caffe2) detection (.pkl) ------------------------------------------------------------

# (pattern, match -> (detcore module, caffe2 leaf letter)); the ResNet body follows caffe2-resnet's rules.
_C2_DETECTION_RULES = [
    # The top lateral reads res5 directly; the others are "_lateral" convs merged top-down.
    rule(r"^fpn_inner_res(\d)_\d+_sum(?:_lateral)?_([wb])$", lambda m: (f"backbone.fpn_lateral{m[1]}", m[2])),
    rule(r"^fpn_res(\d)_\d+_sum_([wb])$", lambda m: (f"backbone.fpn_output{m[1]}", m[2])),
    # One RPN head shared by all levels: its weights live on the finest level (fpn2).
    # (A C4 model's single-level RPN has no level suffix.)
    rule(r"^conv_rpn(?:_fpn2)?_([wb])$", lambda m: ("proposal_generator.rpn_head.conv", m[1])),
    rule(r"^rpn_cls_logits(?:_fpn2)?_([wb])$", lambda m: ("proposal_generator.rpn_head.objectness_logits", m[1])),
    rule(r"^rpn_bbox_pred(?:_fpn2)?_([wb])$", lambda m: ("proposal_generator.rpn_head.anchor_deltas", m[1])),
    rule(r"^fc(6|7)_([wb])$", lambda m: (f"roi_heads.box_head.fc{int(m[1]) - 5}", m[2])),
    rule(r"^(cls_score|bbox_pred)_([wb])$", lambda m: (f"roi_heads.box_predictor.{m[1]}", m[2])),
    rule(r"^_\[mask\]_fcn(\d+)_([wb])$", lambda m: (f"roi_heads.mask_head.mask_fcn{m[1]}", m[2])),
    rule(r"^conv5_mask_([wb])$", lambda m: ("roi_heads.mask_head.deconv", m[1])),
    rule(r"^mask_fcn_logits_([wb])$", lambda m: ("roi_heads.mask_head.predictor", m[1])),
]  # fmt: skip


def convert_caffe2_detection(state_dict, out: ConvertedCheckpoint) -> None:
    if any(k.startswith("fpn_") for k in state_dict):
        convert_caffe2_blobs(state_dict, out, body_prefix=_FPN_BODY, head_rules=_C2_DETECTION_RULES)
    else:  # C4: res5 is the box head (Detectron's add_ResNet_roi_conv5_head names it res5_* too)
        stage_prefixes = {"res5": _C4_RES5}
        convert_caffe2_blobs(
            state_dict, out, body_prefix=_C4_BODY, head_rules=_C2_DETECTION_RULES, stage_prefixes=stage_prefixes
        )
    move_background_last(out)
