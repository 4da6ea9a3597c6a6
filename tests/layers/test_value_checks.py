"""detcore.layers.trusted_inputs (detcore/layers/value_checks.py, detcore/csrc/value_checks.h): the
per-thread switch of the value checks, which a backward follows from its forward; the CPU
kernels' checks, which stay on; torch.compile tracing through it; and the SyncCounter of
tests/layers/op_watch.py, exercised with a stand-in op (the GPU tests count real syncs with it).

The CUDA kernels' guards for the values the checks would refuse are tested under the CUDA
emulation (test_cuda_emulation_unchecked.py), the syncs on a GPU in tests/layers/test_ops_cuda.py
and tests/modeling/test_model_value_checks.py."""
import os
import threading
import warnings

import pytest
import torch

from detcore.layers import (
    OpArgumentError,
    _extension,
    batched_nms,
    roi_align,
    roi_pool,
    sigmoid_focal_loss,
    sigmoid_focal_loss_per_image,
    trusted_inputs,
    value_checks_enabled,
)
from detcore.layers.value_checks import ValueChecks

try:
    from .op_watch import SYNC_WARNING, DetcoreOpRecorder, count_syncs
except ImportError:  # tests/ run as rootdir-relative modules, without packages
    from op_watch import SYNC_WARNING, DetcoreOpRecorder, count_syncs


def test_the_switch_is_on_by_default_off_in_the_block_and_restored():
    assert value_checks_enabled()
    with trusted_inputs():
        assert not value_checks_enabled()
        with ValueChecks(True):
            assert value_checks_enabled()
        assert not value_checks_enabled()
        with trusted_inputs():
            assert not value_checks_enabled()
        assert not value_checks_enabled()
    assert value_checks_enabled()
    with pytest.raises(KeyError):
        with trusted_inputs():
            raise KeyError("inside")
    assert value_checks_enabled()


def test_the_switch_is_per_thread():
    seen = []
    with trusted_inputs():
        thread = threading.Thread(target=lambda: seen.append(value_checks_enabled()))
        thread.start()
        thread.join()
        assert not value_checks_enabled()
    assert seen == [True]


def test_the_cpu_kernels_check_values_inside_the_block():
    """No sync to save on the CPU: its checks stay (the backward sizes its work from them)."""
    x = torch.rand(1, 2, 8, 8)
    rois = torch.tensor([[1.0, 0.0, 0.0, 4.0, 4.0]])  # batch index 1 of a batch of 1
    for op in (lambda: roi_align(x, rois, 2, 1.0, 0, True), lambda: roi_pool(x, rois, 2, 1.0)):
        with trusted_inputs(), pytest.raises(OpArgumentError, match="batch indices"):
            op()
    with trusted_inputs(), pytest.raises(OpArgumentError, match="probabilities"):
        sigmoid_focal_loss(torch.zeros(3), torch.tensor([0.0, 2.0, 1.0]))
    labels = torch.tensor([[0, 7]])  # 7 is past background (K = 3)
    with trusted_inputs(), pytest.raises(ValueError, match="labels must lie in"):
        sigmoid_focal_loss_per_image([torch.zeros(1, 2, 3)], labels)


def _rois_for(x):
    return torch.tensor([[0.0, 1.0, 1.0, 6.0, 5.0]], dtype=x.dtype)


def _roi_align(x):
    return roi_align(x, _rois_for(x), 2, 1.0, 0, True)


def _roi_pool(x):
    return roi_pool(x, _rois_for(x), 2, 1.0)


def _focal(x):
    return sigmoid_focal_loss(x, (x.detach() > 0.5).to(x.dtype), reduction="sum")


def _focal_per_image(x):
    logits = x.reshape(1, -1, 4)
    labels = torch.arange(logits.shape[1]).remainder(6)[None] - 1  # -1 ignored .. 4 background
    return sigmoid_focal_loss_per_image([logits], labels)


BACKWARD_OPS = {
    "roi_align": (_roi_align, "_roi_align_backward"),
    "roi_pool": (_roi_pool, "_roi_pool_backward"),
    "sigmoid_focal_loss": (_focal, "_sigmoid_focal_loss_backward"),
    "sigmoid_focal_loss_per_image": (_focal_per_image, "_sigmoid_focal_loss_backward"),
}


@pytest.mark.parametrize("name", sorted(BACKWARD_OPS))
@pytest.mark.parametrize("forward_trusted", [True, False])
def test_the_backward_checks_as_its_forward_did(name, forward_trusted):
    """The backward runs after the block (and for CUDA on autograd's thread): it follows the
    state recorded at the forward, whatever the state where backward() is called."""
    forward, backward_op = BACKWARD_OPS[name]
    x = torch.rand(1, 2, 8, 8, dtype=torch.float64, requires_grad=True)
    with DetcoreOpRecorder() as recorder:
        with ValueChecks(not forward_trusted):
            out = forward(x)
        with ValueChecks(forward_trusted):  # the opposite state around backward()
            out.sum().backward()
    backward_calls = [c for c in recorder.calls if c.op == backward_op]
    forward_calls = [c for c in recorder.calls if c.op != backward_op]
    assert forward_calls and backward_calls
    assert all(c.checked is not forward_trusted for c in recorder.calls), recorder.calls


def test_direct_calls_are_checked():
    x = torch.rand(1, 2, 8, 8, requires_grad=True)
    with DetcoreOpRecorder() as recorder:
        _roi_align(x).sum().backward()
    assert [(c.op, c.checked) for c in recorder.calls] == [("roi_align", True), ("_roi_align_backward", True)]


def test_torch_compile_traces_through_the_block():
    """While dynamo traces, trusted_inputs() does nothing (no graph break, fullgraph holds); the
    compiled function gives the eager result."""

    def pool(x, rois):
        with trusted_inputs():
            return roi_align(x, rois, 2, 0.5, 0, True)

    x = torch.rand(1, 2, 8, 8)
    rois = torch.tensor([[0.0, 1.0, 1.0, 9.0, 7.0]])
    torch._dynamo.reset()
    compiled = torch.compile(pool, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(x, rois), pool(x, rois))
    assert value_checks_enabled()


# --- the sync counter of the GPU tests, with a stand-in op -----------------------------------------
_modes = []


def _set_mode(mode):
    _modes.append(mode)


@torch.library.custom_op("detcore_sync_probe::touch", mutates_args=())
def _touch(x: torch.Tensor, syncs: int) -> torch.Tensor:
    """Stands in for an op that syncs `syncs` times: warns as sync debug mode "warn" does, or
    raises as "error" does."""
    for _ in range(syncs):
        if _modes[-1] == "error":
            raise RuntimeError("called a synchronizing CUDA operation")
        warnings.warn(SYNC_WARNING)
    return x.clone()


@torch.library.custom_op("detcore_sync_probe::touch_native", mutates_args=())
def _touch_native(x: torch.Tensor) -> torch.Tensor:
    """Syncs once as older torch reports it from inside torch.ops.*: C++'s default handler's line
    on stderr (file descriptor 2), no Python warning."""
    os.write(2, f"[W1128 CUDAFunctions.cpp:162] Warning: {SYNC_WARNING} (function x)\n".encode())
    return x.clone()


def test_the_sync_counter_sees_syncs_reported_on_stderr():
    with count_syncs(_set_mode) as counter:
        _touch_native(torch.ones(3))
        assert counter.syncs() == 1
    assert counter.by_op == {"detcore_sync_probe::touch_native": 1}


def test_the_sync_counter_attributes_syncs_and_stops_a_strict_op():
    """Syncs are attributed to the op that made them; an op of the strict namespace (detcore's,
    here the probe's) with value checks off runs in "error" mode and cannot sync unseen; nms's
    namesake would be exempt. The mode ends at "default"."""
    _modes.clear()
    x = torch.ones(3)
    with count_syncs(_set_mode) as counter:
        _touch(x, 2)
        torch.ops.detcore_sync_probe.touch(x, 0)
        assert counter.syncs() == 2
    assert counter.by_op == {"detcore_sync_probe::touch": 2}
    assert _modes[0] == "warn" and _modes[-1] == "default"

    _modes.clear()
    with count_syncs(_set_mode, namespace="detcore_sync_probe") as counter:
        with ValueChecks(True):  # checked: may sync, counted
            _touch(x, 1)
        with trusted_inputs():
            _touch(x, 0)  # unchecked, no sync: fine
            with pytest.raises(RuntimeError, match="synchronizing"):
                _touch(x, 1)
    assert [(c.op, c.checked, c.syncs) for c in counter.calls] == [("touch", True, 1), ("touch", False, 0)]
    assert counter.failures == ["detcore_sync_probe.touch (value checks off) synchronized with the host"]
    assert "error" in _modes and _modes[-1] == "default"


# --- on a GPU ---------------------------------------------------------------------------------------
def on_gpu(test):
    marks = [
        pytest.mark.cuda,
        pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
        pytest.mark.skipif(
            not (_extension.is_available() and _extension.cuda_kernels_built()),
            reason="detcore._C was built without CUDA kernels",
        ),
    ]
    for mark in marks:
        test = mark(test)
    return test


def _gpu_inputs():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(2, 3, 16, 16, generator=g).cuda().requires_grad_(True)
    rois = torch.tensor([[0.0, 1.0, 1.0, 9.0, 9.0], [1.0, 2.0, 2.0, 14.0, 12.0]], device="cuda")
    return x, rois


GPU_OPS = {
    "roi_align": lambda x, rois: roi_align(x, rois, 3, 0.5, 0, True),
    "roi_pool": lambda x, rois: roi_pool(x, rois, 3, 0.5),
    "sigmoid_focal_loss": lambda x, rois: sigmoid_focal_loss(x, (x.detach() > 0.5).float(), reduction="sum"),
}


@on_gpu
@pytest.mark.parametrize("name", sorted(GPU_OPS))
def test_on_a_gpu_a_checked_call_syncs_and_a_trusted_one_does_not(name):
    """Checked: the forward's check syncs once (attributed to it), the backward's too (replayed
    after the pass). Trusted: forward and backward run under sync debug mode "error"."""
    op = GPU_OPS[name]
    x, rois = _gpu_inputs()
    with count_syncs() as counter:
        out = op(x, rois)
        forward = counter.syncs()
        out.sum().backward()
    assert [(c.op, c.checked, c.syncs) for c in counter.calls][:1] == [(name, True, 1)]
    assert forward == 1 and counter.syncs() >= 2

    with count_syncs() as counter:
        with trusted_inputs():
            out = op(x, rois)
        forward = counter.syncs()
        out.sum().backward()  # outside the block: the backward follows the forward
    assert not counter.failures and len(counter.calls) == 2
    assert [(c.checked, c.syncs) for c in counter.calls] == [(False, 0), (False, 0)]
    assert forward == 0


@on_gpu
def test_on_a_gpu_batched_nms_syncs_once_for_its_size_with_integer_ids():
    g = torch.Generator().manual_seed(0)
    xy = torch.rand(200, 2, generator=g) * 100
    boxes = torch.cat([xy, xy + 5 + torch.rand(200, 2, generator=g) * 30], dim=1).cuda()
    scores = torch.rand(200, generator=g).cuda()
    ids = torch.randint(0, 5, (200,), generator=g).cuda()
    with count_syncs() as counter:
        keep = batched_nms(boxes, scores, ids, 0.5)
        with trusted_inputs():
            trusted_keep = batched_nms(boxes, scores, ids, 0.5)
        floating = batched_nms(boxes, scores, ids.float(), 0.5)
        with trusted_inputs():
            trusted_floating = batched_nms(boxes, scores, ids.float(), 0.5)
    syncs = [(c.checked, c.syncs) for c in counter.calls]
    assert syncs[:2] == [(True, 1), (False, 1)], syncs
    # Floating ids: the finiteness check's sync (checked only) and torch.unique's.
    assert syncs[2][1] > syncs[3][1] > 1, syncs
    for other in (trusted_keep, floating, trusted_floating):
        assert torch.equal(other, keep)


@on_gpu
def test_on_a_gpu_unchecked_bad_rois_pool_zeros():
    """The CUDA kernels' guards on the hardware (test_cuda_emulation_unchecked.py has the cases
    and the reasons): bad rois pool zeros and pass no gradient; good rois as checked."""
    x, good = _gpu_inputs()
    bad = torch.tensor(
        [[-1.0, 1, 1, 9, 9], [2.0, 1, 1, 9, 9], [-0.5, 1, 1, 9, 9], [float("nan"), 1, 1, 9, 9],
         [0.0, float("nan"), 1, 9, 9], [1.0, 1, float("inf"), 9, 9], [0.0, 1, 1, -float("inf"), 9]],
        device="cuda")
    rois = torch.cat([good, bad])
    for name in ("roi_align", "roi_pool"):
        expected = GPU_OPS[name](x, good)
        (expected_grad,) = torch.autograd.grad(expected.sum(), x)
        with trusted_inputs():
            out = GPU_OPS[name](x, rois)
        (grad,) = torch.autograd.grad(out.sum(), x)
        assert torch.equal(out[len(good):], torch.zeros_like(out[len(good):])), name
        torch.testing.assert_close(out[: len(good)], expected)
        torch.testing.assert_close(grad, expected_grad)
    # roi_pool's backward given argmax offsets past the plane: dropped.
    argmax = torch.full((2, 3, 3, 3), 16 * 16, dtype=torch.int32, device="cuda")
    with trusted_inputs():
        grad = torch.ops.detcore._roi_pool_backward(torch.ones(2, 3, 3, 3, device="cuda"), good, argmax, 0.5, 3, 3, 2, 3, 16, 16)
    assert torch.equal(grad, torch.zeros_like(grad))
