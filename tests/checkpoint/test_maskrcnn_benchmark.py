"""maskrcnn-benchmark .pth and Detectron .pkl detection checkpoints into the
configs/maskrcnn_benchmark preset: every name, shape and value placed where the reference's
module structure says (zoo_names.py and the pairs below are written from maskrcnn-benchmark's and
Detectron's model code, not from detcore's mapping), and the body computing what theirs does."""
import pathlib
import pickle

import pytest
import torch
from torch import nn

from detcore.checkpoint import convert_state_dict, detect_format, load_converted_state_dict
from detcore.checkpoint.layouts import match_layouts
from detcore.config import get_cfg
from detcore.modeling import build_model

from .test_loader import random_resnet50_state
from .zoo_names import caffe2_detectron_mask_rcnn_r50_fpn_shapes, maskrcnn_benchmark_mask_rcnn_r50_fpn_shapes

REPO = pathlib.Path(__file__).resolve().parents[2]
PRESET = REPO / "configs" / "maskrcnn_benchmark" / "e2e_mask_rcnn_R_50_FPN_1x.yaml"
EPS = 1e-5  # detcore FrozenBatchNorm2d's; maskrcnn-benchmark's has none

# (maskrcnn-benchmark module, Detectron blob, detcore module) outside the ResNet body. The FPN
# of both is numbered from the finest body stage: fpn_inner1 / res2_2_sum is the res2 lateral.
HEAD_MODULES = [
    ("backbone.fpn.fpn_inner1", "fpn_inner_res2_2_sum_lateral", "backbone.fpn_lateral2"),
    ("backbone.fpn.fpn_inner2", "fpn_inner_res3_3_sum_lateral", "backbone.fpn_lateral3"),
    ("backbone.fpn.fpn_inner3", "fpn_inner_res4_5_sum_lateral", "backbone.fpn_lateral4"),
    ("backbone.fpn.fpn_inner4", "fpn_inner_res5_2_sum", "backbone.fpn_lateral5"),
    ("backbone.fpn.fpn_layer1", "fpn_res2_2_sum", "backbone.fpn_output2"),
    ("backbone.fpn.fpn_layer2", "fpn_res3_3_sum", "backbone.fpn_output3"),
    ("backbone.fpn.fpn_layer3", "fpn_res4_5_sum", "backbone.fpn_output4"),
    ("backbone.fpn.fpn_layer4", "fpn_res5_2_sum", "backbone.fpn_output5"),
    ("rpn.head.conv", "conv_rpn_fpn2", "proposal_generator.rpn_head.conv"),
    ("rpn.head.cls_logits", "rpn_cls_logits_fpn2", "proposal_generator.rpn_head.objectness_logits"),
    ("rpn.head.bbox_pred", "rpn_bbox_pred_fpn2", "proposal_generator.rpn_head.anchor_deltas"),
    ("roi_heads.box.feature_extractor.fc6", "fc6", "roi_heads.box_head.fc1"),
    ("roi_heads.box.feature_extractor.fc7", "fc7", "roi_heads.box_head.fc2"),
    ("roi_heads.mask.feature_extractor.mask_fcn1", "_[mask]_fcn1", "roi_heads.mask_head.mask_fcn1"),
    ("roi_heads.mask.feature_extractor.mask_fcn2", "_[mask]_fcn2", "roi_heads.mask_head.mask_fcn2"),
    ("roi_heads.mask.feature_extractor.mask_fcn3", "_[mask]_fcn3", "roi_heads.mask_head.mask_fcn3"),
    ("roi_heads.mask.feature_extractor.mask_fcn4", "_[mask]_fcn4", "roi_heads.mask_head.mask_fcn4"),
    ("roi_heads.mask.predictor.conv5_mask", "conv5_mask", "roi_heads.mask_head.deconv"),
]
# Classifier layers: background is output 0 there, last (cls_score) or absent here.
PREDICTORS = [
    ("roi_heads.box.predictor.cls_score", "cls_score", "roi_heads.box_predictor.cls_score"),
    ("roi_heads.box.predictor.bbox_pred", "bbox_pred", "roi_heads.box_predictor.bbox_pred"),
    ("roi_heads.mask.predictor.mask_fcn_logits", "mask_fcn_logits", "roi_heads.mask_head.predictor"),
]


@pytest.fixture(scope="module")
def preset_model():
    cfg = get_cfg()
    cfg.merge_from_file(str(PRESET))
    cfg.merge_from_list(["MODEL.DEVICE", "cpu"])
    return build_model(cfg)


def numbered(shapes, offset=0):
    """Each tensor filled with its own index (+ offset), so a misplaced one is visible."""
    return {name: torch.full(shape, float(i + offset)) for i, (name, shape) in enumerate(shapes.items())}


def check_class_order(converted):
    """The classifier rows were numbered 0..80 (background first): background moves last in
    cls_score, and has no box deltas or mask here."""
    assert torch.equal(converted["roi_heads.box_predictor.cls_score.bias"], torch.tensor([*range(1, 81), 0.0]))
    assert torch.equal(converted["roi_heads.box_predictor.cls_score.weight"][:, 0], torch.tensor([*range(1, 81), 0.0]))
    assert torch.equal(converted["roi_heads.box_predictor.bbox_pred.bias"], torch.arange(4.0, 324.0))
    assert torch.equal(converted["roi_heads.mask_head.predictor.bias"], torch.arange(1.0, 81.0))
    assert torch.equal(converted["roi_heads.mask_head.predictor.weight"][:, 0, 0, 0], torch.arange(1.0, 81.0))


def without_background(name, shape):
    """A checkpoint tensor's shape once background's outputs are gone (box deltas and masks)."""
    if name.endswith(("predictor.bbox_pred.weight", "predictor.bbox_pred.bias", "bbox_pred_w", "bbox_pred_b")):
        return (shape[0] - 4,) + tuple(shape[1:])
    if "mask_fcn_logits" in name:
        return (shape[0] - 1,) + tuple(shape[1:])
    return tuple(shape)


def numbered_rows(t):
    """``t``'s shape, each row holding its row index."""
    rows = torch.arange(t.shape[0], dtype=torch.float32)
    return rows.view(-1, *([1] * (t.dim() - 1))).expand_as(t).clone()


def convert_detectron_pkl(tmp_path, shapes, predictor_blobs, model, head_modules):
    """A Detectron ``model_final.pkl`` of these blob shapes (each blob numbered, the classifier
    blobs ``predictor_blobs`` numbered by row), converted for ``model``: checks what every
    Detectron detection checkpoint must give (its format, every model tensor filled, only the
    BN momenta dropped, the ``head_modules``' (_, blob, detcore module) weights and biases in
    place, every other blob used, background moved last) and returns ``(converted, blobs)``."""
    blobs = {k: v.numpy() for k, v in numbered(shapes).items()}
    for c2 in predictor_blobs:
        for leaf in ("w", "b"):
            blobs[f"{c2}_{leaf}"] = numbered_rows(torch.from_numpy(blobs[f"{c2}_{leaf}"])).numpy()
    path = tmp_path / "model_final.pkl"
    path.write_bytes(pickle.dumps({"blobs": blobs, "cfg": "MODEL:\n  TYPE: generalized_rcnn\n"}, protocol=2))

    converted, report = load_converted_state_dict(path, model)
    assert report.format == "caffe2-detection"
    assert report.complete, report.table()
    momentum = [k for k in shapes if k.endswith("_momentum")]
    assert momentum and sorted(k for k, _ in report.dropped) == sorted(momentum)
    assert {dst for _, dst, _ in report.mapped} == set(model.state_dict())
    assert {src for src, _, _ in report.mapped} >= {k for k in shapes if not k.endswith("_momentum")}
    for _, c2, ours in head_modules:
        assert torch.equal(converted[ours + ".weight"], torch.from_numpy(blobs[c2 + "_w"])), (c2, ours)
        assert torch.equal(converted[ours + ".bias"], torch.from_numpy(blobs[c2 + "_b"])), (c2, ours)
    check_class_order(converted)
    return converted, blobs


def convert_maskrcnn_benchmark_pth(path, shapes, state, model, head_modules, dropped):
    """maskrcnn-benchmark's training file at ``path`` (the DDP ``state`` of these ``shapes``)
    converted for ``model``: checks what every such checkpoint must give (its format, every model
    tensor filled at its shape less background, exactly ``dropped`` left out, the three notes,
    the ``head_modules``' (module, _, detcore module) weights and biases in place, background
    moved last) and returns the converted state."""
    converted, report = load_converted_state_dict(path, model)
    assert report.format == "maskrcnn-benchmark"
    assert report.complete, report.table()
    assert len(report.notes) == 3, report.notes  # DDP prefix, FrozenBN eps, class order; no settings to fix
    assert sorted(k for k, _ in report.dropped) == sorted(dropped)
    model_shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert {dst for _, dst, _ in report.mapped} == set(model_shapes)
    for src, dst, shape in report.mapped:
        assert model_shapes[dst] == shape == without_background(src, shapes["module." + src]), (src, dst)
    for mb, _, ours in head_modules:
        for leaf in ("weight", "bias"):
            assert torch.equal(converted[f"{ours}.{leaf}"], state[f"module.{mb}.{leaf}"]), (mb, ours)
    check_class_order(converted)
    return converted


# --- maskrcnn-benchmark .pth -----------------------------------------------------------------------
def test_maskrcnn_benchmark_pth_fills_the_preset_name_by_name(tmp_path, preset_model):
    shapes = maskrcnn_benchmark_mask_rcnn_r50_fpn_shapes()  # "module." + ... (a DDP model)
    model_state = numbered(shapes)
    for src, _, _ in PREDICTORS:
        for leaf in ("weight", "bias"):
            model_state[f"module.{src}.{leaf}"] = numbered_rows(model_state[f"module.{src}.{leaf}"])
    path = tmp_path / "model_final.pth"
    optimizer = {"state": {}, "param_groups": [{"lr": 0.02, "momentum": 0.9, "params": list(range(5))}]}
    scheduler = {"milestones": [60000, 80000], "gamma": 0.1, "last_epoch": 90000, "base_lrs": [0.02]}
    torch.save({"model": model_state, "optimizer": optimizer, "scheduler": scheduler, "iteration": 90000}, path)

    dropped = [f"rpn.anchor_generator.cell_anchors.{i}" for i in range(5)]
    converted = convert_maskrcnn_benchmark_pth(path, shapes, model_state, preset_model, HEAD_MODULES, dropped)
    # Body spot checks: torchvision's layer{k} is res{k+1}; FrozenBN's var lowered by eps.
    body = {
        "stem.conv1.weight": "stem.conv1.weight",
        "stem.bn1.bias": "stem.bn1.bias",
        "layer1.0.downsample.0.weight": "res2.0.downsample.0.weight",
        "layer3.5.conv2.weight": "res4.5.conv2.weight",
        "layer4.2.bn3.running_mean": "res5.2.bn3.running_mean",
    }
    for mb, ours in body.items():
        assert torch.equal(converted["backbone.bottom_up." + ours], model_state["module.backbone.body." + mb]), mb
    got = converted["backbone.bottom_up.res3.0.downsample.1.running_var"]
    assert torch.equal(got, model_state["module.backbone.body.layer2.0.downsample.1.running_var"] - EPS)
    preset_model.load_state_dict(converted, strict=True)


class _FrozenBNWithoutEps(nn.Module):
    """maskrcnn-benchmark's FrozenBatchNorm2d: scale = weight / sqrt(running_var), no eps."""

    def __init__(self, bn):
        super().__init__()
        scale = bn.weight.detach() * bn.running_var.rsqrt()
        self.register_buffer("scale", scale.view(1, -1, 1, 1))
        self.register_buffer("shift", (bn.bias.detach() - bn.running_mean * scale).view(1, -1, 1, 1))

    def forward(self, x):
        return x * self.scale + self.shift


def _maskrcnn_benchmark_body(state):
    """A plain-PyTorch R-50 body as maskrcnn-benchmark builds it: torchvision's modules with the
    stride on the first 1x1 conv of each downsampling block and eps-free frozen norms."""
    torchvision = pytest.importorskip("torchvision")
    net = torchvision.models.resnet50(weights=None)
    net.load_state_dict(state)
    for block in [b for layer in (net.layer2, net.layer3, net.layer4) for b in layer]:
        if block.conv2.stride == (2, 2):
            block.conv1.stride, block.conv2.stride = (2, 2), (1, 1)

    def freeze(module):
        for name, child in module.named_children():
            if isinstance(child, nn.BatchNorm2d):
                setattr(module, name, _FrozenBNWithoutEps(child))
            else:
                freeze(child)

    freeze(net)
    return net.eval()


def test_maskrcnn_benchmark_body_computes_what_theirs_computes(preset_model):
    tv_state = random_resnet50_state()
    # Their ResNet has torchvision's stage names, its stem under "stem.", and FrozenBN norms.
    mb_state = {}
    for name, tensor in tv_state.items():
        if name.endswith("num_batches_tracked") or name.startswith("fc."):
            continue
        if name.startswith(("conv1.", "bn1.")):
            name = "stem." + name
        mb_state["module.backbone.body." + name] = tensor
    # A few tiny variances, where the missing eps matters most.
    mb_state["module.backbone.body.layer1.0.bn2.running_var"][:8] = 1e-4
    tv_state["layer1.0.bn2.running_var"][:8] = 1e-4
    reference = _maskrcnn_benchmark_body(tv_state)
    for name, shape in maskrcnn_benchmark_mask_rcnn_r50_fpn_shapes().items():  # FPN and heads
        mb_state.setdefault(name, torch.zeros(shape))
    converted, report = convert_state_dict(mb_state, preset_model)
    assert report.format == "maskrcnn-benchmark"
    preset_model.load_state_dict(converted, strict=False)
    x = torch.randn(1, 3, 96, 128) * 50
    with torch.no_grad():
        expected = reference.layer4(reference.layer3(reference.layer2(reference.layer1(
            reference.maxpool(reference.relu(reference.bn1(reference.conv1(x))))))))  # fmt: skip
        got = preset_model.backbone.bottom_up(x)["res5"]
    assert expected.abs().max() > 0
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5 * float(expected.abs().max()))


# --- Detectron .pkl ------------------------------------------------------------------------------
def test_detectron_pkl_fills_the_preset_name_by_name(tmp_path, preset_model):
    shapes = caffe2_detectron_mask_rcnn_r50_fpn_shapes()
    converted, blobs = convert_detectron_pkl(tmp_path, shapes, [c2 for _, c2, _ in PREDICTORS], preset_model, HEAD_MODULES)
    for c2, ours in {"res4_3_branch2b_w": "res4.3.conv2.weight", "res2_0_branch1_w": "res2.0.downsample.0.weight",
                     "res_conv1_bn_b": "stem.bn1.bias", "res5_2_branch2c_bn_s": "res5.2.bn3.weight"}.items():
        assert torch.equal(converted["backbone.bottom_up." + ours], torch.from_numpy(blobs[c2])), c2
    # AffineChannel: y = x * s + b exactly.
    preset_model.load_state_dict(converted, strict=True)
    bn = preset_model.backbone.bottom_up.res3[1].bn1
    x = torch.randn(2, bn.num_features, 3, 3)
    s = torch.from_numpy(blobs["res3_1_branch2a_bn_s"]).view(1, -1, 1, 1)
    b = torch.from_numpy(blobs["res3_1_branch2a_bn_b"]).view(1, -1, 1, 1)
    torch.testing.assert_close(bn(x), x * s + b)


# --- not torchvision -------------------------------------------------------------------------------
def test_maskrcnn_benchmark_is_not_taken_for_torchvision():
    # Both put a torchvision-named ResNet under backbone.body.; before strict detection a
    # maskrcnn-benchmark file was read as torchvision's and lost its stem, FPN and heads.
    keys = maskrcnn_benchmark_mask_rcnn_r50_fpn_shapes(ddp=False)
    assert detect_format(keys) == "maskrcnn-benchmark"
    by_format = {m.layout.format: m for m in match_layouts({k: torch.empty(0) for k in keys})}
    tv = by_format["torchvision-detection"]
    assert not tv.fits and tv.missing == [
        "torchvision's ResNet stem 'backbone.body.conv1.weight'",
        "torchvision's FPN (backbone.fpn.inner_blocks, layer_blocks)",
    ]
    assert by_format["maskrcnn-benchmark"].fits and not by_format["maskrcnn-benchmark"].unexplained
