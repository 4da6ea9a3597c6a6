"""Ctrl-C during the long CPU ops (detcore/csrc/cpu/interrupt.h), each in a child process.

The issue's reproducers, scaled. A case's child first times the op on a probe input (the best of
two runs), then builds an input K times as large, whose uninterrupted run would last at least
about K times as long (every op here costs at least in proportion to its input), says "ready"
and calls the op. The test sends SIGINT once the call has started and expects KeyboardInterrupt
out of the op, raised by the op's own check (the kernels count the calls they end so:
detcore._C._interrupted_op_count), not by Python after the op ran to its end. No time is asserted:
the latency is printed (the README promises about a second), and the waits are hang guards. Then a
small second call of the op must give torchvision's answer: nothing of the interrupted call is
left behind. The ops run on all intra-op threads, so the workers' early stop
is exercised too. Then what the process set up for SIGINT: a handler of its own that returns lets
the op go on to its full answer, an ignored SIGINT changes nothing, and an op on another thread
than the main one is never interrupted.

Slow: each case starts a Python process that imports torch.
"""
import os
import queue
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not hasattr(signal, "SIGINT") or os.name != "posix", reason="POSIX signals"),
]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STARTUP_TIMEOUT_S = 600  # importing torch and timing the probe on a loaded machine
SIGNAL_DELAY_S = 0.5     # after the child says the op starts (at most; see _signal_delay)
FINISH_TIMEOUT_S = 600   # a hang guard, never reached by a passing test

# --- the long ops. `make(m)` builds the arguments `a` for m units of work (boxes, rois, images,
# elements), `call` runs the op on them, `again` is a small second call checked against
# torchvision. (m, K): the probe's units and how many times more the interrupted call gets.
_NMS_MAKE = """
def make(m):  # boxes within a few pixels of each other, IoU mostly under 0.99: most are kept
    xy = torch.rand(m, 2, generator=g) * 20
    boxes = torch.cat([xy, xy + 100 + torch.rand(m, 2, generator=g) * 100], 1)
    return boxes, torch.rand(m, generator=g), torch.arange(m) % 2
"""
_NMS_AGAIN = """
b = torch.rand(600, 2, generator=g) * 300
b = torch.cat([b, b + 20 + torch.rand(600, 2, generator=g) * 80], 1)
s = torch.rand(600, generator=g)
c = torch.randint(0, 3, (600,), generator=g)
assert torch.equal(L.nms(b, s, 0.5), torchvision.ops.nms(b, s, 0.5))
assert torch.equal(L.batched_nms(b, s, c, 0.5), torchvision.ops.batched_nms(b, s, c, 0.5))
"""
_ROI_MAKE = """
x = torch.rand(1, 8, 64, 64, generator=g)
def make(m):  # with sampling_ratio 128 (the largest allowed) a roi has 16384 taps a bin
    corner = torch.rand(m, 2, generator=g) * 20
    rois = torch.cat([torch.zeros(m, 1), corner, corner + 40], 1)
    return x, rois, torch.rand(m, 8, 7, 7, generator=g)
"""
_ROI_AGAIN = """
x = torch.rand(2, 32, 20, 20, generator=g, dtype=torch.float64, requires_grad=True)
corner = torch.rand(30, 2, generator=g, dtype=torch.float64) * 12
r = torch.cat([torch.randint(0, 2, (30, 1), generator=g).double(), corner, corner + 6], 1)
for ours, theirs, kw in [
    (L.roi_align, torchvision.ops.roi_align, dict(spatial_scale=1.0, sampling_ratio=3, aligned=True)),
    (L.roi_pool, torchvision.ops.roi_pool, dict(spatial_scale=1.0)),
]:
    a, = torch.autograd.grad(ours(x, r, (5, 5), **kw).square().sum(), x)
    b, = torch.autograd.grad(theirs(x, r, (5, 5), **kw).square().sum(), x)
    torch.testing.assert_close(a, b, atol=1e-9, rtol=1e-9)
"""
_ROI_POOL_MAKE = """
x = torch.rand(1, 32, 400, 400, generator=g)
def make(m):  # every roi spans most of the map
    rois = torch.cat([torch.zeros(m, 1), torch.rand(m, 2, generator=g) * 20,
                      380 + torch.rand(m, 2, generator=g) * 20], 1)
    return x, rois
"""
_DEFORM_MAKE = """
w = torch.rand(128, 128, 3, 3, generator=g)
def make(m):  # m images of 128 channels
    x = torch.rand(m, 128, 96, 96, generator=g)
    return x, torch.randn(m, 18, 94, 94, generator=g), torch.rand(m, 128, 94, 94, generator=g)
"""
_DEFORM_AGAIN = """
x = torch.rand(2, 6, 9, 9, generator=g, dtype=torch.float64, requires_grad=True)
w = torch.rand(4, 6, 3, 3, generator=g, dtype=torch.float64, requires_grad=True)
o = torch.randn(2, 18, 7, 7, generator=g, dtype=torch.float64, requires_grad=True)
ours = torch.autograd.grad(L.deform_conv2d(x, o, w).square().sum(), (x, w, o))
theirs = torch.autograd.grad(torchvision.ops.deform_conv2d(x, o, w).square().sum(), (x, w, o))
for a, b in zip(ours, theirs):
    torch.testing.assert_close(a, b, atol=1e-9, rtol=1e-9)
"""
_FOCAL_MAKE = """
torch.set_num_threads(1)  # one pass over memory: one thread makes it last longest
def make(m):  # m elements
    logits = torch.randn(m // 8, 8, generator=g)
    return logits, torch.randint(0, 2, logits.shape, generator=g, dtype=torch.float32)
"""
_FOCAL_AGAIN = """
torch.set_num_threads(2)
z = torch.randn(50, 7, generator=g, dtype=torch.float64, requires_grad=True)
t = (torch.rand(50, 7, generator=g) < 0.3).double()
a, = torch.autograd.grad(L.sigmoid_focal_loss(z, t, reduction="sum"), z)
b, = torch.autograd.grad(torchvision.ops.sigmoid_focal_loss(z, t, reduction="sum"), z)
torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12)
"""
OPS = "torch.ops.detcore"
_SCRIPTED_NMS = (
    "cu = torch.jit.CompilationUnit(\"\"\"\n"
    "def f(b: Tensor, s: Tensor) -> Tensor:\n"
    "    return torch.ops.detcore.nms(b, s, 0.99)\n"
    "\"\"\")\n"
)
# roi_pool's backward (a few adds per pooled value) and the focal loss run at memory speed: they
# last seconds only on gigabytes; the focal loss is here on 100M elements, on one thread.
CASES = {  # name: (make, call, again, probe units, K)
    # 200k boxes (the 10 s); the walk's cost grows faster than the boxes: K * probe is
    # far below the uninterrupted time, and the sort and grid set-up before it stay short.
    "nms": (_NMS_MAKE, "L.nms(a[0], a[1], 0.99)", _NMS_AGAIN, 40_000, 5),
    "nms_torchscript": (  # the interpreter turns the exception into a RuntimeError saying so
        _NMS_MAKE + _SCRIPTED_NMS, "cu.f(a[0], a[1])", _NMS_AGAIN, 40_000, 5),
    "batched_nms": (  # two categories: their walks run on two threads
        _NMS_MAKE, "L.batched_nms(a[0], a[1], a[2], 0.99)", _NMS_AGAIN, 40_000, 5),
    "roi_align": (_ROI_MAKE, "L.roi_align(a[0], a[1], 7, 1.0, 128, True)", _ROI_AGAIN, 2, 100),
    "roi_align_backward": (
        _ROI_MAKE,
        f"{OPS}._roi_align_backward(a[2], a[1], 1.0, 7, 7, 1, 8, 64, 64, 128, True)",
        _ROI_AGAIN, 2, 100),
    "roi_pool": (_ROI_POOL_MAKE, "L.roi_pool(a[0], a[1], 7, 1.0)", _ROI_AGAIN, 10, 100),
    "deform_conv2d": (
        _DEFORM_MAKE, "L.deform_conv2d(a[0], a[1], w)", _DEFORM_AGAIN, 1, 40),
    "deform_conv2d_backward": (
        _DEFORM_MAKE,
        f"{OPS}._deform_conv2d_backward(a[2], a[0], w, a[1], None, None, 1, 1, 0, 0, 1, 1, 1, 1)",
        _DEFORM_AGAIN, 1, 40),
    "sigmoid_focal_loss": (
        _FOCAL_MAKE, 'L.sigmoid_focal_loss(a[0], a[1], reduction="sum")', _FOCAL_AGAIN,
        4_000_000, 25),
    "sigmoid_focal_loss_backward": (
        _FOCAL_MAKE,
        f'{OPS}._sigmoid_focal_loss_backward(torch.ones(()), a[0], a[1], 0.25, 2.0, "sum", False)',
        _FOCAL_AGAIN, 4_000_000, 25),
}

_PRELUDE = """
import signal, sys, time
import torch, torchvision
import detcore.layers as L
g = torch.Generator().manual_seed(0)
"""


class Child:
    """A Python child process whose stdout lines are read as they come."""

    def __init__(self, code):
        self.proc = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(_PRELUDE) + textwrap.dedent(code)],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        self.lines = queue.Queue()
        self.stderr = []
        threading.Thread(target=self._pump, args=(self.proc.stdout, self.lines.put), daemon=True).start()
        threading.Thread(target=self._pump, args=(self.proc.stderr, self.stderr.append), daemon=True).start()

    @staticmethod
    def _pump(stream, put):
        for line in stream:
            put(line.rstrip("\n"))
        put(None)  # the child closed it: it exited

    def expect(self, wanted, timeout=FINISH_TIMEOUT_S):
        """Waits for a line starting with `wanted`; returns it, or fails with the child's stderr.
        A line saying the op ended another way than `wanted` fails at once."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                line = self.lines.get(timeout=max(left, 0))
            except queue.Empty:
                self.kill()
                pytest.fail(f"no {wanted!r} from the child within {timeout:.1f} s\n" + self.errors())
            if line is None:
                self.lines.put(None)
                pytest.fail(f"the child exited before saying {wanted!r}\n" + self.errors())
            if line.startswith(wanted):
                return line
            if line.startswith(("finished", "interrupted", "handler")):
                self.kill()
                pytest.fail(f"expected {wanted!r}, the child said {line!r}\n" + self.errors())

    def interrupt(self):
        os.kill(self.proc.pid, signal.SIGINT)

    def exit_code(self, timeout=60):
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail("the child did not exit\n" + self.errors())

    def errors(self):
        time.sleep(0.2)
        return "child stderr:\n" + "\n".join(line for line in self.stderr[-40:] if line is not None)

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _op_script(make, call, again, units, times):
    return (
        make
        + "def timed(a):\n    t = time.monotonic()\n    " + call + "\n    return time.monotonic() - t\n"
        + f"a = make({units})\n"
        + "probe = min(timed(a), timed(a))\n"
        + f"a = make({units * times})\n"
        + "import detcore._C as C\n"
        + "stopped_before = C._interrupted_op_count()\n"
        + "def report():\n"
        + '    print("interrupted", time.monotonic() - start, started,\n'
        + "          C._interrupted_op_count() - stopped_before, flush=True)\n"
        + "started = False\n"
        + f'print("ready", {times} * probe, flush=True)\n'
        + "start = time.monotonic()\n"
        + "try:\n    started = True\n    " + call + "\n"
        + "except KeyboardInterrupt:\n    report()\n"
        + "except RuntimeError as e:\n"
        + '    if "KeyboardInterrupt raised by the SIGINT handler" not in str(e):\n        raise\n'
        + "    report()\n"
        + 'else:\n    print("finished", flush=True)\n'
        + "del a\n"
        + "g = torch.Generator().manual_seed(1)\n"
        + again
        + 'print("again ok", flush=True)\n'
    )


def _signal_delay(uninterrupted):
    """How long to let the op run before SIGINT: a small part of its uninterrupted time (the op
    starts a few bytecodes after the child's "ready"; a signal that came first would raise
    before the op, and the case fails saying so). Long enough that the op has started; short
    enough that it is far from its end."""
    return min(SIGNAL_DELAY_S, max(0.05, uninterrupted / 20))


@pytest.mark.parametrize("case", list(CASES))
def test_ctrl_c_stops_the_op(case):
    make, call, again, units, times = CASES[case]
    child = Child(_op_script(make, call, again, units, times))
    uninterrupted = float(child.expect("ready", STARTUP_TIMEOUT_S).split()[1])
    time.sleep(_signal_delay(uninterrupted))
    sent = time.monotonic()
    child.interrupt()
    _, ran, started, stopped_in_op = child.expect("interrupted").split()
    print(f"{case}: KeyboardInterrupt {time.monotonic() - sent:.3f} s after SIGINT, "
          f"the call ran {float(ran):.2f} s of about {uninterrupted:.1f} s uninterrupted")
    assert started == "True", "the SIGINT came before the op was called: the case proves nothing"
    assert stopped_in_op == "1", "KeyboardInterrupt came after the op's end, not from its check"
    child.expect("again ok")
    assert child.exit_code() == 0, child.errors()


# A handler of the program's own that returns: the op runs it while it works (the child says so
# before the op returns) and goes on to the same answer as a call never signalled. nms walks on
# the calling thread; roi_align's blocks run on all threads while the calling thread runs the
# handler. The probe makes the call last well past the signal.
_HANDLER = """
def handler(signum, frame):
    print("handler called", flush=True)
signal.signal(signal.SIGINT, handler)
"""
_GOES_ON = {  # name: (make, call, probe units, K, power: the cost grows as units ** power)
    "nms": (_NMS_MAKE, "L.nms(a[0], a[1], 0.99)", 10_000, 4, 2),  # most boxes kept: quadratic
    "roi_align": (_ROI_MAKE, "L.roi_align(a[0], a[1], 7, 1.0, 32, True)", 10, 10, 1),
}


def _long_enough(make, call, units, times, power):
    """Code that sets `a` to arguments on which `call` lasts about 8 SIGNAL_DELAY_S or more."""
    return (
        make
        + f"a = make({units})\n"
        + "def timed(a):\n    t = time.monotonic()\n    " + call + "\n    return time.monotonic() - t\n"
        + "probe = min(timed(a), timed(a))\n"
        + f"a = make(max({units * times}, int({units} * ({8 * SIGNAL_DELAY_S} / probe) ** (1 / {power})) + 1))\n"
        + "run = lambda: " + call + "\n"
    )


@pytest.mark.parametrize("case", list(_GOES_ON))
def test_a_handler_that_returns_lets_the_op_finish(case):
    child = Child(
        _long_enough(*_GOES_ON[case])
        + _HANDLER
        + 'print("ready", flush=True)\n'
        + "got = run()\n"
        + 'print("finished", flush=True)\n'
        + "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        + "assert torch.equal(got, run())\n"
        + 'print("same answer", flush=True)\n'
    )
    child.expect("ready", STARTUP_TIMEOUT_S)
    time.sleep(SIGNAL_DELAY_S)
    child.interrupt()
    child.expect("handler called")  # before "finished", or expect fails
    child.expect("finished")
    child.expect("same answer")
    assert child.exit_code() == 0, child.errors()


def test_an_ignored_sigint_changes_nothing():
    child = Child(
        _long_enough(*_GOES_ON["nms"])
        + "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
        + 'print("ready", flush=True)\n'
        + "got = run()\n"
        + 'print("finished", flush=True)\n'
        + "assert torch.equal(got, run())\n"
        + 'print("same answer", flush=True)\n'
    )
    child.expect("ready", STARTUP_TIMEOUT_S)
    time.sleep(SIGNAL_DELAY_S)
    child.interrupt()
    child.expect("finished")
    child.expect("same answer")
    assert child.exit_code() == 0, child.errors()


def test_an_op_on_another_thread_runs_to_its_end():
    # Python interrupts its main thread only: there the wait for the thread raises, while the op
    # on the other thread runs on to its full answer. (An Event, not Thread.join: a join that
    # KeyboardInterrupt broke may return at once the next time, the thread still running.)
    child = Child(
        _long_enough(*_GOES_ON["nms"])
        + "import threading\n"
        + "out = {}\n"
        + "done = threading.Event()\n"
        + "worker = threading.Thread(target=lambda: (out.update(keep=run()), done.set()))\n"
        + 'print("ready", flush=True)\n'
        + "worker.start()\n"
        + "try:\n    done.wait()\n"
        + 'except KeyboardInterrupt:\n    print("interrupted", flush=True)\n'
        + "done.wait()\n"
        + 'print("finished", flush=True)\n'
        + 'assert torch.equal(out["keep"], run())\n'
        + 'print("same answer", flush=True)\n'
    )
    child.expect("ready", STARTUP_TIMEOUT_S)
    time.sleep(SIGNAL_DELAY_S)
    child.interrupt()
    child.expect("interrupted")  # before "finished", or expect fails
    child.expect("finished")
    child.expect("same answer")
    assert child.exit_code() == 0, child.errors()
