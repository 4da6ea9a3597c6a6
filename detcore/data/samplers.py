"""Which images each rank loads, in which order, and how they are grouped into batches.

- ``TrainingSampler``: an endless stream of shuffled epochs (training counts iterations, not
  epochs). All ranks draw the *same* permutations from a shared seed and rank ``r`` takes
  positions ``r, r + world, r + 2 * world...``, so within an epoch the ranks' images are disjoint.
- ``InferenceSampler``: a contiguous shard of ``range(size)`` per rank; the shards cover every
  image exactly once.
- ``GroupedBatchSampler``: batches of one aspect-ratio group only (landscape with landscape,
  portrait with portrait), so padding a batch to its largest image wastes little.
- ``TrainingBatchSampler``: the training loader's batches, startable at any batch. Its batches
  hold ``StreamItem``s: the dataset index, the stream's seed and the item's position in the
  stream, from which the loader seeds the item's augmentations. Batch ``k`` is then the same
  images with the same augmentations whether the stream started at 0 or at ``k`` (a resumed
  run), whichever data-loader worker loads it.

Rank and world size come from ``torch.distributed`` when it is initialized (``detcore.utils.comm``).
"""
import itertools
from typing import Iterable, Iterator, List, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from torch.utils.data import Sampler

from ..utils import comm

__all__ = [
    "StreamItem",
    "TrainingSampler",
    "InferenceSampler",
    "GroupedBatchSampler",
    "TrainingBatchSampler",
    "get_rank_and_world_size",
]


class StreamItem(NamedTuple):
    """One item of the training stream: ``index`` into the dataset, and the ``seed`` and
    ``position`` (counted over all ranks) that seed its augmentations."""

    index: int
    seed: int
    position: int


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

    ``seed`` (an int >= 0) fixes the stream (``None``: a random seed shared by all ranks).
    ``rank`` / ``world_size`` default to torch.distributed's."""

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
        if seed is not None and (not isinstance(seed, (int, np.integer)) or seed < 0):
            raise ValueError(f"TrainingSampler: seed must be an int >= 0 or None, got {seed!r}")
        self.size = int(size)
        self.shuffle = shuffle
        # Every rank must shuffle identically for the shards to stay disjoint.
        self.seed = comm.shared_random_seed() if seed is None else int(seed)
        self.rank, self.world_size = _check_shard(rank, world_size, "TrainingSampler")

    def __iter__(self) -> Iterator[int]:
        return itertools.islice(self._all_ranks_indices(self.seed), self.rank, None, self.world_size)

    def items(self) -> Iterator[StreamItem]:
        """This rank's share of the stream as ``StreamItem``s (the same indices as iterating)."""
        seed = self.seed
        mine = itertools.islice(zip(self._all_ranks_indices(seed), itertools.count()), self.rank, None, self.world_size)
        return (StreamItem(index, seed, position) for index, position in mine)

    def _all_ranks_indices(self, seed: int) -> Iterator[int]:
        g = torch.Generator()
        g.manual_seed(seed)
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
        return _grouped_batches(self.sampler, self.group_ids, self.batch_size)


def _index(item: Union[int, StreamItem]) -> int:
    return item.index if isinstance(item, StreamItem) else item


def _grouped_batches(items: Iterable, group_ids: np.ndarray, batch_size: int) -> Iterator[list]:
    buckets = {}
    for item in items:
        bucket = buckets.setdefault(int(group_ids[_index(item)]), [])
        bucket.append(item)
        if len(bucket) == batch_size:
            yield bucket[:]
            bucket.clear()


def _batches(items: Iterable, batch_size: int) -> Iterator[list]:
    items = iter(items)
    while True:
        yield list(itertools.islice(items, batch_size))


class TrainingBatchSampler(Sampler):
    """Batches of ``batch_size`` ``StreamItem``s from ``sampler``'s stream, each from one group
    of ``group_ids`` (None: no grouping), from batch ``start`` on (see the module docstring).

    ``start_at(k)`` before iterating makes the stream begin with batch ``k``: the ``k`` batches
    before it are drawn as indices and dropped (the grouping's leftovers depend on them), which
    reads no image. ``seed`` is the stream's seed (the sampler's).
    """

    def __init__(self, sampler: TrainingSampler, batch_size: int, group_ids: Optional[Sequence[int]] = None):
        if not isinstance(sampler, TrainingSampler):
            raise TypeError(f"TrainingBatchSampler: sampler must be a TrainingSampler, got {type(sampler).__name__}")
        if not isinstance(batch_size, (int, np.integer)) or batch_size <= 0:
            raise ValueError(f"TrainingBatchSampler: batch_size must be a positive int, got {batch_size!r}")
        self.sampler = sampler
        self.batch_size = int(batch_size)
        self.group_ids = None
        if group_ids is not None:
            self.group_ids = np.asarray(group_ids, dtype=np.int64)
            if self.group_ids.shape != (sampler.size,):
                raise ValueError(
                    f"TrainingBatchSampler: group_ids must have one entry per dataset item ({sampler.size}), "
                    f"got shape {self.group_ids.shape}"
                )
        self.start = 0

    @property
    def seed(self) -> int:
        return self.sampler.seed

    @seed.setter
    def seed(self, value: int) -> None:
        if not isinstance(value, (int, np.integer)) or value < 0:
            raise ValueError(f"TrainingBatchSampler: seed must be an int >= 0, got {value!r}")
        self.sampler.seed = int(value)

    def start_at(self, batch: int) -> None:
        if not isinstance(batch, (int, np.integer)) or batch < 0:
            raise ValueError(f"TrainingBatchSampler.start_at: batch must be an int >= 0, got {batch!r}")
        self.start = int(batch)

    def __iter__(self) -> Iterator[List[StreamItem]]:
        items = self.sampler.items()
        if self.group_ids is None:
            batches = _batches(items, self.batch_size)
        else:
            batches = _grouped_batches(items, self.group_ids, self.batch_size)
        return itertools.islice(batches, self.start, None)


def aspect_ratio_group_ids(records: Sequence[dict]) -> np.ndarray:
    """0 for landscape images (width > height), 1 for the others, from the records' sizes."""
    return np.array([0 if r["width"] > r["height"] else 1 for r in records], dtype=np.int64)
