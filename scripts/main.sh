#!/usr/bin/env bash
# The main job, one command: set up (install deps, build detcore._C), train Mask R-CNN
# R-18-FPN on the built-in synthetic shapes dataset, evaluate box and mask AP on shapes_val,
# draw pictures of the evaluation (PR curves, per-class AP, confusion matrix, the images with the
# most errors), demo pictures of validation images and the loss curves -- all into one folder.
# On a 2-core CPU the R-18 recipe trains in minutes (the time measured on a fresh machine, setup
# included, and its AP: docs/benchmarks.md, "The main job on a fresh machine").
#
#   bash scripts/main.sh                              # the full recipe of the config
#   bash scripts/main.sh SOLVER.MAX_ITER 200          # KEY VALUE config overrides (training and demo)
#   CONFIG=configs/e2e_mask_rcnn_R_34_FPN_shapes.yaml bash scripts/main.sh   # -> output/shapes_R34
#   CONFIG=configs/retinanet_R_18_FPN_shapes.yaml bash scripts/main.sh       # -> output/shapes_retinanet_R18
#
# Environment: CONFIG (the yaml), OUTPUT (the folder; default output/shapes_R18 / _R34 /
# shapes_retinanet_R18), NUM_DEMO
# (pictures to draw, default 8), SKIP_SETUP=1 (skip scripts/setup_env.sh), PYTHON.
# --resume is passed to training, so re-running after an interruption continues the run.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
CONFIG=${CONFIG:-configs/e2e_mask_rcnn_R_18_FPN_shapes.yaml}
# Default folder named after the body: ..._R_18_FPN_shapes.yaml -> output/shapes_R18, and
# RetinaNet's after its architecture too: retinanet_R_18_FPN_shapes.yaml -> output/shapes_retinanet_R18.
BODY=$(basename "$CONFIG" .yaml | sed -n 's/.*_R_\([0-9]*\)_.*/R\1/p')
ARCH=$(basename "$CONFIG" .yaml | sed -n 's/^\(retinanet\)_.*/\1_/p')
OUTPUT=${OUTPUT:-output/shapes_${ARCH}${BODY:-run}}
NUM_DEMO=${NUM_DEMO:-8}
start=$(date +%s)
# OpenMP threads that sleep when idle instead of spinning: with the data-loading worker (and
# anything else) sharing a small CPU, spinning threads wait on a preempted peer at every
# parallel region: on a loaded 2-core machine spinning made iterations several times slower
# (docs/benchmarks.md, "Figures behind code choices").
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}

if [ "${SKIP_SETUP:-0}" != 1 ]; then
  bash scripts/setup_env.sh
fi

echo "== Training $CONFIG into $OUTPUT (then evaluating on its DATASETS.TEST)"
"$PYTHON" tools/train_net.py --config-file "$CONFIG" --resume "$@" OUTPUT_DIR "$OUTPUT"

echo "== Drawing $NUM_DEMO validation images"
# The images of the config's first test dataset (generated into the cache on first use).
VAL_IMAGES=$("$PYTHON" - "$CONFIG" "$@" <<'PY'
import sys
from detcore.config import get_cfg
from detcore.data import MetadataCatalog
cfg = get_cfg()
cfg.merge_from_file(sys.argv[1])
cfg.merge_from_list(sys.argv[2:])
print(MetadataCatalog.get(cfg.DATASETS.TEST[0]).image_root)
PY
)
"$PYTHON" tools/demo.py --config-file "$CONFIG" --input "$VAL_IMAGES" --output "$OUTPUT/demo" \
  --max-images "$NUM_DEMO" "$@" MODEL.WEIGHTS "$OUTPUT/model_final.pth"

echo "== Done in $(( $(date +%s) - start )) s. Everything is in $(cd "$OUTPUT" && pwd):"
echo "   model_final.pth        trained weights (+ optimizer/schedule state; last_checkpoint points to it)"
echo "   inference/*/           predictions and coco_eval_metrics.json (box AP, and mask AP for Mask R-CNN)"
echo "   inference/*/*.png      pictures of the evaluation: bbox_/segm_pr_curves.png, _per_category_ap.png,"
echo "                          _confusion_matrix.png, and error_gallery.png (the images with the most errors)"
echo "   metrics.json           losses, LR and timings per logged iteration, and the AP"
echo "   loss_curves.png        the loss and LR curves"
echo "   demo/*.png             validation images with the detections drawn"
echo "   log.txt, config.yaml   the full log and the exact config"
"$PYTHON" - "$OUTPUT" <<'PY'
import glob, json, os, sys
from detcore.engine import format_results
for path in sorted(glob.glob(os.path.join(sys.argv[1], "inference", "*", "coco_eval_metrics.json"))):
    print(f"AP on {os.path.basename(os.path.dirname(path))}:")
    print(format_results(json.load(open(path))))
PY
