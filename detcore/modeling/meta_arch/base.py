"""What every meta-architecture (GeneralizedRCNN, ProposalNetwork, RetinaNet) does around its
heads: normalize and pad the input images, check the training targets, at inference batch
together only images of the same padded size, and map the results back to each image's size.

A subclass passes its backbone and its other sub-modules (by name, in order) to
``DetectorBase.__init__``, implements ``forward`` (training) and ``_inference_batch`` (one padded
batch → per image an ``Instances`` in the resized input's frame), and, if its results are not
detections, ``result_key`` and ``postprocess_one``.
"""
import math
from typing import Dict, List, Sequence

import torch
from torch import nn

from detcore.structures import ImageList, Instances
from detcore.structures.image_list import padded_side

from ..backbone import Backbone
from ..postprocessing import detector_postprocess

__all__ = ["DetectorBase"]


class DetectorBase(nn.Module):
    """Args:
        backbone: image batch → named feature maps.
        pixel_mean, pixel_std: per-channel normalization, in ``input_format`` order.
        input_format: channel order of the images ("BGR" or "RGB").
        size_divisibility: pad batches to a multiple of this (and of the backbone's own).
        channels_last: keep weights and images in NHWC memory layout.
        **heads: the other sub-modules (e.g. proposal_generator, roi_heads), registered in the
            order given, after the backbone (checkpoints list them in that order).
    """

    # Whether results carry masks (Predictor and export ask the model, whatever its heads).
    mask_on = False
    # The key of each postprocessed result in the output dicts.
    result_key = "instances"

    @staticmethod
    def input_settings(cfg) -> Dict:
        """The constructor arguments every detector takes from the config alike: how its input
        images are read, normalized and padded (for ``from_config``)."""
        return {
            "pixel_mean": cfg.MODEL.PIXEL_MEAN,
            "pixel_std": cfg.MODEL.PIXEL_STD,
            "input_format": cfg.INPUT.FORMAT,
            "size_divisibility": cfg.INPUT.SIZE_DIVISIBILITY,
            "channels_last": cfg.MODEL.CHANNELS_LAST,
        }

    def __init__(
        self,
        *,
        backbone: Backbone,
        pixel_mean: Sequence[float],
        pixel_std: Sequence[float],
        input_format: str = "BGR",
        size_divisibility: int = 0,
        channels_last: bool = False,
        **heads: nn.Module,
    ):
        super().__init__()
        if len(pixel_mean) != len(pixel_std):
            raise ValueError(
                f"pixel_mean and pixel_std must have the same length, got {len(pixel_mean)} and {len(pixel_std)}"
            )
        self.backbone = backbone
        for name, module in heads.items():
            self.add_module(name, module)
        self.input_format = input_format
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

    def gt_instances(self, batched_inputs: List[Dict]) -> List[Instances]:
        """The training targets of every input, on the model's device."""
        if any("instances" not in x for x in batched_inputs):
            raise ValueError(f"{type(self).__name__} in training mode needs 'instances' in every input dict")
        return [x["instances"].to(self.device) for x in batched_inputs]

    @torch.no_grad()
    def inference(self, batched_inputs: List[Dict], do_postprocess: bool = True) -> List:
        """Outputs per input. Images are batched with those of the same padded size only, so
        each is padded as it would be alone: a batch gives the outputs of one-by-one inference
        (up to float rounding), whatever else is in it."""
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
        """One padded batch → per image the raw results (``do_postprocess=False``: Instances in
        the input's size) or the outputs in the original image size."""
        raise NotImplementedError(f"{type(self).__name__} must implement _inference_batch")

    def postprocess(self, results: List[Instances], batched_inputs: List[Dict]) -> List[Dict]:
        """Each result rescaled from the resized input to the size the input dict asks for
        ("height" / "width", default: the input's own), as ``{result_key: Instances}``."""
        processed = []
        for result, x in zip(results, batched_inputs):
            height = x.get("height", result.image_size[0])
            width = x.get("width", result.image_size[1])
            processed.append({self.result_key: self.postprocess_one(result, height, width)})
        return processed

    def postprocess_one(self, result: Instances, height: int, width: int) -> Instances:
        return detector_postprocess(result, height, width)
