"""Data loaders: registered dataset names -> batches of model inputs (lists of dicts).

    loader = build_detection_train_loader(cfg)          # endless; batches of IMS_PER_BATCH / world
    for batch in build_detection_test_loader(cfg, "shapes_val"):  # this rank's shard, batch 1
        ...

``make_detection_train_loader`` / ``make_detection_test_loader`` take plain arguments (records,
mapper, batch size...); the ``build_*`` functions translate the config into them.

The training stream is a pure function of its seed and its position: the batches come from a
``TrainingBatchSampler`` (startable at any batch: the trainer starts it at the iteration it
resumes from), and each image's augmentations draw from a random stream seeded by (seed, the
image's position in the stream), inside ``MapDataset``. So batch ``k`` holds the same images,
augmented the same way, in an uninterrupted run and in one resumed at ``k``, with any number of
data-loader workers. The loader takes its workers' base seed from a generator of its own, so
creating it draws nothing from the main process' random state.

Workers end with the main process (``detcore.utils.processes.exit_with_parent``): one blocked on
a dead main process would otherwise wait forever.
"""
import functools
import logging
import os
import pickle
from typing import Callable, List, Optional, Sequence, Union

import numpy as np
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset

from detcore.config.choices import TRAIN_SAMPLERS
from detcore.utils import rng
from detcore.utils.processes import exit_with_parent
from detcore.utils.registry import build_from_config

from .catalog import DatasetCatalog, MetadataCatalog
from .dataset_mapper import DatasetMapper
from .datasets.builtin import set_datasets_root
from .samplers import (
    GroupedBatchSampler,
    InferenceSampler,
    StreamItem,
    TrainingBatchSampler,
    TrainingSampler,
    aspect_ratio_group_ids,
    get_rank_and_world_size,
)

__all__ = [
    "DatasetFromList",
    "MapDataset",
    "get_detection_dataset_dicts",
    "filter_images_with_few_keypoints",
    "trivial_batch_collator",
    "make_detection_train_loader",
    "make_detection_test_loader",
    "build_detection_train_loader",
    "build_detection_test_loader",
]

logger = logging.getLogger(__name__)


class DatasetFromList(Dataset):
    """A list of records as a map-style dataset.

    The records are pickled into one numpy byte buffer: data-loader workers then share a single
    read-only block of memory, where a list of 100k dicts would be copied page by page into every
    worker as Python's reference counting touches them. Each access unpickles a fresh copy, so a
    mapper may edit what it gets.
    """

    def __init__(self, records: Sequence[dict]):
        blobs = [np.frombuffer(pickle.dumps(r, protocol=pickle.HIGHEST_PROTOCOL), dtype=np.uint8) for r in records]
        self._ends = np.cumsum([len(b) for b in blobs], dtype=np.int64)
        self._data = np.concatenate(blobs) if blobs else np.zeros(0, dtype=np.uint8)

    def __len__(self) -> int:
        return len(self._ends)

    def __getitem__(self, index: int) -> dict:
        start = int(self._ends[index - 1]) if index > 0 else 0
        return pickle.loads(memoryview(self._data[start : int(self._ends[index])]))


class MapDataset(Dataset):
    """``dataset`` with ``map_func`` applied to every item on access.

    Indexed with a ``StreamItem`` (the training loader), ``map_func`` draws from the random
    stream of the item's seed and position (``detcore.utils.rng.isolated_rng``), and the calling
    process' own random state is left as it was; indexed with an int, from the process' state."""

    def __init__(self, dataset: Dataset, map_func: Callable[[dict], dict]):
        self.dataset = dataset
        self.map_func = map_func

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: Union[int, StreamItem]) -> dict:
        if isinstance(index, StreamItem):
            with rng.isolated_rng(index.seed, rng.SAMPLE, index.position):
                return self.map_func(self.dataset[index.index])
        return self.map_func(self.dataset[index])


def trivial_batch_collator(batch: List[dict]) -> List[dict]:
    """Batches stay lists of dicts: images differ in size, the model pads them itself."""
    return batch


def _worker_init(worker_id: int, main_pid: Optional[int] = None) -> None:
    exit_with_parent(main_pid)
    # A mapper indexed with plain ints draws from np.random: give every worker its own stream,
    # derived from the per-worker torch seed (the loader's base seed + the worker id).
    np.random.seed(torch.initial_seed() % 2**32)


def _worker_init_fn():
    # Bound to this process' pid: a worker checks that the process that made the loader lives.
    return functools.partial(_worker_init, main_pid=os.getpid())


def get_detection_dataset_dicts(names: Union[str, Sequence[str]], filter_empty: bool = True) -> List[dict]:
    """Records of the named datasets, concatenated. With ``filter_empty``, images without any
    non-crowd annotation are dropped (they teach a detector nothing; detectron2 does the same)."""
    if isinstance(names, str):
        names = [names]
    if len(names) == 0:
        raise ValueError("get_detection_dataset_dicts: no dataset names given")
    records: List[dict] = []
    for name in names:
        recs = DatasetCatalog.get(name)
        if len(recs) == 0:
            raise ValueError(f"Dataset '{name}' is empty")
        records.extend(recs)
    _check_same_classes(names)
    if filter_empty and any("annotations" in r for r in records):
        before = len(records)
        records = [r for r in records if any(a.get("iscrowd", 0) == 0 for a in r.get("annotations", []))]
        if before != len(records):
            logger.info(
                "Removed %d images with no usable annotations; %d images left", before - len(records), len(records)
            )
        if not records:
            raise ValueError(f"No image of {list(names)} has a non-crowd annotation: nothing to train on")
    return records


def filter_images_with_few_keypoints(records: List[dict], min_keypoints: int) -> List[dict]:
    """The records whose non-crowd annotations have at least ``min_keypoints`` labeled keypoints
    (visibility > 0) together: Keypoint R-CNN learns nothing about keypoints from the others."""

    def labeled(record: dict) -> int:
        return sum(
            sum(1 for v in a["keypoints"][2::3] if v > 0)
            for a in record.get("annotations", [])
            if "keypoints" in a and not a.get("iscrowd", 0)
        )

    kept = [r for r in records if labeled(r) >= min_keypoints]
    if len(kept) != len(records):
        logger.info(
            "Removed %d images with fewer than %d labeled keypoints; %d images left",
            len(records) - len(kept), min_keypoints, len(kept),
        )
    if not kept:
        raise ValueError(
            f"No training image has {min_keypoints} or more labeled keypoints (DATALOADER.MIN_KEYPOINTS_PER_IMAGE): "
            "nothing to train the keypoint head on"
        )
    return kept


def _check_same_classes(names: Sequence[str]) -> None:
    classes = [(n, MetadataCatalog.get(n).get("thing_classes")) for n in names]
    classes = [(n, c) for n, c in classes if c is not None]
    for n, c in classes[1:]:
        if list(c) != list(classes[0][1]):
            raise ValueError(
                f"Datasets '{classes[0][0]}' and '{n}' have different thing_classes "
                f"({list(classes[0][1])} vs {list(c)}); they cannot be trained on together"
            )


def make_detection_train_loader(
    records: Union[Sequence[dict], Dataset],
    mapper: Callable[[dict], dict],
    total_batch_size: int,
    *,
    aspect_ratio_grouping: bool = True,
    num_workers: int = 0,
    seed: Optional[int] = None,
    sampler: Optional[torch.utils.data.Sampler] = None,
) -> DataLoader:
    """An endless loader of ``total_batch_size / world_size`` mapped records per batch on this
    rank. ``sampler`` defaults to a ``TrainingSampler`` seeded with ``seed``; with a
    ``TrainingSampler`` the batches come from a ``TrainingBatchSampler`` (``loader.batch_sampler``:
    see the module docstring), with another sampler the stream is neither startable at a batch nor
    seeded per image."""
    _, world = get_rank_and_world_size()
    if total_batch_size <= 0 or total_batch_size % world != 0:
        raise ValueError(
            f"total batch size (SOLVER.IMS_PER_BATCH) must be a positive multiple of the number of "
            f"processes ({world}), got {total_batch_size}"
        )
    batch_size = total_batch_size // world
    dataset = records if isinstance(records, Dataset) else DatasetFromList(records)
    if sampler is None:
        sampler = TrainingSampler(len(dataset), seed=seed)
    if aspect_ratio_grouping and isinstance(records, Dataset):
        raise ValueError("aspect_ratio_grouping needs the records (a list of dicts with width/height), not a Dataset")
    group_ids = aspect_ratio_group_ids(records) if aspect_ratio_grouping else None
    generator = None  # the workers' base seed from the main process' torch RNG
    if isinstance(sampler, TrainingSampler):
        batch_sampler = TrainingBatchSampler(sampler, batch_size, group_ids)
        generator = torch.Generator().manual_seed(rng.derive_seed(sampler.seed, rng.LOADER))
    elif group_ids is not None:
        batch_sampler = GroupedBatchSampler(sampler, group_ids, batch_size)
    else:
        batch_sampler = BatchSampler(sampler, batch_size, drop_last=True)
    return DataLoader(
        MapDataset(dataset, mapper),
        batch_sampler=batch_sampler,
        num_workers=num_workers,
        collate_fn=trivial_batch_collator,
        worker_init_fn=_worker_init_fn(),
        generator=generator,
    )


def make_detection_test_loader(
    records: Union[Sequence[dict], Dataset],
    mapper: Callable[[dict], dict],
    *,
    batch_size: int = 1,
    num_workers: int = 0,
) -> DataLoader:
    """A finite loader over this rank's shard (``InferenceSampler``), in dataset order."""
    dataset = records if isinstance(records, Dataset) else DatasetFromList(records)
    return DataLoader(
        MapDataset(dataset, mapper),
        sampler=InferenceSampler(len(dataset)),
        batch_size=batch_size,
        drop_last=False,
        num_workers=num_workers,
        collate_fn=trivial_batch_collator,
        worker_init_fn=_worker_init_fn(),
    )


def build_detection_train_loader(cfg, mapper: Optional[Callable[[dict], dict]] = None) -> DataLoader:
    """Train loader of ``cfg.DATASETS.TRAIN`` (see ``make_detection_train_loader``)."""
    set_datasets_root(cfg.DATASETS.ROOT or None)
    records = get_detection_dataset_dicts(cfg.DATASETS.TRAIN, filter_empty=cfg.DATALOADER.FILTER_EMPTY_ANNOTATIONS)
    if cfg.MODEL.KEYPOINT_ON and cfg.DATALOADER.MIN_KEYPOINTS_PER_IMAGE > 0:
        records = filter_images_with_few_keypoints(records, cfg.DATALOADER.MIN_KEYPOINTS_PER_IMAGE)
    if cfg.DATALOADER.SAMPLER_TRAIN not in TRAIN_SAMPLERS:
        raise ValueError(
            f"DATALOADER.SAMPLER_TRAIN: unknown sampler {cfg.DATALOADER.SAMPLER_TRAIN!r}; available: {list(TRAIN_SAMPLERS)}"
        )
    return make_detection_train_loader(
        records,
        mapper if mapper is not None else build_from_config(DatasetMapper, cfg, is_train=True),
        cfg.SOLVER.IMS_PER_BATCH,
        aspect_ratio_grouping=cfg.DATALOADER.ASPECT_RATIO_GROUPING,
        num_workers=cfg.DATALOADER.NUM_WORKERS,
        seed=cfg.SEED if cfg.SEED >= 0 else None,
    )


def build_detection_test_loader(cfg, dataset_name: str, mapper: Optional[Callable[[dict], dict]] = None) -> DataLoader:
    """Inference loader of one dataset: every image once across ranks, in batches of
    TEST.IMS_PER_BATCH."""
    set_datasets_root(cfg.DATASETS.ROOT or None)
    records = get_detection_dataset_dicts([dataset_name], filter_empty=False)
    return make_detection_test_loader(
        records,
        mapper if mapper is not None else build_from_config(DatasetMapper, cfg, is_train=False),
        batch_size=cfg.TEST.IMS_PER_BATCH,
        num_workers=cfg.DATALOADER.NUM_WORKERS,
    )
