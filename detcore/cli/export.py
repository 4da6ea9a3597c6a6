"""``detcore export``: export a detector to TorchScript (.ts), torch.export's ExportedProgram
(.pt2), ONNX (.onnx) or OpenVINO (.xml), with export.json. ``tools/export_model.py`` runs it.

    detcore export --config-file configs/e2e_mask_rcnn_R_18_FPN_shapes.yaml \\
        --format onnx --output exported/ MODEL.WEIGHTS output/e2e_mask_rcnn_R_18_FPN_shapes/model_final.pth

The exported graph takes one uint8 image (3 channels in INPUT.FORMAT order; --input-layout CHW or
HWC) of any size, already resized as export.json says (with --input-contract raw_image, for onnx
and openvino: as it is, the graph resizes it), and returns boxes, scores, classes (and mask
probabilities). See the README's "Deploy" section; ``detcore test --exported DIR`` scores it.
"""
import argparse
from typing import Optional, Sequence

import cv2
import torch

from detcore.config import get_cfg
from detcore.data import MetadataCatalog
from detcore.engine import load_model_weights
from detcore.engine.arguments import add_config_argument, add_overrides_argument
from detcore.export import FORMATS, INPUT_CONTRACTS, check_export_request, export_model, resize_for_model
from detcore.export.wrapper import INPUT_LAYOUTS
from detcore.modeling import build_model
from detcore.utils.logger import setup_logger

DESCRIPTION = (
    "Export a detector to TorchScript (.ts), torch.export's ExportedProgram (.pt2), ONNX (.onnx) or "
    "OpenVINO (.xml), with export.json."
)


def build_parser(prog: Optional[str] = None, description: Optional[str] = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=description or DESCRIPTION)
    add_config_argument(parser)
    parser.add_argument("--format", required=True, choices=FORMATS, help="what to write")
    parser.add_argument("--output", required=True, help="folder for the model file and export.json")
    parser.add_argument("--sample-image", help="an image to trace with (default: a random one at the test size)")
    parser.add_argument("--input-layout", default="CHW", choices=INPUT_LAYOUTS, help="the exported input's layout")
    parser.add_argument(
        "--input-contract", default="resized_image", choices=INPUT_CONTRACTS,
        help="raw_image (onnx, openvino): the graph takes the image as it is, resizes it and maps the boxes back "
        "itself; resized_image (default): the caller resizes as export.json says",
    )
    parser.add_argument(
        "--batch-size", type=int, default=None,
        help="export a graph taking B equally sized images at once (default: one image, no batch axis)",
    )
    parser.add_argument(
        "--overwrite", action="store_true",
        help="replace the model file and export.json of an earlier export in --output (otherwise refused)",
    )
    parser.add_argument(
        "--allow-random-weights", action="store_true",
        help="export an untrained model when MODEL.WEIGHTS is empty (otherwise refused)",
    )
    # int8 post-training quantization (ONNX, OpenVINO): detcore/export/quantize.py.
    parser.add_argument(
        "--int8", action="store_true",
        help="quantize the ONNX or OpenVINO export to int8, calibrated on --calibration-dataset",
    )
    parser.add_argument(
        "--calibration-dataset", metavar="NAME",
        help="registered dataset whose images calibrate --int8 (e.g. shapes_val, coco:path/to/val.json)",
    )
    parser.add_argument(
        "--calibration-images", type=int, default=100, metavar="N", help="how many of its images (default 100)"
    )
    add_overrides_argument(parser, help="KEY VALUE overrides; set MODEL.WEIGHTS")
    return parser


def parse_args(argv: Optional[Sequence[str]] = None, prog: Optional[str] = None, description: Optional[str] = None):
    return build_parser(prog, description).parse_args(argv)


def main(args):
    setup_logger()
    cfg = get_cfg()
    cfg.merge_from_file(args.config_file)
    cfg.merge_from_list(args.opts)
    cfg.freeze()
    if not cfg.MODEL.WEIGHTS and not args.allow_random_weights:
        raise SystemExit(
            "MODEL.WEIGHTS is empty, so the exported model would have random weights. Give the "
            "checkpoint (MODEL.WEIGHTS path/to/model_final.pth), or add --allow-random-weights if that is the intent."
        )
    try:  # before the model is built and traced: the format, settings and folder can be refused now
        check_export_request(
            cfg, args.format, args.output, args.overwrite, args.input_contract,
            args.int8, args.calibration_dataset, args.calibration_images,
        )
    except (ValueError, OSError, ImportError) as e:
        raise SystemExit(str(e)) from None
    model = build_model(cfg).eval()
    if cfg.MODEL.WEIGHTS:
        load_model_weights(model, cfg.MODEL.WEIGHTS)
    sample = None
    if args.sample_image:
        bgr = cv2.imread(args.sample_image, cv2.IMREAD_COLOR)
        if bgr is None:
            raise SystemExit(f"cannot read --sample-image {args.sample_image!r} as an image")
        image = bgr[:, :, ::-1] if cfg.INPUT.FORMAT == "RGB" else bgr
        sample, _, _ = resize_for_model(image.copy(), int(cfg.INPUT.MIN_SIZE_TEST), int(cfg.INPUT.MAX_SIZE_TEST))
        if args.input_layout == "CHW":
            sample = sample.permute(2, 0, 1).contiguous()
    class_names = MetadataCatalog.get(cfg.DATASETS.TEST[0]).get("thing_classes") if cfg.DATASETS.TEST else None
    paths = export_model(
        cfg, model, args.format, args.output, sample, args.input_layout, class_names, args.batch_size,
        overwrite=args.overwrite, input_contract=args.input_contract,
        int8=args.int8, calibration_dataset=args.calibration_dataset, calibration_images=args.calibration_images,
    )
    print(f"Wrote {paths['model']} and {paths['metadata']}")
    return paths


def run(args):
    with torch.no_grad():
        return main(args)
