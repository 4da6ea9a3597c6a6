#!/usr/bin/env bash
# The one command for the tests: set up (install + build), then run the fast test suite.
# Extra arguments go to pytest, e.g.  bash scripts/test.sh -m slow   or   bash scripts/test.sh tests/layers
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
bash scripts/setup_env.sh
if [ $# -eq 0 ]; then
  # The slowest tests are listed at the end, so a CI log shows where its time goes.
  set -- -m "not slow" --durations=30
fi
"$PYTHON" -m pytest "$@"
