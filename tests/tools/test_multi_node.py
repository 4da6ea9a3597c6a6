"""Multi-node training, proven on one machine: two torchrun "nodes" of one process each (static
rendezvous at 127.0.0.1, gloo) must train exactly as one node with two processes does: the same
global ranks get the same seeds and the same shards of the data, so every logged loss and the
final weights are equal bit for bit. A rank computed from the node-local rank (LOCAL_RANK is 0 on
both nodes) would give both nodes the same seed and data, and the losses would differ."""
import os
import socket
import subprocess
import sys

import pytest
import torch

from detcore.engine.checkpointer import load_checkpoint_file
from detcore.utils.plotting import read_metrics

from tests.engine.toy_model import REPO, TOY, subprocess_env

LAUNCHER = os.path.join(REPO, "tests", "tools", "launcher.py")
TRAIN_NET = os.path.join(REPO, "tools", "train_net.py")
CONFIG = os.path.join(REPO, "configs", "e2e_mask_rcnn_R_18_FPN_shapes.yaml")
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train_args(output_dir):
    opts = TOY + [
        "SOLVER.IMS_PER_BATCH", "4", "SOLVER.MAX_ITER", "5", "SOLVER.CHECKPOINT_PERIOD", "100", "LOG_PERIOD", "1",
        "OUTPUT_DIR", str(output_dir),
    ]
    return [LAUNCHER, TRAIN_NET, "--config-file", CONFIG, *opts]


def run_all(commands, cache, timeout=600):
    """Start every command at once (the nodes must meet at the rendezvous), wait for all; the
    outputs, or a failure showing each one's tail."""
    procs = [
        subprocess.Popen(cmd, env=subprocess_env(cache), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO)
        for cmd in commands
    ]
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=timeout)[0])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    failed = [i for i, proc in enumerate(procs) if proc.returncode != 0]
    assert not failed, "\n\n".join(f"command {i} exited {procs[i].returncode}:\n{outputs[i][-3000:]}" for i in failed)
    return outputs


def losses(output_dir):
    """{iteration: {loss name: value}} from metrics.json (written by global rank 0)."""
    records = [r for r in read_metrics(os.path.join(output_dir, "metrics.json")) if "total_loss" in r]
    return {r["iteration"]: {k: v for k, v in r.items() if k.startswith(("loss", "total_loss"))} for r in records}


@pytest.mark.slow  # two torchrun launches of two processes each: ~2.5 min on a loaded 2-core machine
def test_two_nodes_train_as_one_node_with_two_processes(tiny_cache, tmp_path):
    one_node, two_nodes = tmp_path / "one_node", tmp_path / "two_nodes"
    run_all([TORCHRUN + ["--standalone", "--nproc_per_node", "2", *train_args(one_node)]], tiny_cache)

    port = str(free_port())
    nodes = [
        TORCHRUN + ["--nnodes", "2", "--node_rank", str(rank), "--nproc_per_node", "1",
                    "--master_addr", "127.0.0.1", "--master_port", port, *train_args(two_nodes)]
        for rank in (0, 1)
    ]  # fmt: skip
    node0, node1 = run_all(nodes, tiny_cache)

    assert "world size: 2" in node0 and "iter: 5/5" in node0
    assert "Rank of this process: 1; world size: 2" in (two_nodes / "log.txt.rank1").read_text()
    assert "iter:" not in node1  # the second node's process is rank 1: it logs to its file only

    expected, got = losses(one_node), losses(two_nodes)
    assert sorted(expected) == list(range(5)) and expected[0]["total_loss"] > 0
    assert got == expected  # bit for bit, every iteration and every loss
    ours = load_checkpoint_file(str(two_nodes / "model_final.pth"))["model"]
    reference = load_checkpoint_file(str(one_node / "model_final.pth"))["model"]
    assert ours.keys() == reference.keys()
    for name, value in reference.items():
        assert torch.equal(ours[name], value), name
    # Evaluation ran on both nodes and was gathered on rank 0: every validation image once.
    assert read_metrics(str(two_nodes / "metrics.json"))[-1]["bbox/AP50"] == read_metrics(
        str(one_node / "metrics.json")
    )[-1]["bbox/AP50"]
