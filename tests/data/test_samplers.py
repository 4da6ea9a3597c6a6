import itertools
import json
import os

import pytest

from detcore.data.samplers import (
    GroupedBatchSampler,
    InferenceSampler,
    StreamItem,
    TrainingBatchSampler,
    TrainingSampler,
    aspect_ratio_group_ids,
)


def take(iterable, n):
    return list(itertools.islice(iterable, n))


def test_training_sampler_is_endless_epochs_of_permutations():
    stream = take(TrainingSampler(7, seed=0), 7 * 4)
    for epoch in range(4):
        assert sorted(stream[epoch * 7 : (epoch + 1) * 7]) == list(range(7))
    assert stream[:7] != stream[7:14] or stream[7:14] != stream[14:21]  # reshuffled each epoch
    assert take(TrainingSampler(5, shuffle=False, seed=0), 12) == [0, 1, 2, 3, 4] * 2 + [0, 1]


def test_training_sampler_seed_determinism():
    assert take(TrainingSampler(50, seed=3), 200) == take(TrainingSampler(50, seed=3), 200)
    assert take(TrainingSampler(50, seed=3), 200) != take(TrainingSampler(50, seed=4), 200)


@pytest.mark.parametrize("world", [2, 3])
def test_training_sampler_shards_are_disjoint_and_cover_the_stream(world):
    size = 12
    full = take(TrainingSampler(size, seed=7, rank=0, world_size=1), size * 2)
    shards = [take(TrainingSampler(size, seed=7, rank=r, world_size=world), size * 2 // world) for r in range(world)]
    for r, shard in enumerate(shards):
        assert shard == full[r::world]
    # Within one epoch the ranks see disjoint images, together all of them.
    first_epoch = [s[: size // world] for s in shards]
    assert sorted(sum(first_epoch, [])) == list(range(size))


def test_inference_sampler_shards():
    for size in (0, 1, 7, 10):
        for world in (1, 2, 3, 4):
            shards = [list(InferenceSampler(size, rank=r, world_size=world)) for r in range(world)]
            assert sum(shards, []) == list(range(size))  # contiguous, in order, no duplicates
            assert max(map(len, shards)) - min(map(len, shards)) <= 1
            lengths = [len(InferenceSampler(size, rank=r, world_size=world)) for r in range(world)]
            assert lengths == list(map(len, shards))


def test_bad_shards():
    with pytest.raises(ValueError, match="rank"):
        TrainingSampler(5, seed=0, rank=2, world_size=2)
    with pytest.raises(ValueError, match="size"):
        InferenceSampler(-1)
    with pytest.raises(ValueError, match="size"):
        TrainingSampler(0, seed=0)


def test_grouped_batches_are_single_group():
    records = [{"width": 10 + (i % 3), "height": 11} for i in range(30)]  # w 10, 11: portrait/square; 12: landscape
    groups = aspect_ratio_group_ids(records)
    assert groups.tolist() == [1, 1, 0] * 10
    batches = take(GroupedBatchSampler(TrainingSampler(30, seed=1), groups, 4), 40)
    assert all(len(b) == 4 for b in batches)
    assert all(len({int(groups[i]) for i in b}) == 1 for b in batches)
    assert {int(groups[b[0]]) for b in batches} == {0, 1}


def test_grouped_batches_keep_sampler_order_within_group():
    groups = [0, 1, 0, 1, 0, 1]
    batches = list(GroupedBatchSampler(iter(range(6)), groups, 2))
    assert batches == [[0, 2], [1, 3]]  # 4 and 5 wait for a partner that never comes


def test_stream_items_are_the_sampler_indices_with_their_place_in_the_stream():
    for world in (1, 3):
        for rank in range(world):
            sampler = TrainingSampler(7, seed=5, rank=rank, world_size=world)
            items = take(sampler.items(), 20)
            assert [item.index for item in items] == take(iter(sampler), 20)
            # Positions count the stream of all ranks: this rank's share, unique, whatever the world.
            assert [item.position for item in items] == list(range(rank, rank + 20 * world, world))
            assert all(item.seed == 5 for item in items)


@pytest.mark.parametrize("grouped", [False, True])
def test_a_batch_stream_started_at_k_is_the_uninterrupted_stream_from_batch_k(grouped):
    # Batch k does not depend on where the stream started: a resumed run gets the batches an
    # uninterrupted one would have got. With grouping, the leftovers waiting in the buckets at
    # batch k depend on every batch before it: they are replayed, not restarted.
    groups = [0, 1, 1, 0, 1, 1, 1, 0, 1, 1, 1] if grouped else None
    whole = take(TrainingBatchSampler(TrainingSampler(11, seed=2), 3, groups), 40)
    assert all(len(b) == 3 and all(isinstance(i, StreamItem) for i in b) for b in whole)
    if grouped:
        assert all(len({groups[i.index] for i in b}) == 1 for b in whole)
    positions = [i.position for b in whole for i in b]
    assert len(set(positions)) == len(positions)
    for k in (1, 7, 25):
        batches = TrainingBatchSampler(TrainingSampler(11, seed=2), 3, groups)
        batches.start_at(k)
        assert take(batches, 40 - k) == whole[k:]
    # Without the replay the stream would differ from batch k on (the test can fail).
    restarted = TrainingBatchSampler(TrainingSampler(11, seed=2), 3, groups)
    assert take(restarted, 15) != whole[25:40]


def test_batch_stream_seed_and_arguments():
    batches = TrainingBatchSampler(TrainingSampler(6, seed=1), 2)
    batches.seed = 9
    assert batches.seed == 9 and all(i.seed == 9 for b in take(batches, 3) for i in b)
    assert take(batches, 3) == take(TrainingBatchSampler(TrainingSampler(6, seed=9), 2), 3)
    with pytest.raises(ValueError, match="start_at: batch must be an int >= 0"):
        batches.start_at(-1)
    with pytest.raises(ValueError, match="seed must be an int >= 0"):
        batches.seed = -3
    with pytest.raises(ValueError, match="seed must be an int >= 0 or None"):
        TrainingSampler(6, seed=-1)
    with pytest.raises(ValueError, match=r"group_ids must have one entry per dataset item \(6\)"):
        TrainingBatchSampler(TrainingSampler(6, seed=1), 2, [0, 1])
    with pytest.raises(TypeError, match="must be a TrainingSampler"):
        TrainingBatchSampler(range(6), 2)


def _distributed_worker(rank, world, init_file, out_dir):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        train = take(TrainingSampler(10), 5)  # seed=None: drawn on rank 0, shared
        result = {"train": train, "inference": list(InferenceSampler(10))}
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump(result, f)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # spawns two fresh interpreters
def test_real_process_group_shards(tmp_path):
    """Two gloo processes: ranks come from torch.distributed, the random seed is shared."""
    import torch.multiprocessing as mp

    mp.spawn(_distributed_worker, args=(2, str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True)
    results = [json.load(open(tmp_path / f"rank{r}.json")) for r in range(2)]
    assert sorted(results[0]["train"] + results[1]["train"]) == list(range(10))
    assert results[0]["inference"] + results[1]["inference"] == list(range(10))
