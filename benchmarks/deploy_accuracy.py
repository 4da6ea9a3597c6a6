"""The deploy table's accuracy columns (benchmark_export.py): box and mask AP on shapes_val of
the shapes R-18 Mask R-CNN (the model the main job trains, given by its checkpoint), through each
of detcore's rows: eager in float32 and bfloat16, and each export made from it as users make them
(export_model; int8 calibrated on shapes_train), evaluated by the same evaluators
(``detcore test --exported`` runs the same code). torchvision's rows have no such model.

Every row sees the images the exports see: resized by OpenCV (INPUT.RESIZE_MODE opencv, which an
export's evaluation imposes, detcore/export/exported_detector.py), so the rows differ only by
their runtime and precision.
"""
import os
from typing import Dict, Iterable, Tuple

from deploy_rows import DETCORE_EAGER, EXPORTS, export_row

SHAPES_CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs",
                             "e2e_mask_rcnn_R_18_FPN_shapes.yaml")


def shapes_ap(weights: str, rows: Iterable[str], folder: str, threads: int,
              calibration: Tuple[str, int]) -> Dict[str, Dict[str, float]]:
    """``{row: {"box_ap": AP, "mask_ap": AP}}`` of the detcore rows among ``rows``; the exports
    and evaluation outputs are written under ``folder``."""
    import torch

    from detcore.config import get_cfg
    from detcore.engine import DefaultTrainer
    from detcore.engine.checkpointer import load_model_weights
    from detcore.export import ExportedDetector, exported_config, load_exported
    from detcore.modeling import build_model

    torch.set_num_threads(threads)
    cfg = get_cfg()
    cfg.merge_from_file(SHAPES_CONFIG)
    cfg.merge_from_list(["MODEL.DEVICE", "cpu", "INPUT.RESIZE_MODE", "opencv", "OUTPUT_DIR", folder])
    model = build_model(cfg)
    load_model_weights(model, weights, strict=True)
    model.eval()
    results = {}
    for row in rows:
        if row in DETCORE_EAGER or row in EXPORTS:
            print(f"  AP through {row} ...", flush=True)
        if row in DETCORE_EAGER:
            row_cfg = cfg.clone()
            row_cfg.merge_from_list(["TEST.PRECISION", DETCORE_EAGER[row], "OUTPUT_DIR", os.path.join(folder, row)])
            metrics = DefaultTrainer.test(row_cfg, model)
        elif row in EXPORTS:
            exported = export_row(cfg, model, row, folder, calibration)
            runner = load_exported(exported, num_threads=threads)
            metrics = DefaultTrainer.test(exported_config(runner.metadata, exported), ExportedDetector(runner))
        else:
            continue
        results[row] = {"box_ap": metrics["bbox"]["AP"], "mask_ap": metrics["segm"]["AP"]}
    return results
