"""Reading checkpoint files: numpy-only pickles, torch files, containers, and refusing code."""
import os
import pickle

import numpy as np
import pytest
import torch

from detcore.checkpoint import read_checkpoint, safe_pickle_load


class _RunsCode:
    """Unpickling this calls os.system: what a malicious .pkl would do."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_numpy_pickle_with_model_dict(tmp_path):
    arrays = {"a.weight": np.arange(6, dtype=np.float32).reshape(2, 3), "a.bias": np.ones(2, np.float64)}
    for protocol in (2, 4, 5):
        path = tmp_path / f"m{protocol}.pkl"
        path.write_bytes(pickle.dumps({"model": arrays, "__author__": "Detectron2 Model Zoo"}, protocol=protocol))
        tensors, skipped = read_checkpoint(path)
        assert set(tensors) == {"a.weight", "a.bias"}
        torch.testing.assert_close(tensors["a.weight"], torch.arange(6.0).view(2, 3))
        assert tensors["a.bias"].dtype == torch.float64
        assert skipped == []  # "__author__" sits beside "model", which is what is read


def test_old_numpy_module_names_and_blobs_container():
    # Detectron (numpy 1.x) pickles name numpy.core.multiarray; numpy 2 moved it to numpy._core.
    data = pickle.dumps({"blobs": {"conv1_w": np.zeros((2, 3), np.float32)}, "meta": "x"}, protocol=2)
    data = data.replace(b"numpy._core.multiarray", b"numpy.core.multiarray")
    assert b"numpy.core.multiarray" in data
    blobs = safe_pickle_load(data)["blobs"]
    assert blobs["conv1_w"].shape == (2, 3)


def test_pickle_that_runs_code_is_refused(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pkl"
    path.write_bytes(pickle.dumps({"model": {"w": _RunsCode(marker)}}, protocol=2))
    with pytest.raises(pickle.UnpicklingError, match="refusing to unpickle .*system"):
        read_checkpoint(path)
    assert not marker.exists()
    # The same bytes under another extension: torch's weights_only loader refuses too.
    other = tmp_path / "evil.pth"
    other.write_bytes(path.read_bytes())
    with pytest.raises(pickle.UnpicklingError):
        read_checkpoint(other)
    assert not marker.exists()


def test_builtins_beyond_plain_data_are_refused():
    data = pickle.dumps({"x": getattr}, protocol=2)  # a reference to builtins.getattr
    with pytest.raises(pickle.UnpicklingError, match="getattr"):
        safe_pickle_load(data)


def test_torch_files_zip_and_legacy(tmp_path):
    state = {"layer.weight": torch.randn(3, 2), "layer.bias": torch.randn(3)}
    zipped = tmp_path / "new.pth"
    torch.save({"model": state, "iteration": 7, "optimizer": {"lr": 0.1}}, zipped)
    legacy = tmp_path / "old.pt"
    torch.save({"state_dict": state}, legacy, _use_new_zipfile_serialization=False)
    bare = tmp_path / "bare.pth"
    torch.save(state, bare)
    for path in (zipped, legacy, bare):
        tensors, skipped = read_checkpoint(path)
        assert set(tensors) == set(state)
        torch.testing.assert_close(tensors["layer.weight"], state["layer.weight"])


def test_non_tensor_entries_are_listed_as_skipped(tmp_path):
    path = tmp_path / "mixed.pth"
    torch.save({"w": torch.ones(2), "step": 3, "names": np.array(["a", "b"])}, path)
    with pytest.raises(pickle.UnpicklingError):  # numpy str arrays are not weights_only-safe
        read_checkpoint(path)
    torch.save({"w": torch.ones(2), "step": 3, "note": "hello"}, path)
    tensors, skipped = read_checkpoint(path)
    assert set(tensors) == {"w"}
    assert sorted(k for k, _ in skipped) == ["note", "step"]


def test_torch_file_with_custom_objects_is_refused(tmp_path):
    path = tmp_path / "objects.pth"
    torch.save({"model": {"w": torch.ones(1)}, "extra": _RunsCode(tmp_path / "x")}, path)
    with pytest.raises(pickle.UnpicklingError, match="weights_only"):
        read_checkpoint(path)
    assert not (tmp_path / "x").exists()


def test_unreadable_and_missing_files(tmp_path):
    junk = tmp_path / "junk.pth"
    junk.write_bytes(b"\x00\x01 definitely not a checkpoint")
    with pytest.raises(ValueError, match="neither torch.load nor pickle"):
        read_checkpoint(junk)
    with pytest.raises(FileNotFoundError):
        read_checkpoint(tmp_path / "nope.pkl")
    empty = tmp_path / "list.pkl"
    empty.write_bytes(pickle.dumps([1, 2, 3]))
    with pytest.raises(ValueError, match=rf"^{empty}: a checkpoint must hold a dict of tensors, got list"):
        read_checkpoint(empty)


def test_a_torch_file_holding_a_list_is_named(tmp_path):
    path = tmp_path / "weights.pth"
    torch.save([torch.zeros(2), torch.ones(3)], path)
    with pytest.raises(ValueError, match=rf"^{path}: a checkpoint must hold a dict of tensors, got list"):
        read_checkpoint(path)
