#!/usr/bin/env python
"""Profile training iterations of a config, by stage: where does an iteration's time go?

    python benchmarks/profile_train_step.py --config-file configs/e2e_mask_rcnn_R_18_FPN_shapes.yaml
    python benchmarks/profile_train_step.py --config-file X --iters 10 --ops 25 MODEL.ROI_MASK_HEAD.NUM_CONV 2

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
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(1, os.path.dirname(os.path.abspath(__file__)))  # the timing helper beside this script

import torch  # noqa: E402

from detcore.config import get_cfg  # noqa: E402
from detcore.data import build_detection_train_loader  # noqa: E402
from detcore.modeling import build_model  # noqa: E402
from detcore.solver import build_optimizer  # noqa: E402
from benchmark_timing import median, timed_ms  # noqa: E402


def _timed(module, name, times, device):
    """Wrap ``module.forward`` so each call adds its wall time (seconds) to ``times[name]``."""
    forward = module.forward

    def wrapper(*args, **kwargs):
        out, ms = timed_ms(lambda: forward(*args, **kwargs), device)
        times[name] += ms / 1000
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
    device = torch.device(cfg.MODEL.DEVICE)
    _timed(model.backbone, "forward: backbone", times, device)
    # R-CNNs have a proposal generator and ROI heads, RetinaNet its dense head (the losses are
    # the rest of its forward).
    if getattr(model, "proposal_generator", None) is not None:
        _timed(model.proposal_generator, "forward: proposal generator", times, device)
    if getattr(model, "head", None) is not None:
        _timed(model.head, "forward: dense head", times, device)
    roi = getattr(model, "roi_heads", None)
    if roi is not None:
        _timed(roi, "forward: roi heads (all)", times, device)
        for part in ("box_pooler", "box_head", "box_predictor", "mask_pooler", "mask_head", "keypoint_pooler", "keypoint_head"):
            if hasattr(roi, part):
                _timed(getattr(roi, part), f"  roi: {part}", times, device)

    def step():
        data, ms = timed_ms(lambda: next(loader))
        times["data wait"] += ms / 1000
        # Mixed precision as SimpleTrainer does it (SOLVER.AMP; no grad scaler needed for bfloat16).
        amp = cfg.SOLVER.AMP
        dtype = torch.bfloat16 if amp.DTYPE == "bfloat16" else torch.float16

        def forward():
            with torch.autocast(device_type=device.type, dtype=dtype, enabled=amp.ENABLED):
                return model(data)

        losses, ms = timed_ms(forward, device)
        times["forward: total"] += ms / 1000
        total = sum(v.float() for v in losses.values())

        def backward():
            optimizer.zero_grad(set_to_none=True)
            total.backward()

        times["backward"] += timed_ms(backward, device)[1] / 1000
        times["optimizer step"] += timed_ms(optimizer.step, device)[1] / 1000
        return {k: float(v.detach()) for k, v in losses.items()}

    for _ in range(args.warmup):
        step()
    per_stage = defaultdict(list)
    totals = []
    for _ in range(args.iters):
        times.clear()
        losses, ms = timed_ms(step, device)
        totals.append(ms / 1000)
        for k, v in times.items():
            per_stage[k].append(v)

    print(f"config: {args.config_file} {' '.join(args.opts)}")
    print(f"threads: {torch.get_num_threads()}, images per batch: {cfg.SOLVER.IMS_PER_BATCH}, "
          f"median of {args.iters} iterations after {args.warmup} warm-up")
    total = median(totals)
    print(f"{'stage':<34}{'s/it':>9}{'share':>8}")
    order = ["data wait", "forward: total", "forward: backbone", "forward: proposal generator",
             "forward: dense head", "forward: roi heads (all)"] + sorted(k for k in per_stage if k.startswith("  roi")) + [
             "backward", "optimizer step"]
    for k in order:
        if k in per_stage:
            v = median(per_stage[k])
            print(f"{k:<34}{v:>9.3f}{100 * v / total:>7.1f}%")
    print(f"{'iteration':<34}{total:>9.3f}")
    print("last losses: " + ", ".join(f"{k} {v:.3f}" for k, v in losses.items()))

    if args.ops > 0:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            step()
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.ops))


if __name__ == "__main__":
    main()
