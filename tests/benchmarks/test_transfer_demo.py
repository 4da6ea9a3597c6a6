"""benchmarks/transfer_demo.py end to end on the tiny shapes splits: both runs train, evaluate and are
reported side by side, the pretrained one really starts from the given weights, and a missing
weights package is a clear error."""
import json
import os
import subprocess
import sys

import torch

from detcore.engine.checkpointer import load_checkpoint_file

from tests.checkpoint.test_loader import random_resnet50_state
from tests.engine.toy_model import REPO, TINY_RCNN, subprocess_env

DEMO = os.path.join(REPO, "benchmarks", "transfer_demo.py")
LAUNCHER = os.path.join(REPO, "tests", "tools", "launcher.py")
TRAIN_NET = os.path.join(REPO, "tools", "train_net.py")


def test_both_runs_are_trained_evaluated_and_compared(tiny_cache, tmp_path):
    weights = tmp_path / "resnet50.pth"
    # imgsim's layout: a torchvision resnet50 under "module.pre.", with its own 768-wide fc.
    state = random_resnet50_state(prefix="module.pre.")
    torch.save(state, weights)
    root = tmp_path / "transfer"
    opts = TINY_RCNN + ["SOLVER.MAX_ITER", "2", "SOLVER.STEPS", "(1,)", "SOLVER.WARMUP_ITERS", "1",
                        "SOLVER.CHECKPOINT_PERIOD", "100", "TEST.EVAL_PERIOD", "1", "LOG_PERIOD", "1"]
    cmd = [sys.executable, DEMO, "--output-root", str(root), "--weights", str(weights),
           "--train-command", f"{sys.executable} {LAUNCHER} {TRAIN_NET}", *opts]
    proc = subprocess.run(cmd, env=subprocess_env(tiny_cache), capture_output=True, text=True, timeout=900, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    summary = json.loads((root / "transfer_results.json").read_text())
    assert set(summary["runs"]) == {"imgsim", "scratch"}
    for name, run in summary["runs"].items():
        assert 0 <= run["bbox/AP"] <= 100 and 0 <= run["segm/AP"] <= 100, name
        assert sorted(int(i) for i in run["ap_by_iteration"]) == [1, 2], name  # evaluated every iteration
        assert run["seconds_per_iteration"] > 0
    assert "| imgsim |" in proc.stdout and "| scratch |" in proc.stdout
    for png in ("total_loss.png", "box_ap.png"):
        assert (root / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # The pretrained run starts from the given body (its frozen stem is never trained), the
    # scratch run does not.
    stem = state["module.pre.conv1.weight"]
    pretrained = load_checkpoint_file(str(root / "imgsim" / "model_final.pth"))["model"]
    scratch = load_checkpoint_file(str(root / "scratch" / "model_final.pth"))["model"]
    torch.testing.assert_close(pretrained["backbone.bottom_up.stem.conv1.weight"], stem, rtol=0, atol=0)
    assert not torch.allclose(scratch["backbone.bottom_up.stem.conv1.weight"], stem)


def test_missing_imgsim_is_a_clear_error(tmp_path):
    # An empty directory first on the path hides nothing, so make find_spec fail instead.
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    (tmp_path / "sitecustomize.py").write_text(
        "import importlib.util, sys\n"
        "_find = importlib.util.find_spec\n"
        "importlib.util.find_spec = lambda name, *a: None if name == 'imgsim' else _find(name, *a)\n"
    )
    proc = subprocess.run([sys.executable, DEMO, "--output-root", str(tmp_path / "out")],
                          env=env, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode != 0
    assert "pip install --no-deps imgsim" in proc.stderr
