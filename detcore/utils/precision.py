"""Inference precision (TEST.PRECISION): float32, or bfloat16 under ``torch.autocast``; and
whether this CPU computes bfloat16 natively.

    with inference_autocast(cfg.TEST.PRECISION, cfg.MODEL.DEVICE):
        outputs = model(inputs)

Under bfloat16 autocast the convolutions and matrix products of the network run in bfloat16;
the steps whose rounding would change which boxes or mask pixels are kept compute in float32
whatever the caller's autocast (see the comments at those places): the RPN's logits and deltas
and the box head's deltas and class scores are cast to float32 before decoding, softmax and NMS
(fast_rcnn.py, rpn.py, box_regression.py); NMS and ROIAlign compute in float32 (their autocast
kernels in csrc/autocast.cpp); mask pasting and TTA's box voting, matrix products that autocast
would round, switch it off (``detcore.layers.autocast.full_precision``, a layer below this one:
structures use it). The mask head's sigmoid is taken in float32.

bfloat16 is fast on CPUs that have instructions for it: Intel AMX (``amx_bf16``), AVX512-BF16
(``avx512_bf16``: Intel Cooper Lake and later, AMD Zen 4 and later) and Arm's BF16 extension
(``bf16``). Elsewhere oneDNN emulates it with float32 arithmetic plus conversions, slower than
plain float32: a one-line warning says so when bfloat16 inference starts there.
"""
import contextlib
import functools
import logging
from typing import Dict, List

import torch

from detcore.config.choices import INFERENCE_PRECISIONS

__all__ = [
    "NATIVE_BFLOAT16_FEATURES",
    "cpu_bfloat16_features",
    "cpu_bfloat16_summary",
    "cpu_int8_features",
    "cpu_int8_summary",
    "has_native_cpu_bfloat16",
    "inference_autocast",
]

logger = logging.getLogger(__name__)

# CPU feature (as torch.cpu.get_capabilities and /proc/cpuinfo name it) -> what it is.
NATIVE_BFLOAT16_FEATURES: Dict[str, str] = {
    "amx_bf16": "AMX",
    "avx512_bf16": "AVX512-BF16",
    "bf16": "Arm BF16",
}


_CPUINFO = "/proc/cpuinfo"


def _cpu_capabilities() -> Dict[str, object]:
    """torch's own query of the CPU (cpuinfo, the same detection oneDNN's dispatch relies on);
    the flags of /proc/cpuinfo where this torch has no such query."""
    get_capabilities = getattr(torch.cpu, "get_capabilities", None)
    if get_capabilities is not None:
        return dict(get_capabilities())
    flags = set()
    try:
        with open(_CPUINFO) as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):  # x86, Arm
                    flags.update(value.split())
    except OSError:
        pass
    return {name: True for name in flags}


def cpu_bfloat16_features() -> List[str]:
    """The native bfloat16 features of this CPU (keys of ``NATIVE_BFLOAT16_FEATURES``); empty
    when bfloat16 would be emulated."""
    capabilities = _cpu_capabilities()
    return [name for name in NATIVE_BFLOAT16_FEATURES if capabilities.get(name)]


def has_native_cpu_bfloat16() -> bool:
    return bool(cpu_bfloat16_features())


def cpu_bfloat16_summary() -> str:
    """One line for the environment report: native (which features) or emulated."""
    features = cpu_bfloat16_features()
    if features:
        names = ", ".join(f"{NATIVE_BFLOAT16_FEATURES[f]} ({f})" for f in features)
        return f"native: {names}"
    return "emulated (no AMX, AVX512-BF16 or Arm BF16): TEST.PRECISION bfloat16 would be slower than float32"


# int8 dot-product instructions (what an int8 export needs to pay; detcore.export.quantize).
NATIVE_INT8_FEATURES: Dict[str, str] = {
    "amx_int8": "AMX",
    "avx512_vnni": "AVX512-VNNI",
    "avx_vnni": "AVX-VNNI",
    "asimddp": "Arm dot product",
}


def cpu_int8_features() -> List[str]:
    """The int8 dot-product features of this CPU (keys of ``NATIVE_INT8_FEATURES``); empty when
    int8 matrix products would be emulated with wider instructions."""
    capabilities = _cpu_capabilities()
    return [name for name in NATIVE_INT8_FEATURES if capabilities.get(name)]


def cpu_int8_summary() -> str:
    """One line for the environment report: int8 dot products native (which) or emulated."""
    features = cpu_int8_features()
    if features:
        return "native: " + ", ".join(f"{NATIVE_INT8_FEATURES[f]} ({f})" for f in features)
    return "emulated (no AVX512-VNNI, AVX-VNNI, AMX or Arm dot product): an int8 export may be slower than float32"


@functools.lru_cache(maxsize=None)
def _warn_emulated() -> None:
    # Once per process: a warning per image would bury the log.
    logger.warning(
        "TEST.PRECISION bfloat16 on a CPU without native bfloat16 (no AMX, AVX512-BF16 or Arm BF16): it is "
        "emulated and will be slower than float32"
    )


def check_precision(precision: str) -> None:
    if precision not in INFERENCE_PRECISIONS:
        raise ValueError(f"TEST.PRECISION must be one of {list(INFERENCE_PRECISIONS)}, got {precision!r}")


def inference_autocast(precision: str, device) -> contextlib.AbstractContextManager:
    """The context to run inference in at ``precision`` ("float32" or "bfloat16") on ``device``
    (a torch.device or its name): nothing for float32, ``torch.autocast(bfloat16)`` otherwise.
    On a CPU without native bfloat16 it warns (once) that this will be slow."""
    check_precision(precision)
    if precision == "float32":
        return contextlib.nullcontext()
    device_type = torch.device(device).type
    if device_type == "cpu" and not has_native_cpu_bfloat16():
        _warn_emulated()
    return torch.autocast(device_type, dtype=torch.bfloat16)
