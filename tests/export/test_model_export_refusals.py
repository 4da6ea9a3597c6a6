"""What export_model refuses before it traces (tracing takes tens of seconds): test-time
augmentation the graph would not hold, a folder that already holds an export (unless overwrite,
and then only the export's own files are replaced), a folder it cannot write to, an output that
is a file. Tracing is replaced by a stand-in that fails the test if reached, or that stops the
export where overwrite lets it go on."""
import os
import subprocess

import pytest
import torch

import detcore.export.model_export as model_export
from detcore.config import get_cfg
from detcore.export import export_model
from detcore.modeling import build_model

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "configs", "e2e_mask_rcnn_R_18_FPN_shapes.yaml")


class Traced(Exception):
    pass


@pytest.fixture
def no_tracing(monkeypatch):
    def trace(detector, image):
        raise Traced("export_model went on to trace")

    monkeypatch.setattr(model_export, "trace_detector", trace)


@pytest.fixture(scope="module")
def cfg_and_model():
    cfg = get_cfg()
    cfg.merge_from_file(CONFIG)
    cfg.merge_from_list(["MODEL.DEVICE", "cpu", "INPUT.MIN_SIZE_TEST", 128])
    torch.manual_seed(0)
    return cfg, build_model(cfg).eval()


def _contents(folder):
    return {name: open(os.path.join(folder, name), "rb").read() for name in sorted(os.listdir(folder))}


def test_test_time_augmentation_is_refused(cfg_and_model, no_tracing, tmp_path):
    cfg, model = cfg_and_model
    cfg = cfg.clone()
    cfg.merge_from_list(["TEST.AUG.ENABLED", True])
    with pytest.raises(ValueError, match=r"TEST.AUG.ENABLED is True, but an exported graph runs the model once, without"):
        export_model(cfg, model, "torchscript", str(tmp_path / "out"))
    assert not os.path.exists(tmp_path / "out")


@pytest.mark.parametrize("fmt", ["torchscript", "exported_program", "onnx", "openvino"])
def test_an_existing_export_is_kept_unless_overwrite(cfg_and_model, no_tracing, tmp_path, fmt):
    cfg, model = cfg_and_model
    if fmt == "openvino":
        pytest.importorskip("openvino")
    folder = tmp_path / "exported"
    folder.mkdir()
    model_file = model_export._FILE_NAMES[fmt]
    for name, text in ((model_file, b"the user's model"), ("export.json", b"{}"), ("notes.txt", b"mine")):
        (folder / name).write_bytes(text)
    before = _contents(folder)
    with pytest.raises(FileExistsError, match=rf"{folder}' already holds an export \({model_file}, export.json\); "
                                              r"nothing was changed.*overwrite=True \(tools/export_model.py: --overwrite\)"):
        export_model(cfg, model, fmt, str(folder))
    assert _contents(folder) == before
    (folder / model_file).unlink()  # export.json alone still marks an export
    with pytest.raises(FileExistsError, match=r"already holds an export \(export.json\)"):
        export_model(cfg, model, fmt, str(folder))
    with pytest.raises(Traced):
        export_model(cfg, model, fmt, str(folder), overwrite=True)
    assert _contents(folder) == {name: text for name, text in before.items() if name != model_file}


@pytest.fixture
def unwritable_folder(tmp_path):
    """An existing folder the process cannot create files in: read-only permission bits, and where
    those do not bind (root) the immutable attribute; skipped where neither can be set."""
    folder = tmp_path / "read_only"
    folder.mkdir()
    os.chmod(folder, 0o555)
    immutable = False
    try:
        if os.access(folder, os.W_OK):  # root ignores the permission bits
            immutable = subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode == 0
            if not immutable:
                pytest.skip("cannot make a folder unwritable for this process")
        yield folder
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(folder)], capture_output=True)
        os.chmod(folder, 0o755)


def test_an_unwritable_folder_is_refused_before_tracing_and_named(cfg_and_model, no_tracing, unwritable_folder):
    cfg, model = cfg_and_model
    with pytest.raises(PermissionError, match=rf"cannot write into the output folder '{unwritable_folder}' \("):
        export_model(cfg, model, "exported_program", str(unwritable_folder))
    with pytest.raises(PermissionError, match=rf"cannot write into the output folder '{unwritable_folder}/inner' \("):
        export_model(cfg, model, "exported_program", str(unwritable_folder / "inner"))
    assert os.listdir(unwritable_folder) == []


def test_an_output_that_is_a_file_is_refused(cfg_and_model, no_tracing, tmp_path):
    cfg, model = cfg_and_model
    (tmp_path / "model.onnx").write_bytes(b"a file")
    with pytest.raises(NotADirectoryError, match=r"the output '.*model.onnx' exists and is not a folder"):
        export_model(cfg, model, "onnx", str(tmp_path / "model.onnx"))
    assert (tmp_path / "model.onnx").read_bytes() == b"a file"
