"""Builds and loads the CUDA emulation: detcore's device code compiled by the host compiler.

``load()`` compiles the sources next to this file with torch.utils.cpp_extension and returns
``torch.ops.detcore_emulated``. It compiles once: the build directory, under
~/.cache/detcore/emulated_ops (or $XDG_CACHE_HOME/detcore/emulated_ops), is named after a hash
of every source and header the build reads (path and content), the flags and the torch
version, so a second run reuses it and an edit makes a new one.

With DETCORE_EMULATION_TSAN=1 it builds with -fsanitize=thread instead. Python is not built with
ThreadSanitizer, so its runtime must be loaded first: scripts/test_emulation_tsan.sh runs the
tests that way.
"""
import glob
import hashlib
import os
import subprocess

import torch
from torch.utils.cpp_extension import load as _build

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
SOURCES = [
    os.path.join(HERE, name)
    for name in (
        "cuda_emulation.cpp", "emulated_launch.cpp", "emulated_nms.cpp", "emulated_roi_align.cpp",
        "emulated_roi_pool.cpp", "emulated_deform_conv2d.cpp", "emulated_sigmoid_focal_loss.cpp",
    )
]
# -ffp-contract=off: a * b + c is two roundings, never an FMA (see cuda_emulation.h).
FLAGS = ["-O2", "-ffp-contract=off"]
TSAN_FLAGS = ["-O1", "-g", "-ffp-contract=off", "-fsanitize=thread"]


def tsan_requested():
    return os.environ.get("DETCORE_EMULATION_TSAN", "0") == "1"


def _inputs():
    """Every file the build reads: the sources, the emulation, detcore's kernels and headers."""
    csrc = os.path.join(ROOT, "detcore", "csrc")
    files = glob.glob(os.path.join(HERE, "*.cpp")) + glob.glob(os.path.join(HERE, "*.h"))
    files += glob.glob(os.path.join(csrc, "*.h")) + glob.glob(os.path.join(csrc, "cuda", "*.h"))
    files += glob.glob(os.path.join(csrc, "cuda", "*.cuh"))
    return sorted(files)


def build_directory(name, flags):
    digest = hashlib.sha256(repr((flags, torch.__version__)).encode())
    for path in _inputs():
        with open(path, "rb") as f:
            digest.update(path.encode() + b"\0" + f.read())
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    directory = os.path.join(cache, "detcore", "emulated_ops", f"{name}-{digest.hexdigest()[:16]}")
    os.makedirs(directory, exist_ok=True)
    return directory


def _check_tsan_runtime():
    """A -fsanitize=thread library loads only into a process that started with the runtime."""
    with open("/proc/self/maps") as f:
        if "libtsan" not in f.read():
            raise RuntimeError(
                "DETCORE_EMULATION_TSAN=1 needs the ThreadSanitizer runtime preloaded: "
                "run scripts/test_emulation_tsan.sh")
    # The compiler run by the build needs no sanitizer: keep the preload out of its environment.
    os.environ.pop("LD_PRELOAD", None)


def load():
    tsan = tsan_requested()
    if tsan:
        _check_tsan_runtime()
    name = "detcore_emulated_ops_tsan" if tsan else "detcore_emulated_ops"
    flags = TSAN_FLAGS if tsan else FLAGS
    if not hasattr(torch.ops.detcore_emulated, "nms"):
        _build(
            name=name,
            sources=SOURCES,
            extra_cflags=flags,
            extra_ldflags=["-fsanitize=thread"] if tsan else [],
            extra_include_paths=[ROOT],
            build_directory=build_directory(name, flags),
            is_python_module=False,
        )
    return torch.ops.detcore_emulated


def fma_probe():
    """Builds fma_probe.cpp with FMA contraction on (as nvcc compiles device code); its path."""
    flags = ["-std=c++20", "-O2", "-mfma", "-ffp-contract=fast"]
    path = os.path.join(build_directory("fma_probe", flags), "fma_probe")
    if not os.path.exists(path):
        source = os.path.join(HERE, "fma_probe.cpp")
        subprocess.run(["g++", *flags, "-I", ROOT, source, "-o", path + ".tmp"], check=True)
        os.replace(path + ".tmp", path)  # whole, even if another test run builds it too
    return path
