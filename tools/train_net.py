#!/usr/bin/env python
"""Train a detcore model, or evaluate one (--eval-only).

    python tools/train_net.py --config-file configs/e2e_mask_rcnn_R_18_FPN_shapes.yaml
    python tools/train_net.py --config-file X --resume                 # continue after a crash
    python tools/train_net.py --config-file X --start-over             # retrain; the old run moves aside
    python tools/train_net.py --config-file X --eval-only MODEL.WEIGHTS out/model_final.pth
    torchrun --nproc_per_node 2 tools/train_net.py --config-file X    # distributed (DDP)

Outputs go to OUTPUT_DIR: log.txt, config.yaml, metrics.json, loss_curves.png, checkpoints
(model_XXXXXXX.pth, model_final.pth, last_checkpoint) and inference/<dataset>/ results.
"""
import os
import sys

# Runnable from a checkout without installing: the repository root goes on the path.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from detcore.config import get_cfg  # noqa: E402
from detcore.engine import DefaultTrainer, default_argument_parser, default_setup, launch  # noqa: E402
from detcore.engine.checkpointer import Checkpointer  # noqa: E402


def setup(args):
    cfg = get_cfg()
    cfg.merge_from_file(args.config_file)
    cfg.merge_from_list(args.opts)
    cfg.freeze()
    default_setup(cfg, args)
    return cfg


def main(args):
    cfg = setup(args)
    if args.eval_only:
        model = DefaultTrainer.build_model(cfg)
        checkpointer = Checkpointer(model, cfg.OUTPUT_DIR)
        if not cfg.MODEL.WEIGHTS and not (args.resume and checkpointer.has_checkpoint()):
            raise SystemExit("--eval-only needs weights: MODEL.WEIGHTS path/to/model.pth (or --resume with a checkpoint in OUTPUT_DIR)")
        checkpointer.resume_or_load(cfg.MODEL.WEIGHTS, resume=args.resume)
        return DefaultTrainer.test(cfg, model)
    trainer = DefaultTrainer(cfg)
    trainer.resume_or_load(resume=args.resume, start_over=args.start_over)
    return trainer.train()


if __name__ == "__main__":
    launch(main, default_argument_parser(__doc__.splitlines()[0]).parse_args())
