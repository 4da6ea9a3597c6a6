"""The benchmarks' one worker protocol: a second Python process that a benchmark script starts as
itself (``python SCRIPT --worker ARGS``) and asks for measurements.

Why a second process:
- benchmark_ops.py's baseline build (``--baseline DIR``: a checkout whose detcore/_C was built
  from older sources). Two builds of detcore._C cannot live in one process (both register the
  ``detcore`` operator namespace), so the baseline runs in a worker, asked for one timed call at
  a time between the benchmark's own calls: both see the same load. Its results come back as
  digests, to prove that the two builds give the same bits.
- torchvision's NMS on the worst cases, under a time limit: one uninterruptible C++ call that
  may take minutes, so it runs in a worker that is killed when the limit passes.
- benchmark_model.py's measurements: the timing of every framework in one fresh process, and
  each peak memory in a process of its own (a process's peak RSS cannot be reset).

The protocol: one JSON object per line each way. The worker first says ``{"ready": true,
"detcore": <the folder its detcore was imported from>}``, then answers each request with one
reply: whatever its handler returns, or ``{"error": "..."}`` when the handler raised. It exits at
the end of its input, and with its parent (Linux). The worker's own prints go to its stderr (kept
in a file, whose end a failure quotes), so nothing but the protocol is ever on its stdout.
"""
import hashlib
import json
import os
import select
import subprocess
import sys
import tempfile
import time

import torch

from background_load import die_with_parent


def digest(result):
    """A hash of a result's bits (a tensor or a tuple of tensors): shapes, dtypes and bytes."""
    h = hashlib.sha256()
    for t in result if isinstance(result, (tuple, list)) else (result,):
        t = t.detach().cpu().contiguous()
        h.update(f"{tuple(t.shape)} {t.dtype};".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()[:16]


# --- the worker's side ------------------------------------------------------------------------
def serve(handle, stdin=None, stdout=None):
    """The worker's loop: ``handle(request) -> reply`` (dicts) for every request line until the
    end of input. With the default streams, the process's stdout is given over to the protocol
    and everything else printed goes to stderr."""
    if stdout is None:
        stdout = os.fdopen(os.dup(sys.stdout.fileno()), "w")
        sys.stdout.flush()
        os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # prints, even from C, now go to stderr
    stdin = sys.stdin if stdin is None else stdin
    import detcore

    stdout.write(json.dumps({"ready": True, "detcore": os.path.dirname(detcore.__file__)}) + "\n")
    stdout.flush()
    for line in stdin:
        try:
            reply = handle(json.loads(line))
        except Exception as e:  # reported to the benchmark, which says where it came from
            reply = {"error": f"{type(e).__name__}: {e}"}
        stdout.write(json.dumps(reply) + "\n")
        stdout.flush()


# --- the benchmark's side ---------------------------------------------------------------------
class WorkerTimeout(Exception):
    pass


class WorkerError(RuntimeError):
    """The worker died, or its handler raised: ``reason`` says what happened, the message adds
    the last lines of the worker's stderr."""

    def __init__(self, reason, stderr_tail=""):
        super().__init__(reason + stderr_tail)
        self.reason = reason


class Worker:
    """Starts ``python script --worker *args`` with detcore imported from ``detcore_root`` (the
    script's own checkout when None) and exchanges requests and replies with it.

    ``call`` sends a request and waits for its reply; ``send`` and ``receive`` split the two, so
    that several workers can work at once."""

    def __init__(self, script, args, detcore_root=None, what="benchmark worker", cwd=None, hello_timeout_s=600):
        env = dict(os.environ)
        if detcore_root is not None:
            env["DETCORE_BENCHMARK_ROOT"] = os.path.abspath(detcore_root)
        self.what = what
        self._stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [sys.executable, script, "--worker", *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            env=env,
            cwd=cwd,
            bufsize=0,
            preexec_fn=die_with_parent,
        )
        self._buffer = b""
        self._hello_timeout_s = hello_timeout_s
        self._detcore_path = None

    @property
    def detcore_path(self):
        """Where the worker's detcore was imported from (waits for its first line)."""
        if self._detcore_path is None:
            hello = self._read_line(self._hello_timeout_s)
            if not hello.get("ready"):
                raise WorkerError(f"{self.what}: expected its ready line first, got {hello}")
            self._detcore_path = hello["detcore"]
        return self._detcore_path

    def send(self, request):
        """Sends a request at once (the worker reads it when it is ready)."""
        self.proc.stdin.write((json.dumps(request) + "\n").encode())

    def receive(self, timeout_s=None):
        """The reply to the oldest unanswered request. Raises WorkerTimeout (and kills the
        worker) when none comes within timeout_s, WorkerError when the reply is an error."""
        self.detcore_path  # the ready line comes first
        reply = self._read_line(timeout_s)
        if "error" in reply:
            raise WorkerError(f"{self.what}: {reply['error']}", self._stderr_tail())
        return reply

    def call(self, request, timeout_s=None):
        self.send(request)
        return self.receive(timeout_s)

    def _read_line(self, timeout_s):
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while b"\n" not in self._buffer:
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([self.proc.stdout], [], [], wait)
            if not ready:
                self.close()
                raise WorkerTimeout(f"{self.what}: no answer within {timeout_s:g} s")
            chunk = os.read(self.proc.stdout.fileno(), 65536)
            if not chunk:
                code = self.proc.wait()
                raise WorkerError(f"{self.what} exited (code {code})", self._stderr_tail())
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def _stderr_tail(self, chars=4000):
        self._stderr.seek(0, os.SEEK_END)
        size = self._stderr.tell()
        self._stderr.seek(max(0, size - chars))
        tail = self._stderr.read().decode(errors="replace").strip()
        return f"; the end of its stderr:\n{tail}" if tail else ""

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.proc.stdin.close()
        self.proc.stdout.close()
