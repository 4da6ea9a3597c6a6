"""The one way the benchmark scripts time a call: wall time in milliseconds, with the device
synchronized before and after (CUDA runs asynchronously: without it a kernel launch would be
timed, not the kernel), and the median of the repeats.

The scripts interleave their competitors call by call (detcore, then torchvision, then detcore...)
so that a change of load on a shared machine hits every side alike; that is why they do not use
``torch.utils.benchmark.Timer``, which times one statement in blocks of its own.

    result, ms = timed_ms(fn, device)
    times = interleaved({"eager": f, "onnx": g}, repeats=5)   # {name: [ms, ...]}
"""
import statistics
import time
from typing import Callable, Dict, List, Optional

import torch


def synchronize(device) -> None:
    """Waits for the device's queued work (a no-op on the CPU or when ``device`` is None)."""
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def timed_ms(fn: Callable, device=None):
    """(fn's result, its wall time in ms), the device synchronized before and after."""
    synchronize(device)
    start = time.perf_counter()
    result = fn()
    synchronize(device)
    return result, (time.perf_counter() - start) * 1000


def median(times: List[float]) -> Optional[float]:
    """The median of a list of times; None for no times (a side that was not timed)."""
    return statistics.median(times) if times else None


def interleaved(fns: Dict[str, Callable], repeats: int, device=None) -> Dict[str, List[float]]:
    """Calls every function in turn, ``repeats`` rounds: {name: [ms of each round]}."""
    if repeats < 0:
        raise ValueError(f"interleaved: repeats must be >= 0, got {repeats}")
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            times[name].append(timed_ms(fn, device)[1])
    return times
