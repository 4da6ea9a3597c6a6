"""``detcore test``: evaluate a checkpoint on the config's DATASETS.TEST and print its AP.
``tools/test_net.py`` runs it.

    detcore test --config-file configs/e2e_mask_rcnn_R_18_FPN_shapes.yaml \\
        MODEL.WEIGHTS output/e2e_mask_rcnn_R_18_FPN_shapes/model_final.pth
    detcore test --config-file X --num-gpus 2 MODEL.WEIGHTS ckpt.pth     # or torchrun
    detcore test --exported exported/ --threads 2                         # an export, by its runtime

Results are also saved under OUTPUT_DIR/inference/<dataset>/ (predictions and metrics json, and
pictures of the evaluation: PR curves, per-class AP, confusion matrix, the images with the most
errors; TEST.EVAL_PICTURES False leaves them out).
A ProposalNetwork (RPN-only) config is scored by its proposals' recall (AR@100 / AR@1000, all and
by object size); `--proposal-recall` adds that of an R-CNN's RPN to its AP (a second pass over the
data, in OUTPUT_DIR/inference/<dataset>_proposals/).

`--exported DIR` evaluates an export (``detcore export``'s folder, any format) instead, through
its runtime, with the config and datasets recorded in its export.json (KEY VALUE overrides, e.g.
DATASETS.TEST "('shapes_val',)"); results go to DIR/evaluation/ unless OUTPUT_DIR is given.
"""
import argparse
import os
from typing import Optional, Sequence

from detcore.config import get_cfg
from detcore.data import dataset_folder_name
from detcore.engine import DefaultTrainer, default_setup, format_results, launch, load_model_weights
from detcore.engine.arguments import add_config_argument, add_machine_arguments, add_overrides_argument
from detcore.modeling import ProposalNetwork
from detcore.utils import comm

DESCRIPTION = "Evaluate a checkpoint on the config's DATASETS.TEST and print its AP."


def build_parser(prog: Optional[str] = None, description: Optional[str] = None) -> argparse.ArgumentParser:
    # No --resume here: default_setup reads its absence as "an evaluation" (config.yaml is left alone).
    parser = argparse.ArgumentParser(prog=prog, description=description or DESCRIPTION)
    add_config_argument(parser, required=False, help="the yaml config: a path or a preset's name (not with --exported)")
    parser.add_argument(
        "--proposal-recall", action="store_true",
        help="also report the proposal recall (AR@100/AR@1000) of a two-stage model's RPN",
    )
    parser.add_argument(
        "--exported", metavar="DIR",
        help="evaluate the export in DIR (TorchScript, .pt2, ONNX or OpenVINO) with its export.json's config",
    )
    parser.add_argument("--threads", type=int, default=None, help="CPU threads of the export's runtime (--exported)")
    add_machine_arguments(parser)
    add_overrides_argument(parser, help="KEY VALUE overrides; set MODEL.WEIGHTS")
    return parser


def parse_args(argv: Optional[Sequence[str]] = None, prog: Optional[str] = None, description: Optional[str] = None):
    return build_parser(prog, description).parse_args(argv)


def main(args):
    if args.exported or not args.config_file:
        return _test_exported(args)
    cfg = get_cfg()
    cfg.merge_from_file(args.config_file)
    cfg.merge_from_list(args.opts)
    cfg.freeze()
    if not cfg.MODEL.WEIGHTS:
        raise SystemExit("give the checkpoint to evaluate as MODEL.WEIGHTS path/to/model.pth")
    default_setup(cfg, args)
    model = DefaultTrainer.build_model(cfg)
    load_model_weights(model, cfg.MODEL.WEIGHTS, all_ranks=True)
    results = DefaultTrainer.test(cfg, model)
    if args.proposal_recall and not isinstance(comm.unwrap_model(model), ProposalNetwork):
        results = _merge(results, _rpn_recall(cfg, model), len(cfg.DATASETS.TEST))
    _print(cfg, results)
    return results


def run(args):
    return launch(main, args)


def _print(cfg, results):
    if comm.is_main_process():
        print(format_results(results if len(cfg.DATASETS.TEST) == 1 else {
            f"{name}/{task}": m for name, r in results.items() for task, m in r.items()
        }))


def _test_exported(args):
    """The AP of an exported artefact, run by its own runtime (detcore/export/exported_detector.py)."""
    from detcore.export import ExportedDetector, exported_config, load_exported

    if not args.exported or args.config_file or args.proposal_recall:
        raise SystemExit("give --config-file (a checkpoint's config), or --exported DIR alone (the "
                         "export's config is in its export.json; --proposal-recall needs the model's RPN)")
    runner = load_exported(args.exported, args.threads)
    cfg = exported_config(runner.metadata, args.exported, args.opts)
    default_setup(cfg, args)
    results = DefaultTrainer.test(cfg, ExportedDetector(runner))
    _print(cfg, results)
    return results


def _rpn_recall(cfg, model):
    """The recall of the model's proposals: its backbone and RPN run as a ProposalNetwork."""
    rpn = ProposalNetwork.from_detector(comm.unwrap_model(model))
    evaluators = [
        DefaultTrainer.build_evaluator(
            cfg, name, os.path.join(cfg.OUTPUT_DIR, "inference", f"{dataset_folder_name(name)}_proposals"),
            tasks=("box_proposals",),
        )
        for name in cfg.DATASETS.TEST
    ]
    return DefaultTrainer.test(cfg, rpn, evaluators)


def _merge(results, recall, num_datasets):
    """Add the recall task to each dataset's results (``test`` nests by dataset only for several)."""
    if num_datasets == 1:
        return {**results, **recall}
    return {name: {**results[name], **recall[name]} for name in results}
