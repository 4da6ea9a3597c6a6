"""Build detcore and its compiled extension detcore._C.

The C++ kernels are always built. CUDA kernels are added when torch has CUDA, nvcc is found, and
either a GPU is visible or FORCE_CUDA=1 (to compile on a GPU-less machine, as CI does).
Install with:  pip install --no-build-isolation -e .
"""
import glob
import importlib.util
import os
import shutil
import sys

from setuptools import find_packages, setup

ROOT = os.path.dirname(os.path.abspath(__file__))
CSRC = os.path.join("detcore", "csrc")


def _load_cuda_home_finder():
    """detcore/utils/cuda_home.py, loaded by path: the package itself is not importable yet."""
    path = os.path.join(ROOT, "detcore", "utils", "cuda_home.py")
    spec = importlib.util.spec_from_file_location("_detcore_cuda_home", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.find_cuda_home


# Must happen before torch.utils.cpp_extension is imported: it reads CUDA_HOME once, at import.
_cuda_home = _load_cuda_home_finder()()
if _cuda_home:
    os.environ["CUDA_HOME"] = _cuda_home

try:
    import torch
    from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension
except ImportError:  # pragma: no cover - a build needs torch first
    sys.exit(
        "detcore needs PyTorch to build its extension. Install it first:\n"
        "    pip install torch torchvision\n"
        "then build without isolation, so the build sees that torch:\n"
        "    pip install --no-build-isolation -e ."
    )


def _want_cuda():
    force = os.environ.get("FORCE_CUDA", "0") == "1"
    if torch.version.cuda is None:
        if force:
            print("detcore: FORCE_CUDA=1 but this torch has no CUDA; building CPU kernels only.")
        return False
    if CUDA_HOME is None or not os.path.exists(os.path.join(CUDA_HOME, "bin", "nvcc")):
        if force:
            sys.exit("detcore: FORCE_CUDA=1 but nvcc was not found; set CUDA_HOME to the toolkit.")
        return False
    return force or torch.cuda.is_available()


def _pip_cuda_include_dirs():
    """Headers (cuBLAS, cuSPARSE...) that ATen/cuda/CUDAContext.h wants, from pip's nvidia wheels.

    They go in as trailing -isystem, never -I: -I would put pip's newer CUDA headers before
    nvcc's own and nvcc refuses mismatched toolkit headers.
    """
    found = []
    for entry in sys.path:
        for sub in ("nvidia/cu13/include", "nvidia/cu12/include"):
            path = os.path.join(entry, sub)
            if os.path.isdir(path) and path not in found:
                found.append(path)
    return found


def _extension():
    sources = sorted(glob.glob(os.path.join(CSRC, "*.cpp")))
    sources += sorted(glob.glob(os.path.join(CSRC, "cpu", "*.cpp")))
    sources += sorted(glob.glob(os.path.join(CSRC, "autograd", "*.cpp")))
    # OpenMP: at::parallel_for is an inline OpenMP region; without -fopenmp it runs serially.
    # Linking -fopenmp resolves to the libgomp.so.1 torch has already loaded.
    cxx = ["-O3", "-fopenmp"]
    link = ["-fopenmp"]
    macros = []
    if _want_cuda():
        sources += sorted(glob.glob(os.path.join(CSRC, "cuda", "*.cu")))
        macros.append(("WITH_CUDA", None))
        nvcc = ["-O3", "--expt-relaxed-constexpr"]
        for inc in _pip_cuda_include_dirs():
            cxx += ["-isystem", inc]
            nvcc += ["-isystem", inc]
        return CUDAExtension(
            "detcore._C",
            sources,
            define_macros=macros,
            extra_compile_args={"cxx": cxx, "nvcc": nvcc},
            extra_link_args=link,
        )
    return CppExtension(
        "detcore._C",
        sources,
        define_macros=macros,
        extra_compile_args={"cxx": cxx},
        extra_link_args=link,
    )


setup(
    name="detcore",
    version="0.1.0",
    description="Mask R-CNN style detection and instance segmentation with compiled NMS/ROIAlign",
    packages=find_packages(exclude=("tests", "tests.*", "tools", "configs")),
    python_requires=">=3.9",
    install_requires=["torch", "yacs", "numpy", "pycocotools", "opencv-python-headless", "matplotlib"],
    extras_require={
        "test": ["pytest", "hypothesis", "torchvision", "imgviz", "onnx", "onnxruntime", "onnxscript", "openvino"],
        "export": ["onnx", "onnxruntime", "onnxscript"],
        # The OpenVINO format (converted from the ONNX export) and, later, its int8 quantization.
        "openvino": ["onnx", "onnxscript", "openvino", "nncf"],
    },
    ext_modules=[_extension()],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=shutil.which("ninja") is not None)},
    zip_safe=False,
)
