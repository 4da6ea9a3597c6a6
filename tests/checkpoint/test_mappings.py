"""Key renaming (format detection: test_layouts.py), checked against the published parameter names of
detectron2's, torchvision's and caffe2's models (written out here, independently of the code)."""
import pickle

import numpy as np
import pytest
import torch

from detcore.checkpoint import convert_keys, load_converted_state_dict
from detcore.config import get_cfg
from detcore.modeling import build_model

from .zoo_names import (
    caffe2_resnet50_shapes,
    detectron2_imagenet_resnet50_shapes,
    detectron2_mask_rcnn_r50_c4_shapes,
    detectron2_mask_rcnn_r50_fpn_shapes,
    detectron2_retinanet_r50_fpn_shapes,
    torchvision_maskrcnn_v1_shapes,
    torchvision_retinanet_v1_shapes,
)

REPO_CONFIGS = __import__("pathlib").Path(__file__).resolve().parents[2] / "configs"


def model_from(config, **overrides):
    cfg = get_cfg()
    cfg.merge_from_file(str(REPO_CONFIGS / config))
    opts = ["MODEL.DEVICE", "cpu"]
    for key, value in overrides.items():
        opts += [key, value]
    cfg.merge_from_list(opts)
    return build_model(cfg)


@pytest.fixture(scope="module")
def d2_model():
    return model_from("detectron2/mask_rcnn_R_50_FPN_1x.yaml")


@pytest.fixture(scope="module")
def d2_c4_model():
    return model_from("detectron2/mask_rcnn_R_50_C4_1x.yaml")


def numbered_arrays(shapes):
    """Each tensor filled with its own index, so a misplaced one is visible."""
    return {name: np.full(shape, i, dtype=np.float32) for i, (name, shape) in enumerate(shapes.items())}


# --- detectron2 ---------------------------------------------------------------------------------
def test_detectron2_model_zoo_pkl_maps_every_name(tmp_path, d2_model):
    shapes = detectron2_mask_rcnn_r50_fpn_shapes()
    arrays = numbered_arrays(shapes)
    path = tmp_path / "model_final_f10217.pkl"
    with open(path, "wb") as f:
        pickle.dump({"model": arrays, "__author__": "Detectron2 Model Zoo"}, f)

    state_dict, report = load_converted_state_dict(path, d2_model)
    assert report.format == "detectron2"
    assert report.complete, report.table()
    assert len(report.mapped) == len(shapes) == len(d2_model.state_dict())
    assert {src for src, _, _ in report.mapped} == set(shapes)  # every name used, none left over
    model_state = d2_model.state_dict()
    for src, dst, shape in report.mapped:
        assert tuple(model_state[dst].shape) == shapes[src] == shape
    # Spot checks that values land where they belong.
    pairs = {
        "backbone.bottom_up.stem.conv1.norm.running_var": "backbone.bottom_up.stem.bn1.running_var",
        "backbone.bottom_up.res3.0.conv2.norm.bias": "backbone.bottom_up.res3.0.bn2.bias",
        "backbone.bottom_up.res4.0.shortcut.weight": "backbone.bottom_up.res4.0.downsample.0.weight",
        "backbone.bottom_up.res5.0.shortcut.norm.running_mean": "backbone.bottom_up.res5.0.downsample.1.running_mean",
        "roi_heads.box_predictor.cls_score.weight": "roi_heads.box_predictor.cls_score.weight",
        "roi_heads.mask_head.deconv.weight": "roi_heads.mask_head.deconv.weight",
    }
    for src, dst in pairs.items():
        assert torch.equal(state_dict[dst], torch.from_numpy(arrays[src]))
    d2_model.load_state_dict(state_dict, strict=True)


def test_detectron2_c4_model_zoo_pkl_maps_every_name(tmp_path, d2_c4_model):
    """detectron2's mask_rcnn_R_50_C4_1x checkpoint fills the detectron2 C4 preset name by name:
    the body under backbone., res5 under roi_heads.res5 (its convs' norms renamed as for FPN)."""
    model = d2_c4_model
    shapes = detectron2_mask_rcnn_r50_c4_shapes()
    arrays = numbered_arrays(shapes)
    path = tmp_path / "model_final_b1acc2.pkl"
    with open(path, "wb") as f:
        pickle.dump({"model": arrays, "__author__": "Detectron2 Model Zoo"}, f)

    state_dict, report = load_converted_state_dict(path, model)
    assert report.format == "detectron2"
    assert report.complete, report.table()
    assert len(report.mapped) == len(shapes) == len(model.state_dict())
    assert {src for src, _, _ in report.mapped} == set(shapes)
    model_state = model.state_dict()
    for src, dst, shape in report.mapped:
        assert tuple(model_state[dst].shape) == shapes[src] == shape
    pairs = {
        "backbone.stem.conv1.norm.running_mean": "backbone.stem.bn1.running_mean",
        "backbone.res4.5.conv3.norm.weight": "backbone.res4.5.bn3.weight",
        "backbone.res2.0.shortcut.weight": "backbone.res2.0.downsample.0.weight",
        "roi_heads.res5.0.shortcut.norm.bias": "roi_heads.res5.0.downsample.1.bias",
        "roi_heads.res5.2.conv2.weight": "roi_heads.res5.2.conv2.weight",
        "roi_heads.res5.1.conv1.norm.running_var": "roi_heads.res5.1.bn1.running_var",
        "proposal_generator.rpn_head.objectness_logits.weight": "proposal_generator.rpn_head.objectness_logits.weight",
        "roi_heads.mask_head.deconv.weight": "roi_heads.mask_head.deconv.weight",
    }
    for src, dst in pairs.items():
        assert torch.equal(state_dict[dst], torch.from_numpy(arrays[src]))
    model.load_state_dict(state_dict, strict=True)


def test_detectron2_pth_with_training_state(tmp_path, d2_model):
    shapes = detectron2_mask_rcnn_r50_fpn_shapes()
    tensors = {k: torch.zeros(s) for k, s in shapes.items()}
    tensors["pixel_mean"] = torch.zeros(3, 1, 1)  # older detectron2 checkpoints saved these
    tensors["proposal_generator.anchor_generator.cell_anchors.0"] = torch.zeros(3, 4)
    path = tmp_path / "model_0004999.pth"
    torch.save({"model": tensors, "iteration": 4999, "scheduler": {"last_epoch": 4999}}, path)
    _, report = load_converted_state_dict(path, d2_model)
    assert report.complete, report.table()
    assert sorted(k for k, _ in report.dropped) == [
        "pixel_mean",
        "proposal_generator.anchor_generator.cell_anchors.0",
    ]


def test_detectron2_rules_leave_head_convs_with_norm_alone():
    # GN heads keep their norm inside the conv in detcore too: only ResNet body names change.
    out = convert_keys(
        {
            "backbone.bottom_up.stem.conv1.norm.weight": torch.zeros(1),
            "backbone.fpn_lateral2.norm.weight": torch.zeros(1),
            "roi_heads.box_head.conv1.norm.weight": torch.zeros(1),
            "roi_heads.mask_head.mask_fcn1.norm.bias": torch.zeros(1),
        },
        "detectron2",
    )
    assert set(out.tensors) == {
        "backbone.bottom_up.stem.bn1.weight",
        "backbone.fpn_lateral2.norm.weight",
        "roi_heads.box_head.conv1.norm.weight",
        "roi_heads.mask_head.mask_fcn1.norm.bias",
    }


# --- torchvision --------------------------------------------------------------------------------
def test_torchvision_v1_and_current_layouts_rename_alike():
    v1 = torchvision_maskrcnn_v1_shapes()
    current = {}
    for name, shape in v1.items():  # torchvision >= 0.13 module layout of the same model
        name = name.replace("rpn.head.conv.", "rpn.head.conv.0.0.")
        for i in range(4):
            name = name.replace(f"fpn.inner_blocks.{i}.", f"fpn.inner_blocks.{i}.0.")
            name = name.replace(f"fpn.layer_blocks.{i}.", f"fpn.layer_blocks.{i}.0.")
            name = name.replace(f"mask_head.mask_fcn{i + 1}.", f"mask_head.{i}.0.")
        current[name] = shape
    tensors = lambda shapes: {k: torch.zeros(s) for k, s in shapes.items()}  # noqa: E731
    a, b = convert_keys(tensors(v1)), convert_keys(tensors(current))
    assert a.format == b.format == "torchvision-detection"
    assert not a.unknown and not b.unknown
    assert set(a.tensors) == set(b.tensors)
    assert "proposal_generator.rpn_head.conv.weight" in a.tensors
    assert "backbone.fpn_lateral5.weight" in a.tensors and "backbone.fpn_output2.bias" in a.tensors
    assert "roi_heads.mask_head.mask_fcn4.weight" in a.tensors
    assert "roi_heads.box_head.fc2.weight" in a.tensors


def test_torchvision_background_moves_last():
    shapes = torchvision_maskrcnn_v1_shapes()
    tensors = {k: torch.zeros(s) for k, s in shapes.items()}
    rows = torch.arange(91, dtype=torch.float32)
    tensors["roi_heads.box_predictor.cls_score.weight"] = rows[:, None].expand(91, 1024).clone()
    tensors["roi_heads.box_predictor.cls_score.bias"] = rows.clone()
    tensors["roi_heads.box_predictor.bbox_pred.weight"] = torch.arange(364.0)[:, None].expand(364, 1024).clone()
    tensors["roi_heads.box_predictor.bbox_pred.bias"] = torch.arange(364.0)
    tensors["roi_heads.mask_predictor.mask_fcn_logits.weight"] = rows.view(91, 1, 1, 1).expand(91, 256, 1, 1).clone()
    tensors["roi_heads.mask_predictor.mask_fcn_logits.bias"] = rows.clone()
    out = convert_keys(tensors).tensors
    order = list(range(1, 91)) + [0]  # torchvision label k+1 becomes class k, background last
    assert out["roi_heads.box_predictor.cls_score.bias"].tolist() == order
    assert out["roi_heads.box_predictor.cls_score.weight"][:, 0].tolist() == order
    assert out["roi_heads.box_predictor.bbox_pred.bias"].tolist() == list(range(4, 364))
    assert out["roi_heads.box_predictor.bbox_pred.weight"][:, 7].tolist() == list(range(4, 364))
    assert out["roi_heads.mask_head.predictor.bias"].tolist() == list(range(1, 91))
    assert out["roi_heads.mask_head.predictor.weight"][:, 3, 0, 0].tolist() == list(range(1, 91))


def test_torchvision_checkpoint_fills_the_torchvision_preset():
    model = model_from("torchvision/mask_rcnn_R_50_FPN.yaml")
    shapes = torchvision_maskrcnn_v1_shapes()
    state = {k: torch.zeros(s) for k, s in shapes.items()}
    from detcore.checkpoint import convert_state_dict

    converted, report = convert_state_dict(state, model)
    assert report.complete, report.table()
    assert len(converted) == len(model.state_dict()) == len(shapes)
    assert not report.notes[1:], report.notes  # only the class-order note: settings fit


# --- caffe2 / MSRA ImageNet ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def msra_r50(tmp_path_factory):
    """An R-50.pkl of random blobs in caffe2 names (with an optimizer blob), and the blobs."""
    shapes = caffe2_resnet50_shapes()
    rng = np.random.default_rng(0)
    blobs = {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}
    blobs["res2_0_branch2a_w_momentum"] = np.zeros(shapes["res2_0_branch2a_w"], np.float32)
    path = tmp_path_factory.mktemp("msra") / "R-50.pkl"
    path.write_bytes(pickle.dumps({"blobs": blobs}, protocol=2))
    return path, blobs


def test_caffe2_msra_resnet50_initializes_the_body(msra_r50, d2_model):
    path, blobs = msra_r50
    state_dict, report = load_converted_state_dict(path, d2_model)
    assert report.format == "caffe2-resnet"
    assert not report.unexpected and not report.shape_mismatch, report.table()
    body = {k for k in d2_model.state_dict() if k.startswith("backbone.bottom_up.")}
    assert set(state_dict) == body  # weights, biases, and synthesized statistics
    assert {k for k, _ in report.missing} == set(d2_model.state_dict()) - body
    assert sorted(k for k, _ in report.dropped) == ["fc1000_b", "fc1000_w", "res2_0_branch2a_w_momentum"]
    assert any("affine only" in n for n in report.notes)

    # caffe2's AffineChannel: y = x * s + b, which the loaded FrozenBN must compute exactly.
    d2_model.load_state_dict(state_dict, strict=False)
    bn = d2_model.backbone.bottom_up.res3[0].bn2
    x = torch.randn(2, bn.num_features, 3, 3)
    s = torch.from_numpy(blobs["res3_0_branch2b_bn_s"]).view(1, -1, 1, 1)
    b = torch.from_numpy(blobs["res3_0_branch2b_bn_b"]).view(1, -1, 1, 1)
    torch.testing.assert_close(bn(x), x * s + b)
    torch.testing.assert_close(
        state_dict["backbone.bottom_up.res4.2.conv3.weight"], torch.from_numpy(blobs["res4_2_branch2c_w"])
    )
    torch.testing.assert_close(
        state_dict["backbone.bottom_up.res5.0.downsample.0.weight"], torch.from_numpy(blobs["res5_0_branch1_w"])
    )


def test_caffe2_msra_resnet50_fills_a_c4_models_body_and_res5_head(msra_r50, d2_c4_model):
    """The C4 recipe starts from ImageNet R-50.pkl: res2..res4 go to the body (backbone.), res5,
    which the body lacks, to the ROI heads' res5."""
    path, blobs = msra_r50
    model = d2_c4_model
    state_dict, report = load_converted_state_dict(path, model)
    assert not report.unexpected and not report.shape_mismatch, report.table()
    resnet = {k for k in model.state_dict() if k.startswith(("backbone.", "roi_heads.res5."))}
    assert set(state_dict) == resnet
    assert any("roi_heads.res5" in n for n in report.notes), report.notes
    torch.testing.assert_close(state_dict["roi_heads.res5.2.conv3.weight"], torch.from_numpy(blobs["res5_2_branch2c_w"]))
    torch.testing.assert_close(state_dict["roi_heads.res5.0.downsample.1.weight"], torch.from_numpy(blobs["res5_0_branch1_bn_s"]))
    torch.testing.assert_close(state_dict["backbone.res4.0.conv1.weight"], torch.from_numpy(blobs["res4_0_branch2a_w"]))
    model.load_state_dict(state_dict, strict=False)


def test_detectron2_imagenet_pickle_with_batchnorm_statistics(tmp_path, d2_model):
    """detectron2's own MSRA R-50.pkl keeps BatchNorm unfused: its statistics load as they are
    (none synthesized), and the FrozenBN computes the BatchNorm of those four blobs."""
    shapes = detectron2_imagenet_resnet50_shapes()
    rng = np.random.default_rng(1)
    blobs = {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}
    for k in blobs:
        if k.endswith("_running_var"):
            blobs[k] = np.abs(blobs[k]) + 0.5
    path = tmp_path / "R-50.pkl"
    path.write_bytes(pickle.dumps(blobs, protocol=2))
    state_dict, report = load_converted_state_dict(path, d2_model)
    assert report.format == "caffe2-resnet"
    assert not report.unexpected and not report.shape_mismatch, report.table()
    body = {k for k in d2_model.state_dict() if k.startswith("backbone.bottom_up.")}
    assert set(state_dict) == body
    assert {src for src, _, _ in report.mapped} == set(shapes) - {"fc1000_w", "fc1000_b"}
    assert not any("affine only" in n for n in report.notes), report.notes

    d2_model.load_state_dict(state_dict, strict=False)
    bn = d2_model.backbone.bottom_up.res3[0].bn2
    x = torch.randn(2, bn.num_features, 3, 3)
    blob = {leaf: torch.from_numpy(blobs[f"res3_0_branch2b_bn_{leaf}"]).view(1, -1, 1, 1)
            for leaf in ("gamma", "beta", "running_mean", "running_var")}
    expected = (x - blob["running_mean"]) / torch.sqrt(blob["running_var"] + bn.eps) * blob["gamma"] + blob["beta"]
    torch.testing.assert_close(bn(x), expected)
    stem = d2_model.backbone.bottom_up.stem.bn1
    torch.testing.assert_close(stem.running_var, torch.from_numpy(blobs["res_conv1_bn_running_var"]))


# --- RetinaNet ----------------------------------------------------------------------------------
def test_detectron2_retinanet_pkl_maps_every_name(tmp_path):
    model = model_from("detectron2/retinanet_R_50_FPN_1x.yaml")
    shapes = detectron2_retinanet_r50_fpn_shapes()
    arrays = numbered_arrays(shapes)
    path = tmp_path / "model_final_bfca0b.pkl"
    with open(path, "wb") as f:
        pickle.dump({"model": arrays, "__author__": "Detectron2 Model Zoo"}, f)
    state_dict, report = load_converted_state_dict(path, model)
    assert report.format == "detectron2" and report.complete, report.table()
    assert len(report.mapped) == len(shapes) == len(model.state_dict())
    assert {src for src, _, _ in report.mapped} == set(shapes)
    assert not report.notes, report.notes  # the preset's settings fit the weights
    pairs = {
        "backbone.bottom_up.res5.2.conv3.norm.running_var": "backbone.bottom_up.res5.2.bn3.running_var",
        "backbone.fpn_lateral3.weight": "backbone.fpn_lateral3.weight",
        "backbone.top_block.p6.weight": "backbone.top_block.p6.weight",
        "head.cls_subnet.6.bias": "head.cls_subnet.6.bias",
        "head.bbox_subnet.0.weight": "head.bbox_subnet.0.weight",
        "head.cls_score.weight": "head.cls_score.weight",
        "head.bbox_pred.bias": "head.bbox_pred.bias",
    }
    for src, dst in pairs.items():
        assert torch.equal(state_dict[dst], torch.from_numpy(arrays[src]))
    model.load_state_dict(state_dict, strict=True)


def test_detectron2_retinanet_pth_drops_its_cell_anchors(tmp_path):
    model = model_from("detectron2/retinanet_R_50_FPN_1x.yaml")
    tensors = {k: torch.zeros(s) for k, s in detectron2_retinanet_r50_fpn_shapes().items()}
    for i in range(5):
        tensors[f"anchor_generator.cell_anchors.{i}"] = torch.zeros(9, 4)
    path = tmp_path / "model_0089999.pth"
    torch.save({"model": tensors, "iteration": 89999}, path)
    _, report = load_converted_state_dict(path, model)
    assert report.complete, report.table()
    assert sorted(k for k, _ in report.dropped) == [f"anchor_generator.cell_anchors.{i}" for i in range(5)]


def test_coco_retinanet_into_a_three_class_model_keeps_all_but_the_classifier(tmp_path):
    model = model_from("detectron2/retinanet_R_50_FPN_1x.yaml", **{"MODEL.RETINANET.NUM_CLASSES": "3"})
    from detcore.checkpoint import convert_state_dict

    state = {k: torch.zeros(s) for k, s in detectron2_retinanet_r50_fpn_shapes().items()}
    converted, report = convert_state_dict(state, model)
    assert {n for _, n, _, _ in report.reinitialized} == {"head.cls_score.weight", "head.cls_score.bias"}
    assert any("predicts 80 classes and the model 3" in n and "head.cls_score" in n for n in report.notes), report.notes
    assert set(converted) == set(model.state_dict()) - {"head.cls_score.weight", "head.cls_score.bias"}
    assert not report.missing and not report.shape_mismatch


def _current_torchvision_retinanet_layout(v1):
    """torchvision >= 0.13 names of the same model (Conv2dNormActivation towers, wrapped FPN convs)."""
    current = {}
    for name, shape in v1.items():
        for i in range(4):
            for head in ("classification_head", "regression_head"):
                name = name.replace(f"head.{head}.conv.{2 * i}.", f"head.{head}.conv.{i}.0.")
        for i in range(3):
            name = name.replace(f"fpn.inner_blocks.{i}.", f"fpn.inner_blocks.{i}.0.")
            name = name.replace(f"fpn.layer_blocks.{i}.", f"fpn.layer_blocks.{i}.0.")
        current[name] = shape
    return current


def test_torchvision_retinanet_fills_the_torchvision_preset_in_both_layouts():
    model = model_from("torchvision/retinanet_R_50_FPN.yaml")
    from detcore.checkpoint import convert_state_dict

    v1 = torchvision_retinanet_v1_shapes()
    for shapes in (v1, _current_torchvision_retinanet_layout(v1)):
        state = {k: torch.zeros(s) for k, s in shapes.items()}
        converted, report = convert_state_dict(state, model)
        assert report.format == "torchvision-detection" and report.complete, report.table()
        assert len(converted) == len(model.state_dict()) == len(shapes)
        assert len(report.notes) == 1 and "per anchor" in report.notes[0], report.notes  # settings fit
    names = {src: dst for src, dst, _ in report.mapped}
    # RetinaNet's FPN starts at C3: inner block 0 is level 3 (the R-CNNs' is level 2).
    assert names["backbone.fpn.inner_blocks.0.0.weight"] == "backbone.fpn_lateral3.weight"
    assert names["backbone.fpn.layer_blocks.2.0.bias"] == "backbone.fpn_output5.bias"
    assert names["backbone.fpn.extra_blocks.p7.weight"] == "backbone.top_block.p7.weight"
    assert names["head.classification_head.conv.3.0.weight"] == "head.cls_subnet.6.weight"
    assert names["head.regression_head.conv.0.0.bias"] == "head.bbox_subnet.0.bias"
    assert names["head.regression_head.bbox_reg.weight"] == "head.bbox_pred.weight"


def test_torchvision_retinanet_drops_each_anchors_background_output():
    shapes = torchvision_retinanet_v1_shapes()
    tensors = {k: torch.zeros(s) for k, s in shapes.items()}
    rows = torch.arange(9 * 91, dtype=torch.float32)  # row a * 91 + c: anchor a, torchvision label c
    tensors["head.classification_head.cls_logits.bias"] = rows.clone()
    tensors["head.classification_head.cls_logits.weight"] = rows.view(-1, 1, 1, 1).expand(819, 256, 3, 3).clone()
    out = convert_keys(tensors).tensors
    expected = [a * 91 + c for a in range(9) for c in range(1, 91)]  # class k = label k + 1
    assert out["head.cls_score.bias"].tolist() == expected
    assert out["head.cls_score.weight"][:, 5, 1, 2].tolist() == expected
    assert out["head.bbox_pred.weight"].shape == (36, 256, 3, 3)
