"""GeneralizedRCNN: backbone → proposal generator (RPN) → ROI heads.

Training takes the data loader's list of dicts and returns a dict of losses; inference returns
one {"instances": Instances} per image, in the image's original size.
"""
import math
from typing import Dict, List, Sequence

import torch
from torch import nn

from detcore.structures import ImageList, Instances
from detcore.structures.image_list import padded_side

from ..backbone import Backbone, build_backbone
from ..postprocessing import detector_postprocess
from ..proposal_generator import build_proposal_generator
from ..roi_heads import build_roi_heads
from .build import META_ARCH_REGISTRY

__all__ = ["GeneralizedRCNN"]


@META_ARCH_REGISTRY.register()
class GeneralizedRCNN(nn.Module):
    """Faster / Mask R-CNN: what the heads are is decided by the config (MODEL.MASK_ON, ...)."""

    def __init__(
        self,
        *,
        backbone: Backbone,
        proposal_generator: nn.Module,
        roi_heads: nn.Module,
        pixel_mean: Sequence[float],
        pixel_std: Sequence[float],
        input_format: str = "BGR",
        mask_threshold: float = 0.5,
        paste_mode: str = "aligned",
        size_divisibility: int = 0,
        channels_last: bool = False,
        legacy_plus_one: bool = False,
    ):
        super().__init__()
        if len(pixel_mean) != len(pixel_std):
            raise ValueError(
                f"pixel_mean and pixel_std must have the same length, got {len(pixel_mean)} and {len(pixel_std)}"
            )
        self.backbone = backbone
        self.proposal_generator = proposal_generator
        self.roi_heads = roi_heads
        self.input_format = input_format
        self.mask_threshold = mask_threshold
        self.paste_mode = paste_mode
        self.legacy_plus_one = bool(legacy_plus_one)
        # The batch is padded to a multiple of both the requested divisibility and the backbone's
        # own (FPN needs its coarsest stride to divide the input); 0 or 1 means no constraint.
        divisors = [int(d) for d in (size_divisibility, backbone.size_divisibility) if int(d) > 1]
        self.size_divisibility = math.lcm(*divisors) if divisors else 0
        # Buffers, so they follow .to(device); not persistent: they come from the config, not
        # from training, so checkpoints do not carry them.
        self.register_buffer("pixel_mean", torch.tensor(pixel_mean, dtype=torch.float32).view(-1, 1, 1), False)
        self.register_buffer("pixel_std", torch.tensor(pixel_std, dtype=torch.float32).view(-1, 1, 1), False)
        # Weights (here) and images (preprocess_image) in NHWC; conv outputs then stay NHWC.
        self.channels_last = channels_last
        if channels_last:
            self.to(memory_format=torch.channels_last)

    @classmethod
    def from_config(cls, cfg):
        backbone = build_backbone(cfg)
        shapes = backbone.output_shape()
        return {
            "backbone": backbone,
            "proposal_generator": build_proposal_generator(cfg, shapes),
            "roi_heads": build_roi_heads(cfg, shapes),
            "pixel_mean": cfg.MODEL.PIXEL_MEAN,
            "pixel_std": cfg.MODEL.PIXEL_STD,
            "input_format": cfg.INPUT.FORMAT,
            "mask_threshold": cfg.MODEL.ROI_MASK_HEAD.MASK_THRESHOLD,
            "paste_mode": cfg.MODEL.ROI_MASK_HEAD.PASTE_MODE,
            "size_divisibility": cfg.INPUT.SIZE_DIVISIBILITY,
            "channels_last": cfg.MODEL.CHANNELS_LAST,
            "legacy_plus_one": cfg.MODEL.BOX_LEGACY_PLUS_ONE,
        }

    @property
    def device(self) -> torch.device:
        return self.pixel_mean.device

    def preprocess_image(self, batched_inputs: List[Dict]) -> ImageList:
        """Normalize each image and pad the batch to the backbone's size divisibility."""
        images = []
        for i, x in enumerate(batched_inputs):
            image = x.get("image")
            if not isinstance(image, torch.Tensor) or image.dim() != 3 or image.shape[0] != self.pixel_mean.shape[0]:
                shape = tuple(image.shape) if isinstance(image, torch.Tensor) else type(image).__name__
                raise ValueError(
                    f"batched_inputs[{i}]['image'] must be a Tensor[{self.pixel_mean.shape[0]}, H, W] in "
                    f"{self.input_format} order, got {shape}"
                )
            images.append((image.to(self.device, non_blocking=True).float() - self.pixel_mean) / self.pixel_std)
        images = ImageList.from_tensors(images, self.size_divisibility)
        if self.channels_last:
            images.tensor = images.tensor.contiguous(memory_format=torch.channels_last)
        return images

    def forward(self, batched_inputs: List[Dict]):
        if not self.training:
            return self.inference(batched_inputs)
        if any("instances" not in x for x in batched_inputs):
            raise ValueError("GeneralizedRCNN in training mode needs 'instances' in every input dict")
        images = self.preprocess_image(batched_inputs)
        gt_instances = [x["instances"].to(self.device) for x in batched_inputs]
        features = self.backbone(images.tensor)
        proposals, proposal_losses = self.proposal_generator(images, features, gt_instances)
        _, detector_losses = self.roi_heads(images, features, proposals, gt_instances)
        return {**proposal_losses, **detector_losses}

    @torch.no_grad()
    def inference(self, batched_inputs: List[Dict], do_postprocess: bool = True) -> List:
        """Detections per input. Images are batched with those of the same padded size only, so
        each is padded as it would be alone: a batch gives the detections of one-by-one
        inference (up to float rounding), whatever else is in it."""
        sizes = [self._padded_size(x.get("image")) for x in batched_inputs]
        if len(batched_inputs) <= 1 or any(isinstance(v, torch.SymInt) for size in sizes for v in size):
            # One image; or traced for export, where a batch is one tensor of equal images.
            return self._inference_batch(batched_inputs, do_postprocess)
        groups: Dict[tuple, List[int]] = {}
        for i, size in enumerate(sizes):
            groups.setdefault(size, []).append(i)
        if len(groups) == 1:
            return self._inference_batch(batched_inputs, do_postprocess)
        results: List = [None] * len(batched_inputs)
        for indices in groups.values():
            for i, result in zip(indices, self._inference_batch([batched_inputs[i] for i in indices], do_postprocess)):
                results[i] = result
        return results

    def _padded_size(self, image) -> tuple:
        if not isinstance(image, torch.Tensor) or image.dim() != 3:
            return ()  # preprocess_image names the bad input
        h, w = image.shape[-2:]
        return padded_side(h, self.size_divisibility), padded_side(w, self.size_divisibility)

    def _inference_batch(self, batched_inputs: List[Dict], do_postprocess: bool) -> List:
        images = self.preprocess_image(batched_inputs)
        features = self.backbone(images.tensor)
        proposals, _ = self.proposal_generator(images, features, None)
        results, _ = self.roi_heads(images, features, proposals, None)
        if not do_postprocess:
            return results
        return self.postprocess(results, batched_inputs)

    def postprocess(self, results: List[Instances], batched_inputs: List[Dict]) -> List[Dict]:
        processed = []
        for result, x in zip(results, batched_inputs):
            height = x.get("height", result.image_size[0])
            width = x.get("width", result.image_size[1])
            processed.append(
                {
                    "instances": detector_postprocess(
                        result, height, width, self.mask_threshold, self.paste_mode, self.legacy_plus_one
                    )
                }
            )
        return processed

