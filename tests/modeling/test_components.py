"""The one rule for building a component (detcore.utils.registry), checked on every registry:
each built-in component built from plain arguments equals the one its registry builds from a
config; every registry is selected by a declared config key; a subclass that changes one
argument in `from_config` builds through `build_model`."""
import importlib
import pkgutil

import pytest
import torch
from torch import nn

import detcore
from detcore.config import get_cfg
from detcore.layers import ShapeSpec
from detcore.modeling import (
    ROI_HEADS_REGISTRY,
    Box2BoxTransform,
    GeneralizedRCNN,
    Matcher,
    ProposalNetwork,
    RetinaNet,
    RetinaNetHead,
    ROIPooler,
    StandardROIHeads,
    build_model,
)
from detcore.modeling.anchor_generator import DefaultAnchorGenerator
from detcore.modeling.backbone import FPN, LastLevelMaxPool, LastLevelP6P7, ResNet, RetinaNetFPN
from detcore.modeling.backbone.resnet import make_stage
from detcore.modeling.proposal_generator import RPN, StandardRPNHead
from detcore.modeling.roi_heads import (
    FastRCNNConvFCHead,
    FastRCNNOutputLayers,
    KRCNNConvDeconvUpsampleHead,
    MaskRCNNConvUpsampleHead,
    Res5ROIHeads,
)
from detcore.utils.registry import Registry, build_from_config

from .small_config import small_cfg

CHANNELS = 32  # small_cfg's FPN width
LEVELS = ["p2", "p3", "p4", "p5", "p6"]
LEVEL_SHAPES = {f"p{k}": ShapeSpec(channels=CHANNELS, stride=2**k) for k in range(2, 7)}


# --- each component from plain arguments, matching small_cfg() ----------------------------------
def plain_resnet():
    return ResNet(
        18, in_channels=3, out_features=["res2", "res3", "res4", "res5"], num_groups=1, width_per_group=64,
        stem_out_channels=64, res2_out_channels=64, stride_in_1x1=True, norm="GN", res5_dilation=1, freeze_at=0,
    )


def plain_fpn(cls=FPN, top_block=None):
    top_block = LastLevelMaxPool() if top_block is None else top_block
    return cls(plain_resnet(), ["res2", "res3", "res4", "res5"], CHANNELS, norm="GN", top_block=top_block, fuse_type="sum")


def plain_anchor_generator():
    return DefaultAnchorGenerator(sizes=[[8], [16], [32], [64], [128]], aspect_ratios=[[0.5, 1.0, 2.0]], strides=[4, 8, 16, 32, 64])


def plain_rpn():
    return RPN(
        in_features=LEVELS,
        head=StandardRPNHead(CHANNELS, 3),
        anchor_generator=plain_anchor_generator(),
        anchor_matcher=Matcher([0.3, 0.7], [0, -1, 1], allow_low_quality_matches=True),
        box2box_transform=Box2BoxTransform((1.0, 1.0, 1.0, 1.0)),
        batch_size_per_image=64,
        positive_fraction=0.5,
        pre_nms_topk=(200, 200),
        post_nms_topk=(50, 50),
    )


def plain_box_head():
    return FastRCNNConvFCHead(ShapeSpec(channels=CHANNELS, height=7, width=7), conv_dims=[], fc_dims=[32, 32])


def plain_box_predictor():
    return FastRCNNOutputLayers(
        ShapeSpec(channels=32), box2box_transform=Box2BoxTransform((10.0, 10.0, 5.0, 5.0)), num_classes=3,
        test_score_thresh=0.0, test_topk_per_image=20,
    )


def plain_mask_head():
    return MaskRCNNConvUpsampleHead(ShapeSpec(channels=CHANNELS, height=14, width=14), num_classes=3, conv_dims=[32, 32])


def plain_keypoint_head():
    # small_cfg's keypoint head: the defaults' 17 keypoints, SMALL_MODEL's convs.
    return KRCNNConvDeconvUpsampleHead(
        ShapeSpec(channels=CHANNELS, height=14, width=14), num_keypoints=17, conv_dims=[32, 32],
        loss_weight=1.0, loss_normalizer="visible",
    )


def plain_roi_heads():
    scales = (1 / 4, 1 / 8, 1 / 16, 1 / 32)
    return StandardROIHeads(
        box_in_features=LEVELS[:4],
        box_pooler=ROIPooler(7, scales, sampling_ratio=0, canonical_box_size=112),
        box_head=plain_box_head(),
        box_predictor=plain_box_predictor(),
        num_classes=3,
        batch_size_per_image=32,
        positive_fraction=0.25,
        proposal_matcher=Matcher([0.5], [0, 1]),
        mask_in_features=LEVELS[:4],
        mask_pooler=ROIPooler(14, scales, sampling_ratio=0, canonical_box_size=112),
        mask_head=plain_mask_head(),
    )


def plain_res5_roi_heads():
    """Res5ROIHeads as mask_rcnn_R_18_C4_shapes.yaml (shrunk by small_cfg) builds it on R-18's res4."""
    res5, channels = make_stage(18, 3, 256, first_stride=2, res2_out_channels=64, stride_in_1x1=True, norm="GN")
    return Res5ROIHeads(
        in_features=["res4"],
        pooler=ROIPooler(8, (1 / 16,), sampling_ratio=0),
        res5=res5,
        box_predictor=FastRCNNOutputLayers(
            ShapeSpec(channels=channels), box2box_transform=Box2BoxTransform((10.0, 10.0, 5.0, 5.0)), num_classes=3,
            test_score_thresh=0.0, test_topk_per_image=20,
        ),
        num_classes=3,
        batch_size_per_image=32,
        positive_fraction=0.25,
        proposal_matcher=Matcher([0.5], [0, 1]),
        mask_head=MaskRCNNConvUpsampleHead(ShapeSpec(channels=channels, height=4, width=4), num_classes=3, conv_dims=[32, 32]),
    )


def plain_proposal_network():
    return ProposalNetwork(
        backbone=plain_fpn(),
        proposal_generator=plain_rpn(),
        pixel_mean=[103.530, 116.280, 123.675],
        pixel_std=[57.375, 57.120, 58.395],
        size_divisibility=32,
        channels_last=True,
    )


def plain_retinanet():
    """small_cfg("retinanet_R_18_FPN_shapes.yaml"): P3-P5 from res3-res5, no top block."""
    resnet = ResNet(
        18, in_channels=3, out_features=["res3", "res4", "res5"], num_groups=1, width_per_group=64,
        stem_out_channels=64, res2_out_channels=64, stride_in_1x1=True, norm="GN", res5_dilation=1, freeze_at=0,
    )
    octaves = [2 ** (i / 3) for i in range(3)]
    return RetinaNet(
        backbone=FPN(resnet, ["res3", "res4", "res5"], CHANNELS, norm="GN", top_block=None, fuse_type="sum"),
        head=RetinaNetHead(in_channels=CHANNELS, num_anchors=9, num_classes=3, num_convs=4, norm="GN", prior_prob=0.01),
        head_in_features=["p3", "p4", "p5"],
        anchor_generator=DefaultAnchorGenerator(
            sizes=[[s * o for o in octaves] for s in (24.0, 48.0, 96.0)], aspect_ratios=[[0.5, 1.0, 2.0]],
            strides=[8, 16, 32], offset=0.0,
        ),
        box2box_transform=Box2BoxTransform((1.0, 1.0, 1.0, 1.0)),
        anchor_matcher=Matcher([0.4, 0.5], [0, -1, 1], allow_low_quality_matches=True),
        num_classes=3,
        pixel_mean=[103.530, 116.280, 123.675],
        pixel_std=[57.375, 57.120, 58.395],
        focal_loss_gamma=0.5,
        smooth_l1_beta=0.11,
        max_detections_per_image=20,
        size_divisibility=32,
    )


def plain_rcnn():
    return GeneralizedRCNN(
        backbone=plain_fpn(),
        proposal_generator=plain_rpn(),
        roi_heads=plain_roi_heads(),
        pixel_mean=[103.530, 116.280, 123.675],
        pixel_std=[57.375, 57.120, 58.395],
        size_divisibility=32,
        channels_last=True,
    )


# registry -> {registered name: (plain-argument builder, what the registry's build gets besides cfg
# [, the configs/ file it is selected in, when not small_cfg's default])}
BUILT_IN = {
    "META_ARCH": {
        "GeneralizedRCNN": (plain_rcnn, ()),
        "ProposalNetwork": (plain_proposal_network, ()),
        "RetinaNet": (plain_retinanet, (), "retinanet_R_18_FPN_shapes.yaml"),
    },
    "BACKBONE": {
        "ResNet": (plain_resnet, (ShapeSpec(channels=3),)),
        "FPN": (plain_fpn, (ShapeSpec(channels=3),)),
        "RetinaNetFPN": (lambda: plain_fpn(RetinaNetFPN, LastLevelP6P7(512, CHANNELS)), (ShapeSpec(channels=3),)),
    },
    "ANCHOR_GENERATOR": {"DefaultAnchorGenerator": (plain_anchor_generator, (list(LEVEL_SHAPES.values()),))},
    "PROPOSAL_GENERATOR": {"RPN": (plain_rpn, (LEVEL_SHAPES,))},
    "RPN_HEAD": {"StandardRPNHead": (lambda: StandardRPNHead(CHANNELS, 3), (list(LEVEL_SHAPES.values()),))},
    "ROI_HEADS": {
        "StandardROIHeads": (plain_roi_heads, (LEVEL_SHAPES,)),
        "Res5ROIHeads": (plain_res5_roi_heads, ({"res4": ShapeSpec(channels=256, stride=16)},), "mask_rcnn_R_18_C4_shapes.yaml"),
    },
    "ROI_BOX_HEAD": {"FastRCNNConvFCHead": (plain_box_head, (ShapeSpec(channels=CHANNELS, height=7, width=7),))},
    "ROI_BOX_PREDICTOR": {"FastRCNNOutputLayers": (plain_box_predictor, (ShapeSpec(channels=32),))},
    "ROI_MASK_HEAD": {
        "MaskRCNNConvUpsampleHead": (plain_mask_head, (ShapeSpec(channels=CHANNELS, height=14, width=14),))
    },
    "ROI_KEYPOINT_HEAD": {
        "KRCNNConvDeconvUpsampleHead": (plain_keypoint_head, (ShapeSpec(channels=CHANNELS, height=14, width=14),))
    },
}


def all_registries():
    """Every Registry defined anywhere in the package, by name."""
    found = {}
    for info in pkgutil.walk_packages(detcore.__path__, "detcore."):
        module = importlib.import_module(info.name)
        for value in vars(module).values():
            if isinstance(value, Registry):
                found[value.name] = value
    return found


def comment_above(source: str, key: str) -> str:
    """The comment lines right above ``_C.<key> = ...`` in defaults.py, joined."""
    lines = source.split(f"\n_C.{key} = ")[0].split("\n")
    comment = []
    for line in reversed(lines):
        if not line.startswith("#"):
            break
        comment.insert(0, line[1:].strip())
    return " ".join(comment)


def _plain_value(value):
    if isinstance(value, (int, float, str, bool, type(None))):
        return value
    if isinstance(value, (list, tuple)) and all(isinstance(v, (int, float, str, bool, list, tuple)) for v in value):
        return [_plain_value(v) for v in value]
    if isinstance(value, dict) and all(isinstance(v, (int, float, str, bool)) for v in value.values()):
        return dict(value)
    return None


def describe(module: nn.Module):
    """Everything a constructor decides: module types and structure, parameter and buffer
    shapes, and the settings kept as plain attributes (also inside helper objects such as a
    Matcher or a Box2BoxTransform)."""
    out = {"tensors": {k: tuple(v.shape) for k, v in module.state_dict().items()}}
    for name, sub in module.named_modules():
        settings = {}
        for key, value in vars(sub).items():
            if key.startswith("_") or key == "training":
                continue
            plain = _plain_value(value)
            if plain is not None or value is None:
                settings[key] = plain
            elif not isinstance(value, (nn.Module, torch.Tensor)) and hasattr(value, "__dict__"):
                settings[key] = (type(value).__name__, {k: _plain_value(v) for k, v in vars(value).items()})
        out[name or "<root>"] = (type(sub).__name__, settings)
    return out


def selecting(registry: Registry, name: str, *config: str):
    cfg = small_cfg(*config)
    cfg.merge_from_list([registry.config_key, name])
    return cfg


@pytest.mark.parametrize(
    "registry_name, name", [(r, n) for r, names in BUILT_IN.items() for n in names], ids=lambda x: str(x)
)
def test_component_from_plain_arguments_equals_the_one_built_from_a_config(registry_name, name):
    registry = all_registries()[registry_name]
    plain, build_args, *config = BUILT_IN[registry_name][name]
    from_config = registry.build(selecting(registry, name, *config), *build_args)
    assert type(from_config) is registry.get(name)
    assert describe(plain()) == describe(from_config)


def test_every_built_in_component_is_in_the_table():
    registries = all_registries()
    assert set(registries) == set(BUILT_IN)
    for registry_name, registry in registries.items():
        built_in = {n for n in registry.names() if registry.get(n).__module__.startswith("detcore.")}
        assert built_in == set(BUILT_IN[registry_name]), registry_name


def test_every_registry_is_selected_by_a_declared_config_key():
    defaults = get_cfg()
    source = open(detcore.config.defaults.__file__).read()
    for registry in all_registries().values():
        # Declared, with its default a registered name, and documented beside it.
        default = registry.selected_name(defaults)
        assert default in registry, (registry.config_key, default)
        assert f"_C.{registry.config_key} = " in source, registry.config_key
        assert registry.name in comment_above(source, registry.config_key), registry.config_key
        # Every registered name (and alias) can be chosen from the command line / a yaml file.
        for name in registry.names() + list(registry.aliases()):
            cfg = get_cfg()
            cfg.merge_from_list([registry.config_key, name])
            assert registry.get(registry.selected_name(cfg)) is registry.get(name)


def test_a_typo_in_any_registry_names_the_key_and_the_closest_name():
    for registry in all_registries().values():
        name = registry.names()[0]
        with pytest.raises(KeyError, match=f"Did you mean '{name}'") as info:
            registry.get(name[:-1] + "_")
        assert registry.config_key in str(info.value)


@ROI_HEADS_REGISTRY.register()
class _FewerROIsHeads(StandardROIHeads):
    """A user's subclass changing one argument, as docs/adding_a_component.md shows."""

    @classmethod
    def from_config(cls, cfg, input_shape):
        args = super().from_config(cfg, input_shape)
        args["batch_size_per_image"] = 7
        return args


def test_a_subclass_overriding_one_argument_builds_through_build_model():
    cfg = small_cfg("e2e_mask_rcnn_R_18_FPN_shapes.yaml", **{"MODEL.ROI_HEADS.NAME": "_FewerROIsHeads"})
    model = build_model(cfg)
    assert type(model.roi_heads) is _FewerROIsHeads
    assert model.roi_heads.batch_size_per_image == 7
    reference = build_model(small_cfg())
    assert reference.roi_heads.batch_size_per_image == 32
    assert describe(model.roi_heads.box_head) == describe(reference.roi_heads.box_head)


class _ReturnsAnInstance(StandardROIHeads):
    """from_config written the old way (returning the module): refused with a sentence."""

    @classmethod
    def from_config(cls, cfg, input_shape):
        return cls(**super().from_config(cfg, input_shape))


def test_from_config_returning_an_instance_is_a_clear_error():
    with pytest.raises(TypeError, match=r"_ReturnsAnInstance.from_config must return a dict of constructor arguments"):
        build_from_config(_ReturnsAnInstance, small_cfg(), LEVEL_SHAPES)


def test_registries_refuse_what_breaks_the_rule():
    registry = Registry("TEST", "MODEL.TEST_NAME")
    with pytest.raises(TypeError, match="must be a class with a from_config classmethod"):
        registry.register(lambda cfg: None, name="builder_function")
    with pytest.raises(TypeError, match="must be a class with a from_config"):
        registry.register(nn.Linear)
    registry.register(StandardRPNHead)
    with pytest.raises(KeyError, match="already registered"):
        registry.register(RPN, name="StandardRPNHead")
    registry.register_alias("rpn_head", "StandardRPNHead")
    registry.register_alias("head_of_the_rpn", "rpn_head")  # an alias of an alias
    assert registry.get("rpn_head") is registry.get("head_of_the_rpn") is StandardRPNHead
    assert registry.names() == ["StandardRPNHead"]
    with pytest.raises(KeyError, match="already registered"):
        registry.register_alias("rpn_head", "StandardRPNHead")
    with pytest.raises(KeyError, match="No TEST named 'RPN'"):
        registry.register_alias("x", "RPN")


def test_retinanet_fpn_is_the_fpn_with_p6p7_weight_for_weight():
    # Same seed, same weights: building RetinaNetFPN draws no extra random numbers.
    cfg = small_cfg()
    cfg.merge_from_list(["MODEL.FPN.TOP_BLOCK", "p6p7"])
    torch.manual_seed(0)
    fpn = build_from_config(FPN, cfg, ShapeSpec(channels=3))
    cfg.merge_from_list(["MODEL.FPN.TOP_BLOCK", "maxpool"])
    torch.manual_seed(0)
    retina = build_from_config(RetinaNetFPN, cfg, ShapeSpec(channels=3))
    assert fpn.state_dict().keys() == retina.state_dict().keys()
    for k, v in fpn.state_dict().items():
        assert torch.equal(v, retina.state_dict()[k]), k
