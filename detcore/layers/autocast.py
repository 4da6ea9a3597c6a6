"""The steps that keep float32 under ``torch.autocast``: ``full_precision(device)`` switches
autocast off inside a block.

A few matrix products decide which boxes or mask pixels are kept (mask pasting's interpolation,
TTA's box voting): rounded to bfloat16 they would move values across a threshold, so they run in
float32 whatever precision the caller infers in (TEST.PRECISION, utils/precision.py). The
compiled ops do the same in C++ (their autocast kernels, csrc/autocast.cpp).
"""
import contextlib

import torch

__all__ = ["full_precision"]


def full_precision(device) -> contextlib.AbstractContextManager:
    """Autocast switched off on ``device``'s kind (a torch.device or its name) inside the block;
    nothing when autocast is not on there. The inputs must be float32 too: autocast only ever
    casts an op's inputs, it does not widen tensors that are already bfloat16."""
    device_type = torch.device(device).type
    if device_type not in ("cpu", "cuda") or not torch.is_autocast_enabled(device_type):
        return contextlib.nullcontext()
    return torch.autocast(device_type, enabled=False)
