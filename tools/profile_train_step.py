#!/usr/bin/env python
"""Profile training iterations of a config, by stage: where does an iteration's time go?

    python tools/profile_train_step.py --config-file configs/e2e_mask_rcnn_R_18_FPN_shapes.yaml
    python tools/profile_train_step.py --config-file X --iters 10 --ops 25 MODEL.ROI_MASK_HEAD.NUM_CONV 2

Builds the model, optimizer and training loader of the config (KEY VALUE overrides as in
train_net.py), runs --warmup iterations untimed, then --iters timed ones, and prints the median
seconds per iteration of each stage: waiting for data, the forward of each top-level part
(backbone, proposal generator, ROI heads: box, mask and keypoint branches; RetinaNet's dense head), backward, optimizer step.
With --ops N it also runs one more iteration under torch.profiler and prints the N operators
with the most self CPU time (forward and backward), which is what says *why* a stage is slow.
Nothing is written to disk; the model is trained for the iterations it runs, from scratch.
"""
import argparse
import os
import statistics
import sys
import time
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from detcore.config import get_cfg  # noqa: E402
from detcore.data import build_detection_train_loader  # noqa: E402
from detcore.modeling import build_model  # noqa: E402
from detcore.solver import build_optimizer  # noqa: E402


def _timed(module, name, times):
    """Wrap ``module.forward`` so each call adds its wall time to ``times[name]``."""
    forward = module.forward

    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        out = forward(*args, **kwargs)
        times[name] += time.perf_counter() - start
        return out

    module.forward = wrapper


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config-file", required=True, metavar="FILE")
    parser.add_argument("--warmup", type=int, default=3, help="untimed iterations first (allocator, caches)")
    parser.add_argument("--iters", type=int, default=5, help="timed iterations")
    parser.add_argument("--ops", type=int, default=0, help="also print the N operators with most self CPU time")
    parser.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: leave torch's default)")
    parser.add_argument("opts", nargs=argparse.REMAINDER, default=[], help="config overrides, KEY VALUE ...")
    args = parser.parse_args()
    if args.iters < 1 or args.warmup < 0:
        parser.error("--iters must be >= 1 and --warmup >= 0")

    cfg = get_cfg()
    cfg.merge_from_file(args.config_file)
    cfg.merge_from_list(args.opts)
    cfg.freeze()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    model = build_model(cfg)
    model.train()
    optimizer = build_optimizer(cfg, model)
    loader = iter(build_detection_train_loader(cfg))

    times = defaultdict(float)
    _timed(model.backbone, "forward: backbone", times)
    # R-CNNs have a proposal generator and ROI heads, RetinaNet its dense head (the losses are
    # the rest of its forward).
    if getattr(model, "proposal_generator", None) is not None:
        _timed(model.proposal_generator, "forward: proposal generator", times)
    if getattr(model, "head", None) is not None:
        _timed(model.head, "forward: dense head", times)
    roi = getattr(model, "roi_heads", None)
    if roi is not None:
        _timed(roi, "forward: roi heads (all)", times)
        for part in ("box_pooler", "box_head", "box_predictor", "mask_pooler", "mask_head", "keypoint_pooler", "keypoint_head"):
            if hasattr(roi, part):
                _timed(getattr(roi, part), f"  roi: {part}", times)

    def step():
        start = time.perf_counter()
        data = next(loader)
        times["data wait"] += time.perf_counter() - start
        start = time.perf_counter()
        # Mixed precision as SimpleTrainer does it (SOLVER.AMP; no grad scaler needed for bfloat16).
        amp = cfg.SOLVER.AMP
        dtype = torch.bfloat16 if amp.DTYPE == "bfloat16" else torch.float16
        with torch.autocast(device_type=torch.device(cfg.MODEL.DEVICE).type, dtype=dtype, enabled=amp.ENABLED):
            losses = model(data)
        times["forward: total"] += time.perf_counter() - start
        total = sum(v.float() for v in losses.values())
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        total.backward()
        times["backward"] += time.perf_counter() - start
        start = time.perf_counter()
        optimizer.step()
        times["optimizer step"] += time.perf_counter() - start
        return {k: float(v.detach()) for k, v in losses.items()}

    for _ in range(args.warmup):
        step()
    per_stage = defaultdict(list)
    totals = []
    for _ in range(args.iters):
        times.clear()
        start = time.perf_counter()
        losses = step()
        totals.append(time.perf_counter() - start)
        for k, v in times.items():
            per_stage[k].append(v)

    print(f"config: {args.config_file} {' '.join(args.opts)}")
    print(f"threads: {torch.get_num_threads()}, images per batch: {cfg.SOLVER.IMS_PER_BATCH}, "
          f"median of {args.iters} iterations after {args.warmup} warm-up")
    total = statistics.median(totals)
    print(f"{'stage':<34}{'s/it':>9}{'share':>8}")
    order = ["data wait", "forward: total", "forward: backbone", "forward: proposal generator",
             "forward: dense head", "forward: roi heads (all)"] + sorted(k for k in per_stage if k.startswith("  roi")) + [
             "backward", "optimizer step"]
    for k in order:
        if k in per_stage:
            v = statistics.median(per_stage[k])
            print(f"{k:<34}{v:>9.3f}{100 * v / total:>7.1f}%")
    print(f"{'iteration':<34}{total:>9.3f}")
    print("last losses: " + ", ".join(f"{k} {v:.3f}" for k, v in losses.items()))

    if args.ops > 0:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            step()
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.ops))


if __name__ == "__main__":
    main()
