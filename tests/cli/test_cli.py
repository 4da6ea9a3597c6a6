"""The ``detcore`` command: every subcommand's parser and help, config names, overrides, the
torchrun command behind --num-gpus, and tools/ scripts parsing exactly as the commands do."""
import hashlib
import importlib.util
import io
import json
import os
import re
import subprocess
import sys

import pytest
import torch

from detcore.cli import COMMANDS, command_module, main
from detcore.config import get_cfg, list_presets, resolve_config_file
from detcore.engine.arguments import torchrun_command, wants_torchrun

from tests.checkpoint.weights_server import serve
from tests.engine.toy_model import REPO, TINY_VAL, TOY

SHAPES = "e2e_mask_rcnn_R_18_FPN_shapes.yaml"


def _tool(script):
    spec = importlib.util.spec_from_file_location(f"tool_{script[:-3]}", os.path.join(REPO, "tools", script))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- help and dispatch -----------------------------------------------------------------------
@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_command_has_help(name, capsys):
    with pytest.raises(SystemExit) as info:
        main([name, "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: detcore {name} ")
    assert command_module(name).DESCRIPTION.split(" (")[0][:40] in " ".join(out.split())


def test_top_level_help_lists_the_commands_and_refuses_unknown_ones(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    for name in COMMANDS:
        assert f"\n  {name} " in out, name
    assert main([]) == 2
    with pytest.raises(SystemExit) as info:
        main(["trian", "--config-file", SHAPES])
    assert info.value.code == 2
    assert "unknown command 'trian'; choose from train, test," in capsys.readouterr().err


def test_the_module_and_the_package_run_as_the_command():
    for module in ("detcore", "detcore.cli"):
        proc = subprocess.run([sys.executable, "-m", module, "configs"], capture_output=True, text=True, cwd=REPO,
                              timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.splitlines() == list_presets()


# --- config names ------------------------------------------------------------------------------
def test_presets_are_named_relative_to_the_configs_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # nowhere near the clone: the names must not depend on the folder
    path = os.path.join(REPO, "configs", "torchvision", "mask_rcnn_R_50_FPN.yaml")
    for name in ("torchvision/mask_rcnn_R_50_FPN.yaml", "torchvision/mask_rcnn_R_50_FPN",
                 "configs/torchvision/mask_rcnn_R_50_FPN.yaml", "./configs/torchvision/mask_rcnn_R_50_FPN.yaml"):
        assert os.path.samefile(resolve_config_file(name), path), name
    presets = list_presets()
    assert "torchvision/mask_rcnn_R_50_FPN.yaml" in presets and SHAPES in presets
    assert len(presets) == sum(len([f for f in files if f.endswith(".yaml")])
                               for _, _, files in os.walk(os.path.join(REPO, "configs")))
    cfg = get_cfg()
    cfg.merge_from_file("torchvision/mask_rcnn_R_50_FPN")  # and so wherever a config file is read
    assert cfg.MODEL.MASK_ON and cfg.MODEL.RESNETS.DEPTH == 50


def test_a_file_on_disk_wins_over_a_preset_of_the_same_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "torchvision").mkdir()
    (tmp_path / "torchvision" / "mask_rcnn_R_50_FPN.yaml").write_text("MODEL:\n  MASK_ON: False\n")
    assert resolve_config_file("torchvision/mask_rcnn_R_50_FPN.yaml") == "torchvision/mask_rcnn_R_50_FPN.yaml"
    cfg = get_cfg()
    cfg.merge_from_file("torchvision/mask_rcnn_R_50_FPN.yaml")
    assert not cfg.MODEL.MASK_ON  # the preset has masks


def test_an_unknown_config_names_the_folders_and_the_closest_presets(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"config file torchvision/mask_rcnn_R50_FPN.yaml does not exist, and "
                       r"it names no preset in detcore's configs folder \(.*configs\); did you mean "
                       r"torchvision/mask_rcnn_R_50_FPN.yaml"):
        resolve_config_file("torchvision/mask_rcnn_R50_FPN.yaml")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        resolve_config_file(str(tmp_path / SHAPES))  # an absolute path is a path, never a name
    with pytest.raises(SystemExit, match="configs: config file nothing_like_it does not exist"):
        main(["configs", "nothing_like_it"])


def test_configs_shows_a_presets_file_and_full_config(capsys):
    main(["configs", "torchvision/mask_rcnn_R_50_FPN"])
    out = capsys.readouterr().out
    first, rest = out.split("\n", 1)
    assert os.path.samefile(first[2:], os.path.join(REPO, "configs", "torchvision", "mask_rcnn_R_50_FPN.yaml"))
    cfg = get_cfg()
    cfg.merge_from_file(first[2:])
    assert rest == cfg.dump()


# --- the arguments, one definition ---------------------------------------------------------------
def test_every_command_with_a_config_takes_the_same_config_option():
    option = {}
    for name in ("train", "test", "demo", "export", "convert"):
        parser = command_module(name).build_parser(prog=f"detcore {name}")
        (action,) = [a for a in parser._actions if "--config-file" in a.option_strings]
        option[name] = (action.metavar, action.dest)
    assert set(option.values()) == {("FILE", "config_file")}


def test_overrides_parse_after_the_options():
    args = command_module("train").parse_args(["--config-file", SHAPES, "--resume", "SOLVER.MAX_ITER", "10",
                                               "OUTPUT_DIR", "out/"])
    assert (args.config_file, args.resume, args.eval_only, args.num_gpus) == (SHAPES, True, False, 1)
    assert args.opts == ["SOLVER.MAX_ITER", "10", "OUTPUT_DIR", "out/"]
    args = command_module("test").parse_args(["--config-file", SHAPES, "MODEL.WEIGHTS", "m.pth"])
    assert args.opts == ["MODEL.WEIGHTS", "m.pth"] and not hasattr(args, "resume")  # an evaluation
    args = command_module("demo").parse_args(["--config-file", SHAPES, "--output", "o", "--input", "a.png", "b.png",
                                              "MODEL.WEIGHTS", "m.pth"])
    assert (args.input, args.opts) == (["a.png", "b.png"], ["MODEL.WEIGHTS", "m.pth"])
    args = command_module("convert").parse_args(["in.pkl", "out.pth", "MODEL.DEVICE", "cpu", "--config-file", SHAPES])
    assert (args.input, args.output, args.opts, args.config_file) == ("in.pkl", "out.pth", ["MODEL.DEVICE", "cpu"], SHAPES)


@pytest.mark.parametrize("script, name, argv", [
    ("train_net.py", "train", ["--config-file", SHAPES, "--start-over", "--num-gpus", "2", "SOLVER.MAX_ITER", "5"]),
    ("test_net.py", "test", ["--exported", "exp/", "--threads", "2", "DATASETS.TEST", "('shapes_val',)"]),
    ("demo.py", "demo", ["--model", "torchvision/mask_rcnn_R_50_FPN", "--input", "p.jpg", "--output", "o",
                         "--max-images", "3", "TEST.DETECTIONS_PER_IMAGE", "5"]),
    ("export_model.py", "export", ["--config-file", SHAPES, "--format", "onnx", "--output", "e", "--overwrite"]),
    ("convert_checkpoint.py", "convert", ["a.pkl", "b.pth", "--format", "detectron2", "--ungrouped"]),
])
def test_tools_scripts_parse_as_their_commands(script, name, argv):
    assert vars(_tool(script).parse_args(argv)) == vars(command_module(name).parse_args(argv))


def test_bad_machine_options_are_refused_naming_the_option(capsys):
    for argv, message in ((["--num-gpus", "0"], r"argument --num-gpus: must lie in \[1, inf\), got 0"),
                          (["--machine-rank", "-1"], r"argument --machine-rank: must lie in")):
        with pytest.raises(SystemExit) as info:
            command_module("train").parse_args(["--config-file", SHAPES, *argv])
        assert info.value.code == 2
        assert re.search(message, capsys.readouterr().err)


# --- --num-gpus: the same command under torchrun ---------------------------------------------------
def _args(*argv):
    return command_module("train").parse_args(["--config-file", SHAPES, *argv])


def test_num_gpus_runs_the_same_command_under_torchrun(monkeypatch):
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    argv = ["/venv/bin/detcore", "train", "--config-file", SHAPES, "--num-gpus", "2", "OUTPUT_DIR", "o"]
    args = _args("--num-gpus", "2", "OUTPUT_DIR", "o")
    assert wants_torchrun(args) and not wants_torchrun(_args())
    assert torchrun_command(args, argv) == [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--standalone", *argv]
    assert torchrun_command(args, argv, "detcore.cli")[-len(argv) - 1:] == ["-m", "detcore.cli", *argv[1:]]
    monkeypatch.setenv("LOCAL_RANK", "1")  # a worker torchrun started runs the command itself
    assert not wants_torchrun(args)


def test_several_machines_meet_at_the_dist_url():
    args = _args("--num-gpus", "4", "--num-machines", "2", "--machine-rank", "1", "--dist-url", "tcp://10.0.0.1:29500")
    cmd = torchrun_command(args, ["tools/train_net.py", "--config-file", SHAPES])
    assert cmd[3:] == ["--nproc_per_node", "4", "--nnodes", "2", "--node_rank", "1", "--master_addr", "10.0.0.1",
                       "--master_port", "29500", "tools/train_net.py", "--config-file", SHAPES]
    with pytest.raises(ValueError, match=r"--dist-url must be tcp://HOST:PORT of machine 0 .* got 'auto'"):
        torchrun_command(_args("--num-machines", "2"), ["x"])
    with pytest.raises(ValueError, match=r"--machine-rank must be in 0..1 \(--num-machines 2\), got 2"):
        torchrun_command(_args("--num-machines", "2", "--machine-rank", "2", "--dist-url", "tcp://h:1"), ["x"])


# --- the commands run -------------------------------------------------------------------------------
def test_train_then_test_by_config_name(tiny_cache, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--config-file", SHAPES, *TOY, "SOLVER.MAX_ITER", "2", "OUTPUT_DIR", str(out)]) == 0
    assert (out / "model_final.pth").is_file() and (out / "config.yaml").is_file()
    evaluated = tmp_path / "eval"
    assert main(["test", "--config-file", SHAPES, *TOY, "MODEL.WEIGHTS", str(out / "model_final.pth"),
                 "OUTPUT_DIR", str(evaluated)]) == 0
    assert "bbox: AP " in capsys.readouterr().out
    tested = json.load(open(evaluated / "inference" / TINY_VAL / "coco_eval_metrics.json"))
    trained = json.load(open(out / "inference" / TINY_VAL / "coco_eval_metrics.json"))
    assert tested["bbox"]["AP50"] == pytest.approx(trained["bbox"]["AP50"], nan_ok=True)


def test_download_fetches_a_url_and_lists_the_catalog(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DETCORE_CACHE", str(tmp_path / "cache"))
    buffer = io.BytesIO()
    torch.save({"model": {"w": torch.ones(2)}}, buffer)
    with serve() as server:
        server.files["/team/w.pth"] = buffer.getvalue()
        url = f"{server.url}/team/w.pth#sha256={hashlib.sha256(buffer.getvalue()).hexdigest()}"
        main(["download", url])
        main(["download", url])  # cached: not fetched again
    path = capsys.readouterr().out.splitlines()[-1]
    assert path.startswith(str(tmp_path / "cache")) and open(path, "rb").read() == buffer.getvalue()
    assert server.count("/team/w.pth") == 1
    main(["download", "--list"])
    assert "| `torchvision/mask_rcnn_R_50_FPN` |" in capsys.readouterr().out
    with pytest.raises(SystemExit, match=r"download: no model called 'torchvision/mask_rcnn_R50_FPN'.*did you mean"):
        main(["download", "torchvision/mask_rcnn_R50_FPN"])
    with pytest.raises(SystemExit) as info:
        main(["download"])
    assert info.value.code == 2


def test_env_reports_where_detcore_is(capsys):
    main(["env"])
    import detcore

    assert f"@ {os.path.dirname(detcore.__file__)}" in capsys.readouterr().out


@pytest.mark.slow
def test_num_gpus_starts_the_processes(tiny_cache, tmp_path):
    """``detcore train --num-gpus 2`` runs itself again under torchrun: two CPU processes (gloo),
    training the tiny R-18 Mask R-CNN on a coco: json (the tests' datasets are not registered in
    the processes torchrun starts; a json on disk needs no registration)."""
    from tests.data.user_data import write_coco_set
    from tests.engine.toy_model import TINY_RCNN, TINY_TRAIN, subprocess_env
    from detcore.data import DatasetCatalog

    train = write_coco_set(DatasetCatalog.get(TINY_TRAIN), str(tmp_path / "data" / "train.json"), str(tmp_path / "data"))
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "detcore.cli", "train", "--config-file", SHAPES, "--num-gpus", "2", *TINY_RCNN,
           "DATASETS.TRAIN", f"('coco:{train}',)", "DATASETS.TEST", "()", "SOLVER.IMS_PER_BATCH", "4",
           "SOLVER.MAX_ITER", "2", "LOG_PERIOD", "1", "MODEL.DEVICE", "cpu", "OUTPUT_DIR", str(out)]
    proc = subprocess.run(cmd, env=subprocess_env(tiny_cache), capture_output=True, text=True, timeout=900, cwd=tmp_path)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-6000:]
    assert "torch.distributed.run --nproc_per_node 2 --standalone -m detcore.cli train" in text
    assert "world size: 2" in text
    assert (out / "model_final.pth").is_file() and (out / "log.txt.rank1").is_file()
