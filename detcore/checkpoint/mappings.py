"""Renaming the checkpoints people have to detcore names: one converter per layout.

    format                   where it comes from                            names
    "detcore"                detcore training (maybe DDP "module.")         as the model's
    "torchvision-detection"  torchvision faster/mask/keypointrcnn_resnet50_ backbone.body.layer1..., rpn.head...,
                             fpn, retinanet_resnet50_fpn                    head.classification_head...
    "detectron2"             detectron2 model zoo (.pkl) or training (.pth) backbone.bottom_up.res2.0.conv1.norm...
    "caffe2-resnet"          Detectron / MSRA ImageNet ResNets (R-50.pkl)   res2_0_branch2a_w, res2_0_branch2a_bn_s
    "torchvision-resnet"     ImageNet ResNets in torchvision's names, maybe conv1, layer1.0.bn1 (or module.pre.conv1)
                             under a prefix (DDP, self-supervised wrappers)

(maskrcnn_benchmark.py converts maskrcnn-benchmark's and Detectron's detection checkpoints;
layouts.py holds the table of all layouts and tells them apart.)

A converter fills a `ConvertedCheckpoint`: every key it places (or drops on purpose, with the
reason) is explained; the keys it cannot place are `unknown`, which is what strict format
detection counts. Converters run on placeholder tensors during detection, so they must not
depend on tensor values or shapes to decide names.

The ResNet renaming is regular (see detcore/modeling/backbone/resnet.py): torchvision's layer{k}
is res{k+1}, its conv1/bn1 the stem's; detectron2 keeps a block's norm inside its conv
(conv{j}.norm -> bn{j}) and calls the projection `shortcut` (-> downsample.0 / .1). The
backbone-only formats give names relative to the ResNet body ("stem.conv1.weight"); the loader
places them under the model's body.

Class order: detcore and detectron2 put background last; torchvision first (index 0), so its
cls_score rows are rotated and the background rows of bbox_pred and the mask predictor dropped.
torchvision's RetinaNet has a sigmoid output for "class 0" too (always trained towards 0); its
rows are dropped, so class k is torchvision label k + 1 as for the R-CNNs. RetinaNet's FPN starts
at C3 (three inner blocks where the R-CNNs have four): the level names follow the count. Its
anchors stay in torchvision's ratio-major order: the preset sets CELL_ANCHOR_ORDER accordingly.
detectron2's RetinaNet names are detcore's (head.cls_subnet.0, head.cls_score, ...).
"""
import re
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Set, Tuple

import torch

__all__ = ["ConvertedCheckpoint"]


@dataclass
class ConvertedCheckpoint:
    """A checkpoint renamed to detcore names.

    Attributes:
        format: the layout's name (one of detcore.checkpoint.FORMATS).
        tensors: detcore name -> tensor.
        sources: detcore name -> the checkpoint key it came from (for the report).
        dropped: (checkpoint key, reason) for entries left out on purpose.
        unknown: checkpoint key -> shape for keys no rule of the format maps (reported as
            unexpected).
        body_relative: names are relative to the ResNet body (backbone-only weights).
        synthesized: detcore names made up rather than read (statistics of caffe2's affine-only
            norms); skipped quietly where the model has no such entry.
        notes: sentences for the report.
    """

    format: str
    tensors: Dict[str, torch.Tensor] = field(default_factory=dict)
    sources: Dict[str, str] = field(default_factory=dict)
    dropped: List[Tuple[str, str]] = field(default_factory=list)
    unknown: Dict[str, Tuple[int, ...]] = field(default_factory=dict)
    body_relative: bool = False
    synthesized: Set[str] = field(default_factory=set)
    notes: List[str] = field(default_factory=list)

    def add(self, name: str, tensor: torch.Tensor, source: str) -> None:
        if name in self.tensors:
            raise ValueError(f"checkpoint keys '{self.sources[name]}' and '{source}' both map to '{name}'")
        self.tensors[name] = tensor
        self.sources[name] = source


# --- detcore ----------------------------------------------------------------------------------

# Modules of detcore's (and detectron2's) R-CNN / RetinaNet models: ResNet + FPN backbones (or a
# bare ResNet), RPN, ROI heads, RetinaNet head; and the body-relative names of backbone-only
# checkpoints. Other names belong to other layouts (torchvision's backbone.body, ...).
_DETCORE_NAMESPACES = re.compile(
    r"^(backbone\.(bottom_up|stem|res\d|fpn_lateral\d+|fpn_output\d+|top_block)\.|proposal_generator\.|"
    r"roi_heads\.|head\.|stem\.|res\d\.)"
)
_D2_BODY = re.compile(r"(^|\.)(stem\.conv1\.norm\.|res\d\.\d+\.(conv\d\.norm|shortcut)\.)")
_DETCORE_BODY = re.compile(r"(^|\.)(stem\.bn1\.|res\d\.\d+\.(bn\d|downsample)\.)")
_BODY_RELATIVE = re.compile(r"^(stem|res\d)\.")


def is_detcore_name(key: str) -> bool:
    """Whether ``key`` looks like a detcore R-CNN / RetinaNet name (a model's own checkpoint may
    hold any name; format detection only credits these to the detcore layout)."""
    return bool(_DETCORE_NAMESPACES.match(key)) and not _D2_BODY.search(key)


def convert_detcore(state_dict, out: ConvertedCheckpoint) -> None:
    """Every name kept as it is."""
    for key, tensor in state_dict.items():
        out.add(key, tensor, key)
    if out.tensors and all(_BODY_RELATIVE.match(k) for k in out.tensors):
        out.body_relative = True


# --- torchvision ResNet names ------------------------------------------------------------------

_TV_BLOCK = re.compile(r"^layer(\d)\.(\d+)\.((conv\d|bn\d|downsample\.[01])\.\w+)$")
_RESNET_ANCHOR = "layer1.0.conv1.weight"


def _resnet_prefix(keys: List[str]) -> Optional[str]:
    """The prefix under which a torchvision-named ResNet sits ("" for a bare one), or None."""
    candidates = sorted({k[: -len(_RESNET_ANCHOR)] for k in keys if k.endswith(_RESNET_ANCHOR)}, key=len)
    keyset = set(keys)
    for prefix in candidates:
        if prefix + "conv1.weight" in keyset and (prefix == "" or prefix.endswith(".")):
            return prefix
    return None


def torchvision_resnet_name(key: str) -> Tuple[Optional[str], Optional[str]]:
    """(body-relative detcore name, None) or (None, reason to drop) or (None, None) if unknown."""
    if key.startswith("fc."):
        return None, "classifier head (fc): a detection body has none"
    if key == "conv1.weight":
        return "stem.conv1.weight", None
    if key.startswith("bn1."):
        return "stem." + key, None
    m = _TV_BLOCK.match(key)
    if m:
        return f"res{int(m[1]) + 1}.{m[2]}.{m[3]}", None
    return None, None


def convert_torchvision_resnet(state_dict, out: ConvertedCheckpoint) -> None:
    prefix = _resnet_prefix(list(state_dict))
    if prefix is None:
        raise ValueError(f"torchvision-resnet: no '{_RESNET_ANCHOR}' with a matching 'conv1.weight' among the keys")
    if prefix:
        out.notes.append(f"ResNet weights found under the prefix '{prefix}'")
    out.body_relative = True
    for key, tensor in state_dict.items():
        if not key.startswith(prefix):
            out.unknown[key] = tuple(tensor.shape)
            continue
        name, why = torchvision_resnet_name(key[len(prefix):])
        if name is not None:
            out.add(name, tensor, key)
        elif why is not None:
            out.dropped.append((key, why))
        else:
            out.unknown[key] = tuple(tensor.shape)


# --- torchvision detection ---------------------------------------------------------------------

def rule(pattern: str, rename: Callable[[re.Match], str]) -> Tuple[re.Pattern, Callable[[re.Match], str]]:
    return re.compile(pattern), rename


# (pattern, replacement) on full keys. The optional ".0" / ".0.0" accept both the published
# checkpoints' module layout ("v1": inner_blocks.0.weight, rpn.head.conv.weight,
# mask_head.mask_fcn1.weight, classification_head.conv.2.weight) and the one of current
# torchvision modules (inner_blocks.0.0.weight, rpn.head.conv.0.0.weight, mask_head.0.0.weight,
# classification_head.conv.1.0.weight). The FPN rules are made per checkpoint (its first level).
def _fpn_rules(first_level: int):
    return [
        rule(r"^backbone\.fpn\.inner_blocks\.(\d+)\.(?:0\.)?(weight|bias)$",
              lambda m: f"backbone.fpn_lateral{int(m[1]) + first_level}.{m[2]}"),
        rule(r"^backbone\.fpn\.layer_blocks\.(\d+)\.(?:0\.)?(weight|bias)$",
              lambda m: f"backbone.fpn_output{int(m[1]) + first_level}.{m[2]}"),
    ]  # fmt: skip


_TV_RETINANET_TOWERS = {"classification_head": "cls_subnet", "regression_head": "bbox_subnet"}
_TV_DETECTION_RULES = [
    rule(r"^backbone\.fpn\.extra_blocks\.(p6|p7)\.(weight|bias)$",
          lambda m: f"backbone.top_block.{m[1]}.{m[2]}"),
    # v1: conv.{0,2,4,6} (Conv2d, ReLU pairs); current: conv.{0,1,2,3}.0 (Conv2dNormActivation).
    rule(r"^head\.(classification_head|regression_head)\.conv\.(\d+)\.(weight|bias)$",
          lambda m: f"head.{_TV_RETINANET_TOWERS[m[1]]}.{m[2]}.{m[3]}"),
    rule(r"^head\.(classification_head|regression_head)\.conv\.(\d+)\.0\.(weight|bias)$",
          lambda m: f"head.{_TV_RETINANET_TOWERS[m[1]]}.{2 * int(m[2])}.{m[3]}"),
    rule(r"^head\.classification_head\.cls_logits\.(weight|bias)$", lambda m: f"head.cls_score.{m[1]}"),
    rule(r"^head\.regression_head\.bbox_reg\.(weight|bias)$", lambda m: f"head.bbox_pred.{m[1]}"),
    rule(r"^rpn\.head\.conv\.(?:0\.0\.)?(weight|bias)$",
          lambda m: f"proposal_generator.rpn_head.conv.{m[1]}"),
    rule(r"^rpn\.head\.cls_logits\.(weight|bias)$",
          lambda m: f"proposal_generator.rpn_head.objectness_logits.{m[1]}"),
    rule(r"^rpn\.head\.bbox_pred\.(weight|bias)$",
          lambda m: f"proposal_generator.rpn_head.anchor_deltas.{m[1]}"),
    rule(r"^roi_heads\.box_head\.fc(6|7)\.(weight|bias)$",
          lambda m: f"roi_heads.box_head.fc{int(m[1]) - 5}.{m[2]}"),
    rule(r"^roi_heads\.box_predictor\.(cls_score|bbox_pred)\.(weight|bias)$",
          lambda m: f"roi_heads.box_predictor.{m[1]}.{m[2]}"),
    rule(r"^roi_heads\.mask_head\.mask_fcn(\d+)\.(weight|bias)$",
          lambda m: f"roi_heads.mask_head.mask_fcn{m[1]}.{m[2]}"),
    rule(r"^roi_heads\.mask_head\.(\d+)\.0\.(weight|bias)$",
          lambda m: f"roi_heads.mask_head.mask_fcn{int(m[1]) + 1}.{m[2]}"),
    rule(r"^roi_heads\.mask_predictor\.conv5_mask\.(weight|bias)$",
          lambda m: f"roi_heads.mask_head.deconv.{m[1]}"),
    rule(r"^roi_heads\.mask_predictor\.mask_fcn_logits\.(weight|bias)$",
          lambda m: f"roi_heads.mask_head.predictor.{m[1]}"),
    # Keypoint R-CNN: an nn.Sequential of (conv, ReLU) x 8, so the convs are its even entries.
    rule(r"^roi_heads\.keypoint_head\.(\d*[02468])\.(weight|bias)$",
          lambda m: f"roi_heads.keypoint_head.conv_fcn{int(m[1]) // 2 + 1}.{m[2]}"),
    rule(r"^roi_heads\.keypoint_predictor\.kps_score_lowres\.(weight|bias)$",
          lambda m: f"roi_heads.keypoint_head.score_lowres.{m[1]}"),
]  # fmt: skip

_CLS_SCORE = "roi_heads.box_predictor.cls_score."
_BBOX_PRED = "roi_heads.box_predictor.bbox_pred."
_MASK_PREDICTOR = "roi_heads.mask_head.predictor."


_TV_INNER_BLOCK = re.compile(r"^backbone\.fpn\.inner_blocks\.(\d+)\.")


def convert_torchvision_detection(state_dict, out: ConvertedCheckpoint) -> None:
    # torchvision's FPN always ends at C5 (layer4): with n inner blocks the first is level 6 - n
    # (four for the R-CNNs, from C2; three for RetinaNet, from C3).
    inner = {int(m[1]) for m in map(_TV_INNER_BLOCK.match, state_dict) if m}
    rules = _fpn_rules(6 - len(inner) if inner else 2) + _TV_DETECTION_RULES
    for key, tensor in state_dict.items():
        if key.startswith("backbone.body."):
            name, why = torchvision_resnet_name(key[len("backbone.body."):])
            if name is not None:
                out.add("backbone.bottom_up." + name, tensor, key)
            elif why is not None:
                out.dropped.append((key, why))
            else:
                out.unknown[key] = tuple(tensor.shape)
            continue
        for pattern, rename in rules:
            m = pattern.match(key)
            if m:
                out.add(rename(m), tensor, key)
                break
        else:
            out.unknown[key] = tuple(tensor.shape)
    move_background_last(out)
    _drop_retinanet_background(out)


def move_background_last(out: ConvertedCheckpoint) -> None:
    """torchvision's (and maskrcnn-benchmark's, Detectron's) predictor rows are [background,
    class 1, ..., class K]; detcore's
    cls_score is [class 1..K, background], and its class-specific boxes and masks have no
    background entry."""
    t = out.tensors
    if _CLS_SCORE + "bias" not in t:
        return
    num_rows = t[_CLS_SCORE + "bias"].shape[0]
    for leaf in ("weight", "bias"):
        name = _CLS_SCORE + leaf
        if name in t:
            t[name] = torch.cat([t[name][1:], t[name][:1]])
        name = _BBOX_PRED + leaf
        if name in t and t[name].shape[0] == 4 * num_rows:
            t[name] = t[name][4:]
        name = _MASK_PREDICTOR + leaf
        if name in t and t[name].shape[0] == num_rows:
            t[name] = t[name][1:]
    out.notes.append(
        f"class order: {out.format}'s {num_rows} outputs put background first; moved it last in cls_score "
        f"and dropped the background rows of bbox_pred and the mask predictor ({num_rows - 1} classes: "
        "class k here is its label k + 1)"
    )


_RETINANET_CLS = "head.cls_score."
_RETINANET_BOX = "head.bbox_pred."


def _drop_retinanet_background(out: ConvertedCheckpoint) -> None:
    """torchvision's RetinaNet classifies A anchors x (background + K classes) per location,
    anchor-major; detcore's has A x K. Drop each anchor's background row."""
    t = out.tensors
    if _RETINANET_CLS + "bias" not in t or _RETINANET_BOX + "bias" not in t:
        return
    num_anchors = t[_RETINANET_BOX + "bias"].shape[0] // 4
    rows = t[_RETINANET_CLS + "bias"].shape[0]
    if rows == 0 and t[_RETINANET_BOX + "bias"].numel() == 0:
        return  # shapeless placeholders: detect_format judges a layout by its names alone
    if num_anchors < 1 or rows % num_anchors:
        raise ValueError(
            f"torchvision RetinaNet checkpoint: cls_logits has {rows} rows, not a multiple of the "
            f"{num_anchors} anchors bbox_reg predicts for"
        )
    num_rows = rows // num_anchors
    for leaf in ("weight", "bias"):
        name = _RETINANET_CLS + leaf
        if name in t:
            tensor = t[name]
            t[name] = tensor.reshape(num_anchors, num_rows, *tensor.shape[1:])[:, 1:].reshape(-1, *tensor.shape[1:])
    out.notes.append(
        f"class order: torchvision's RetinaNet has {num_rows} outputs per anchor, the first for background "
        f"(label 0); dropped it ({num_rows - 1} classes: class k here is torchvision label k + 1)"
    )


# --- detectron2 ---------------------------------------------------------------------------------

_D2_RULES = [
    (re.compile(r"(^|\.)stem\.conv1\.norm\."), r"\1stem.bn1."),
    (re.compile(r"(^|\.)(res\d\.\d+)\.conv(\d)\.norm\."), r"\1\2.bn\3."),
    (re.compile(r"(^|\.)(res\d\.\d+)\.shortcut\.norm\."), r"\1\2.downsample.1."),
    (re.compile(r"(^|\.)(res\d\.\d+)\.shortcut\.(weight|bias)$"), r"\1\2.downsample.0.\3"),
]
_D2_DERIVED = re.compile(r"^(pixel_mean|pixel_std)$|anchor_generator\.cell_anchors")


def convert_detectron2(state_dict, out: ConvertedCheckpoint) -> None:
    for key, tensor in state_dict.items():
        if _D2_DERIVED.search(key):
            out.dropped.append((key, "derived from the config (detcore recomputes it)"))
            continue
        if not _DETCORE_NAMESPACES.match(key) or _DETCORE_BODY.search(key):
            out.unknown[key] = tuple(tensor.shape)  # not a detectron2 name
            continue
        name = key
        for pattern, replacement in _D2_RULES:
            name = pattern.sub(replacement, name)
        out.add(name, tensor, key)
    if out.tensors and all(_BODY_RELATIVE.match(k) for k in out.tensors):
        out.body_relative = True


# --- caffe2 (Detectron, MSRA ImageNet) ----------------------------------------------------------

# Each rule gives (detcore module, caffe2 leaf, norm kind or None). A norm is Detectron's
# AffineChannel (scale _s, shift _b: "bn") or, in the ImageNet pickles of detectron2's model zoo
# (MSRA R-50.pkl, R-101.pkl, FAIR X-101-32x8d.pkl, which keep BatchNorm unfused), a BatchNorm with
# its statistics (_bn_gamma, _bn_beta, _bn_running_mean, _bn_running_var; also spelled _bn_s,
# _bn_b, _bn_rm, _bn_riv): such a norm brings its own statistics, and none is synthesized.
_NORM_LEAF = r"(s|b|gamma|beta|rm|riv|running_mean|running_var)"
_C2_RULES = [
    rule(r"^conv1_([wb])$", lambda m: ("stem.conv1", m[1], None)),
    rule(rf"^res_conv1_(bn|gn)_{_NORM_LEAF}$", lambda m: ("stem.bn1", m[2], m[1])),
    rule(r"^(res\d)_(\d+)_branch2([abc])_([wb])$",
          lambda m: (f"{m[1]}.{m[2]}.conv{'abc'.index(m[3]) + 1}", m[4], None)),
    rule(rf"^(res\d)_(\d+)_branch2([abc])_(bn|gn)_{_NORM_LEAF}$",
          lambda m: (f"{m[1]}.{m[2]}.bn{'abc'.index(m[3]) + 1}", m[5], m[4])),
    rule(r"^(res\d)_(\d+)_branch1_([wb])$", lambda m: (f"{m[1]}.{m[2]}.downsample.0", m[3], None)),
    rule(rf"^(res\d)_(\d+)_branch1_(bn|gn)_{_NORM_LEAF}$", lambda m: (f"{m[1]}.{m[2]}.downsample.1", m[4], m[3])),
]  # fmt: skip
_C2_LEAF = {
    "w": "weight", "b": "bias", "s": "weight", "gamma": "weight", "beta": "bias",
    "rm": "running_mean", "running_mean": "running_mean", "riv": "running_var", "running_var": "running_var",
}  # fmt: skip
_STAT_LEAVES = ("rm", "riv", "running_mean", "running_var")
# detcore's FrozenBatchNorm2d eps: running_var = 1 - eps makes its scale exactly the weight.
FROZEN_BN_EPS = 1e-5


def convert_caffe2_blobs(
    state_dict, out: ConvertedCheckpoint, body_prefix: str = "", head_rules=(), stage_prefixes=None
) -> None:
    """caffe2 blob names: the ResNet body (placed under ``body_prefix``, or a stage under its
    ``stage_prefixes`` entry, e.g. a C4 model's res5 in its ROI heads) and, for detection
    checkpoints, ``head_rules``: (pattern, match -> (detcore module, leaf letter)) tried first."""
    stage_prefixes = stage_prefixes or {}
    affine_norms, with_stats = {}, set()
    for key, tensor in state_dict.items():
        if key.endswith("_momentum"):
            out.dropped.append((key, "optimizer state"))
            continue
        if key.startswith("fc1000_") or key.startswith("pred_"):
            out.dropped.append((key, "ImageNet classifier: a detection body has none"))
            continue
        for pattern, rename in head_rules:
            m = pattern.match(key)
            if m:
                module, leaf = rename(m)
                out.add(f"{module}.{_C2_LEAF[leaf]}", tensor, key)
                break
        else:
            for pattern, rename in _C2_RULES:
                m = pattern.match(key)
                if m:
                    module, leaf, norm = rename(m)
                    module = stage_prefixes.get(module.split(".", 1)[0], body_prefix) + module
                    out.add(f"{module}.{_C2_LEAF[leaf]}", tensor, key)
                    if norm == "bn" and leaf in _STAT_LEAVES:
                        with_stats.add(module)
                    elif norm == "bn":
                        affine_norms[module] = (tensor.shape[0], key.rsplit("_", 1)[0])
                    break
            else:
                out.unknown[key] = tuple(tensor.shape)
    # caffe2's AffineChannel is a norm with fixed scale and shift only: give it identity statistics.
    affine_norms = {k: v for k, v in affine_norms.items() if k not in with_stats}
    for module, (channels, source) in affine_norms.items():
        for leaf, value in (("running_mean", 0.0), ("running_var", 1.0 - FROZEN_BN_EPS)):
            name = f"{module}.{leaf}"
            if name not in out.tensors:
                out.add(name, torch.full((channels,), value), f"({source}: affine only, identity statistics)")
                out.synthesized.add(name)
    if affine_norms:
        out.notes.append(
            "caffe2 norms are affine only (scale, shift): their running statistics were set to mean 0, "
            f"var 1 - {FROZEN_BN_EPS}, which FrozenBN turns into exactly that scale and shift"
        )


def convert_caffe2_resnet(state_dict, out: ConvertedCheckpoint) -> None:
    out.body_relative = True
    convert_caffe2_blobs(state_dict, out)
