"""Keypoint R-CNN checkpoints of torchvision and detectron2 onto the presets, name by name. The
published names and shapes are written here from those projects' module structures (not from
detcore's mapping), on top of the R-50-FPN ones of zoo_names.py."""
import pickle

import pytest
import torch

from detcore.checkpoint import convert_state_dict, detect_format, load_converted_state_dict

from .test_mappings import model_from, numbered_arrays
from .zoo_names import detectron2_mask_rcnn_r50_fpn_shapes, torchvision_maskrcnn_v1_shapes

KEYPOINTS = 17


def detectron2_keypoint_rcnn_r50_fpn_shapes():
    """COCO-Keypoints/keypoint_rcnn_R_50_FPN_*: the R-50-FPN Mask R-CNN's names for one class (person)
    without the mask head, and KRCNNConvDeconvUpsampleHead: conv_fcn1..8 (3x3, 512) and the
    score_lowres ConvTranspose2d (weight [in, out, 4, 4])."""
    s = {k: v for k, v in detectron2_mask_rcnn_r50_fpn_shapes(num_classes=1).items() if ".mask_head." not in k}
    cin = 256
    for k in range(1, 9):
        s[f"roi_heads.keypoint_head.conv_fcn{k}.weight"] = (512, cin, 3, 3)
        s[f"roi_heads.keypoint_head.conv_fcn{k}.bias"] = (512,)
        cin = 512
    s["roi_heads.keypoint_head.score_lowres.weight"] = (512, KEYPOINTS, 4, 4)
    s["roi_heads.keypoint_head.score_lowres.bias"] = (KEYPOINTS,)
    return s


def torchvision_keypointrcnn_v1_shapes():
    """keypointrcnn_resnet50_fpn_coco: background + person, KeypointRCNNHeads (an nn.Sequential of
    8 x (conv 3x3 512, ReLU): convs at 0, 2, ..., 14) and KeypointRCNNPredictor.kps_score_lowres."""
    s = {k: v for k, v in torchvision_maskrcnn_v1_shapes().items() if "mask_" not in k}
    s["roi_heads.box_predictor.cls_score.weight"], s["roi_heads.box_predictor.cls_score.bias"] = (2, 1024), (2,)
    s["roi_heads.box_predictor.bbox_pred.weight"], s["roi_heads.box_predictor.bbox_pred.bias"] = (8, 1024), (8,)
    cin = 256
    for i in range(0, 16, 2):
        s[f"roi_heads.keypoint_head.{i}.weight"], s[f"roi_heads.keypoint_head.{i}.bias"] = (512, cin, 3, 3), (512,)
        cin = 512
    s["roi_heads.keypoint_predictor.kps_score_lowres.weight"] = (512, KEYPOINTS, 4, 4)
    s["roi_heads.keypoint_predictor.kps_score_lowres.bias"] = (KEYPOINTS,)
    return s


@pytest.fixture(scope="module")
def tv_model():
    return model_from("torchvision/keypoint_rcnn_R_50_FPN.yaml")


def test_torchvision_keypoint_checkpoint_fills_the_preset_name_by_name(tv_model):
    shapes = torchvision_keypointrcnn_v1_shapes()
    assert detect_format(shapes) == "torchvision-detection"
    state = {k: torch.from_numpy(v) for k, v in numbered_arrays(shapes).items()}
    converted, report = convert_state_dict(state, tv_model)
    assert report.complete, report.table()
    assert len(converted) == len(tv_model.state_dict()) == len(shapes)
    expected = {f"roi_heads.keypoint_head.{2 * k}.weight": f"roi_heads.keypoint_head.conv_fcn{k + 1}.weight" for k in range(8)}
    expected["roi_heads.keypoint_predictor.kps_score_lowres.weight"] = "roi_heads.keypoint_head.score_lowres.weight"
    expected["roi_heads.keypoint_predictor.kps_score_lowres.bias"] = "roi_heads.keypoint_head.score_lowres.bias"
    mapped = {src: dst for src, dst, _ in report.mapped}
    for src, dst in expected.items():
        assert mapped[src] == dst
        assert torch.equal(converted[dst], state[src])
    # Background first in torchvision: the person row moves to 0, background last.
    assert converted["roi_heads.box_predictor.cls_score.bias"].tolist() == state["roi_heads.box_predictor.cls_score.bias"][[1, 0]].tolist()


def test_the_installed_torchvision_module_layout_maps_and_computes_the_same_heatmaps(tv_model):
    torchvision = pytest.importorskip("torchvision")
    tv = torchvision.models.detection.keypointrcnn_resnet50_fpn(weights=None, weights_backbone=None)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # fresh weights at the init's scale, and random biases (the init zeroes them)
        for p in list(tv.roi_heads.keypoint_head.parameters()) + list(tv.roi_heads.keypoint_predictor.parameters()):
            std = (2.0 / p[0].numel()) ** 0.5 if p.dim() > 1 else 0.1
            p.copy_(torch.randn(p.shape, generator=g) * std)
    converted, report = convert_state_dict(tv.state_dict(), tv_model)
    assert report.complete, report.table()
    tv_model.load_state_dict(converted, strict=True)
    # The converted head computes torchvision's heatmaps (convs, deconv and 2x bilinear upsampling).
    pooled = torch.randn(3, 256, 14, 14, generator=g)
    with torch.no_grad():
        expected = tv.eval().roi_heads.keypoint_predictor(tv.roi_heads.keypoint_head(pooled))
        got = tv_model.roi_heads.keypoint_head.layers(pooled)
    assert got.shape == expected.shape == (3, 17, 56, 56) and expected.std() > 0.1
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


def test_detectron2_keypoint_checkpoint_fills_its_preset_name_by_name(tmp_path):
    model = model_from("detectron2/keypoint_rcnn_R_50_FPN_1x.yaml")
    shapes = detectron2_keypoint_rcnn_r50_fpn_shapes()
    arrays = numbered_arrays(shapes)
    path = tmp_path / "model_final_04e291.pkl"
    with open(path, "wb") as f:
        pickle.dump({"model": arrays, "__author__": "Detectron2 Model Zoo"}, f)
    state_dict, report = load_converted_state_dict(path, model)
    assert report.format == "detectron2" and report.complete, report.table()
    assert {src for src, _, _ in report.mapped} == set(shapes) and len(shapes) == len(model.state_dict())
    model_state = model.state_dict()
    for src, dst, shape in report.mapped:
        assert tuple(model_state[dst].shape) == shapes[src] == shape
    for name in ("roi_heads.keypoint_head.conv_fcn1.weight", "roi_heads.keypoint_head.conv_fcn8.bias",
                 "roi_heads.keypoint_head.score_lowres.weight"):  # fmt: skip
        assert torch.equal(state_dict[name], torch.from_numpy(arrays[name]))
    model.load_state_dict(state_dict, strict=True)


def test_presets_set_the_keypoint_heads_of_their_sources():
    tv = model_from("torchvision/keypoint_rcnn_R_50_FPN.yaml").roi_heads
    d2 = model_from("detectron2/keypoint_rcnn_R_50_FPN_1x.yaml").roi_heads
    # torchvision: MultiScaleRoIAlign(14, sampling_ratio=2), aligned=False; detectron2: ROIAlignV2.
    assert (tv.keypoint_pooler.output_size, tv.keypoint_pooler.sampling_ratio, tv.keypoint_pooler.aligned) == ((14, 14), 2, False)
    assert (d2.keypoint_pooler.output_size, d2.keypoint_pooler.sampling_ratio, d2.keypoint_pooler.aligned) == ((14, 14), 0, True)
    for heads in (tv, d2):
        assert heads.keypoint_on and not heads.mask_on and heads.num_classes == 1
        assert len(heads.keypoint_head.convs) == 8 and heads.keypoint_head.score_lowres.out_channels == KEYPOINTS
    assert d2.box_predictor.smooth_l1_beta == 0.5  # detectron2's keypoint recipe
