#!/usr/bin/env bash
# Downloads, on a machine with network, the wheels that scripts/gpu_check.sh installs on the lent
# GPU machine, which has no network and no package index (docs/gpu.md). Into .whl/ (ignored by
# git; name it in the run's carry list): CPython 3.12, manylinux x86-64, one version of each,
# the versions this machine has installed (else the newest). Each wheel's own requirements must
# be on that machine already (NEEDED_THERE below) or in the list: the script checks, and fails
# naming a requirement that is neither.
#
#   bash scripts/prepare_gpu_wheels.sh            # -> .whl/yacs-*.whl, .whl/pycocotools-*.whl
#
# It ends by printing the size of what a run call sends (the tree git would see plus .whl), and
# fails above the 64 MiB limit.
#
# What the machine lacks of what detcore and the GPU check need: yacs (the config) and
# pycocotools (COCO evaluation in step 6). cityscapesscripts, imgviz and imgsim are used only by
# tests the check does not run.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
PACKAGES=(yacs pycocotools)
# Requirements of those wheels that the lent machine has (docs/gpu.md; the device notes' list).
NEEDED_THERE="numpy pyyaml"

rm -rf .whl
mkdir -p .whl
specs=()
for name in "${PACKAGES[@]}"; do
  version=$("$PYTHON" -m pip show "$name" 2>/dev/null | sed -n 's/^Version: //p')
  specs+=("$name${version:+==$version}")
done
"$PYTHON" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl "${specs[@]}"

status=0
for wheel in .whl/*.whl; do
  # Requires-Dist lines without an extra: the wheel's own needs.
  for need in $(unzip -p "$wheel" '*.dist-info/METADATA' | sed -n 's/^Requires-Dist: //p' | grep -v 'extra ==' \
                | sed 's/[ ;<>=!~(\[].*//' | tr 'A-Z_' 'a-z-'); do
    if ! grep -qw -- "$need" <<<"$NEEDED_THERE ${PACKAGES[*]}"; then
      echo "prepare_gpu_wheels: $(basename "$wheel") needs $need, which is neither on the GPU machine nor downloaded" >&2
      status=1
    fi
  done
done
count=$(ls .whl/*.whl | wc -l)
if [ "$count" -ne "${#PACKAGES[@]}" ]; then
  echo "prepare_gpu_wheels: expected ${#PACKAGES[@]} wheels, found $count" >&2
  status=1
fi
ls .whl
# What a run call sends: tracked and untracked-not-ignored files, plus the carried .whl: at most 64 MiB.
tree=$(git ls-files -z --cached --others --exclude-standard | du -cb --files0-from=- | tail -1 | cut -f1)
wheels=$(du -sb .whl | cut -f1)
echo "travels: $(( (tree + wheels) / 1024 )) KiB (tree $(( tree / 1024 )) KiB, .whl $(( wheels / 1024 )) KiB) of 65536 KiB"
if [ $(( tree + wheels )) -gt $(( 64 * 1024 * 1024 )) ]; then
  echo "prepare_gpu_wheels: over the 64 MiB that a run call may send" >&2
  status=1
fi
exit $status
