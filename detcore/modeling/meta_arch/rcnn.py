"""GeneralizedRCNN: backbone → proposal generator (RPN) → ROI heads.

Training takes the data loader's list of dicts and returns a dict of losses; inference returns
one {"instances": Instances} per image, in the image's original size.
"""
from typing import Dict, List, Sequence

from torch import nn

from detcore.structures import Instances

from ..backbone import Backbone, build_backbone
from ..postprocessing import detector_postprocess
from ..proposal_generator import build_proposal_generator
from ..roi_heads import build_roi_heads
from .base import DetectorBase
from .build import META_ARCH_REGISTRY

__all__ = ["GeneralizedRCNN"]


@META_ARCH_REGISTRY.register()
class GeneralizedRCNN(DetectorBase):
    """Faster / Mask R-CNN: what the heads are is decided by the config (MODEL.MASK_ON, ...).
    Input normalization, padding, batched inference and rescaling are DetectorBase's."""

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
        super().__init__(
            backbone=backbone,
            pixel_mean=pixel_mean,
            pixel_std=pixel_std,
            input_format=input_format,
            size_divisibility=size_divisibility,
            channels_last=channels_last,
            proposal_generator=proposal_generator,
            roi_heads=roi_heads,
        )
        self.mask_threshold = mask_threshold
        self.paste_mode = paste_mode
        self.legacy_plus_one = bool(legacy_plus_one)

    @classmethod
    def from_config(cls, cfg):
        backbone = build_backbone(cfg)
        shapes = backbone.output_shape()
        return {
            "backbone": backbone,
            "proposal_generator": build_proposal_generator(cfg, shapes),
            "roi_heads": build_roi_heads(cfg, shapes),
            "mask_threshold": cfg.MODEL.ROI_MASK_HEAD.MASK_THRESHOLD,
            "paste_mode": cfg.MODEL.ROI_MASK_HEAD.PASTE_MODE,
            "legacy_plus_one": cfg.MODEL.BOX_LEGACY_PLUS_ONE,
            **cls.input_settings(cfg),
        }

    @property
    def mask_on(self) -> bool:
        return bool(getattr(self.roi_heads, "mask_on", False))

    def forward(self, batched_inputs: List[Dict]):
        if not self.training:
            return self.inference(batched_inputs)
        gt_instances = self.gt_instances(batched_inputs)
        images = self.preprocess_image(batched_inputs)
        features = self.backbone(images.tensor)
        proposals, proposal_losses = self.proposal_generator(images, features, gt_instances)
        _, detector_losses = self.roi_heads(images, features, proposals, gt_instances)
        return {**proposal_losses, **detector_losses}

    def _inference_batch(self, batched_inputs: List[Dict], do_postprocess: bool) -> List:
        images = self.preprocess_image(batched_inputs)
        features = self.backbone(images.tensor)
        proposals, _ = self.proposal_generator(images, features, None)
        results, _ = self.roi_heads(images, features, proposals, None)
        if not do_postprocess:
            return results
        return self.postprocess(results, batched_inputs)

    def postprocess_one(self, result: Instances, height: int, width: int) -> Instances:
        return detector_postprocess(result, height, width, self.mask_threshold, self.paste_mode, self.legacy_plus_one)
