"""The iteration loop: ``TrainerBase`` runs hooks around each step, ``SimpleTrainer`` does a step.

A training run is ``before_train`` -> for each iteration ``before_step``, ``run_step``,
``after_step`` -> ``after_train``, with hooks (``HookBase``) doing everything that is not the
step itself: LR schedule, timing, checkpoints, evaluation, metric writers. ``after_train`` runs
even when a step raises (``trainer.completed`` says whether every iteration ran); what belongs
to the last iteration (final checkpoint, final evaluation) happens in its ``after_step``, which
a step that raised never reaches.
"""
import logging
import time
import weakref
from typing import Callable, Iterable, List, Optional

import torch
from torch import nn

from detcore.config.choices import AMP_DTYPES
from detcore.data.samplers import TrainingBatchSampler
from detcore.utils import comm, rng

from .divergence import HOW_TO_GO_ON, DivergenceGuard, TrainingDiverged
from .events import EventStorage, get_event_storage

__all__ = ["HookBase", "TrainerBase", "SimpleTrainer", "TrainingDiverged"]

logger = logging.getLogger(__name__)

_AMP_DTYPES = {name: getattr(torch, name) for name in AMP_DTYPES}


class HookBase:
    """Base class of training hooks; ``self.trainer`` is set when the hook is registered."""

    trainer: "TrainerBase" = None

    def before_train(self) -> None:
        pass

    def after_train(self) -> None:
        pass

    def before_step(self) -> None:
        pass

    def after_step(self) -> None:
        pass


class TrainerBase:
    """Runs iterations ``[start_iter, max_iter)`` with hooks; subclasses implement ``run_step``.

    Attributes: ``iter`` (the current iteration), ``start_iter``, ``max_iter``, ``storage`` (the
    run's ``EventStorage``), ``completed`` (True once every iteration ran without an error),
    ``failure`` (the exception that ended the last ``train``, for the hooks' ``after_train``).
    """

    def __init__(self):
        self._hooks: List[HookBase] = []
        self.iter = 0
        self.start_iter = 0
        self.max_iter = 0
        self.storage: Optional[EventStorage] = None
        self.completed = False
        self.failure: Optional[Exception] = None

    def register_hooks(self, hooks: Iterable[Optional[HookBase]]) -> None:
        """Append hooks (None entries are skipped); they run in the order given."""
        for hook in hooks:
            if hook is None:
                continue
            if not isinstance(hook, HookBase):
                raise TypeError(f"register_hooks: expected HookBase instances, got {type(hook).__name__}")
            # A weak reference: trainer -> hook -> trainer would be a cycle keeping both alive.
            hook.trainer = weakref.proxy(self)
            self._hooks.append(hook)

    def train(self, start_iter: int, max_iter: int) -> None:
        if start_iter < 0 or max_iter < 0:
            raise ValueError(f"train: start_iter and max_iter must be >= 0, got {start_iter}, {max_iter}")
        logger.info("Starting training from iteration %d to %d", start_iter, max_iter)
        self.iter = self.start_iter = start_iter
        self.max_iter = max_iter
        self.completed = False
        self.failure = None
        with EventStorage(start_iter) as self.storage:
            try:
                self.before_train()
                for self.iter in range(start_iter, max_iter):
                    self.before_step()
                    self.run_step()
                    self.after_step()
                self.iter = max_iter
                self.completed = True
            except Exception as e:
                logger.exception("Exception during training at iteration %d:", self.iter)
                self.failure = e
                raise
            finally:
                self.after_train()

    def before_train(self) -> None:
        for h in self._hooks:
            h.before_train()

    def after_train(self) -> None:
        self.storage.iter = self.iter
        for h in self._hooks:
            h.after_train()

    def before_step(self) -> None:
        self.storage.iter = self.iter
        for h in self._hooks:
            h.before_step()

    def after_step(self) -> None:
        for h in self._hooks:
            h.after_step()
        self.storage.step()

    def run_step(self) -> None:
        raise NotImplementedError


class SimpleTrainer(TrainerBase):
    """One step: next batch -> model losses -> NaN check -> backward -> (clip) -> optimizer step.

    Args:
        model: returns a dict of scalar losses in training mode (DDP-wrapped when distributed).
        data_loader: an endless iterable of batches.
        optimizer: over the model's parameters.
        grad_clipper: ``clip(parameters)`` called before each optimizer step (see
            ``detcore.solver.build_gradient_clipper``), or None.
        amp_enabled, amp_dtype: run the forward pass under ``torch.autocast`` in ``amp_dtype``
            ("float16" or "bfloat16") on the model's device type. float16 also gets a
            ``GradScaler``, which scales the loss so small gradients do not flush to zero and
            skips steps whose gradients overflowed.
        guard: the divergence checks (default: NaN / inf only, no growth bounds).
        seed: the run's seed (an int >= 0), or None. With a seed, each step's random draws (the
            model's sampling of anchors and proposals...) come from python / numpy / torch
            seeded with (seed, rank, iteration), and a data loader whose ``batch_sampler`` is a
            ``TrainingBatchSampler`` is set to this seed; ``state_dict`` holds it.

    The data stream starts at the batch of the first iteration run: with a
    ``TrainingBatchSampler``, a trainer whose first step is iteration ``k`` (a resumed run) gets
    batch ``k``. With the seed too, step ``k`` is then computed from the same inputs, weights,
    optimizer state and random draws whether the run got there in one go or was resumed.

    Divergence stops training with ``TrainingDiverged`` (a ``FloatingPointError``) that names the
    iteration and the losses, before anything non-finite reaches the weights: a loss that is NaN
    or infinite, or a total loss past ``guard``'s bound (on any rank: losses are averaged over
    ranks first, so every rank sees the same values and stops together), stops it before the
    backward pass; a non-finite gradient (after the all-reduce, so again on every rank) before
    clipping and the optimizer step, which would write NaN into every weight. The model and
    optimizer stay as the previous step left them. (With a float16 ``GradScaler`` overflowing
    gradients are expected: the scaler skips those steps itself.) ``check_weights`` is the
    guard's check of the weights, for the checkpointer. See ``detcore.engine.divergence``.
    """

    def __init__(
        self,
        model: nn.Module,
        data_loader: Iterable,
        optimizer: torch.optim.Optimizer,
        grad_clipper: Optional[Callable[[Iterable[torch.Tensor]], None]] = None,
        amp_enabled: bool = False,
        amp_dtype: str = "float16",
        seed: Optional[int] = None,
        guard: Optional[DivergenceGuard] = None,
    ):
        super().__init__()
        if seed is not None and (not isinstance(seed, int) or seed < 0):
            raise ValueError(f"SimpleTrainer: seed must be an int >= 0 or None, got {seed!r}")
        self.seed = seed
        self.guard = guard if guard is not None else DivergenceGuard()
        if amp_dtype not in _AMP_DTYPES:
            raise ValueError(f"SOLVER.AMP.DTYPE must be one of {sorted(_AMP_DTYPES)}, got {amp_dtype!r}")
        self.model = model
        self.data_loader = data_loader
        self._data_loader_iter = None  # created on the first step: no loader workers before that
        self.optimizer = optimizer
        self.grad_clipper = grad_clipper
        self.amp_enabled = bool(amp_enabled)
        self.amp_dtype = _AMP_DTYPES[amp_dtype]
        self.device_type = _device_type(model)
        self.grad_scaler = None
        if self.amp_enabled and self.amp_dtype == torch.float16:
            if self.device_type == "cpu":
                logger.warning("SOLVER.AMP.DTYPE float16 on the CPU: few CPUs compute float16 fast; bfloat16 is the usual choice")
            self.grad_scaler = torch.amp.GradScaler(self.device_type)

    def run_step(self) -> None:
        if not self.model.training:
            raise RuntimeError("SimpleTrainer: the model is in eval mode; call model.train() before training")
        start = time.perf_counter()
        if self._data_loader_iter is None:
            self._data_loader_iter = iter(self._start_data_stream())
        data = next(self._data_loader_iter)
        data_time = time.perf_counter() - start
        self.guard.start(comm.unwrap_model(self.model))
        if self.seed is not None:
            # After loading: whatever ran since the last step (loader start, evaluation, hooks)
            # does not change this step's draws.
            rng.seed_global_rngs(self.seed, rng.STEP, comm.get_rank(), self.iter)

        try:
            with torch.autocast(device_type=self.device_type, dtype=self.amp_dtype, enabled=self.amp_enabled):
                loss_dict = self.model(data)
        except FloatingPointError as e:  # a part of the model saw non-finite values (e.g. the RPN)
            raise TrainingDiverged(
                f"Training diverged at iteration={self.iter}: {e}. Stopped before the backward pass. {HOW_TO_GO_ON}.",
                self.iter - 1,
            ) from e
        if isinstance(loss_dict, torch.Tensor):
            loss_dict = {"total_loss": loss_dict}
        if not isinstance(loss_dict, dict) or not loss_dict:
            raise TypeError(
                f"SimpleTrainer: the model must return a non-empty dict of scalar losses in training mode, "
                f"got {type(loss_dict).__name__}"
            )
        losses = sum(v.float() for v in loss_dict.values())

        # Averaged over ranks: logged values describe the whole batch, and every rank reaches the
        # same verdict in the finiteness check below.
        reduced = {k: float(v) for k, v in comm.reduce_dict({k: v.detach() for k, v in loss_dict.items()}).items()}
        self.guard.check_losses(self.iter, reduced)

        self.optimizer.zero_grad(set_to_none=True)
        if self.grad_scaler is not None:
            self.grad_scaler.scale(losses).backward()
            if self.grad_clipper is not None:
                self.grad_scaler.unscale_(self.optimizer)  # clip the true gradients, not scaled ones
                self.grad_clipper(self._params())
            self.grad_scaler.step(self.optimizer)
            self.grad_scaler.update()
        else:
            losses.backward()
            self.guard.check_gradients(self.iter, reduced, self._params(), comm.unwrap_model(self.model))
            if self.grad_clipper is not None:
                self.grad_clipper(self._params())
            self.optimizer.step()

        storage = get_event_storage()
        storage.put_scalar("total_loss", sum(reduced.values()))
        storage.put_scalars(**reduced)
        storage.put_scalar("data_time", data_time)

    def _start_data_stream(self) -> Iterable:
        batches = getattr(self.data_loader, "batch_sampler", None)
        if isinstance(batches, TrainingBatchSampler):
            if self.seed is not None:
                batches.seed = self.seed
            batches.start_at(self.iter)
            if self.iter > 0:
                logger.info("The training stream continues at batch %d (the earlier ones are skipped unread)", self.iter)
        elif self.iter > 0:
            logger.warning(
                "Starting at iteration %d with a data loader that cannot start at a given batch (its batch_sampler is "
                "not a TrainingBatchSampler): the data stream starts from its beginning, so this run will not match an "
                "uninterrupted one", self.iter,
            )
        return self.data_loader

    def check_weights(self) -> None:
        """Raise ``TrainingDiverged`` when the weights after this iteration must not be saved."""
        self.guard.check_weights(self.iter, comm.unwrap_model(self.model))

    def state_dict(self) -> dict:
        """What a checkpoint needs to continue this trainer: the seed of its random streams and
        the divergence guard's references."""
        return {"seed": self.seed, "guard": self.guard.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        if state.get("seed") is not None:
            self.seed = int(state["seed"])
        self.guard.load_state_dict(state.get("guard", {}))

    def _params(self) -> List[torch.Tensor]:
        return [p for group in self.optimizer.param_groups for p in group["params"] if p.grad is not None]


def _device_type(model: nn.Module) -> str:
    for p in model.parameters():
        return p.device.type
    return "cpu"
