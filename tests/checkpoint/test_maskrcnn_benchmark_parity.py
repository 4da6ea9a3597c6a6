"""A maskrcnn-benchmark checkpoint through MODEL.WEIGHTS and the configs/maskrcnn_benchmark preset
gives maskrcnn-benchmark's detections and masks on a photo it resizes.

maskrcnn-benchmark itself does not install here (its C++/CUDA ops are built against a 2019
PyTorch), so its inference is rebuilt in this file from torchvision's Mask R-CNN, which descends
from it and shares its layers, with the parts where the two differ written from
maskrcnn-benchmark's code: the ResNet body (stride on the 1x1 conv, FrozenBatchNorm2d without
eps), Detectron's anchors, the Pooler (its level rule on "+1" areas, Detectron's ROIAlign on
inclusive corners), "+1" clipping, no small-box filter, the PIL resize, and the rescale of the
inclusive corners to the original image with the Masker's paste. torchvision's box coder, IoU
and NMS on detcore-style boxes give exactly maskrcnn-benchmark's numbers on its "+1" boxes.

The weights are seeded random ones made to exercise everything (as in
test_torchvision_parity.py), saved in maskrcnn-benchmark's names (a DDP "module." model dict)
and loaded by detcore's Predictor from the file. Paired detections must agree as tightly as in
the torchvision parity test (detcore's folded, channels-last convolutions round differently).
"""
from collections import OrderedDict

import numpy as np
import pytest
import torch
from torch import nn

from detcore.config import get_cfg
from detcore.engine import Predictor

from .test_maskrcnn_benchmark import PRESET, _FrozenBNWithoutEps
from .test_maskrcnn_benchmark_options import legacy_clip, reference_generate_anchors, reference_pooler
from .test_torchvision_parity import _randomize, check_detections, real_image

torchvision = pytest.importorskip("torchvision")
from torchvision.models.detection.roi_heads import paste_masks_in_image as tv_paste  # noqa: E402
from torchvision.ops import boxes as box_ops  # noqa: E402
from torchvision.ops.misc import FrozenBatchNorm2d as TVFrozenBatchNorm2d  # noqa: E402

MB_MEAN = [102.9801, 115.9465, 122.7717]  # BGR, no std
STRIDES = (4, 8, 16, 32, 64)
SIZES = (32, 64, 128, 256, 512)


class ReferenceAnchors(nn.Module):
    """maskrcnn-benchmark's AnchorGenerator for FPN: Detectron's cell anchors of each level's size,
    shifted by (x * stride, y * stride); returned in detcore-style boxes (+1 on the far corner)."""

    def __init__(self):
        super().__init__()
        self.cells = [torch.from_numpy(reference_generate_anchors(s, (size,), (0.5, 1, 2))).float() for s, size in zip(STRIDES, SIZES)]

    def forward(self, images, features):
        levels = []
        for feature, stride, cell in zip(features, STRIDES, self.cells):
            h, w = feature.shape[-2:]
            ys, xs = torch.meshgrid(torch.arange(h) * stride, torch.arange(w) * stride, indexing="ij")
            shifts = torch.stack([xs, ys, xs, ys], -1).reshape(-1, 1, 4).float()
            legacy = (shifts + cell[None]).reshape(-1, 4)
            levels.append(torch.cat([legacy[:, :2], legacy[:, 2:] + 1], 1))
        return [torch.cat(levels)] * len(images.image_sizes)


class ReferencePooler(nn.Module):
    """MultiScaleRoIAlign's place: maskrcnn-benchmark's Pooler (reference_pooler)."""

    def __init__(self, output_size, sampling_ratio):
        super().__init__()
        self.output_size, self.sampling_ratio = output_size, sampling_ratio

    def forward(self, features, boxes, image_shapes):
        assert len(boxes) == 1
        x = [features[k] for k in ("0", "1", "2", "3")]
        return reference_pooler(x, boxes[0], self.output_size, self.sampling_ratio)


def _stride_on_1x1(body):
    for layer in (body.layer2, body.layer3, body.layer4):
        block = layer[0]
        block.conv1.stride, block.conv2.stride = (2, 2), (1, 1)


def _without_eps(module):
    for name, child in module.named_children():
        if isinstance(child, TVFrozenBatchNorm2d):
            setattr(module, name, _FrozenBNWithoutEps(child))
        else:
            _without_eps(child)


def maskrcnn_benchmark_names(tv_state):
    """torchvision Mask R-CNN state dict -> maskrcnn-benchmark's names (its modeling code)."""
    out = OrderedDict()
    for name, tensor in tv_state.items():
        if name.startswith(("backbone.body.conv1.", "backbone.body.bn1.")):
            name = name.replace("backbone.body.", "backbone.body.stem.")
        for i in range(4):
            name = name.replace(f"backbone.fpn.inner_blocks.{i}.0.", f"backbone.fpn.fpn_inner{i + 1}.")
            name = name.replace(f"backbone.fpn.layer_blocks.{i}.0.", f"backbone.fpn.fpn_layer{i + 1}.")
            name = name.replace(f"roi_heads.mask_head.{i}.0.", f"roi_heads.mask.feature_extractor.mask_fcn{i + 1}.")
        name = name.replace("rpn.head.conv.0.0.", "rpn.head.conv.")
        name = name.replace("roi_heads.box_head.", "roi_heads.box.feature_extractor.")
        name = name.replace("roi_heads.box_predictor.", "roi_heads.box.predictor.")
        name = name.replace("roi_heads.mask_predictor.", "roi_heads.mask.predictor.")
        out[name] = tensor
    for level, cell in enumerate(ReferenceAnchors().cells):
        out[f"rpn.anchor_generator.cell_anchors.{level}"] = cell
    return out


def maskrcnn_benchmark_resize(rgb, min_size, max_size=1333):
    """Its Resize (size rule of transforms.py) with PIL's bilinear, then BGR float pixels."""
    from PIL import Image

    h, w = rgb.shape[:2]
    size = min_size
    if max(h, w) / min(h, w) * size > max_size:
        size = int(round(max_size * min(h, w) / max(h, w)))
    oh, ow = (size, int(size * w / h)) if h < w else (int(size * h / w), size)
    resized = np.asarray(Image.fromarray(rgb).resize((ow, oh), Image.BILINEAR))
    return torch.from_numpy(np.ascontiguousarray(resized[:, :, ::-1])).permute(2, 0, 1).float()


def test_maskrcnn_benchmark_checkpoint_gives_its_detections(tmp_path, monkeypatch):
    min_size = 384  # 375 x 500 -> 384 x 512
    rgb, _, _, source = real_image()
    height, width = rgb.shape[:2]
    pixels = maskrcnn_benchmark_resize(rgb, min_size)

    torch.manual_seed(0)
    ref = torchvision.models.detection.maskrcnn_resnet50_fpn(
        weights=None, weights_backbone=None, num_classes=81, min_size=pixels.shape[1], max_size=1333,
        image_mean=MB_MEAN, image_std=[1.0, 1.0, 1.0], rpn_pre_nms_top_n_test=1000, rpn_post_nms_top_n_test=1000,
        box_score_thresh=0.2, box_detections_per_img=100,
    )  # fmt: skip
    _stride_on_1x1(ref.backbone.body)
    _randomize(ref, pixels)
    checkpoint = {"module." + k: v.clone() for k, v in maskrcnn_benchmark_names(ref.state_dict()).items()}
    path = tmp_path / "model_final.pth"
    torch.save({"model": checkpoint, "iteration": 90000}, path)
    _without_eps(ref.backbone.body)
    ref.rpn.anchor_generator = ReferenceAnchors()
    ref.rpn.min_size = 0.0
    ref.roi_heads.box_roi_pool = ReferencePooler(7, 2)
    ref.roi_heads.mask_roi_pool = ReferencePooler(14, 2)
    ref.eval()
    monkeypatch.setattr(box_ops, "clip_boxes_to_image", lambda b, size: legacy_clip(b, *size))
    monkeypatch.setattr(box_ops, "remove_small_boxes", lambda b, min_size: torch.arange(len(b)))
    with torch.no_grad():
        images, _ = ref.transform([pixels])
        assert tuple(images.tensors.shape[-2:]) == (384, 512)
        features = ref.backbone(images.tensors)
        proposals, _ = ref.rpn(images, features)
        det = ref.roi_heads(features, proposals, images.image_sizes)[0][0]
    # Its BoxList.resize scales the inclusive corners to the photo; the Masker pastes into them.
    scale = torch.tensor([width / pixels.shape[2], height / pixels.shape[1]] * 2)
    legacy = torch.cat([det["boxes"][:, :2], det["boxes"][:, 2:] - 1], 1) * scale
    expected = {
        "boxes": torch.cat([legacy[:, :2], legacy[:, 2:] + 1], 1),
        "scores": det["scores"],
        "labels": det["labels"],
        "masks": (tv_paste(det["masks"], legacy, (height, width), padding=1) > 0.5).float(),
    }

    cfg = get_cfg()
    cfg.merge_from_file(str(PRESET))
    cfg.merge_from_list(
        ["MODEL.DEVICE", "cpu", "MODEL.WEIGHTS", str(path), "INPUT.MIN_SIZE_TEST", min_size,
         "MODEL.ROI_HEADS.SCORE_THRESH_TEST", 0.2]
    )  # fmt: skip
    predictor = Predictor(cfg)
    assert predictor.load_report.format == "maskrcnn-benchmark" and predictor.load_report.complete
    got = predictor(np.ascontiguousarray(rgb[:, :, ::-1]))["instances"]
    assert len(expected["boxes"]) < 100  # the list ends at the score threshold, not at a cut
    check_detections("mask", expected, got, source)
