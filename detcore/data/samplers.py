"""Which images each rank loads, in which order, and how they are grouped into batches.

- ``TrainingSampler``: an endless stream of shuffled epochs (training counts iterations, not
  epochs). All ranks draw the *same* permutations from a shared seed and rank ``r`` takes
  positions ``r, r + world, r + 2 * world...``, so within an epoch the ranks' images are disjoint.
- ``InferenceSampler``: a contiguous shard of ``range(size)`` per rank; the shards cover every
  image exactly once.
- ``GroupedBatchSampler``: batches of one aspect-ratio group only (landscape with landscape,
  portrait with portrait), so padding a batch to its largest image wastes little.

Rank and world size come from ``torch.distributed`` when it is initialized (``detcore.utils.comm``).
"""
import itertools
from typing import Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch.utils.data import Sampler

from ..utils import comm

__all__ = ["TrainingSampler", "InferenceSampler", "GroupedBatchSampler", "get_rank_and_world_size"]


def get_rank_and_world_size() -> Tuple[int, int]:
    """``(rank, world_size)`` of the default process group, ``(0, 1)`` without one."""
    return comm.get_rank(), comm.get_world_size()


def _check_shard(rank: Optional[int], world_size: Optional[int], where: str) -> Tuple[int, int]:
    default_rank, default_world = get_rank_and_world_size()
    rank = default_rank if rank is None else int(rank)
    world_size = default_world if world_size is None else int(world_size)
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"{where}: need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
    return rank, world_size


class TrainingSampler(Sampler):
    """Endless indices into a dataset of ``size`` items (see the module docstring).

    ``seed`` fixes the stream (``None``: a random seed shared by all ranks). ``rank`` /
    ``world_size`` default to torch.distributed's."""

    def __init__(
        self,
        size: int,
        shuffle: bool = True,
        seed: Optional[int] = None,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
    ):
        if not isinstance(size, (int, np.integer)) or size <= 0:
            raise ValueError(f"TrainingSampler: size must be a positive int (the dataset length), got {size!r}")
        self.size = int(size)
        self.shuffle = shuffle
        # Every rank must shuffle identically for the shards to stay disjoint.
        self.seed = comm.shared_random_seed() if seed is None else int(seed)
        self.rank, self.world_size = _check_shard(rank, world_size, "TrainingSampler")

    def __iter__(self) -> Iterator[int]:
        return itertools.islice(self._all_ranks_indices(), self.rank, None, self.world_size)

    def _all_ranks_indices(self) -> Iterator[int]:
        g = torch.Generator()
        g.manual_seed(self.seed)
        while True:
            if self.shuffle:
                yield from torch.randperm(self.size, generator=g).tolist()
            else:
                yield from range(self.size)


class InferenceSampler(Sampler):
    """This rank's contiguous shard of ``range(size)``; shard sizes differ by at most one."""

    def __init__(self, size: int, rank: Optional[int] = None, world_size: Optional[int] = None):
        if not isinstance(size, (int, np.integer)) or size < 0:
            raise ValueError(f"InferenceSampler: size must be an int >= 0 (the dataset length), got {size!r}")
        self.size = int(size)
        self.rank, self.world_size = _check_shard(rank, world_size, "InferenceSampler")
        self._begin = self.size * self.rank // self.world_size
        self._end = self.size * (self.rank + 1) // self.world_size

    def __iter__(self) -> Iterator[int]:
        return iter(range(self._begin, self._end))

    def __len__(self) -> int:
        return self._end - self._begin


class GroupedBatchSampler(Sampler):
    """Batches of ``batch_size`` indices drawn from ``sampler``, each batch from one group
    (``group_ids[index]``); an index waits in its group's bucket until the bucket is full.
    Meant for the endless training stream: leftovers in unfilled buckets are never yielded."""

    def __init__(self, sampler: Sampler, group_ids: Sequence[int], batch_size: int):
        if not isinstance(batch_size, (int, np.integer)) or batch_size <= 0:
            raise ValueError(f"GroupedBatchSampler: batch_size must be a positive int, got {batch_size!r}")
        self.sampler = sampler
        self.group_ids = np.asarray(group_ids, dtype=np.int64)
        if self.group_ids.ndim != 1:
            raise ValueError(
                f"GroupedBatchSampler: group_ids must be 1-D (one per index), got shape {self.group_ids.shape}"
            )
        self.batch_size = int(batch_size)

    def __iter__(self) -> Iterator[List[int]]:
        buckets = {}
        for index in self.sampler:
            bucket = buckets.setdefault(int(self.group_ids[index]), [])
            bucket.append(index)
            if len(bucket) == self.batch_size:
                yield bucket[:]
                bucket.clear()


def aspect_ratio_group_ids(records: Sequence[dict]) -> np.ndarray:
    """0 for landscape images (width > height), 1 for the others, from the records' sizes."""
    return np.array([0 if r["width"] > r["height"] else 1 for r in records], dtype=np.int64)
