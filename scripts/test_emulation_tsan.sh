#!/usr/bin/env bash
# The CUDA emulation tests again, built with ThreadSanitizer: a missing __syncthreads() or a plain
# += where two emulated threads meet is then a reported data race, even when the race happened
# to give the right numbers. Python is not built with TSan, so its runtime is preloaded; the
# suppressions (tests/layers/cuda_emulation/tsan.supp) cover libraries outside our code only.
# Extra arguments go to pytest. Run after scripts/setup_env.sh (CI: .ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
TSAN_RUNTIME=$("${CXX:-g++}" -print-file-name=libtsan.so)
# The interpreter itself, not a wrapper script: a shell does not survive the TSan preload.
PYTHON_BIN=$("$PYTHON" -c "import sys; print(sys.executable)")
export DETCORE_EMULATION_TSAN=1
# libtorch's own parallel loops (an index_select over a few thousand boxes) synchronize through
# libgomp, which TSan cannot see: one OpenMP thread keeps them inline. The emulated GPU threads
# are std::threads and race-checked as before.
export OMP_NUM_THREADS=1
SUPPRESSIONS=$PWD/tests/layers/cuda_emulation/tsan.supp
export TSAN_OPTIONS="halt_on_error=1 exitcode=66 suppressions=$SUPPRESSIONS ${TSAN_OPTIONS:-}"
# --capture=sys: a report goes straight to stderr (halt_on_error ends the process right after it,
# before pytest would print what it captured).
LD_PRELOAD="$TSAN_RUNTIME" "$PYTHON_BIN" -m pytest -p no:cacheprovider --capture=sys -q \
  tests/layers/test_cuda_emulation.py tests/layers/test_cuda_emulation_roi_pool.py \
  tests/layers/test_cuda_emulation_nms.py \
  tests/layers/test_cuda_emulation_deform_conv.py \
  tests/layers/test_cuda_emulation_sigmoid_focal_loss.py "$@"
