"""Test helpers that watch detcore's op calls from below autograd (TorchDispatchMode): whether each
ran with value checks on (detcore/layers/value_checks.py), and, on a GPU, the host syncs each op
caused (torch.cuda.set_sync_debug_mode). Used by tests/layers/test_value_checks.py and
tests/modeling/test_model_value_checks.py."""
import contextlib
import os
import sys
import tempfile
import warnings
from collections import Counter
from dataclasses import dataclass
from typing import List, Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from detcore.layers import value_checks_enabled

# The ops whose CUDA kernels check argument values (detcore/csrc/checks.h): a sync per call when on.
VALUE_CHECKED_OPS = {
    "nms", "batched_nms", "roi_align", "_roi_align_backward", "roi_pool", "_roi_pool_backward",
    "sigmoid_focal_loss", "_sigmoid_focal_loss_backward",
}
# Their one sync that no caller avoids: reading the number of kept boxes, the result's size.
RESULT_SIZE_SYNC_OPS = {"nms", "batched_nms"}
# batched_nms over this many boxes takes the banded path (detcore/csrc/cuda/launch_config.h,
# kNmsBandAbove), which syncs three more times to lay out its categories' masks: the number of
# categories (unique_consecutive), their sizes' copy to the host and the layout's copy back.
NMS_BAND_ABOVE = 5000
BANDED_NMS_SYNCS = 4


def allowed_syncs(call: "OpCall") -> int:
    """The host syncs an unchecked call of a detcore op may make: none, but nms / batched_nms's."""
    if call.op not in RESULT_SIZE_SYNC_OPS:
        return 0
    return BANDED_NMS_SYNCS if call.op == "batched_nms" and call.boxes > NMS_BAND_ABOVE else 1

SYNC_WARNING = "called a synchronizing CUDA operation"


@dataclass
class OpCall:
    op: str  # the op's name in torch.ops.detcore, e.g. "roi_align", "_roi_align_backward"
    checked: bool  # value checks on at the call
    device: str
    ids_dtype: Optional[torch.dtype] = None  # batched_nms's idxs
    boxes: int = 0  # nms / batched_nms: how many boxes
    syncs: int = 0  # host syncs the call caused (SyncCounter, forward calls only)


def _op_call(func, args) -> OpCall:
    """What a call of the op overload `func` was (its namespace's, e.g. torch.ops.detcore.*)."""
    ids_dtype = args[2].dtype if func._opname == "batched_nms" else None
    boxes = len(args[0]) if func._opname in RESULT_SIZE_SYNC_OPS else 0
    device = next((str(a.device) for a in args if isinstance(a, torch.Tensor)), "?")
    return OpCall(func._opname, value_checks_enabled(), device, ids_dtype, boxes)


class DetcoreOpRecorder(TorchDispatchMode):
    """Records every detcore op call made while active (forward and backward) as an OpCall."""

    def __init__(self):
        super().__init__()
        self.calls: List[OpCall] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "detcore":
            self.calls.append(_op_call(func, args))
        return func(*args, **(kwargs or {}))


class NativeWarnings:
    """Counts the sync warnings that C++ writes to stderr (file descriptor 2) during `capture()`
    blocks, and passes the text on. Older torch (2.11, the GPU machine's) calls torch.ops.* with no
    Python warning handler (pytorch/pytorch#193451 added it), so a sync inside an op called that way
    goes to C++'s default handler, stderr, instead of Python's warnings."""

    def __init__(self):
        self.count = 0
        self._file = tempfile.TemporaryFile()

    @contextlib.contextmanager
    def capture(self):
        sys.stderr.flush()
        saved = os.dup(2)
        start = self._file.seek(0, os.SEEK_END)
        os.dup2(self._file.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            self._file.seek(start)
            text = self._file.read()
            self.count += text.count(SYNC_WARNING.encode())
            os.write(2, text)

    def close(self):
        self._file.close()


class SyncCounter(TorchDispatchMode):
    """Attributes the host syncs that sync debug mode "warn" reports to the ops that caused them:
    `by_op[name]` and each detcore OpCall's `syncs`. A C++ warning reaches Python when its op
    returns (or stderr, NativeWarnings, on older torch), so the forward's are attributed exactly;
    the autograd engine replays a backward's warnings only after the whole pass, so those are
    counted (`syncs()`) but not attributed.
    A detcore op on the unchecked path, but nms / batched_nms, runs with the mode at "error":
    a sync inside it raises there, in the forward or the backward, naming the op (`failures`).

    Use through `count_syncs()`, which turns the debug mode on and records the warnings."""

    def __init__(self, log, set_mode, namespace="detcore"):
        super().__init__()
        self.log = log
        self.set_mode = set_mode
        self.namespace = namespace
        self.native = NativeWarnings()
        self.by_op: Counter = Counter()
        self.calls: List[OpCall] = []
        self.failures: List[str] = []

    def syncs(self) -> int:
        return sum(SYNC_WARNING in str(w.message) for w in self.log) + self.native.count

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        call = _op_call(func, args) if func.namespace == self.namespace else None
        strict = call is not None and not call.checked and call.op not in RESULT_SIZE_SYNC_OPS
        before = self.syncs()
        if strict:
            self.set_mode("error")
        try:
            with self.native.capture():
                out = func(*args, **(kwargs or {}))
        except RuntimeError as e:
            if strict and "synchronizing CUDA operation" in str(e):
                self.failures.append(f"{self.namespace}.{call.op} (value checks off) synchronized with the host")
            raise
        finally:
            if strict:
                self.set_mode("warn")
        syncs = self.syncs() - before
        if syncs:
            self.by_op[func.name()] += syncs
        if call is not None:
            call.syncs = syncs
            self.calls.append(call)
        return out


@contextlib.contextmanager
def count_syncs(set_mode=None, namespace="detcore"):
    """A SyncCounter over the block, with the sync debug mode at "warn" (set_mode and namespace:
    for tests of the counter itself; torch.cuda.set_sync_debug_mode and detcore's ops by default)."""
    set_mode = set_mode or torch.cuda.set_sync_debug_mode
    with warnings.catch_warnings(record=True) as log:
        warnings.simplefilter("always")
        counter = SyncCounter(log, set_mode, namespace)
        set_mode("warn")
        try:
            with counter:
                yield counter
        finally:
            set_mode("default")
            counter.native.close()
