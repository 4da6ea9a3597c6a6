"""``detcore demo``: draw a model's detections (boxes, masks, keypoints, class names, scores) on
images, saved as PNGs. ``tools/demo.py`` runs it.

    detcore demo --config-file configs/e2e_mask_rcnn_R_18_FPN_shapes.yaml \\
        --input imgs/ "more/*.jpg" one.png --output out/ MODEL.WEIGHTS model_final.pth
    detcore demo --model torchvision/mask_rcnn_R_50_FPN --input photo.jpg --output out/
"""
import argparse
import os
import re
from typing import Optional, Sequence

from detcore.engine import Predictor
from detcore.engine.arguments import add_config_argument, add_overrides_argument
from detcore.engine.demo import collect_image_paths, demo_config, demo_metadata, visualize_images
from detcore.utils.argtypes import integer, number
from detcore.utils.logger import setup_logger

DESCRIPTION = "Draw a model's detections (boxes, masks, keypoints, class names, scores) on images, saved as PNGs."

_CONFIG_KEY = re.compile(r"^[A-Z][A-Z0-9_]*(\.[A-Z0-9_]+)+$")


def build_parser(prog: Optional[str] = None, description: Optional[str] = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=description or DESCRIPTION)
    add_config_argument(parser, required=False, help="the yaml config: a path or a preset's name (default: the --model's preset)")
    parser.add_argument(
        "--model", metavar="NAME",
        help="a model zoo name (e.g. torchvision/mask_rcnn_R_50_FPN; detcore download --list shows "
        "them): its weights, downloaded once, and its preset config unless --config-file is given",
    )
    parser.add_argument("--input", required=True, nargs="+", help="image files, folders or glob patterns")
    parser.add_argument("--output", required=True, help="folder for the PNGs (created if missing)")
    parser.add_argument(
        "--confidence-threshold", type=number(0.0, 1.0), default=0.5, help="draw detections scoring at least this (0..1)"
    )
    parser.add_argument(
        "--keypoint-threshold", type=number(), default=None,
        help="draw predicted keypoints whose score (heatmap logit) is at least this (default: all)",
    )
    parser.add_argument("--max-images", type=integer(0), default=0, help="only the first N images (0: all)")
    parser.add_argument(
        "--picture-min-size", type=integer(0), default=480, metavar="PIXELS",
        help="draw images whose short side is smaller enlarged by a whole factor to at least this, so that "
        "labels do not cover small objects (default 480; 0: every image at its own size)",
    )
    parser.add_argument(
        "--allow-random-weights", action="store_true",
        help="draw the predictions of an untrained model when MODEL.WEIGHTS is empty (otherwise refused)",
    )
    add_overrides_argument(parser, help="KEY VALUE overrides; set MODEL.WEIGHTS")
    return parser


def parse_args(argv: Optional[Sequence[str]] = None, prog: Optional[str] = None, description: Optional[str] = None):
    parser = build_parser(prog, description)
    args = parser.parse_args(argv)
    # "--input a.png MODEL.WEIGHTS x.pth" (overrides right after the inputs): nargs="+" took
    # the overrides as inputs; move everything from the first config key on back to opts.
    for i, item in enumerate(args.input):
        if _CONFIG_KEY.match(item) and not os.path.exists(item):
            args.input, args.opts = args.input[:i], args.input[i:] + args.opts
            break
    if not args.input:
        parser.error("--input needs at least one image file, folder or glob pattern")
    if not args.config_file and not args.model:
        parser.error("give --config-file FILE, --model NAME (a model zoo name), or both")
    return args


def main(args):
    setup_logger()
    cfg = demo_config(args.config_file, args.model, args.opts)
    cfg.freeze()
    if not cfg.MODEL.WEIGHTS and not args.allow_random_weights:
        raise SystemExit(
            "MODEL.WEIGHTS is empty, so the model would have random weights and draw noise. Give the "
            "checkpoint (MODEL.WEIGHTS path/to/model_final.pth, or --model NAME), or add --allow-random-weights "
            "if that is the intent."
        )
    paths = collect_image_paths(args.input)
    if args.max_images > 0:
        paths = paths[: args.max_images]
    written = visualize_images(
        Predictor(cfg), paths, args.output, score_threshold=args.confidence_threshold, min_size=args.picture_min_size,
        keypoint_threshold=args.keypoint_threshold, **demo_metadata(cfg),
    )
    print(f"Wrote {len(written)} picture(s) to {os.path.abspath(args.output)}")
    return written


run = main
