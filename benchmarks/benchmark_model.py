#!/usr/bin/env python
"""Benchmark detcore's Mask R-CNN or RetinaNet R50-FPN against torchvision's, in the same run.

Both models get the same image(s), the same thread count and random weights (no download):

* inference (eval mode, one image): median ms per stage -- preprocessing (normalize / pad; for
  torchvision also its resize, a no-op scale here), backbone (ResNet + FPN), RPN, ROI heads (box
  head + per-class NMS + mask head), post-processing (rescale boxes, paste masks into the image);
* a training step on 2 images (forward, backward, SGD step) with 3 trainable backbone stages on
  both (detcore: FREEZE_AT 2; torchvision: trainable_layers=3) and FrozenBN on both;
* times come from one subprocess holding both models and alternating them run by run, so a
  change of load on a shared machine affects both alike; median of the repeats after warmup;
* peak memory: each (framework, phase) runs once more in its own subprocess. On the CPU it is the
  peak resident set size (``resource.getrusage(RUSAGE_SELF).ru_maxrss``), reported both as the
  process peak and as the growth over the RSS right after building the model and its inputs
  (Python, torch and the weights excluded); on CUDA ``torch.cuda.max_memory_allocated``.

Random weights detect differently in the two models, so the work is fixed instead: score
threshold 0, the same number of proposals (1000 per image) and of detections per image (100), so
both paste 100 masks; the reported detection counts show it held. RetinaNet (``--model
retinanet``): torchvision's ``retinanet_resnet50_fpn`` against detcore's preset of the same model
(configs/torchvision/retinanet_R_50_FPN.yaml: P6/P7 from P5, the same anchors), score threshold 0,
so every level's top 1000 (anchor, class) pairs are decoded and go to the NMS on both sides, and
100 detections per image; its stages are the head (anchors, class and box towers on P3-P7) and
detect (per level top-k, decoding, NMS). Training uses SGD with lr 0 so
that every repeat sees the same weights (the update is computed all the same).

torchvision's ``maskrcnn_resnet50_fpn(weights=None, weights_backbone=None)`` silently switches to
BatchNorm and 5 trainable stages (it assumes training from scratch), so the same model is built
from its parts: ``resnet_fpn_backbone("resnet50", norm_layer=FrozenBatchNorm2d,
trainable_layers=3)`` + ``MaskRCNN`` -- exactly what the builder does for a pretrained backbone.

    python benchmarks/benchmark_model.py                 # CPU, 800x1333 (several minutes on 2 cores)
    python benchmarks/benchmark_model.py --quick         # smoke run of the tool: tiny image, 1 repeat
    python benchmarks/benchmark_model.py --device cuda --repeats 20
    python benchmarks/benchmark_model.py --quick MODEL.CHANNELS_LAST True   # detcore config overrides
    python benchmarks/benchmark_model.py --train-repeats 0                  # inference only
    python benchmarks/benchmark_model.py --model retinanet                  # RetinaNet vs retinanet_resnet50_fpn
    python benchmarks/benchmark_model.py --precision bfloat16   # + detcore in bfloat16 (inference and AMP step)

With ``--precision bfloat16`` a third model joins the same run: detcore's, with the same random
weights, inferring in TEST.PRECISION bfloat16 and training with bfloat16 AMP (SOLVER.AMP); its
time over detcore's float32 time is printed as bf16/fp32. That pays only on CPUs with native
bfloat16 (`python -m detcore.utils.collect_env` says which; the table's header repeats it).
``--torchvision-bfloat16`` adds torchvision's model under bfloat16 autocast too (inference and the
training step's forward), so that both libraries are also compared in mixed precision;
``--memory-workers N`` takes N peak-memory measurements at once (on a GPU, where each process
reads only its own allocations; scripts/gpu_check.sh uses both).

Results are printed as a table (ratio = torchvision time / detcore time: above 1, detcore is
faster) and saved to benchmark_results/model_<device>.json (model_retinanet_<device>.json).
"""
import argparse
import os
import platform
import sys

import torch

# Runnable as `python benchmarks/benchmark_model.py` from a checkout, without installing detcore.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
# The workloads live beside this script (on the path already when it runs as a script; not under runpy).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from detcore.utils.collect_env import cpu_name  # noqa: E402
from results_file import write_results  # noqa: E402
from detcore.config.choices import INFERENCE_PRECISIONS  # noqa: E402
from detcore.utils.precision import cpu_bfloat16_summary  # noqa: E402
import benchmark_worker  # noqa: E402
from model_benchmark_workloads import CONFIGS, NUM_GT, RUNNERS, STAGES, serve  # noqa: E402


# --- driver -------------------------------------------------------------------------------------------
def phases(args):
    """The phases to measure: those with at least one timed repeat (0 skips a phase)."""
    return [p for p, n in (("infer", args.repeats), ("train", args.train_repeats)) if n > 0]


def start_worker(args, frameworks, phase):
    """A worker (benchmark_worker.py's protocol) started with the run's options, asked for one
    measurement: the times of ``frameworks`` (phase "time") or the peak memory of one."""
    worker_args = [
        "--model", args.model, "--device", args.device, "--threads", str(args.threads),
        "--config", args.config,
        "--height", str(args.height), "--width", str(args.width), "--repeats", str(args.repeats),
        "--train-repeats", str(args.train_repeats), "--warmup", str(args.warmup),
        "--detections", str(args.detections), "--proposals", str(args.proposals), "--roi-batch", str(args.roi_batch),
        "--precision", args.precision,
        *(["--torchvision-channels-last"] if args.torchvision_channels_last else []),
        *(["--torchvision-bfloat16"] if args.torchvision_bfloat16 else []),
        *args.opts,  # last: a KEY VALUE list takes the rest of the command line
    ]
    what = f"the {'/'.join(frameworks)} {phase} worker"
    worker = benchmark_worker.Worker(os.path.abspath(__file__), worker_args, what=what, cwd=ROOT)
    worker.send({"frameworks": list(frameworks), "phase": phase})
    return worker


def finish_worker(worker):
    """The measurement a worker was asked for; the worker is closed."""
    try:
        return worker.receive()
    finally:
        worker.close()


def ratio(tv, dc):
    return tv / dc if dc > 0 else float("nan")


LABELS = {"detcore": "detcore", "detcore_bfloat16": "detcore bf16", "torchvision": "torchvision",
          "torchvision_bfloat16": "tv bf16"}


def ratio_columns(results):
    """(header, numerator, denominator) of the time ratios to print, for the frameworks measured."""
    columns = []
    if "torchvision" in results:
        columns.append(("tv/detcore", "torchvision", "detcore"))
    if "detcore_bfloat16" in results:
        columns.append(("bf16/fp32", "detcore_bfloat16", "detcore"))
        if "torchvision" in results:
            columns.append(("tv/bf16", "torchvision", "detcore_bfloat16"))
        if "torchvision_bfloat16" in results:
            columns.append(("tvbf16/bf16", "torchvision_bfloat16", "detcore_bfloat16"))
    return columns


def print_table(results, args):
    names = [name for name in RUNNERS if name in results]
    unit = "MiB (CUDA max allocated)" if args.device == "cuda" else "MiB (peak RSS)"
    rows = [("inference " + s, f"infer.{s}_ms", "ms") for s in STAGES[args.model]]
    rows += [
        ("inference total", "infer.total_ms", "ms"),
        ("train step forward (2 img)", "train.forward_ms", "ms"),
        ("train step backward+SGD", "train.backward_step_ms", "ms"),
        ("train step total (2 img)", "train.total_ms", "ms"),
        ("peak memory, inference", "infer.peak_memory_mb", unit),
        ("  growth over built model", "infer.memory_growth_mb", unit),
        ("peak memory, train step", "train.peak_memory_mb", unit),
        ("  growth over built model", "train.memory_growth_mb", unit),
    ]
    rows = [row for row in rows if row[1].split(".")[0] in results["detcore"]]  # a phase with 0 repeats was not run

    def get(res, key):
        phase, field = key.split(".")
        return res[phase][field]

    medians = " / ".join(
        f"{n} ({what})" for n, what in ((args.repeats, "inference"), (args.train_repeats, "train")) if n > 0
    )
    name = {"mask_rcnn": "Mask R-CNN", "retinanet": "RetinaNet"}[args.model]
    print(f"\n{name} R50-FPN, {args.height}x{args.width}, device {args.device}, {args.threads} thread(s), "
          f"median of {medians} runs")
    print(f"detcore config: {os.path.relpath(args.config, ROOT)}")
    if args.opts:
        print(f"detcore overrides: {' '.join(args.opts)}")
    if args.torchvision_channels_last:
        print("torchvision: channels-last weights (--torchvision-channels-last)")
    if "detcore_bfloat16" in results and args.device == "cpu":
        print(f"detcore bf16: TEST.PRECISION bfloat16 (inference), bfloat16 AMP (train step); CPU bfloat16 "
              f"{cpu_bfloat16_summary()}")
    columns = ratio_columns(results)
    print("; ".join({"tv/detcore": "tv/detcore = torchvision / detcore: above 1, detcore is faster or smaller",
                     "bf16/fp32": "bf16/fp32 = detcore bf16 / detcore: below 1, bfloat16 is faster",
                     "tv/bf16": "tv/bf16 = torchvision / detcore bf16",
                     "tvbf16/bf16": "tvbf16/bf16 = torchvision bf16 / detcore bf16"}[c[0]] for c in columns))
    print(f"{'':32}" + "".join(f" {LABELS[n]:>12}" for n in names) + "".join(f" {c[0]:>10}" for c in columns) + "  unit")
    for label, key, u in rows:
        values = {n: get(results[n], key) for n in names}
        line = f"{label:32}" + "".join(f" {values[n]:12.1f}" for n in names)
        if u == "ms":  # ratios of times; memory ratios are read off the columns
            line += "".join(f" {ratio(values[num], values[den]):10.2f}" for _, num, den in columns)
        else:
            line += "".join(f" {'':>10}" for _ in columns)
        print(f"{line}  {u}")
    for name in names:
        res = results[name]
        facts = []
        if "infer" in res:
            i = res["infer"]
            first = "anchors" if args.model == "retinanet" else "proposals"
            facts.append(f"{i[first + '_per_image']} {first} and {i['detections_per_image']} detections per image")
            # Conv / matmul work at the measured speed: the same GFLOP on both sides, so the
            # rest of the time is where the frameworks can differ.
            facts.append(f"{i['gflop']:.0f} GFLOP of conv/matmul per inference, "
                         f"{i['gflop'] / i['total_ms'] * 1000:.0f} GFLOP/s over the whole inference")
        if "train" in res:
            facts.append(f"{res['train']['trainable_params']:,} trainable parameters")
        print(f"{LABELS[name]}: {'; '.join(facts)}")
    if args.model == "retinanet":
        work = (f"the top 1000 (anchor, class) pairs of each level decoded and {args.detections} detections per "
                "image on both; train step = forward + backward + SGD (lr 0) on 2 images with "
                f"{NUM_GT} objects each, focal loss over all anchors")
    else:
        work = (f"{args.proposals} proposals and {args.detections} detections per image on both; "
                f"train step = forward + backward + SGD (lr 0) on 2 images with {NUM_GT} objects each, "
                f"{args.roi_batch} sampled ROIs per image")
    print(f"Work is fixed, not learned: random weights, score threshold 0, {work}, FrozenBN, 3 trainable backbone "
          "stages on both.")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--model", default="mask_rcnn", choices=sorted(CONFIGS), help="which detector to compare")
    parser.add_argument("--config", default=None, help="detcore's config (default: the one matching --model's torchvision model)")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--height", type=int, default=800)
    parser.add_argument("--width", type=int, default=1333)
    parser.add_argument("--repeats", type=int, default=3, help="timed inference runs (median)")
    parser.add_argument("--train-repeats", type=int, default=2, help="timed training steps (median)")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--detections", type=int, default=100, help="detections per image, both models")
    parser.add_argument("--proposals", type=int, default=1000, help="RPN proposals per image at test time")
    parser.add_argument("--roi-batch", type=int, default=512, help="ROIs sampled per training image, both models")
    parser.add_argument(
        "--precision", default="float32", choices=INFERENCE_PRECISIONS,
        help="bfloat16: also time detcore in bfloat16 (TEST.PRECISION for inference, AMP for the train step)",
    )
    parser.add_argument(
        "--quick", action="store_true",
        help="smoke run (checks the tool, its ratios mean little): 128x192 image, 100 proposals, "
        "10 detections, 64 training ROIs per image, 1 repeat (0 stays 0), no warmup",
    )
    parser.add_argument(
        "--torchvision-channels-last", action="store_true",
        help="give torchvision's model channels-last weights too (detcore's MODEL.CHANNELS_LAST, done by hand), "
        "to compare like with like rather than default with default",
    )
    parser.add_argument(
        "--torchvision-bfloat16", action="store_true",
        help="with --precision bfloat16: also time torchvision's model under bfloat16 autocast (inference and the "
        "training step's forward), to compare like with like",
    )
    parser.add_argument(
        "--memory-workers", type=int, default=1, metavar="N",
        help="peak-memory subprocesses run at once (default 1; --quick: all). On CUDA each reads its own "
        "allocations (max_memory_allocated), so several at once do not disturb one another",
    )
    parser.add_argument("--output", default=None, help="JSON path (default benchmark_results/model_<device>.json)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "opts", nargs="*", default=[],
        help="detcore config overrides, KEY VALUE ..., applied after the benchmark's own (torchvision only reads "
        "the class count from the config)",
    )
    # Intermixed: options may come after the KEY VALUE overrides too.
    args = parser.parse_intermixed_args()
    args.config = os.path.abspath(args.config or os.path.join(ROOT, CONFIGS[args.model]))
    if len(args.opts) % 2:
        parser.error(f"config overrides come in KEY VALUE pairs, got an odd count ({len(args.opts)}): {args.opts}")

    if args.worker:
        return serve(args)

    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is available")
    if args.quick:
        args.height, args.width = 128, 192
        args.proposals, args.detections, args.roi_batch = 100, 10, 64
        args.repeats, args.train_repeats = min(args.repeats, 1), min(args.train_repeats, 1)
        args.warmup = 0
    if args.repeats < 0 or args.train_repeats < 0:
        parser.error("--repeats and --train-repeats cannot be negative")
    if args.repeats == 0 and args.train_repeats == 0:
        parser.error("--repeats 0 and --train-repeats 0: nothing to measure (0 skips that phase)")
    if args.torchvision_bfloat16 and args.precision != "bfloat16":
        parser.error("--torchvision-bfloat16 goes with --precision bfloat16")
    if args.memory_workers < 1:
        parser.error("--memory-workers must be >= 1")

    try:
        import torchvision  # noqa: F401

        frameworks = ("detcore", "torchvision")
    except ImportError:
        print("torchvision is not importable: timing detcore alone")
        frameworks = ("detcore",)
    if args.precision == "bfloat16":
        frameworks = ("detcore", "detcore_bfloat16") + frameworks[1:]
        if args.torchvision_bfloat16 and "torchvision" in frameworks:
            frameworks += ("torchvision_bfloat16",)

    load_before = os.getloadavg()
    print(f"timing {' and '.join(frameworks)}, alternating run by run ...", flush=True)
    results = finish_worker(start_worker(args, frameworks, "time"))
    jobs = [(framework, phase) for framework in frameworks for phase in phases(args)]
    # Small models (--quick) all at once, each in its own process all the same; else one at a
    # time (at 800x1333 a training step takes several GB) unless --memory-workers says more.
    at_once = len(jobs) if args.quick else args.memory_workers
    for first in range(0, len(jobs), at_once):
        batch = jobs[first:first + at_once]
        print("peak memory of " + ", ".join(f"{framework} {phase}" for framework, phase in batch) + " ...", flush=True)
        procs = [start_worker(args, [framework], phase) for framework, phase in batch]
        for (framework, phase), proc in zip(batch, procs):
            results[framework][phase].update(finish_worker(proc))
    load_after = os.getloadavg()
    print_table(results, args)

    import detcore

    record = {
        "benchmark": "model",
        "model": args.model,
        "device": args.device,
        "device_name": torch.cuda.get_device_name() if args.device == "cuda" else cpu_name(),
        "cpu_bfloat16": cpu_bfloat16_summary(),
        "precision": args.precision,
        "stages": "each stage called in turn (the calls the models' forward makes), synchronized and timed apart",
        "threads": args.threads,
        "image": [args.height, args.width],
        "repeats": {"inference": args.repeats, "train": args.train_repeats, "warmup": args.warmup},
        "config": os.path.relpath(args.config, ROOT),
        "detcore_overrides": args.opts,
        "torchvision_channels_last": args.torchvision_channels_last,
        "torchvision_bfloat16": args.torchvision_bfloat16,
        "detections_per_image": args.detections,
        "proposals_per_image": args.proposals,
        "train_rois_per_image": args.roi_batch,
        "load_average_1min": {"before": load_before[0], "after": load_after[0]},
        "memory": (
            "CUDA max_memory_allocated" if args.device == "cuda"
            else "peak RSS (ru_maxrss) of a subprocess per framework and phase"
        ),
        "quick": args.quick,
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "detcore": getattr(detcore, "__version__", "unknown"),
            "torchvision": __import__("torchvision").__version__ if "torchvision" in results else None,
        },
        "results": results,
    }
    stem = "model" if args.model == "mask_rcnn" else f"model_{args.model}"
    suffix = ("_bfloat16" if args.precision == "bfloat16" else "") + ("_quick" if args.quick else "")
    path = args.output or os.path.join(ROOT, "benchmark_results", f"{stem}_{args.device}{suffix}.json")
    write_results(path, record)
    print(f"saved {os.path.relpath(path, ROOT)}")


if __name__ == "__main__":
    main()
