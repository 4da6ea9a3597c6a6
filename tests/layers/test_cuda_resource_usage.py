"""Every CUDA kernel of detcore._C fits its launch: registers and shared memory, per GPU arch.

The CUDA emulation runs the kernels' code but knows nothing of registers: a kernel whose threads
per block (detcore/csrc/cuda/launch_config.h) times its registers exceed the register file, or
whose static plus dynamic shared memory exceeds what a launch gets, passes every emulated test
and fails at launch on the GPU ("too many resources requested"). This reads what nvcc gave each
kernel of the built extension (cuobjdump --dump-resource-usage: registers, static shared memory,
stack and local memory, per function and arch) and checks it against the launch table below.
Runs where detcore._C has CUDA kernels (CI builds them with FORCE_CUDA=1 for sm_80 and sm_90).
"""
import functools
import glob
import os
import re
import shutil
import subprocess
import sysconfig

import pytest

import detcore._C
from detcore.utils.build_config import find_cuda_home

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# How each kernel is launched (detcore/csrc/cuda/*.cu): its threads per block and the most dynamic
# shared memory its launcher asks for, as C++ expressions over launch_config.h. A kernel of the
# binary that is not here fails the test: add it.
LAUNCHES = {
    "nms_mask_kernel": ("kBlockBoxes", "0"),
    # The largest n whose removed bitmap still goes to shared memory.
    "nms_unwrap_kernel": ("kUnwrapThreads", "nms_launch(kMaxSharedWords * kBlockBoxes).unwrap_shared_bytes"),
    "nms_band_mask_kernel": ("kBlockBoxes", "0"),
    # The widest run (category) whose removed bitmap still goes to shared memory.
    "nms_band_unwrap_kernel": (
        "kUnwrapThreads", "nms_band_launch(kMaxSharedWords, 1, kMaxSharedWords).unwrap_shared_bytes"),
    "roi_align_forward_kernel": ("kRoiAlignThreads", "0"),
    "roi_align_backward_kernel": ("kRoiAlignThreads", "0"),
    "roi_pool_forward_kernel": ("kRoiPoolThreads", "0"),
    "roi_pool_backward_kernel": ("kRoiPoolThreads", "0"),
    "deform_im2col_kernel": ("kDeformConvThreads", "0"),
    "deform_col2im_kernel": ("kDeformConvThreads", "0"),
    "deform_coordinate_grad_kernel": ("kDeformConvThreads", "0"),
    "sigmoid_focal_loss_forward_kernel": ("kFocalLossThreads", "0"),
    "sigmoid_focal_loss_sum_kernel": ("kFocalLossThreads", "0"),
    "sigmoid_focal_loss_backward_kernel": ("kFocalLossThreads", "0"),
}

# The same on every arch from sm_70 on (the CUDA programming guide's table of compute
# capabilities): a register file of 64K 32-bit registers per block, allocated per warp in units of
# 256, at most 255 per thread; 48 KiB of static + dynamic shared memory per block without opting
# in to more (the launchers do not opt in).
REGISTERS_PER_BLOCK = 65536
REGISTER_UNIT_PER_WARP = 256
REGISTERS_PER_THREAD = 255
SHARED_BYTES = 48 * 1024
MAX_THREADS = 1024


def _cuobjdump():
    """On PATH, in the CUDA toolkit, or the copy that Triton (a dependency of torch) ships."""
    candidates = [shutil.which("cuobjdump")]
    cuda_home = find_cuda_home()
    if cuda_home:
        candidates.append(os.path.join(cuda_home, "bin", "cuobjdump"))
    site = sysconfig.get_paths()["purelib"]
    candidates += sorted(glob.glob(os.path.join(site, "nvidia", "*", "bin", "cuobjdump")))
    candidates.append(os.path.join(site, "triton", "backends", "nvidia", "bin", "cuobjdump"))
    return next((c for c in candidates if c and os.access(c, os.X_OK)), None)


def parse_resource_usage(text):
    """cuobjdump --dump-resource-usage's output as [(arch, mangled name, {REG: .., SHARED: ..})]."""
    usage, arch, function = [], None, None
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("arch ="):
            arch = line.split("=", 1)[1].strip()
        elif line.startswith("Function "):
            function = line[len("Function ") :].rstrip(":")
        elif function is not None and line.startswith("REG:"):
            fields = dict(re.findall(r"(\w+(?:\[\d+\])?):(\d+)", line))
            usage.append((arch, function, {k: int(v) for k, v in fields.items()}))
            function = None
    return usage


def kernel_of(mangled):
    """The LAUNCHES entry whose name is in the mangled name (length-prefixed), or None."""
    found = [name for name in LAUNCHES if f"{len(name)}{name}" in mangled]
    assert len(found) <= 1, (mangled, found)
    return found[0] if found else None


@functools.lru_cache(maxsize=None)
def launch_table(tmp_root):
    """LAUNCHES' expressions evaluated by the C++ compiler over launch_config.h."""
    lines = [f'  std::printf("{name} %lld %lld\\n", (long long)({threads}), (long long)({dynamic}));'
             for name, (threads, dynamic) in LAUNCHES.items()]
    source = os.path.join(tmp_root, "launch_table.cpp")
    with open(source, "w") as f:
        f.write('#include <cstdio>\n#include "detcore/csrc/cuda/launch_config.h"\n'
                "using namespace detcore;\nint main() {\n" + "\n".join(lines) + "\n}\n")
    binary = os.path.join(tmp_root, "launch_table")
    subprocess.run(["g++", "-std=c++17", "-I", ROOT, source, "-o", binary], check=True)
    rows = subprocess.run([binary], capture_output=True, text=True, check=True).stdout.split("\n")
    return {name: (int(threads), int(dynamic)) for name, threads, dynamic in (r.split() for r in rows if r)}


def problems(arch, resources, threads, dynamic_shared):
    """What does not fit when `threads` threads per block with `dynamic_shared` bytes run a
    kernel with `resources` (cuobjdump's fields) on `arch`; empty if it fits."""
    found = []
    if int(arch.removeprefix("sm_").rstrip("af")) < 70:
        found.append(f"{arch} is older than the GPUs these limits are for (sm_70 on)")
    registers = resources["REG"]
    if threads > MAX_THREADS:
        found.append(f"{threads} threads per block (at most {MAX_THREADS})")
    if registers > REGISTERS_PER_THREAD:
        found.append(f"{registers} registers per thread (at most {REGISTERS_PER_THREAD})")
    per_warp = -(-registers * 32 // REGISTER_UNIT_PER_WARP) * REGISTER_UNIT_PER_WARP
    per_block = per_warp * -(-threads // 32)
    if per_block > REGISTERS_PER_BLOCK:
        found.append(
            f"{threads} threads x {registers} registers take {per_block} registers per block "
            f"(at most {REGISTERS_PER_BLOCK})")
    shared = resources["SHARED"] + dynamic_shared
    if shared > SHARED_BYTES:
        found.append(
            f"{resources['SHARED']} bytes of static and {dynamic_shared} of dynamic shared memory "
            f"(at most {SHARED_BYTES} together)")
    if resources.get("LOCAL", 0) or resources.get("STACK", 0):
        found.append(
            f"local memory (LOCAL {resources.get('LOCAL')}, STACK {resources.get('STACK')}): "
            "register spills or arrays indexed at run time, slow on the GPU")
    return found


@pytest.fixture(scope="module")
def resource_usage():
    tool = _cuobjdump()
    if tool is None:
        pytest.skip("no cuobjdump (CUDA toolkit, nvidia wheel or Triton's copy) to read the kernels")
    result = subprocess.run(
        [tool, "--dump-resource-usage", detcore._C.__file__], capture_output=True, text=True)
    usage = parse_resource_usage(result.stdout)
    if result.returncode != 0 or not usage:
        pytest.skip(
            f"detcore._C has no CUDA kernels (built without FORCE_CUDA=1?): {tool} says "
            f"{(result.stderr or result.stdout).strip()[:200]!r}")
    return usage


@pytest.fixture(scope="module")
def launches(tmp_path_factory):
    if shutil.which("g++") is None:
        pytest.skip("needs g++ to evaluate launch_config.h")
    return launch_table(str(tmp_path_factory.mktemp("launch_table")))


def test_every_kernel_fits_its_launch(resource_usage, launches):
    failures, seen = [], {}
    for arch, mangled, resources in resource_usage:
        name = kernel_of(mangled)
        if name is None:
            failures.append(f"{arch} {mangled}: a kernel missing from LAUNCHES (add its launch)")
            continue
        seen.setdefault(arch, set()).add(name)
        failures += [f"{arch} {mangled}: {p}" for p in problems(arch, resources, *launches[name])]
    for arch, names in seen.items():
        failures += [f"{arch}: no kernel {name} in the binary (stale LAUNCHES entry?)"
                     for name in sorted(set(LAUNCHES) - names)]
    assert not failures, "\n".join(failures)


def test_the_check_fails_when_a_launch_outgrows_the_kernel(resource_usage, launches):
    """More threads per block than the registers allow, or dynamic shared memory past 48 KiB."""
    arch, _, resources = max(
        (u for u in resource_usage if kernel_of(u[1]) == "roi_align_backward_kernel"),
        key=lambda u: u[2]["REG"])
    assert resources["REG"] > 64  # over 64 registers, 1024 threads exceed the register file
    assert problems(arch, resources, launches["roi_align_backward_kernel"][0], 0) == []
    assert "registers per block" in problems(arch, resources, 1024, 0)[0]
    arch, _, resources = next(u for u in resource_usage if kernel_of(u[1]) == "nms_unwrap_kernel")
    assert "shared memory" in problems(arch, resources, 256, SHARED_BYTES - resources["SHARED"] + 8)[0]


def test_parse_resource_usage():
    text = """
Fatbin elf code:
================
arch = sm_90
Resource usage:
 Common:
  GLOBAL:0
 Function _ZN7detcore12_GLOBAL__N_117nms_unwrap_kernelEllPKybPyPb:
  REG:31 STACK:0 SHARED:1552 LOCAL:0 CONSTANT[0]:576 TEXTURE:0 SURFACE:0 SAMPLER:0
"""
    [(arch, mangled, resources)] = parse_resource_usage(text)
    assert arch == "sm_90" and kernel_of(mangled) == "nms_unwrap_kernel"
    assert resources["REG"] == 31 and resources["SHARED"] == 1552 and resources["CONSTANT[0]"] == 576
    assert kernel_of("_ZN7detcore12_GLOBAL__N_110new_kernelEv") is None
