"""Every yaml under configs/ (found recursively, so new ones are covered) builds a model on the CPU
that trains for one step and runs inference: detections for the R-CNNs (FPN and C4) and
RetinaNet, proposals for the RPN-only ProposalNetworks.

Only sizes that do not change the architecture are shrunk (proposal counts, sampled ROIs,
detections, a C4 head's pooled grid); the networks are exactly the configs'. The 101-layer bodies
are marked slow.
"""
from pathlib import Path

import pytest
import torch

from detcore.config import get_cfg
from detcore.modeling import ProposalNetwork, build_model
from detcore.structures import Boxes, Instances, Keypoints, PolygonMasks

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
CONFIG_FILES = sorted(CONFIGS.rglob("*.yaml"))


pytestmark = pytest.mark.usefixtures("single_thread")

SMALL = [
    "MODEL.DEVICE", "cpu",
    "INPUT.MIN_SIZE_TEST", 64,
    "INPUT.MAX_SIZE_TEST", 128,
    "MODEL.RPN.PRE_NMS_TOPK_TRAIN", 200,
    "MODEL.RPN.POST_NMS_TOPK_TRAIN", 50,
    "MODEL.RPN.PRE_NMS_TOPK_TEST", 200,
    "MODEL.RPN.POST_NMS_TOPK_TEST", 20,
    "MODEL.RPN.BATCH_SIZE_PER_IMAGE", 64,
    # A C4 head runs res5 per ROI: few ROIs keep its step short.
    "MODEL.ROI_HEADS.BATCH_SIZE_PER_IMAGE", 16,
    # Random weights give low scores: keep every detection so the mask branch has work to do.
    "MODEL.ROI_HEADS.SCORE_THRESH_TEST", 0.0,
    "MODEL.RETINANET.SCORE_THRESH_TEST", 0.0,
    "MODEL.RETINANET.TOPK_CANDIDATES_TEST", 100,
    "TEST.DETECTIONS_PER_IMAGE", 10,
]


def _load(path: Path):
    cfg = get_cfg()
    cfg.merge_from_file(str(path))
    cfg.merge_from_list(SMALL)
    if cfg.MODEL.ROI_HEADS.NAME == "Res5ROIHeads":
        # res5 runs per ROI on the pooled grid; 8x8 instead of 14x14 is ~3x cheaper and leaves
        # every parameter as the config has it (the predictor sees res5's average).
        cfg.merge_from_list(["MODEL.ROI_BOX_HEAD.POOLER_RESOLUTION", 8, "MODEL.ROI_MASK_HEAD.POOLER_RESOLUTION", 8])
    return cfg


def _params():
    params = []
    for path in CONFIG_FILES:
        depth = _load(path).MODEL.RESNETS.DEPTH
        marks = [pytest.mark.slow] if depth >= 101 else []  # ~2-4x an R-50 step on a small CPU
        params.append(pytest.param(path, id=str(path.relative_to(CONFIGS)), marks=marks))
    return params


def _image(h, w, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (3, h, w), dtype=torch.uint8, generator=g)


def _targets(h, w, with_masks, num_keypoints=0):
    # Two objects: a square-ish box and a triangle, with their polygons.
    polygons = [
        [[8.0, 10.0, 36.0, 10.0, 36.0, 40.0, 8.0, 40.0]],
        [[40.0, 50.0, 60.0, 20.0, 62.0, 58.0]],
    ]
    gt = Instances(
        (h, w),
        gt_boxes=Boxes(torch.tensor([[8.0, 10.0, 36.0, 40.0], [40.0, 20.0, 62.0, 58.0]])),
        gt_classes=torch.tensor([0, 1]),
    )
    if with_masks:
        gt.gt_masks = PolygonMasks(polygons)
    if num_keypoints:
        # Points spread over each box (every third one unlabeled).
        g = torch.Generator().manual_seed(h)
        boxes = gt.gt_boxes.tensor
        xy = boxes[:, None, :2] + torch.rand(2, num_keypoints, 2, generator=g) * (boxes[:, None, 2:] - boxes[:, None, :2])
        v = (torch.arange(num_keypoints) % 3 != 0).float().expand(2, -1) * 2
        gt.gt_keypoints = Keypoints(torch.cat([xy * v[..., None].bool(), v[..., None]], dim=2))
    return gt


def test_configs_are_found():
    names = {p.name for p in CONFIG_FILES}
    assert {"e2e_mask_rcnn_R_50_FPN_1x.yaml", "e2e_faster_rcnn_R_50_FPN_1x.yaml", "retinanet_R_50_FPN_1x.yaml"} <= names
    assert {"mask_rcnn_R_50_C4_1x.yaml", "rpn_R_50_FPN_1x.yaml", "rpn_R_50_C4_1x.yaml"} <= names


@pytest.mark.parametrize("path", _params())
def test_config_builds_trains_one_step_and_infers(path):
    torch.manual_seed(0)
    cfg = _load(path)
    model = build_model(cfg)
    proposals_only = isinstance(model, ProposalNetwork)
    mask_on = cfg.MODEL.MASK_ON and not proposals_only
    assert model.mask_on == mask_on
    num_keypoints = cfg.MODEL.ROI_KEYPOINT_HEAD.NUM_KEYPOINTS if cfg.MODEL.KEYPOINT_ON and not proposals_only else 0
    assert bool(getattr(getattr(model, "roi_heads", None), "keypoint_on", False)) == bool(num_keypoints)

    model.train()
    inputs = [
        {"image": _image(80, 96, seed=1), "height": 80, "width": 96, "instances": _targets(80, 96, mask_on, num_keypoints)},
        {"image": _image(64, 72, seed=2), "height": 64, "width": 72, "instances": _targets(64, 72, mask_on, num_keypoints)},
    ]
    losses = model(inputs)
    if cfg.MODEL.META_ARCHITECTURE == "RetinaNet":
        expected = {"loss_cls", "loss_box_reg"}
    else:
        expected = {"loss_rpn_cls", "loss_rpn_loc"} | (set() if proposals_only else {"loss_cls", "loss_box_reg"})
        expected |= {"loss_mask"} if mask_on else set()
        expected |= {"loss_keypoint"} if num_keypoints else set()
    assert set(losses) == expected
    assert all(v.dim() == 0 and torch.isfinite(v) for v in losses.values()), losses
    sum(losses.values()).backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert grads and all(g is not None and torch.isfinite(g).all() for g in grads)
    # Frozen stages (FREEZE_AT) really are frozen.
    if cfg.MODEL.BACKBONE.FREEZE_AT >= 1:
        stem = [p for n, p in model.backbone.named_parameters() if "stem" in n]
        assert stem and not any(p.requires_grad for p in stem)

    model.eval()
    # A 60x80 input standing for a 90x120 original: outputs come back in the original size.
    out = model([{"image": _image(60, 80, seed=3), "height": 90, "width": 120}])
    if proposals_only:
        inst = out[0]["proposals"]
        assert set(inst.fields()) == {"proposal_boxes", "objectness_logits"}
        assert 0 < len(inst) <= cfg.MODEL.RPN.POST_NMS_TOPK_TEST
        boxes = inst.proposal_boxes.tensor
    else:
        inst = out[0]["instances"]
        fields = {"pred_boxes", "scores", "pred_classes"} | ({"pred_masks"} if mask_on else set())
        fields |= {"pred_keypoints"} if num_keypoints else set()
        assert set(inst.fields()) == fields
        assert len(inst) <= 10
        boxes = inst.pred_boxes.tensor
    assert inst.image_size == (90, 120)
    assert boxes.shape == (len(inst), 4) and torch.isfinite(boxes).all()
    assert (boxes[:, 0::2] <= 120).all() and (boxes[:, 1::2] <= 90).all() and (boxes >= 0).all()
    if mask_on:
        assert inst.pred_masks.shape == (len(inst), 90, 120) and inst.pred_masks.dtype == torch.bool
    if num_keypoints:
        assert inst.pred_keypoints.shape == (len(inst), num_keypoints, 3) and torch.isfinite(inst.pred_keypoints).all()
