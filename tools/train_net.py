#!/usr/bin/env python
"""Train a detcore model, or evaluate one (--eval-only).

    python tools/train_net.py --config-file configs/e2e_mask_rcnn_R_18_FPN_shapes.yaml
    python tools/train_net.py --config-file X --resume                 # continue after a crash
    python tools/train_net.py --config-file X --start-over             # retrain; the old run moves aside
    python tools/train_net.py --config-file X --eval-only MODEL.WEIGHTS out/model_final.pth
    torchrun --nproc_per_node 2 tools/train_net.py --config-file X    # distributed (DDP)
    python tools/train_net.py --config-file X --num-gpus 2            # the same; torchrun is started for you

Outputs go to OUTPUT_DIR: log.txt, config.yaml, metrics.json, loss_curves.png, checkpoints
(model_XXXXXXX.pth, model_final.pth, last_checkpoint) and inference/<dataset>/ results.
Installed, the same program is `detcore train` (detcore/cli/train.py).
"""
import os
import sys

# Runnable from a checkout without installing: the repository root goes on the path.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from detcore.cli import train as _command  # noqa: E402
from detcore.engine import launch  # noqa: E402

# The program is detcore/cli/train.py (also ``detcore train``); this script runs it.
setup = _command.setup
main = _command.main


def parse_args(argv=None):
    return _command.parse_args(argv, description=__doc__.splitlines()[0])


if __name__ == "__main__":
    launch(main, parse_args())
