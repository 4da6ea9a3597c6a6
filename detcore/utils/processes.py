"""Whether a process lives, and child processes that end with the process that started them.

``exit_with_parent`` is for data-loader workers: when the main process is killed (kill -9, an
out-of-memory kill), a worker blocked writing a batch to it would otherwise wait forever, and
keep whatever it inherited (files, memory, a GPU context) with it.
"""
import os
import threading
import time
from typing import Optional

__all__ = ["process_alive", "exit_with_parent"]

# How often a worker checks that its parent still lives: what "promptly" means below.
PARENT_POLL_SECONDS = 0.2


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this machine and is not a zombie (a process that has
    ended but was not yet reaped by its parent counts as ended)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it exists
        pass
    try:
        with open(f"/proc/{pid}/stat") as f:
            # "pid (name) state ...": the name may hold spaces and parentheses; the state follows the last ")".
            return f.read().rpartition(")")[2].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return True  # no /proc (not Linux): os.kill said it exists


def exit_with_parent(parent_pid: Optional[int] = None) -> None:
    """Make this process end (``os._exit``) within ``PARENT_POLL_SECONDS`` of its parent's end.

    A daemon thread watches ``os.getppid()``: when the parent dies, the kernel hands its children
    to another process at once, even before anyone reaps the parent, so the parent pid changes.
    ``parent_pid`` is the pid the caller expects as parent (the main process, for a data-loader
    worker started by fork): when the parent is already someone else at the start, the expected
    one died before this call and the process exits now. A thread rather than Linux's
    ``PR_SET_PDEATHSIG``, which fires when the *thread* that started the child ends: a loader
    iterated from a short-lived thread would lose its workers.
    """
    start = os.getppid()
    if parent_pid is not None and start != parent_pid and not process_alive(parent_pid):
        os._exit(1)

    def watch() -> None:
        while os.getppid() == start:
            time.sleep(PARENT_POLL_SECONDS)
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()
