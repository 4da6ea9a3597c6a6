#!/usr/bin/env python
"""Export a detector to TorchScript (.ts), torch.export's ExportedProgram (.pt2), ONNX (.onnx) or OpenVINO (.xml), with export.json.

    python tools/export_model.py --config-file configs/e2e_mask_rcnn_R_18_FPN_shapes.yaml \
        --format onnx --output exported/ MODEL.WEIGHTS output/e2e_mask_rcnn_R_18_FPN_shapes/model_final.pth

The exported graph takes one uint8 image (3 channels in INPUT.FORMAT order; --input-layout CHW or
HWC) of any size, already resized as export.json says (with --input-contract raw_image, for onnx
and openvino: as it is, the graph resizes it), and returns boxes, scores, classes (and mask
probabilities). See the README's "Deploy" section.

Installed, the same program is `detcore export` (detcore/cli/export.py).
"""
import os
import sys

# Runnable from a checkout without installing: the repository root goes on the path.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from detcore.cli import export as _command  # noqa: E402

# The program is detcore/cli/export.py (also ``detcore export``); this script runs it.


def parse_args(argv=None):
    return _command.parse_args(argv, description=__doc__.splitlines()[0])


def main(argv=None):
    return _command.run(parse_args(argv))


if __name__ == "__main__":
    main()
