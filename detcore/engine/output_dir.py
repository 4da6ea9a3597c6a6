"""An OUTPUT_DIR belongs to one training run.

- ``lock_output_dir``: a lock file that a second run into the same folder cannot take while the
  first lives (two runs would delete each other's temporary files and mix their checkpoints).
  It is an OS lock (``flock``) on ``OUTPUT_DIR/.run.lock``, held by the main process alone: the
  kernel releases it when the process ends, however it ends (kill -9 included), so a killed run
  leaves no stale lock. The file also records who holds it, for the message the second run gets.
- ``check_new_run``: a run that does not resume refuses a folder that already holds a run's
  checkpoints (it would overwrite model_final.pth, metrics.json and config.yaml), with a message
  saying how to resume or where to write instead; ``start_over=True`` moves the old run's files
  into a ``replaced_<time>`` subfolder first, so nothing is lost either way.

Why the lock is the main process' alone: a ``flock`` belongs to the open file, and a child made
by ``fork`` shares the parent's open files. Data-loader workers are forked, so they held the
lock too, and outlived a killed run for seconds to minutes (``--resume`` was refused, naming the
dead process). Closing the file on exec (Python's default) covers children that run another
program, and spawn / forkserver children (they are exec'd); ``os.register_at_fork`` covers the
forked ones: each forked child closes its copy at once, which leaves the parent's lock as it is.
(POSIX ``fcntl`` locks are not inherited by fork either, but the process loses them when it
closes *any* descriptor of the file, which any code reading the lock file would do.) And when a
lock is still held after the run that took it has died (a process it started still holds the
file: from a run before this rule, or a child made by some other way), the next run says so,
names those processes, and waits a while for them to exit.
"""
import datetime
import fcntl
import glob
import logging
import os
import re
import shutil
import socket
import time
from typing import Dict, List, Optional, Tuple

from detcore.utils.processes import process_alive

__all__ = ["OutputDirInUseError", "OutputDirHasRunError", "lock_output_dir", "check_new_run", "previous_run_files"]

LOCK_FILE = ".run.lock"
# What a run writes into OUTPUT_DIR (besides the lock): moved aside together on start-over.
_RUN_FILES = ("model_*.pth", "last_checkpoint", "metrics.json", "config.yaml", "log.txt", "loss_curves.png",
              "events.out.tfevents.*", "inference")

_held: Dict[str, int] = {}  # realpath of OUTPUT_DIR -> file descriptor of its lock, for this process

# How long a run waits for processes left behind by a dead run to release the lock.
LEFTOVER_WAIT_SECONDS = 30.0

logger = logging.getLogger(__name__)


def _forget_locks_in_child() -> None:
    # In a forked child: close its copies of the lock files (the parent keeps its lock).
    for fd in _held.values():
        try:
            os.close(fd)
        except OSError:
            pass
    _held.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_locks_in_child)


class OutputDirInUseError(RuntimeError):
    """Another live process trains into this OUTPUT_DIR."""


class OutputDirHasRunError(RuntimeError):
    """A new (not resumed) run was pointed at a folder holding a previous run."""


def lock_output_dir(output_dir: str) -> None:
    """Take OUTPUT_DIR's run lock for this process (again: a no-op), or raise
    ``OutputDirInUseError`` naming the process that holds it. When that process has ended but
    processes it started still hold the lock, wait up to ``LEFTOVER_WAIT_SECONDS`` for them."""
    key = os.path.realpath(output_dir)
    if key in _held:
        return
    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, LOCK_FILE)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        _take(fd, path, output_dir)
    except BaseException:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    started = datetime.datetime.now().isoformat(timespec="seconds")
    os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}, started {started}\n".encode(), 0)
    _held[key] = fd  # held until the process exits


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _take(fd: int, path: str, output_dir: str) -> None:
    if _try_lock(fd):
        return
    holder = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip() or "unknown process"
    pid, host = _parse_holder(holder)
    if pid is None or host != socket.gethostname() or process_alive(pid):
        raise OutputDirInUseError(
            f"OUTPUT_DIR {output_dir} is in use by another run ({holder}). Two runs in one folder would mix "
            "their checkpoints: wait for it to end, or set OUTPUT_DIR to another folder."
        )
    # The run that took the lock is dead: what holds it now are processes it left behind.
    left = _processes_holding(path)
    logger.warning(
        "OUTPUT_DIR %s: the run that held it (%s) has ended, but processes it started still hold its lock%s; "
        "waiting up to %g s for them to exit",
        output_dir, holder, f" (pids {', '.join(map(str, left))})" if left else "", LEFTOVER_WAIT_SECONDS,
    )
    deadline = time.monotonic() + LEFTOVER_WAIT_SECONDS
    while time.monotonic() < deadline:
        time.sleep(0.1)
        if _try_lock(fd):
            return
    left = _processes_holding(path)
    raise OutputDirInUseError(
        f"OUTPUT_DIR {output_dir} is still locked {LEFTOVER_WAIT_SECONDS:g} s after the run that held it ({holder}) "
        f"ended: processes it started still hold the lock ({'pids ' + ', '.join(map(str, left)) if left else 'their pids are not visible to this user'}). "
        "End them (kill PID) and start again, or set OUTPUT_DIR to another folder."
    )


def _parse_holder(holder: str) -> Tuple[Optional[int], Optional[str]]:
    match = re.match(r"pid (\d+) on (\S+),", holder)
    return (int(match.group(1)), match.group(2)) if match else (None, None)


def _processes_holding(path: str) -> List[int]:
    """The pids (this user's, on Linux) with ``path`` open, this process excluded."""
    try:
        target = os.stat(path)
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return []
    found = []
    for pid in pids:
        if pid == os.getpid():
            continue
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                st = os.stat(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if (st.st_dev, st.st_ino) == (target.st_dev, target.st_ino):
                found.append(pid)
                break
    return sorted(found)


def previous_run_files(output_dir: str) -> List[str]:
    """The files and folders of a previous run in ``output_dir`` (empty when it holds no
    checkpoint: a run killed before its first checkpoint left nothing worth keeping)."""
    if not glob.glob(os.path.join(glob.escape(output_dir), "model_*.pth")) and not os.path.exists(
        os.path.join(output_dir, "last_checkpoint")
    ):
        return []
    found = []
    for pattern in _RUN_FILES:
        found += sorted(glob.glob(os.path.join(glob.escape(output_dir), pattern)))
    return found


def check_new_run(output_dir: str, start_over: bool = False) -> None:
    """Make sure a run that starts from iteration 0 overwrites no previous run (see the module
    docstring)."""
    files = previous_run_files(output_dir)
    if not files:
        return
    names = [os.path.basename(f) for f in files]
    finished = "model_final.pth" in names
    if not start_over:
        shown = ", ".join(names[:6]) + (", ..." if len(names) > 6 else "")
        raise OutputDirHasRunError(
            f"OUTPUT_DIR {output_dir} already holds a {'finished' if finished else 'previous'} run ({shown}). "
            "To continue it, add --resume. To keep it and train anew, set OUTPUT_DIR to another folder. "
            "To start over in this folder (its files are moved into a replaced_<time> subfolder), add --start-over."
        )
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    target = os.path.join(output_dir, f"replaced_{stamp}")
    os.makedirs(target)
    for path in files:
        shutil.move(path, os.path.join(target, os.path.basename(path)))
    logger.warning("Starting over in %s: the previous run's files are now in %s", output_dir, target)
