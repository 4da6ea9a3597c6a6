"""What every meta-architecture does around its network: normalize and pad the input images,
batch inference so that padding never changes a detection, and map the results back to each
image's original size.

A subclass builds its parts, then calls ``finish_init()`` (channels-last needs every weight to
exist), implements ``forward`` for training and ``_inference_batch`` (one padded batch →
per-image ``Instances`` in the resized input frame).
"""
import math
from typing import Dict, List, Sequence

import torch
from torch import nn

from detcore.structures import ImageList, Instances
from detcore.structures.image_list import padded_side

from ..postprocessing import detector_postprocess

__all__ = ["Detector"]


class Detector(nn.Module):
    """Args:
        backbone: a Backbone (its ``size_divisibility`` joins ``size_divisibility``).
        pixel_mean, pixel_std: per channel, subtracted from and dividing the 0-255 pixels.
        input_format: "BGR" or "RGB", the channel order of the input images.
        size_divisibility: the padded batch is a multiple of this and of the backbone's own.
        channels_last: keep weights and images in NHWC (see MODEL.CHANNELS_LAST).
    """

    mask_on = False

    def __init__(
        self,
        *,
        backbone: nn.Module,
        pixel_mean: Sequence[float],
        pixel_std: Sequence[float],
        input_format: str = "BGR",
        size_divisibility: int = 0,
        channels_last: bool = False,
    ):
        super().__init__()
        if len(pixel_mean) != len(pixel_std):
            raise ValueError(
                f"pixel_mean and pixel_std must have the same length, got {len(pixel_mean)} and {len(pixel_std)}"
            )
        self.backbone = backbone
        self.input_format = input_format
        # The batch is padded to a multiple of both the requested divisibility and the backbone's
        # own (FPN needs its coarsest stride to divide the input); 0 or 1 means no constraint.
        divisors = [int(d) for d in (size_divisibility, backbone.size_divisibility) if int(d) > 1]
        self.size_divisibility = math.lcm(*divisors) if divisors else 0
        # Buffers, so they follow .to(device); not persistent: they come from the config, not
        # from training, so checkpoints do not carry them.
        self.register_buffer("pixel_mean", torch.tensor(pixel_mean, dtype=torch.float32).view(-1, 1, 1), False)
        self.register_buffer("pixel_std", torch.tensor(pixel_std, dtype=torch.float32).view(-1, 1, 1), False)
        self.channels_last = channels_last

    def finish_init(self) -> None:
        """Called by the subclass once all its modules exist: weights (here) and images
        (preprocess_image) in NHWC, so that conv outputs stay NHWC."""
        if self.channels_last:
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
        raise NotImplementedError(f"{type(self).__name__} must implement _inference_batch")

    def postprocess(self, results: List[Instances], batched_inputs: List[Dict]) -> List[Dict]:
        """Each result rescaled from the resized input to the size the input dict asks for
        ("height" / "width", default: the input's own)."""
        processed = []
        for result, x in zip(results, batched_inputs):
            height = x.get("height", result.image_size[0])
            width = x.get("width", result.image_size[1])
            processed.append({"instances": self.postprocess_one(result, height, width)})
        return processed

    def postprocess_one(self, result: Instances, height: int, width: int) -> Instances:
        return detector_postprocess(result, height, width)
