"""Whole models on CUDA against the CPU: R-50-FPN Mask R-CNN, Keypoint R-CNN, RetinaNet and a
Mask R-CNN with a deformable (DCN v2) body, each from its config under configs/ with seeded
random weights: inference, and one training step (losses and every parameter's gradient).

Both devices compute in float64, but for the RPN, which ranks and decodes its proposals in
float32 as it always does (CUDA's expf and the CPU's may differ in the last bit, moving a
proposal's corner by ~1e-5 pixel). Otherwise the two differ only in the order of their
additions (cuDNN's convolutions against the CPU's, the kernels' atomics), ~1e-16 relative per
operation. Everything downstream of the proposals thus agrees to ~1e-7 relative, and
DOUBLE_TOLERANCE (1e-5) leaves a margin while anything a wrong kernel or a misplaced tensor
would give is far larger. In float32 throughout, differences of ~1e-6 would move values across
the model's discrete decisions now and then (which of two anchors with nearly the same logit
makes an RPN level's top-k, which box survives NMS) and a whole detection would differ; the
float64 network keeps those gaps (~1e-5 among thousands of scores) far above its errors. Masks
are compared as the share of pasted pixels that differ (a pixel's probability next to 0.5 may
round either way), at most MASK_PIXEL_TOLERANCE.

Training takes every anchor and every proposal (sampling sizes far above their counts), so that
the random sampling, which draws from each device's own generator, picks the same examples on
both; only their order differs, which sums absorb.

The mixed-precision step (float16 autocast, SOLVER.AMP's default) is checked
against the float64 losses loosely (AMP_LOSS_TOLERANCE): float16 rounding moves some proposals
across NMS and top-k, so its losses average over slightly different ROIs.

The sizes that do not change the code path are shrunk (images, proposal and detection counts,
the keypoint head's width), so that the float64 CPU side stays quick.
"""
import copy

import pytest
import torch

from detcore.config import get_cfg
from detcore.layers import _extension
from detcore.modeling import build_model
from detcore.structures import Boxes, Instances, Keypoints, PolygonMasks

try:
    from .small_config import CONFIGS
except ImportError:  # tests/ run as rootdir-relative modules, without packages
    from small_config import CONFIGS

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(
        not (_extension.is_available() and _extension.cuda_kernels_built()),
        reason="detcore._C was built without CUDA kernels",
    ),
]

DOUBLE_TOLERANCE = dict(rtol=1e-5, atol=1e-5)
# float64 sums of terms up to ~1 that cancel leave noise near 1e-16: the floor sits well above it.
CANCELLED_GRADIENT_FLOOR = 1e-12
MASK_PIXEL_TOLERANCE = 1e-3
AMP_LOSS_TOLERANCE = dict(rtol=0.1, atol=0.02)
HEIGHT, WIDTH = 128, 160  # one size for both images: no padding, whose zeros could tie scores

MODELS = {
    "mask_rcnn": ("e2e_mask_rcnn_R_50_FPN_1x.yaml", []),
    "keypoint_rcnn": ("keypoint_rcnn_R_50_FPN_1x.yaml", ["MODEL.ROI_KEYPOINT_HEAD.CONV_DIMS", [64] * 8]),
    "retinanet": ("retinanet_R_50_FPN_1x.yaml", []),
    "dcn_v2": ("e2e_mask_rcnn_dconv_R_50_FPN_1x.yaml", ["MODEL.RESNETS.DEFORM_MODULATED", True]),
}
SMALL = [
    "MODEL.DEVICE", "cpu",
    "MODEL.RPN.PRE_NMS_TOPK_TRAIN", 300,
    "MODEL.RPN.POST_NMS_TOPK_TRAIN", 100,
    "MODEL.RPN.PRE_NMS_TOPK_TEST", 300,
    "MODEL.RPN.POST_NMS_TOPK_TEST", 100,
    # Every anchor and every proposal: no random sampling (see the module's docstring).
    "MODEL.RPN.BATCH_SIZE_PER_IMAGE", 10**7,
    "MODEL.ROI_HEADS.BATCH_SIZE_PER_IMAGE", 10**7,
    "MODEL.ROI_HEADS.SCORE_THRESH_TEST", 0.0,
    "MODEL.RETINANET.SCORE_THRESH_TEST", 0.0,
    "MODEL.RETINANET.TOPK_CANDIDATES_TEST", 300,
    "TEST.DETECTIONS_PER_IMAGE", 10,
]


@pytest.fixture(autouse=True)
def exact_float32_on_gpu():
    """No TF32 in cuDNN / cuBLAS: the AMP test's float32 parts stay float32."""
    flags = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = flags


def _cfg(name):
    config, overrides = MODELS[name]
    cfg = get_cfg()
    cfg.merge_from_file(str(CONFIGS / config))
    cfg.merge_from_list(SMALL + overrides)
    return cfg


def _models(name):
    """The CPU model in float64 with seeded random weights, and its copy on the GPU."""
    cfg = _cfg(name)
    torch.manual_seed(0)
    cpu = build_model(cfg)
    if name == "dcn_v2":
        # The offset convs start at zero (the plain ResNet); move every tap off its pixel, by
        # fractions of a pixel up to 1.5, and give the modulation masks values away from 0.5.
        g = torch.Generator().manual_seed(1)
        for module in cpu.modules():
            if getattr(module, "conv2_offset", None) is not None:
                w, b = module.conv2_offset.weight, module.conv2_offset.bias
                w.data.copy_(torch.randn(w.shape, generator=g) * 1e-3)
                b.data.copy_((torch.rand(b.shape, generator=g) - 0.5) * 3)
    cpu = cpu.double()
    return cfg, cpu, copy.deepcopy(cpu).to("cuda")


def _image(seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (3, HEIGHT, WIDTH), dtype=torch.uint8, generator=g)


def _targets(cfg, seed):
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(4, 2, generator=g) * torch.tensor([WIDTH - 60.0, HEIGHT - 60.0])
    wh = 16 + torch.rand(4, 2, generator=g) * 40
    boxes = torch.cat([xy, xy + wh], dim=1)
    gt = Instances((HEIGHT, WIDTH), gt_boxes=Boxes(boxes))
    num_classes = cfg.MODEL.RETINANET.NUM_CLASSES if cfg.MODEL.META_ARCHITECTURE == "RetinaNet" else cfg.MODEL.ROI_HEADS.NUM_CLASSES
    gt.gt_classes = torch.randint(0, num_classes, (4,), generator=g)
    if cfg.MODEL.MASK_ON:  # a diamond inscribed in each box
        x1, y1, x2, y2 = boxes.unbind(1)
        cx, cy = (x1 + x2) / 2, (y1 + y2) / 2
        gt.gt_masks = PolygonMasks([[torch.stack([cx, y1, x2, cy, cx, y2, x1, cy])[:, i].tolist()] for i in range(4)])
    if cfg.MODEL.KEYPOINT_ON:
        k = cfg.MODEL.ROI_KEYPOINT_HEAD.NUM_KEYPOINTS
        points = boxes[:, None, :2] + torch.rand(4, k, 2, generator=g) * wh[:, None, :]
        visible = (torch.arange(k) % 3 != 0).float().expand(4, k) * 2  # every third unlabeled
        gt.gt_keypoints = Keypoints(torch.cat([points * visible[..., None].bool(), visible[..., None]], dim=2))
    return gt


def _batch(cfg, train):
    batch = []
    for seed in (1, 2):
        item = {"image": _image(seed), "height": HEIGHT, "width": WIDTH}
        if train:
            item["instances"] = _targets(cfg, seed)
        batch.append(item)
    return batch


def _assert_instances_close(got, expected, what):
    assert len(got) == len(expected) > 0, f"{what}: {len(got)} vs {len(expected)} detections"
    torch.testing.assert_close(got.pred_classes.cpu(), expected.pred_classes, rtol=0, atol=0)
    torch.testing.assert_close(got.scores.cpu(), expected.scores, **DOUBLE_TOLERANCE)
    torch.testing.assert_close(got.pred_boxes.tensor.cpu(), expected.pred_boxes.tensor, **DOUBLE_TOLERANCE)
    if expected.has("pred_masks"):
        differ = (got.pred_masks.cpu() != expected.pred_masks).double().mean()
        assert differ <= MASK_PIXEL_TOLERANCE, f"{what}: {float(differ):.2e} of the mask pixels differ"
    if expected.has("pred_keypoints"):
        torch.testing.assert_close(got.pred_keypoints.cpu(), expected.pred_keypoints, **DOUBLE_TOLERANCE)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_inference_cuda_equals_cpu(name):
    cfg, cpu, cuda = _models(name)
    with torch.no_grad():
        expected = cpu.eval()(_batch(cfg, train=False))
        got = cuda.eval()(_batch(cfg, train=False))
    for i, (a, b) in enumerate(zip(got, expected)):
        assert a["instances"].pred_boxes.tensor.is_cuda
        _assert_instances_close(a["instances"], b["instances"], f"{name} image {i}")


def _training_step(model, batch):
    model.train()
    model.zero_grad(set_to_none=True)
    losses = model(batch)
    sum(losses.values()).backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.requires_grad}
    return {k: v.detach() for k, v in losses.items()}, grads


@pytest.mark.parametrize("name", sorted(MODELS))
def test_training_step_cuda_equals_cpu(name):
    cfg, cpu, cuda = _models(name)
    expected_losses, expected_grads = _training_step(cpu, _batch(cfg, train=True))
    losses, grads = _training_step(cuda, _batch(cfg, train=True))
    assert losses.keys() == expected_losses.keys()
    for key, value in losses.items():
        assert value.is_cuda
        torch.testing.assert_close(value.cpu(), expected_losses[key], **DOUBLE_TOLERANCE, msg=lambda m: f"{key}: {m}")
    assert grads.keys() == expected_grads.keys()
    for key, expected in expected_grads.items():
        assert (grads[key] is None) == (expected is None), key
        if expected is None:
            continue
        # Relative to the tensor's largest gradient: its small entries are sums that cancel. A
        # tensor that is zero in exact arithmetic (the keypoint logits' bias: a softmax's
        # gradient sums to 0 over positions) holds only rounding noise: the floor admits that.
        scale = float(expected.abs().max()) or 1.0
        atol = max(DOUBLE_TOLERANCE["atol"] * scale, CANCELLED_GRADIENT_FLOOR)
        torch.testing.assert_close(
            grads[key].cpu(), expected, rtol=DOUBLE_TOLERANCE["rtol"], atol=atol,
            msg=lambda m: f"grad of {key}: {m}")


@pytest.mark.parametrize("name", ["mask_rcnn", "retinanet"])
def test_amp_training_step_cuda(name):
    """A float32 model under float16 autocast (SOLVER.AMP's default dtype): finite losses near
    the float64 ones, finite gradients (unscaled: a GradScaler's first scale may overflow them,
    which it then handles by skipping the step)."""
    cfg, cpu, cuda = _models(name)
    expected_losses, _ = _training_step(cpu, _batch(cfg, train=True))
    cuda = cuda.float().train()
    with torch.autocast("cuda", dtype=torch.float16):
        losses = cuda(_batch(cfg, train=True))
    sum(losses.values()).backward()
    for key, value in losses.items():
        assert torch.isfinite(value), key
        torch.testing.assert_close(
            value.detach().cpu().double(), expected_losses[key].double(), **AMP_LOSS_TOLERANCE,
            msg=lambda m: f"{key}: {m}")
    grads = [p.grad for p in cuda.parameters() if p.requires_grad and p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
