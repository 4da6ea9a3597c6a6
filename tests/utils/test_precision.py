"""TEST.PRECISION: the CPU's bfloat16 detection (tested both ways: this machine's CPU changes
between runs) and the autocast context that inference runs in."""
import logging

import pytest
import torch

from detcore.utils import precision
from detcore.utils.collect_env import collect_env_info
from detcore.utils.precision import (
    cpu_bfloat16_features,
    cpu_bfloat16_summary,
    has_native_cpu_bfloat16,
    inference_autocast,
)

AMX_CPU = {"avx512_f": True, "amx_tile": True, "amx_bf16": True, "avx512_bf16": True}
ZEN4_CPU = {"avx512_f": True, "avx512_bf16": True, "amx_bf16": False}
ZEN3_CPU = {"avx2": True, "avx512_bf16": False, "amx_bf16": False}


@pytest.fixture
def cpu(monkeypatch):
    """Pretend the CPU has the given capabilities; the emulation warning is reset so each test sees it."""

    def pretend(capabilities):
        monkeypatch.setattr(precision, "_cpu_capabilities", lambda: dict(capabilities))
        precision._warn_emulated.cache_clear()

    yield pretend
    precision._warn_emulated.cache_clear()


def test_native_features_are_read_from_the_cpu(cpu):
    cpu(AMX_CPU)
    assert cpu_bfloat16_features() == ["amx_bf16", "avx512_bf16"] and has_native_cpu_bfloat16()
    assert cpu_bfloat16_summary() == "native: AMX (amx_bf16), AVX512-BF16 (avx512_bf16)"
    cpu(ZEN4_CPU)
    assert cpu_bfloat16_features() == ["avx512_bf16"]
    cpu(ZEN3_CPU)
    assert cpu_bfloat16_features() == [] and not has_native_cpu_bfloat16()
    assert cpu_bfloat16_summary().startswith("emulated")


def test_torch_query_agrees_with_proc_cpuinfo(monkeypatch, tmp_path):
    """The two sources of the flags: torch's cpuinfo query and the kernel's /proc/cpuinfo (the
    fallback for a torch without torch.cpu.get_capabilities)."""
    from_torch = cpu_bfloat16_features()
    try:
        flags = open("/proc/cpuinfo").read()
    except OSError:
        pytest.skip("no /proc/cpuinfo here")
    monkeypatch.delattr(torch.cpu, "get_capabilities")
    assert cpu_bfloat16_features() == from_torch
    assert set(from_torch) <= set(flags.split())


def test_proc_cpuinfo_fallback_reads_x86_and_arm_flags(monkeypatch, tmp_path):
    monkeypatch.delattr(torch.cpu, "get_capabilities")
    fake = tmp_path / "cpuinfo"
    monkeypatch.setattr(precision, "_CPUINFO", str(fake))
    fake.write_text("processor\t: 0\nflags\t\t: fpu sse avx2 avx512f amx_tile amx_bf16\n\nprocessor\t: 1\n")
    assert cpu_bfloat16_features() == ["amx_bf16"]
    fake.write_text("processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\n")
    assert cpu_bfloat16_features() == ["bf16"]
    fake.write_text("processor\t: 0\nflags\t\t: fpu sse avx2\n")
    assert cpu_bfloat16_features() == []
    monkeypatch.setattr(precision, "_CPUINFO", str(tmp_path / "missing"))
    assert cpu_bfloat16_features() == []


def test_collect_env_reports_the_cpu_bfloat16_line(cpu):
    cpu(AMX_CPU)
    assert "CPU bfloat16" in collect_env_info() and "native: AMX (amx_bf16)" in collect_env_info()
    cpu(ZEN3_CPU)
    assert "emulated (no AMX, AVX512-BF16 or Arm BF16)" in collect_env_info()


def test_float32_is_no_autocast_and_bfloat16_is_cpu_autocast(cpu):
    cpu(AMX_CPU)
    x, w = torch.randn(4, 8), torch.randn(8, 3)
    with inference_autocast("float32", "cpu"):
        assert not torch.is_autocast_enabled("cpu")
        assert (x @ w).dtype == torch.float32
    with inference_autocast("bfloat16", torch.device("cpu")):
        assert torch.is_autocast_enabled("cpu")
        assert (x @ w).dtype == torch.bfloat16
    assert not torch.is_autocast_enabled("cpu")


@pytest.mark.parametrize("capabilities, warns", [(AMX_CPU, False), (ZEN4_CPU, False), (ZEN3_CPU, True)])
def test_one_warning_where_bfloat16_is_emulated(cpu, caplog, capabilities, warns):
    cpu(capabilities)
    with caplog.at_level(logging.WARNING, logger="detcore"):
        for _ in range(3):
            with inference_autocast("bfloat16", "cpu"):
                pass
        with inference_autocast("float32", "cpu"):
            pass
    messages = [r.getMessage() for r in caplog.records if "bfloat16" in r.getMessage()]
    assert len(messages) == (1 if warns else 0), messages
    if warns:
        assert "\n" not in messages[0] and "emulated and will be slower than float32" in messages[0]


def test_unknown_precision_names_the_key():
    with pytest.raises(ValueError, match=r"TEST.PRECISION must be one of \['float32', 'bfloat16'\], got 'float16'"):
        inference_autocast("float16", "cpu")


def test_int8_dot_products_are_read_from_the_cpu(cpu):
    cpu({"amx_int8": True, "avx512_vnni": True, "avx_vnni": True})
    assert precision.cpu_int8_features() == ["amx_int8", "avx512_vnni", "avx_vnni"]
    assert precision.cpu_int8_summary() == "native: AMX (amx_int8), AVX512-VNNI (avx512_vnni), AVX-VNNI (avx_vnni)"
    cpu({"avx512_vnni": False, "avx_vnni": True})
    assert precision.cpu_int8_features() == ["avx_vnni"]
    cpu({"avx2": True, "avx512_vnni": False})  # e.g. Zen 2, Skylake: emulated
    assert precision.cpu_int8_features() == [] and precision.cpu_int8_summary().startswith("emulated")
