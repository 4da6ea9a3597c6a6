"""A wheel built from the repository, installed in a fresh virtual environment, gives a ``detcore``
command that trains the shapes recipe, evaluates it and draws pictures, run from an empty folder
with no clone on the path (what a user who types ``pip install`` gets).

The environment sees the installed torch and torchvision (--system-site-packages: they are not
downloaded again), and with them the editable install of a clone, if there is one: the test
checks that the wheel's package, inside the environment, is the one imported.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import cv2
import pytest

from tests.engine.toy_model import REPO

SHAPES = "e2e_mask_rcnn_R_18_FPN_shapes.yaml"
PICTURES = ("bbox_pr_curves.png", "bbox_per_category_ap.png", "bbox_confusion_matrix.png", "segm_pr_curves.png")


def _run(cmd, cwd, env, timeout=1200):
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))} failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc.stdout


@pytest.mark.slow
def test_wheel_in_a_fresh_venv_trains_tests_and_draws(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")}
    env.setdefault("MAX_JOBS", "1")  # the build compiles detcore._C

    wheels = tmp_path / "wheels"
    _run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", REPO, "-w", wheels],
         REPO, env, timeout=3600)
    (wheel,) = wheels.glob("detcore-*.whl")
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--system-site-packages", venv], tmp_path, env)
    python, detcore = venv / "bin" / "python", venv / "bin" / "detcore"
    # --force-reinstall: a detcore visible from the system site-packages (an editable clone) must
    # not count as "already installed"; pip installs into the environment and leaves that one alone.
    _run([python, "-m", "pip", "install", "--no-deps", "--no-index", "--force-reinstall", wheel], tmp_path, env)

    work = tmp_path / "empty"
    work.mkdir()
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", DETCORE_CACHE=str(tmp_path / "cache"),
               OMP_NUM_THREADS="2", MPLBACKEND="Agg")
    where = _run([python, "-c", "import detcore, detcore._C, detcore.cli; print(detcore.__file__)"], work, env)
    assert Path(where.strip()).resolve().is_relative_to(venv.resolve()), f"detcore imported from {where}, not the wheel"
    preset = _run([detcore, "configs", SHAPES], work, env).splitlines()[0][2:]
    assert Path(preset).resolve().is_relative_to(venv.resolve()), preset  # the presets ship in the wheel

    # Train a few iterations by the preset's name; the final evaluation runs on shapes_val.
    _run([detcore, "train", "--config-file", SHAPES, "SOLVER.MAX_ITER", "4", "LOG_PERIOD", "1", "OUTPUT_DIR", "run"],
         work, env)
    run = work / "run"
    for name in ("model_final.pth", "metrics.json", "loss_curves.png", "config.yaml", "log.txt"):
        assert (run / name).is_file(), name
    trained = json.loads((run / "inference" / "shapes_val" / "coco_eval_metrics.json").read_text())

    out = _run([detcore, "test", "--config-file", SHAPES, "MODEL.WEIGHTS", "run/model_final.pth", "OUTPUT_DIR", "eval"],
               work, env)
    assert "bbox: AP " in out and "segm: AP " in out
    evaluated = work / "eval" / "inference" / "shapes_val"
    tested = json.loads((evaluated / "coco_eval_metrics.json").read_text())
    assert set(tested) >= {"bbox", "segm"}
    assert tested["bbox"]["AP"] == pytest.approx(trained["bbox"]["AP"], nan_ok=True)
    for name in PICTURES:
        picture = cv2.imread(str(evaluated / name))
        assert picture is not None and picture.std() > 0, name  # a picture, not a blank page

    image_root = _run([python, "-c", "from detcore.data import MetadataCatalog; "
                       "print(MetadataCatalog.get('shapes_val').image_root)"], work, env).strip()
    out = _run([detcore, "demo", "--config-file", SHAPES, "--input", image_root, "--output", "pictures",
                "--max-images", "2", "MODEL.WEIGHTS", "run/model_final.pth"], work, env)
    assert "Wrote 2 picture(s)" in out
    drawn = sorted((work / "pictures").glob("*.png"))
    assert len(drawn) == 2 and all(cv2.imread(str(p)) is not None for p in drawn)
