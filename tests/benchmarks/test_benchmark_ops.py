"""benchmarks/benchmark_ops.py's load and A/B machinery: the busy processes start, spin and always stop
(also on an error, and with a killed parent); a quick run writes quiet and loaded columns, the
load average, and the bit-for-bit verdict against a baseline build; the torchvision worker is
killed at its time budget."""
import json
import os
import subprocess
import sys
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "benchmarks"))

from background_load import BackgroundLoad  # noqa: E402
import benchmark_worker  # noqa: E402


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _cpu_ticks(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().split(")")[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads /proc (Linux)")


def test_background_load_spins_then_stops():
    with BackgroundLoad(2, settle_s=0.2) as load:
        pids = load.pids()
        assert len(pids) == 2 and all(_alive(p) for p in pids)
        before = [_cpu_ticks(p) for p in pids]
        time.sleep(0.5)
        assert all(_cpu_ticks(p) > b for p, b in zip(pids, before)), "the processes are not busy"
    assert not any(_alive(p) for p in pids)


def test_background_load_stops_on_an_error():
    with pytest.raises(KeyError):
        with BackgroundLoad(1, settle_s=0.1) as load:
            pids = load.pids()
            raise KeyError("boom")
    assert not any(_alive(p) for p in pids)


def test_niced_background_load():
    with BackgroundLoad(1, nice=19, settle_s=0.2) as load:
        assert os.getpriority(os.PRIO_PROCESS, load.pids()[0]) == 19


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="processes"):
        BackgroundLoad(-1)
    with pytest.raises(ValueError, match="nice"):
        BackgroundLoad(1, nice=25)


def test_busy_processes_die_with_a_killed_benchmark():
    code = (
        f"import sys, os, signal; sys.path.insert(0, {os.path.join(REPO, 'benchmarks')!r})\n"
        "from background_load import BackgroundLoad\n"
        "load = BackgroundLoad(1, settle_s=0.1); load.start()\n"
        "print(load.pids()[0], flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    child = int(out.stdout.split()[0])
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)


def test_quick_run_with_load_and_a_baseline(tmp_path):
    from benchmarks import benchmark_ops

    out = tmp_path / "ops.json"
    args = ["--quick", "--only", "nms N=1000", "--repeats", "2", "--background-load", "1"]
    # The baseline is this very checkout: the same build must give the same bits.
    status = benchmark_ops.main(args + ["--baseline", REPO, "--json", str(out)])
    saved = json.loads(out.read_text())
    assert status == 0 and saved["phases"] == ["quiet", "loaded"]
    assert saved["background_load"] == 1 and len(saved["loadavg_at_start"]) == 3
    (row,) = saved["results"]
    assert row["same_bits_as_baseline"] == "yes" and row["agree"] in ("yes", "n/a (no torchvision)")
    for phase in ("quiet", "loaded"):
        m = row[phase]
        assert m["detcore_ms"] > 0 and m["baseline_ms"] > 0 and len(m["loadavg_1min"]) == 2


def test_the_torchvision_worker_is_killed_at_its_budget():
    pytest.importorskip("torchvision")
    script = os.path.join(REPO, "benchmarks", "benchmark_ops.py")
    worker = benchmark_worker.Worker(script, ["--worst-cases", "--only", "N=1000000 spread"], REPO)
    try:
        # Greedy NMS of a million boxes that barely overlap: minutes for torchvision.
        with pytest.raises(benchmark_worker.WorkerTimeout):
            case = "nms worst N=1000000 spread (canvas 300000) iou=0.5"
            worker.call({"case": case, "impl": "torchvision", "digest": False}, timeout_s=1)
        assert worker.proc.poll() is not None
    finally:
        worker.close()


def test_only_selects_cases_by_any_of_several_texts():
    import benchmark_ops

    def names(only):
        args = benchmark_ops.parse_args(["--quick", "--only", only])
        return [c.name for c in benchmark_ops._selected_cases(args, benchmark_ops.torch.device("cpu"), 1)]

    both = names("nms N=1000,roi_pool")
    assert both == names("nms N=1000") + names("roi_pool") and len(both) == 3
    assert all("roi_align" not in n for n in both)


def test_roi_pool_gradients_must_be_equal_on_the_cpu():
    """On the CPU both libraries' ROIPool gradients are the same sums in the same order: a 1e-7
    difference is a disagreement (only a GPU's atomics excuse one)."""
    import torch
    import benchmark_ops

    out, grad = torch.ones(3), torch.full((4,), 0.5)
    assert benchmark_ops._roi_pool_agree((out, grad), (out.clone(), grad.clone())) == "yes"
    assert benchmark_ops._roi_pool_agree((out, grad), (out, grad + 1e-7)).startswith("NO")
    assert benchmark_ops._roi_pool_agree(out, out + 1e-7).startswith("NO")
