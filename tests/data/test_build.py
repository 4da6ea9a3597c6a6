"""Loaders end to end on the tiny shapes split."""
import pytest
import torch

from detcore.config import get_cfg
from detcore.data import build as build_module
from detcore.data import samplers as samplers_module
from detcore.data import (
    DatasetCatalog,
    DatasetFromList,
    build_detection_test_loader,
    build_detection_train_loader,
    get_detection_dataset_dicts,
)
from detcore.structures import BitMasks, Boxes, Instances


def tiny_cfg(name, workers=0):
    cfg = get_cfg()
    cfg.DATASETS.TRAIN = (name,)
    cfg.DATASETS.TEST = (name,)
    cfg.MODEL.MASK_ON = True
    cfg.INPUT.MIN_SIZE_TRAIN = (64, 80)
    cfg.INPUT.MAX_SIZE_TRAIN = 160
    cfg.INPUT.MIN_SIZE_TEST = 72
    cfg.INPUT.MAX_SIZE_TEST = 160
    cfg.SOLVER.IMS_PER_BATCH = 4
    cfg.DATALOADER.NUM_WORKERS = workers
    cfg.SEED = 11
    return cfg


def check_input_dict(d, train):
    expected = {"file_name", "image_id", "height", "width", "image"} | ({"instances"} if train else set())
    assert set(d) == expected
    assert d["image"].dtype == torch.uint8 and d["image"].shape[0] == 3
    assert isinstance(d["height"], int) and isinstance(d["width"], int) and isinstance(d["image_id"], int)
    if train:
        inst = d["instances"]
        assert isinstance(inst, Instances) and inst.image_size == tuple(d["image"].shape[1:])
        assert isinstance(inst.gt_boxes, Boxes) and inst.gt_classes.dtype == torch.int64
        assert len(inst.gt_masks) == len(inst)


def test_dataset_from_list_round_trips_and_copies():
    records = [{"file_name": f"{i}.png", "annotations": [{"bbox": [i, 0, 1, 1]}]} for i in range(5)]
    ds = DatasetFromList(records)
    assert len(ds) == 5 and [ds[i] for i in range(5)] == records
    ds[0]["annotations"].clear()
    assert ds[0] == records[0]


def test_get_detection_dataset_dicts_concatenates(tiny_shapes):
    one = get_detection_dataset_dicts(tiny_shapes)
    two = get_detection_dataset_dicts([tiny_shapes, tiny_shapes])
    assert len(two) == 2 * len(one) and two[: len(one)] == one
    with pytest.raises(KeyError, match="not registered"):
        get_detection_dataset_dicts(["no_such_dataset"])


def test_train_loader_batches(tiny_shapes):
    loader = build_detection_train_loader(tiny_cfg(tiny_shapes))
    records = {r["image_id"]: r for r in DatasetCatalog.get(tiny_shapes)}
    orientations = set()
    for batch in _take(loader, 6):
        assert isinstance(batch, list) and len(batch) == 4
        for d in batch:
            check_input_dict(d, train=True)
        # Aspect-ratio grouping: one orientation per batch (from the original sizes).
        landscape = {records[d["image_id"]]["width"] > records[d["image_id"]]["height"] for d in batch}
        assert len(landscape) == 1
        orientations |= landscape
    assert orientations == {True, False}


def _take(loader, n):
    out = []
    for batch in loader:
        out.append(batch)
        if len(out) == n:
            break
    return out


def test_train_loader_is_reproducible_with_a_seed(tiny_shapes):
    def ids():
        torch.manual_seed(0)
        return [[d["image_id"] for d in b] for b in _take(build_detection_train_loader(tiny_cfg(tiny_shapes)), 5)]

    assert ids() == ids()


def test_train_loader_bitmask_and_no_grouping(tiny_shapes):
    cfg = tiny_cfg(tiny_shapes)
    cfg.INPUT.MASK_FORMAT = "bitmask"
    cfg.DATALOADER.ASPECT_RATIO_GROUPING = False
    cfg.SOLVER.IMS_PER_BATCH = 3
    (batch,) = _take(build_detection_train_loader(cfg), 1)
    assert len(batch) == 3
    assert all(isinstance(d["instances"].gt_masks, BitMasks) for d in batch)


def test_train_loader_with_two_workers(tiny_shapes):
    batches = _take(build_detection_train_loader(tiny_cfg(tiny_shapes, workers=2)), 3)
    assert len(batches) == 3
    for batch in batches:
        assert len(batch) == 4
        for d in batch:
            check_input_dict(d, train=True)


def test_batch_is_split_across_ranks(tiny_shapes, monkeypatch):
    """As rank 1 of 2: half the total batch, taken from every other position of the stream."""
    for module in (build_module, samplers_module):
        monkeypatch.setattr(module, "get_rank_and_world_size", lambda: (1, 2))
    cfg = tiny_cfg(tiny_shapes)
    cfg.DATALOADER.ASPECT_RATIO_GROUPING = False
    records = get_detection_dataset_dicts(tiny_shapes)  # what the loader indexes into
    batches = _take(build_detection_train_loader(cfg), 3)
    assert all(len(b) == 2 for b in batches)
    it = iter(samplers_module.TrainingSampler(len(records), seed=cfg.SEED, rank=0, world_size=1))
    full = [next(it) for _ in range(12)]
    assert [d["image_id"] for b in batches for d in b] == [records[i]["image_id"] for i in full[1::2]]
    cfg.SOLVER.IMS_PER_BATCH = 3
    with pytest.raises(ValueError, match="multiple of the number of processes"):
        build_detection_train_loader(cfg)


def _stream(cfg, start, n):
    loader = build_detection_train_loader(cfg)
    loader.batch_sampler.start_at(start)
    return _take(loader, n)


def _assert_same_batches(a, b):
    assert len(a) == len(b)
    for batch_a, batch_b in zip(a, b):
        assert [d["image_id"] for d in batch_a] == [d["image_id"] for d in batch_b]
        for da, db in zip(batch_a, batch_b):
            assert torch.equal(da["image"], db["image"])
            assert torch.equal(da["instances"].gt_boxes.tensor, db["instances"].gt_boxes.tensor)


@pytest.mark.filterwarnings("ignore:This DataLoader will create 4 worker processes")
def test_batch_k_is_the_same_from_any_start_and_with_any_worker_count(tiny_shapes):
    # What a resumed run relies on: the loader started at batch k gives the images and the
    # augmentations (a random short side of two, a random flip, a random brightness) that an
    # uninterrupted loader gives at batch k, whether loading happens in the main process or in
    # 1 or 4 workers (each augmentation draws from the stream of the image's position).
    cfg = tiny_cfg(tiny_shapes)
    cfg.INPUT.COLOR_JITTER.BRIGHTNESS = 0.3
    whole = _stream(cfg, 0, 8)
    assert {min(d["image"].shape[1:]) for b in whole for d in b} == {64, 80}  # the draws do vary
    for workers in (0, 1, 4):
        cfg.DATALOADER.NUM_WORKERS = workers
        _assert_same_batches(_stream(cfg, 5, 3), whole[5:8])
    _assert_same_batches(_stream(cfg, 0, 8), whole)  # 4 workers from the start too


def test_loading_in_the_main_process_leaves_its_random_state_alone(tiny_shapes):
    import random

    import numpy as np

    loader = iter(build_detection_train_loader(tiny_cfg(tiny_shapes)))
    before = random.getstate(), np.random.get_state(), torch.get_rng_state()
    next(loader)
    after = np.random.get_state()
    assert random.getstate() == before[0]
    assert (after[1] == before[1][1]).all() and after[2:] == before[1][2:]  # the key and the position in it
    assert torch.equal(torch.get_rng_state(), before[2])


def test_test_loader_yields_every_image_once(tiny_shapes):
    loader = build_detection_test_loader(tiny_cfg(tiny_shapes), tiny_shapes)
    batches = list(loader)
    assert len(loader) == len(batches) == 20 and all(len(b) == 1 for b in batches)
    for (d,) in batches:
        check_input_dict(d, train=False)
        assert min(d["image"].shape[1:]) == 72
    assert [b[0]["image_id"] for b in batches] == [r["image_id"] for r in DatasetCatalog.get(tiny_shapes)]


def test_test_loader_batches_test_ims_per_batch_images_in_order(tiny_shapes):
    cfg = tiny_cfg(tiny_shapes)
    cfg.TEST.IMS_PER_BATCH = 3
    batches = list(build_detection_test_loader(cfg, tiny_shapes))
    assert [len(b) for b in batches] == [3] * 6 + [2]  # 20 images, the last batch partial
    ids = [d["image_id"] for b in batches for d in b]
    assert ids == [r["image_id"] for r in DatasetCatalog.get(tiny_shapes)]


def test_unknown_sampler_name(tiny_shapes):
    cfg = tiny_cfg(tiny_shapes)
    cfg.DATALOADER.SAMPLER_TRAIN = "RepeatFactorTrainingSampler"
    with pytest.raises(ValueError, match="TrainingSampler"):
        build_detection_train_loader(cfg)
