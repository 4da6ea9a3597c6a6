"""Several processes fetching the same weights at once: processes on one machine take turns
through the cache's file lock (one downloads, the others wait and use its file), and the ranks
of a torch.distributed run wait at a collective for rank 0's download and share its failure."""
import hashlib
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from detcore.checkpoint import download

from .weights_server import Behaviour, serve
from .zoo_files import TORCHVISION, torchvision_pth, url_path

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Each process: the entry checked against the served file's digest, then MODEL.WEIGHTS resolved.
SCRIPT = """
import logging, sys
from dataclasses import replace
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
from detcore.checkpoint import resolve_weights
from detcore.checkpoint.catalog import CATALOG, Checksum
from detcore.utils import comm
name, prefix, all_ranks = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
CATALOG[name] = replace(CATALOG[name], checksum=Checksum("sha256", prefix))
comm.init_distributed()
try:  # as detcore.engine.launch does: leave the group before exiting (gloo may abort otherwise)
    print("PATH", resolve_weights(name, all_ranks=all_ranks), flush=True)
except Exception as e:
    print("ERROR", type(e).__name__, e, flush=True)
    sys.exit(3)
finally:
    comm.destroy_distributed()
"""
DEADLINE = 240  # a guard against a hang, not a measure


def start(cache, mirror, prefix, all_ranks=False, rank=None, world=None, port=None):
    env = {**os.environ, "PYTHONPATH": REPO, "DETCORE_CACHE": str(cache), download.MIRROR_ENV: mirror,
           "OMP_NUM_THREADS": "1"}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    if rank is not None:
        env.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    return subprocess.Popen(
        [sys.executable, "-c", SCRIPT, TORCHVISION, prefix, "1" if all_ranks else "0"],
        env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def finish(procs):
    outputs = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=DEADLINE)
            outputs.append((proc.returncode, out, err))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    return outputs


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def served():
    data = torchvision_pth()
    with serve() as state:
        state.files[url_path(TORCHVISION)] = data
        yield state, data, hashlib.sha256(data).hexdigest()[:8]


def test_two_processes_at_once_download_once(served, tmp_path):
    """The second process arrives while the first is downloading (the server holds the first
    response until the second says it waits): it waits on the lock and uses the first one's file."""
    state, data, prefix = served
    hold = threading.Event()
    state.behaviour[url_path(TORCHVISION)] = Behaviour(hold=hold)
    first = start(tmp_path, state.url, prefix)
    deadline = time.monotonic() + DEADLINE
    while state.count(url_path(TORCHVISION)) == 0:
        assert first.poll() is None and time.monotonic() < deadline, first.communicate()
        time.sleep(0.05)
    second = start(tmp_path, state.url, prefix)
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(second.stderr), daemon=True)
    reader.start()
    while not any("another process is downloading" in line for line in lines):
        assert state.count(url_path(TORCHVISION)) == 1, "the second process downloaded too"
        assert second.poll() is None and time.monotonic() < deadline, "".join(lines)
        time.sleep(0.05)
    hold.set()
    reader.join(DEADLINE)
    outputs = finish([first, second])
    assert [rc for rc, _, _ in outputs] == [0, 0], outputs
    paths = {out.split("PATH ", 1)[1].strip() for _, out, _ in outputs}
    assert len(paths) == 1
    assert open(paths.pop(), "rb").read() == data
    assert state.count(url_path(TORCHVISION)) == 1


def test_ranks_of_a_run_share_rank_0s_download(served, tmp_path):
    state, data, prefix = served
    port = free_port()
    procs = [start(tmp_path, state.url, prefix, all_ranks=True, rank=r, world=2, port=port) for r in range(2)]
    outputs = finish(procs)
    assert [rc for rc, _, _ in outputs] == [0, 0], outputs
    assert len({out.split("PATH ", 1)[1].strip() for _, out, _ in outputs}) == 1
    assert state.count(url_path(TORCHVISION)) == 1


@pytest.mark.slow  # test_download.py checks the logic in one process; this, real ranks
def test_ranks_with_caches_of_their_own_each_download(served, tmp_path):
    """Two machines that do not share the cache folder: each has its own copy."""
    state, data, prefix = served
    port = free_port()
    procs = [start(tmp_path / f"node{r}", state.url, prefix, all_ranks=True, rank=r, world=2, port=port) for r in range(2)]
    outputs = finish(procs)
    assert [rc for rc, _, _ in outputs] == [0, 0], outputs
    for r, (_, out, _) in enumerate(outputs):
        path = out.split("PATH ", 1)[1].strip()
        assert path.startswith(str(tmp_path / f"node{r}")) and open(path, "rb").read() == data
    assert state.count(url_path(TORCHVISION)) == 2


@pytest.mark.slow  # test_download.py checks the logic in one process; this, real ranks
def test_rank_0s_failure_is_every_ranks(served, tmp_path):
    state, _, prefix = served
    del state.files[url_path(TORCHVISION)]
    port = free_port()
    procs = [start(tmp_path / f"node{r}", state.url, prefix, all_ranks=True, rank=r, world=2, port=port) for r in range(2)]
    outputs = finish(procs)
    (rc0, out0, _), (rc1, out1, _) = outputs
    assert rc0 == rc1 == 3, outputs
    assert "HTTP 404" in out0 and "rank 0 could not fetch" in out1 and "HTTP 404" in out1
    assert state.count(url_path(TORCHVISION)) == 1  # rank 1 did not try on its own
