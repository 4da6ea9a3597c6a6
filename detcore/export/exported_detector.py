"""An exported artefact evaluated like the model: ``ExportedDetector`` takes the test loader's
input dicts and returns what the eager detector returns (``[{"instances": Instances}]``, or
``"proposals"`` for a ProposalNetwork), so ``DefaultTrainer.test`` and every evaluator score
exactly what is shipped (tools/test_net.py --exported DIR).

The graph runs through the format's runner (runners.py); around it only what a deploy side does
with export.json: the image in the export's layout, and the model's own postprocessing
(``detector_postprocess`` / ``proposal_postprocess``: boxes rescaled to the original image, masks
pasted with export.json's threshold, paste mode and legacy +1, keypoints decoded).

``exported_config`` is the config of an evaluation: the one recorded in export.json, with what the
graph fixes imposed (float32 around the runtime, no test-time augmentation, OpenCV's uint8 resize
that export.json's ``resize_before`` asks of the deploy side; for a graph that takes the raw image,
export.json's ``input.contract`` "raw_image", no resize in the loader: INPUT.MIN_SIZE_TEST 0, the
detections come out in the image's pixels and the postprocessing's rescale is the identity), then
the command line's overrides (DATASETS.TEST, OUTPUT_DIR ...).
"""
import logging
import os
from typing import Dict, List, Sequence

import torch
import yaml
from torch import nn

from detcore.modeling.postprocessing import detector_postprocess, proposal_postprocess
from detcore.structures import Boxes, Instances

from .runners import ExportedRunner

__all__ = ["ExportedDetector", "exported_config"]

logger = logging.getLogger(__name__)

# What the exported graph fixes, whatever the recorded config or the command line say.
_IMPOSED = ["TEST.PRECISION", "float32", "TEST.AUG.ENABLED", False, "INPUT.RESIZE_MODE", "opencv", "MODEL.DEVICE", "cpu"]


class ExportedDetector(nn.Module):
    """Args:
        runner: an export loaded by ``detcore.export.load_exported``.
    """

    def __init__(self, runner: ExportedRunner):
        super().__init__()
        self.runner = runner
        metadata = runner.metadata
        self.input_layout = metadata["input"]["layout"]
        self.output_names = tuple(metadata["outputs"])
        self.proposals_only = "objectness_logits" in self.output_names
        self.result_key = "proposals" if self.proposals_only else "instances"
        # A batch graph ("[B, 3, H, W]") is fed the image B times; image 0's detections are kept.
        shape = metadata["input"]["shape"]
        self.batch_size = int(shape[1:].split(",")[0]) if "image_index" in self.output_names else None
        self.mask_threshold = metadata.get("mask_threshold")
        self.paste_mode = metadata.get("mask_paste_mode")
        self.legacy_plus_one = bool(metadata.get("box_legacy_plus_one", False))

    def forward(self, batched_inputs: List[Dict]) -> List[Dict]:
        return [{self.result_key: self._one(x)} for x in batched_inputs]

    def _one(self, x: Dict) -> Instances:
        image = x["image"]
        if image.dtype != torch.uint8:
            raise ValueError(
                f"ExportedDetector: the exported graph takes uint8 images, the loader gave {image.dtype} (set "
                "INPUT.RESIZE_MODE opencv, as export.json's resize_before says)"
            )
        height, width = image.shape[-2:]
        graph_input = image.permute(1, 2, 0).contiguous() if self.input_layout == "HWC" else image
        if self.batch_size is not None:
            graph_input = graph_input.unsqueeze(0).expand(self.batch_size, *graph_input.shape).contiguous()
        outputs = dict(zip(self.output_names, self.runner(graph_input)))
        if self.batch_size is not None:
            first = outputs.pop("image_index") == 0
            outputs = {name: value[first] for name, value in outputs.items()}
        result = Instances((height, width))
        out_height, out_width = x.get("height", height), x.get("width", width)
        if self.proposals_only:
            result.proposal_boxes = Boxes(outputs["boxes"])
            result.objectness_logits = outputs["objectness_logits"]
            return proposal_postprocess(result, out_height, out_width)
        result.pred_boxes = Boxes(outputs["boxes"])
        result.scores = outputs["scores"]
        result.pred_classes = outputs["classes"]
        if "mask_probs" in outputs:
            result.pred_masks = outputs["mask_probs"][:, None]
        if "keypoint_heatmaps" in outputs:
            result.pred_keypoint_heatmaps = outputs["keypoint_heatmaps"]
        paste = {}
        if self.mask_threshold is not None:
            paste = dict(mask_threshold=self.mask_threshold, paste_mode=self.paste_mode)
        return detector_postprocess(result, out_height, out_width, legacy_plus_one=self.legacy_plus_one, **paste)


def exported_config(metadata: dict, folder: str, opts: Sequence = ()):
    """The config to evaluate the export in ``folder`` with (frozen): export.json's, what the graph
    fixes, OUTPUT_DIR ``folder/evaluation`` (results beside the artefact), then ``opts``."""
    from detcore.config import get_cfg

    cfg = get_cfg()
    cfg.merge_from_other_cfg(yaml.safe_load(metadata["config"]))
    cfg.merge_from_list(["OUTPUT_DIR", os.path.join(folder, "evaluation")])
    cfg.merge_from_list(list(opts))
    imposed = list(_IMPOSED)
    if metadata["input"].get("contract") == "raw_image":
        imposed += ["INPUT.MIN_SIZE_TEST", 0]  # the graph resizes: the loader hands over the images as they are
    changed = [key for key, value in zip(imposed[::2], imposed[1::2]) if _get(cfg, key) != value]
    if changed:
        logger.info("Evaluating the export with %s as the exported graph runs it", ", ".join(
            f"{key} {value}" for key, value in zip(imposed[::2], imposed[1::2]) if key in changed))
    cfg.merge_from_list(imposed)
    cfg.freeze()
    return cfg


def _get(cfg, key: str):
    for part in key.split("."):
        cfg = getattr(cfg, part)
    return cfg
