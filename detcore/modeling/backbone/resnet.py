"""ResNet and ResNeXt bodies for detection: a stem and the stages res2..res5.

Parameter names mirror torchvision's `resnet*` / `resnext*`, so ImageNet checkpoints load by
renaming prefixes only. The detectron2 layout (norm kept inside each conv) maps just as
regularly:

    torchvision                   detcore ResNet                 detectron2
    conv1, bn1                    stem.conv1, stem.bn1           stem.conv1, stem.conv1.norm
    layer{k}.{i}.conv{j}          res{k+1}.{i}.conv{j}           res{k+1}.{i}.conv{j}
    layer{k}.{i}.bn{j}            res{k+1}.{i}.bn{j}             res{k+1}.{i}.conv{j}.norm
    layer{k}.{i}.downsample.0     res{k+1}.{i}.downsample.0      res{k+1}.{i}.shortcut
    layer{k}.{i}.downsample.1     res{k+1}.{i}.downsample.1      res{k+1}.{i}.shortcut.norm
    fc                            (none: a body has no classifier)

Each norm key holds weight, bias, running_mean, running_var (FrozenBatchNorm2d has the same
keys as nn.BatchNorm2d). Where no norm is used (norm=""), the `bn*` slots are nn.Identity (no
keys) and the convs get a bias instead.

`deform_on_per_stage` makes the 3×3 conv of every bottleneck in the chosen stages a deformable
convolution (DCN, Dai et al. 2017; with `deform_modulated`, DCN v2's masks, Zhu et al. 2019), as
maskrcnn-benchmark and detectron2 have: a plain 3×3 conv (`conv2_offset`, initialized to zero, so
a new model starts as the ordinary ResNet) predicts the sampling offsets (and masks) from the
block's input. The deformable conv keeps the name and shape of `conv2`, so ImageNet weights load.

`stride_in_1x1` picks where a stage's first block downsamples: on its first 1×1 conv (the
original MSRA / caffe2 models, detectron2's MSRA weights) or on the 3×3 conv (torchvision,
"ResNet v1.5"). The two give different functions from the same weights, so it must match the
checkpoint.
"""
from torch import nn
from torch.nn import functional as F

from detcore.config.choices import FREEZE_AT_STAGES, RES5_DILATIONS, RESNET_DEPTHS, RESNET_OUT_FEATURES
from detcore.layers.batch_norm import FrozenBatchNorm2d, get_norm
from detcore.layers.conv import c2_msra_fill, conv_norm
from detcore.layers.deform_conv import DeformConv2d

from .backbone import Backbone
from .build import BACKBONE_REGISTRY

__all__ = ["BasicBlock", "BottleneckBlock", "BasicStem", "ResNet", "init_resnet_weights", "make_stage"]

# Blocks per stage (res2, res3, res4, res5) for each depth.
_BLOCKS_PER_STAGE = {
    18: (2, 2, 2, 2),
    34: (3, 4, 6, 3),
    50: (3, 4, 6, 3),
    101: (3, 4, 23, 3),
    152: (3, 8, 36, 3),
}
_STAGE_NAMES = ("res2", "res3", "res4", "res5")


def _norm_or_identity(norm, channels):
    layer = get_norm(norm, channels)
    return nn.Identity() if layer is None else layer


def _conv(in_channels, out_channels, kernel_size, norm, stride=1, dilation=1, groups=1):
    # A conv followed by a norm needs no bias: the norm's shift replaces it.
    return nn.Conv2d(
        in_channels,
        out_channels,
        kernel_size,
        stride=stride,
        padding=dilation * (kernel_size - 1) // 2,
        dilation=dilation,
        groups=groups,
        bias=not norm,  # norm is "" / None (no norm), a name, or a callable
    )


def _shortcut(block, x):
    """The block's shortcut branch: x itself, or its projection (1×1 conv + norm)."""
    if block.downsample is None:
        return x
    conv, *norm = block.downsample
    return conv_norm(conv, norm[0] if norm else None, x)


def _downsample(in_channels, out_channels, stride, norm):
    """1×1 projection shortcut (+ norm), used where a block changes channels or resolution."""
    layers = [_conv(in_channels, out_channels, 1, norm, stride=stride)]
    norm_layer = get_norm(norm, out_channels)
    if norm_layer is not None:
        layers.append(norm_layer)
    return nn.Sequential(*layers)


class BasicBlock(nn.Module):
    """Two 3×3 convs and a shortcut (ResNet-18/34). The first conv carries the stride."""

    def __init__(self, in_channels, out_channels, *, stride=1, norm="FrozenBN"):
        super().__init__()
        self.conv1 = _conv(in_channels, out_channels, 3, norm, stride=stride)
        self.bn1 = _norm_or_identity(norm, out_channels)
        self.conv2 = _conv(out_channels, out_channels, 3, norm)
        self.bn2 = _norm_or_identity(norm, out_channels)
        self.downsample = None
        if stride != 1 or in_channels != out_channels:
            self.downsample = _downsample(in_channels, out_channels, stride, norm)

    @property
    def last_norm(self):
        return self.bn2

    def forward(self, x):
        # conv_norm folds FrozenBN into the convs; the adds and ReLUs work in place.
        out = F.relu_(conv_norm(self.conv1, self.bn1, x))
        out = conv_norm(self.conv2, self.bn2, out)
        out += _shortcut(self, x)
        return F.relu_(out)


class BottleneckBlock(nn.Module):
    """1×1 reduce, 3×3 (grouped for ResNeXt, optionally dilated), 1×1 expand, plus shortcut."""

    def __init__(
        self,
        in_channels,
        out_channels,
        *,
        bottleneck_channels,
        stride=1,
        num_groups=1,
        norm="FrozenBN",
        stride_in_1x1=False,
        dilation=1,
        deform=False,
        deform_modulated=False,
        deform_num_groups=1,
    ):
        super().__init__()
        stride_1x1, stride_3x3 = (stride, 1) if stride_in_1x1 else (1, stride)
        self.conv1 = _conv(in_channels, bottleneck_channels, 1, norm, stride=stride_1x1)
        self.bn1 = _norm_or_identity(norm, bottleneck_channels)
        self.deform_modulated = bool(deform_modulated)
        self.conv2_offset = None
        if deform:
            # Per deformable group and 3x3 tap: (dy, dx), and with DCN v2 a mask logit.
            per_tap = 3 if deform_modulated else 2
            self.conv2_offset = nn.Conv2d(
                bottleneck_channels, deform_num_groups * per_tap * 9, 3,
                stride=stride_3x3, padding=dilation, dilation=dilation,
            )
            self.conv2 = DeformConv2d(
                bottleneck_channels, bottleneck_channels, 3, stride=stride_3x3, padding=dilation,
                dilation=dilation, groups=num_groups, bias=not norm,
            )
        else:
            self.conv2 = _conv(
                bottleneck_channels,
                bottleneck_channels,
                3,
                norm,
                stride=stride_3x3,
                dilation=dilation,
                groups=num_groups,
            )
        self.bn2 = _norm_or_identity(norm, bottleneck_channels)
        self.conv3 = _conv(bottleneck_channels, out_channels, 1, norm)
        self.bn3 = _norm_or_identity(norm, out_channels)
        self.downsample = None
        if stride != 1 or in_channels != out_channels:
            self.downsample = _downsample(in_channels, out_channels, stride, norm)

    @property
    def last_norm(self):
        return self.bn3

    def forward(self, x):
        # conv_norm folds FrozenBN into the convs; the adds and ReLUs work in place.
        out = F.relu_(conv_norm(self.conv1, self.bn1, x))
        if self.conv2_offset is None:
            out = F.relu_(conv_norm(self.conv2, self.bn2, out))
        else:
            out = F.relu_(self.bn2(self._deformable_conv2(out)))
        out = conv_norm(self.conv3, self.bn3, out)
        out += _shortcut(self, x)
        return F.relu_(out)

    def _deformable_conv2(self, x):
        offset = self.conv2_offset(x)
        if not self.deform_modulated:
            return self.conv2(x, offset)
        num_offsets = offset.shape[1] * 2 // 3  # (dy, dx) channels first, then the masks
        return self.conv2(x, offset[:, :num_offsets], offset[:, num_offsets:].sigmoid())

    def zero_init_offsets(self):
        """Offsets 0 (and masks sigmoid(0)): the deformable conv starts as the plain 3x3 conv."""
        if self.conv2_offset is not None:
            nn.init.zeros_(self.conv2_offset.weight)
            nn.init.zeros_(self.conv2_offset.bias)


class BasicStem(nn.Module):
    """7×7/2 conv, norm, ReLU, 3×3/2 max pool: stride 4 in total."""

    def __init__(self, in_channels=3, out_channels=64, norm="FrozenBN"):
        super().__init__()
        self.out_channels = out_channels
        self.stride = 4
        self.conv1 = _conv(in_channels, out_channels, 7, norm, stride=2)
        self.bn1 = _norm_or_identity(norm, out_channels)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)

    def forward(self, x):
        return self.maxpool(F.relu_(conv_norm(self.conv1, self.bn1, x)))


def _check_stage_arguments(depth, num_groups, res2_out_channels, dilation, deform, deform_num_groups):
    """What the block type of `depth` allows: basic blocks (ResNet-18/34) have no groups, width
    choice, dilation or deformable convs."""
    if deform_num_groups < 1:
        raise ValueError(f"ResNet: deform_num_groups must be >= 1, got {deform_num_groups}")
    if depth not in (18, 34):
        return
    if deform:
        raise ValueError(
            f"ResNet-{depth}: deformable convs (MODEL.RESNETS.DEFORM_ON_PER_STAGE) need bottleneck "
            "blocks (depth 50, 101 or 152)"
        )
    if res2_out_channels not in (None, 64):
        raise ValueError(
            f"ResNet-{depth}: res2_out_channels (MODEL.RESNETS.RES2_OUT_CHANNELS) must be 64, got {res2_out_channels}"
        )
    if num_groups != 1:
        raise ValueError(f"ResNet-{depth}: num_groups must be 1 (BasicBlock), got {num_groups}")
    if dilation != 1:
        raise ValueError(f"ResNet-{depth}: res5_dilation must be 1 (BasicBlock)")


def make_stage(
    depth,
    stage_index,
    in_channels,
    *,
    first_stride=2,
    num_groups=1,
    width_per_group=64,
    res2_out_channels=None,
    stride_in_1x1=False,
    norm="FrozenBN",
    dilation=1,
    deform=False,
    deform_modulated=False,
    deform_num_groups=1,
):
    """Stage res{stage_index + 2} of a ResNet-`depth` (stage_index 0..3), taking `in_channels`.

    The first block carries `first_stride` (and a projection shortcut where the shape changes);
    widths follow ResNet's rule (see ResNet's arguments of the same names). ResNet builds its
    body from these, and a C4 detector's ROI head builds res5 with it (Res5ROIHeads). Weights
    keep PyTorch's default init: call `init_resnet_weights` on the result.

    Returns:
        (nn.Sequential of the blocks, output channels).
    """
    if depth not in _BLOCKS_PER_STAGE:
        raise ValueError(f"make_stage: depth must be one of {list(_BLOCKS_PER_STAGE)}, got {depth}")
    if not 0 <= stage_index < len(_STAGE_NAMES):
        raise ValueError(f"make_stage: stage_index must be 0..3 (res2..res5), got {stage_index}")
    _check_stage_arguments(depth, num_groups, res2_out_channels, dilation, deform, deform_num_groups)
    basic = depth in (18, 34)
    if res2_out_channels is None:
        res2_out_channels = 64 if basic else 256
    out_channels = res2_out_channels * 2**stage_index
    blocks = []
    for b in range(_BLOCKS_PER_STAGE[depth][stage_index]):
        block_stride = first_stride if b == 0 else 1
        if basic:
            block = BasicBlock(in_channels, out_channels, stride=block_stride, norm=norm)
        else:
            block = BottleneckBlock(
                in_channels,
                out_channels,
                bottleneck_channels=num_groups * width_per_group * 2**stage_index,
                stride=block_stride,
                num_groups=num_groups,
                norm=norm,
                stride_in_1x1=stride_in_1x1,
                dilation=dilation,
                deform=deform,
                deform_modulated=deform_modulated,
                deform_num_groups=deform_num_groups,
            )
        blocks.append(block)
        in_channels = out_channels
    return nn.Sequential(*blocks), out_channels


def init_resnet_weights(module, zero_init_residual=False):
    """ResNet's initialization of every conv in `module` (a body or a stage): MSRA fill,
    deformable offsets at zero, and with `zero_init_residual` each block's last norm at 0."""
    for m in module.modules():
        if isinstance(m, (nn.Conv2d, DeformConv2d)):
            c2_msra_fill(m)
    for m in module.modules():  # after the fill, which would reach the offset convs too
        if isinstance(m, BottleneckBlock):
            m.zero_init_offsets()
    if zero_init_residual:
        for m in module.modules():
            if isinstance(m, (BasicBlock, BottleneckBlock)):
                nn.init.zeros_(m.last_norm.weight)


@BACKBONE_REGISTRY.register()
class ResNet(Backbone):
    """ResNet / ResNeXt body returning a dict of the features named in `out_features`.

    Args:
        depth: 18, 34 (BasicBlock) or 50, 101, 152 (BottleneckBlock).
        in_channels: channels of the input image.
        out_features: names among "stem", "res2".."res5" to return. Stages after the last one
            named are not built (e.g. ("res4",) builds a C4 body without res5).
        num_groups, width_per_group: the 3×3 conv of res2 has num_groups * width_per_group
            channels in num_groups groups (ResNet: 1 and 64; ResNeXt-101 32x8d: 32 and 8);
            it doubles at each stage. Bottleneck depths only.
        stem_out_channels: channels of the stem output.
        res2_out_channels: output channels of res2, doubled at each stage. Default: 64 for
            depth 18/34 (which allow nothing else), 256 otherwise.
        stride_in_1x1: downsample on the 1×1 conv (MSRA/caffe2) instead of the 3×3 (torchvision).
        norm: "FrozenBN", "BN", "SyncBN", "GN", "" (none) or a callable channels → module.
        res5_dilation: 1, or 2 to keep res5 at stride 16 with dilated 3×3 convs.
        deform_on_per_stage: four bools (res2..res5): deformable 3x3 convs in that stage's
            bottlenecks (bottleneck depths only).
        deform_modulated: DCN v2 (offsets and masks) instead of v1 (offsets).
        deform_num_groups: deformable groups (offset sets) of each deformable conv.
        freeze_at: 0 freezes nothing, 1 the stem, k >= 2 the stem and res2..res{k}. Frozen
            parts get requires_grad=False and their batch norms become FrozenBatchNorm2d.
        zero_init_residual: start the last norm of each block at weight 0, so every residual
            branch starts as zero (helps training from scratch; "Bag of Tricks", Goyal et al.).
    """

    def __init__(
        self,
        depth=50,
        *,
        in_channels=3,
        out_features=("res2", "res3", "res4", "res5"),
        num_groups=1,
        width_per_group=64,
        stem_out_channels=64,
        res2_out_channels=None,
        stride_in_1x1=False,
        norm="FrozenBN",
        res5_dilation=1,
        deform_on_per_stage=(False, False, False, False),
        deform_modulated=False,
        deform_num_groups=1,
        freeze_at=0,
        zero_init_residual=False,
    ):
        super().__init__()
        deform_on_per_stage = [bool(d) for d in deform_on_per_stage]
        if len(deform_on_per_stage) != 4:
            raise ValueError(
                f"ResNet: deform_on_per_stage (MODEL.RESNETS.DEFORM_ON_PER_STAGE) needs one bool per "
                f"stage res2..res5, got {len(deform_on_per_stage)} values"
            )
        if depth not in RESNET_DEPTHS:
            raise ValueError(f"ResNet: depth must be one of {list(RESNET_DEPTHS)}, got {depth}")
        out_features = list(out_features)
        known = RESNET_OUT_FEATURES
        unknown = [name for name in out_features if name not in known]
        if not out_features or unknown:
            raise ValueError(
                f"ResNet: out_features must be a non-empty subset of {list(known)}, "
                f"got {out_features}"
            )
        if freeze_at not in FREEZE_AT_STAGES:
            raise ValueError(f"ResNet: freeze_at must be one of {list(FREEZE_AT_STAGES)}, got {freeze_at}")
        if res5_dilation not in RES5_DILATIONS:
            raise ValueError(f"ResNet: res5_dilation must be one of {list(RES5_DILATIONS)}, got {res5_dilation}")
        _check_stage_arguments(
            depth, num_groups, res2_out_channels, res5_dilation, any(deform_on_per_stage), deform_num_groups
        )
        if zero_init_residual and not norm:
            raise ValueError("ResNet: zero_init_residual needs a norm layer, but norm is empty")

        self.stem = BasicStem(in_channels, stem_out_channels, norm)
        self._out_feature_channels = {"stem": stem_out_channels}
        self._out_feature_strides = {"stem": self.stem.stride}

        num_stages = max(known.index(name) for name in out_features)  # 0: stem only
        self.stage_names = list(_STAGE_NAMES[:num_stages])
        channels, stride = stem_out_channels, self.stem.stride
        for i, name in enumerate(self.stage_names):
            dilation = res5_dilation if name == "res5" else 1
            first_stride = 1 if i == 0 or dilation > 1 else 2
            stage, channels = make_stage(
                depth,
                i,
                channels,
                first_stride=first_stride,
                num_groups=num_groups,
                width_per_group=width_per_group,
                res2_out_channels=res2_out_channels,
                stride_in_1x1=stride_in_1x1,
                norm=norm,
                dilation=dilation,
                deform=deform_on_per_stage[i],
                deform_modulated=deform_modulated,
                deform_num_groups=deform_num_groups,
            )
            self.add_module(name, stage)
            stride *= first_stride
            self._out_feature_channels[name] = channels
            self._out_feature_strides[name] = stride
        self._out_features = [name for name in known if name in out_features]
        self.in_channels = in_channels

        init_resnet_weights(self, zero_init_residual)
        self.freeze(freeze_at)

    @classmethod
    def from_config(cls, cfg, input_shape):
        """The body of cfg.MODEL.RESNETS.* frozen up to cfg.MODEL.BACKBONE.FREEZE_AT."""
        r = cfg.MODEL.RESNETS
        return {
            "depth": r.DEPTH,
            "in_channels": input_shape.channels,
            "out_features": r.OUT_FEATURES,
            "num_groups": r.NUM_GROUPS,
            "width_per_group": r.WIDTH_PER_GROUP,
            "stem_out_channels": r.STEM_OUT_CHANNELS,
            "res2_out_channels": r.RES2_OUT_CHANNELS,
            "stride_in_1x1": r.STRIDE_IN_1X1,
            "norm": r.NORM,
            "res5_dilation": r.RES5_DILATION,
            "deform_on_per_stage": r.DEFORM_ON_PER_STAGE,
            "deform_modulated": r.DEFORM_MODULATED,
            "deform_num_groups": r.DEFORM_NUM_GROUPS,
            "freeze_at": cfg.MODEL.BACKBONE.FREEZE_AT,
        }

    def freeze(self, freeze_at=0):
        """Freeze the stem (freeze_at >= 1) and res2..res{freeze_at}: parameters stop requiring
        grad and batch norms become FrozenBatchNorm2d. Returns self."""

        def frozen(module):
            for p in module.parameters():
                p.requires_grad_(False)
            return FrozenBatchNorm2d.convert_frozen_batchnorm(module)

        if freeze_at >= 1:
            self.stem = frozen(self.stem)
        for k, name in enumerate(self.stage_names, start=2):
            if freeze_at >= k:
                self.add_module(name, frozen(getattr(self, name)))
        return self

    def forward(self, x):
        if x.dim() != 4 or x.shape[1] != self.in_channels:
            raise ValueError(
                f"ResNet: input x must have shape (N, {self.in_channels}, H, W), "
                f"got {tuple(x.shape)}"
            )
        outputs = {}
        x = self.stem(x)
        if "stem" in self._out_features:
            outputs["stem"] = x
        for name in self.stage_names:
            x = getattr(self, name)(x)
            if name in self._out_features:
                outputs[name] = x
        return outputs


# detectron2's name for the same backbone, so its configs select it unchanged.
BACKBONE_REGISTRY.register_alias("build_resnet_backbone", "ResNet")
