"""How scripts/gpu_check.sh runs one piece of work: a command with its own time limit, its output
in a log file, its result as a Part (status passed / failed / skipped, seconds, a note).

Standard library only: it runs before anything else is installed. Each command starts in its own
process group, so a time limit stops the command and everything it started, and nothing else.
"""
import os
import signal
import subprocess
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional

PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"
TAIL_CHARS = 1500  # of a failed part's log, kept in the JSON (the logs travel in a tarball)


@dataclass
class Part:
    name: str
    status: str
    seconds: float = 0.0
    note: str = ""
    command: str = ""
    log: str = ""
    tail: str = ""
    cpu_seconds: Optional[float] = None  # user + system, the command and the children it waited for

    def as_dict(self) -> Dict:
        return {k: v for k, v in asdict(self).items() if v not in ("", None)}


@dataclass
class Step:
    name: str
    title: str
    parts: List[Part] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def status(self) -> str:
        """failed if a part failed; skipped if every part was skipped (or there are none)."""
        statuses = {p.status for p in self.parts}
        if FAILED in statuses:
            return FAILED
        if PASSED in statuses:
            return PASSED
        return SKIPPED

    def as_dict(self) -> Dict:
        return {
            "name": self.name,
            "title": self.title,
            "status": self.status,
            "seconds": round(self.seconds, 1),
            "cpu_seconds": round(sum(p.cpu_seconds or 0 for p in self.parts), 1),
            "parts": [p.as_dict() for p in self.parts],
        }


def skipped(name: str, why: str) -> Part:
    print(f"  [{name}] skipped: {why}", flush=True)
    return Part(name, SKIPPED, note=why)


def failed(name: str, why: str) -> Part:
    """A part that cannot run, for a reason found before starting it."""
    print(f"  [{name}] failed: {why}", flush=True)
    return Part(name, FAILED, note=why)


def tail_of(path: str, chars: int = TAIL_CHARS) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - chars))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


class Job:
    """A command running in the background, its output going to `log`. One watcher thread reaps
    it (os.wait4), which also gives the CPU time it and the children it waited for used: a
    measure of its work that a loaded machine does not inflate."""

    def __init__(self, name: str, args: List[str], log: str, env: Optional[Dict[str, str]] = None, cwd: Optional[str] = None):
        self.name, self.args, self.log = name, args, log
        self.start = time.monotonic()
        self._file = open(log, "wb")
        self._file.write(("$ " + " ".join(args) + "\n").encode())
        self._file.flush()
        self.proc = subprocess.Popen(
            args, stdout=self._file, stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True
        )
        self.returncode: Optional[int] = None
        self.timed_out = False
        self.end: Optional[float] = None
        self.cpu_seconds: Optional[float] = None
        self._ended = threading.Event()
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self) -> None:
        _, status, usage = os.wait4(self.proc.pid, 0)
        self.proc.returncode = os.waitstatus_to_exitcode(status)
        self.cpu_seconds = usage.ru_utime + usage.ru_stime
        self.end = time.monotonic()
        self._ended.set()

    def _stop(self) -> None:
        """SIGTERM to the command's process group, SIGKILL 5 s later if it is still there."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            if self._ended.wait(5):
                return

    def wait(self, limit_s: float) -> Optional[int]:
        """The exit code, or None when the limit (counted from the start) ran out: then stopped."""
        if self.returncode is not None or self.timed_out:
            return self.returncode
        if self._ended.wait(max(0.0, limit_s - (time.monotonic() - self.start))):
            self.returncode = self.proc.returncode
        else:
            self.timed_out = True
            self._stop()
        self._file.close()
        return self.returncode

    def elapsed(self) -> float:
        """Seconds from the start to the command's end, or to now while it runs."""
        return (self.end or time.monotonic()) - self.start

    def part(self, limit_s: float, ok=None, note: str = "") -> Part:
        """Waits (up to limit_s from the start) and describes the outcome. ok(log text) may turn an
        exit code 0 into a failure and give the note: it returns (passed, note)."""
        rc = self.wait(limit_s)
        seconds = self.elapsed()
        cpu = round(self.cpu_seconds, 1) if self.cpu_seconds is not None else None
        command = " ".join(self.args)
        if rc is None:
            status, note = FAILED, f"stopped at its time limit of {limit_s:.0f} s"
        elif rc != 0:
            status, note = FAILED, note or f"exit code {rc}"
        else:
            status = PASSED
            if ok is not None:
                passed, note = ok(_read(self.log))
                status = PASSED if passed else FAILED
        part = Part(self.name, status, round(seconds, 1), note, command, os.path.basename(self.log), cpu_seconds=cpu)
        if status == FAILED:
            part.tail = tail_of(self.log)
        cpu_text = f" ({cpu:.0f} s of CPU)" if cpu is not None else ""
        print(f"  [{self.name}] {status} in {seconds:.1f} s{cpu_text}{': ' + note if note else ''}", flush=True)
        return part


def shorten(args: List[str], chars: int = 300) -> str:
    """A command line for the console, a long inline program cut short (the log has it whole)."""
    text = " ".join(a.replace("\n", "; ") for a in args)
    return text if len(text) <= chars else text[: chars - 3] + "..."


def run(name: str, args: List[str], log: str, limit_s: float, env=None, cwd=None, ok=None) -> Part:
    """Runs a command to its end or its time limit; its Part."""
    if limit_s <= 0:
        return skipped(name, "no time left in the budget")
    print(f"  [{name}] $ {shorten(args)}  (limit {limit_s:.0f} s)", flush=True)
    return Job(name, args, log, env, cwd).part(limit_s, ok)


def _read(path: str) -> str:
    with open(path, "rb") as f:
        return f.read().decode("utf-8", "replace")
