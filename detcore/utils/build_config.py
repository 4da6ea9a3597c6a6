"""The build's decisions: compiler flags, where the CUDA toolkit is, which GPU archs to compile.

setup.py loads this file by path (the package is not importable while it builds), so it uses
the standard library only, and every decision is a function of what it is given (environment,
PATH, folders, nvcc's arch list): tests/utils/test_build_config.py runs them without a GPU.
collect_env and the tests import it as detcore.utils.build_config.
"""
import glob
import os
import re
import shutil
import subprocess

# -ffp-contract=off: a * b + c stays two roundings on the host. The CPU kernels share their
# geometry with the GPU (roi_align_common.h & co.), where the _rn operations round each step;
# a compiler that may emit FMA (aarch64, -march=native, -mfma) would otherwise fuse them and,
# for example, give ROIAlign's adaptive grid another sample count than the GPU's.
FP_FLAGS = ["-ffp-contract=off"]
# OpenMP: at::parallel_for is an inline OpenMP region; without -fopenmp it runs serially.
CXX_FLAGS = ["-O3", "-fopenmp", *FP_FLAGS]
LINK_FLAGS = ["-fopenmp"]  # resolves to the libgomp.so.1 torch has already loaded
# The host half of the .cu files gets the same rule (nvcc passes no cxx flags on its own).
# Device code keeps nvcc's -fmad=true: what must not fuse there uses the _rn intrinsics.
NVCC_FLAGS = ["-O3", "--expt-relaxed-constexpr", *(f"-Xcompiler={f}" for f in FP_FLAGS)]

# The GPU archs of a build for GPUs other than the one at hand (FORCE_CUDA=1, no GPU visible, no
# TORCH_CUDA_ARCH_LIST): the SASS set of torch's own CUDA 13 wheels, Turing to Blackwell (a
# cubin also runs on the later minor versions of its major: sm_80 on an RTX 30/40 or an L4,
# sm_120 on a GB10), plus the newest one's PTX, which the driver compiles at first use for a
# GPU newer than the list. README's Install section says what each costs to build.
DEFAULT_CUDA_ARCHS = ("7.5", "8.0", "8.6", "9.0", "10.0", "12.0")


def _is_toolkit(folder):
    """A CUDA toolkit folder: bin/nvcc and the runtime headers (include/ or conda's targets/)."""
    if not folder or not os.access(os.path.join(folder, "bin", "nvcc"), os.X_OK):
        return False
    header = "cuda_runtime_api.h"
    return os.path.isfile(os.path.join(folder, "include", header)) or bool(
        glob.glob(os.path.join(folder, "targets", "*", "include", header)))


def _version_key(folder):
    """cuda-12.4 -> (12, 4): numeric, so that 9.2 < 10.1 < 12.4."""
    return tuple(int(part) for part in re.findall(r"\d+", os.path.basename(folder)))


def find_cuda_home(environ=None, prefix="/usr/local"):
    """The CUDA toolkit folder, looked up in torch.utils.cpp_extension's order:

    1. CUDA_HOME, then CUDA_PATH, as set (an explicit choice wins);
    2. the nvcc on PATH (symlinks resolved; conda's toolkit), when the folder above its bin/
       holds a toolkit: a wrapper script such as /usr/local/bin/nvcc is passed over;
    3. PREFIX/cuda;
    4. the newest PREFIX/cuda-X.Y by version number.
    None if none is found. environ defaults to os.environ (its PATH is the one searched).
    """
    environ = os.environ if environ is None else environ
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if environ.get(var):
            return environ[var]
    nvcc = shutil.which("nvcc", path=environ.get("PATH", ""))
    if nvcc:
        folder = os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))
        if _is_toolkit(folder):
            return folder
    versioned = [
        f for f in glob.glob(os.path.join(prefix, "cuda-*")) if re.fullmatch(r"cuda-\d+(\.\d+)*", os.path.basename(f))]
    for folder in [os.path.join(prefix, "cuda")] + sorted(versioned, key=_version_key, reverse=True):
        if _is_toolkit(folder):
            return folder
    return None


def pip_cuda_include_dirs(search_path):
    """Headers (cuBLAS, cuSPARSE...) that ATen/cuda/CUDAContext.h wants, from pip's nvidia wheels
    found on search_path (sys.path). They go in as trailing -isystem, never -I: -I would put pip's
    newer CUDA headers before nvcc's own and nvcc refuses mismatched toolkit headers."""
    found = []
    for entry in search_path:
        for sub in ("nvidia/cu13/include", "nvidia/cu12/include"):
            path = os.path.join(entry, sub)
            if os.path.isdir(path) and path not in found:
                found.append(path)
    return found


def nvcc_gpu_archs(nvcc):
    """The archs this nvcc builds SASS for ('7.5', ..., '12.1', from --list-gpu-code), or None
    if it cannot say (an nvcc older than CUDA 11)."""
    try:
        out = subprocess.run([nvcc, "--list-gpu-code"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    codes = re.findall(r"^sm_(\d+)$", out.stdout, re.M) if out.returncode == 0 else []
    return [f"{int(c) // 10}.{int(c) % 10}" for c in codes] or None


def default_cuda_arch_list(supported=None):
    """DEFAULT_CUDA_ARCHS less those the toolkit cannot build (supported: nvcc_gpu_archs's list,
    None for all), with the newest one's PTX: '7.5;8.0;8.6;9.0;10.0;12.0+PTX' with CUDA 13."""
    archs = [a for a in DEFAULT_CUDA_ARCHS if supported is None or a in supported]
    if not archs:
        raise ValueError(
            f"this nvcc builds none of detcore's default GPU archs {';'.join(DEFAULT_CUDA_ARCHS)} "
            f"(it lists {', '.join(supported)}): set TORCH_CUDA_ARCH_LIST")
    return ";".join(archs) + "+PTX"


def cuda_arch_list(environ, visible_gpus, nvcc):
    """The TORCH_CUDA_ARCH_LIST for a CUDA build, or None to leave torch's choice.

    An explicit list is kept. Without one, torch compiles for the visible GPUs (their archs, PTX
    of the newest); with none visible it has nothing to choose from (and fails), so the list is
    default_cuda_arch_list for what nvcc (the path given) builds.
    """
    explicit = environ.get("TORCH_CUDA_ARCH_LIST", "").strip()
    if explicit and explicit != "native":
        return explicit
    if visible_gpus > 0:
        return None
    if explicit == "native":
        raise ValueError(
            "TORCH_CUDA_ARCH_LIST=native compiles for the visible GPUs and none is visible: "
            "name the archs (e.g. \"8.0;9.0+PTX\"), or unset it for detcore's default list")
    return default_cuda_arch_list(nvcc_gpu_archs(nvcc))


def ptx_arch(gencode_flags):
    """The newest virtual arch whose PTX nvcc embeds (-gencode=arch=compute_90,code=compute_90
    gives 90), or 0 if it embeds none: the build then runs only on its SASS archs."""
    found = [int(n) for flag in gencode_flags for n in re.findall(r"code=\[?compute_(\d+)", flag)]
    return max(found, default=0)


# The runtimes the extension must share with torch, which has loaded their shared libraries: the
# linker's name for each (what -lNAME finds) and the file torch loaded.
SHARED_RUNTIMES = {"libstdc++.so": "libstdc++.so.6", "libgomp.so": "libgomp.so.1"}


def runtime_link_flags(compiler, run=subprocess.run):
    """``-l:FILE`` for each runtime of SHARED_RUNTIMES that ``compiler`` would link statically.

    A toolchain whose ``libstdc++.so`` (the linker's name, a link to ``libstdc++.so.6``) dangles
    makes the linker take ``libstdc++.a`` from the same folder without a word (seen with a
    compiler copied into another prefix, its relative links left pointing nowhere). The extension
    then carries a second C++ runtime beside the one torch loaded, and the two share some locale
    state and not the rest: formatting a number into an error message reads the wrong facet,
    which truncates the message or crashes the process. Naming the shared file makes the linker
    take it. The folders are searched as the linker searches them: the compiler's library folders
    in order, the first holding the runtime (shared, dangling or archive) decides."""
    try:
        found = run([compiler, "-print-search-dirs"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return []  # no such compiler here: the build will say so itself
    folders = []
    for line in found.stdout.splitlines():
        if line.startswith("libraries:"):
            folders = [f for f in line.split("=", 1)[-1].split(os.pathsep) if f]
    flags = []
    for name, shared in SHARED_RUNTIMES.items():
        archive = name[: -len(".so")] + ".a"
        for folder in folders:
            link, static = os.path.join(folder, name), os.path.join(folder, archive)
            if os.path.exists(link):
                break  # a shared runtime (or a linker script naming one): what torch has
            if os.path.lexists(link) or os.path.exists(static):
                flags.append(f"-l:{shared}")
                break
    return flags
