"""Training and evaluation engine: trainer and hooks, checkpoints, metrics, inference loop."""
from .checkpointer import (
    LAST_CHECKPOINT_FILE,
    Checkpointer,
    LoadReport,
    atomic_torch_save,
    load_checkpoint_file,
    load_model_weights,
)
from .defaults import (
    LOSS_CURVE_FILE,
    METRICS_FILE,
    DefaultTrainer,
    create_ddp_model,
    default_argument_parser,
    default_setup,
    launch,
    seed_all_rng,
)
from .events import CommonMetricPrinter, EventStorage, JSONWriter, TensorboardWriter, get_event_storage
from .hooks import (
    EvalHook,
    IterationTimer,
    LossCurvePlotter,
    LRScheduler,
    PeriodicCheckpointer,
    PeriodicWriter,
)
from .inference import format_results, inference_context, inference_on_dataset
from .predictor import Predictor
from .train_loop import HookBase, SimpleTrainer, TrainerBase

__all__ = [
    "LAST_CHECKPOINT_FILE",
    "LOSS_CURVE_FILE",
    "METRICS_FILE",
    "Checkpointer",
    "CommonMetricPrinter",
    "DefaultTrainer",
    "EvalHook",
    "EventStorage",
    "HookBase",
    "IterationTimer",
    "JSONWriter",
    "LoadReport",
    "LossCurvePlotter",
    "LRScheduler",
    "PeriodicCheckpointer",
    "PeriodicWriter",
    "Predictor",
    "SimpleTrainer",
    "TensorboardWriter",
    "TrainerBase",
    "atomic_torch_save",
    "create_ddp_model",
    "default_argument_parser",
    "default_setup",
    "format_results",
    "get_event_storage",
    "inference_context",
    "inference_on_dataset",
    "launch",
    "load_checkpoint_file",
    "load_model_weights",
    "seed_all_rng",
]
