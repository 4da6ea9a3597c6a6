"""Distributed helpers that also work, as no-ops, in a single process.

Processes are started by ``torchrun`` (or any launcher that sets the same environment:
``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``);
``init_distributed`` joins the default process group from those variables. Every other function
asks ``torch.distributed`` and falls back to "rank 0 of 1" when no group is initialized, so the
same training code runs unchanged with one process or many.
"""
import datetime
import logging
import os
import random
from typing import Any, Dict, List, Optional

import numpy as np
import torch
import torch.distributed as dist

__all__ = [
    "init_distributed",
    "destroy_distributed",
    "is_distributed",
    "get_world_size",
    "get_rank",
    "get_local_rank",
    "get_local_size",
    "is_main_process",
    "unwrap_model",
    "resolve_device",
    "synchronize",
    "all_gather",
    "gather",
    "reduce_dict",
    "shared_random_seed",
    "rng_states",
    "set_rng_states",
]

logger = logging.getLogger(__name__)


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value in (None, ""):
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name} must be an integer, got {value!r}") from None


def init_distributed(device: str = "cpu", backend: Optional[str] = None, timeout_minutes: float = 30) -> bool:
    """Join the default process group described by torchrun's environment variables.

    Does nothing (returns False) when ``WORLD_SIZE`` is unset or 1, or when a group already
    exists. ``backend`` defaults to NCCL for a CUDA ``device`` and gloo otherwise; for CUDA the
    current device becomes ``cuda:LOCAL_RANK`` so that ``"cuda"`` means this process' GPU.
    Multi-node runs need nothing more: torchrun's ``--nnodes`` / ``--rdzv-*`` flags set the
    same variables.
    """
    if is_distributed():
        return False
    world_size = _env_int("WORLD_SIZE", 1)
    if world_size <= 1:
        return False
    missing = [v for v in ("RANK", "MASTER_ADDR", "MASTER_PORT") if not os.environ.get(v)]
    if missing:
        raise RuntimeError(
            f"WORLD_SIZE={world_size} but {', '.join(missing)} not set: start distributed runs with "
            f"torchrun (e.g. torchrun --nproc_per_node 2 tools/train_net.py ...)"
        )
    is_cuda = torch.device(device).type == "cuda"
    if backend is None:
        backend = "nccl" if is_cuda else "gloo"
    if is_cuda:
        if not torch.cuda.is_available():
            raise RuntimeError(f"MODEL.DEVICE is {device!r} but CUDA is not available in this process")
        local_rank = get_local_rank()
        if local_rank >= torch.cuda.device_count():
            raise RuntimeError(
                f"LOCAL_RANK {local_rank} has no GPU: this node has {torch.cuda.device_count()} visible GPU(s); "
                f"use at most that many processes per node (--nproc_per_node)"
            )
        torch.cuda.set_device(local_rank)
    dist.init_process_group(
        backend=backend, init_method="env://", timeout=datetime.timedelta(minutes=timeout_minutes)
    )
    logger.info("Joined process group: rank %d of %d (%s)", dist.get_rank(), dist.get_world_size(), backend)
    return True


def destroy_distributed() -> None:
    """Leave the default process group, if any."""
    if is_distributed():
        dist.destroy_process_group()


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def get_world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def get_rank() -> int:
    return dist.get_rank() if is_distributed() else 0


def get_local_rank() -> int:
    """Rank of this process on its machine (torchrun's LOCAL_RANK; 0 without one)."""
    return _env_int("LOCAL_RANK", 0)


def get_local_size() -> int:
    """Processes on this machine (torchrun's LOCAL_WORLD_SIZE; 1 without one)."""
    return _env_int("LOCAL_WORLD_SIZE", 1) if is_distributed() else 1


def resolve_device(name: str) -> torch.device:
    """``torch.device(name)`` for MODEL.DEVICE, after checking this machine has it: a CUDA device
    without a GPU (or past the last GPU), or a device detcore has no kernels for, is an error naming
    the key, not a failure deep in torch."""
    from detcore.config.choices import device_problem

    problem = device_problem(name)
    if problem:
        raise RuntimeError(f"MODEL.DEVICE {problem}, got {name!r}")
    device = torch.device(name)
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise RuntimeError(
                f"MODEL.DEVICE is {name!r}, but torch sees no CUDA GPU on this machine "
                "(torch.cuda.is_available() is False): set MODEL.DEVICE cpu"
            )
        if device.index is not None and device.index >= count:
            raise RuntimeError(f"MODEL.DEVICE is {name!r}, but this machine has {count} CUDA GPU(s): cuda:0 .. cuda:{count - 1}")
    return device


def unwrap_model(model: torch.nn.Module) -> torch.nn.Module:
    """The module inside a DistributedDataParallel wrapper, or ``model`` itself."""
    return model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model


def is_main_process() -> bool:
    return get_rank() == 0


def synchronize() -> None:
    """Barrier across all processes (no-op in a single process)."""
    if get_world_size() == 1:
        return
    if dist.get_backend() == dist.Backend.NCCL:
        # NCCL needs to know the device, or it may pick one another process uses.
        dist.barrier(device_ids=[torch.cuda.current_device()])
    else:
        dist.barrier()


def all_gather(obj: Any) -> List[Any]:
    """Every rank's ``obj`` (any picklable object), in rank order, on every rank."""
    if get_world_size() == 1:
        return [obj]
    out = [None] * get_world_size()
    dist.all_gather_object(out, obj)
    return out


def gather(obj: Any, dst: int = 0) -> List[Any]:
    """Every rank's ``obj`` on rank ``dst`` (in rank order); an empty list on the others."""
    if get_world_size() == 1:
        return [obj]
    if dist.get_backend() == dist.Backend.NCCL:
        # gather_object is not supported by NCCL on all versions; all_gather is.
        out = all_gather(obj)
        return out if get_rank() == dst else []
    out = [None] * get_world_size() if get_rank() == dst else None
    dist.gather_object(obj, out, dst=dst)
    return out if get_rank() == dst else []


def reduce_dict(values: Dict[str, torch.Tensor], average: bool = True) -> Dict[str, torch.Tensor]:
    """Sum (or mean) of each scalar tensor over all ranks, on every rank.

    All ranks must pass the same keys; they are reduced in sorted order in one all_reduce.
    """
    if get_world_size() == 1 or not values:
        return dict(values)
    names = sorted(values)
    stacked = torch.stack([values[k].detach().reshape(()).float() for k in names])
    dist.all_reduce(stacked)
    if average:
        stacked /= get_world_size()
    return dict(zip(names, stacked))


def shared_random_seed() -> int:
    """A random int in [0, 2**31) that is the same on every rank (rank 0's draw)."""
    seed = int(np.random.randint(2**31))
    return int(all_gather(seed)[0])


def rng_states() -> Dict[str, Any]:
    """This process' python / numpy / torch (and CUDA) RNG states, in types that
    ``torch.load(weights_only=True)`` accepts (no numpy arrays)."""
    np_state = np.random.get_state()
    states = {
        "python": random.getstate(),
        "numpy": (np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), int(np_state[2]),
                  int(np_state[3]), float(np_state[4])),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_rng_states(states: Dict[str, Any]) -> None:
    """Restore what ``rng_states`` returned."""
    version, keys, pos, has_gauss, cached = states["numpy"]
    random.setstate(_as_tuple(states["python"]))
    np.random.set_state((version, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():
        cuda_states = states["cuda"]
        if len(cuda_states) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda_states)
        else:
            logger.warning(
                "Not restoring CUDA RNG states: saved for %d GPU(s), %d visible now",
                len(cuda_states), torch.cuda.device_count(),
            )


def _as_tuple(x):
    # A saved python RNG state may come back with lists where random.setstate wants tuples.
    return tuple(_as_tuple(v) for v in x) if isinstance(x, (list, tuple)) else x
