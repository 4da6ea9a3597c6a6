"""``detcore convert``: convert a torchvision / detectron2 / maskrcnn-benchmark / Detectron /
ImageNet checkpoint to detcore. ``tools/convert_checkpoint.py`` runs it.

    detcore convert model_final_f10217.pkl out/d2_mask_rcnn.pth \\
        --config-file configs/detectron2/mask_rcnn_R_50_FPN_1x.yaml
    detcore convert maskrcnn_resnet50_fpn_coco.pth out/tv.pth --config-file torchvision/mask_rcnn_R_50_FPN.yaml
    detcore convert resnet50.pth out/R-50.pth        # names only, no model

The format is recognized strictly from the keys (detcore/checkpoint/layouts.py: a file no known
layout fits is refused, naming the closest ones), or forced with --format. With --config-file the model
it describes is built on the CPU and the output holds exactly what fits it, with a table of every
key (mapped, missing, unexpected, shape mismatches, re-initialized predictors); without one every
tensor is renamed. MODEL.WEIGHTS accepts the original files as well: converting first only saves
the renaming at each start and lets you inspect the result.
"""
import argparse
import os
from typing import Optional, Sequence

import torch

from detcore.checkpoint import FORMATS, convert_state_dict, read_checkpoint
from detcore.engine.arguments import add_config_argument

DESCRIPTION = "Convert a torchvision / detectron2 / maskrcnn-benchmark / Detectron / ImageNet checkpoint to detcore."


def build_parser(prog: Optional[str] = None, description: Optional[str] = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=description or DESCRIPTION)
    parser.add_argument("input", help="checkpoint to convert (.pth, .pt, .pkl)")
    parser.add_argument("output", help="where to write the detcore checkpoint (.pth)")
    add_config_argument(parser, required=False, help="detcore config of the model the weights are for (a path or a preset's name)")
    parser.add_argument("--format", default="auto", choices=("auto",) + FORMATS, help="checkpoint format")
    parser.add_argument("--ungrouped", action="store_true", help="one table row per key")
    # "*", not the other commands' REMAINDER: overrides may come before the options here.
    parser.add_argument("opts", nargs="*", help="config overrides: KEY VALUE ...")
    return parser


def parse_args(argv: Optional[Sequence[str]] = None, prog: Optional[str] = None, description: Optional[str] = None):
    args = build_parser(prog, description).parse_intermixed_args(argv)
    args.config_file = args.config_file or ""
    return args


def build_cpu_model(config_file, opts):
    from detcore.config import get_cfg
    from detcore.modeling import build_model

    cfg = get_cfg()
    cfg.merge_from_file(config_file)
    cfg.merge_from_list(list(opts) + ["MODEL.DEVICE", "cpu", "MODEL.WEIGHTS", ""])
    return build_model(cfg)


def main(args):
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


run = main
