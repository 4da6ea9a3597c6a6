"""scripts/gpu_check/: how a part is run and judged (time limits, exit codes, pytest's and
compute-sanitizer's summaries), and what the report says. The whole check runs in CI as
`bash scripts/gpu_check.sh --rehearse` (.ci/run); these are its pieces, quickly."""
import json
import os
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts", "gpu_check"))

import parts  # noqa: E402
import report  # noqa: E402
import run as gpu_check_run  # noqa: E402
import steps  # noqa: E402


def test_a_command_that_passes_fails_or_overruns(tmp_path):
    ok = parts.run("ok", [sys.executable, "-c", "print('hi')"], str(tmp_path / "ok.log"), 30)
    assert ok.status == parts.PASSED and "hi" in (tmp_path / "ok.log").read_text()
    bad = parts.run("bad", [sys.executable, "-c", "raise SystemExit(3)"], str(tmp_path / "bad.log"), 30)
    assert bad.status == parts.FAILED and bad.note == "exit code 3"
    judged = parts.run("judged", [sys.executable, "-c", "print('0 of 1')"], str(tmp_path / "j.log"), 30,
                       ok=lambda text: (False, "judged: " + text.strip().splitlines()[-1]))
    assert judged.status == parts.FAILED and judged.note == "judged: 0 of 1" and "0 of 1" in judged.tail
    assert parts.run("none", ["true"], str(tmp_path / "n.log"), 0).status == parts.SKIPPED


def test_a_time_limit_stops_the_command_and_what_it_started(tmp_path):
    marker = tmp_path / "child_alive"
    child = tmp_path / "child.py"
    child.write_text(f"import time\ntime.sleep(3)\nopen({str(marker)!r}, 'w').close()\n")
    parent = tmp_path / "parent.py"
    # The child would outlive its parent's end unless the whole process group is stopped.
    parent.write_text(f"import subprocess, sys, time\nsubprocess.Popen([sys.executable, {str(child)!r}])\ntime.sleep(60)\n")
    began = time.monotonic()
    part = parts.run("slow", [sys.executable, str(parent)], str(tmp_path / "slow.log"), 1)
    assert part.status == parts.FAILED and "time limit of 1 s" in part.note
    assert time.monotonic() - began < 20
    time.sleep(4)
    assert not marker.exists()


def test_a_background_job_is_timed_to_its_end_not_to_its_join(tmp_path):
    job = parts.Job("quick", [sys.executable, "-c", "pass"], str(tmp_path / "quick.log"))
    time.sleep(5)  # the job ended long before this
    part = job.part(30)
    assert part.status == parts.PASSED and part.seconds < 4
    assert part.cpu_seconds is not None and part.cpu_seconds < part.seconds + 1


def test_a_part_counts_the_cpu_time_of_its_command_and_children(tmp_path):
    busy = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.6: pass\n"
    (tmp_path / "busy.py").write_text(busy)
    parent = f"import subprocess, sys\nsubprocess.run([sys.executable, {str(tmp_path / 'busy.py')!r}])\n" + busy
    part = parts.run("busy", [sys.executable, "-c", parent], str(tmp_path / "busy.log"), 120)
    assert part.status == parts.PASSED and part.cpu_seconds >= 1.2  # 0.6 s each, whatever the load


def test_step_status():
    step = parts.Step("s", "a step")
    assert step.status == parts.SKIPPED
    step.parts = [parts.Part("a", parts.SKIPPED), parts.Part("b", parts.PASSED)]
    assert step.status == parts.PASSED
    step.parts.append(parts.Part("c", parts.FAILED))
    assert step.status == parts.FAILED


JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" errors="0" failures="1"
skipped="2" tests="5"><testcase name="a"/><testcase name="b"><failure message="x"/></testcase>
<testcase name="c"><skipped message="needs a CUDA GPU"/></testcase>
<testcase name="d"><skipped message="needs a CUDA GPU"/></testcase><testcase name="e"/></testsuite></testsuites>"""


def test_pytest_results_from_junit(tmp_path):
    path = tmp_path / "junit.xml"
    path.write_text(JUNIT)
    counts = steps.junit_counts(str(path))
    assert counts == {"tests": 5, "failures": 1, "errors": 0, "skipped": 2, "skip_reasons": ["needs a CUDA GPU"]}
    passed, note = steps._pytest_ok(str(path), require_run=False)("")
    assert passed and note.startswith("2 passed, 1 failed, 2 skipped")
    passed, note = steps._pytest_ok(str(path), require_run=True)("")
    assert not passed and "on a GPU every test must run" in note
    assert steps.junit_counts(str(tmp_path / "missing.xml"))["tests"] == 0


@pytest.mark.parametrize(
    "output,passed",
    [
        ("sanitizer_driver: 812 calls\n========= ERROR SUMMARY: 0 errors\n", True),
        ("sanitizer_driver: 812 calls\n========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)\n", True),
        ("sanitizer_driver: 812 calls\n========= ERROR SUMMARY: 3 errors\n", False),
        ("sanitizer_driver: 8 calls\n========= RACECHECK SUMMARY: 2 hazards displayed (1 error, 1 warning)\n", False),
        ("========= ERROR SUMMARY: 0 errors\n", False),  # the driver died before its end
    ],
)
def test_sanitizer_summaries(output, passed):
    assert steps.sanitizer_ok(output)[0] is passed


def test_build_arch_and_training_schedule():
    assert steps.arch_list("9.0") == "9.0" and steps.arch_list("8.6") == "8.6"
    assert steps.arch_list(None) is None and steps.arch_list("sm_90") is None
    opts = steps.train_options(1000, rehearse=False)
    settings = dict(zip(opts[::2], opts[1::2]))
    assert settings["SOLVER.MAX_ITER"] == "1000" and settings["SOLVER.STEPS"] == "(844, 953)"
    assert settings["MODEL.DEVICE"] == "cuda" and settings["SOLVER.AMP.DTYPE"] == "float16"
    assert dict(zip(*[iter(steps.train_options(3200, rehearse=True))] * 2))["SOLVER.STEPS"] == "(2700, 3050)"


def test_cuda_test_files():
    files = steps.cuda_test_files(ROOT)
    assert os.path.join("tests", "layers", "test_ops_cuda.py") in files
    assert os.path.join("tests", "modeling", "test_models_cuda.py") in files
    assert not any(f.endswith("test_emulation_vs_gpu.py") for f in files)


def test_only_takes_numbers_and_names(capsys):
    args = gpu_check_run.parse_args(["--only", "5,training", "out"])
    assert args.wanted == {"environment", "speed", "training"} and args.mode == "gpu" and args.budget_s == 450
    assert gpu_check_run.parse_args(["--rehearse", "out"]).train_iters == 10
    with pytest.raises(SystemExit):
        gpu_check_run.parse_args(["--only", "7", "out"])


def test_report_json_and_markdown(tmp_path):
    step = parts.Step("speed", "detcore against torchvision", [parts.Part("ops", parts.PASSED, 12.3, "fine")], 12.5)
    failed = parts.Step("training", "shapes", [parts.Part("train", parts.FAILED, 3.0, "no AP", tail="Traceback")], 3.0)
    ops = {"device_name": "NVIDIA H100", "repeats": 20, "device": "cuda", "results": [
        {"case": "nms N=1000 iou=0.5", "agree": "yes", "quiet": {"detcore_ms": 0.21, "torchvision_ms": 0.42, "speedup": 2.0}}]}
    model = {"device_name": "NVIDIA H100", "image": [800, 1333], "results": {
        "detcore": {"infer": {"total_ms": 31.0, "peak_memory_mb": 900.0}, "train": {"total_ms": 120.0}},
        "torchvision": {"infer": {"total_ms": 35.0}}}}
    state = {"mode": "gpu", "date": "2026-11-30", "budget_s": 450, "seconds": 400.0,
             "machine": {"gpu": "NVIDIA H100 80GB HBM3", "driver": "580.1"}, "figures": {"ops": ops, "model": model}}
    doc = report.write(str(tmp_path), state, [step, failed])
    saved = json.loads((tmp_path / "gpu_check.json").read_text())
    assert saved == json.loads(json.dumps(doc)) and [s["status"] for s in saved["steps"]] == ["passed", "failed"]
    assert saved["steps"][1]["parts"][0]["tail"] == "Traceback"
    md = (tmp_path / "gpu_check.md").read_text()
    assert "### GPU check: NVIDIA H100 80GB HBM3, 2026-11-30" in md and "- driver: 580.1" in md
    assert "| 2 | shapes | **FAILED** | 3 s | 0 s | train: failed (no AP) |" in md
    assert "| nms N=1000 iou=0.5 | 0.210 | 0.420 | 2.00x | yes |" in md
    assert "| inference total, ms | 31.0 | 35.0 |" in md and "| peak memory, inference, MiB | 900.0 | - |" in md


def test_report_lists_the_host_syncs_of_a_training_iteration(tmp_path):
    """tests/modeling/test_model_value_checks.py's figure, as the markdown shows it."""
    syncs = {"model": "R-50-FPN Mask R-CNN", "total": 31, "forward": 25, "backward": 6,
             "forward_by_op": {"aten::nonzero": 20, "detcore::batched_nms": 4}, "forward_outside_ops": 1,
             "detcore_ops": {"batched_nms": {"calls": 4, "syncs": 4, "checked": 0}}}
    state = {"mode": "gpu", "date": "2026-11-30", "budget_s": 450, "seconds": 400.0, "machine": {},
             "figures": {"host_syncs": syncs}}
    report.write(str(tmp_path), state, [])
    md = (tmp_path / "gpu_check.md").read_text()
    assert "Host syncs of one training iteration, R-50-FPN Mask R-CNN: 31 (25 in the forward, 6 in the backward)" in md
    assert "| aten::nonzero | 20 |" in md and "| (outside any op) | 1 |" in md
    assert "batched_nms 4x (4 syncs, 0 checked)" in md
