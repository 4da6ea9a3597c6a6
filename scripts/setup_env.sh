#!/usr/bin/env bash
# Installs detcore's dependencies and builds detcore._C in place (pip editable install).
# Safe to re-run: pip skips what is installed and ninja rebuilds only what changed.
#   FORCE_CUDA=1  compile the CUDA kernels without a visible GPU (for the GPUs README's Install
#                 section lists; TORCH_CUDA_ARCH_LIST="9.0" for one arch, a quicker build)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}

# torch first: the extension build needs it, and build isolation would fetch a second copy.
if ! "$PYTHON" -c "import torch" 2>/dev/null; then
  "$PYTHON" -m pip install torch torchvision
fi
# tensorboard, onnx, onnxruntime, onnxscript (export), openvino (its format) and nncf (int8
# OpenVINO) are optional for users; installed here so the tests run them too.
"$PYTHON" -m pip install "setuptools>=64" wheel yacs numpy pycocotools opencv-python-headless matplotlib ninja pytest hypothesis imgviz tensorboard onnx onnxruntime onnxscript openvino nncf
# cityscapesscripts: the Cityscapes label table, polygon drawing and instance AP (the loader and
# evaluator call its functions; nothing is downloaded).
"$PYTHON" -m pip install cityscapesscripts
# imgsim only for its weights file (a self-supervised ResNet-50: benchmarks/transfer_demo.py and a
# checkpoint test); --no-deps, as it asks for opencv-python, which would clash with the headless build.
"$PYTHON" -m pip install --no-deps imgsim
"$PYTHON" -m pip install --no-build-isolation --use-pep517 -e .
"$PYTHON" -m detcore.utils.collect_env
