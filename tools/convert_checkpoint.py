#!/usr/bin/env python
"""Convert a torchvision / detectron2 / maskrcnn-benchmark / Detectron / ImageNet checkpoint to detcore.

    python tools/convert_checkpoint.py model_final_f10217.pkl out/d2_mask_rcnn.pth \\
        --config-file configs/detectron2/mask_rcnn_R_50_FPN_1x.yaml
    python tools/convert_checkpoint.py maskrcnn_resnet50_fpn_coco.pth out/tv.pth \\
        --config-file configs/torchvision/mask_rcnn_R_50_FPN.yaml
    python tools/convert_checkpoint.py e2e_mask_rcnn_R_50_FPN_1x.pth out/mb.pth \\
        --config-file configs/maskrcnn_benchmark/e2e_mask_rcnn_R_50_FPN_1x.yaml
    python tools/convert_checkpoint.py resnet50.pth out/R-50.pth        # names only, no model

The format is recognized strictly from the keys (detcore/checkpoint/layouts.py: a file no known
layout fits is refused, naming the closest ones), or forced with --format. With --config-file the model
it describes is built on the CPU and the output holds exactly what fits it, with a table of every
key (mapped, missing, unexpected, shape mismatches, re-initialized predictors); without one every
tensor is renamed. MODEL.WEIGHTS accepts the original files as well: converting first only saves
the renaming at each start and lets you inspect the result.
"""
import argparse
import os
import sys

# Runnable from a checkout without installing: the repository root goes on the path.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from detcore.checkpoint import FORMATS, convert_state_dict, read_checkpoint  # noqa: E402


def build_cpu_model(config_file, opts):
    from detcore.config import get_cfg
    from detcore.modeling import build_model

    cfg = get_cfg()
    cfg.merge_from_file(config_file)
    cfg.merge_from_list(list(opts) + ["MODEL.DEVICE", "cpu", "MODEL.WEIGHTS", ""])
    return build_model(cfg)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("input", help="checkpoint to convert (.pth, .pt, .pkl)")
    parser.add_argument("output", help="where to write the detcore checkpoint (.pth)")
    parser.add_argument("--config-file", default="", help="detcore config of the model the weights are for")
    parser.add_argument("--format", default="auto", choices=("auto",) + FORMATS, help="checkpoint format")
    parser.add_argument("--ungrouped", action="store_true", help="one table row per key")
    parser.add_argument("opts", nargs="*", help="config overrides: KEY VALUE ...")
    args = parser.parse_intermixed_args(argv)

    state_dict, skipped = read_checkpoint(args.input)
    model = build_cpu_model(args.config_file, args.opts) if args.config_file else None
    converted, report = convert_state_dict(state_dict, model, format=args.format, source=args.input)
    report.dropped.extend((k, f"skipped: {why}") for k, why in skipped)
    print(report.table(group=not args.ungrouped))

    out_dir = os.path.dirname(os.path.abspath(args.output))
    os.makedirs(out_dir, exist_ok=True)
    tensors = {k: v.detach().cpu().contiguous() for k, v in converted.items()}
    torch.save({"model": tensors, "converted_from": {"path": args.input, "format": report.format}}, args.output)
    print(f"wrote {len(tensors)} tensors to {args.output}")
    return report


if __name__ == "__main__":
    main()
