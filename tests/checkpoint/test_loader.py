"""Loading into a model: backbone initialization, class-count changes, the report, the tool."""
import importlib.util
import pathlib
import runpy

import pytest
import torch

from detcore.checkpoint import LoadReport, convert_state_dict, load_converted_state_dict
from detcore.config import get_cfg
from detcore.modeling import build_model

from .zoo_names import torchvision_resnet50_shapes

REPO = pathlib.Path(__file__).resolve().parents[2]


def model_from(config, *opts):
    cfg = get_cfg()
    cfg.merge_from_file(str(REPO / "configs" / config))
    cfg.merge_from_list(["MODEL.DEVICE", "cpu"] + list(opts))
    return build_model(cfg)


def small_model(num_classes=3):
    return model_from("e2e_mask_rcnn_R_18_FPN_shapes.yaml", "MODEL.ROI_HEADS.NUM_CLASSES", num_classes)


@pytest.fixture(scope="module")
def r50_model():
    # The torchvision recipe's body: stride on the 3x3 conv, FrozenBN.
    return model_from("torchvision/mask_rcnn_R_50_FPN.yaml")


def random_resnet50_state(prefix=""):
    """A torchvision-named ResNet-50 state dict with random weights and BN statistics."""
    g = torch.Generator().manual_seed(0)
    state = {}
    for name, shape in torchvision_resnet50_shapes(prefix).items():
        if name.endswith("num_batches_tracked"):
            state[name] = torch.tensor(100)
        elif len(shape) == 1 and name.endswith(("running_var", ".weight")):
            state[name] = torch.rand(shape, generator=g) + 0.5
        elif len(shape) == 4:
            fan_in = shape[1] * shape[2] * shape[3]
            state[name] = torch.randn(shape, generator=g) * (2.0 / fan_in) ** 0.5
        else:
            state[name] = torch.randn(shape, generator=g) * 0.1
    return state


def check_backbone_report(report, model, body_prefix="backbone.bottom_up."):
    model_keys = set(model.state_dict())
    body = {k for k in model_keys if k.startswith(body_prefix)}
    assert {dst for _, dst, _ in report.mapped} == body
    assert {k for k, _ in report.missing} == model_keys - body
    assert not report.shape_mismatch and not report.reinitialized
    classifier = {k: why for k, why in report.dropped if k.endswith(("fc.weight", "fc.bias"))}
    assert len(classifier) == 2 and all("classifier" in why for why in classifier.values())
    others = [k for k, _ in report.dropped if k not in classifier]
    assert others and all(k.endswith("num_batches_tracked") for k in others)


# --- backbone initialization ---------------------------------------------------------------------
def test_torchvision_resnet50_initializes_the_body(tmp_path, r50_model):
    state = random_resnet50_state()
    path = tmp_path / "resnet50.pth"
    torch.save(state, path)
    converted, report = load_converted_state_dict(path, r50_model)
    assert report.format == "torchvision-resnet"
    assert not report.unexpected, report.table()
    check_backbone_report(report, r50_model)
    assert not [n for n in report.notes if "STRIDE_IN_1X1" in n or "FORMAT" in n]
    torch.testing.assert_close(
        converted["backbone.bottom_up.res4.5.bn3.running_var"], state["layer3.5.bn3.running_var"]
    )
    torch.testing.assert_close(converted["backbone.bottom_up.stem.conv1.weight"], state["conv1.weight"])


def test_body_computes_what_torchvision_resnet50_computes(r50_model):
    torchvision = pytest.importorskip("torchvision")
    resnet = torchvision.models.resnet50(weights=None)
    resnet.load_state_dict(random_resnet50_state())
    resnet.eval()
    converted, _ = convert_state_dict(resnet.state_dict(), r50_model)
    r50_model.load_state_dict(converted, strict=False)
    x = torch.randn(1, 3, 96, 128)
    with torch.no_grad():
        expected = resnet.layer4(resnet.layer3(resnet.layer2(resnet.layer1(
            resnet.maxpool(resnet.relu(resnet.bn1(resnet.conv1(x))))))))  # fmt: skip
        got = r50_model.backbone.bottom_up(x)["res5"]
    assert expected.abs().max() > 0
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5 * float(expected.abs().max()))


def test_prefixed_resnet_as_in_self_supervised_wrappers(r50_model):
    state = random_resnet50_state(prefix="module.pre.")
    state["module.head.weight"] = torch.zeros(128, 768)  # a projection head beside the ResNet
    converted, report = convert_state_dict(state, r50_model)
    assert report.format == "torchvision-resnet"
    check_backbone_report(report, r50_model)
    assert [(k, shape) for k, _, shape in report.unexpected] == [("module.head.weight", (128, 768))]
    assert any("module.pre." in n for n in report.notes)
    torch.testing.assert_close(
        converted["backbone.bottom_up.res3.0.downsample.0.weight"], state["module.pre.layer2.0.downsample.0.weight"]
    )


def test_imgsim_checkpoint_if_installed(r50_model):
    spec = importlib.util.find_spec("imgsim")
    if spec is None:
        pytest.skip("the imgsim package (a self-supervised ResNet-50 under 'module.pre.') is not installed")
    path = pathlib.Path(spec.origin).parent / "model.pth"
    _, report = load_converted_state_dict(path, r50_model)
    assert report.format == "torchvision-resnet"
    assert not report.unexpected
    check_backbone_report(report, r50_model)


def test_settings_that_do_not_fit_the_weights_are_noted():
    msra_style = model_from("detectron2/mask_rcnn_R_50_FPN_1x.yaml")  # stride on 1x1, BGR
    _, report = convert_state_dict(random_resnet50_state(), msra_style)
    text = " ".join(report.notes)
    assert "STRIDE_IN_1X1 False" in text and "RGB" in text
    assert "note: " in report.table()


# --- class counts, detcore checkpoints, errors ----------------------------------------------------
def test_class_count_change_reinitializes_only_the_predictors(tmp_path):
    coco = small_model(num_classes=80)
    path = tmp_path / "coco.pth"
    torch.save({"model": coco.state_dict(), "iteration": 10}, path)
    mine = small_model(num_classes=3)
    before = {k: v.clone() for k, v in mine.state_dict().items()}
    converted, report = load_converted_state_dict(path, mine)
    mine.load_state_dict(converted, strict=False)

    reinit = {dst for _, dst, _, _ in report.reinitialized}
    assert reinit == {
        f"roi_heads.{layer}.{leaf}"
        for layer in ("box_predictor.cls_score", "box_predictor.bbox_pred", "mask_head.predictor")
        for leaf in ("weight", "bias")
    }
    assert not report.missing and not report.unexpected and not report.shape_mismatch
    assert any("80 classes" in n and "3" in n for n in report.notes)
    after = mine.state_dict()
    for name in after:
        source = before if name in reinit else coco.state_dict()
        assert torch.equal(after[name], source[name]), name


def test_detcore_checkpoint_round_trip_with_ddp_prefix():
    model = small_model()
    state = {"module." + k: v for k, v in model.state_dict().items()}
    converted, report = convert_state_dict(state, small_model())
    assert report.format == "detcore" and report.complete
    assert any("module." in n for n in report.notes)
    for k, v in model.state_dict().items():
        assert torch.equal(converted[k], v)


def test_shape_mismatch_is_reported_not_loaded():
    model = small_model()
    state = model.state_dict()
    fpn_shape = tuple(state["backbone.fpn_output3.weight"].shape)
    fc_bias_shape = tuple(state["roi_heads.box_head.fc1.bias"].shape)
    state["backbone.fpn_output3.weight"] = torch.zeros(7, 7, 3, 3)
    state["roi_heads.box_head.extra.weight"] = torch.zeros(2)
    del state["roi_heads.box_head.fc1.bias"]
    converted, report = convert_state_dict(state, model)
    assert report.shape_mismatch == [
        ("backbone.fpn_output3.weight", "backbone.fpn_output3.weight", (7, 7, 3, 3), fpn_shape)
    ]
    assert "backbone.fpn_output3.weight" not in converted
    assert report.missing == [("roi_heads.box_head.fc1.bias", fc_bias_shape)]
    assert [k for k, _, _ in report.unexpected] == ["roi_heads.box_head.extra.weight"]
    assert not report.complete
    table = report.table()
    for status in ("SHAPE MISMATCH", "MISSING", "UNEXPECTED", "mapped"):
        assert status in table
    assert f"(7, 7, 3, 3) vs model {fpn_shape}" in table


def test_nothing_fits_is_an_error():
    with pytest.raises(ValueError, match="no tensor of .* fits the model"):
        convert_state_dict({"backbone.bottom_up.stem.bn1.weight": torch.zeros(5)}, small_model())


def test_a_file_of_unrelated_tensors_is_named(tmp_path):
    """Its format cannot be told: the error says which file (it is what the user gave as MODEL.WEIGHTS)."""
    path = tmp_path / "unrelated.pth"
    torch.save({"foo": torch.zeros(3), "bar": torch.ones(2, 2)}, path)
    with pytest.raises(ValueError, match=rf"^{path}: cannot tell the checkpoint format: no known layout fits its 2 keys"):
        load_converted_state_dict(path, small_model())


def test_report_table_groups_a_modules_keys():
    report = LoadReport(source="x.pth", format="torchvision-detection")
    for leaf in ("weight", "bias", "running_mean", "running_var"):
        report.mapped.append((f"backbone.body.bn1.{leaf}", f"backbone.bottom_up.stem.bn1.{leaf}", (64,)))
    report.dropped += [(f"layer1.{i}.bn1.num_batches_tracked", "BatchNorm step counter") for i in range(5)]
    report.notes.append("something to know")
    lines = report.table().splitlines()
    assert lines[0].startswith("Checkpoint x.pth (torchvision-detection): mapped 4, missing 0")
    row = [line for line in lines if "stem.bn1" in line]
    assert len(row) == 1 and "backbone.body.bn1.{weight,bias,running_mean,running_var}" in row[0]
    assert any("5 keys, e.g. layer1.0.bn1.num_batches_tracked" in line for line in lines)
    assert lines[-1] == "  note: something to know"
    assert len(report.table(group=False).splitlines()) == len(lines) + 3 + 4


# --- tools/convert_checkpoint.py -----------------------------------------------------------------
def test_convert_tool_with_and_without_a_config(tmp_path, capsys):
    tool = runpy.run_path(str(REPO / "tools" / "convert_checkpoint.py"))
    src = tmp_path / "resnet50.pth"
    torch.save(random_resnet50_state(prefix="module.pre."), src)

    out = tmp_path / "names_only.pth"
    report = tool["main"]([str(src), str(out)])
    assert report.format == "torchvision-resnet"
    assert "wrote" in capsys.readouterr().out
    model = model_from("torchvision/faster_rcnn_R_50_FPN.yaml")
    converted, again = load_converted_state_dict(out, model)
    assert again.format == "detcore"
    assert len(converted) == len(report.mapped)

    out2 = tmp_path / "for_model.pth"
    report = tool["main"]([str(src), str(out2), "--config-file", str(REPO / "configs/torchvision/faster_rcnn_R_50_FPN.yaml")])
    printed = capsys.readouterr().out
    assert "MISSING" in printed and "mapped" in printed  # the heads are not in a backbone file
    saved = torch.load(out2, weights_only=True)
    assert saved["converted_from"]["format"] == "torchvision-resnet"
    assert set(saved["model"]) == {dst for _, dst, _ in report.mapped}
