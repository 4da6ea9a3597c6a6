"""scripts/main.sh, the README's one command, end to end on a toy-sized schedule (setup skipped:
the test environment is already set up, and the lead owns the build)."""
import os
import subprocess
import sys

import pytest

from detcore.utils.plotting import read_metrics

from tests.engine.toy_model import REPO, subprocess_env


@pytest.mark.slow
def test_main_sh_trains_evaluates_and_draws_into_one_folder(tiny_cache, tmp_path):
    out = tmp_path / "shapes_R18"
    env = subprocess_env(tiny_cache)
    env.update(SKIP_SETUP="1", OUTPUT=str(out), PYTHON=sys.executable, NUM_DEMO="2")
    overrides = [
        "SOLVER.MAX_ITER", "2", "SOLVER.IMS_PER_BATCH", "2", "DATALOADER.NUM_WORKERS", "0",
        "INPUT.MIN_SIZE_TRAIN", "(64,)", "INPUT.MAX_SIZE_TRAIN", "96", "INPUT.MIN_SIZE_TEST", "64",
        "INPUT.MAX_SIZE_TEST", "96", "TEST.DETECTIONS_PER_IMAGE", "5", "MODEL.RPN.POST_NMS_TOPK_TEST", "20",
    ]
    proc = subprocess.run(["bash", os.path.join(REPO, "scripts", "main.sh"), *overrides], env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert f"Everything is in {out}" in proc.stdout and "error_gallery.png" in proc.stdout
    assert "AP on shapes_val:" in proc.stdout and "segm: AP" in proc.stdout
    for name in ("model_final.pth", "metrics.json", "loss_curves.png", "log.txt", "config.yaml",
                 "inference/shapes_val/coco_eval_metrics.json", "inference/shapes_val/error_gallery.png",
                 *(f"inference/shapes_val/{task}_{picture}.png" for task in ("bbox", "segm")
                   for picture in ("pr_curves", "per_category_ap", "confusion_matrix"))):
        assert (out / name).is_file(), name
    assert sorted(os.listdir(out / "demo")) == ["000000.png", "000001.png"]
    assert "bbox/AP" in read_metrics(str(out / "metrics.json"))[-1]
