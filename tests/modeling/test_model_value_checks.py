"""The model's own detcore op calls take the path without value checks (detcore.layers.
trusted_inputs), so that on a GPU they cost no host sync, while a user's direct call is checked.

On the CPU: a training iteration and an inference of the small Mask R-CNN (both mask target
modes), Keypoint R-CNN and RetinaNet, with every detcore op call recorded from below autograd
with the state of the value checks; every call of an op that checks values must be unchecked,
its backward included, and batched_nms must get integer ids (floating ones cost syncs however
called).

On a GPU (marked cuda; scripts/gpu_check.sh runs it): the host syncs of one R-50-FPN Mask R-CNN
training iteration, counted under torch.cuda.set_sync_debug_mode("warn") and attributed to the
ops that made them. The detcore ops on the unchecked path make none, but for the one sync of
nms / batched_nms, which read the size of their result (three more for batched_nms's banded path
over 5000 boxes, as the RPN's in training: op_watch.allowed_syncs); the others' forward and
backward run under "error", so a sync inside one fails the test there. The count is printed and,
where $DETCORE_HOST_SYNCS_JSON names a file (the GPU check sets it), written there for the report.
"""
import json
import os

import pytest
import torch

from detcore.config import get_cfg
from detcore.layers import _extension
from detcore.modeling import build_model
from detcore.structures import Boxes, Instances, Keypoints, PolygonMasks

try:
    from ..layers.op_watch import VALUE_CHECKED_OPS, DetcoreOpRecorder, allowed_syncs, count_syncs
    from .small_config import CONFIGS, small_cfg
except ImportError:  # tests/ run as rootdir-relative modules, without packages
    from layers.op_watch import VALUE_CHECKED_OPS, DetcoreOpRecorder, allowed_syncs, count_syncs
    from small_config import CONFIGS, small_cfg

HEIGHT, WIDTH = 96, 128


def _image(seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (3, HEIGHT, WIDTH), dtype=torch.uint8, generator=g)


def _targets(cfg, seed, count=3):
    """`count` ground-truth boxes, with masks (diamonds) and keypoints where the config has them."""
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(count, 2, generator=g) * torch.tensor([WIDTH - 50.0, HEIGHT - 50.0])
    wh = 16 + torch.rand(count, 2, generator=g) * 30
    boxes = torch.cat([xy, xy + wh], dim=1)
    gt = Instances((HEIGHT, WIDTH), gt_boxes=Boxes(boxes))
    retinanet = cfg.MODEL.META_ARCHITECTURE == "RetinaNet"
    num_classes = cfg.MODEL.RETINANET.NUM_CLASSES if retinanet else cfg.MODEL.ROI_HEADS.NUM_CLASSES
    gt.gt_classes = torch.randint(0, num_classes, (count,), generator=g)
    if cfg.MODEL.MASK_ON:
        x1, y1, x2, y2 = boxes.unbind(1)
        cx, cy = (x1 + x2) / 2, (y1 + y2) / 2
        diamonds = torch.stack([cx, y1, x2, cy, cx, y2, x1, cy], dim=1)
        gt.gt_masks = PolygonMasks([[d.tolist()] for d in diamonds])
    if cfg.MODEL.KEYPOINT_ON:
        k = cfg.MODEL.ROI_KEYPOINT_HEAD.NUM_KEYPOINTS
        points = boxes[:, None, :2] + torch.rand(count, k, 2, generator=g) * wh[:, None, :]
        gt.gt_keypoints = Keypoints(torch.cat([points, torch.full((count, k, 1), 2.0)], dim=2))
    return gt


def _batch(cfg, train):
    batch = []
    for seed in (1, 2):
        item = {"image": _image(seed), "height": HEIGHT, "width": WIDTH}
        if train:
            item["instances"] = _targets(cfg, seed)
        batch.append(item)
    return batch


# name -> (config under configs/, overrides, the value-checked ops a training iteration and an
# inference must call between them)
MODELS = {
    "mask_rcnn": ("e2e_mask_rcnn_R_18_FPN_shapes.yaml", {}, {"roi_align", "_roi_align_backward", "batched_nms"}),
    "mask_rcnn_torchvision_targets": (
        "e2e_mask_rcnn_R_18_FPN_shapes.yaml", {"MODEL.ROI_MASK_HEAD.TARGET_MODE": "torchvision"},
        {"roi_align", "_roi_align_backward", "batched_nms"},
    ),
    "keypoint_rcnn": (
        "keypoint_rcnn_R_18_FPN_figures.yaml", {"MODEL.ROI_KEYPOINT_HEAD.CONV_DIMS": [16, 16]},
        {"roi_align", "_roi_align_backward", "batched_nms"},
    ),
    "retinanet": (
        "retinanet_R_18_FPN_shapes.yaml", {"MODEL.RETINANET.SCORE_THRESH_TEST": 0.0},
        {"sigmoid_focal_loss", "_sigmoid_focal_loss_backward", "batched_nms"},
    ),
}


@pytest.mark.usefixtures("single_thread")
@pytest.mark.parametrize("name", sorted(MODELS))
def test_the_models_detcore_calls_skip_value_checks(name):
    config, overrides, expected_ops = MODELS[name]
    cfg = small_cfg(config, **overrides)
    torch.manual_seed(0)
    model = build_model(cfg)
    with DetcoreOpRecorder() as recorder:
        losses = model.train()(_batch(cfg, train=True))
        sum(losses.values()).backward()
        with torch.no_grad():
            model.eval()(_batch(cfg, train=False))
    checked = [c for c in recorder.calls if c.op in VALUE_CHECKED_OPS]
    assert {c.op for c in checked} >= expected_ops, f"{name} called {sorted({c.op for c in checked})}"
    assert all(not c.checked for c in checked), [c for c in checked if c.checked]
    ids = {c.ids_dtype for c in checked if c.op == "batched_nms"}
    assert ids and all(not dtype.is_floating_point for dtype in ids), ids
    # Outside the model, the same process checks again.
    with DetcoreOpRecorder() as recorder:
        torch.ops.detcore.nms(torch.zeros(0, 4), torch.zeros(0), 0.5)
    assert [(c.op, c.checked) for c in recorder.calls] == [("nms", True)]


# --- on a GPU: the syncs of one Mask R-CNN training iteration --------------------------------------
def _sync_report(counter, forward, total, losses):
    calls = {}
    for c in counter.calls:
        entry = calls.setdefault(c.op, {"calls": 0, "syncs": 0, "checked": 0})
        entry["calls"] += 1
        entry["syncs"] += c.syncs
        entry["checked"] += c.checked
    return {
        "model": "R-50-FPN Mask R-CNN (configs/e2e_mask_rcnn_R_50_FPN_1x.yaml), training iteration, "
                 f"2 images {HEIGHT}x{WIDTH} from the host, {torch.cuda.get_device_name()}",
        "total": total,
        "forward": forward,
        "backward": total - forward,  # replayed by autograd after the pass: not attributed to ops
        "forward_by_op": dict(counter.by_op.most_common()),
        "forward_outside_ops": forward - sum(counter.by_op.values()),
        "detcore_ops": calls,
        "losses": sorted(losses),
    }


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.skipif(
    not (_extension.is_available() and _extension.cuda_kernels_built()),
    reason="detcore._C was built without CUDA kernels",
)
def test_host_syncs_of_a_mask_rcnn_training_iteration():
    cfg = get_cfg()
    cfg.merge_from_file(str(CONFIGS / "e2e_mask_rcnn_R_50_FPN_1x.yaml"))
    cfg.merge_from_list(["MODEL.DEVICE", "cuda"])
    torch.manual_seed(0)
    model = build_model(cfg).train()
    warm_up, batch = _batch(cfg, train=True), _batch(cfg, train=True)  # on the host, as a loader gives them
    # A first iteration does the lazy initializations (cuBLAS, cuDNN, the allocator's pools).
    sum(model(warm_up).values()).backward()
    model.zero_grad(set_to_none=True)
    torch.cuda.synchronize()

    with count_syncs() as counter:
        losses = model(batch)
        forward = counter.syncs()
        sum(losses.values()).backward()
        total = counter.syncs()
    report = _sync_report(counter, forward, total, losses)
    print("host syncs of one training iteration:", json.dumps(report, indent=1))
    if os.environ.get("DETCORE_HOST_SYNCS_JSON"):
        with open(os.environ["DETCORE_HOST_SYNCS_JSON"], "w") as f:
            json.dump(report, f, indent=1)

    assert not counter.failures, counter.failures  # (a failure raised already; this names it)
    checked = [c for c in counter.calls if c.op in VALUE_CHECKED_OPS]
    assert {c.op for c in checked} >= {"roi_align", "_roi_align_backward", "batched_nms"}
    assert all(not c.checked for c in checked), [c for c in checked if c.checked]
    for c in counter.calls:  # forward calls: attributed exactly; backward ones ran under "error"
        assert c.syncs <= allowed_syncs(c), c
    assert total > 0  # the counter sees syncs: the model has others (listed in the report)
