"""ProposalNetwork: backbone → RPN, and nothing after (the "RPN-only" models of Detectron,
maskrcnn-benchmark and detectron2).

Training returns the RPN's losses; inference returns one {"proposals": Instances} per image with
``proposal_boxes`` (Boxes, in the original image's pixels) and ``objectness_logits``, by
decreasing objectness (MODEL.RPN.POST_NMS_TOPK_TEST of them at most). Its metric is proposal
recall (AR@100, AR@1000; detcore.evaluation.proposal_recall).
"""
from typing import Dict, List, Sequence

from torch import nn

from detcore.structures import Instances

from ..backbone import Backbone, build_backbone
from ..postprocessing import proposal_postprocess
from ..proposal_generator import build_proposal_generator
from .base import DetectorBase
from .build import META_ARCH_REGISTRY

__all__ = ["ProposalNetwork"]


@META_ARCH_REGISTRY.register()
class ProposalNetwork(DetectorBase):
    """Args: as GeneralizedRCNN's, without the ROI heads and their mask settings."""

    result_key = "proposals"

    def __init__(
        self,
        *,
        backbone: Backbone,
        proposal_generator: nn.Module,
        pixel_mean: Sequence[float],
        pixel_std: Sequence[float],
        input_format: str = "BGR",
        size_divisibility: int = 0,
        channels_last: bool = False,
    ):
        super().__init__(
            backbone=backbone,
            pixel_mean=pixel_mean,
            pixel_std=pixel_std,
            input_format=input_format,
            size_divisibility=size_divisibility,
            channels_last=channels_last,
            proposal_generator=proposal_generator,
        )

    @classmethod
    def from_config(cls, cfg):
        backbone = build_backbone(cfg)
        return {
            "backbone": backbone,
            "proposal_generator": build_proposal_generator(cfg, backbone.output_shape()),
            **cls.input_settings(cfg),
        }

    @classmethod
    def from_detector(cls, detector: DetectorBase) -> "ProposalNetwork":
        """The first stage of a two-stage detector (a GeneralizedRCNN) as a ProposalNetwork that
        shares its backbone and RPN (no copy): its proposals, e.g. to measure their recall."""
        generator = getattr(detector, "proposal_generator", None)
        if not isinstance(detector, DetectorBase) or generator is None:
            raise TypeError(
                f"ProposalNetwork.from_detector: needs a detector with a backbone and a proposal_generator "
                f"(a GeneralizedRCNN), got {type(detector).__name__}"
            )
        network = cls(
            backbone=detector.backbone,
            proposal_generator=generator,
            pixel_mean=detector.pixel_mean.flatten().tolist(),
            pixel_std=detector.pixel_std.flatten().tolist(),
            input_format=detector.input_format,
            size_divisibility=detector.size_divisibility,
            channels_last=detector.channels_last,
        )
        return network.to(detector.device).train(detector.training)

    def forward(self, batched_inputs: List[Dict]):
        if not self.training:
            return self.inference(batched_inputs)
        gt_instances = self.gt_instances(batched_inputs)
        images = self.preprocess_image(batched_inputs)
        features = self.backbone(images.tensor)
        _, losses = self.proposal_generator(images, features, gt_instances)
        return losses

    def _inference_batch(self, batched_inputs: List[Dict], do_postprocess: bool) -> List:
        images = self.preprocess_image(batched_inputs)
        features = self.backbone(images.tensor)
        proposals, _ = self.proposal_generator(images, features, None)
        if not do_postprocess:
            return proposals
        return self.postprocess(proposals, batched_inputs)

    def postprocess_one(self, result: Instances, height: int, width: int) -> Instances:
        return proposal_postprocess(result, height, width)
