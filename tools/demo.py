#!/usr/bin/env python
"""Draw a model's detections (boxes, masks, keypoints, class names, scores) on images, saved as PNGs.

    python tools/demo.py --config-file configs/e2e_mask_rcnn_R_18_FPN_shapes.yaml \
        --input imgs/ "more/*.jpg" one.png --output out/ MODEL.WEIGHTS model_final.pth
    python tools/demo.py --model torchvision/mask_rcnn_R_50_FPN --input photo.jpg --output out/

Installed, the same program is `detcore demo` (detcore/cli/demo.py).
"""
import os
import sys

# Runnable from a checkout without installing: the repository root goes on the path.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from detcore.cli import demo as _command  # noqa: E402

# The program is detcore/cli/demo.py (also ``detcore demo``); this script runs it.


def parse_args(argv=None):
    return _command.parse_args(argv, description=__doc__.splitlines()[0])


def main(argv=None):
    return _command.main(parse_args(argv))


if __name__ == "__main__":
    main()
