import subprocess
import sys

import torch

from detcore.utils.collect_env import collect_env_info, _format_archs, _format_ptx


def test_report_names_the_extension_and_its_kernels():
    report = collect_env_info()
    assert f"torch               {torch.__version__}".split()[1] in report
    lines = {line.split("  ")[0].strip(): line for line in report.splitlines()}
    assert "detcore._C" in lines and "loaded" in lines["detcore._C"]
    kernels = lines["detcore._C kernels"]
    if torch.ops.detcore._cuda_version() > 0:
        assert kernels.endswith("CPU, CUDA") and "detcore._C CUDA archs" in lines
        ptx = torch.ops.detcore._cuda_ptx_arch()
        assert lines["detcore._C CUDA PTX"].endswith(_format_ptx(ptx))
    else:
        assert kernels.endswith("CPU only")
    assert lines["detcore._C CPU vectors"].split()[-1] in ("baseline", "avx2", "avx512")


def test_runs_as_a_module():
    out = subprocess.run(
        [sys.executable, "-m", "detcore.utils.collect_env"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert "detcore._C" in out.stdout and "torch" in out.stdout


def test_arch_list_formatting():
    assert _format_archs("800,900") == "sm_80, sm_90"
    assert _format_archs("") == "none"


def test_ptx_formatting():
    assert _format_ptx(120).startswith("compute_120 ")
    assert _format_ptx(0).startswith("none ")
    assert _format_ptx(-1).startswith("unknown ")


def test_report_says_whether_int8_is_native(monkeypatch):
    from detcore.utils import precision

    monkeypatch.setattr(precision, "_cpu_capabilities", lambda: {"avx512_vnni": True})
    assert "CPU int8                native: AVX512-VNNI (avx512_vnni)".split("  ")[-1] in collect_env_info()
    monkeypatch.setattr(precision, "_cpu_capabilities", lambda: {"avx2": True})
    line = [row for row in collect_env_info().splitlines() if row.startswith("CPU int8")][0]
    assert "emulated" in line and "slower than float32" in line
