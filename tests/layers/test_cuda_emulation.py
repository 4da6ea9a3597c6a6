"""detcore's CUDA kernels, run on the CPU by the CUDA emulation, equal the CPU kernels: ROIAlign
here, the other ops in test_cuda_emulation_*.py.

The device code (detcore/csrc/cuda/*_kernels.cuh) is compiled by g++ with
tests/layers/cuda_emulation/cuda_emulation.h: every CUDA thread a std::thread, __syncthreads a
barrier. The emulated ops run the real launchers' host sequences (detcore/csrc/cuda/*_launch.h:
allocations, grids, empty cases, dtype dispatch), with garbage where the real launcher leaves
memory uninitialised. The grid limit is lowered in some tests so that small inputs take the
grid-stride loops. Half and bfloat16 are compared with the CPU float32 kernel on the same (exactly
upcast) values, as in test_ops_cuda.py. DETCORE_EMULATION_TSAN=1 builds the emulation with
ThreadSanitizer (scripts/test_emulation_tsan.sh).
"""
import math
import os
import shutil
import subprocess

import numpy as np
import pytest
import torch

import detcore.layers  # noqa: F401  (loads torch.ops.detcore)
from detcore.utils import build_config

try:
    from . import cuda_emulation
    from .reference_ops import CUDA_VS_CPU_TOLERANCE, EMULATED_DTYPES, in_cpu_dtype, seeded, random_boxes
except ImportError:  # tests/ run as rootdir-relative modules, without packages
    import cuda_emulation
    from reference_ops import CUDA_VS_CPU_TOLERANCE, EMULATED_DTYPES, in_cpu_dtype, seeded, random_boxes

DTYPES = EMULATED_DTYPES
TOL = CUDA_VS_CPU_TOLERANCE


# ---------------------------------------------------------------------------------- roi_align


def _roi_inputs(seed, dtype, k=24, size=(11, 13)):
    """Rois inside, across and outside the map, some of negative or zero size."""
    g = seeded(seed)
    height, width = size
    features = torch.randn(2, 3, height, width, generator=g)
    boxes = random_boxes(k, g, xy_max=16.0 * max(size), wh_range=(-20.0, 120.0))
    boxes[0] = torch.tensor([-200.0, -200.0, -100.0, -150.0])  # wholly outside
    boxes[1] = torch.tensor([40.0, 40.0, 40.0, 40.0])  # a point
    rois = torch.cat([(torch.arange(k) % 2).double()[:, None], boxes.double()], dim=1)
    return features.to(dtype), rois.to(dtype)


def _cpu_roi_align(features, rois, grad, *args):
    """The CPU kernel's forward and input gradient, on the upcast values for half types."""
    x = in_cpu_dtype(features).requires_grad_(True)
    out = torch.ops.detcore.roi_align(x, in_cpu_dtype(rois), *args)
    out.backward(in_cpu_dtype(grad))
    return out.detach(), x.grad


def _backward(op, grad, rois, input_shape, args, *limit):
    """op (the emulated or the CPU backward) with roi_align's (scale, ph, pw, ratio, aligned)."""
    scale, ph, pw, sampling_ratio, aligned = args
    return op(grad, rois, scale, ph, pw, *input_shape, sampling_ratio, aligned, *limit)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("aligned", [False, True])
@pytest.mark.parametrize("sampling_ratio", [-1, 0, 1, 3])
def test_roi_align_equals_cpu(emu, dtype, aligned, sampling_ratio):
    features, rois = _roi_inputs(sampling_ratio + 7, dtype)
    args = (0.25, 3, 4, sampling_ratio, aligned)
    grad = torch.randn(len(rois), 3, 3, 4, generator=seeded(1)).to(dtype)
    out_cpu, grad_cpu = _cpu_roi_align(features, rois, grad, *args)

    out = emu.roi_align(features, rois, *args)
    grad_input = _backward(emu.roi_align_backward, grad, rois, features.shape, args)
    assert out.dtype == dtype and grad_input.dtype == dtype
    torch.testing.assert_close(in_cpu_dtype(out), out_cpu, **TOL[dtype])
    torch.testing.assert_close(in_cpu_dtype(grad_input), grad_cpu, **TOL[dtype])


@pytest.mark.parametrize("max_blocks", [1, 2])
def test_roi_align_more_work_than_blocks(emu, max_blocks):
    """The same results with a grid of 1 or 2 blocks for 9 blocks' work: the grid-stride loops."""
    features, rois = _roi_inputs(3, torch.float32, k=64)
    args = (0.25, 3, 4, 2, True)
    grad = torch.randn(64, 3, 3, 4, generator=seeded(2))
    out = emu.roi_align(features, rois, *args, max_blocks)
    assert torch.equal(out, emu.roi_align(features, rois, *args))
    grad_input = _backward(emu.roi_align_backward, grad, rois, features.shape, args, max_blocks)
    full_grid = _backward(emu.roi_align_backward, grad, rois, features.shape, args)
    torch.testing.assert_close(grad_input, full_grid, atol=1e-6, rtol=1e-6)  # atomics' order
    _, grad_cpu = _cpu_roi_align(features, rois, grad, *args)
    torch.testing.assert_close(grad_input, grad_cpu)


def test_roi_align_edge_cases(emu):
    """No rois, a map without pixels, one roi, and the zero-stride gradient of out.sum()."""
    features, rois = _roi_inputs(4, torch.float32, k=3)
    args = (0.25, 2, 2, 0, True)
    expanded = torch.ones(1, 1, 1, 1).expand(3, 3, 2, 2)
    cases = [(features, rois[:0], None), (features[:, :, :0], rois, None)]
    cases += [(features, rois[:1], None), (features, rois, expanded)]
    for x, r, grad in cases:
        expected = torch.ops.detcore.roi_align(x, r, *args)
        torch.testing.assert_close(emu.roi_align(x, r, *args), expected)
        grad = torch.ones(expected.shape) if grad is None else grad
        cpu = _backward(torch.ops.detcore._roi_align_backward, grad.contiguous(), r, x.shape, args)
        got = _backward(emu.roi_align_backward, grad, r, x.shape, args)
        torch.testing.assert_close(got, cpu)


def test_roi_align_backward_strided_grad(emu):
    """A grad with strides of its own in every dimension: the launcher passes them to the kernel."""
    features, rois = _roi_inputs(6, torch.float32, k=5)
    args = (0.25, 3, 4, 2, True)
    grad = torch.randn(4, 3, 3, 5, generator=seeded(3)).permute(3, 1, 2, 0)  # [5, 3, 3, 4]
    assert grad.stride() == (1, 15, 5, 45)
    got = _backward(emu.roi_align_backward, grad, rois, features.shape, args)
    _, expected = _cpu_roi_align(features, rois, grad.contiguous(), *args)
    torch.testing.assert_close(got, expected)


def test_roi_align_adaptive_count_of_issue_roi(emu):
    """y 13 -> 97 at 1/3 is 28 rows for 7 bins: the CPU samples 5 rows per bin (float rounding)."""
    x = (torch.arange(40.0)[:, None] ** 2 + torch.arange(4.0)).reshape(1, 1, 40, 4)
    rois = torch.tensor([[0.0, 0.0, 13.0, 3.0, 97.0]])
    args = (1 / 3, 7, 1, 0, True)
    expected = torch.ops.detcore.roi_align(x, rois, *args)  # 4 rows per bin would be 1e-3 off
    torch.testing.assert_close(emu.roi_align(x, rois, *args), expected, rtol=1e-6, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_roi_align_backward_atomics(emu, dtype):
    """256 threads of one block, 1024 atomic adds each, all into the same 4 pixels.

    The roi covers 1 pixel, its 16 x 16 samples fall between pixels (0, 0) and (1, 1) at
    multiples of 1/32: every term is a multiple of 2**-18 and the sums are exact whatever the
    order (float32 with 16 rois, which stay under its 24 bits). A plain += would lose updates.
    """
    rois_count = 256 if dtype == torch.float64 else 16
    shape = (1, 1, 3, 3)
    rois = torch.tensor([[0.0, 0.5, 0.5, 1.5, 1.5]], dtype=dtype).repeat(rois_count, 1)
    grad = torch.ones(rois_count, 1, 1, 1, dtype=dtype)
    args = (1.0, 1, 1, 16, True)
    got = _backward(emu.roi_align_backward, grad, rois, shape, args)
    expected = _backward(torch.ops.detcore._roi_align_backward, grad, rois, shape, args)
    assert torch.equal(got, expected) and got.sum() == rois_count


# ------------------------------------------------------------------------- FMA contraction


def _has_fma():
    try:
        with open("/proc/cpuinfo") as f:
            return " fma " in f.read().replace("\n", " ")
    except OSError:
        return False


def _unfused_geometry(roi, scale, ph, pw, sampling_ratio, aligned):
    """roi_align_common.h's geometry in float32, every operation rounded (the CPU kernel's)."""
    f = np.float32
    s, offset = f(scale), f(0.5 if aligned else 0.0)
    x1, y1, x2, y2 = (f(v) for v in roi)
    start_w, start_h = f(x1 * s) - offset, f(y1 * s) - offset
    width, height = (f(x2 * s) - offset) - start_w, (f(y2 * s) - offset) - start_h
    if not aligned:
        width, height = max(width, f(1)), max(height, f(1))
    grid_h = sampling_ratio if sampling_ratio > 0 else int(math.ceil(height / f(ph)))
    grid_w = sampling_ratio if sampling_ratio > 0 else int(math.ceil(width / f(pw)))
    bin_h, bin_w = height / f(ph), width / f(pw)
    y = (start_h + f(ph - 1) * bin_h) + (f(grid_h - 1) + f(0.5)) * bin_h / f(grid_h)
    x = (start_w + f(pw - 1) * bin_w) + (f(grid_w - 1) + f(0.5)) * bin_w / f(grid_w)
    return [grid_h, grid_w, start_h, start_w, bin_h, bin_w, y, x]


ISSUE_ROI = [0.0, 13.0, 3.0, 97.0]  # 28 rows at scale 1/3, aligned: 5 samples per bin, 4 if fused
needs_fma_gxx = pytest.mark.skipif(
    shutil.which("g++") is None or not _has_fma(), reason="needs g++, an FMA CPU")


def _host_builds():
    """How setup.py compiles host code (build_config's flags: torch adds -std=c++20), on a host
    whose compiler may emit FMA (-mfma here; aarch64, -march=native): the C++ sources with g++,
    and the host half of the .cu files with nvcc."""
    host = ["-std=c++20", "-DDETCORE_FMA_PROBE_HOST"]
    builds = [pytest.param("g++", [*host, *build_config.CXX_FLAGS, "-mfma"], id="g++")]
    cuda_home = build_config.find_cuda_home()
    nvcc = os.path.join(cuda_home, "bin", "nvcc") if cuda_home else None
    builds.append(pytest.param(
        nvcc, ["-x", "cu", *host, *build_config.NVCC_FLAGS, "-Xcompiler=-mfma"], id="nvcc",
        marks=pytest.mark.skipif(nvcc is None or not os.path.exists(nvcc), reason="needs nvcc")))
    return builds


def _probe(rois, scale, output, aligned, flags, compiler="g++"):
    """fma_probe built with flags: whether it fuses a * b - c, and each roi's geometry."""
    args = [str(scale), str(output[0]), str(output[1]), "0", str(int(aligned))]
    args += [repr(float(np.float32(v))) for roi in rois for v in roi]
    probe = subprocess.run(
        [cuda_emulation.fma_probe(flags, compiler), *args], capture_output=True, text=True,
        check=True)
    lines = probe.stdout.splitlines()
    geometry = []
    for line in lines[1:]:
        values = line.split()
        geometry.append([int(v) for v in values[:2]] + [np.float32(float(v)) for v in values[2:]])
    return float(lines[0]) == 28.0, geometry


def _geometry_rois():
    rois = random_boxes(30, seeded(9), xy_max=300.0, wh_range=(1.0, 150.0)).tolist()
    return [ISSUE_ROI] + rois


@needs_fma_gxx
@pytest.mark.parametrize("scale,output,aligned", [(1 / 3, (7, 1), True), (1 / 32, (7, 7), False)])
def test_device_geometry_with_fma_contraction(scale, output, aligned):
    """Built like nvcc builds device code (a * b + c fused), the geometry is still the CPU's."""
    rois, scale = _geometry_rois(), float(np.float32(scale))
    fuses, geometry = _probe(rois, scale, output, aligned, cuda_emulation.DEVICE_FMA_FLAGS)
    if not fuses:
        pytest.skip("this g++ does not fuse a * b - c here, so it cannot show a fused geometry")
    for roi, got in zip(rois, geometry):
        assert got == _unfused_geometry(roi, scale, *output, 0, aligned), roi


@needs_fma_gxx
@pytest.mark.parametrize("compiler,flags", _host_builds())
@pytest.mark.parametrize("scale,output,aligned", [(1 / 3, (7, 1), True), (1 / 32, (7, 7), False)])
def test_host_geometry_with_setup_flags_on_an_fma_cpu(scale, output, aligned, compiler, flags):
    """With setup.py's flags, a compiler free to emit FMA fuses nothing: the CPU kernels'
    geometry (grid, start, bin size, sample points) is the GPU's, 5 samples for the issue's roi."""
    rois, scale = _geometry_rois(), float(np.float32(scale))
    fuses, geometry = _probe(rois, scale, output, aligned, flags, compiler)
    assert not fuses, "setup.py's flags let the compiler fuse a * b - c into an FMA"
    for roi, got in zip(rois, geometry):
        assert got == _unfused_geometry(roi, scale, *output, 0, aligned), roi
    if scale == float(np.float32(1 / 3)) and aligned:
        assert geometry[0][0] == 5
