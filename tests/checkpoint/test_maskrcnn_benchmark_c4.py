"""maskrcnn-benchmark's and Detectron's C4 Mask R-CNN checkpoints into
configs/maskrcnn_benchmark/e2e_mask_rcnn_R_50_C4_1x.yaml: every name, shape and value placed where
the reference's module structure says (zoo_names.py and the pairs below are written from their
model code: the body's layer1..layer3, res5 as the box head's ResNetHead ``layer4`` shared with
the mask head, the single-level RPN, MaskRCNNC4Predictor), and the res5 head computing what
theirs does."""

import pytest
import torch

from detcore.checkpoint import convert_keys, convert_state_dict
from detcore.config import get_cfg
from detcore.modeling import build_model

from .test_loader import random_resnet50_state
from .test_maskrcnn_benchmark import (
    EPS,
    REPO,
    _maskrcnn_benchmark_body,
    convert_detectron_pkl,
    convert_maskrcnn_benchmark_pth,
    numbered,
    numbered_rows,
)
from .zoo_names import caffe2_detectron_mask_rcnn_r50_c4_shapes, maskrcnn_benchmark_mask_rcnn_r50_c4_shapes

PRESET = REPO / "configs" / "maskrcnn_benchmark" / "e2e_mask_rcnn_R_50_C4_1x.yaml"
BOX_RES5 = "roi_heads.box.feature_extractor.head."
MASK_RES5 = "roi_heads.mask.feature_extractor.head."

# (maskrcnn-benchmark module, Detectron blob, detcore module) outside the ResNet stages.
HEAD_MODULES = [
    ("rpn.head.conv", "conv_rpn", "proposal_generator.rpn_head.conv"),
    ("rpn.head.cls_logits", "rpn_cls_logits", "proposal_generator.rpn_head.objectness_logits"),
    ("rpn.head.bbox_pred", "rpn_bbox_pred", "proposal_generator.rpn_head.anchor_deltas"),
    ("roi_heads.mask.predictor.conv5_mask", "conv5_mask", "roi_heads.mask_head.deconv"),
]
PREDICTORS = [
    ("roi_heads.box.predictor.cls_score", "cls_score"),
    ("roi_heads.box.predictor.bbox_pred", "bbox_pred"),
    ("roi_heads.mask.predictor.mask_fcn_logits", "mask_fcn_logits"),
]
# (maskrcnn-benchmark name, Detectron blob, detcore name) in the stages: the body's layer1..3
# are the backbone's res2..res4, the box head's layer4 is the ROI heads' res5.
STAGE_PAIRS = [
    ("backbone.body.stem.conv1.weight", "conv1_w", "backbone.stem.conv1.weight"),
    ("backbone.body.stem.bn1.bias", "res_conv1_bn_b", "backbone.stem.bn1.bias"),
    ("backbone.body.layer1.0.downsample.0.weight", "res2_0_branch1_w", "backbone.res2.0.downsample.0.weight"),
    ("backbone.body.layer3.5.conv2.weight", "res4_5_branch2b_w", "backbone.res4.5.conv2.weight"),
    ("backbone.body.layer3.5.bn3.weight", "res4_5_branch2c_bn_s", "backbone.res4.5.bn3.weight"),
    (BOX_RES5 + "layer4.0.conv1.weight", "res5_0_branch2a_w", "roi_heads.res5.0.conv1.weight"),
    (BOX_RES5 + "layer4.0.downsample.0.weight", "res5_0_branch1_w", "roi_heads.res5.0.downsample.0.weight"),
    (BOX_RES5 + "layer4.2.bn3.bias", "res5_2_branch2c_bn_b", "roi_heads.res5.2.bn3.bias"),
]


@pytest.fixture(scope="module")
def preset_model():
    cfg = get_cfg()
    cfg.merge_from_file(str(PRESET))
    cfg.merge_from_list(["MODEL.DEVICE", "cpu"])
    return build_model(cfg).eval()


def maskrcnn_benchmark_c4_state():
    """A numbered C4 model dict (DDP prefix) whose mask head holds the box head's res5, as
    SHARE_BOX_FEATURE_EXTRACTOR makes it; predictor rows numbered by row."""
    shapes = maskrcnn_benchmark_mask_rcnn_r50_c4_shapes()
    state = numbered(shapes)
    for key in state:
        if key.startswith("module." + MASK_RES5):
            state[key] = state["module." + BOX_RES5 + key[len("module." + MASK_RES5):]]
    for src, _ in PREDICTORS:
        for leaf in ("weight", "bias"):
            state[f"module.{src}.{leaf}"] = numbered_rows(state[f"module.{src}.{leaf}"])
    return shapes, state


def test_maskrcnn_benchmark_c4_pth_fills_the_preset_name_by_name(tmp_path, preset_model):
    shapes, state = maskrcnn_benchmark_c4_state()
    path = tmp_path / "model_final.pth"
    torch.save({"model": state, "optimizer": {}, "scheduler": {}, "iteration": 180000}, path)

    shared = sorted(k[len("module."):] for k in shapes if k.startswith("module." + MASK_RES5))
    assert len(shared) == 3 * 15 + 5  # 3 blocks x (3 convs + 3 norms x 4) + the projection
    dropped = ["rpn.anchor_generator.cell_anchors.0"] + shared
    converted = convert_maskrcnn_benchmark_pth(path, shapes, state, preset_model, HEAD_MODULES, dropped)
    for mb, _, ours in STAGE_PAIRS:
        assert torch.equal(converted[ours], state["module." + mb]), mb
    for mb, ours in (("backbone.body.layer2.0.downsample.1.running_var", "backbone.res3.0.downsample.1.running_var"),
                     (BOX_RES5 + "layer4.1.bn2.running_var", "roi_heads.res5.1.bn2.running_var")):  # fmt: skip
        assert torch.equal(converted[ours], state["module." + mb] - EPS), mb
    preset_model.load_state_dict(converted, strict=True)


def test_a_mask_head_with_its_own_res5_is_refused():
    # SHARE_BOX_FEATURE_EXTRACTOR False: two res5 stages, which detcore's Res5ROIHeads cannot hold.
    _, state = maskrcnn_benchmark_c4_state()
    key = "module." + MASK_RES5 + "layer4.1.conv2.weight"
    state[key] = state[key] + 1
    with pytest.raises(ValueError) as info:
        convert_keys(state)
    message = str(info.value)
    assert "maskrcnn-benchmark" in message and "SHARE_BOX_FEATURE_EXTRACTOR" in message
    assert "roi_heads.mask.feature_extractor.head.layer4.1.conv2.weight" in message


def test_detectron_c4_pkl_fills_the_preset_name_by_name(tmp_path, preset_model):
    converted, blobs = convert_detectron_pkl(
        tmp_path, caffe2_detectron_mask_rcnn_r50_c4_shapes(), [c2 for _, c2 in PREDICTORS], preset_model, HEAD_MODULES
    )
    for _, c2, ours in STAGE_PAIRS:
        assert torch.equal(converted[ours], torch.from_numpy(blobs[c2])), c2
    preset_model.load_state_dict(converted, strict=True)


def test_c4_body_and_res5_head_compute_what_theirs_compute(preset_model):
    """The converted body gives maskrcnn-benchmark's res4 (layer3) and the ROI heads' res5 its
    ResNetHead's output (layer4: stride on the first 1x1 conv, eps-free FrozenBN) and
    FastRCNNPredictor's scores (average pool, then the linear layers)."""
    tv_state = random_resnet50_state()
    # A few tiny variances, where the missing eps matters most.
    tv_state["layer3.0.bn2.running_var"][:8] = 1e-4
    tv_state["layer4.0.bn2.running_var"][:8] = 1e-4
    reference = _maskrcnn_benchmark_body(tv_state)
    state = {}
    for name, tensor in tv_state.items():
        if name.endswith("num_batches_tracked") or name.startswith("fc."):
            continue
        if name.startswith(("conv1.", "bn1.")):
            state["backbone.body.stem." + name] = tensor
        elif name.startswith("layer4."):
            state[BOX_RES5 + name] = state[MASK_RES5 + name] = tensor
        else:
            state["backbone.body." + name] = tensor
    g = torch.Generator().manual_seed(0)
    for name, shape in maskrcnn_benchmark_mask_rcnn_r50_c4_shapes(ddp=False).items():
        if name not in state:
            state[name] = torch.randn(shape, generator=g) * 0.01
    converted, report = convert_state_dict(state, preset_model)
    assert report.format == "maskrcnn-benchmark" and report.complete, report.table()
    preset_model.load_state_dict(converted, strict=True)

    x = torch.randn(1, 3, 96, 128) * 50
    pooled = torch.randn(5, 1024, 14, 14)
    with torch.no_grad():
        expected_res4 = reference.layer3(reference.layer2(reference.layer1(
            reference.maxpool(reference.relu(reference.bn1(reference.conv1(x)))))))  # fmt: skip
        got_res4 = preset_model.backbone(x)["res4"]
        expected_res5 = reference.layer4(pooled)
        got_res5 = preset_model.roi_heads.res5(pooled)
        cls_score = state["roi_heads.box.predictor.cls_score.weight"]
        expected_scores = expected_res5.mean(dim=(2, 3)) @ cls_score.T + state["roi_heads.box.predictor.cls_score.bias"]
        got_scores, _ = preset_model.roi_heads.box_predictor(got_res5.mean(dim=(2, 3)))
    assert got_res5.shape == (5, 2048, 7, 7)
    for got, expected in ((got_res4, expected_res4), (got_res5, expected_res5)):
        assert expected.abs().max() > 0
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5 * float(expected.abs().max()))
    # Background is their output 0, detcore's last.
    torch.testing.assert_close(got_scores, torch.cat([expected_scores[:, 1:], expected_scores[:, :1]], 1), rtol=1e-4, atol=1e-4)


def test_the_c4_preset_runs_a_maskrcnn_benchmark_checkpoint(tmp_path):
    """End to end through the Predictor: the file loads completely and the model (legacy boxes,
    adaptive Detectron ROIAlign on res4, res5 per ROI, 14x14 masks pasted its way) returns
    detections with masks in the photo's size."""
    from detcore.engine import Predictor

    _, state = maskrcnn_benchmark_c4_state()
    g = torch.Generator().manual_seed(1)
    state = {k: (torch.randn(v.shape, generator=g) * 0.02 if v.dim() > 1 else v * 0) for k, v in state.items()}
    for key in state:  # FrozenBN: unit statistics; a confident class 1 and an object-heavy RPN
        if key.endswith("running_var") or (key.endswith(".weight") and state[key].dim() == 1):
            state[key] = torch.ones_like(state[key])
        if key.startswith("module." + MASK_RES5):
            state[key] = state["module." + BOX_RES5 + key[len("module." + MASK_RES5):]]
    state["module.roi_heads.box.predictor.cls_score.bias"][1] = 5.0
    state["module.rpn.head.cls_logits.bias"][:] = 3.0
    path = tmp_path / "c4.pth"
    torch.save({"model": state}, path)
    cfg = get_cfg()
    cfg.merge_from_file(str(PRESET))
    cfg.merge_from_list(["MODEL.DEVICE", "cpu", "MODEL.WEIGHTS", str(path), "INPUT.MIN_SIZE_TEST", "96",
                         "MODEL.RPN.PRE_NMS_TOPK_TEST", "200", "MODEL.RPN.POST_NMS_TOPK_TEST", "50"])  # fmt: skip
    predictor = Predictor(cfg)
    assert predictor.load_report.format == "maskrcnn-benchmark" and predictor.load_report.complete
    image = (torch.rand(75, 100, 3, generator=g) * 255).to(torch.uint8).numpy()
    out = predictor(image)
    assert len(out["boxes"]) > 0 and (out["labels"] == 0).all()  # their class 1
    assert out["masks"].shape == (len(out["boxes"]), 75, 100)
