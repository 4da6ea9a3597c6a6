#!/usr/bin/env python
"""The machine, for the GPU check's report: one line `FACTS {json}` (host, Python, torch and its
CUDA, cores, CPU, the first GPU's name, compute capability, memory and multiprocessors, the
driver, nvcc, the C++ compiler, whether Python's headers are there). Whatever cannot be read is
left out."""
import json
import os
import platform
import socket
import subprocess
import sysconfig

import torch


def first_line(args, last=False):
    """The first (or last) line a command prints, or None."""
    try:
        out = subprocess.run(args, capture_output=True, text=True, timeout=30).stdout.strip().splitlines()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (out[-1] if last else out[0]) if out else None


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor()


def facts():
    found = {
        "host": socket.gethostname(), "python": platform.python_version(), "torch": torch.__version__,
        "torch_cuda": torch.version.cuda, "cores": os.cpu_count(), "cpu": cpu_name(),
    }
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        found.update(gpu=p.name, capability=f"{p.major}.{p.minor}", gpu_memory_gib=round(p.total_memory / 2**30, 1),
                     multiprocessors=p.multi_processor_count)
    found["driver"] = first_line(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    nvcc = os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc")
    found["nvcc"] = first_line([nvcc, "--version"], last=True) or first_line(["nvcc", "--version"], last=True)
    found["cxx"] = first_line([os.environ.get("CXX", "c++"), "--version"])
    # The _C build and the emulation's include Python.h: a Python without its headers cannot build them.
    found["python_headers"] = os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h"))
    return {k: v for k, v in found.items() if v is not None}


if __name__ == "__main__":
    print("FACTS " + json.dumps(facts()))
