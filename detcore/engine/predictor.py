"""Predictor: an image (as OpenCV reads it) or a list of them in, detections out (numpy arrays).

The simplest way to use a trained model from a script or a notebook:

    predictor = Predictor(cfg)            # cfg.MODEL.WEIGHTS: the trained checkpoint
    out = predictor(cv2.imread("a.jpg"))  # out["boxes"], out["scores"], out["labels"], out["masks"],
                                          # out["keypoints"]

It applies the same test-time preprocessing as the evaluation data loader (channel order
INPUT.FORMAT, shortest edge resized to INPUT.MIN_SIZE_TEST capped at INPUT.MAX_SIZE_TEST, the way
INPUT.RESIZE_MODE says), and
the model rescales its detections back to the image as given. With TEST.AUG.ENABLED it runs the
test-time augmentation of the evaluation instead (``GeneralizedRCNNWithTTA``, which resizes each
scale itself, the same way).
"""
import numpy as np
import torch

from detcore.data.transforms import ResizeShortestEdge
from detcore.modeling import GeneralizedRCNNWithTTA, build_model
from detcore.utils.registry import build_from_config
from detcore.config.choices import IMAGE_FORMATS
from detcore.utils.precision import check_precision, inference_autocast

from .checkpointer import LoadReport, load_model_weights

__all__ = ["Predictor"]

_FORMATS = IMAGE_FORMATS


class Predictor:
    """Builds the model of `cfg` in eval mode on MODEL.DEVICE, loads MODEL.WEIGHTS (when set) and
    runs it on single images, in TEST.PRECISION ("bfloat16": under ``torch.autocast``).

    `__call__(image)` takes a ``[H, W, 3]`` uint8 numpy array in BGR order (or a list of them, run
    as one batch) and returns a dict of numpy arrays (a list of dicts) describing the detections
    in that image's pixel coordinates:

    * ``boxes``: float32 ``[N, 4]`` xyxy;
    * ``scores``: float32 ``[N]`` confidences;
    * ``labels``: int64 ``[N]`` class indices in ``[0, NUM_CLASSES)``;
    * ``masks``: bool ``[N, H, W]``, only for models with a mask head;
    * ``keypoints``: float32 ``[N, K, 3]`` (x, y, score: the heatmap logit), only for models with
      a keypoint head;
    * ``instances``: the model's raw ``Instances`` (on the CPU).

    A ProposalNetwork (RPN-only model) gives its proposals instead: ``boxes`` float32 ``[N, 4]``,
    ``objectness_logits`` float32 ``[N]`` (by decreasing objectness) and ``proposals`` (its raw
    ``Instances``).
    """

    def __init__(self, cfg):
        self.cfg = cfg.clone()
        self.input_format = self.cfg.INPUT.FORMAT
        if self.input_format not in _FORMATS:
            raise ValueError(f"Predictor: INPUT.FORMAT must be one of {_FORMATS}, got {self.input_format!r}")
        self.precision = self.cfg.TEST.PRECISION
        check_precision(self.precision)
        self.model = build_model(self.cfg)
        self.model.eval()
        self.load_report = None
        if self.cfg.MODEL.WEIGHTS:
            self.load_weights(self.cfg.MODEL.WEIGHTS)
        self.min_size, self.max_size = int(self.cfg.INPUT.MIN_SIZE_TEST), int(self.cfg.INPUT.MAX_SIZE_TEST)
        self.resize_mode = self.cfg.INPUT.RESIZE_MODE
        # What runs the inputs: the model, or its TTA wrapper (then given the images unresized).
        self.runner = self.model
        if self.cfg.TEST.AUG.ENABLED:
            self.runner = build_from_config(GeneralizedRCNNWithTTA, self.cfg, self.model)
            self.min_size = 0
        self.has_masks = bool(getattr(self.model, "mask_on", False))
        roi_heads = getattr(self.model, "roi_heads", None)  # a ProposalNetwork or RetinaNet has none
        self.has_keypoints = bool(getattr(roi_heads, "keypoint_on", False))

    def load_weights(self, path: str) -> LoadReport:
        """Load a state dict or a trainer checkpoint into the model (the engine's loader: matching
        names and shapes are copied, anything else is reported in the log)."""
        self.load_report = load_model_weights(self.model, path)
        return self.load_report

    def _check(self, image) -> None:
        if not isinstance(image, np.ndarray):
            raise TypeError(
                f"Predictor: image must be a numpy uint8 array [H, W, 3] in BGR order (as cv2.imread "
                f"returns), got {type(image).__name__}"
            )
        if image.ndim != 3 or image.shape[2] != 3 or min(image.shape[:2]) < 1 or image.dtype != np.uint8:
            raise ValueError(
                f"Predictor: image must be a numpy uint8 array [H, W, 3] in BGR order (as cv2.imread "
                f"returns), got {image.dtype} array of shape {image.shape}"
            )

    def preprocess(self, image: np.ndarray) -> torch.Tensor:
        """The checked BGR image as the model's ``[3, H', W']`` input: INPUT.FORMAT channel
        order, resized like the evaluation data loader does (same transform, same sizes; uint8, or
        float32 with INPUT.RESIZE_MODE "torchvision"; not resized with TEST.AUG.ENABLED)."""
        self._check(image)
        if self.input_format == "RGB":
            image = image[:, :, ::-1]
        image = np.ascontiguousarray(image)
        h, w = image.shape[:2]  # MIN_SIZE_TEST 0: no resizing
        resize = ResizeShortestEdge.test_transform(h, w, self.min_size, self.max_size, self.resize_mode)
        image = resize.apply_image(image)
        return torch.as_tensor(np.ascontiguousarray(image.transpose(2, 0, 1)))

    def __call__(self, image):
        """One image → its detections (a dict as described above); a list of images → a list of
        those dicts, computed in one batch (the same detections as one by one, up to float
        rounding: a batch pads its images to the largest)."""
        if isinstance(image, (list, tuple)):
            return self._predict(list(image))
        return self._predict([image])[0]

    def _predict(self, images: list) -> list:
        inputs = []
        for image in images:
            tensor = self.preprocess(image)
            inputs.append({"image": tensor, "height": image.shape[0], "width": image.shape[1]})
        if not inputs:
            return []
        with torch.no_grad(), inference_autocast(self.precision, self.model.device):
            outputs = self.runner(inputs)
        return [
            self._proposal_arrays(out["proposals"].to("cpu")) if "proposals" in out
            else self._as_arrays(out["instances"].to("cpu"), x["height"], x["width"])
            for out, x in zip(outputs, inputs)
        ]

    @staticmethod
    def _proposal_arrays(proposals) -> dict:
        return {
            "boxes": proposals.proposal_boxes.tensor.numpy().astype(np.float32, copy=False),
            "objectness_logits": proposals.objectness_logits.numpy().astype(np.float32, copy=False),
            "proposals": proposals,
        }

    def _as_arrays(self, instances, height: int, width: int) -> dict:
        out = {
            "boxes": instances.pred_boxes.tensor.numpy().astype(np.float32, copy=False),
            "scores": instances.scores.numpy().astype(np.float32, copy=False),
            "labels": instances.pred_classes.numpy().astype(np.int64, copy=False),
            "instances": instances,
        }
        if self.has_masks:
            if instances.has("pred_masks"):
                out["masks"] = instances.pred_masks.numpy().astype(bool, copy=False)
            else:  # no detections may mean the mask head was never asked for a mask
                out["masks"] = np.zeros((0, height, width), dtype=bool)
        if self.has_keypoints:
            if instances.has("pred_keypoints"):
                out["keypoints"] = instances.pred_keypoints.numpy().astype(np.float32, copy=False)
            else:
                num_keypoints = self.cfg.MODEL.ROI_KEYPOINT_HEAD.NUM_KEYPOINTS
                out["keypoints"] = np.zeros((0, num_keypoints, 3), dtype=np.float32)
        return out
