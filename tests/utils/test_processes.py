"""process_alive (zombies count as ended) and exit_with_parent (a child ends soon after its
parent, including when the parent died before the child started watching)."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from detcore.utils.processes import exit_with_parent, process_alive

REPO = Path(__file__).resolve().parents[2]

_PARENT = """
import os, sys, time
from detcore.utils.processes import exit_with_parent
parent = os.getpid()
child = os.fork()
if child == 0:
    exit_with_parent(parent)
    time.sleep(120)
    os._exit(0)
print(child, flush=True)
time.sleep(120)
"""


def test_process_alive_counts_a_zombie_as_ended():
    assert process_alive(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    while True:  # exited but not reaped: a zombie
        with open(f"/proc/{child.pid}/stat") as f:
            if f.read().rpartition(")")[2].split()[0] == "Z":
                break
        time.sleep(0.01)
    assert not process_alive(child.pid)
    child.wait()
    assert not process_alive(child.pid)


def wait_gone(pid, seconds=60):
    deadline = time.time() + seconds
    while process_alive(pid) and time.time() < deadline:
        time.sleep(0.02)
    return not process_alive(pid)


def test_a_child_exits_when_its_parent_is_killed():
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    parent = subprocess.Popen([sys.executable, "-c", _PARENT], stdout=subprocess.PIPE, text=True, env=env)
    child = int(parent.stdout.readline())
    try:
        time.sleep(0.5)
        assert process_alive(child)  # it lives while its parent does
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        assert wait_gone(child)
    finally:
        if process_alive(child):
            os.kill(child, signal.SIGKILL)


def test_a_child_whose_parent_died_before_it_watched_exits_at_once():
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    pid = os.fork()
    if pid == 0:  # the expected parent is not this child's parent, and it is dead
        try:
            exit_with_parent(dead.pid)
        finally:
            os._exit(0)  # not reached when exit_with_parent exits (status 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 1
