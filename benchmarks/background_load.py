"""Busy processes beside a benchmark: the load that a shared machine puts on a kernel.

    with BackgroundLoad(2):            # two `while True: pass` processes, one per core
        ...time something...
    with BackgroundLoad(2, nice=19):   # the same at the lowest priority (a niced build beside us)

The processes belong to the benchmark: started on entering the block, killed on leaving it (also
on Ctrl-C or an error), and each one also dies with its parent (Linux), or exits by itself soon
after, so that a benchmark killed with SIGKILL leaves nothing spinning.
"""
import ctypes
import os
import signal
import subprocess
import sys
import time

# A busy loop that looks up its parent every million turns (a few tens of milliseconds).
_SPIN = """
import os
parent = os.getppid()
turns = 0
while True:
    turns += 1
    if turns % 1000000 == 0 and os.getppid() != parent:
        break
"""


def die_with_parent():
    """preexec_fn for a child process: SIGKILL when its parent dies (Linux; elsewhere a no-op)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class BackgroundLoad:
    """`processes` busy Python processes at niceness `nice` (0: the benchmark's own priority)."""

    def __init__(self, processes, nice=0, settle_s=0.3):
        if processes < 0:
            raise ValueError(f"BackgroundLoad: processes must be >= 0, got {processes}")
        if not 0 <= nice <= 19:
            raise ValueError(f"BackgroundLoad: nice must be in [0, 19], got {nice}")
        self.processes = processes
        self.nice = nice
        self.settle_s = settle_s
        self._children = []

    def start(self):
        def prepare_child():
            die_with_parent()
            if self.nice:
                os.nice(self.nice)

        try:
            for _ in range(self.processes):
                self._children.append(
                    subprocess.Popen(
                        [sys.executable, "-c", _SPIN],
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                        preexec_fn=prepare_child,
                    )
                )
            time.sleep(self.settle_s)  # the interpreters are up and spinning before timing starts
            dead = [p.returncode for p in self._children if p.poll() is not None]
            if dead:
                raise RuntimeError(f"BackgroundLoad: a busy process exited at once (codes {dead})")
        except BaseException:
            self.stop()
            raise

    def stop(self):
        for p in self._children:
            if p.poll() is None:
                p.kill()
        for p in self._children:
            p.wait()
        self._children = []

    def pids(self):
        return [p.pid for p in self._children]

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()
        return False
