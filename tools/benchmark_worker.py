"""A second benchmark process that runs the same cases as tools/benchmark_ops.py on request.

Two uses:
- another detcore build (`--baseline DIR`: a checkout whose detcore/_C was built from older
  sources). Two builds of detcore._C cannot live in one process (both register the `detcore`
  operator namespace), so the baseline runs here, and the benchmark asks it for one timed call
  at a time, interleaved with its own calls: both see the same load. Its results come back as
  digests, to prove the two builds give the same bits.
- torchvision on the worst cases, under a time limit: its NMS is one uninterruptible C++ call
  that may take minutes, so it runs here and the process is killed when the limit passes.

The worker rebuilds the cases from the same arguments and seed, so its inputs are the same
tensors. Protocol: one JSON object per line each way; the worker exits at end of input (and
with its parent, on Linux).
"""
import hashlib
import json
import os
import select
import subprocess
import sys
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


def _timed_ms(fn):
    start = time.perf_counter()
    result = fn()
    return result, (time.perf_counter() - start) * 1000


def serve(cases, stdin=sys.stdin, stdout=sys.stdout):
    """The worker's loop: answers requests about `cases` (by name) until end of input."""
    by_name = {c.name: c for c in cases}
    import detcore

    stdout.write(json.dumps({"ready": True, "detcore": os.path.dirname(detcore.__file__)}) + "\n")
    stdout.flush()
    for line in stdin:
        request = json.loads(line)
        case = by_name.get(request["case"])
        fn = None
        if case is not None:
            fn = case.detcore_fn if request["impl"] == "detcore" else case.torchvision_fn
        if fn is None:
            reply = {"error": f"no {request['impl']} call for case {request['case']!r} here"}
        else:
            try:
                result, ms = _timed_ms(fn)
                reply = {"ms": ms}
                if request.get("digest"):
                    reply["digest"] = digest(result)
            except Exception as e:  # reported to the benchmark, which prints it in the row
                reply = {"error": f"{type(e).__name__}: {e}"}
        stdout.write(json.dumps(reply) + "\n")
        stdout.flush()


class WorkerTimeout(Exception):
    pass


class Worker:
    """The benchmark's side: starts `python tools/benchmark_ops.py --serve ...` with detcore
    imported from `detcore_root`, and sends it requests."""

    def __init__(self, script, serve_args, detcore_root):
        env = dict(os.environ, DETCORE_BENCHMARK_ROOT=os.path.abspath(detcore_root))
        self.proc = subprocess.Popen(
            [sys.executable, script, "--serve", *serve_args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            bufsize=0,
            preexec_fn=die_with_parent,
        )
        self._buffer = b""
        hello = self._read_line(timeout_s=600)
        self.detcore_path = hello["detcore"]

    def call(self, case_name, impl="detcore", want_digest=False, timeout_s=None):
        """One timed call in the worker: {"ms": ..., ["digest": ...]} or {"error": ...}.
        Raises WorkerTimeout (and kills the worker) when it takes longer than timeout_s."""
        request = {"case": case_name, "impl": impl, "digest": want_digest}
        self.proc.stdin.write((json.dumps(request) + "\n").encode())
        return self._read_line(timeout_s)

    def _read_line(self, timeout_s):
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while b"\n" not in self._buffer:
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([self.proc.stdout], [], [], wait)
            if not ready:
                self.close()
                raise WorkerTimeout(f"no answer within {timeout_s:g} s")
            chunk = os.read(self.proc.stdout.fileno(), 65536)
            if not chunk:
                code = self.proc.wait()
                raise RuntimeError(f"benchmark worker exited (code {code}); its errors are above")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
