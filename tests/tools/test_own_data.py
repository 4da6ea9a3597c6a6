"""A user's own data with no Python written: a COCO json with its JPEGs and a Pascal VOC folder,
written to disk as a user has them, named on the command line as coco:JSON[:IMAGE_ROOT] and
voc:FOLDER[:SPLIT], trained on by tools/train_net.py and evaluated by tools/test_net.py.

The fast tests run the tools' main functions in this process with the tests' ToyDetector (a
model that trains in milliseconds); the slow one runs the commands themselves, with the tiny R-18
Mask R-CNN. Nothing registers the user's datasets but their names."""
import importlib.util
import json
import math
import os
import subprocess
import sys

import pytest

from detcore.data import DatasetCatalog, MetadataCatalog, dataset_folder_name
from detcore.engine import default_argument_parser

from tests.data.user_data import USER_CATEGORIES, write_coco_set, write_voc_folder
from tests.engine.toy_model import REPO, TINY_RCNN, TINY_TRAIN, TINY_VAL, TOY, subprocess_env

CONFIG = os.path.join(REPO, "configs", "e2e_mask_rcnn_R_18_FPN_shapes.yaml")
SHORT = ["SOLVER.MAX_ITER", "3", "SOLVER.CHECKPOINT_PERIOD", "3", "LOG_PERIOD", "1"]


def load_tool(script):
    spec = importlib.util.spec_from_file_location(script[:-3], os.path.join(REPO, "tools", script))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def strict(metrics):
    """Metrics as their json file holds them (NaN written as null)."""
    return {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in metrics.items()}


def datasets(train, test):
    return ["DATASETS.TRAIN", f"({train!r},)", "DATASETS.TEST", f"({test!r},)"]


@pytest.fixture
def forget():
    """Names to drop from this process' catalogs after the test (the tools registered them here)."""
    names = []
    yield names.extend
    for name in names:
        if name in DatasetCatalog:
            DatasetCatalog.remove(name)
        MetadataCatalog.remove(name)


def write_user_coco(tmp_path):
    """Training images away from their json, in folders whose names hold ':' and ' ';
    validation images next to their json (the default image folder). Returns the two names."""
    image_dir = str(tmp_path / "my images:all")
    train_json = write_coco_set(DatasetCatalog.get(TINY_TRAIN), str(tmp_path / "ann:v1" / "train.json"), image_dir)
    val_json = write_coco_set(DatasetCatalog.get(TINY_VAL), str(tmp_path / "val set" / "val.json"), str(tmp_path / "val set"))
    return f"coco:{train_json}:{image_dir}", f"coco:{val_json}"


def check_coco_outputs(folder, trained):
    """The classes are the json's, in category id order; predictions go back to its sparse ids.
    The name's folder is one plain folder (no "coco:" folder with the json's path below it)."""
    assert os.listdir(folder.parent) == [folder.name] and folder.name.startswith("coco_")
    assert {k for k in trained if k.startswith("AP-")} == {"AP-tile", "AP-wedge", "AP-ring"}
    assert strict(json.load(open(folder / "coco_eval_metrics.json"))["bbox"]) == pytest.approx(strict(trained))
    predictions = json.load(open(folder / "coco_instances_results.json"))
    assert predictions and {p["category_id"] for p in predictions} <= {cid for cid, _ in USER_CATEGORIES}
    assert {p["image_id"] for p in predictions} == set(range(100, 100 + len(DatasetCatalog.get(TINY_VAL))))


def test_train_net_and_test_net_on_a_coco_json(tiny_cache, tmp_path, forget):
    """In this process (a second interpreter costs more than the run): train_net's main trains
    and evaluates, then test_net's main evaluates the checkpoint again."""
    train, val = write_user_coco(tmp_path)
    forget([train, val])
    out = tmp_path / "run"
    train_net = load_tool("train_net.py")
    args = default_argument_parser().parse_args(
        ["--config-file", CONFIG, *TOY, *datasets(train, val), *SHORT, "OUTPUT_DIR", str(out)])
    trained = train_net.main(args)["bbox"]
    check_coco_outputs(out / "inference" / dataset_folder_name(val), trained)

    test_net = load_tool("test_net.py")
    args = test_net.parse_args(["--config-file", CONFIG, *TOY, *datasets(train, val),
                                "MODEL.WEIGHTS", str(out / "model_final.pth"), "OUTPUT_DIR", str(tmp_path / "eval")])
    assert strict(test_net.main(args)["bbox"]) == pytest.approx(strict(trained))
    check_coco_outputs(tmp_path / "eval" / "inference" / dataset_folder_name(val), trained)


@pytest.mark.slow
def test_the_command_lines_of_the_readme(tiny_cache, tmp_path):
    """What a user types, in fresh interpreters from another folder: tools/train_net.py with the
    real (tiny) R-18 Mask R-CNN on a coco: json, then tools/test_net.py on its checkpoint."""
    train, val = write_user_coco(tmp_path)
    out = tmp_path / "run"
    tiny = TINY_RCNN + datasets(train, val) + SHORT
    for script, opts in (("train_net.py", tiny + ["OUTPUT_DIR", str(out)]),
                         ("test_net.py", tiny + ["MODEL.WEIGHTS", str(out / "model_final.pth"), "OUTPUT_DIR", str(tmp_path / "eval")])):
        cmd = [sys.executable, os.path.join(REPO, "tools", script), "--config-file", CONFIG, *opts]
        proc = subprocess.run(cmd, env=subprocess_env(tiny_cache), capture_output=True, text=True, timeout=900, cwd=str(tmp_path))
        assert proc.returncode == 0, f"{script} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert f"Evaluation results of {val}" in proc.stdout + proc.stderr
    for run in (out, tmp_path / "eval"):
        metrics = json.load(open(run / "inference" / dataset_folder_name(val) / "coco_eval_metrics.json"))
        assert {k for k in metrics["segm"] if k.startswith("AP-")} == {"AP-tile", "AP-wedge", "AP-ring"}


def test_train_net_and_test_net_on_a_voc_folder(tiny_cache, tmp_path, forget):
    """In this process (a second interpreter would double the time): train_net's main trains on
    the folder's default split ("train") and evaluates on its "val" split, then test_net's main
    evaluates the checkpoint again."""
    folder = write_voc_folder(str(tmp_path / "my voc"), {"train": DatasetCatalog.get(TINY_TRAIN),
                                                        "val": DatasetCatalog.get(TINY_VAL)})
    train, val = f"voc:{folder}", f"voc:{folder}:val"
    forget([train, val])
    out = tmp_path / "run"
    train_net = load_tool("train_net.py")
    args = default_argument_parser().parse_args(
        ["--config-file", CONFIG, *TOY, *datasets(train, val), *SHORT, "OUTPUT_DIR", str(out)])
    trained = train_net.main(args)["bbox"]
    assert len(DatasetCatalog.get(train)) == len(DatasetCatalog.get(TINY_TRAIN))  # the "train" split
    assert MetadataCatalog.get(val).thing_classes == ["ring", "tile", "wedge"]
    assert {"AP50-area-ring", "AP50-11point-tile", "AP50-area-wedge"} <= set(trained)
    saved = json.load(open(out / "inference" / dataset_folder_name(val) / "pascal_voc_metrics.json"))["bbox"]
    assert saved == pytest.approx(strict(trained))

    test_net = load_tool("test_net.py")
    args = test_net.parse_args(["--config-file", CONFIG, *TOY, *datasets(train, val),
                                "MODEL.WEIGHTS", str(out / "model_final.pth"), "OUTPUT_DIR", str(tmp_path / "eval")])
    assert test_net.main(args)["bbox"] == pytest.approx(trained, nan_ok=True)


def test_a_num_classes_mismatch_stops_train_net(tiny_cache, tmp_path, forget):
    json_file = write_coco_set(DatasetCatalog.get(TINY_VAL), str(tmp_path / "data" / "val.json"), str(tmp_path / "data"),
                               categories=[(1, "ring"), (2, "tile"), (3, "wedge"), (4, "unused")])
    name = f"coco:{json_file}"
    forget([name])
    train_net = load_tool("train_net.py")
    args = default_argument_parser().parse_args(
        ["--config-file", CONFIG, *TOY, *datasets(name, name), *SHORT, "OUTPUT_DIR", str(tmp_path / "run")])
    with pytest.raises(ValueError) as e:
        train_net.main(args)
    assert str(e.value).startswith(f"MODEL.ROI_HEADS.NUM_CLASSES is 3, but dataset '{name}' has 4 classes")
