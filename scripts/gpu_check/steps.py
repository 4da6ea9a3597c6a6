"""The six steps of scripts/gpu_check.sh, each a list of parts (parts.py), on the GPU or, with
--rehearse, on the CPU at small sizes (GPU-only parts skipped, with the reason).

1 environment: carried wheels, machine facts, detcore._C built for this GPU's arch only (beside
  the CUDA emulation's build), collect_env listing the CUDA kernels;
2 correctness: every test marked `cuda` (tests/layers/test_ops_cuda.py, the model tests...);
3 the emulation held against the hardware: tests/layers/test_emulation_vs_gpu.py;
4 compute-sanitizer memcheck, racecheck, synccheck over sanitizer_driver.py;
5 speed: benchmarks/benchmark_ops.py and benchmarks/benchmark_model.py against torchvision;
6 a short real training: the shapes R-18 recipe with AMP, its AP against the CPU recipe's.
Steps 2-4 only check results, so they run at once; the benchmarks and the training run alone.
Standard library only.
"""
import glob
import json
import os
import re
import shutil
import sys
import xml.etree.ElementTree as ElementTree
from typing import Dict, List, Optional

from parts import FAILED, PASSED, SKIPPED, Job, Part, Step, failed, run, shorten, skipped

NO_GPU = "no GPU (rehearsal on the CPU)"
TRAIN_CONFIG = "configs/e2e_mask_rcnn_R_18_FPN_shapes.yaml"
RECIPE_ITERS, RECIPE_STEPS = 3200, (2700, 3050)
# Box / mask AP of the CPU recipe (float32, SEED 7) at a schedule of N iterations, the recipe's
# LR steps scaled to N: the figure a GPU run of the same schedule is held against (docs/gpu.md).
CPU_REFERENCE_AP = {
    1000: (22.3, 23.4, "docs/gpu.md: the CPU recipe shortened alike"),
    3200: (57.6, 57.5, "configs/README.md: the full recipe"),
}
AP_MARGIN = 10.0  # points below the CPU figure that still pass: seeds alone move AP by ~2

SANITIZER_TOOLS = ("memcheck", "racecheck", "synccheck")


class Context:
    def __init__(self, root, out_dir, scratch, rehearse, deadline, clock, env, python, train_iters, cores):
        self.root, self.out_dir, self.scratch = root, out_dir, scratch
        self.rehearse, self.deadline, self.clock = rehearse, deadline, clock
        self.env, self.python = env, python
        self.train_iters, self.cores = train_iters, cores
        self.machine: Dict = {}
        self.figures: Dict = {}
        self.jobs: Dict[str, Job] = {}
        self.logs = os.path.join(scratch, "logs")
        os.makedirs(self.logs, exist_ok=True)

    def remaining(self) -> float:
        return self.deadline - self.clock()

    def limit(self, seconds: float) -> float:
        """A part's time limit: its own (3x in the rehearsal, for a loaded CI machine), or what the
        budget has left (5 s kept for the report)."""
        return min(seconds * (3 if self.rehearse else 1), self.remaining() - 5)

    def log(self, name: str) -> str:
        return os.path.join(self.logs, re.sub(r"[^A-Za-z0-9_.-]", "_", name) + ".log")

    def run(self, name, args, limit_s, env=None, ok=None) -> Part:
        return run(name, args, self.log(name), self.limit(limit_s), env=env or self.env, cwd=self.root, ok=ok)

    def start(self, name, args, env=None) -> Job:
        print(f"  [{name}] started in the background: $ {shorten(args)}", flush=True)
        job = Job(name, args, self.log(name), env=env or self.env, cwd=self.root)
        self.jobs[name] = job
        return job

    def join(self, name, limit_s, ok=None) -> Part:
        """A background job's part: waits for it, within its limit from its start and the budget."""
        job = self.jobs.get(name)
        if job is None:
            return skipped(name, "was not started")
        return job.part(min(limit_s * (3 if self.rehearse else 1), job.elapsed() + self.remaining() - 5), ok)

    def py(self, *args) -> List[str]:
        return [self.python, *args]


# ---------------------------------------------------------------------------- 1 environment


def arch_list(capability: Optional[str]) -> Optional[str]:
    """TORCH_CUDA_ARCH_LIST for this GPU alone: its compute capability ("9.0"), no PTX."""
    if not capability or not re.fullmatch(r"\d+\.\d+", capability):
        return None
    return capability


def _commit(root: str) -> str:
    if os.environ.get("GPU_CHECK_COMMIT"):
        return os.environ["GPU_CHECK_COMMIT"]
    head = os.path.join(root, ".git")
    if shutil.which("git") and os.path.exists(head):
        import subprocess

        out = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        if out.returncode == 0:
            return out.stdout.strip()
    return "unknown (set GPU_CHECK_COMMIT)"


def step_environment(ctx: Context) -> Step:
    step = Step("environment", "environment and the _C build")
    step.parts.append(_wheels(ctx))

    def facts_ok(text):
        lines = [line for line in text.splitlines() if line.startswith("FACTS ")]
        if not lines:
            return False, "no FACTS line"
        ctx.machine.update(json.loads(lines[-1][len("FACTS "):]))
        if not ctx.rehearse and not ctx.machine.get("gpu"):
            return False, "torch sees no CUDA GPU"
        if not ctx.machine.get("python_headers"):
            return False, "no Python.h for this Python: nothing can be built (install its -dev package)"
        return True, ", ".join(f"{k} {ctx.machine[k]}" for k in ("gpu", "capability", "driver", "torch", "torch_cuda") if ctx.machine.get(k))

    step.parts.append(ctx.run("machine", ctx.py("scripts/gpu_check/facts.py"), 90, ok=facts_ok))
    ctx.machine["commit"] = _commit(ctx.root)

    # The emulation compiles with the host compiler alone: it builds beside _C.
    ctx.start("emulation build", ctx.py("-c", "from tests.layers import cuda_emulation; cuda_emulation.load(); print('built')"),
              env={**ctx.env, "MAX_JOBS": str(ctx.cores)})
    arch = arch_list(ctx.machine.get("capability"))
    if ctx.rehearse:
        step.parts.append(skipped("build", f"{NO_GPU}: the tests use the _C that setup built"))
    elif arch is None:
        step.parts.append(failed("build", "no GPU compute capability to build for"))
    else:
        ctx.machine["arch_list"] = arch
        env = {**ctx.env, "FORCE_CUDA": "1", "TORCH_CUDA_ARCH_LIST": arch, "MAX_JOBS": str(ctx.cores)}
        step.parts.append(ctx.run("build", ctx.py("setup.py", "build_ext", "--inplace"), 300, env=env))

    def env_ok(text):
        rows = dict(re.findall(r"^(detcore\._C[\w .]*?)\s{2,}(.*)$", text, re.M))
        kernels = rows.get("detcore._C kernels", "")
        if ctx.rehearse:
            return bool(kernels), f"kernels: {kernels or 'none (detcore._C not loaded)'}"
        archs = rows.get("detcore._C CUDA archs", "")
        want = "sm_" + arch.replace(".", "") if arch else "?"
        return "CUDA" in kernels and want in archs, f"kernels: {kernels or '-'}; archs: {archs or '-'}"

    step.parts.append(ctx.run("collect_env", ctx.py("-m", "detcore.utils.collect_env"), 90, ok=env_ok))
    # The build's linkage: torch's shared C++ runtime, messages formatted whole (a toolchain
    # copied into another prefix linked libstdc++ statically on the first H200 run).
    junit = os.path.join(ctx.scratch, "junit_extension.xml")
    step.parts.append(ctx.run("extension", ctx.py("-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}",
                                                  "tests/layers/test_extension.py"), 120, ok=_pytest_ok(junit, False)))
    # The shapes dataset for step 6 (imports detcore, so only once _C is in place).
    splits = "('shapes_val',)" if ctx.rehearse else "('shapes_train', 'shapes_val')"
    ctx.start("dataset", ctx.py("-c", "from detcore.data import DatasetCatalog\n"
                                      f"for s in {splits}: print(s, len(DatasetCatalog.get(s)))"))
    return step


def _wheels(ctx: Context) -> Part:
    """The carried wheels (scripts/prepare_gpu_wheels.sh) into a --target folder on PYTHONPATH."""
    wheels = sorted(glob.glob(os.path.join(ctx.root, ".whl", "*.whl")))
    missing = _missing_modules(ctx, ("yacs", "pycocotools"))
    if ctx.rehearse:
        return skipped("wheels", f"{NO_GPU}: {len(wheels)} wheels in .whl/ are for the lent machine's Python 3.12"
                                 + (f"; missing here: {', '.join(missing)}" if missing else ""))
    if not wheels:
        if missing:
            return failed("wheels", f"{', '.join(missing)} not importable and no .whl/*.whl to install "
                                    "(scripts/prepare_gpu_wheels.sh makes them)")
        return skipped("wheels", "no .whl folder, and nothing missing")
    site = os.path.join(ctx.scratch, "site")
    shutil.rmtree(site, ignore_errors=True)
    args = ctx.py("-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--no-cache-dir",
                  "--upgrade", "--target", site, *wheels)
    part = ctx.run("wheels", args, 120)
    if part.status == PASSED:
        ctx.env["PYTHONPATH"] = os.pathsep.join([site, ctx.env["PYTHONPATH"]])
        still = _missing_modules(ctx, ("yacs", "pycocotools"))
        part.note = f"{len(wheels)} wheels" + (f"; still missing: {', '.join(still)}" if still else "")
        part.status = FAILED if still else PASSED
    return part


def _missing_modules(ctx: Context, names) -> List[str]:
    import subprocess

    code = "import importlib.util, sys; print(' '.join(n for n in sys.argv[1:] if importlib.util.find_spec(n) is None))"
    out = subprocess.run(ctx.py("-c", code, *names), capture_output=True, text=True, env=ctx.env, cwd=ctx.root)
    return out.stdout.split()


# ---------------------------------------------------------------------- 2-4 correctness block
def cuda_test_files(root: str) -> List[str]:
    """Every test file that names the `cuda` marker (tests/test_cuda_marker.py makes sure that
    each file using a CUDA device does), but the emulation's, which step 3 runs; `-m cuda` then
    selects the marked tests among them. Not the whole of tests/: collecting it imports every
    test module (slower, and one that fails to import there would stop pytest before any test)."""
    files = []
    for path in sorted(glob.glob(os.path.join(root, "tests", "**", "test_*.py"), recursive=True)):
        with open(path) as f:
            if "pytest.mark.cuda" in f.read():
                files.append(os.path.relpath(path, root))
    return [f for f in files if not f.endswith("test_emulation_vs_gpu.py")]


def junit_counts(path: str) -> Dict:
    """tests / failures / errors / skipped of a pytest junit xml, and the skip reasons."""
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0, "skip_reasons": []}
    try:
        root = ElementTree.parse(path).getroot()
    except (OSError, ElementTree.ParseError):
        return counts
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    for suite in suites:
        for key in ("tests", "failures", "errors", "skipped"):
            counts[key] += int(suite.get(key, 0))
        for case in suite.iter("testcase"):
            for skip in case.findall("skipped"):
                reason = (skip.get("message") or "").strip()
                if reason and reason not in counts["skip_reasons"]:
                    counts["skip_reasons"].append(reason)
    return counts


def _pytest_ok(junit: str, require_run: bool):
    def ok(text):
        c = junit_counts(junit)
        passed = c["tests"] - c["failures"] - c["errors"] - c["skipped"]
        note = f"{passed} passed, {c['failures'] + c['errors']} failed, {c['skipped']} skipped"
        if c["skip_reasons"]:
            note += " (" + "; ".join(r[:120] for r in c["skip_reasons"][:3]) + ")"
        if require_run and (passed == 0 or c["skipped"]):
            return False, note + ": on a GPU every test must run"
        return passed > 0, note

    return ok


def _xdist(ctx: Context, workers: int) -> List[str]:
    if ctx.rehearse or _missing_modules(ctx, ("xdist",)):
        return []
    return ["-n", str(workers)]


def start_correctness_tests(ctx: Context) -> Optional[Job]:
    files = cuda_test_files(ctx.root)
    junit = os.path.join(ctx.scratch, "junit_cuda.xml")
    args = ctx.py("-m", "pytest", "-m", "cuda", "-q", "-rfEs", "-p", "no:cacheprovider", f"--junitxml={junit}", *files)
    if ctx.rehearse:
        return None
    # Workers share the cores: 4 threads each for the float64 CPU references. The model test of
    # host syncs (tests/modeling/test_model_value_checks.py) writes its count where this says.
    env = {**ctx.env, "OMP_NUM_THREADS": "4", "DETCORE_HOST_SYNCS_JSON": _host_syncs_path(ctx)}
    return ctx.start("pytest -m cuda", args + _xdist(ctx, 4), env=env)


def _host_syncs_path(ctx: Context) -> str:
    return os.path.join(ctx.out_dir, "host_syncs.json")


def step_correctness(ctx: Context, job: Optional[Job]) -> Step:
    step = Step("correctness", "tests marked cuda (ops, models)")
    files = cuda_test_files(ctx.root)
    if ctx.rehearse:
        def collected(text):
            m = re.search(r"(\d+)(?:/\d+)? tests? (?:collected|selected)", text)
            return True, f"{NO_GPU}: collected {m.group(1) if m else '?'} tests marked cuda, none run"

        part = ctx.run("pytest -m cuda (collect only)", ctx.py("-m", "pytest", "-m", "cuda", "--collect-only", "-q",
                                                                "-p", "no:cacheprovider", *files), 120, ok=collected)
        if part.status == PASSED:
            part.status = SKIPPED
        step.parts.append(part)
        return step
    step.parts.append(ctx.join("pytest -m cuda", 240, ok=_pytest_ok(os.path.join(ctx.scratch, "junit_cuda.xml"), True)))
    ctx.figures["host_syncs"] = _load_json(_host_syncs_path(ctx))
    return step


def start_emulation_tests(ctx: Context) -> Job:
    junit = os.path.join(ctx.scratch, "junit_emulation.xml")
    build = ctx.jobs.get("emulation build")
    if build is not None:
        build.wait(min(300, build.elapsed() + ctx.remaining() - 5))
    env = dict(ctx.env)
    if ctx.rehearse:
        env["DETCORE_EMULATION_VS_DEVICE"] = "cpu"
    args = ctx.py("-m", "pytest", "-q", "-rfEs", "-p", "no:cacheprovider", f"--junitxml={junit}",
                  "tests/layers/test_emulation_vs_gpu.py")
    return ctx.start("emulation vs device", args + _xdist(ctx, 4), env=env)


def step_emulation(ctx: Context) -> Step:
    step = Step("emulation", "the emulation against the hardware")
    step.parts.append(ctx.join("emulation build", 300, ok=lambda text: (True, "")))
    ok = _pytest_ok(os.path.join(ctx.scratch, "junit_emulation.xml"), not ctx.rehearse)
    part = ctx.join("emulation vs device", 240, ok=ok)
    if ctx.rehearse and part.status == PASSED:
        part.note = f"against the CPU kernels, {NO_GPU}: {part.note}"
    step.parts.append(part)
    return step


def compute_sanitizer() -> Optional[str]:
    found = shutil.which("compute-sanitizer")
    for home in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if not found and home and os.path.exists(os.path.join(home, "bin", "compute-sanitizer")):
            found = os.path.join(home, "bin", "compute-sanitizer")
    return found


def sanitizer_ok(text: str):
    """No errors in the tool's summary, and the driver reached its end."""
    if "sanitizer_driver:" not in text:
        return False, "the driver did not finish"
    summaries = [line.strip("= \t") for line in text.splitlines() if "SUMMARY" in line]
    bad = [s for s in summaries if any(int(n) for n in re.findall(r"(\d+) (?:errors?|hazards?|warnings?)", s))]
    if bad:
        return False, bad[-1]
    return True, summaries[-1] if summaries else "no summary line (exit code 0)"


DRIVER = "scripts/gpu_check/sanitizer_driver.py"


def start_sanitizers(ctx: Context) -> None:
    """The driver on its own (on the CPU in the rehearsal), and under each sanitizer tool."""
    device = "cpu" if ctx.rehearse else "cuda"
    ctx.start(f"driver on {device}", ctx.py(DRIVER, "--device", device))
    if ctx.rehearse or not compute_sanitizer():
        return
    for tool in SANITIZER_TOOLS:
        # memcheck checks every kernel (torch's too, so that a filter matching nothing cannot
        # pass unseen); racecheck and synccheck check detcore's (their mangled names hold
        # "detcore"), not cuBLAS's or torch's. No caching allocator: each tensor its own allocation.
        only_ours = [] if tool == "memcheck" else ["--kernel-name", "kernel_substring=detcore"]
        args = [compute_sanitizer(), "--tool", tool, *only_ours, "--error-exitcode", "1", "--print-limit", "20",
                *ctx.py(DRIVER, "--device", "cuda")]
        ctx.start(f"compute-sanitizer {tool}", args, env={**ctx.env, "PYTORCH_NO_CUDA_MEMORY_CACHING": "1"})


def step_sanitizer(ctx: Context) -> Step:
    step = Step("sanitizer", "compute-sanitizer over every kernel")
    device = "cpu" if ctx.rehearse else "cuda"
    step.parts.append(ctx.join(f"driver on {device}", 120))
    if ctx.rehearse:
        step.parts += [skipped(f"compute-sanitizer {t}", NO_GPU) for t in SANITIZER_TOOLS]
    elif not compute_sanitizer():
        step.parts += [failed(f"compute-sanitizer {t}", "compute-sanitizer not found") for t in SANITIZER_TOOLS]
    else:
        step.parts += [ctx.join(f"compute-sanitizer {t}", 240, ok=sanitizer_ok) for t in SANITIZER_TOOLS]
    return step


# ---------------------------------------------------------------------------------- 5 speed
def _load_json(path: str) -> Optional[Dict]:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def step_speed(ctx: Context) -> Step:
    step = Step("speed", "detcore against torchvision, same device, same run")
    device = "cpu" if ctx.rehearse else "cuda"
    ops_json = os.path.join(ctx.out_dir, f"ops_{device}.json")
    size = ["--quick"] if ctx.rehearse else ["--repeats", "20"]
    step.parts.append(ctx.run("ops", ctx.py("benchmarks/benchmark_ops.py", "--device", device, *size, "--json", ops_json), 120))
    ctx.figures["ops"] = _load_json(ops_json)

    model_json = os.path.join(ctx.out_dir, f"model_{device}.json")
    # The rehearsal infers only: four R-50 training steps take minutes on 2 cores.
    size = ["--quick", "--train-repeats", "0"] if ctx.rehearse else ["--repeats", "5", "--train-repeats", "3", "--warmup", "2"]
    args = ctx.py("benchmarks/benchmark_model.py", "--device", device, *size, "--precision", "bfloat16",
                  "--torchvision-bfloat16", "--memory-workers", "8", "--output", model_json)
    step.parts.append(ctx.run("model", args, 180))
    ctx.figures["model"] = _load_json(model_json)
    return step


# ------------------------------------------------------------------------------- 6 training
def train_options(iters: int, rehearse: bool) -> List[str]:
    """The shapes R-18 recipe shortened to `iters` iterations, its LR steps at the same fractions,
    with AMP: float16 on the GPU (SOLVER.AMP's default), bfloat16 in the rehearsal on the CPU."""
    steps = tuple(max(1, round(s * iters / RECIPE_ITERS)) for s in RECIPE_STEPS)
    opts = ["SEED", "7", "SOLVER.MAX_ITER", str(iters), "SOLVER.STEPS", f"({steps[0]}, {steps[1]})",
            "SOLVER.WARMUP_ITERS", str(min(200, iters)), "SOLVER.CHECKPOINT_PERIOD", str(iters),
            "SOLVER.AMP.ENABLED", "True", "LOG_PERIOD", str(max(1, min(50, iters // 4)))]
    if rehearse:  # trained on the 100 validation images: 800 training ones take long to draw
        return opts + ["MODEL.DEVICE", "cpu", "SOLVER.AMP.DTYPE", "bfloat16", "DATALOADER.NUM_WORKERS", "1",
                       "DATASETS.TRAIN", "('shapes_val',)"]
    return opts + ["MODEL.DEVICE", "cuda", "SOLVER.AMP.DTYPE", "float16", "DATALOADER.NUM_WORKERS", "4"]


def training_figures(output_dir: str, iters: int, rehearse: bool) -> Dict:
    metrics = _load_json(os.path.join(output_dir, "inference", "shapes_val", "coco_eval_metrics.json")) or {}
    figures = {
        "iterations": iters,
        "precision": "bfloat16 AMP (CPU)" if rehearse else "float16 AMP",
        "seed": 7,
        "box_ap": (metrics.get("bbox") or {}).get("AP"),
        "mask_ap": (metrics.get("segm") or {}).get("AP"),
    }
    times = []
    try:
        with open(os.path.join(output_dir, "metrics.json")) as f:
            for line in f:
                record = json.loads(line) if line.strip() else {}
                if isinstance(record.get("time"), (int, float)):
                    times.append(record["time"])
    except (OSError, ValueError):
        pass
    if times:
        figures["seconds_per_iter"] = sorted(times)[len(times) // 2]
    reference = CPU_REFERENCE_AP.get(iters)
    if reference and not rehearse:
        figures["reference"] = f"box {reference[0]} / mask {reference[1]} AP ({reference[2]})"
        figures["reference_ap"] = list(reference[:2])
    return figures


def step_training(ctx: Context) -> Step:
    step = Step("training", "shapes R-18 Mask R-CNN, AMP")
    step.parts.append(ctx.join("dataset", 240, ok=lambda text: (True, ", ".join(re.findall(r"^shapes_\w+ \d+$", text, re.M)))))
    if step.parts[-1].status != PASSED:
        step.parts.append(skipped("train", "no dataset"))
        return step
    iters = ctx.train_iters
    output = os.path.join(ctx.scratch, "train")
    shutil.rmtree(output, ignore_errors=True)
    if ctx.remaining() < (30 if ctx.rehearse else 60):
        step.parts.append(skipped("train", f"{ctx.remaining():.0f} s left in the budget"))
        return step
    args = ctx.py("tools/train_net.py", "--config-file", TRAIN_CONFIG, *train_options(iters, ctx.rehearse),
                  "OUTPUT_DIR", output)

    def ok(text):
        t = training_figures(output, iters, ctx.rehearse)
        ctx.figures["training"] = t
        if t["box_ap"] is None or t["mask_ap"] is None:
            return False, "no box / mask AP in the evaluation's metrics"
        note = f"box AP {t['box_ap']:.1f}, mask AP {t['mask_ap']:.1f} after {iters} iterations"
        if "reference_ap" in t:
            low = [name for name, got, ref in zip(("box", "mask"), (t["box_ap"], t["mask_ap"]), t["reference_ap"])
                   if got < ref - AP_MARGIN]
            note += f" (CPU: {t['reference']})"
            if low:
                return False, note + f": {' and '.join(low)} AP more than {AP_MARGIN:g} points below the CPU's"
        else:
            note += " (no CPU figure at this schedule to hold it against)" if not ctx.rehearse else ""
        return True, note

    step.parts.append(ctx.run("train", args, ctx.remaining(), ok=ok))
    return step
