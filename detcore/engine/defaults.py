"""The standard training setup: run setup, launch, and ``DefaultTrainer``.

``detcore train`` (detcore/cli/train.py, also ``tools/train_net.py``) is essentially::

    args = default_argument_parser().parse_args()     # arguments.py
    launch(main, args)            # main: cfg = setup(args); DefaultTrainer(cfg) ... train()

``default_setup`` joins the process group when started by torchrun, so the same command runs
on one process or many (``torchrun --nproc_per_node N tools/train_net.py ...``, or
``--num-gpus N``, which has ``launch`` start torchrun).
"""
import argparse
import inspect
import logging
import os
import random
import subprocess
import sys
from collections import OrderedDict
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from detcore.config import resolve_config_file
from detcore.data import MetadataCatalog, build_detection_test_loader, build_detection_train_loader, dataset_folder_name
from detcore.data.samplers import TrainingBatchSampler
from detcore.evaluation import (
    EVALUATOR_TYPES,
    CityscapesInstanceEvaluator,
    COCOEvaluator,
    DatasetEvaluator,
    DatasetEvaluators,
    PascalVOCDetectionEvaluator,
)
from detcore.modeling import META_ARCH_REGISTRY, GeneralizedRCNNWithTTA, ProposalNetwork, build_model
from detcore.solver import build_gradient_clipper, build_lr_scheduler, build_optimizer
from detcore.utils import comm
from detcore.utils.logger import setup_logger
from detcore.utils.registry import build_from_config

from . import hooks
from .arguments import default_argument_parser, torchrun_command, wants_torchrun
from .checkpointer import Checkpointer
from .dataset_classes import check_dataset_classes
from .divergence import DivergenceGuard
from .events import CommonMetricPrinter, JSONWriter, TensorboardWriter
from .inference import format_results, inference_on_dataset
from .output_dir import check_new_run, lock_output_dir
from .train_loop import SimpleTrainer, TrainerBase

__all__ = [
    "default_argument_parser",
    "default_setup",
    "seed_all_rng",
    "launch",
    "create_ddp_model",
    "DefaultTrainer",
    "METRICS_FILE",
    "LOSS_CURVE_FILE",
]

logger = logging.getLogger(__name__)

METRICS_FILE = "metrics.json"
LOSS_CURVE_FILE = "loss_curves.png"


def seed_all_rng(seed: Optional[int] = None) -> int:
    """Seed python, numpy and torch (all devices); ``None`` draws a fresh seed. Returns it."""
    if seed is None or seed < 0:
        seed = int.from_bytes(os.urandom(4), "big") % 2**31
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # all CUDA devices too
    return seed


def default_setup(cfg, args: Optional[argparse.Namespace] = None) -> None:
    """Everything a run does before building the model:

    joins the process group (torchrun), creates OUTPUT_DIR and, for a training run (``args``
    with ``resume`` and without ``eval_only``), takes it for this run (``output_dir.py``: a
    lock against a concurrent run; a new run refuses a folder holding another run's
    checkpoints unless ``args.start_over``). Then logs to the console and OUTPUT_DIR/log.txt,
    logs the environment, arguments and config, saves config.yaml (not for an evaluation: it
    must not replace the config of the run it evaluates), and seeds the RNGs
    (SEED < 0: a random seed, logged; every rank gets seed + rank).
    """
    comm.resolve_device(cfg.MODEL.DEVICE)  # before anything else: a missing GPU is a one-line error
    comm.init_distributed(cfg.MODEL.DEVICE)
    rank = comm.get_rank()
    output_dir = cfg.OUTPUT_DIR
    # train_net-style arguments say whether this trains (takes the folder) or only evaluates.
    evaluation = args is not None and (getattr(args, "eval_only", False) or not hasattr(args, "resume"))
    training = args is not None and not evaluation
    if comm.is_main_process() and output_dir:
        os.makedirs(output_dir, exist_ok=True)
        if training:
            lock_output_dir(output_dir)
            if not args.resume:
                check_new_run(output_dir, start_over=getattr(args, "start_over", False))
    comm.synchronize()
    setup_logger(output_dir or None, distributed_rank=rank)

    from detcore.utils.collect_env import collect_env_info

    logger.info("Rank of this process: %d; world size: %d", rank, comm.get_world_size())
    logger.info("Environment:\n%s", collect_env_info())
    if args is not None:
        logger.info("Command line arguments: %s", args)
        if getattr(args, "config_file", None):
            with open(resolve_config_file(args.config_file)) as f:
                logger.info("Contents of %s:\n%s", args.config_file, f.read())
    logger.info("Full config:\n%s", cfg.dump())
    if comm.is_main_process() and output_dir and not evaluation:
        path = os.path.join(output_dir, "config.yaml")
        with open(path, "w") as f:
            f.write(cfg.dump())
        logger.info("Config saved to %s", path)

    seed = seed_all_rng(None if cfg.SEED < 0 else cfg.SEED + rank)
    logger.info("Random seed of this process: %d%s", seed, " (SEED < 0: drawn at random)" if cfg.SEED < 0 else "")


def launch(main_func: Callable[..., Any], *args: Any) -> Any:
    """Run ``main_func(*args)`` and leave the process group (if it joined one) afterwards.

    Processes are started by torchrun; ``default_setup`` joins the group. When the first argument
    is a parsed command line asking for more processes than this one (``--num-gpus 2``) and
    torchrun has not started it, the same command runs again under torchrun (arguments.py), and
    this process exits with its status."""
    if args and isinstance(args[0], argparse.Namespace) and wants_torchrun(args[0]):
        spec = getattr(sys.modules.get("__main__"), "__spec__", None)
        module = spec.name[: -len(".__main__")] if spec is not None and spec.name.endswith(".__main__") else None
        cmd = torchrun_command(args[0], sys.argv, module or (spec.name if spec is not None else None))
        print(f"Starting the processes: {' '.join(cmd)}", file=sys.stderr, flush=True)  # no logger is set up yet
        raise SystemExit(subprocess.call(cmd))
    try:
        return main_func(*args)
    finally:
        comm.destroy_distributed()


def create_ddp_model(model: nn.Module) -> nn.Module:
    """``model`` wrapped in DistributedDataParallel when there are several processes."""
    if comm.get_world_size() == 1:
        return model
    device_ids = [comm.get_local_rank()] if next(model.parameters()).device.type == "cuda" else None
    # No buffer broadcast in forward: buffers (FrozenBN statistics, pixel mean) never change, and
    # a broadcast in every forward would hang evaluation, where ranks run unequal numbers of
    # batches. Newer torch names the switch forward_sync_buffers (still syncing once at init,
    # which is harmless here) and deprecates broadcast_buffers.
    if "forward_sync_buffers" in inspect.signature(DistributedDataParallel.__init__).parameters:
        return DistributedDataParallel(model, device_ids=device_ids, forward_sync_buffers=False)
    return DistributedDataParallel(model, device_ids=device_ids, broadcast_buffers=False)


def _run_seed(cfg, data_loader) -> int:
    """The seed of the run's random streams, the same on every rank: the training stream's when
    the loader has one (SEED, or a shared random draw for SEED < 0), else SEED or a shared draw."""
    batches = getattr(data_loader, "batch_sampler", None)
    if isinstance(batches, TrainingBatchSampler):
        return batches.seed
    return cfg.SEED if cfg.SEED >= 0 else comm.shared_random_seed()


class DefaultTrainer(TrainerBase):
    """Builds model, optimizer, schedule, data loader, checkpointer and hooks from ``cfg``.

        trainer = DefaultTrainer(cfg)
        trainer.resume_or_load(resume=args.resume)
        results = trainer.train()      # the final evaluation's results

    Override the ``build_*`` class methods to swap a part (e.g. the evaluator).
    """

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        # Before hours of training: the test sets are checked now too.
        check_dataset_classes(cfg, list(cfg.DATASETS.TRAIN) + list(cfg.DATASETS.TEST))
        model = self.build_model(cfg)
        optimizer = self.build_optimizer(cfg, model)
        data_loader = self.build_train_loader(cfg)
        model = create_ddp_model(model)
        self._trainer = SimpleTrainer(
            model,
            data_loader,
            optimizer,
            grad_clipper=build_gradient_clipper(cfg),
            amp_enabled=cfg.SOLVER.AMP.ENABLED,
            amp_dtype=cfg.SOLVER.AMP.DTYPE,
            seed=_run_seed(cfg, data_loader),
            guard=DivergenceGuard(cfg.SOLVER.DIVERGENCE.MAX_LOSS_GROWTH, cfg.SOLVER.DIVERGENCE.MAX_WEIGHT_GROWTH),
        )
        self.scheduler = self.build_lr_scheduler(cfg, optimizer)
        self.checkpointer = Checkpointer(
            model, cfg.OUTPUT_DIR, optimizer=optimizer, scheduler=self.scheduler, grad_scaler=self._trainer.grad_scaler,
            trainer=self._trainer,
        )
        self.start_iter = 0
        self.max_iter = cfg.SOLVER.MAX_ITER
        self.last_eval_results: Dict = {}
        self.register_hooks(self.build_hooks())

    @property
    def model(self) -> nn.Module:
        return self._trainer.model

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self._trainer.optimizer

    @property
    def data_loader(self):
        return self._trainer.data_loader

    def resume_or_load(self, resume: bool = True, start_over: bool = False) -> None:
        """With ``resume`` and a checkpoint in OUTPUT_DIR: continue from it (next iteration after
        the saved one). Otherwise start at 0 from MODEL.WEIGHTS (weights only) or from scratch,
        into an OUTPUT_DIR that must not hold another run's checkpoints (``start_over`` moves
        them aside; see ``detcore.engine.output_dir``). OUTPUT_DIR is locked for this run."""
        if comm.is_main_process():
            lock_output_dir(self.cfg.OUTPUT_DIR)
            if not resume:
                check_new_run(self.cfg.OUTPUT_DIR, start_over=start_over)
        extra = self.checkpointer.resume_or_load(self.cfg.MODEL.WEIGHTS, resume=resume)
        self.start_iter = int(extra["iteration"]) + 1 if "iteration" in extra else 0
        if "iteration" in extra and 0 <= self.cfg.SEED != self._trainer.seed:
            logger.warning(
                "SEED %d is not used: the resumed run continues with its own seed %d, so that it draws the images, "
                "augmentations and random numbers it would have drawn uninterrupted. To train with another seed, start a "
                "new run from the checkpoint's weights (MODEL.WEIGHTS).", self.cfg.SEED, self._trainer.seed,
            )

    def build_hooks(self) -> List[Optional[hooks.HookBase]]:
        cfg = self.cfg
        out = cfg.OUTPUT_DIR
        main = comm.is_main_process()

        checkpoint_period = cfg.SOLVER.CHECKPOINT_PERIOD
        # metrics.json's writer; the loss curves are drawn from its records.
        metrics = JSONWriter(os.path.join(out, METRICS_FILE)) if main else None
        return [
            hooks.IterationTimer(),
            hooks.LRScheduler(self.optimizer, self.scheduler),
            # Before the checkpointer (see detcore.engine.hooks): no iteration a resumed run skips
            # is missing from metrics.json.
            hooks.PeriodicWriter([metrics] + self.build_writers(), cfg.LOG_PERIOD, checkpoint_period) if main else None,
            hooks.PeriodicCheckpointer(self.checkpointer, checkpoint_period, check_weights=self._trainer.check_weights),
            hooks.LossCurvePlotter(metrics, os.path.join(out, LOSS_CURVE_FILE), checkpoint_period) if main else None,
            # After the checkpoint: a crash while evaluating loses no training.
            hooks.EvalHook(cfg.TEST.EVAL_PERIOD, lambda: self.test(cfg, self.model)) if cfg.DATASETS.TEST else None,
        ]

    def build_writers(self) -> list:
        """The writers besides metrics.json's (which ``build_hooks`` makes): the console line and,
        when the tensorboard package is installed, TensorBoard event files."""
        writers = [CommonMetricPrinter(self.max_iter)]
        tensorboard = TensorboardWriter.create(self.cfg.OUTPUT_DIR)  # None without the tensorboard package
        if tensorboard is not None:
            writers.append(tensorboard)
        return writers

    def train(self) -> Dict:
        """Train from ``start_iter`` to SOLVER.MAX_ITER; returns the last evaluation's results."""
        super().train(self.start_iter, self.max_iter)
        return self.last_eval_results

    def run_step(self) -> None:
        self._trainer.iter = self.iter
        self._trainer.run_step()

    # --- builders (override to customize) -------------------------------------------------------
    @classmethod
    def build_model(cls, cfg) -> nn.Module:
        model = build_model(cfg)
        n = sum(p.numel() for p in model.parameters())
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        logger.info("Model: %s (%.2fM parameters, %.2fM trainable)", type(model).__name__, n / 1e6, trainable / 1e6)
        logger.debug("Model:\n%s", model)
        return model

    @classmethod
    def build_optimizer(cls, cfg, model: nn.Module) -> torch.optim.Optimizer:
        return build_optimizer(cfg, model)

    @classmethod
    def build_lr_scheduler(cls, cfg, optimizer: torch.optim.Optimizer):
        return build_lr_scheduler(cfg, optimizer)

    @classmethod
    def build_train_loader(cls, cfg):
        return build_detection_train_loader(cfg)

    @classmethod
    def build_test_loader(cls, cfg, dataset_name: str):
        return build_detection_test_loader(cfg, dataset_name)

    @classmethod
    def build_evaluator(
        cls, cfg, dataset_name: str, output_folder: Optional[str] = None, tasks: Optional[Sequence[str]] = None
    ) -> DatasetEvaluator:
        """The evaluator of the dataset's ``evaluator_type`` (``EVALUATOR_TYPES``): "coco", box
        (and mask with MODEL.MASK_ON, keypoint with MODEL.KEYPOINT_ON) AP by pycocotools, for a
        dataset registered from code too (its records are converted to a COCO json in the output
        folder); "pascal_voc", the VOC devkit's AP; "cityscapes_instance", Cityscapes' own
        instance AP and COCO AP. A ProposalNetwork is scored by its proposals' recall
        ("box_proposals", COCO-style on any of them); ``tasks`` picks COCOEvaluator tasks
        explicitly. Results go to OUTPUT_DIR/inference/<dataset> (<dataset>_TTA with
        TEST.AUG.ENABLED; a name that is no file name, e.g. coco:/data/val.json, as
        ``dataset_folder_name`` spells it)."""
        if output_folder is None:
            suffix = "_TTA" if cfg.TEST.AUG.ENABLED else ""
            output_folder = os.path.join(cfg.OUTPUT_DIR, "inference", dataset_folder_name(dataset_name) + suffix)
        kind = MetadataCatalog.get(dataset_name).get("evaluator_type", "coco")
        if kind not in EVALUATOR_TYPES:
            raise NotImplementedError(
                f"No evaluator for dataset '{dataset_name}' of evaluator_type {kind!r} (known: "
                f"{list(EVALUATOR_TYPES)}); override DefaultTrainer.build_evaluator"
            )
        if tasks is None and issubclass(META_ARCH_REGISTRY.get(cfg.MODEL.META_ARCHITECTURE), ProposalNetwork):
            tasks = ("box_proposals",)
        pictures = cfg.TEST.EVAL_PICTURES
        if tasks is not None:
            return COCOEvaluator(dataset_name, tasks, output_folder, distributed=True, pictures=pictures)
        if kind == "pascal_voc":
            return PascalVOCDetectionEvaluator(dataset_name, output_folder, distributed=True)
        tasks = ("bbox",) + (("segm",) if cfg.MODEL.MASK_ON else ()) + (("keypoints",) if cfg.MODEL.KEYPOINT_ON else ())
        coco = COCOEvaluator(dataset_name, tasks, output_folder, distributed=True, pictures=pictures)
        if kind == "cityscapes_instance":
            return DatasetEvaluators([CityscapesInstanceEvaluator(dataset_name, output_folder), coco])
        return coco

    @classmethod
    def test(cls, cfg, model: nn.Module, evaluators: Optional[List[DatasetEvaluator]] = None) -> Dict:
        """Evaluate ``model`` on every DATASETS.TEST dataset; with TEST.AUG.ENABLED, wrapped in
        ``GeneralizedRCNNWithTTA`` (the test loader then gives unresized images).

        Returns ``{task: {metric: value}}`` for a single dataset, ``{dataset: {task: ...}}`` for
        several; ranks other than 0 get empty dicts.
        """
        names = list(cfg.DATASETS.TEST)
        if evaluators is not None and len(evaluators) != len(names):
            raise ValueError(f"test: got {len(evaluators)} evaluators for {len(names)} datasets {names}")
        check_dataset_classes(cfg, names)
        results = OrderedDict()
        model = comm.unwrap_model(model)
        if cfg.TEST.AUG.ENABLED:
            model = build_from_config(GeneralizedRCNNWithTTA, cfg, model)
            logger.info(
                "Test-time augmentation: short sides %s (long side <= %d)%s, merged by %s",
                list(model.min_sizes), model.max_size, ", each also flipped" if model.flip else "", model.merge,
            )
        for i, name in enumerate(names):
            loader = cls.build_test_loader(cfg, name)
            evaluator = evaluators[i] if evaluators is not None else cls.build_evaluator(cfg, name)
            results[name] = inference_on_dataset(model, loader, evaluator, precision=cfg.TEST.PRECISION)
            if comm.is_main_process():
                logger.info("Evaluation results of %s:\n%s", name, format_results(results[name]))
        if len(results) == 1:
            return next(iter(results.values()))
        return results
