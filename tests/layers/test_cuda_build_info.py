"""detcore/csrc/cuda/build_info.cu compiles for several GPU archs at once.

With TORCH_CUDA_ARCH_LIST="8.0;9.0" nvcc defines __CUDA_ARCH_LIST__ as 800,900: two macro
arguments, which a one-argument stringify macro refuses. Compiling the file alone takes seconds;
the whole extension for two archs is CI's job (.ci/run).
"""
import os
import subprocess

import pytest

from detcore.utils.build_config import find_cuda_home

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CUDA_HOME = find_cuda_home()
NVCC = os.path.join(CUDA_HOME, "bin", "nvcc") if CUDA_HOME else None


@pytest.mark.skipif(NVCC is None or not os.path.exists(NVCC), reason="needs nvcc")
def test_build_info_compiles_for_two_archs(tmp_path):
    source = os.path.join(ROOT, "detcore", "csrc", "cuda", "build_info.cu")
    archs = ["-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90,code=sm_90"]
    out = subprocess.run(
        [NVCC, *archs, "-E", source, "-o", str(tmp_path / "build_info.ii")],
        capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert '"800,900"' in (tmp_path / "build_info.ii").read_text()
