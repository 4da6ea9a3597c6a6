"""tools/train_net.py as a user runs it: single process, --eval-only, and 2-process DDP (torchrun, gloo)."""
import json
import os
import subprocess
import sys

import pytest

from detcore.engine.checkpointer import LAST_CHECKPOINT_FILE, load_checkpoint_file
from detcore.utils.plotting import read_metrics

from tests.engine.toy_model import REPO, TINY_RCNN, TOY, subprocess_env

LAUNCHER = os.path.join(REPO, "tests", "tools", "launcher.py")
TRAIN_NET = os.path.join(REPO, "tools", "train_net.py")
CONFIG = os.path.join(REPO, "configs", "e2e_mask_rcnn_R_18_FPN_shapes.yaml")


def run(cmd, cache, timeout=600):
    proc = subprocess.run(cmd, env=subprocess_env(cache), capture_output=True, text=True, timeout=timeout, cwd=REPO)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc.stdout + proc.stderr


def test_train_then_eval_only(tiny_cache, tmp_path):
    out = tmp_path / "run"
    opts = TOY + ["SOLVER.MAX_ITER", "4", "SOLVER.CHECKPOINT_PERIOD", "2", "LOG_PERIOD", "1", "OUTPUT_DIR", str(out)]
    text = run([sys.executable, LAUNCHER, TRAIN_NET, "--config-file", CONFIG, *opts], tiny_cache)
    assert "iter: 4/4" in text and "eta:" in text
    assert "Evaluation results of tiny_shapes_val" in text and "bbox: AP" in text
    for name in ("config.yaml", "log.txt", "metrics.json", "loss_curves.png", "model_0000001.pth", "model_final.pth"):
        assert (out / name).is_file(), name
    assert "Evaluation results of tiny_shapes_val" in (out / "log.txt").read_text()

    eval_out = tmp_path / "eval"
    text = run([sys.executable, LAUNCHER, TRAIN_NET, "--config-file", CONFIG, "--eval-only",
                *TOY, "MODEL.WEIGHTS", str(out / "model_final.pth"), "OUTPUT_DIR", str(eval_out)], tiny_cache)
    assert "Loaded all 8 model tensors" in text
    evaluated = json.load(open(eval_out / "inference" / "tiny_shapes_val" / "coco_eval_metrics.json"))
    trained = json.load(open(out / "inference" / "tiny_shapes_val" / "coco_eval_metrics.json"))
    assert evaluated["bbox"]["AP50"] == pytest.approx(trained["bbox"]["AP50"], nan_ok=True)
    assert not any(p.endswith(".pth") for p in os.listdir(eval_out))


@pytest.mark.parametrize("model", ["toy", pytest.param("rcnn", marks=pytest.mark.slow)])
def test_two_process_ddp_on_cpu(tiny_cache, tmp_path, model):
    out = tmp_path / "ddp"
    opts = (TOY if model == "toy" else TINY_RCNN) + [
        "SOLVER.IMS_PER_BATCH", "4", "SOLVER.MAX_ITER", "4", "SOLVER.CHECKPOINT_PERIOD", "2", "LOG_PERIOD", "1",
        "OUTPUT_DIR", str(out),
    ]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           LAUNCHER, TRAIN_NET, "--config-file", CONFIG, *opts]
    text = run(cmd, tiny_cache)
    assert "world size: 2" in text
    # One set of outputs, written by rank 0; rank 1 only logs to its own file.
    assert sorted(p for p in os.listdir(out) if p.endswith(".pth")) == ["model_0000001.pth", "model_final.pth"]
    assert (out / LAST_CHECKPOINT_FILE).read_text() == "model_final.pth"
    assert (out / "log.txt.rank1").is_file()
    final = load_checkpoint_file(str(out / "model_final.pth"))
    assert final["iteration"] == 3 and len(final["rng_states"]) == 2
    iterations = [r["iteration"] for r in read_metrics(str(out / "metrics.json")) if "total_loss" in r]
    assert iterations == [0, 1, 2, 3]
    # Evaluation saw every validation image once, gathered from both ranks.
    predictions = json.load(open(out / "inference" / "tiny_shapes_val" / "coco_instances_results.json"))
    if model == "toy":  # one detection per image
        assert sorted(p["image_id"] for p in predictions) == list(range(1, 7))
    assert "bbox/AP50" in read_metrics(str(out / "metrics.json"))[-1]
