"""Which detcore op calls check the values of their arguments, and the model's way to skip that.

On a GPU, the checks that read values bring their verdict to the host: a sync per call, which
stalls the host's queueing of kernels and rules out CUDA-graph capture. They are: a roi's batch
index and finiteness (roi_align, roi_pool and their backward), roi_pool's argmax offsets (its
backward), the focal loss's targets in [0, 1] (forward and backward), batched_nms's floating
category ids (finite). A user calling an op directly gets them; the model, which passes tensors it
made itself, runs its calls inside ``trusted_inputs()`` and skips them.

Inside the block, on this thread:

- shape, dtype and device checks still run (they read no values), and so does every check of the
  CPU kernels (no sync to save there);
- a value the checks would refuse gives no error and an unspecified result, never a read or write
  out of bounds: the CUDA kernels pool zeros for a roi whose batch index is outside the batch or
  that has a NaN / infinite coordinate, and skip an argmax offset outside the plane;
- a backward follows its forward: autograd records the state at the forward and restores it for
  the backward, which runs after the block (and for CUDA on another thread).

What no caller can avoid: nms and batched_nms read the number of kept boxes, the size of their
result (one sync per call); batched_nms over 5000 boxes also reads its categories' sizes, to lay
out their masks (three more: detcore/csrc/cuda/nms_launch.h). batched_nms with floating ids also numbers them with ``torch.unique``,
whose result size is another sync: the model passes integer ids.

While torch.compile or torch.export traces, ``trusted_inputs()`` does nothing: the fake kernels
check no values, and a traced graph calls the ops as a user would, checked. TorchScript cannot
compile it; scripted code calls the ops checked.
"""
import torch

from . import _extension

__all__ = ["trusted_inputs", "value_checks_enabled", "ValueChecks"]


def value_checks_enabled() -> bool:
    """Whether detcore's CUDA ops check the values of their arguments on this thread (the
    default) or run as ``trusted_inputs()`` says."""
    if not _extension.is_available():
        return True
    from detcore import _C

    return _C._value_checks_enabled()


class ValueChecks:
    """Context manager: this thread's value checks on (``enabled``) or off for the block, then as
    they were. ``trusted_inputs()`` is ``ValueChecks(False)``; a Python autograd Function
    restores its forward's state in its backward with ``ValueChecks(state)``."""

    def __init__(self, enabled: bool):
        self.enabled = bool(enabled)
        self._previous = None

    def __enter__(self):
        if _extension.is_available() and not torch.compiler.is_compiling():
            from detcore import _C

            self._previous = _C._set_value_checks_enabled(self.enabled)
        return self

    def __exit__(self, *exc_info):
        if self._previous is not None:
            from detcore import _C

            _C._set_value_checks_enabled(self._previous)
            self._previous = None
        return False


def trusted_inputs() -> ValueChecks:
    """The detcore op calls in this block skip the checks that read argument values on a GPU
    (see the module's docstring): for callers that made the inputs themselves, as the model's
    poolers, proposal generators, NMS and losses do.

    Example::

        with detcore.layers.trusted_inputs():
            pooled = roi_align(features, rois, 7, 1 / 16, 0, True)  # rois built by this code
    """
    return ValueChecks(False)
