#!/usr/bin/env bash
# The GPU half, proven and timed in one command (issue 22; docs/gpu.md says how to run it on the
# lent machine and on any GPU box):
#
#   bash scripts/gpu_check.sh OUT_DIR              # on a machine with a CUDA GPU: at most ~8 min
#   bash scripts/gpu_check.sh --rehearse OUT_DIR   # on the CPU at small sizes (CI runs it)
#   bash scripts/gpu_check.sh --only 5,6 OUT_DIR   # step 1 and some others (a second, shorter run)
#
# Steps, in this order so that a run cut short still says the most: 1 environment and the _C
# build for this GPU's arch, 2 the tests marked cuda, 3 the CUDA emulation against the hardware,
# 4 compute-sanitizer, 5 speed against torchvision, 6 a short real training. Each is timed and
# has its own time limit; a failing one does not stop the next. OUT_DIR gets gpu_check.json,
# gpu_check.md (a summary for docs/benchmarks.md), logs.tar.gz and the benchmarks' JSON files.
# Wheels in .whl/ (scripts/prepare_gpu_wheels.sh) are installed first, to a folder on PYTHONPATH.
# Exit code 0 when no step failed.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
exec "$PYTHON" scripts/gpu_check/run.py "$@"
