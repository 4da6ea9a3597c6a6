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

Installed, the same program is `detcore convert` (detcore/cli/convert.py).
"""
import os
import sys

# Runnable from a checkout without installing: the repository root goes on the path.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from detcore.cli import convert as _command  # noqa: E402

# The program is detcore/cli/convert.py (also ``detcore convert``); this script runs it.
build_cpu_model = _command.build_cpu_model


def parse_args(argv=None):
    return _command.parse_args(argv, description=__doc__.splitlines()[0])


def main(argv=None):
    return _command.main(parse_args(argv))


if __name__ == "__main__":
    main()
