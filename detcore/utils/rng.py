"""Random streams that are pure functions of a seed and a position, so a resumed run draws what
an uninterrupted one would have drawn, without saving any live random state.

- ``derive_seed(seed, *keys)``: an integer seed for the stream named by ``keys`` (e.g. the
  training step ``(STEP, rank, iteration)`` or a sample ``(SAMPLE, position)``). Different keys
  give independent streams (numpy's ``SeedSequence`` hashes them), the same keys the same one.
- ``seed_global_rngs(seed, *keys)``: seed python's ``random``, ``numpy.random`` and torch (CPU and
  every CUDA device) for that stream. The trainer calls it before each step.
- ``isolated_rng(seed, *keys)``: a block that draws from that stream and then puts python's,
  numpy's and torch's CPU generators back as they were. The training data loader wraps each
  sample's augmentations in it, so they depend on the sample's place in the stream only, not on
  which process loads it, nor on what the main process drew before.
"""
import contextlib
import random
from typing import Iterator

import numpy as np
import torch

__all__ = ["STEP", "SAMPLE", "LOADER", "derive_seed", "seed_global_rngs", "isolated_rng"]

# The first key of each kind of stream, so that a step and a sample never share one.
STEP, SAMPLE, LOADER = 1, 2, 3


def derive_seed(seed: int, *keys: int) -> int:
    """A seed in ``[0, 2**63)`` for the stream ``(seed, *keys)``; all must be ints >= 0."""
    entropy = [int(seed), *(int(k) for k in keys)]
    if any(v < 0 for v in entropy):
        raise ValueError(f"derive_seed: seed and keys must be >= 0, got {entropy}")
    low, high = np.random.SeedSequence(entropy).generate_state(2, dtype=np.uint32)
    return (int(high) << 32 | int(low)) & (2**63 - 1)


def _seed_cpu_generators(value: int) -> None:
    random.seed(value)
    np.random.seed([value & 0xFFFFFFFF, value >> 32])
    torch.default_generator.manual_seed(value)


def seed_global_rngs(seed: int, *keys: int) -> None:
    """Seed python, numpy and torch (all devices) for the stream ``(seed, *keys)``."""
    value = derive_seed(seed, *keys)
    _seed_cpu_generators(value)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(value)  # queued until CUDA is initialized, if it is not yet


@contextlib.contextmanager
def isolated_rng(seed: int, *keys: int) -> Iterator[None]:
    """Draw from the stream ``(seed, *keys)`` inside the block; python's, numpy's and torch's CPU
    generators are restored afterwards (CUDA's are not touched)."""
    saved = random.getstate(), np.random.get_state(), torch.get_rng_state()
    _seed_cpu_generators(derive_seed(seed, *keys))
    try:
        yield
    finally:
        random.setstate(saved[0])
        np.random.set_state(saved[1])
        torch.set_rng_state(saved[2])
