#!/usr/bin/env python
"""Evaluate a checkpoint on the config's DATASETS.TEST and print its AP.

    python tools/test_net.py --config-file configs/e2e_mask_rcnn_R_18_FPN_shapes.yaml \
        MODEL.WEIGHTS output/e2e_mask_rcnn_R_18_FPN_shapes/model_final.pth
    torchrun --nproc_per_node 2 tools/test_net.py --config-file X MODEL.WEIGHTS ckpt.pth

Results are also saved under OUTPUT_DIR/inference/<dataset>/ (predictions and metrics json, and
pictures of the evaluation: PR curves, per-class AP, confusion matrix, the images with the most
errors; TEST.EVAL_PICTURES False leaves them out).
A ProposalNetwork (RPN-only) config is scored by its proposals' recall (AR@100 / AR@1000, all and
by object size); `--proposal-recall` adds that of an R-CNN's RPN to its AP (a second pass over the
data, in OUTPUT_DIR/inference/<dataset>_proposals/).

`--exported DIR` evaluates an export (tools/export_model.py's folder, any format) instead, through
its runtime, with the config and datasets recorded in its export.json (KEY VALUE overrides, e.g.
DATASETS.TEST "('shapes_val',)"); results go to DIR/evaluation/ unless OUTPUT_DIR is given:

    python tools/test_net.py --exported exported/ --threads 2

Installed, the same program is `detcore test` (detcore/cli/evaluate.py).
"""
import os
import sys

# Runnable from a checkout without installing: the repository root goes on the path.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from detcore.cli import evaluate as _command  # noqa: E402
from detcore.engine import launch  # noqa: E402

# The program is detcore/cli/evaluate.py (also ``detcore test``); this script runs it.
main = _command.main


def parse_args(argv=None):
    return _command.parse_args(argv, description=__doc__.splitlines()[0])


if __name__ == "__main__":
    launch(main, parse_args())
