"""Build detcore and its compiled extension detcore._C.

The C++ kernels are always built. CUDA kernels are added when torch has CUDA, nvcc is found, and
either a GPU is visible or FORCE_CUDA=1 (to compile on a GPU-less machine, as CI does).
Install with:  pip install --no-build-isolation -e .

Which GPU archs (detcore/utils/build_config.py decides, README's Install section explains):
TORCH_CUDA_ARCH_LIST when set; else, with a GPU visible, torch's choice (the visible GPUs' archs
and the newest one's PTX); else, as FORCE_CUDA=1 alone on a machine without a GPU, detcore's
default list, "7.5;8.0;8.6;9.0;10.0;12.0+PTX" with CUDA 13: every GPU torch's own CUDA 13 wheels
run on, and through the PTX newer ones. A build for one arch is several times quicker (say
TORCH_CUDA_ARCH_LIST="9.0" for an H100); docs/benchmarks.md has the compile times.
"""
import glob
import importlib.util
import os
import shutil
import sys

from setuptools import find_packages, setup

ROOT = os.path.dirname(os.path.abspath(__file__))
CSRC = os.path.join("detcore", "csrc")


def _load_build_config():
    """detcore/utils/build_config.py, loaded by path: the package itself is not importable yet."""
    path = os.path.join(ROOT, "detcore", "utils", "build_config.py")
    spec = importlib.util.spec_from_file_location("_detcore_build_config", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


build_config = _load_build_config()
# Must happen before torch.utils.cpp_extension is imported: it reads CUDA_HOME once, at import.
_cuda_home = build_config.find_cuda_home()
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


def _cuda_archs():
    """Sets TORCH_CUDA_ARCH_LIST where detcore chooses it; the newest arch whose PTX is embedded."""
    nvcc = os.path.join(CUDA_HOME, "bin", "nvcc")
    try:
        arch_list = build_config.cuda_arch_list(os.environ, torch.cuda.device_count(), nvcc)
    except ValueError as e:
        sys.exit(f"detcore: {e}")
    if arch_list:
        os.environ["TORCH_CUDA_ARCH_LIST"] = arch_list
    print(f"detcore: CUDA archs {arch_list or 'of the visible GPUs (torch chooses)'}")
    try:  # the -gencode flags torch will pass (a private function: unknown, -1, if it goes)
        from torch.utils.cpp_extension import _get_cuda_arch_flags
    except ImportError:
        return -1
    return build_config.ptx_arch(_get_cuda_arch_flags())


def _extension():
    sources = sorted(glob.glob(os.path.join(CSRC, "*.cpp")))
    sources += sorted(glob.glob(os.path.join(CSRC, "cpu", "*.cpp")))
    sources += sorted(glob.glob(os.path.join(CSRC, "autograd", "*.cpp")))
    cxx = list(build_config.CXX_FLAGS)
    link = list(build_config.LINK_FLAGS)
    if sys.platform.startswith("linux"):
        runtimes = build_config.runtime_link_flags(os.environ.get("CXX", "c++"))
        if runtimes:
            print(f"detcore: this compiler would link its runtimes statically; linking {' '.join(runtimes)} instead")
        link += runtimes
    macros = []
    if _want_cuda():
        sources += sorted(glob.glob(os.path.join(CSRC, "cuda", "*.cu")))
        macros.append(("WITH_CUDA", None))
        # For build_info.cu only: a macro for every source would rebuild the C++ on a new list.
        nvcc = list(build_config.NVCC_FLAGS) + [f"-DDETCORE_CUDA_PTX_ARCH={_cuda_archs()}"]
        for inc in build_config.pip_cuda_include_dirs(sys.path):
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
    # The presets ship inside the package as detcore/configs/ (the clone keeps them in configs/):
    # `--config-file torchvision/mask_rcnn_R_50_FPN.yaml` finds them (detcore/config/presets.py).
    packages=find_packages(exclude=("tests", "tests.*", "tools", "configs", "benchmarks", "benchmarks.*"))
    + ["detcore.configs"],
    package_dir={"detcore.configs": "configs"},
    package_data={"detcore.configs": ["**/*.yaml", "README.md"]},
    entry_points={"console_scripts": ["detcore = detcore.cli:main"]},
    python_requires=">=3.9",
    install_requires=["torch", "yacs", "numpy", "pycocotools", "opencv-python-headless", "matplotlib"],
    extras_require={
        "test": [
            "pytest", "hypothesis", "torchvision", "imgviz", "onnx", "onnxruntime", "onnxscript", "openvino", "nncf",
        ],
        "export": ["onnx", "onnxruntime", "onnxscript"],
        # The OpenVINO format (converted from the ONNX export) and its int8 quantization (NNCF).
        "openvino": ["onnx", "onnxscript", "openvino", "nncf"],
    },
    ext_modules=[_extension()],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=shutil.which("ninja") is not None)},
    zip_safe=False,
)
