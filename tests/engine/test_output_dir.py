"""An OUTPUT_DIR belongs to one run: a second live run is refused (the lock dies with its
process, kill -9 included), and a new run never overwrites a previous one unless told to start
over, in which case the old files are moved aside, not deleted."""
import contextlib
import fcntl
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from detcore.engine import output_dir
from detcore.engine.output_dir import (
    LOCK_FILE,
    OutputDirHasRunError,
    OutputDirInUseError,
    check_new_run,
    lock_output_dir,
)
from detcore.utils.processes import process_alive

from .toy_model import TOY, subprocess_env

REPO = Path(__file__).resolve().parents[2]

_HOLDER = """
import sys, time
from detcore.engine.output_dir import lock_output_dir
lock_output_dir(sys.argv[1])
print("locked", flush=True)
time.sleep(120)
"""


def start_holder(folder):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, str(folder)], stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def try_lock_in_child(folder):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    code = "import sys\nfrom detcore.engine.output_dir import lock_output_dir\nlock_output_dir(sys.argv[1])\nprint('ok')"
    return subprocess.run([sys.executable, "-c", code, str(folder)], capture_output=True, text=True, env=env, timeout=120)


def test_a_second_run_is_refused_while_the_first_lives_and_admitted_after_kill_9(tmp_path):
    holder = start_holder(tmp_path)
    try:
        second = try_lock_in_child(tmp_path)
        assert second.returncode != 0
        assert "is in use by another run (pid" in second.stderr and f"pid {holder.pid} " in second.stderr
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert (tmp_path / LOCK_FILE).exists()  # the file stays; the kernel released the lock itself
    assert try_lock_in_child(tmp_path).stdout.strip() == "ok"


def test_the_lock_is_reentrant_within_one_process(tmp_path):
    lock_output_dir(str(tmp_path))
    lock_output_dir(str(tmp_path))
    assert "is in use" in try_lock_in_child(tmp_path).stderr


_FORKING_HOLDER = """
import os, sys, time
from detcore.engine.output_dir import lock_output_dir
lock_output_dir(sys.argv[1])
if os.fork() == 0:  # a forked child, as a data-loader worker is: it must not keep the lock
    time.sleep(120)
    os._exit(0)
print("locked", flush=True)
time.sleep(120)
"""

_EXEC_HOLDER = """
import os, subprocess, sys, time
from detcore.engine.output_dir import _held, lock_output_dir
lock_output_dir(sys.argv[1])
(fd,) = _held.values()
# A child handed the lock's descriptor on purpose: it keeps the lock after the run dies.
child = subprocess.Popen(["sleep", "120"], pass_fds=(fd,))
print(child.pid, flush=True)
time.sleep(120)
"""


def lock_is_free(folder):
    fd = os.open(folder / LOCK_FILE, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)  # releases it again
    return True


def test_a_forked_child_does_not_hold_the_lock(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    holder = subprocess.Popen([sys.executable, "-c", _FORKING_HOLDER, str(tmp_path)], stdout=subprocess.PIPE, text=True, env=env)
    assert holder.stdout.readline().strip() == "locked"
    children = child_pids(holder.pid)
    try:
        assert len(children) == 1 and not lock_is_free(tmp_path)
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        assert lock_is_free(tmp_path)  # at once, while the forked child still lives
        assert process_alive(children[0])
    finally:
        for pid in children:
            os.kill(pid, signal.SIGKILL)


def test_a_dead_runs_leftover_holder_is_named_and_waited_for(tmp_path, monkeypatch):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    holder = subprocess.Popen([sys.executable, "-c", _EXEC_HOLDER, str(tmp_path)], stdout=subprocess.PIPE, text=True, env=env)
    leftover = int(holder.stdout.readline())
    try:
        assert "is in use by another run (pid" in try_lock_in_child(tmp_path).stderr  # a live holder, named
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        monkeypatch.setattr(output_dir, "LEFTOVER_WAIT_SECONDS", 0.5)
        with pytest.raises(OutputDirInUseError) as info:
            lock_output_dir(str(tmp_path))
        said = str(info.value)
        assert f"after the run that held it (pid {holder.pid} " in said and "ended" in said
        assert f"pids {leftover}" in said and "kill PID" in said
        # Once the leftover exits while a run waits, the run takes the folder.
        monkeypatch.setattr(output_dir, "LEFTOVER_WAIT_SECONDS", 120)
        threading.Timer(0.5, os.kill, (leftover, signal.SIGKILL)).start()
        lock_output_dir(str(tmp_path))
        assert "is in use" in try_lock_in_child(tmp_path).stderr
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(leftover, signal.SIGKILL)


def child_pids(pid):
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rpartition(")")[2].split()
            except OSError:
                continue
            if int(fields[1]) == pid and fields[0] not in "ZX":
                found.append(int(entry))
    return found


def test_a_killed_run_leaves_no_lock_and_its_loader_workers_exit(tiny_cache, tmp_path):
    # Data-loader workers are forked from the run: they used to share its lock and, with 4 of
    # them, to block for minutes on a dead run, so --resume was refused naming a dead process.
    out = tmp_path / "run"
    cmd = [
        sys.executable, str(REPO / "tests" / "tools" / "launcher.py"), str(REPO / "tools" / "train_net.py"),
        "--config-file", str(REPO / "configs" / "e2e_mask_rcnn_R_18_FPN_shapes.yaml"),
        *TOY, "DATALOADER.NUM_WORKERS", "4", "SOLVER.MAX_ITER", "100000", "SOLVER.CHECKPOINT_PERIOD", "2",
        "DATASETS.TEST", "()", "OUTPUT_DIR", str(out),
    ]
    proc = subprocess.Popen(cmd, env=subprocess_env(tiny_cache), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=REPO)
    workers = []
    try:
        deadline = time.time() + 300
        while not (out / "last_checkpoint").exists():  # training runs: the workers are up
            assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
            assert time.time() < deadline, "no checkpoint within 300 s"
            time.sleep(0.05)
        workers = child_pids(proc.pid)
        assert len(workers) == 4
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stderr.close()
    try:
        assert lock_is_free(out)  # at once: the lock was the run's alone
        deadline = time.time() + 120  # the workers notice within a fraction of a second
        while any(process_alive(pid) for pid in workers) and time.time() < deadline:
            time.sleep(0.05)
        assert not any(process_alive(pid) for pid in workers), "orphaned data-loader workers still run"
    finally:
        for pid in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def make_run(folder, finished=True):
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("model_0000999.pth", "metrics.json", "config.yaml", "log.txt"):
        (folder / name).write_text(name)
    if finished:
        (folder / "model_final.pth").write_text("final")
    (folder / "last_checkpoint").write_text("model_final.pth" if finished else "model_0000999.pth")


def test_a_new_run_refuses_a_folder_with_a_run_and_says_what_to_do(tmp_path):
    make_run(tmp_path)
    with pytest.raises(OutputDirHasRunError, match=r"already holds a finished run .*add --resume.*another folder.*--start-over"):
        check_new_run(str(tmp_path))
    assert (tmp_path / "model_final.pth").read_text() == "final"  # untouched
    check_new_run(str(tmp_path / "elsewhere"))  # an empty or new folder is fine
    (tmp_path / "fresh").mkdir()
    (tmp_path / "fresh" / "metrics.json").write_text("{}")  # killed before its first checkpoint
    check_new_run(str(tmp_path / "fresh"))


def test_start_over_moves_the_previous_run_aside(tmp_path):
    make_run(tmp_path)
    check_new_run(str(tmp_path), start_over=True)
    assert not (tmp_path / "model_final.pth").exists() and not (tmp_path / "last_checkpoint").exists()
    (moved,) = [p for p in tmp_path.iterdir() if p.name.startswith("replaced_")]
    assert (moved / "model_final.pth").read_text() == "final"
    assert sorted(p.name for p in moved.iterdir()) == sorted(
        ["model_0000999.pth", "model_final.pth", "metrics.json", "config.yaml", "log.txt", "last_checkpoint"]
    )


def run_train_net(cache, out, *extra, check=True):
    cmd = [
        sys.executable, str(REPO / "tests" / "tools" / "launcher.py"), str(REPO / "tools" / "train_net.py"),
        "--config-file", str(REPO / "configs" / "e2e_mask_rcnn_R_18_FPN_shapes.yaml"), *extra,
        *TOY, "SOLVER.MAX_ITER", "2", "SOLVER.CHECKPOINT_PERIOD", "1", "DATASETS.TEST", "()", "OUTPUT_DIR", str(out),
    ]
    result = subprocess.run(cmd, capture_output=True, text=True, env=subprocess_env(cache), timeout=600, cwd=REPO)
    if check:
        assert result.returncode == 0, result.stderr[-3000:]
    return result


def test_train_net_rerun_without_resume_keeps_the_finished_run(tiny_cache, tmp_path):
    out = tmp_path / "run"
    run_train_net(tiny_cache, out)
    final = (out / "model_final.pth").read_bytes()
    config = (out / "config.yaml").read_text()
    again = run_train_net(tiny_cache, out, check=False)
    assert again.returncode != 0 and "already holds a finished run" in again.stderr
    assert (out / "model_final.pth").read_bytes() == final and (out / "config.yaml").read_text() == config
    run_train_net(tiny_cache, out, "--start-over")
    (moved,) = [p for p in out.iterdir() if p.name.startswith("replaced_")]
    assert (moved / "model_final.pth").read_bytes() == final
    assert (out / "model_final.pth").exists()
