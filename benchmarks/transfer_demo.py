#!/usr/bin/env python
"""Transfer learning on the shapes data: a pretrained ResNet-50 body against random weights.

Trains the ResNet-50-FPN Mask R-CNN of configs/shapes_transfer/ twice with one schedule --
from the self-supervised ResNet-50 in the ``imgsim`` wheel, and from scratch -- evaluates both on
shapes_val and reports their box / mask AP side by side, with both loss curves in one picture.

    pip install --no-deps imgsim                # its weights only (93 MB); --no-deps keeps
                                                # opencv-python-headless the only OpenCV
    python benchmarks/transfer_demo.py               # long on a CPU (configs/README.md: s/it)
    python benchmarks/transfer_demo.py SOLVER.MAX_ITER 100 SOLVER.STEPS "(80,)"   # smoke run

Each run goes to OUTPUT_ROOT/<run> and is resumed if interrupted (train_net.py --resume), so
running the command again finishes what is missing. Results: OUTPUT_ROOT/transfer_results.json
(final APs, AP at every evaluation, s/it), OUTPUT_ROOT/total_loss.png and box_ap.png (both runs
on one plot).
"""
import argparse
import glob
import importlib.util
import json
import os
import shlex
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(1, os.path.dirname(os.path.abspath(__file__)))  # the results writer beside this script

from detcore.utils.plotting import plot_runs_compared, read_metrics  # noqa: E402
from results_file import write_results  # noqa: E402

CONFIGS = {
    "imgsim": os.path.join(ROOT, "configs", "shapes_transfer", "imgsim_R_50_FPN.yaml"),
    "scratch": os.path.join(ROOT, "configs", "shapes_transfer", "scratch_R_50_FPN.yaml"),
}
METRICS = ("AP", "AP50", "AP75")


def imgsim_weights():
    """Path of the model.pth inside the installed imgsim package (found without importing it:
    its module imports torchvision and OpenCV at import time)."""
    spec = importlib.util.find_spec("imgsim")
    if spec is None or spec.origin is None:
        sys.exit("transfer_demo: the imgsim package is not installed; run `pip install --no-deps imgsim` "
                 "(or pass --weights /path/to/a/torchvision/resnet50.pth)")
    path = os.path.join(os.path.dirname(spec.origin), "model.pth")
    if not os.path.isfile(path):
        sys.exit(f"transfer_demo: the imgsim package has no weights file at {path}")
    return path


def train_and_evaluate(train_command, name, output_dir, opts, weights):
    cmd = train_command + ["--config-file", CONFIGS[name], "--resume"] + list(opts) + ["OUTPUT_DIR", output_dir]
    if weights is not None:
        cmd += ["MODEL.WEIGHTS", weights]
    print(f"== {name}: {' '.join(cmd)}", flush=True)
    subprocess.run(cmd, check=True)
    # The config's test set (shapes_val unless overridden) is the only one evaluated.
    results = sorted(glob.glob(os.path.join(output_dir, "inference", "*", "coco_eval_metrics.json")))
    if not results:
        sys.exit(f"transfer_demo: the {name} run finished without writing {output_dir}/inference/*/coco_eval_metrics.json")
    with open(results[0]) as f:
        return json.load(f)


def seconds_per_iteration(records):
    """Median logged iteration time of a run's metrics records (None if it logged none)."""
    times = sorted(r["time"] for r in records if isinstance(r.get("time"), (int, float)))
    return times[len(times) // 2] if times else None


def ap_by_iteration(records):
    """{iterations done: {"bbox/AP": .., "segm/AP": ..}} of the evaluations a run logged.

    metrics.json files an evaluation under the index of the step just done (0-based)."""
    return {
        r["iteration"] + 1: {k: r[k] for k in ("bbox/AP", "segm/AP") if k in r}
        for r in records
        if "iteration" in r and "bbox/AP" in r
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output-root", default=os.path.join("output", "shapes_transfer"))
    parser.add_argument("--weights", default=None, help="pretrained body for the 'imgsim' run (default: imgsim's model.pth)")
    parser.add_argument("--runs", default="imgsim,scratch", help="comma-separated subset of: imgsim, scratch")
    parser.add_argument(
        "--train-command", default=f"{shlex.quote(sys.executable)} {shlex.quote(os.path.join(ROOT, 'tools', 'train_net.py'))}",
        help="command that trains and evaluates, given train_net.py's arguments (default: this Python running "
        "tools/train_net.py); a wrapper script that registers more datasets first can stand in",
    )
    parser.add_argument("opts", nargs=argparse.REMAINDER, help="KEY VALUE config overrides, applied to both runs")
    args = parser.parse_args()
    runs = [r for r in args.runs.split(",") if r]
    unknown = [r for r in runs if r not in CONFIGS]
    if unknown:
        parser.error(f"--runs: unknown run(s) {unknown}; expected some of {list(CONFIGS)}")
    if len(args.opts) % 2:
        parser.error(f"config overrides come in KEY VALUE pairs, got an odd count: {args.opts}")
    weights = args.weights or (imgsim_weights() if "imgsim" in runs else None)

    summary = {"overrides": args.opts, "weights": weights, "runs": {}}
    for name in runs:
        out = os.path.join(args.output_root, name)
        metrics = train_and_evaluate(shlex.split(args.train_command), name, out, args.opts, weights if name == "imgsim" else None)
        records = read_metrics(os.path.join(out, "metrics.json"))
        summary["runs"][name] = {
            "config": os.path.relpath(CONFIGS[name], ROOT),
            "output_dir": out,
            "seconds_per_iteration": seconds_per_iteration(records),
            **{f"{task}/{m}": metrics[task][m] for task in ("bbox", "segm") for m in METRICS if task in metrics},
            "ap_by_iteration": ap_by_iteration(records),
        }

    write_results(os.path.join(args.output_root, "transfer_results.json"), summary)
    metrics_files = {name: os.path.join(args.output_root, name, "metrics.json") for name in runs}
    pngs = [
        plot_runs_compared(
            metrics_files, os.path.join(args.output_root, "total_loss.png"),
            title="Mask R-CNN R-50-FPN on shapes: total loss, imgsim-pretrained body vs scratch",
        ),
        plot_runs_compared(
            metrics_files, os.path.join(args.output_root, "box_ap.png"), key="bbox/AP",
            title="Mask R-CNN R-50-FPN on shapes_val: box AP during training, imgsim-pretrained body vs scratch",
        ),
    ]
    columns = [f"{t}/{m}" for t in ("bbox", "segm") for m in METRICS]
    print("\n| run | s/it | " + " | ".join(columns) + " |")
    print("|---|---:|" + "---:|" * len(columns))
    for name, r in summary["runs"].items():
        spi = f"{r['seconds_per_iteration']:.3f}" if r["seconds_per_iteration"] else "-"
        print(f"| {name} | {spi} | " + " | ".join(f"{r.get(c, float('nan')):.1f}" for c in columns) + " |")
    print("\nbox / mask AP at each evaluation:")
    for name, r in summary["runs"].items():
        steps = ", ".join(f"{it}: {ap['bbox/AP']:.1f} / {ap.get('segm/AP', float('nan')):.1f}"
                          for it, ap in sorted(r["ap_by_iteration"].items()))
        print(f"  {name}: {steps or '(no evaluation logged)'}")
    print(f"\nwrote {os.path.join(args.output_root, 'transfer_results.json')}, " + ", ".join(pngs))


if __name__ == "__main__":
    main()
