#!/usr/bin/env python
"""float32 against int8, per runtime (onnxruntime, OpenVINO), on the CPU, in one process, and
which convolution kernels each int8 graph runs.

The detector (random seeded weights, as in benchmark_export.py) is traced once; its ONNX graph is
run by onnxruntime as it is and quantized (detcore.export.quantize, as export_model --int8 does),
and converted to OpenVINO's IR as it is and quantized by NNCF. The four run on the same image,
interleaved repeat by repeat so that a change of machine load hits them alike; medians of the
repeats after a warm-up. Kernels: onnxruntime's optimized int8 graph, convolutions fused into its
int8 QLinearConv against those left as float Conv; OpenVINO's per-layer counters, the
convolutions by the kernel that ran them (``*_I8`` / ``*_i8`` int8, ``*_f32`` float).

    python benchmarks/benchmark_int8.py                      # R-50-FPN Mask R-CNN at 800x1333 (minutes)
    python benchmarks/benchmark_int8.py --config-file configs/e2e_mask_rcnn_R_18_FPN_shapes.yaml --size 800 1066

Results are printed and saved to benchmark_results/int8_cpu.json.
"""
import argparse
import collections
import os
import platform
import sys
import tempfile
import warnings

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(1, os.path.dirname(os.path.abspath(__file__)))

import detcore.export  # noqa: E402
from detcore.config import get_cfg  # noqa: E402
from detcore.export import ExportableDetector, trace_detector  # noqa: E402
from detcore.export import quantize as int8_quantization  # noqa: E402
from detcore.export.openvino_format import import_openvino, onnx_to_openvino  # noqa: E402
from detcore.modeling import build_model  # noqa: E402
from results_file import write_results  # noqa: E402
from detcore.utils.collect_env import cpu_name  # noqa: E402
from benchmark_export import _image  # noqa: E402
from benchmark_timing import interleaved, median  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config-file", default=os.path.join(ROOT, "configs", "e2e_mask_rcnn_R_50_FPN_1x.yaml"))
    parser.add_argument("--size", type=int, nargs=2, default=[800, 1333], metavar=("H", "W"), help="input image size")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--calibration-dataset", default="shapes_val")
    parser.add_argument("--calibration-images", type=int, default=4)
    parser.add_argument("--output", default=os.path.join(ROOT, "benchmark_results", "int8_cpu.json"))
    parser.add_argument("opts", nargs=argparse.REMAINDER, default=[], help="KEY VALUE config overrides")
    return parser.parse_args(argv)


def onnxruntime_kernels(path: str, folder: str) -> dict:
    """How many convolutions onnxruntime's optimized graph runs as QLinearConv and as float Conv."""
    import onnx
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = os.path.join(folder, "optimized.onnx")
    onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    counts = collections.Counter(n.op_type for n in onnx.load(options.optimized_model_filepath).graph.node)
    return {op: counts[op] for op in ("QLinearConv", "Conv", "DequantizeLinear", "QuantizeLinear")}


def openvino_kernels(compiled_request) -> dict:
    """OpenVINO's last run: its convolutions by the kernel that ran them ({exec_type: count}) and
    the six (layer type, kernel) pairs that took the most time ({"type kernel": ms})."""
    executed = [p for p in compiled_request.get_profiling_info() if p.status == p.Status.EXECUTED]
    convolutions = collections.Counter(p.exec_type for p in executed if p.node_type.startswith("Convolution"))
    ms = collections.Counter()
    for p in executed:
        ms[f"{p.node_type} {p.exec_type}"] += p.real_time.total_seconds() * 1000
    return {"convolutions": dict(sorted(convolutions.items())),
            "most_time_ms": {k: round(v, 1) for k, v in ms.most_common(6)}}


def main(argv=None):
    args = parse_args(argv)
    import onnxruntime

    ov = import_openvino()
    cfg = get_cfg()
    cfg.merge_from_file(args.config_file)
    cfg.merge_from_list(["MODEL.DEVICE", "cpu", "MODEL.ROI_HEADS.SCORE_THRESH_TEST", 0.0, "TEST.DETECTIONS_PER_IMAGE", 100])
    cfg.merge_from_list(args.opts)
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    detector = ExportableDetector(model)
    image = _image(*args.size)
    array = image.numpy()
    keep_float = list(int8_quantization.float_layers(model))
    inputs = int8_quantization.calibration_inputs(
        cfg, args.calibration_dataset, args.calibration_images, "CHW", None, detector.min_side
    )
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = args.threads, 1
    ov_config = {"INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": args.threads, "PERF_COUNT": True}
    core = ov.Core()
    with warnings.catch_warnings(), tempfile.TemporaryDirectory() as tmp:
        warnings.simplefilter("ignore")
        onnx_program = detcore.export.program_to_onnx(trace_detector(detector, image), (image,))
        paths = {name: os.path.join(tmp, name) for name in ("float.onnx", "int8.onnx", "float.xml", "int8.xml")}
        onnx_program.save(paths["float.onnx"])
        int8_quantization.quantize_onnx_file(paths["float.onnx"], paths["int8.onnx"], inputs, keep_float)
        onnx_to_openvino(onnx_program, paths["float.xml"])
        nodes = int8_quantization.onnx_nodes_of(onnx_program.model_proto, keep_float)
        onnx_to_openvino(onnx_program, paths["int8.xml"],
                         lambda m: int8_quantization.quantize_openvino_model(m, inputs, nodes))
        sessions = {p: onnxruntime.InferenceSession(paths[p], options, providers=["CPUExecutionProvider"])
                    for p in ("float.onnx", "int8.onnx")}
        requests = {p: core.compile_model(paths[p], "CPU", ov_config).create_infer_request()
                    for p in ("float.xml", "int8.xml")}
        kernels = {"onnxruntime int8": onnxruntime_kernels(paths["int8.onnx"], tmp)}
    input_name = sessions["float.onnx"].get_inputs()[0].name
    runners = {
        "onnxruntime float32": lambda: sessions["float.onnx"].run(None, {input_name: array}),
        "onnxruntime int8": lambda: sessions["int8.onnx"].run(None, {input_name: array}),
        "openvino float32": lambda: requests["float.xml"].infer([array]),
        "openvino int8": lambda: requests["int8.xml"].infer([array]),
    }
    for run in runners.values():  # the warm-up
        run()
    load_before = os.getloadavg()
    times = interleaved(runners, args.repeats)
    load_after = os.getloadavg()
    kernels["openvino float32"] = openvino_kernels(requests["float.xml"])
    kernels["openvino int8"] = openvino_kernels(requests["int8.xml"])
    medians = {name: median(t) for name, t in times.items()}
    print(f"{os.path.basename(args.config_file)} at {args.size[0]}x{args.size[1]}, {args.threads} threads, "
          f"{args.repeats} repeats interleaved, load average {load_before[0]:.2f} before, {load_after[0]:.2f} after")
    print(f"{'runtime':<22}{'median ms':>12}{'int8 / float32':>16}")
    for name, ms in medians.items():
        ratio = f"{ms / medians[name.replace('int8', 'float32')]:.2f}" if name.endswith("int8") else ""
        print(f"{name:<22}{ms:>12.1f}{ratio:>16}")
    for name, counts in kernels.items():
        print(f"convolutions, {name}: {counts}")
    record = {
        "config": os.path.relpath(args.config_file, ROOT),
        "size": args.size,
        "repeats": args.repeats,
        "threads": args.threads,
        "median_ms": medians,
        "times_ms": times,
        "kernels": kernels,
        "calibration": {"dataset": args.calibration_dataset, "images": len(inputs)},
        "cpu": cpu_name(),
        "load_average_before": list(load_before),
        "load_average_after": list(load_after),
        "versions": {"torch": torch.__version__, "onnxruntime": onnxruntime.__version__,
                     "openvino": ov.__version__, "python": platform.python_version()},
    }
    write_results(args.output, record)
    print(f"saved {args.output}")
    return record


if __name__ == "__main__":
    main()
