#!/usr/bin/env python
"""Benchmark detcore's Mask R-CNN R50-FPN against torchvision's, in the same run.

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
both paste 100 masks; the reported detection counts show it held. Training uses SGD with lr 0 so
that every repeat sees the same weights (the update is computed all the same).

torchvision's ``maskrcnn_resnet50_fpn(weights=None, weights_backbone=None)`` silently switches to
BatchNorm and 5 trainable stages (it assumes training from scratch), so the same model is built
from its parts: ``resnet_fpn_backbone("resnet50", norm_layer=FrozenBatchNorm2d,
trainable_layers=3)`` + ``MaskRCNN`` -- exactly what the builder does for a pretrained backbone.

    python tools/benchmark_model.py                 # CPU, 800x1333 (several minutes on 2 cores)
    python tools/benchmark_model.py --quick         # smoke run of the tool: tiny image, 1 repeat
    python tools/benchmark_model.py --device cuda --repeats 20

Results are printed as a table (ratio = torchvision time / detcore time: above 1, detcore is
faster) and saved to benchmark_results/model_<device>.json.
"""
import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time

import numpy as np
import torch

# Runnable as `python tools/benchmark_model.py` from a checkout, without installing detcore.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from detcore.utils.collect_env import cpu_name  # noqa: E402

NUM_GT = 6  # objects per training image
STAGES = ("preprocess", "backbone", "rpn", "roi_heads", "postprocess")


# --- shared inputs ----------------------------------------------------------------------------------
def make_image(h, w, seed):
    """A smooth random BGR uint8 image (random noise would be an unusual input for a detector)."""
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, size=(max(h // 16, 2), max(w // 16, 2), 3)).astype(np.float32)
    t = torch.from_numpy(small).permute(2, 0, 1)[None]
    big = torch.nn.functional.interpolate(t, size=(h, w), mode="bilinear", align_corners=False)[0]
    return big.round().clamp(0, 255).to(torch.uint8)  # [3, H, W], BGR by convention


def make_targets(h, w, num_classes, seed):
    """NUM_GT boxes with an octagon polygon inscribed in each, and class ids in [0, num_classes)."""
    rng = np.random.default_rng(seed)
    boxes, polygons = [], []
    for _ in range(NUM_GT):
        bw, bh = rng.uniform(0.05, 0.4) * w, rng.uniform(0.05, 0.4) * h
        x1, y1 = rng.uniform(0, w - bw), rng.uniform(0, h - bh)
        cx, cy = x1 + bw / 2, y1 + bh / 2
        angles = np.arange(8) * np.pi / 4
        poly = np.stack([cx + bw / 2 * np.cos(angles), cy + bh / 2 * np.sin(angles)], axis=1)
        boxes.append([poly[:, 0].min(), poly[:, 1].min(), poly[:, 0].max(), poly[:, 1].max()])
        polygons.append(poly.reshape(-1))
    classes = rng.integers(0, num_classes, size=NUM_GT)
    return np.array(boxes, dtype=np.float32), polygons, classes


# --- the two models, each behind the same small interface --------------------------------------------
def detcore_cfg(args):
    from detcore.config import get_cfg

    cfg = get_cfg()
    cfg.merge_from_file(args.config)
    cfg.merge_from_list(
        [
            "MODEL.DEVICE", args.device,
            "MODEL.WEIGHTS", "",
            "MODEL.ROI_HEADS.SCORE_THRESH_TEST", 0.0,
            "TEST.DETECTIONS_PER_IMAGE", args.detections,
            "MODEL.RPN.POST_NMS_TOPK_TEST", args.proposals,
            "MODEL.ROI_HEADS.BATCH_SIZE_PER_IMAGE", args.roi_batch,
        ]
    )
    return cfg


class DetcoreRunner:
    name = "detcore"

    def __init__(self, args, train):
        from detcore.modeling import build_model

        self.cfg = detcore_cfg(args)
        self.device = torch.device(args.device)
        self.model = build_model(self.cfg)
        self.model.train(train)
        self.num_classes = self.cfg.MODEL.ROI_HEADS.NUM_CLASSES

    def inference_inputs(self, image):
        return [{"image": image.to(self.device), "height": image.shape[1], "width": image.shape[2]}]

    def stages(self, inputs):
        """The model's inference, split into its stages (the same calls GeneralizedRCNN.inference makes)."""
        m = self.model
        state = {}

        def preprocess():
            state["images"] = m.preprocess_image(inputs)

        def backbone():
            state["features"] = m.backbone(state["images"].tensor)

        def rpn():
            state["proposals"], _ = m.proposal_generator(state["images"], state["features"], None)

        def roi_heads():
            state["results"], _ = m.roi_heads(state["images"], state["features"], state["proposals"], None)

        def postprocess():
            state["output"] = m.postprocess(state["results"], inputs)

        return state, dict(zip(STAGES, (preprocess, backbone, rpn, roi_heads, postprocess)))

    @staticmethod
    def counts(state):
        return len(state["proposals"][0]), len(state["output"][0]["instances"])

    def train_inputs(self, images, targets):
        from detcore.structures import Boxes, Instances, PolygonMasks

        inputs = []
        for image, (boxes, polygons, classes) in zip(images, targets):
            h, w = image.shape[1:]
            inst = Instances(
                (h, w),
                gt_boxes=Boxes(torch.from_numpy(boxes)),
                gt_classes=torch.from_numpy(classes).long(),
                gt_masks=PolygonMasks([[p] for p in polygons]),
            )
            inputs.append({"image": image.to(self.device), "height": h, "width": w, "instances": inst})
        return inputs

    def train_forward(self, inputs):
        return sum(self.model(inputs).values())


class TorchvisionRunner:
    name = "torchvision"

    def __init__(self, args, train):
        from torchvision.models.detection import MaskRCNN
        from torchvision.models.detection.backbone_utils import resnet_fpn_backbone
        from torchvision.ops import FrozenBatchNorm2d

        cfg = detcore_cfg(args)  # the class count and input size follow detcore's config
        self.device = torch.device(args.device)
        self.num_classes = cfg.MODEL.ROI_HEADS.NUM_CLASSES
        h, w = args.height, args.width
        backbone = resnet_fpn_backbone(
            backbone_name="resnet50", weights=None, norm_layer=FrozenBatchNorm2d, trainable_layers=3
        )
        self.model = MaskRCNN(
            backbone,
            num_classes=self.num_classes + 1,  # + background
            min_size=min(h, w),  # the image is already at its test size: no resizing
            max_size=max(h, w),
            box_score_thresh=0.0,
            box_detections_per_img=args.detections,
            rpn_post_nms_top_n_test=args.proposals,
            box_batch_size_per_image=args.roi_batch,
        ).to(self.device)
        self.model.train(train)

    def _to_rgb_float(self, image):
        # torchvision's convention: RGB floats in [0, 1] (the data loader's ToTensor; not timed).
        return image.flip(0).float().div(255).to(self.device)

    def inference_inputs(self, image):
        return [self._to_rgb_float(image)]

    def stages(self, inputs):
        m = self.model
        state = {}
        original_sizes = [tuple(img.shape[-2:]) for img in inputs]

        def preprocess():
            state["images"], _ = m.transform(inputs)

        def backbone():
            state["features"] = m.backbone(state["images"].tensors)

        def rpn():
            state["proposals"], _ = m.rpn(state["images"], state["features"])

        def roi_heads():
            state["results"], _ = m.roi_heads(state["features"], state["proposals"], state["images"].image_sizes)

        def postprocess():
            state["output"] = m.transform.postprocess(state["results"], state["images"].image_sizes, original_sizes)

        return state, dict(zip(STAGES, (preprocess, backbone, rpn, roi_heads, postprocess)))

    @staticmethod
    def counts(state):
        return len(state["proposals"][0]), len(state["output"][0]["boxes"])

    def train_inputs(self, images, targets):
        import cv2

        inputs, tv_targets = [], []
        for image, (boxes, polygons, classes) in zip(images, targets):
            h, w = image.shape[1:]
            masks = np.zeros((len(polygons), h, w), dtype=np.uint8)
            for mask, poly in zip(masks, polygons):
                # Rasterize the same polygons detcore gets (pixel centres inside -> 1).
                pts = np.round((poly.reshape(-1, 2) - 0.5) * 16).astype(np.int32)
                cv2.fillPoly(mask, [pts], 1, cv2.LINE_8, 4)
            inputs.append(self._to_rgb_float(image))
            tv_targets.append(
                {
                    "boxes": torch.from_numpy(boxes).to(self.device),
                    "labels": torch.from_numpy(classes + 1).long().to(self.device),  # 0 is background
                    "masks": torch.from_numpy(masks).to(self.device),
                }
            )
        return inputs, tv_targets

    def train_forward(self, inputs):
        images, targets = inputs
        return sum(self.model(images, targets).values())


RUNNERS = {"detcore": DetcoreRunner, "torchvision": TorchvisionRunner}


# --- measuring (inside a worker subprocess) -------------------------------------------------------
def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_memory_mb(device):
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    # ru_maxrss is in kilobytes on Linux (bytes on macOS).
    scale = 1 if sys.platform == "darwin" else 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / 2**20


def inference_once(runner, inputs):
    """One inference, stage by stage: ({stage: ms}, (proposals, detections) of the first image)."""
    device = runner.device
    state, stages = runner.stages(inputs)
    times = {}
    with torch.no_grad():
        for name, fn in stages.items():
            synchronize(device)
            start = time.perf_counter()
            fn()
            synchronize(device)
            times[name] = (time.perf_counter() - start) * 1000
    return times, runner.counts(state)


def train_once(runner, inputs, optimizer):
    """One training step: (forward ms, backward + SGD step ms)."""
    device = runner.device
    synchronize(device)
    t0 = time.perf_counter()
    loss = runner.train_forward(inputs)
    synchronize(device)
    t1 = time.perf_counter()
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    synchronize(device)
    t2 = time.perf_counter()
    if not torch.isfinite(loss):
        raise RuntimeError(f"{runner.name}: the training loss is not finite ({loss.item()})")
    return (t1 - t0) * 1000, (t2 - t1) * 1000


class Workload:
    """A runner with its inference input, training batch and optimizer."""

    def __init__(self, runner, args):
        h, w = args.height, args.width
        self.runner = runner
        self.infer_inputs = runner.inference_inputs(make_image(h, w, seed=0))
        images = [make_image(h, w, seed=1), make_image(h, w, seed=2)]
        targets = [make_targets(h, w, runner.num_classes, seed=s) for s in (1, 2)]
        self.train_inputs = runner.train_inputs(images, targets)
        self.params = [p for p in runner.model.parameters() if p.requires_grad]
        # lr 0: the weights stay as they are, so every repeat does the same work (the update is still computed).
        self.optimizer = torch.optim.SGD(self.params, lr=0.0, momentum=0.9, weight_decay=1e-4)

    def infer(self):
        self.runner.model.eval()
        return inference_once(self.runner, self.infer_inputs)

    def train(self):
        self.runner.model.train()
        return train_once(self.runner, self.train_inputs, self.optimizer)


def time_worker(args):
    """Times every framework in one process, alternating them run by run, so that a change of
    load on a shared machine hits all of them alike."""
    loads = {w.runner.name: w for w in (Workload(RUNNERS[name](args, train=False), args) for name in args.frameworks)}
    infer = {name: {s: [] for s in STAGES + ("total",)} for name in loads}
    counts = {}
    for it in range(args.warmup + args.repeats):
        for name, load in loads.items():
            times, counts[name] = load.infer()
            if it >= args.warmup:
                for stage, ms in times.items():
                    infer[name][stage].append(ms)
                infer[name]["total"].append(sum(times.values()))
    train = {name: {"forward": [], "backward_step": [], "total": []} for name in loads}
    for it in range(args.warmup + args.train_repeats):
        for name, load in loads.items():
            fwd, bwd = load.train()
            if it >= args.warmup:
                train[name]["forward"].append(fwd)
                train[name]["backward_step"].append(bwd)
                train[name]["total"].append(fwd + bwd)
    result = {}
    for name, load in loads.items():
        i = {f"{k}_ms": statistics.median(v) for k, v in infer[name].items()}
        i["proposals_per_image"], i["detections_per_image"] = counts[name]
        t = {f"{k}_ms": statistics.median(v) for k, v in train[name].items()}
        t["trainable_params"] = sum(p.numel() for p in load.params)
        result[name] = {"infer": i, "train": t}
    return result


def memory_worker(args):
    """Peak memory of one framework in one phase (one run, the high-water mark is what counts)."""
    device = torch.device(args.device)
    runner = RUNNERS[args.frameworks[0]](args, train=args.phase == "train")
    load = Workload(runner, args)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    base = peak_memory_mb(device)
    load.train() if args.phase == "train" else load.infer()
    peak = peak_memory_mb(device)
    return {"peak_memory_mb": peak, "memory_growth_mb": peak - base}


def worker(args):
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    result = time_worker(args) if args.phase == "time" else memory_worker(args)
    print("RESULT " + json.dumps(result))


# --- driver -------------------------------------------------------------------------------------------
def start_worker(args, frameworks, phase):
    cmd = [
        sys.executable, os.path.abspath(__file__), "--worker", "--frameworks", ",".join(frameworks),
        "--phase", phase, "--device", args.device, "--threads", str(args.threads), "--config", args.config,
        "--height", str(args.height), "--width", str(args.width), "--repeats", str(args.repeats),
        "--train-repeats", str(args.train_repeats), "--warmup", str(args.warmup),
        "--detections", str(args.detections), "--proposals", str(args.proposals), "--roi-batch", str(args.roi_batch),
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    proc.what = f"{'/'.join(frameworks)} {phase}"
    return proc


def finish_worker(proc):
    stdout, stderr = proc.communicate()
    lines = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        sys.stderr.write(stderr[-4000:])
        raise RuntimeError(f"the {proc.what} worker failed (exit code {proc.returncode})")
    return json.loads(lines[-1][len("RESULT "):])


def ratio(tv, dc):
    return tv / dc if dc > 0 else float("nan")


def print_table(results, args):
    dc, tv = results["detcore"], results.get("torchvision")
    unit = "MiB (CUDA max allocated)" if args.device == "cuda" else "MiB (peak RSS)"
    rows = [("inference " + s, f"infer.{s}_ms", "ms") for s in STAGES]
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

    def get(res, key):
        phase, field = key.split(".")
        return res[phase][field]

    print(f"\nMask R-CNN R50-FPN, {args.height}x{args.width}, device {args.device}, {args.threads} thread(s), "
          f"median of {args.repeats} (inference) / {args.train_repeats} (train) runs")
    print(f"detcore config: {os.path.relpath(args.config, ROOT)}")
    print("tv/detcore = torchvision / detcore: above 1, detcore is faster or smaller")
    print(f"{'':32} {'detcore':>12} {'torchvision':>12} {'tv/detcore':>11}  unit")
    for label, key, u in rows:
        d = get(dc, key)
        if tv is None:
            print(f"{label:32} {d:12.1f} {'-':>12} {'-':>11}  {u}")
        else:
            t = get(tv, key)
            print(f"{label:32} {d:12.1f} {t:12.1f} {ratio(t, d):11.2f}  {u}")
    for name, res in results.items():
        i = res["infer"]
        print(f"{name}: {i['proposals_per_image']} proposals and {i['detections_per_image']} detections per image; "
              f"{res['train']['trainable_params']:,} trainable parameters")
    print("Work is fixed, not learned: random weights, score threshold 0, "
          f"{args.proposals} proposals and {args.detections} detections per image on both; "
          "train step = forward + backward + SGD (lr 0) on 2 images with "
          f"{NUM_GT} objects each, {args.roi_batch} sampled ROIs per image, FrozenBN, 3 trainable backbone "
          "stages on both.")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--config", default=os.path.join(ROOT, "configs", "e2e_mask_rcnn_R_50_FPN_1x.yaml"))
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
        "--quick", action="store_true",
        help="smoke run (checks the tool, its ratios mean little): 128x192 image, 100 proposals, "
        "10 detections, 64 training ROIs per image, 1 repeat, no warmup",
    )
    parser.add_argument("--output", default=None, help="JSON path (default benchmark_results/model_<device>.json)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--frameworks", default="detcore,torchvision", help=argparse.SUPPRESS)
    parser.add_argument("--phase", choices=("time", "infer", "train"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.config = os.path.abspath(args.config)
    args.frameworks = args.frameworks.split(",")

    if args.worker:
        return worker(args)

    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is available")
    if args.quick:
        args.height, args.width = 128, 192
        args.proposals, args.detections, args.roi_batch = 100, 10, 64
        args.repeats = args.train_repeats = 1
        args.warmup = 0

    try:
        import torchvision  # noqa: F401

        frameworks = ("detcore", "torchvision")
    except ImportError:
        print("torchvision is not importable: timing detcore alone")
        frameworks = ("detcore",)

    load_before = os.getloadavg()
    print(f"timing {' and '.join(frameworks)}, alternating run by run ...", flush=True)
    results = finish_worker(start_worker(args, frameworks, "time"))
    jobs = [(framework, phase) for framework in frameworks for phase in ("infer", "train")]
    if args.quick:  # small models: measure all at once (each in its own process all the same)
        print("peak memory of each framework and phase ...", flush=True)
        procs = [start_worker(args, [framework], phase) for framework, phase in jobs]
        for (framework, phase), proc in zip(jobs, procs):
            results[framework][phase].update(finish_worker(proc))
    else:  # one at a time: at 800x1333 a training step takes several GB
        for framework, phase in jobs:
            print(f"peak memory of {framework} {phase} ...", flush=True)
            results[framework][phase].update(finish_worker(start_worker(args, [framework], phase)))
    load_after = os.getloadavg()
    print_table(results, args)

    import detcore

    record = {
        "benchmark": "model",
        "device": args.device,
        "device_name": torch.cuda.get_device_name() if args.device == "cuda" else cpu_name(),
        "stages": "each stage called in turn (the calls the models' forward makes), synchronized and timed apart",
        "threads": args.threads,
        "image": [args.height, args.width],
        "repeats": {"inference": args.repeats, "train": args.train_repeats, "warmup": args.warmup},
        "config": os.path.relpath(args.config, ROOT),
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
    path = args.output or os.path.join(ROOT, "benchmark_results", f"model_{args.device}.json")
    if args.quick and args.output is None:
        path = os.path.join(ROOT, "benchmark_results", f"model_{args.device}_quick.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(record, f, indent=2)
    print(f"saved {os.path.relpath(path, ROOT)}")


if __name__ == "__main__":
    main()
