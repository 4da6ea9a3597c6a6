"""An OUTPUT_DIR belongs to one training run.

- ``lock_output_dir``: a lock file that a second run into the same folder cannot take while the
  first lives (two runs would delete each other's temporary files and mix their checkpoints).
  It is an OS lock (``flock``) on ``OUTPUT_DIR/.run.lock``: the kernel releases it when the
  process ends, however it ends (kill -9 included), so a killed run leaves no stale lock. The
  file also records who holds it, for the message the second run gets.
- ``check_new_run``: a run that does not resume refuses a folder that already holds a run's
  checkpoints (it would overwrite model_final.pth, metrics.json and config.yaml), with a message
  saying how to resume or where to write instead; ``start_over=True`` moves the old run's files
  into a ``replaced_<time>`` subfolder first, so nothing is lost either way.
"""
import datetime
import fcntl
import glob
import logging
import os
import shutil
import socket
from typing import Dict, List

__all__ = ["OutputDirInUseError", "OutputDirHasRunError", "lock_output_dir", "check_new_run", "previous_run_files"]

LOCK_FILE = ".run.lock"
# What a run writes into OUTPUT_DIR (besides the lock): moved aside together on start-over.
_RUN_FILES = ("model_*.pth", "last_checkpoint", "metrics.json", "config.yaml", "log.txt", "loss_curves.png",
              "events.out.tfevents.*", "inference")

_held: Dict[str, int] = {}  # realpath of OUTPUT_DIR -> file descriptor of its lock, for this process


class OutputDirInUseError(RuntimeError):
    """Another live process trains into this OUTPUT_DIR."""


class OutputDirHasRunError(RuntimeError):
    """A new (not resumed) run was pointed at a folder holding a previous run."""


def lock_output_dir(output_dir: str) -> None:
    """Take OUTPUT_DIR's run lock for this process (again: a no-op), or raise
    ``OutputDirInUseError`` naming the process that holds it."""
    key = os.path.realpath(output_dir)
    if key in _held:
        return
    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, LOCK_FILE)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip() or "unknown process"
        os.close(fd)
        raise OutputDirInUseError(
            f"OUTPUT_DIR {output_dir} is in use by another run ({holder}). Two runs in one folder would mix "
            "their checkpoints: wait for it to end, or set OUTPUT_DIR to another folder."
        ) from None
    os.ftruncate(fd, 0)
    started = datetime.datetime.now().isoformat(timespec="seconds")
    os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}, started {started}\n".encode(), 0)
    _held[key] = fd  # held until the process exits


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
    logging.getLogger(__name__).warning("Starting over in %s: the previous run's files are now in %s", output_dir, target)
