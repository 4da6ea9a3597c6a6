"""The export-facing form of a detector: tensors in, tensors out, one graph.

``ExportableDetector(model)`` runs a detector (GeneralizedRCNN, RetinaNet) on one uint8 image in
the model's channel order (INPUT.FORMAT) and returns plain tensors (with ``batch_size=B``, on a batch of B equally
sized images, the detections of all of them, with ``image_index`` [N] saying whose each is):

* ``boxes``: float32 ``[N, 4]`` xyxy in the input image's pixels;
* ``scores``: float32 ``[N]``; ``classes``: int64 ``[N]`` in ``[0, NUM_CLASSES)``;
* ``mask_probs`` (Mask R-CNN only): float32 ``[N, M, M]`` mask probabilities of each detection's
  class, in its box (M = 28 for the standard FPN head, 14 for C4);
* ``keypoint_heatmaps`` (Keypoint R-CNN only): float32 ``[N, K, S, S]`` heatmap logits of each
  detection's K keypoints, in its box (S = 56 for the standard head).

A ProposalNetwork (RPN-only) gives its proposals instead: ``boxes`` float32 ``[N, 4]`` and
``objectness_logits`` float32 ``[N]``, by decreasing objectness.

Images must be larger than the backbone's coarsest stride on each side (65 px for the R-CNNs'
P6, 129 px for RetinaNet's P7), so that every feature map is at least 2 x 2: torch chooses conv
and norm kernels by whether a side is 1, so a graph traced with larger maps would not serve a 1-px
map. ``min_side`` says the bound. There is no largest size: no op of the graph has a limit an
image reaches before memory runs out. ``check_input`` states the whole rule (dtype, shape,
smallest side) once; every exported format refuses what it refuses (input_checks.py).

Normalization and padding are in the graph; resizing is not: torch.export would carry a resize
whose output size follows the input's through a min/max rule into every shape of the network
(tracing ten times slower), so the caller resizes (``resize_for_model``), or the ONNX / OpenVINO
export puts the resize and the mapping of the boxes back around this graph (raw_image.py,
``export_model(..., input_contract="raw_image")``).

Masks come out as the head's M×M probabilities, not pasted full-image masks: a full-image mask
per detection is N×H×W (100 × 800 × 1333 floats is 400 MB) and pasting is a per-box loop that
exports poorly; ``paste_masks`` (the model's own paste) turns them into image masks on the host.
Keypoints come out as heatmaps for the same reason: decoding resizes each box's maps to the box's
own size in pixels before taking the best pixel (how every reference decodes, so published weights
predict what they predict there), a per-box output size no static graph can hold;
``decode_keypoints`` (the model's own decoding) turns them into ``[N, K, 3]`` keypoints.
"""
from typing import Optional, Tuple

import torch
from torch import Tensor, nn

from detcore.data.transforms import ResizeShortestEdge
from detcore.modeling import ProposalNetwork
from detcore.structures import Boxes, heatmaps_to_keypoints, to_legacy_plus_one
from detcore.structures.mask_paste import paste_masks_in_image
from detcore.utils.precision import check_precision, inference_autocast

__all__ = ["ExportableDetector", "decode_keypoints", "paste_masks", "resize_for_model"]

INPUT_LAYOUTS = ("CHW", "HWC")


class ExportableDetector(nn.Module):
    """Args:
        model: a detcore detector (GeneralizedRCNN, RetinaNet, ProposalNetwork) in eval mode.
        input_layout: "CHW" (``[3, H, W]``) or "HWC" (``[H, W, 3]``, as OpenCV reads images).
        batch_size: None for one image; B for a batch of B equally sized images.
        precision: TEST.PRECISION; "bfloat16" runs the network under ``torch.autocast`` (the
            outputs stay float32).
    """

    def __init__(
        self, model: nn.Module, input_layout: str = "CHW", batch_size: Optional[int] = None, precision: str = "float32"
    ):
        super().__init__()
        check_precision(precision)
        if input_layout not in INPUT_LAYOUTS:
            raise ValueError(f"ExportableDetector: input_layout must be one of {INPUT_LAYOUTS}, got {input_layout!r}")
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"ExportableDetector: batch_size must be None (one image) or >= 1, got {batch_size}")
        self.model = model.eval()
        self.input_layout = input_layout
        self.batch_size = batch_size
        self.precision = precision
        self.proposals_only = isinstance(model, ProposalNetwork)
        self.mask_on = bool(getattr(model, "mask_on", False))
        roi_heads = getattr(model, "roi_heads", None)  # a ProposalNetwork or RetinaNet has none
        self.keypoint_on = bool(getattr(roi_heads, "keypoint_on", False))
        self.min_side = max(shape.stride for shape in model.backbone.output_shape().values()) + 1

    @property
    def input_shape(self) -> str:
        """The input's shape, as export.json and the error messages write it: ``[3, H, W]``,
        ``[H, W, 3]``, or with a leading ``B`` for a batch graph."""
        image = "[H, W, 3]" if self.input_layout == "HWC" else "[3, H, W]"
        return image if self.batch_size is None else f"[{self.batch_size}, {image[1:]}"

    def check_input(self, image: Tensor) -> None:
        """The input rule, stated once: uint8, the layout's shape (3 channels; B images for a batch
        graph), height and width of at least ``min_side``. torch.export keeps it in the program, as
        the input's dtype and fixed sizes and as the smallest value of its symbolic height and width;
        the TorchScript and ONNX forms apply the program's rule (input_checks.py)."""
        shape = tuple(image.shape)
        image_shape = shape if self.batch_size is None else shape[1:]
        fits = len(image_shape) == 3 and (self.batch_size is None or shape[0] == self.batch_size)
        if image.dtype != torch.uint8 or not fits or image_shape[-1 if self.input_layout == "HWC" else 0] != 3:
            raise ValueError(
                f"ExportableDetector: takes a uint8 image of shape {self.input_shape}, got {image.dtype} of shape {shape}"
            )
        height, width = image_shape[:2] if self.input_layout == "HWC" else image_shape[1:]
        # In the exported graph, a bound on the input's size ("Guard failed: ... >= min_side").
        torch._check(
            (height >= self.min_side) & (width >= self.min_side),
            lambda: f"ExportableDetector: images must be at least {self.min_side} px on each side (the coarsest "
            f"feature map must be 2 x 2 or larger), got {height} x {width}",
        )

    def forward(self, image: Tensor) -> Tuple[Tensor, ...]:
        self.check_input(image)
        images = [image] if self.batch_size is None else [image[i] for i in range(self.batch_size)]
        if self.input_layout == "HWC":
            images = [x.permute(2, 0, 1) for x in images]
        with inference_autocast(self.precision, self.model.device):
            results = self.model.inference([{"image": x} for x in images], do_postprocess=False)
        per_image = [self._outputs(result) for result in results]
        if self.batch_size is None:
            return per_image[0]
        merged = tuple(torch.cat(parts) for parts in zip(*per_image))
        index = torch.cat(
            [torch.full_like(outputs[1], i, dtype=torch.int64) for i, outputs in enumerate(per_image)]  # [N_i]
        )
        return merged + (index,)

    def _outputs(self, result) -> Tuple[Tensor, ...]:
        if self.proposals_only:
            boxes = result.proposal_boxes.tensor
            keep = Boxes(boxes).nonempty()  # as proposal_postprocess (masked always: one graph)
            return boxes[keep], result.objectness_logits[keep]
        boxes = result.pred_boxes.tensor
        # As the eager postprocessing: boxes left empty by clipping are dropped (masked always:
        # one graph for any count).
        keep = Boxes(boxes).nonempty()
        outputs = (boxes[keep], result.scores[keep], result.pred_classes[keep])
        if self.mask_on:
            outputs += (result.pred_masks[keep][:, 0],)
        if self.keypoint_on:
            outputs += (result.pred_keypoint_heatmaps[keep],)
        return outputs

    @property
    def output_names(self) -> Tuple[str, ...]:
        if self.proposals_only:
            names = ("boxes", "objectness_logits")
        else:
            names = ("boxes", "scores", "classes") + (("mask_probs",) if self.mask_on else ())
            names += ("keypoint_heatmaps",) if self.keypoint_on else ()
        return names + (("image_index",) if self.batch_size is not None else ())


def resize_for_model(image: Tensor, min_size: int, max_size: int) -> Tuple[Tensor, float, float]:
    """The evaluation loader's resize (shortest edge to ``min_size``, longest at most
    ``max_size``) of a uint8 ``[H, W, 3]`` image given as a tensor or numpy array. Returns the
    resized ``[H', W', 3]`` uint8 tensor and the x, y factors that map its pixels back."""
    array = image.numpy() if isinstance(image, Tensor) else image
    h, w = array.shape[:2]
    resized = ResizeShortestEdge.test_transform(h, w, min_size, max_size).apply_image(array)
    return torch.as_tensor(resized), w / resized.shape[1], h / resized.shape[0]


def paste_masks(
    mask_probs: Tensor,
    boxes: Tensor,
    height: int,
    width: int,
    threshold: float = 0.5,
    mode: str = "aligned",
    legacy_plus_one: bool = False,
) -> Tensor:
    """``[N, M, M]`` mask probabilities and their ``[N, 4]`` boxes (in an image of ``height`` ×
    ``width``) → ``[N, height, width]`` bool masks, as the eager model pastes them (threshold and
    mode: the config's MODEL.ROI_MASK_HEAD.MASK_THRESHOLD and PASTE_MODE, kept in the export's
    JSON; ``legacy_plus_one``: MODEL.BOX_LEGACY_PLUS_ONE, which pastes into (x1, y1, x2 - 1, y2 - 1))."""
    if legacy_plus_one:
        boxes = to_legacy_plus_one(boxes)
    return paste_masks_in_image(mask_probs, boxes, (height, width), threshold=threshold, mode=mode)


def decode_keypoints(keypoint_heatmaps: Tensor, boxes: Tensor) -> Tensor:
    """``[N, K, S, S]`` heatmap logits and their ``[N, 4]`` boxes (both as the graph gives them)
    → ``[N, K, 3]`` keypoints (x, y, score: the heatmap logit there) in the boxes' pixels, as the
    eager model decodes them. Scale x and y like the boxes to map them to another image size."""
    return heatmaps_to_keypoints(torch.as_tensor(keypoint_heatmaps), torch.as_tensor(boxes))
