"""Environment report for bug reports and support questions.

    python -m detcore.utils.collect_env

Prints the versions that matter (Python, torch, CUDA, compilers, dependencies), whether
detcore._C loaded, which kernels it carries (CPU, CUDA), for which GPU archs it was built and
whether it carries PTX for newer ones, and whether the CPU computes bfloat16 natively (what
TEST.PRECISION bfloat16 needs to pay) and has int8 dot products (VNNI, AMX: what an int8 export
needs to pay).
"""
import importlib
import os
import platform
import subprocess
import sys


def _version(module_name):
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # report broken installs instead of crashing the report
        return f"not importable ({type(e).__name__}: {e})".splitlines()[0][:120]
    version = getattr(module, "__version__", None)
    if version is None:
        from importlib import metadata

        try:
            version = metadata.version(module_name)
        except metadata.PackageNotFoundError:
            version = "installed"
    return version


def _first_line(args, last=False):
    """The first (or last) line a command prints, or 'not found'."""
    try:
        out = subprocess.run(args, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return "not found"
    lines = (out.stdout or out.stderr).strip().splitlines()
    if not lines:
        return "not found"
    return lines[-1] if last else lines[0]


def cpu_name():
    """The CPU model as the OS names it (benchmarks record it beside their timings)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _format_archs(raw):
    """'800,900' (nvcc's __CUDA_ARCH_LIST__) -> 'sm_80, sm_90'."""
    archs = [a.strip() for a in raw.split(",") if a.strip()]
    return ", ".join(f"sm_{int(a) // 10}" if a.isdigit() else a for a in archs) or "none"


def _format_ptx(arch):
    """torch.ops.detcore._cuda_ptx_arch()'s answer, for the report."""
    if arch > 0:
        return f"compute_{arch} (a GPU newer than the archs above compiles it at first use)"
    if arch == 0:
        return "none (runs only on the archs above and later minor versions of their major)"
    return "unknown (built without detcore's setup.py)"


def _extension_rows(torch):
    import detcore
    from detcore.layers import _extension

    rows = [("detcore", f"{detcore.__version__} @ {os.path.dirname(detcore.__file__)}")]
    if not _extension.is_available():
        rows.append(("detcore._C", f"NOT LOADED: {_extension._load_error}"))
        return rows
    rows.append(("detcore._C", "loaded"))
    cuda_version = torch.ops.detcore._cuda_version()
    kernels = "CPU, CUDA" if cuda_version > 0 else "CPU only"
    rows.append(("detcore._C kernels", kernels))
    # The SIMD set the vectorized CPU kernels (sigmoid_focal_loss) run with on this machine.
    rows.append(("detcore._C CPU vectors", torch.ops.detcore._cpu_capability()))
    if cuda_version > 0:
        major, minor = cuda_version // 1000, (cuda_version % 1000) // 10
        rows.append(("detcore._C built with CUDA", f"{major}.{minor}"))
        rows.append(("detcore._C CUDA archs", _format_archs(torch.ops.detcore._cuda_arch_list())))
        rows.append(("detcore._C CUDA PTX", _format_ptx(torch.ops.detcore._cuda_ptx_arch())))
    return rows


def collect_env_rows():
    rows = [
        ("sys.platform", sys.platform),
        ("Python", sys.version.replace("\n", " ")),
        ("machine", platform.machine()),
        ("CPU", cpu_name()),
    ]
    try:
        import torch
    except ImportError as e:
        rows.append(("torch", f"not importable: {e}"))
        return rows
    from detcore.utils.precision import cpu_bfloat16_summary, cpu_int8_summary

    rows += [
        ("CPU bfloat16", cpu_bfloat16_summary()),
        ("CPU int8", cpu_int8_summary()),
        ("torch", f"{torch.__version__} @ {os.path.dirname(torch.__file__)}"),
        ("torch CUDA", str(torch.version.cuda)),
        ("torch threads", str(torch.get_num_threads())),
        ("CUDA available", str(torch.cuda.is_available())),
    ]
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            major, minor = torch.cuda.get_device_capability(i)
            rows.append((f"GPU {i}", f"{torch.cuda.get_device_name(i)} (sm_{major}{minor})"))
        rows.append(("cuDNN", str(torch.backends.cudnn.version())))
    rows += _extension_rows(torch)
    from detcore.utils.build_config import find_cuda_home

    cuda_home = find_cuda_home()
    rows.append(("CUDA toolkit", str(cuda_home)))
    if cuda_home:
        rows.append(("nvcc", _first_line([os.path.join(cuda_home, "bin", "nvcc"), "--version"], last=True)))
    rows.append(("C++ compiler", _first_line([os.environ.get("CXX", "c++"), "--version"])))
    for name in ("torchvision", "numpy", "cv2", "pycocotools", "yacs"):
        rows.append((name, str(_version(name))))
    return rows


def collect_env_info():
    rows = collect_env_rows()
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)


def main():
    print(collect_env_info())


if __name__ == "__main__":
    main()
