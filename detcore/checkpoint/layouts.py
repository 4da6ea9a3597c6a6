"""The checkpoint layouts detcore reads, one row each, and telling them apart strictly.

A layout is a family of checkpoint files: where they come from, a *signature* (key patterns every
file of the family has, e.g. torchvision's ResNet stem ``backbone.body.conv1.weight`` beside its
FPN or heads), and the converter that renames its keys to detcore's (mappings.py,
maskrcnn_benchmark.py). Recognizing a file: every layout whose signature is complete converts
its keys; the one that explains the most of them (places them, or drops them on purpose) wins,
provided it leaves at most `MAX_UNEXPLAINED` of them unexplained. The few it may leave (a
projection head beside a self-supervised ResNet) are reported as unexpected by the loader.

A file that no layout fits is an error that names the closest layouts, what of their signature
is missing and which keys they could not place: never a silent partial load. Two layouts can
share most names (maskrcnn-benchmark's body is torchvision's under ``backbone.body.``), so a
prefix alone never decides.

A new family of checkpoints is a new row in `LAYOUTS` (with its converter); nothing else changes:
detection, the error message, ``--format`` and the loader's notes read the table. The steps
(converter, signature and excludes, preset, tests) are in docs/adding_a_component.md, "A
checkpoint format". A family with several architectures (FPN and C4) stays one row: its
signature entry alternates and its converter places the keys per file.
"""
import re
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import torch

from .maskrcnn_benchmark import convert_caffe2_detection, convert_maskrcnn_benchmark
from .mappings import (
    ConvertedCheckpoint,
    convert_caffe2_resnet,
    convert_detcore,
    convert_detectron2,
    is_detcore_name,
    convert_torchvision_detection,
    convert_torchvision_resnet,
)

__all__ = ["FORMATS", "LAYOUTS", "MAX_UNEXPLAINED", "Layout", "convert_keys", "detect_format", "layout", "match_layouts"]

# Largest share of a file's keys its layout may leave unexplained.
MAX_UNEXPLAINED = 0.05

MASKRCNN_BENCHMARK_PRESETS = (
    "configs/maskrcnn_benchmark/e2e_mask_rcnn_R_50_FPN_1x.yaml",
    "configs/maskrcnn_benchmark/e2e_mask_rcnn_R_50_C4_1x.yaml",
)


@dataclass(frozen=True)
class Layout:
    """One family of checkpoint files.

    Attributes:
        format: its name (``format=`` of the loaders, ``--format`` of tools/convert_checkpoint.py).
        source: where such files come from, for messages and the README.
        signature: (description, regex) pairs; a file of this layout has, for each, a key the
            regex finds (``re.search``), after any DDP "module." prefix is removed.
        excludes: (description, regex) of keys its files never hold (a backbone-only layout
            excludes detection heads): one such key rules the layout out.
        explains: for a converter that keeps any name (detcore's), the names detection credits
            to the layout; the others count as unexplained.
        convert: fills a ConvertedCheckpoint from {key: tensor}.
        keeps_ddp_prefix: the converter finds its own prefix (which may start with "module.").
        stride_in_1x1, input_format: what the weights were trained with (MODEL.RESNETS.STRIDE_IN_1X1,
            INPUT.FORMAT), when the layout says; the loader notes a model set otherwise.
        presets: the configs that run such weights as their source does (one per architecture
            of the family, e.g. FPN and C4), if any.
    """

    format: str
    source: str
    signature: Tuple[Tuple[str, str], ...]
    convert: Callable[[Dict[str, torch.Tensor], ConvertedCheckpoint], None]
    excludes: Optional[Tuple[str, str]] = None
    explains: Optional[Callable[[str], bool]] = None
    keeps_ddp_prefix: bool = False
    stride_in_1x1: Optional[bool] = None
    input_format: Optional[str] = None
    presets: Tuple[str, ...] = ()
    _patterns: Tuple[re.Pattern, ...] = field(init=False, repr=False, compare=False)
    _excludes: Optional[re.Pattern] = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "_patterns", tuple(re.compile(p) for _, p in self.signature))
        object.__setattr__(self, "_excludes", None if self.excludes is None else re.compile(self.excludes[1]))

    def missing_signature(self, keys: Sequence[str]) -> List[str]:
        """Descriptions of the signature entries no key matches."""
        return [what for (what, _), pattern in zip(self.signature, self._patterns) if not any(pattern.search(k) for k in keys)]

    def excluded_keys(self, keys: Sequence[str]) -> List[str]:
        """The keys this layout's files never hold."""
        if self._excludes is None:
            return []
        return sorted(k for k in keys if self._excludes.search(k))


LAYOUTS: Tuple[Layout, ...] = (
    Layout(
        "detcore",
        "detcore training (tools/train_net.py, Checkpointer)",
        (("a detcore ResNet body, R-CNN or RetinaNet head",
          r"(^|\.)(stem\.bn1\.|res\d\.\d+\.(bn\d|downsample)\.)|^(proposal_generator|roi_heads|head)\."),),
        convert_detcore,
        explains=is_detcore_name,
    ),
    Layout(
        "detectron2",
        "detectron2 model zoo (model_final_*.pkl) or training (.pth)",
        (("a detectron2 ResNet body (stem.conv1.norm, resN.i.convJ.norm, shortcut)",
          r"(^|\.)(stem\.conv1\.norm\.|res\d\.\d+\.(conv\d\.norm|shortcut)\.)"),),
        convert_detectron2,
        presets=("configs/detectron2/mask_rcnn_R_50_FPN_1x.yaml", "configs/detectron2/mask_rcnn_R_50_C4_1x.yaml",
                 "configs/detectron2/keypoint_rcnn_R_50_FPN_1x.yaml", "configs/detectron2/retinanet_R_50_FPN_1x.yaml"),
    ),
    Layout(
        "torchvision-detection",
        "torchvision fasterrcnn / maskrcnn / keypointrcnn / retinanet_resnet50_fpn (state_dict or published .pth)",
        (("torchvision's ResNet stem 'backbone.body.conv1.weight'", r"^backbone\.body\.conv1\.weight$"),
         ("torchvision's FPN (backbone.fpn.inner_blocks, layer_blocks)", r"^backbone\.fpn\.(inner|layer)_blocks\.")),
        convert_torchvision_detection,
        stride_in_1x1=False,
        input_format="RGB",
        presets=("configs/torchvision/mask_rcnn_R_50_FPN.yaml", "configs/torchvision/faster_rcnn_R_50_FPN.yaml",
                 "configs/torchvision/keypoint_rcnn_R_50_FPN.yaml", "configs/torchvision/retinanet_R_50_FPN.yaml"),
    ),
    Layout(
        "maskrcnn-benchmark",
        "maskrcnn-benchmark training (.pth with model / optimizer / scheduler / iteration)",
        (("maskrcnn-benchmark's ResNet stem 'backbone.body.stem.conv1.weight'", r"^backbone\.body\.stem\.conv1\.weight$"),
         ("maskrcnn-benchmark's FPN (backbone.fpn.fpn_inner1 ...) or C4 box head (roi_heads.box.feature_extractor.head.layer4)",
          r"^backbone\.fpn\.fpn_(inner|layer)\d|^roi_heads\.box\.feature_extractor\.head\.layer4\.")),
        convert_maskrcnn_benchmark,
        excludes=("a RetinaNet head or P6/P7 convs (rpn.head.cls_tower, backbone.fpn.top_blocks), which its Mask "
                  "R-CNN models never have", r"^rpn\.head\.(cls|bbox)_tower\.|^backbone\.fpn\.top_blocks\."),
        stride_in_1x1=True,
        input_format="BGR",
        presets=MASKRCNN_BENCHMARK_PRESETS,
    ),
    Layout(
        "caffe2-detection",
        "Detectron (caffe2) detection model zoo (model_final.pkl with 'blobs')",
        (("a caffe2 ResNet body (res2_0_branch2a_w ...)", r"^res\d_\d+_branch2a_w$"),
         ("Detectron's FPN (fpn_inner_res5_2_sum_w ...) or C4 RPN (conv_rpn_w)", r"^fpn_inner_res\d_\d+_sum|^conv_rpn_w$")),
        convert_caffe2_detection,
        stride_in_1x1=True,
        input_format="BGR",
        presets=MASKRCNN_BENCHMARK_PRESETS,
    ),
    Layout(
        "caffe2-resnet",
        "Detectron / MSRA ImageNet ResNets in caffe2 names (R-50.pkl)",
        (("a caffe2 ResNet body (conv1_w, res2_0_branch2a_w ...)", r"^(conv1_w|res\d_\d+_branch2a_w)$"),),
        convert_caffe2_resnet,
        excludes=("Detectron detection heads (fpn_*, conv_rpn*, rpn_*, fc6_*, cls_score_*, conv5_mask_*)",
                  r"^(fpn_|conv_rpn|rpn_|fc6_|cls_score_|bbox_pred_|conv5_mask_|mask_fcn_logits_)"),
        stride_in_1x1=True,
        input_format="BGR",
    ),
    Layout(
        "torchvision-resnet",
        "ImageNet ResNets in torchvision's names, bare or under a prefix (DDP, self-supervised wrappers)",
        (("torchvision's ResNet 'layer1.0.conv1.weight'", r"(^|\.)layer1\.0\.conv1\.weight$"),),
        convert_torchvision_resnet,
        excludes=("detection heads (an FPN, RPN or ROI heads)", r"(^|\.)(fpn|rpn|roi_heads|proposal_generator)\."),
        keeps_ddp_prefix=True,
        stride_in_1x1=False,
        input_format="RGB",
    ),
)

FORMATS: Tuple[str, ...] = tuple(row.format for row in LAYOUTS)


def layout(format: str) -> Layout:
    """The row of `LAYOUTS` named ``format``."""
    for row in LAYOUTS:
        if row.format == format:
            return row
    raise ValueError(f"format must be 'auto' or one of {FORMATS}, got {format!r}")


@dataclass
class LayoutMatch:
    """How well one layout fits a checkpoint.

    Attributes:
        layout: the row.
        missing: signature entries the checkpoint lacks (it then does not fit, however many
            keys the converter places).
        excluded: keys the layout's files never hold (any rules it out).
        unexplained: keys the converter could not place (nor drop on purpose).
        error: the converter's error (e.g. two keys for one name), if it failed.
        converted: the conversion, unless the converter failed.
        num_keys: keys of the checkpoint.
    """

    layout: Layout
    num_keys: int
    missing: List[str] = field(default_factory=list)
    excluded: List[str] = field(default_factory=list)
    unexplained: List[str] = field(default_factory=list)
    error: Optional[str] = None
    converted: Optional[ConvertedCheckpoint] = None

    @property
    def fits(self) -> bool:
        return (
            self.converted is not None
            and not self.missing
            and not self.excluded
            and len(self.unexplained) <= MAX_UNEXPLAINED * self.num_keys
            and len(self.unexplained) < self.num_keys
        )

    def closeness(self) -> Tuple[float, float]:
        """Sort key, smaller is closer: the share of keys left unexplained (or ruling it out),
        then of the signature missing. A layout whose whole signature is there but whose
        converter refused the file (e.g. a C4 mask head with a res5 of its own) comes first: its
        refusal is the one to read."""
        if self.converted is None:
            unexplained = 1.0 if self.missing else 0.0
        else:
            unexplained = len(self.unexplained) / max(self.num_keys, 1)
        return (unexplained + len(self.excluded) / max(self.num_keys, 1), len(self.missing) / max(len(self.layout.signature), 1))

    def describe(self, examples: int = 4) -> str:
        what = []
        if self.missing:
            what.append("lacks " + "; ".join(self.missing))
        if self.excluded:
            sample = ", ".join(self.excluded[:examples]) + (", ..." if len(self.excluded) > examples else "")
            what.append(f"holds {self.layout.excludes[0]}, which its files never have: {sample}")
        if self.error:
            what.append(self.error)
        if self.converted is not None:
            sample = ", ".join(self.unexplained[:examples]) + (", ..." if len(self.unexplained) > examples else "")
            what.append(f"{len(self.unexplained)} of {self.num_keys} keys unexplained" + (f" (e.g. {sample})" if sample else ""))
        return f"{self.layout.format} ({self.layout.source}): " + "; ".join(what)


def _strip_ddp(state_dict: Dict[str, torch.Tensor]) -> Optional[Dict[str, torch.Tensor]]:
    """The state dict without DistributedDataParallel's "module." prefix, if every key has it."""
    if state_dict and all(k.startswith("module.") for k in state_dict):
        return {k[len("module."):]: v for k, v in state_dict.items()}
    return None


def _convert(row: Layout, state_dict, stripped) -> ConvertedCheckpoint:
    notes = []
    if stripped is not None and not row.keeps_ddp_prefix:
        state_dict = stripped
        notes.append("stripped the 'module.' prefix (a DistributedDataParallel checkpoint)")
    out = ConvertedCheckpoint(format=row.format, notes=notes)
    row.convert(state_dict, out)
    return out


def match_layouts(state_dict: Dict[str, torch.Tensor]) -> List[LayoutMatch]:
    """How every layout of `LAYOUTS` fits ``state_dict`` (key -> tensor), in table order."""
    stripped = _strip_ddp(state_dict)
    matches = []
    for row in LAYOUTS:
        keys = list(state_dict if stripped is None or row.keeps_ddp_prefix else stripped)
        match = LayoutMatch(
            row, num_keys=len(state_dict), missing=row.missing_signature(keys), excluded=row.excluded_keys(keys)
        )
        try:
            match.converted = _convert(row, state_dict, stripped)
            unexplained = set(match.converted.unknown)
            if row.explains is not None:
                unexplained.update(k for k in match.converted.tensors if not row.explains(k))
            match.unexplained = sorted(unexplained)
        except ValueError as e:
            match.error = str(e)
        matches.append(match)
    return matches


def _best(state_dict: Dict[str, torch.Tensor]) -> LayoutMatch:
    if not state_dict:
        raise ValueError("the checkpoint holds no tensors")
    matches = match_layouts(state_dict)
    fitting = [m for m in matches if m.fits]
    if fitting:
        # Fewest unexplained keys; on a tie the earlier row (table order) wins.
        return min(fitting, key=lambda m: len(m.unexplained))
    closest = sorted(matches, key=LayoutMatch.closeness)[:3]
    sample = ", ".join(sorted(state_dict)[:6])
    lines = "\n".join("  - " + m.describe() for m in closest)
    raise ValueError(
        f"cannot tell the checkpoint format: no known layout fits its {len(state_dict)} keys (e.g. {sample}) "
        f"closely enough (a layout must find its whole signature and explain all but "
        f"{MAX_UNEXPLAINED:.0%} of the keys). Closest:\n{lines}\n"
        f"Known formats: {', '.join(FORMATS)}; force one with format=... (--format) if you know better."
    )


def detect_format(keys: Iterable[str]) -> str:
    """Name the layout (one of FORMATS) of a checkpoint from its keys (a list of names or a
    dict keyed by them); ValueError naming the closest layouts if none fits."""
    return _best({k: torch.empty(0) for k in keys}).layout.format


def convert_keys(state_dict: Dict[str, torch.Tensor], format: str = "auto") -> ConvertedCheckpoint:
    """Rename a checkpoint's tensors to detcore names.

    Args:
        state_dict: checkpoint key -> tensor.
        format: one of FORMATS, or "auto" to recognize it strictly from the keys (see the module
            docstring).
    """
    if format != "auto":
        row = layout(format)
        if not state_dict:
            raise ValueError("the checkpoint holds no tensors")
        return _convert(row, state_dict, _strip_ddp(state_dict))
    return _best(state_dict).converted
