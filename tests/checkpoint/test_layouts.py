"""Strict format detection: every published layout is recognized as itself and fits no other;
near misses and unrelated state dicts are errors that name the closest layouts and what did not
match; a few extra keys within the tolerance load and are reported, never dropped quietly."""
import pathlib

import pytest
import torch

from detcore.checkpoint import FORMATS, LAYOUTS, convert_keys, convert_state_dict, detect_format
from detcore.checkpoint.layouts import MAX_UNEXPLAINED, match_layouts

from .zoo_names import (
    caffe2_detectron_mask_rcnn_r50_c4_shapes,
    caffe2_detectron_mask_rcnn_r50_fpn_shapes,
    caffe2_resnet50_shapes,
    detectron2_mask_rcnn_r50_c4_shapes,
    detectron2_mask_rcnn_r50_fpn_shapes,
    detectron2_retinanet_r50_fpn_shapes,
    maskrcnn_benchmark_mask_rcnn_r50_c4_shapes,
    maskrcnn_benchmark_mask_rcnn_r50_fpn_shapes,
    torchvision_maskrcnn_v1_shapes,
    torchvision_resnet50_shapes,
    torchvision_retinanet_v1_shapes,
)

REPO = pathlib.Path(__file__).resolve().parents[2]


def placeholders(keys):
    return {k: torch.empty(0) for k in keys}


def published():
    """(format, key list) of each published checkpoint layout (zoo_names.py)."""
    return [
        ("detectron2", detectron2_mask_rcnn_r50_fpn_shapes()),
        ("detectron2", detectron2_mask_rcnn_r50_c4_shapes()),
        ("detectron2", detectron2_retinanet_r50_fpn_shapes()),
        ("torchvision-detection", torchvision_maskrcnn_v1_shapes()),
        ("torchvision-detection", torchvision_retinanet_v1_shapes()),
        ("maskrcnn-benchmark", maskrcnn_benchmark_mask_rcnn_r50_fpn_shapes(ddp=True)),
        ("maskrcnn-benchmark", maskrcnn_benchmark_mask_rcnn_r50_fpn_shapes(ddp=False)),
        ("maskrcnn-benchmark", maskrcnn_benchmark_mask_rcnn_r50_c4_shapes(ddp=True)),
        ("maskrcnn-benchmark", maskrcnn_benchmark_mask_rcnn_r50_c4_shapes(ddp=False)),
        ("caffe2-detection", caffe2_detectron_mask_rcnn_r50_fpn_shapes()),
        ("caffe2-detection", caffe2_detectron_mask_rcnn_r50_fpn_shapes(momentum=False)),
        ("caffe2-detection", caffe2_detectron_mask_rcnn_r50_c4_shapes()),
        ("caffe2-resnet", caffe2_resnet50_shapes()),
        ("torchvision-resnet", torchvision_resnet50_shapes()),
        ("torchvision-resnet", torchvision_resnet50_shapes(prefix="module.pre.")),
    ]


def test_the_table():
    assert len(set(FORMATS)) == len(FORMATS) == len(LAYOUTS)
    for row in LAYOUTS:
        assert row.signature and row.source
        for preset in row.presets:
            assert (REPO / preset).is_file(), preset
    assert {fmt for fmt, _ in published()} | {"detcore"} == set(FORMATS)  # every row is tested below


@pytest.mark.parametrize("expected,keys", published(), ids=lambda v: v if isinstance(v, str) else "")
def test_each_published_layout_fits_only_its_own_row(expected, keys):
    matches = match_layouts(placeholders(keys))
    assert [m.layout.format for m in matches if m.fits] == [expected]
    assert detect_format(keys) == expected
    mine = next(m for m in matches if m.layout.format == expected)
    assert not mine.unexplained, mine.unexplained[:5]


def test_detcore_checkpoint_fits_only_detcore():
    from .test_loader import small_model

    for prefix in ("", "module."):
        keys = [prefix + k for k in small_model().state_dict()]
        matches = match_layouts(placeholders(keys))
        assert [m.layout.format for m in matches if m.fits] == ["detcore"]


def test_small_key_lists():
    assert detect_format(["conv1.weight", "bn1.weight", "layer1.0.conv1.weight", "fc.weight"]) == "torchvision-resnet"
    assert detect_format(["module.pre.conv1.weight", "module.pre.layer1.0.conv1.weight"]) == "torchvision-resnet"
    assert detect_format(["backbone.bottom_up.stem.bn1.weight", "roi_heads.box_head.fc1.weight"]) == "detcore"
    assert detect_format(["module.backbone.bottom_up.res2.0.downsample.0.weight"]) == "detcore"
    assert detect_format(["head.cls_subnet.0.weight", "backbone.fpn_lateral3.weight", "backbone.bottom_up.stem.bn1.weight"]) == "detcore"
    # detectron2 backbone-only (their torchvision / MSRA conversions): stem.conv1.norm, no prefix.
    assert detect_format(["stem.conv1.weight", "stem.conv1.norm.weight", "res2.0.shortcut.weight"]) == "detectron2"


# --- what does not fit ------------------------------------------------------------------------------
def test_unrelated_state_dict_is_an_error_naming_the_closest_layouts():
    g = torch.Generator().manual_seed(0)
    bert_like = {f"encoder.layer.{i}.attention.self.{p}.weight": torch.randn(8, 8, generator=g)
                 for i in range(4) for p in ("query", "key", "value")}  # fmt: skip
    bert_like["pooler.dense.bias"] = torch.randn(8, generator=g)
    with pytest.raises(ValueError) as info:
        convert_keys(bert_like)
    message = str(info.value)
    assert "cannot tell the checkpoint format" in message and "13 keys" in message
    assert "encoder.layer.0.attention.self.key.weight" in message  # the keys it saw
    assert message.count("\n  - ") == 3  # three closest layouts, each with what did not match
    assert "Known formats: " + ", ".join(FORMATS) in message


def test_torchvision_backbone_that_is_no_resnet():
    # fasterrcnn_mobilenet_v3_large_fpn: torchvision's detection names, another body.
    torchvision = pytest.importorskip("torchvision")
    model = torchvision.models.detection.fasterrcnn_mobilenet_v3_large_fpn(weights=None, weights_backbone=None)
    with pytest.raises(ValueError) as info:
        detect_format(model.state_dict())
    closest = str(info.value).split("Closest:\n")[1].splitlines()[0]
    assert closest.startswith("  - torchvision-detection")
    assert "lacks torchvision's ResNet stem 'backbone.body.conv1.weight'" in closest
    assert "backbone.body.0.0.weight" in closest  # an unexplained key, named


def test_extra_keys_beyond_the_tolerance_are_an_error():
    keys = dict(torchvision_maskrcnn_v1_shapes())
    extra = int(MAX_UNEXPLAINED * len(keys) * 1.5)
    keys.update({f"roi_heads.attribute_head.fc{i}.weight": (4, 4) for i in range(extra)})
    with pytest.raises(ValueError) as info:
        detect_format(keys)
    closest = str(info.value).split("Closest:\n")[1].splitlines()[0]
    assert closest.startswith("  - torchvision-detection")
    assert f"{extra} of {len(keys)} keys unexplained (e.g. roi_heads.attribute_head.fc0.weight" in closest


def test_a_few_extra_keys_load_and_are_reported():
    from .test_loader import model_from

    model = model_from("torchvision/faster_rcnn_R_50_FPN.yaml")
    state = {k: torch.zeros(s) for k, s in torchvision_maskrcnn_v1_shapes().items() if "mask" not in k}
    state["roi_heads.attribute_head.weight"] = torch.zeros(3, 1024)
    _, report = convert_state_dict(state, model)
    assert report.format == "torchvision-detection"
    assert [(k, shape) for k, _, shape in report.unexpected] == [("roi_heads.attribute_head.weight", (3, 1024))]
    assert not report.complete and "UNEXPECTED" in report.table()


def test_detectron_fast_rcnn_pickle_is_refused():
    # A Detectron R-50-C4 Fast R-CNN model_final.pkl (precomputed proposals: no RPN): a caffe2
    # body with box predictors, neither a Mask / Faster R-CNN (no FPN, no C4 RPN) nor ImageNet weights.
    keys = {k: v for k, v in caffe2_detectron_mask_rcnn_r50_c4_shapes(momentum=False).items()
            if not k.startswith(("conv_rpn", "rpn_", "conv5_mask", "mask_fcn"))}  # fmt: skip
    with pytest.raises(ValueError) as info:
        detect_format(keys)
    message = str(info.value)
    assert "caffe2-detection" in message and "lacks Detectron's FPN (fpn_inner_res5_2_sum_w ...) or C4 RPN" in message
    assert "caffe2-resnet" in message and "never have: bbox_pred_b, bbox_pred_w" in message


def test_maskrcnn_benchmark_retinanet_is_refused():
    # maskrcnn-benchmark's RetinaNet R-50-FPN: its stem, FPN and "rpn.head" names are those of
    # its Mask R-CNN, but the towers and P6/P7 convs are not, and the cls_logits shapes differ.
    keys = {k: v for k, v in maskrcnn_benchmark_mask_rcnn_r50_fpn_shapes(ddp=False).items()
            if k.startswith(("backbone.body.", "rpn.anchor_generator.")) or "fpn_inner1" not in k and "fpn_layer1" not in k
            and k.startswith("backbone.fpn.")}  # fmt: skip
    for tower in ("cls_tower", "bbox_tower"):
        for i in (0, 2, 4, 6):
            keys[f"rpn.head.{tower}.{i}.weight"], keys[f"rpn.head.{tower}.{i}.bias"] = (256, 256, 3, 3), (256,)
    keys["rpn.head.cls_logits.weight"], keys["rpn.head.cls_logits.bias"] = (720, 256, 3, 3), (720,)
    keys["rpn.head.bbox_pred.weight"], keys["rpn.head.bbox_pred.bias"] = (36, 256, 3, 3), (36,)
    for p in ("p6", "p7"):
        keys[f"backbone.fpn.top_blocks.{p}.weight"], keys[f"backbone.fpn.top_blocks.{p}.bias"] = (256, 256, 3, 3), (256,)
    with pytest.raises(ValueError) as info:
        detect_format(keys)
    closest = str(info.value).split("Closest:\n")[1].splitlines()
    mb = next(line for line in closest if line.startswith("  - maskrcnn-benchmark"))
    assert "RetinaNet head or P6/P7 convs" in mb and "backbone.fpn.top_blocks.p6.bias" in mb


def test_maskrcnn_benchmark_c4_without_its_box_head_is_refused():
    # The C4 body and RPN alone (the box head cut off): a near miss of the C4 signature.
    keys = {k: v for k, v in maskrcnn_benchmark_mask_rcnn_r50_c4_shapes(ddp=False).items() if not k.startswith("roi_heads.")}
    with pytest.raises(ValueError) as info:
        detect_format(keys)
    assert "maskrcnn-benchmark" in str(info.value)
    assert "lacks maskrcnn-benchmark's FPN (backbone.fpn.fpn_inner1 ...) or C4 box head" in str(info.value)


def test_torchvision_detection_is_no_imagenet_resnet():
    # The body under backbone.body. is a prefixed torchvision ResNet; the heads rule that out.
    matches = {m.layout.format: m for m in match_layouts(placeholders(torchvision_maskrcnn_v1_shapes()))}
    resnet = matches["torchvision-resnet"]
    assert not resnet.fits and resnet.excluded and resnet.excluded[0].startswith("backbone.fpn.")


def test_forced_format_skips_detection():
    keys = torchvision_resnet50_shapes()
    out = convert_keys({k: torch.zeros(s) for k, s in keys.items()}, format="torchvision-resnet")
    assert out.format == "torchvision-resnet" and not out.unknown
    with pytest.raises(ValueError, match="format must be 'auto' or one of"):
        convert_keys({"a": torch.zeros(1)}, format="mmdetection")
    with pytest.raises(ValueError, match="holds no tensors"):
        convert_keys({})


def test_backbone_layouts_refuse_detection_heads():
    # A ResNet beside a few RPN tensors (a detection checkpoint cut down, or a custom model) is
    # within the unexplained-key tolerance of torchvision-resnet, but its heads rule it out: it
    # must not load as an ImageNet body with the heads quietly left behind.
    keys = dict(torchvision_resnet50_shapes())
    keys.update({"rpn.head.conv.weight": (256, 256, 3, 3), "rpn.head.conv.bias": (256,)})
    assert len(keys) * MAX_UNEXPLAINED > 2
    with pytest.raises(ValueError) as info:
        detect_format(keys)
    closest = str(info.value).split("Closest:\n")[1].splitlines()[0]
    assert closest.startswith("  - torchvision-resnet") and "never have: rpn.head.conv.bias, rpn.head.conv.weight" in closest
