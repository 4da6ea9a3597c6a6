"""tools/test_net.py prints the AP of a checkpoint; tools/demo.py draws its detections into PNGs."""
import hashlib
import io
import os
import subprocess
import sys

import cv2
import pytest
import torch

from detcore.data import MetadataCatalog
from detcore.engine import DefaultTrainer, Predictor
from detcore.engine.demo import visualize_images
from detcore.modeling import build_model
from detcore.utils.visualizer import upscale_factor

from tests.checkpoint.weights_server import serve
from tests.engine.toy_model import REPO, TINY_RCNN, TINY_VAL, TOY, make_cfg, subprocess_env

LAUNCHER = os.path.join(REPO, "tests", "tools", "launcher.py")
CONFIG = os.path.join(REPO, "configs", "e2e_mask_rcnn_R_18_FPN_shapes.yaml")


def run(script, args, cache):
    cmd = [sys.executable, LAUNCHER, os.path.join(REPO, "tools", script), "--config-file", CONFIG, *args]
    proc = subprocess.run(cmd, env=subprocess_env(cache), capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, f"{script} failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc.stdout


def train(out, opts, iters):
    cfg = make_cfg(out, opts + ["SOLVER.MAX_ITER", str(iters), "SOLVER.CHECKPOINT_PERIOD", "100", "DATASETS.TEST", "()",
                                "SOLVER.WARMUP_ITERS", "1"])
    cfg.freeze()
    trainer = DefaultTrainer(cfg)
    trainer.resume_or_load(resume=False)
    trainer.train()
    return str(out / "model_final.pth")


def assert_prints_ap(stdout, tasks):
    lines = stdout.splitlines()
    for task in tasks:
        row = [line for line in lines if line.startswith(f"{task}: AP ")]
        assert row, f"no '{task}: AP' line in:\n{stdout[-3000:]}"
        assert "AP50" in row[0] and "AP75" in row[0]


def test_test_net_prints_ap_of_a_checkpoint(tiny_cache, tmp_path):
    weights = train(tmp_path / "train", TOY, 3)
    out = tmp_path / "test"
    stdout = run("test_net.py", [*TOY, "MODEL.WEIGHTS", weights, "OUTPUT_DIR", str(out)], tiny_cache)
    assert_prints_ap(stdout, ["bbox"])
    assert (out / "inference" / TINY_VAL / "coco_eval_metrics.json").is_file()
    # The pictures beside the metrics (their content: tests/evaluation/test_pictures.py).
    for name in ("bbox_pr_curves.png", "bbox_per_category_ap.png", "bbox_confusion_matrix.png"):
        assert (out / "inference" / TINY_VAL / name).is_file(), name


def assert_prints_ar(stdout):
    row = [line for line in stdout.splitlines() if line.startswith("box_proposals: AR@100 ")]
    assert row, f"no 'box_proposals: AR@100' line in:\n{stdout[-3000:]}"
    assert "AR@1000" in row[0] and "ARs@100" in row[0] and "ARl@1000" in row[0]


RPN_ONLY = TINY_RCNN + ["MODEL.META_ARCHITECTURE", "ProposalNetwork"]


def test_a_proposal_network_is_scored_by_recall(tiny_cache, tmp_path):
    """test_net's evaluation (DefaultTrainer.test) picks proposal recall for a ProposalNetwork."""
    cfg = make_cfg(tmp_path, RPN_ONLY)
    torch.manual_seed(0)
    results = DefaultTrainer.test(cfg, build_model(cfg))
    assert list(results) == ["box_proposals"]
    assert set(results["box_proposals"]) == {f"AR{s}@{n}" for s in ("", "s", "m", "l") for n in (100, 1000)}
    assert (tmp_path / "inference" / TINY_VAL / "coco_eval_metrics.json").is_file()


def test_test_net_adds_an_rcnns_proposal_recall_on_request(tiny_cache, tmp_path):
    weights = train(tmp_path / "train", TINY_RCNN, 2)
    out = tmp_path / "test"
    stdout = run("test_net.py", ["--proposal-recall", *TINY_RCNN, "MODEL.WEIGHTS", weights, "OUTPUT_DIR", str(out)], tiny_cache)
    assert_prints_ap(stdout, ["bbox", "segm"])
    assert_prints_ar(stdout)
    assert (out / "inference" / f"{TINY_VAL}_proposals" / "coco_eval_metrics.json").is_file()


def test_predictor_and_demo_on_a_proposal_network(tiny_cache, tmp_path):
    cfg = make_cfg(tmp_path, RPN_ONLY)
    torch.manual_seed(0)
    predictor = Predictor(cfg)
    image = cv2.imread(os.path.join(val_images(), sorted(os.listdir(val_images()))[0]))
    out = predictor(image)
    assert set(out) == {"boxes", "objectness_logits", "proposals"}
    assert out["boxes"].shape == (len(out["objectness_logits"]), 4) and len(out["boxes"]) > 0
    assert out["proposals"].image_size == image.shape[:2]
    written = visualize_images(predictor, [os.path.join(val_images(), sorted(os.listdir(val_images()))[0])],
                               str(tmp_path / "demo"), score_threshold=0.0)
    # Drawn enlarged by a whole factor (short side >= 480, see upscale_factor).
    scale = upscale_factor(*image.shape[:2])
    assert scale > 1
    assert len(written) == 1 and cv2.imread(written[0]).shape == (image.shape[0] * scale, image.shape[1] * scale, 3)


def test_test_net_needs_weights(tiny_cache, tmp_path):
    cmd = [sys.executable, LAUNCHER, os.path.join(REPO, "tools", "test_net.py"), "--config-file", CONFIG, *TOY]
    proc = subprocess.run(cmd, env=subprocess_env(tiny_cache), capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode != 0 and "MODEL.WEIGHTS" in proc.stderr


def val_images():
    return MetadataCatalog.get(TINY_VAL).image_root


def check_pngs(out_dir, names):
    """The PNGs of the validation images ``names``, each drawn enlarged (the tiny images are 64-96
    px) by a whole factor to a short side of at least 480 px."""
    written = sorted(os.listdir(out_dir))
    assert written == sorted(os.path.splitext(n)[0] + ".png" for n in names)
    for name, source in zip(written, sorted(names)):
        image = cv2.imread(os.path.join(out_dir, name))
        h, w = cv2.imread(os.path.join(val_images(), source)).shape[:2]
        k = upscale_factor(h, w)
        assert k > 1 and image.shape == (k * h, k * w, 3) and min(image.shape[:2]) >= 480


def test_demo_writes_pngs(tiny_cache, tmp_path):
    # An untrained Mask R-CNN is enough to exercise the pipeline: image in, drawn PNG out. Its
    # weights come by URL (--model), from a server on the loopback address, checked by sha256.
    cfg = make_cfg(tmp_path, TINY_RCNN)
    torch.manual_seed(0)
    buffer = io.BytesIO()
    torch.save({"model": build_model(cfg).state_dict()}, buffer)
    images = sorted(os.listdir(val_images()))[:2]
    out = tmp_path / "demo"
    with serve() as server:
        server.files["/team/init.pth"] = buffer.getvalue()
        url = f"{server.url}/team/init.pth#sha256={hashlib.sha256(buffer.getvalue()).hexdigest()}"
        # Overrides right after the inputs: the tool must tell the two apart.
        stdout = run("demo.py", ["--output", str(out), "--confidence-threshold", "0.0", "--model", url,
                                 "--input", *(os.path.join(val_images(), n) for n in images), *TINY_RCNN], tiny_cache)
    assert f"Wrote 2 picture(s) to {out}" in stdout
    assert server.count("/team/init.pth") == 1
    check_pngs(out, images)


@pytest.mark.slow
def test_tiny_mask_rcnn_checkpoint_ap_and_demo(tiny_cache, tmp_path):
    weights = train(tmp_path / "train", TINY_RCNN, 4)
    stdout = run("test_net.py", [*TINY_RCNN, "MODEL.WEIGHTS", weights, "OUTPUT_DIR", str(tmp_path / "test")], tiny_cache)
    assert_prints_ap(stdout, ["bbox", "segm"])
    out = tmp_path / "demo"
    run("demo.py", ["--input", os.path.join(val_images(), "*.png"), "--output", str(out), "--max-images", "3",
                    *TINY_RCNN, "MODEL.WEIGHTS", weights], tiny_cache)
    check_pngs(out, sorted(os.listdir(val_images()))[:3])


def test_demo_refuses_random_weights_unless_asked(tiny_cache, tmp_path):
    out = tmp_path / "demo"
    image = os.path.join(val_images(), sorted(os.listdir(val_images()))[0])
    cmd = [sys.executable, LAUNCHER, os.path.join(REPO, "tools", "demo.py"), "--config-file", CONFIG,
           "--input", image, "--output", str(out), *TINY_RCNN]
    proc = subprocess.run(cmd, env=subprocess_env(tiny_cache), capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode != 0 and "MODEL.WEIGHTS is empty" in proc.stderr and "--allow-random-weights" in proc.stderr
    assert not out.exists()
    stdout = run("demo.py", ["--input", image, "--output", str(out), "--allow-random-weights", *TINY_RCNN], tiny_cache)
    assert "Wrote 1 picture(s)" in stdout


def _demo_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("detcore_demo_tool", os.path.join(REPO, "tools", "demo.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "option, value, message",
    [
        # NaN drew nothing and 2 a blank picture, -1 everything: all with exit code 0.
        ("--confidence-threshold", "nan", r"must be a finite number in \[0.0, 1.0\], got nan"),
        ("--confidence-threshold", "inf", "must be a finite number"),
        ("--confidence-threshold", "2", r"must lie in \[0.0, 1.0\], got 2.0"),
        ("--confidence-threshold", "-1", "must lie in"),
        ("--max-images", "-5", r"must lie in \[0, inf\), got -5"),
        ("--picture-min-size", "-1", "must lie in"),
        ("--keypoint-threshold", "nan", "must be a finite number, got nan"),
    ],
)
def test_demo_refuses_bad_option_values_naming_the_option(option, value, message, capsys):
    demo = _demo_module()
    with pytest.raises(SystemExit) as info:
        demo.parse_args(["--config-file", CONFIG, "--input", "a.png", "--output", "out", option, value])
    assert info.value.code == 2
    import re

    assert re.search(f"argument {option}: {message}", capsys.readouterr().err)
    args = demo.parse_args(["--config-file", CONFIG, "--input", "a.png", "--output", "out", "--confidence-threshold", "0.3"])
    assert (args.confidence_threshold, args.max_images, args.picture_min_size) == (0.3, 0, 480)

