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
import shutil
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
# float-cast-overflow: a float to integer conversion out of range (or of NaN) is undefined on the
# host and saturates on the GPU; device code converts through float_to_int.h, and any raw
# conversion left that overflows stops the process with a report (no recovery: it cannot pass).
CAST_CHECK = ["-fsanitize=float-cast-overflow", "-fno-sanitize-recover=float-cast-overflow"]
# -std=c++20 (std::atomic_ref) after torch's own: older torch builds extensions as C++17.
FLAGS = ["-std=c++20", "-O2", "-ffp-contract=off", *CAST_CHECK]
TSAN_FLAGS = ["-std=c++20", "-O1", "-g", "-ffp-contract=off", "-fsanitize=thread", *CAST_CHECK]


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
            extra_ldflags=[*(["-fsanitize=thread"] if tsan else []), CAST_CHECK[0]],
            extra_include_paths=[ROOT],
            build_directory=build_directory(name, flags),
            is_python_module=False,
        )
    return torch.ops.detcore_emulated


# g++ flags that fuse a * b + c where it can, as nvcc compiles device code (-fmad=true).
DEVICE_FMA_FLAGS = ["-std=c++20", "-O2", "-mfma", "-ffp-contract=fast"]


def fma_probe(flags=DEVICE_FMA_FLAGS, compiler="g++"):
    """Builds fma_probe.cpp with these flags; its path. The default builds the device geometry
    with FMA contraction on; flags with -DDETCORE_FMA_PROBE_HOST build the host one (compiler
    may be nvcc, with -x cu: the host half of a .cu file)."""
    flags = list(flags)
    path = os.path.join(build_directory("fma_probe", [compiler, *flags]), "fma_probe")
    if not os.path.exists(path):
        source = os.path.join(HERE, "fma_probe.cpp")
        subprocess.run([compiler, *flags, "-I", ROOT, source, "-o", path + ".tmp"], check=True)
        os.replace(path + ".tmp", path)  # whole, even if another test run builds it too
    return path


# The mutation probe: ThreadSanitizer and the float-cast check, no ATen, so that it builds in
# seconds, from the real headers or from a mutated copy.
PROBE_FLAGS = ["-std=c++20", "-O1", "-g", "-pthread", "-ffp-contract=off", "-fsanitize=thread", *CAST_CHECK]


def mutation_probes(mutations):
    """Builds mutation_probe.cpp for each of `mutations` ({name: None or (path, old, new)}), in
    parallel, and returns {name: executable}. A mutation replaces `old`, which must occur exactly
    once, by `new` in a copy of detcore/<path>; None builds from detcore's own headers."""
    built, jobs = {}, []
    for name, mutation in mutations.items():
        directory = build_directory("mutation_probe", PROBE_FLAGS + [repr(mutation)])
        path = os.path.join(directory, "mutation_probe")
        built[name] = path
        if os.path.exists(path):
            continue
        include = ROOT
        if mutation is not None:
            include = os.path.join(directory, "src")
            shutil.rmtree(include, ignore_errors=True)
            shutil.copytree(os.path.join(ROOT, "detcore", "csrc"), os.path.join(include, "detcore", "csrc"))
            target = os.path.join(include, "detcore", mutation[0])
            with open(target) as f:
                text = f.read()
            if text.count(mutation[1]) != 1:
                raise AssertionError(f"mutation {name}: {mutation[1]!r} is not once in {mutation[0]}")
            with open(target, "w") as f:
                f.write(text.replace(mutation[1], mutation[2]))
        sources = [os.path.join(HERE, "mutation_probe.cpp"), os.path.join(HERE, "cuda_emulation.cpp")]
        command = ["g++", *PROBE_FLAGS, "-I", HERE, "-I", include, *sources, "-o", path + ".tmp"]
        jobs.append((path, subprocess.Popen(command, stderr=subprocess.PIPE, text=True)))
    for path, job in jobs:
        _, errors = job.communicate()
        if job.returncode != 0:
            raise RuntimeError(f"building {path} failed:\n{errors}")
        os.replace(path + ".tmp", path)  # whole, even if another test run builds it too
    return built
