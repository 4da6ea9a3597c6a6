"""Chaos: kill -9 and Ctrl-C (SIGINT) at random moments of a run that writes a checkpoint every
iteration, each followed by --resume, with 0, 1 and 4 data-loader workers. Nothing is lost or
corrupt: every checkpoint left loads, last_checkpoint names one, Ctrl-C never shows torch's
torn-write error, a resume right after a kill is never refused for a stale lock, and the
finished run has each iteration exactly once in metrics.json and ends at the right
model_final.pth, whose weights are bit for bit those of an uninterrupted run (one with no
workers: the training stream does not depend on their number)."""
import os
import random
import signal
import subprocess
import sys
import time

import pytest
import torch

from detcore.engine.checkpointer import LAST_CHECKPOINT_FILE, load_checkpoint_file
from detcore.utils.plotting import read_metrics

from tests.engine.toy_model import REPO, TOY, subprocess_env

LAUNCHER = os.path.join(REPO, "tests", "tools", "launcher.py")
CONFIG = os.path.join(REPO, "configs", "e2e_mask_rcnn_R_18_FPN_shapes.yaml")
MAX_ITER = 150
ROUNDS = 10


def command(out, workers=0):
    return [
        sys.executable, LAUNCHER, os.path.join(REPO, "tools", "train_net.py"), "--config-file", CONFIG, "--resume",
        *TOY, "SOLVER.MAX_ITER", str(MAX_ITER), "SOLVER.CHECKPOINT_PERIOD", "1", "LOG_PERIOD", "1",
        "DATASETS.TEST", "()", "DATALOADER.NUM_WORKERS", str(workers), "OUTPUT_DIR", str(out),
    ]


@pytest.fixture(scope="module")
def uninterrupted(tiny_cache, tmp_path_factory):
    """The final weights of the same run, never interrupted."""
    out = tmp_path_factory.mktemp("uninterrupted") / "run"
    result = subprocess.run(command(out), env=subprocess_env(tiny_cache), capture_output=True, text=True,
                            timeout=1800, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    return load_checkpoint_file(str(out / "model_final.pth"))["model"]


def check_folder(out):
    """Every checkpoint loads and last_checkpoint names one; returns its iteration (-1: none)."""
    for name in os.listdir(out):
        if name.endswith(".pth"):
            assert "model" in load_checkpoint_file(os.path.join(out, name)), name
    pointer = out / LAST_CHECKPOINT_FILE
    if not pointer.exists():
        return -1
    return int(load_checkpoint_file(os.path.join(out, pointer.read_text().strip()))["iteration"])


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 1, 4])
def test_kill_and_ctrl_c_at_random_moments_then_resume(tiny_cache, tmp_path, workers, uninterrupted):
    rng = random.Random(1234 + workers)
    out = tmp_path / "run"
    last = -1
    for round_ in range(ROUNDS):
        proc = subprocess.Popen(command(out, workers), env=subprocess_env(tiny_cache), stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True, cwd=REPO)
        # Wait until training runs (a new checkpoint appears), then a random moment more.
        deadline = time.time() + 120
        while check_folder_quiet(out) <= last and proc.poll() is None and time.time() < deadline:
            time.sleep(0.01)
        time.sleep(rng.uniform(0.0, 0.3))
        sig = rng.choice([signal.SIGKILL, signal.SIGINT])
        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=120)
        assert "OutputDirInUseError" not in stderr, stderr[-2000:]  # the previous round left no lock behind
        if sig == signal.SIGINT:
            assert "inline_container" not in stderr and "unexpected pos" not in stderr, stderr[-2000:]
        reached = check_folder(out)
        assert reached >= last, f"round {round_}: the last checkpoint went back from {last} to {reached}"
        last = reached
        if last >= MAX_ITER - 1:
            break
    assert last > 0
    # Finish the run.
    result = subprocess.run(command(out, workers), env=subprocess_env(tiny_cache), capture_output=True, text=True,
                            timeout=600, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    assert check_folder(out) == MAX_ITER - 1
    final = load_checkpoint_file(str(out / "model_final.pth"))
    assert final["iteration"] == MAX_ITER - 1
    iterations = [r["iteration"] for r in read_metrics(str(out / "metrics.json")) if "total_loss" in r]
    assert iterations == list(range(MAX_ITER))
    assert final["model"].keys() == uninterrupted.keys()
    differ = [k for k in uninterrupted if not torch.equal(final["model"][k], uninterrupted[k])]
    assert not differ, f"after {round_ + 1} interruptions, tensors differ from the uninterrupted run: {differ}"


def check_folder_quiet(out):
    try:
        pointer = out / LAST_CHECKPOINT_FILE
        return int(pointer.read_text().strip()[len("model_"):-len(".pth")]) if pointer.exists() else -1
    except (OSError, ValueError):
        return -1
