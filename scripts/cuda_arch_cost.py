#!/usr/bin/env python
"""What a GPU arch list costs to build: each of detcore's .cu files compiled by nvcc, alone, once
per arch list, with setup.py's flags; the CPU seconds of the whole nvcc process tree (user +
system: what the list costs, however loaded the machine) and the wall time.

    python scripts/cuda_arch_cost.py                        # all .cu files; 9.0, CI's and the default list
    python scripts/cuda_arch_cost.py --files roi_align_kernel --lists "9.0" "default"

"default" is detcore's list for FORCE_CUDA=1 without a GPU (detcore/utils/build_config.py).
Prints a markdown table with the ratio to the first list, the machine, nvcc and the load;
saves benchmark_results/cuda_arch_cost.json. The C++ files are not compiled: no list changes them.
"""
import argparse
import glob
import json
import os
import resource
import subprocess
import sys
import sysconfig
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from detcore.utils import build_config  # noqa: E402
from detcore.utils.collect_env import cpu_name  # noqa: E402

CI_LIST = "7.5;9.0+PTX"  # .ci/run's


def gencode_flags(arch_list):
    """'7.5;9.0+PTX' -> nvcc's -gencode flags: SASS for each arch, PTX of those marked +PTX."""
    flags = []
    for arch in arch_list.replace(" ", ";").split(";"):
        if not arch:
            continue
        number = arch.replace("+PTX", "").replace(".", "")
        flags.append(f"-gencode=arch=compute_{number},code=sm_{number}")
        if arch.endswith("+PTX"):
            flags.append(f"-gencode=arch=compute_{number},code=compute_{number}")
    return flags


def compile_flags(cuda_home):
    """setup.py's nvcc command line, less the arch flags."""
    from torch.utils.cpp_extension import include_paths

    includes = [f"-I{path}" for path in include_paths()]
    includes += [f"-I{os.path.join(cuda_home, 'include')}", f"-I{sysconfig.get_paths()['include']}"]
    for folder in build_config.pip_cuda_include_dirs(sys.path):
        includes += ["-isystem", folder]
    return ["-DWITH_CUDA", *includes, "-c", "-std=c++20", "-Xcompiler=-fPIC",
            "-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__",
            "-D__CUDA_NO_BFLOAT16_CONVERSIONS__", "-D__CUDA_NO_HALF2_OPERATORS__",
            "-DTORCH_API_INCLUDE_EXTENSION_H", "-DTORCH_EXTENSION_NAME=_C", *build_config.NVCC_FLAGS]


def measure(cuda_home, source, arch_list, scratch):
    """(CPU seconds, wall seconds) of one nvcc compile of source for arch_list."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    out = subprocess.run(
        [os.path.join(cuda_home, "bin", "nvcc"), *compile_flags(cuda_home), *gencode_flags(arch_list), source, "-o", os.path.join(scratch, "out.o")],
        capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode != 0:
        sys.exit(f"nvcc failed on {source} for {arch_list!r}:\n{out.stderr[-3000:]}")
    return after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, wall


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--files", nargs="+", help="names under detcore/csrc/cuda without .cu (default: all)")
    parser.add_argument("--lists", nargs="+", default=["9.0", CI_LIST, "default"],
                        help='TORCH_CUDA_ARCH_LIST values, or "default"; the first is the ratios\' base')
    args = parser.parse_args(argv)
    cuda_home = build_config.find_cuda_home()
    if cuda_home is None:
        sys.exit("cuda_arch_cost: no CUDA toolkit found (set CUDA_HOME)")
    nvcc = os.path.join(cuda_home, "bin", "nvcc")
    lists = [build_config.default_cuda_arch_list(build_config.nvcc_gpu_archs(nvcc)) if name == "default" else name
             for name in args.lists]
    sources = sorted(glob.glob(os.path.join(ROOT, "detcore", "csrc", "cuda", "*.cu")))
    if args.files:
        sources = [os.path.join(ROOT, "detcore", "csrc", "cuda", f"{name}.cu") for name in args.files]
    version = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1]
    load = os.getloadavg()
    rows = []
    with tempfile.TemporaryDirectory(prefix="detcore_arch_cost_") as scratch:
        for source in sources:
            for arch_list in lists:
                cpu, wall = measure(cuda_home, source, arch_list, scratch)
                rows.append(dict(file=os.path.basename(source), arch_list=arch_list, cpu_s=round(cpu, 1),
                                 wall_s=round(wall, 1)))
                print(f"{rows[-1]['file']} {arch_list}: {cpu:.1f} s CPU, {wall:.1f} s wall", flush=True)
    totals = {arch_list: sum(r["cpu_s"] for r in rows if r["arch_list"] == arch_list) for arch_list in lists}
    report = dict(cpu=cpu_name(), cores=os.cpu_count(), nvcc=version, load_before=load,
                  load_after=os.getloadavg(), rows=rows, total_cpu_s=totals)
    os.makedirs(os.path.join(ROOT, "benchmark_results"), exist_ok=True)
    with open(os.path.join(ROOT, "benchmark_results", "cuda_arch_cost.json"), "w") as f:
        json.dump(report, f, indent=1)
    print(f"\n{cpu_name()}, {os.cpu_count()} cores, {version}, load {load[0]:.1f} -> {os.getloadavg()[0]:.1f}\n")
    print("| file | " + " | ".join(f"`{a}` CPU s" for a in lists) + " |")
    print("|---" * (1 + len(lists)) + "|")
    for source in sources:
        name = os.path.basename(source)
        cells = [next(r["cpu_s"] for r in rows if r["file"] == name and r["arch_list"] == a) for a in lists]
        print(f"| {name} | " + " | ".join(f"{c:.0f}" for c in cells) + " |")
    base = totals[lists[0]]
    print("| all | " + " | ".join(f"{totals[a]:.0f} ({totals[a] / base:.2f}x)" for a in lists) + " |")


if __name__ == "__main__":
    main()
