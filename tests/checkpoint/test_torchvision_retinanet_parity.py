"""detcore with converted torchvision weights must BE torchvision's RetinaNet: same detections on
a real photo, same training losses on a batch.

As for the R-CNNs (test_torchvision_parity.py, whose image and comparison this reuses), the
torchvision model gets seeded random weights that exercise everything: BatchNorm statistics
measured on the image and perturbed, non-zero biases everywhere, towers with unit-gain weights
(the default std 0.01 would shrink the features to nothing over four convs), class logits that
vary from anchor to anchor with five classes well above the 0.05 threshold, and box deltas of a
few tenths. Its "class 0" output, which torchvision trains towards 0 for every anchor (its labels
start at 1), is set far below the threshold, as training leaves it: the conversion drops it.

What had to match, setting for setting (configs/torchvision/retinanet_R_50_FPN.yaml): P6/P7 from
P5; anchor sizes x * 2^(k/3) truncated to ints, rounded corners, ratio-major order, strides from
the padded image size; a per-image loss normalization averaged over the images; the L1 box loss;
clipping before the NMS; 300 detections per image. detcore drops detections whose box clipping
left empty (as detectron2 does), torchvision keeps them: the comparison leaves those out.
"""
import math

import numpy as np
import pytest
import torch
from torch import nn

from detcore.checkpoint import convert_state_dict
from detcore.config import get_cfg
from detcore.modeling import build_model
from detcore.structures import BitMasks, Boxes, Instances

from .test_torchvision_parity import MEAN, REPO, STD, _freeze_batch_norms, pair_detections, real_image

torchvision = pytest.importorskip("torchvision")

TV_TO_DETCORE_LOSS = {"classification": "loss_cls", "bbox_regression": "loss_box_reg"}
BOOSTED = [1, 3, 18, 44, 62]  # torchvision labels scoring well above the threshold


@torch.no_grad()
def _randomize(tv, pixels):
    body = tv.backbone.body
    for m in body.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.momentum = None
            m.reset_running_stats()
            m.weight.uniform_(0.5, 1.5)
            m.bias.normal_(0, 0.2)
    body.train()
    body(tv.transform([pixels])[0].tensors)  # BatchNorm statistics of this image
    for m in body.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.add_(torch.randn_like(m.running_mean) * 0.05)
    _freeze_batch_norms(body)
    head = tv.head
    for tower in (head.classification_head.conv, head.regression_head.conv):
        for m in tower.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.normal_(m.weight, std=math.sqrt(2.0 / (9 * m.in_channels)))
                nn.init.normal_(m.bias, std=0.05)
    cls = head.classification_head.cls_logits
    num_classes = head.classification_head.num_classes
    nn.init.normal_(cls.weight, std=0.01)
    bias = torch.randn(head.classification_head.num_anchors, num_classes) * 0.3 - 4.0
    bias[:, BOOSTED] += torch.tensor([2.2, 2.0, 1.8, 2.1, 1.7])
    bias[:, 0] = -20.0  # "class 0": trained towards 0 by torchvision, dropped by the conversion
    cls.bias.copy_(bias.flatten())
    reg = head.regression_head.bbox_reg
    nn.init.normal_(reg.weight, std=0.005)
    nn.init.normal_(reg.bias, std=0.1)
    for p in tv.parameters():
        if p.dim() == 1 and not p.abs().sum():
            p.normal_(0, 0.05)  # the remaining zero-initialized biases (FPN, P6/P7)


def build_pair(height, width, pixels):
    torch.manual_seed(0)
    tv = torchvision.models.detection.retinanet_resnet50_fpn(
        weights=None, weights_backbone=None, min_size=height, max_size=max(width, 1333), image_mean=MEAN, image_std=STD
    )
    tv.transform.torch_choice = lambda sizes: sizes[0]  # no random training size
    _randomize(tv, pixels)
    tv.eval()
    cfg = get_cfg()
    cfg.merge_from_file(str(REPO / "configs" / "torchvision" / "retinanet_R_50_FPN.yaml"))
    cfg.merge_from_list(["MODEL.DEVICE", "cpu"])
    ours = build_model(cfg)
    state_dict, report = convert_state_dict(tv.state_dict(), ours)
    assert report.complete, report.table()
    ours.load_state_dict(state_dict, strict=True)
    return tv, ours.eval()


def check_parity(height, width):
    rgb, masks, labels, source = real_image(height, width)
    image = torch.from_numpy(rgb).permute(2, 0, 1).contiguous()
    pixels = image.float()
    tv, ours = build_pair(height, width, pixels)

    with torch.no_grad():
        expected = tv([pixels])[0]
        got = ours([{"image": image, "height": height, "width": width}])[0]["instances"]
    boxes = expected["boxes"]
    nonempty = (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])
    expected = {k: v[nonempty] for k, v in expected.items()}
    n = len(expected["boxes"])
    assert n >= 20 and len(expected["labels"].unique()) >= 4, f"too few detections to compare ({source})"
    assert (expected["labels"] != 0).all()
    assert len(got) == n, f"{len(got)} detections, torchvision has {n} ({source})"
    pair_detections(expected, got, max_rank_shift=6)

    # Training losses on a batch of two images with different foreground counts (the photo, and
    # the photo mirrored with only some of its objects), so per-image normalization matters.
    gt_boxes = BitMasks(torch.from_numpy(masks)).get_bounding_boxes().tensor
    mirrored = gt_boxes[::2].clone()
    mirrored[:, [0, 2]] = width - gt_boxes[::2][:, [2, 0]]
    batch = [(pixels, gt_boxes, labels), (pixels.flip(-1), mirrored, labels[::2])]
    targets = [{"boxes": b.clone(), "labels": torch.from_numpy(np.ascontiguousarray(lab))} for _, b, lab in batch]
    inputs = [
        {"image": px.to(torch.uint8), "instances": Instances(
            (height, width), gt_boxes=Boxes(b.clone()), gt_classes=torch.from_numpy(np.ascontiguousarray(lab - 1)))}
        for px, b, lab in batch
    ]
    tv.train()
    ours.train()
    with torch.no_grad():
        tv_losses = tv([px for px, _, _ in batch], targets)
        our_losses = ours(inputs)
    assert set(our_losses) == {TV_TO_DETCORE_LOSS[k] for k in tv_losses}
    for tv_name, value in tv_losses.items():
        assert value > 0
        torch.testing.assert_close(
            our_losses[TV_TO_DETCORE_LOSS[tv_name]], value, rtol=1e-4, atol=1e-6, msg=lambda m: f"{tv_name}: {m}"
        )


def test_retinanet_matches_torchvision_small_image():
    # 256 x 352: p7 is 2 x 3, so torchvision's anchor strides there are 128 and 352 // 3 = 117.
    check_parity(256, 352)


@pytest.mark.slow
def test_retinanet_matches_torchvision_full_size():
    check_parity(800, 1067)
