#!/usr/bin/env python
"""scripts/gpu_check.sh's driver: runs the steps (steps.py) in order, each timed and recorded,
a failing one not stopping the next, inside a wall-time budget, and writes OUT_DIR after every
step: gpu_check.json, gpu_check.md, logs.tar.gz (every command's output), the benchmarks' JSON.

    python scripts/gpu_check/run.py OUT_DIR                 # on a GPU machine
    python scripts/gpu_check/run.py --rehearse OUT_DIR      # on the CPU, small sizes
    python scripts/gpu_check/run.py --only 5,6 OUT_DIR      # some steps (1, the environment, always runs)

Exit code 0 when no step failed. Standard library only: it starts before anything is installed.
"""
import argparse
import datetime
import os
import sys
import tarfile
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import report  # noqa: E402
import steps  # noqa: E402
from parts import FAILED, Step, skipped  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(HERE))
STEP_NAMES = ["environment", "correctness", "emulation", "sanitizer", "speed", "training"]
DEFAULT_BUDGET_S = {"gpu": 450, "rehearse": 900}
DEFAULT_TRAIN_ITERS = {"gpu": 1000, "rehearse": 10}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", help="where gpu_check.json, gpu_check.md and the rest go")
    parser.add_argument("--rehearse", action="store_true", help="on the CPU at small sizes; GPU-only parts skipped")
    parser.add_argument("--budget-s", type=float, default=None, help="wall-time budget (450 s; rehearsal 900 s)")
    parser.add_argument("--only", default=None, help="comma-separated step numbers or names to run besides step 1")
    parser.add_argument("--train-iters", type=int, default=None, help="step 6's iterations (1000; rehearsal 10)")
    parser.add_argument("--scratch", default=None, help="work folder (default: $TMPDIR/detcore_gpu_check_<mode>)")
    args = parser.parse_args(argv)
    mode = "rehearse" if args.rehearse else "gpu"
    args.mode = mode
    args.budget_s = args.budget_s or DEFAULT_BUDGET_S[mode]
    args.train_iters = args.train_iters or int(os.environ.get("GPU_CHECK_TRAIN_ITERS", DEFAULT_TRAIN_ITERS[mode]))
    args.scratch = args.scratch or os.path.join(tempfile.gettempdir(), f"detcore_gpu_check_{mode}")
    wanted = set(STEP_NAMES)
    if args.only:
        wanted = {"environment"}
        for item in args.only.split(","):
            item = item.strip()
            name = STEP_NAMES[int(item) - 1] if item.isdigit() and 1 <= int(item) <= len(STEP_NAMES) else item
            if name not in STEP_NAMES:
                parser.error(f"--only: {item!r} is not a step (1-{len(STEP_NAMES)} or {', '.join(STEP_NAMES)})")
            wanted.add(name)
    args.wanted = wanted
    return args


def bundle_logs(ctx) -> None:
    """Every log in one tarball: what comes back from the lent machine is at most 8 files."""
    path = os.path.join(ctx.out_dir, "logs.tar.gz")
    with tarfile.open(path + ".tmp", "w:gz") as tar:
        tar.add(ctx.logs, arcname="logs")
        for name in ("junit_cuda.xml", "junit_emulation.xml"):
            if os.path.exists(os.path.join(ctx.scratch, name)):
                tar.add(os.path.join(ctx.scratch, name), arcname=f"logs/{name}")
    os.replace(path + ".tmp", path)


def main(argv=None) -> int:
    args = parse_args(argv)
    out_dir = os.path.abspath(args.out_dir)
    os.makedirs(out_dir, exist_ok=True)
    os.makedirs(args.scratch, exist_ok=True)
    start = time.monotonic()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if args.rehearse:
        # OpenMP threads that sleep when idle: spinning ones wait on preempted peers on a small,
        # shared CPU (as scripts/main.sh sets it).
        env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    ctx = steps.Context(
        root=ROOT, out_dir=out_dir, scratch=args.scratch, rehearse=args.rehearse,
        deadline=start + args.budget_s, clock=time.monotonic, env=env, python=sys.executable,
        train_iters=args.train_iters, cores=os.cpu_count() or 1,
    )
    for old in os.listdir(ctx.logs):
        os.remove(os.path.join(ctx.logs, old))
    state = {
        "mode": args.mode,
        "date": datetime.date.today().isoformat(),
        "started": datetime.datetime.now().isoformat(timespec="seconds"),
        "budget_s": args.budget_s,
        "machine": ctx.machine,
        "figures": ctx.figures,
        "seconds": None,
    }
    done = []
    print(f"gpu_check ({args.mode}): budget {args.budget_s:.0f} s, output in {out_dir}, work in {args.scratch}", flush=True)

    def record(step: Step, began: float, concurrent: bool = False) -> None:
        # Steps 2-4 are jobs started together: such a step's time is its longest part's.
        step.seconds = max(p.seconds for p in step.parts) if concurrent and step.parts else time.monotonic() - began
        done.append(step)
        print(f"== step {len(done)} {step.name}: {step.status} in {step.seconds:.0f} s "
              f"({time.monotonic() - start:.0f} s of {args.budget_s:.0f})", flush=True)
        report.write(out_dir, state, done)
        bundle_logs(ctx)

    def not_wanted(name, title):
        return Step(name, title, [skipped(name, "not in --only")])

    began = time.monotonic()
    print("== step 1 environment", flush=True)
    record(steps.step_environment(ctx), began)

    began = time.monotonic()
    print("== steps 2-4 (at once): correctness, emulation, sanitizer", flush=True)
    job = steps.start_correctness_tests(ctx) if "correctness" in args.wanted else None
    if "sanitizer" in args.wanted:
        steps.start_sanitizers(ctx)
    if "emulation" in args.wanted:
        steps.start_emulation_tests(ctx)
    record(steps.step_correctness(ctx, job) if "correctness" in args.wanted
           else not_wanted("correctness", "tests marked cuda (ops, models)"), began, concurrent=True)
    record(steps.step_emulation(ctx) if "emulation" in args.wanted
           else not_wanted("emulation", "the emulation against the hardware"), began, concurrent=True)
    record(steps.step_sanitizer(ctx) if "sanitizer" in args.wanted
           else not_wanted("sanitizer", "compute-sanitizer over every kernel"), began, concurrent=True)

    began = time.monotonic()
    print("== step 5 speed", flush=True)
    record(steps.step_speed(ctx) if "speed" in args.wanted
           else not_wanted("speed", "detcore against torchvision, same device, same run"), began)

    began = time.monotonic()
    print("== step 6 training", flush=True)
    record(steps.step_training(ctx) if "training" in args.wanted
           else not_wanted("training", "shapes R-18 Mask R-CNN, AMP"), began)

    for name, job in ctx.jobs.items():  # a job no step waited for (a step not run)
        job.wait(0)
    state["seconds"] = round(time.monotonic() - start, 1)
    state["finished"] = datetime.datetime.now().isoformat(timespec="seconds")
    report.write(out_dir, state, done)
    bundle_logs(ctx)
    failed = [s.name for s in done if s.status == FAILED]
    print(f"gpu_check ({args.mode}) finished in {state['seconds']:.0f} s: "
          + (f"FAILED: {', '.join(failed)}" if failed else "no step failed")
          + f"\n  {os.path.join(out_dir, 'gpu_check.md')}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
