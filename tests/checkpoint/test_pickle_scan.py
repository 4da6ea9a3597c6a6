"""Hostile checkpoints refused by type before anything large or unsafe is built (pickle_scan.py),
in the one reader every checkpoint goes through (io.load_checkpoint_object: MODEL.WEIGHTS,
tools/convert_checkpoint.py, the trainer's resume).

tracemalloc shows each refusal comes before the allocation, at sizes a regression could afford
(tens of MB); the finding's own pickles (bytearray(2**32), 2**36) run in a subprocess whose data
segment is limited, where a regression is a MemoryError, never gigabytes. Checkpoints of the ordinary
kinds, with the same constructors used as their writers use them, still load.
"""
import io
import os
import pickle
import subprocess
import sys
import tracemalloc
import zipfile
from collections import OrderedDict

import numpy as np
import pytest
import torch

from detcore.checkpoint import read_checkpoint
from detcore.checkpoint.io import load_checkpoint_object
from detcore.checkpoint.pickle_scan import PickleRefused, check_pickle_file, check_zip_archive

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _call(module: str, name: str, argument: bytes) -> bytes:
    """A protocol-0 pickle of ``module.name(argument)``, ``argument`` in pickle opcodes."""
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n(" + argument + b"tR"


def _int(n: int) -> bytes:
    return b"I%d\n" % n


def _bytearray_of(n: int) -> bytes:  # the finding's pickle: 39 bytes for 2**32
    return _call("__builtin__", "bytearray", _int(n)) + b"."


def _string_of_shared_lists(depth: int) -> bytes:
    """str() of a list whose two items are the same list, ``depth`` deep: a few hundred bytes of
    pickle (the memo shares them), 2**depth leaves in its repr."""
    shared = ["x"]
    for _ in range(depth):
        shared = [shared, shared]
    body = pickle.dumps(shared, protocol=2)[2:-1]  # without PROTO and STOP
    return b"\x80\x02" + _call("__builtin__", "str", body) + b"."


class _Reduces:
    def __init__(self, *reduced):
        self.reduced = reduced

    def __reduce__(self):
        return self.reduced


def _legacy_torch_file(elements: int) -> bytes:
    """A legacy (non-zip) torch file whose one storage declares ``elements`` floats and holds none."""
    from torch.serialization import MAGIC_NUMBER, PROTOCOL_VERSION

    storage = object()

    class Pickler(pickle.Pickler):
        def persistent_id(self, obj):
            return ("storage", torch.FloatStorage, "0", "cpu", elements, None) if obj is storage else None

    out = io.BytesIO()
    for header in (MAGIC_NUMBER, PROTOCOL_VERSION, {"protocol_version": PROTOCOL_VERSION, "little_endian": True}):
        pickle.dump(header, out, protocol=2)
    Pickler(out, protocol=2).dump({"w": storage})
    pickle.dump(["0"], out, protocol=2)
    return out.getvalue()


def _zip_holding(obj, tmp_path) -> bytes:
    path = tmp_path / "written_by_torch.pth"
    torch.save(obj, path)
    return path.read_bytes()


# Each: what the file is, its bytes (a function of tmp_path), the refusal's words.
HOSTILE = {
    "bytearray": (lambda tmp: _bytearray_of(2**26), r"builtins.bytearray\(67108864\) would allocate memory by a number"),
    "bytes": (lambda tmp: _call("__builtin__", "bytes", _int(2**26)) + b".", r"builtins.bytes\(67108864\)"),
    "list of a range": (
        lambda tmp: _call("__builtin__", "list", _call("__builtin__", "range", _int(2**20))) + b".",
        r"it expands a range into builtins.list",
    ),
    "numpy array by shape": (
        lambda tmp: _call("numpy", "ndarray", b"(" + _int(2**23) + b"t") + b".", r"numpy.ndarray\(8388608\)"
    ),
    "string of shared lists": (lambda tmp: _string_of_shared_lists(22), r"it builds a string from a container"),
    "bytes declared, not there": (
        lambda tmp: b"\x80\x04\x8e" + (2**26).to_bytes(8, "little") + b"abc.",
        r"it declares more data than the file holds \(expected 67108864 bytes",
    ),
    "bytearray in a torch zip": (
        lambda tmp: _zip_holding({"model": {}, "x": _Reduces(bytearray, (2**26,))}, tmp),
        r"builtins.bytearray\(67108864\)",
    ),
    "legacy storage larger than the file": (
        lambda tmp: _legacy_torch_file(2**24), r"it declares a storage of 16777216 elements in a file of \d+ bytes"
    ),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_refused_by_type_before_anything_large_is_built(case, tmp_path):
    make, words = HOSTILE[case]
    path = tmp_path / "model_final.pth"
    path.write_bytes(make(tmp_path))
    tracemalloc.start()
    try:
        with pytest.raises(PickleRefused, match=rf"refusing to load {path}: {words}"):
            load_checkpoint_object(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2**20, f"{peak} bytes were allocated before the refusal"


def test_the_findings_pickles_are_refused_through_every_entry_point(tmp_path):
    """bytearray(2**32) and (2**36), a legacy storage of 2**40 floats and a numpy object array whose
    contents do not fit its shape (numpy crashes building it), through MODEL.WEIGHTS' loader,
    read_checkpoint and the trainer's resume, in a process whose data segment may grow by 512 MB
    only (a regression is a MemoryError or a crash there)."""
    if not os.path.exists("/proc/self/status"):
        pytest.skip("measures the data segment in /proc")
    files = {
        "2**32": _bytearray_of(2**32),
        "2**36": _bytearray_of(2**36),
        "legacy": _legacy_torch_file(2**40),
        "objects": pickle.dumps(
            {"model": {"w": _Reduces(np.core.multiarray._reconstruct, (np.ndarray, (0,), b"b"),
                                     (1, (5,), np.dtype("O"), False, [1, 2]))}}, protocol=2,
        ),
    }
    for name, data in files.items():
        (tmp_path / f"{name}.pth").write_bytes(data)
    code = f"""
import os, resource, sys
from torch import nn
from detcore.checkpoint import read_checkpoint
from detcore.checkpoint.pickle_scan import PickleRefused
from detcore.engine import Checkpointer, load_model_weights

with open("/proc/self/status") as f:
    in_use = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmData:"))
resource.setrlimit(resource.RLIMIT_DATA, (in_use + 512 * 2**20, in_use + 512 * 2**20))
folder = {str(tmp_path)!r}
for name in {sorted(files)!r}:
    path = os.path.join(folder, name + ".pth")
    with open(os.path.join(folder, "last_checkpoint"), "w") as f:
        f.write(name + ".pth")
    for load in (read_checkpoint, lambda p: load_model_weights(nn.Linear(2, 2), p),
                 lambda p: Checkpointer(nn.Linear(2, 2), folder).resume()):
        try:
            load(path)
        except PickleRefused as e:
            assert path in str(e), e
            print("refused", name)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(done.stdout.split("\n")[:-1]) == sorted(f"refused {name}" for name in files for _ in range(3))


def test_other_refusals_of_the_scan():
    """Judged without loading: a torch tensor class called with a size, a numpy record dtype, a call
    of something the file does not name, a zip member that would expand beyond the archive."""
    tensor_by_size = b"\x80\x02" + _call("torch", "FloatTensor", _int(2**30)) + b"."
    with pytest.raises(PickleRefused, match=r"torch.FloatTensor\(1073741824\) would allocate"):
        check_pickle_file(tensor_by_size, "x.pth")
    records = pickle.dumps(np.zeros(2, dtype=[("a", "f4")]), protocol=2)
    with pytest.raises(PickleRefused, match=r"a numpy array of dtype 'V4'"):
        check_pickle_file(records, "x.pkl")
    computed_args = b"\x80\x02" + b"c__builtin__\nbytearray\n" + _call("__builtin__", "tuple", b"(" + _int(9) + b"l") + b"R."
    with pytest.raises(PickleRefused, match=r"calls builtins.bytearray with arguments that are not written in the file"):
        check_pickle_file(computed_args, "x.pth")


def test_a_zip_member_that_would_expand_beyond_the_archive_is_refused(tmp_path):
    path = tmp_path / "bomb.pth"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("archive/data.pkl", pickle.dumps({}, protocol=2))
        archive.writestr("archive/data/0", bytes(2**24))  # 16 MB of zeros, a few kB compressed
    assert path.stat().st_size < 2**20
    with pytest.raises(PickleRefused, match=r"its member 'archive/data/0' would expand to 16777216 bytes"):
        check_zip_archive(path, str(path))


def test_ordinary_checkpoints_still_load(tmp_path):
    """The constructors the scan watches, used as writers use them: bytearray and bytes from their
    data (protocols 2 and 5, torch's zip), sets, ranges kept as ranges, OrderedDict, numpy arrays of
    numbers and strings, a legacy torch file whose storage fits in it."""
    state = OrderedDict([("a.weight", torch.arange(6.0).view(2, 3))])
    torch.save({"model": state, "blob": bytearray(b"\x00\x01"), "ids": {1, 2}}, tmp_path / "zip.pth")
    torch.save({"model": state}, tmp_path / "legacy.pth", _use_new_zipfile_serialization=False)
    arrays = {"a.weight": np.arange(6, dtype=np.float32).reshape(2, 3), "names": np.array(["x", "y"])}
    for protocol in (2, 5):
        extras = {"blob": bytearray(b"\x00\x01"), "raw": b"\x00\xff", "kinds": frozenset("ab")}
        if protocol == 5:  # protocol 2 writes a range as Python 2's xrange, which the loader refuses by name
            extras["span"] = range(10**12)
        (tmp_path / f"zoo{protocol}.pkl").write_bytes(pickle.dumps({"model": arrays, **extras}, protocol=protocol))
    for name in ("zip.pth", "legacy.pth", "zoo2.pkl", "zoo5.pkl"):
        tensors, skipped = read_checkpoint(tmp_path / name)
        torch.testing.assert_close(tensors["a.weight"], state["a.weight"])
    assert load_checkpoint_object(tmp_path / "zip.pth")["blob"] == bytearray(b"\x00\x01")
    assert load_checkpoint_object(tmp_path / "zoo5.pkl")["span"] == range(10**12)
