"""When training has diverged, so that it stops and no checkpoint keeps the damage.

``DivergenceGuard`` is asked by the trainer at three points, and raises ``TrainingDiverged``:

- the losses of a step, before the backward pass: any NaN or infinite loss, or a total loss
  more than ``max_loss_growth`` times the run's first total loss;
- the gradients, before the optimizer step: any NaN or infinite value;
- the weights, before each checkpoint is written: a NaN or infinite value, or an L2 norm of all
  parameters more than ``max_weight_growth`` times their norm when the run started.

The two growth rules are relative to the run's own start (both references travel in the
checkpoints, so a resumed run keeps them). Why these rules: a learning rate far too high often
wrecks the weights while every number stays finite, and the losses and weights then grow by
orders of magnitude within a few steps, long before anything becomes NaN (README: "When
training diverges" has the shapes recipe's numbers). A healthy run stays far from either bound:
its first loss is about the largest it sees (losses fall from there), and weight decay keeps its
weights' norm near where it started. Both are config keys (SOLVER.DIVERGENCE.*; 0 turns a rule
off), for a model whose losses or weights are meant to grow that much.

``TrainingDiverged.bad_weights_iteration`` names the iteration after which the weights were
bad: for a loss or gradient check at iteration ``i`` it is ``i - 1`` (those weights produced the
loss), for a weight check the iteration itself. The checkpointer sets aside a checkpoint written
after that iteration (``PeriodicCheckpointer.after_train``): resuming from it would run into the
same loss again, on the same batch, whatever the new learning rate.
"""
import math
from typing import Dict, List, Optional, Sequence

import torch

__all__ = ["TrainingDiverged", "DivergenceGuard", "HOW_TO_GO_ON"]

# The end of every divergence message.
HOW_TO_GO_ON = (
    "The last good state is the checkpoint that last_checkpoint names (if none, the run's start); to continue "
    "from it with a lower learning rate, add --resume SOLVER.BASE_LR <lower>"
)


class TrainingDiverged(FloatingPointError):
    """Training stopped because it diverged (a ``FloatingPointError``, as before)."""

    def __init__(self, message: str, bad_weights_iteration: int):
        super().__init__(message)
        self.bad_weights_iteration = bad_weights_iteration


def _describe(losses: Dict[str, float]) -> str:
    return ", ".join(f"{k}={v:.4g}" for k, v in sorted(losses.items()))


def _shown(names: List[str]) -> str:
    return ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def weight_norm(parameters: Sequence[torch.Tensor]) -> float:
    """The L2 norm of all ``parameters`` together (float64 sum, so it does not overflow)."""
    norms = [torch.linalg.vector_norm(p.detach(), dtype=torch.float64) for p in parameters if p.is_floating_point()]
    if not norms:
        return 0.0
    return float(torch.linalg.vector_norm(torch.stack([n.cpu() for n in norms])))


class DivergenceGuard:
    """The checks of the module docstring; ``state_dict`` holds the run's references."""

    def __init__(self, max_loss_growth: float = 0.0, max_weight_growth: float = 0.0):
        for name, value in (("max_loss_growth", max_loss_growth), ("max_weight_growth", max_weight_growth)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise ValueError(f"DivergenceGuard: {name} must be a number >= 0 (0: off), got {value!r}")
        self.max_loss_growth = float(max_loss_growth)
        self.max_weight_growth = float(max_weight_growth)
        self.first_loss: Optional[float] = None
        self.first_weight_norm: Optional[float] = None

    def start(self, model: torch.nn.Module) -> None:
        """Record the norm of the weights the run starts from (once: a resumed run keeps its own)."""
        if self.first_weight_norm is None and self.max_weight_growth > 0:
            self.first_weight_norm = weight_norm(list(model.parameters()))

    def check_losses(self, iteration: int, losses: Dict[str, float]) -> None:
        bad = {k: v for k, v in losses.items() if not math.isfinite(v)}
        if bad:
            raise TrainingDiverged(
                f"Loss became infinite or NaN at iteration={iteration}: {', '.join(f'{k}={v}' for k, v in sorted(bad.items()))}. "
                f"Training stopped before the backward pass. {HOW_TO_GO_ON}.",
                iteration - 1,
            )
        total = sum(losses.values())
        if self.first_loss is None:
            self.first_loss = total
            return
        if self.max_loss_growth > 0 and self.first_loss > 0 and total > self.max_loss_growth * self.first_loss:
            raise TrainingDiverged(
                f"Training diverged at iteration={iteration}: the total loss is {total:.4g}, more than "
                f"SOLVER.DIVERGENCE.MAX_LOSS_GROWTH={self.max_loss_growth:g} times the run's first loss "
                f"{self.first_loss:.4g} (losses: {_describe(losses)}). Training stopped before the backward pass. "
                f"{HOW_TO_GO_ON}.",
                iteration - 1,
            )

    def check_gradients(
        self, iteration: int, losses: Dict[str, float], params: Sequence[torch.Tensor], model: torch.nn.Module
    ) -> None:
        """``params``: the parameters with a gradient (``model``'s, which names them in the error)."""
        if not params:
            return
        # A NaN or inf anywhere makes its tensor's sum non-finite. One reduction per tensor and
        # one sync, several times cheaper than a max-abs norm (docs/benchmarks.md).
        # (A finite sum overflows only past 3e38, far beyond any gradient training survives.)
        sums = torch.stack([p.grad.sum(dtype=torch.float32) for p in params])
        if bool(torch.isfinite(sums).all()):
            return
        names = {id(p): n for n, p in model.named_parameters()}
        bad = [names.get(id(p), "?") for p in params if not bool(torch.isfinite(p.grad).all())]
        raise TrainingDiverged(
            f"Gradients became infinite or NaN at iteration={iteration} (losses: {_describe(losses)}) in {_shown(bad)}. "
            f"Training stopped before the optimizer step. {HOW_TO_GO_ON}.",
            iteration - 1,
        )

    def check_weights(self, iteration: int, model: torch.nn.Module) -> None:
        """The weights after ``iteration``, before they are saved."""
        named = dict(model.named_parameters())
        bad = [n for n, p in named.items() if p.is_floating_point() and not bool(torch.isfinite(p).all())]
        if bad:
            raise TrainingDiverged(
                f"Training diverged by iteration={iteration}: infinite or NaN weights ({_shown(bad)}); they are not "
                f"saved. {HOW_TO_GO_ON}.",
                iteration,
            )
        if self.max_weight_growth <= 0 or not self.first_weight_norm:
            return
        norm = weight_norm(list(named.values()))
        if norm > self.max_weight_growth * self.first_weight_norm:
            raise TrainingDiverged(
                f"Training diverged by iteration={iteration}: the weights' norm is {norm:.4g}, more than "
                f"SOLVER.DIVERGENCE.MAX_WEIGHT_GROWTH={self.max_weight_growth:g} times their norm when the run started "
                f"({self.first_weight_norm:.4g}); they are not saved. {HOW_TO_GO_ON}.",
                iteration,
            )

    def state_dict(self) -> Dict[str, Optional[float]]:
        return {"first_loss": self.first_loss, "first_weight_norm": self.first_weight_norm}

    def load_state_dict(self, state: Dict[str, Optional[float]]) -> None:
        for key in ("first_loss", "first_weight_norm"):
            if state.get(key) is not None:
                setattr(self, key, float(state[key]))

