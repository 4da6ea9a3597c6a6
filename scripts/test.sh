#!/usr/bin/env bash
# The one command for the tests: set up (install + build), then run the fast test suite.
# Extra arguments go to pytest, e.g.  bash scripts/test.sh -m slow   or   bash scripts/test.sh tests/layers
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
bash scripts/setup_env.sh
if [ $# -eq 0 ]; then
  set -- -m "not slow"
fi
"$PYTHON" -m pytest "$@"
