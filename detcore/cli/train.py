"""``detcore train``: train a model, or evaluate one (--eval-only). ``tools/train_net.py`` runs it.

    detcore train --config-file configs/e2e_mask_rcnn_R_18_FPN_shapes.yaml   # or a preset's name
    detcore train --config-file X --resume                 # continue after a crash
    detcore train --config-file X --start-over             # retrain; the old run moves aside
    detcore train --config-file X --eval-only MODEL.WEIGHTS out/model_final.pth
    detcore train --config-file X --num-gpus 2             # distributed (DDP, through torchrun)

Outputs go to OUTPUT_DIR: log.txt, config.yaml, metrics.json, loss_curves.png, checkpoints
(model_XXXXXXX.pth, model_final.pth, last_checkpoint) and inference/<dataset>/ results.
"""
from typing import Optional, Sequence

from detcore.config import get_cfg
from detcore.engine import DefaultTrainer, default_argument_parser, default_setup, launch
from detcore.engine.checkpointer import Checkpointer

DESCRIPTION = "Train a detcore model, or evaluate one (--eval-only)."


def build_parser(prog: Optional[str] = None, description: Optional[str] = None):
    parser = default_argument_parser(description or DESCRIPTION)
    parser.prog = prog or parser.prog
    return parser


def parse_args(argv: Optional[Sequence[str]] = None, prog: Optional[str] = None, description: Optional[str] = None):
    return build_parser(prog, description).parse_args(argv)


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


def run(args):
    return launch(main, args)
