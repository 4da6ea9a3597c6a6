"""Deformable ResNet stages (MODEL.RESNETS.DEFORM_ON_PER_STAGE): a new deformable body computes
the plain ResNet (zero offsets), takes the plain ResNet's weights by name, learns its offsets,
and refuses what it cannot build."""
import os

import pytest
import torch

from detcore.config import get_cfg
from detcore.layers import DeformConv2d
from detcore.modeling import build_model
from detcore.modeling.backbone.resnet import ResNet

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
DEFORM = (False, True, True, True)


def _pair(**deform):
    torch.manual_seed(0)
    plain = ResNet(50, out_features=("res3", "res5"))
    deformable = ResNet(50, out_features=("res3", "res5"), deform_on_per_stage=DEFORM, **deform)
    report = deformable.load_state_dict(plain.state_dict(), strict=False)
    return plain, deformable, report


def test_a_new_deformable_body_is_the_plain_resnet_and_takes_its_weights():
    plain, deformable, report = _pair()
    # Only the offset convs are new; every plain weight (conv2 included) has its place.
    assert not report.unexpected_keys and all("conv2_offset" in k for k in report.missing_keys)
    assert isinstance(deformable.res3[0].conv2, DeformConv2d) and not isinstance(deformable.res2[0].conv2, DeformConv2d)
    x = torch.rand(1, 3, 96, 128)
    with torch.no_grad():
        expected, got = plain(x), deformable(x)
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-4, atol=1e-4 * expected[name].abs().max().item())


def test_modulated_masks_start_at_one_half():
    """DCN v2: mask sigmoid(0) = 0.5 at the start (as detectron2 and maskrcnn-benchmark), so the
    first deformable block's 3x3 conv gives half the plain conv."""
    _, deformable, _ = _pair(deform_modulated=True)
    block = deformable.res3[0]
    assert block.conv2_offset.out_channels == 27
    x = torch.rand(1, block.conv2.in_channels, 12, 16)
    with torch.no_grad():
        half = block._deformable_conv2(x)
        plain = torch.nn.functional.conv2d(x, block.conv2.weight, None, block.conv2.stride, 1)
    torch.testing.assert_close(half, plain / 2, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("modulated", [False, True])
def test_offsets_learn(modulated):
    _, deformable, _ = _pair(deform_modulated=modulated, deform_num_groups=2)
    deformable.train()
    out = deformable(torch.rand(1, 3, 64, 64))
    (out["res5"].square().mean() + out["res3"].square().mean()).backward()
    offset_conv = deformable.res4[1].conv2_offset
    assert offset_conv.out_channels == 2 * (27 if modulated else 18)
    assert offset_conv.weight.grad is not None and offset_conv.weight.grad.abs().sum() > 0


def test_what_cannot_be_built_is_named():
    with pytest.raises(ValueError, match="DEFORM_ON_PER_STAGE.*bottleneck"):
        ResNet(18, deform_on_per_stage=DEFORM)
    with pytest.raises(ValueError, match="one bool per stage"):
        ResNet(50, deform_on_per_stage=(True, True))
    cfg = get_cfg()
    with pytest.raises(ValueError, match="MODEL.RESNETS.DEFORM_NUM_GROUPS"):
        cfg.merge_from_list(["MODEL.RESNETS.DEFORM_NUM_GROUPS", 0])


def test_the_dconv_config_builds_and_detects():
    cfg = get_cfg()
    cfg.merge_from_file(os.path.join(ROOT, "configs", "e2e_mask_rcnn_dconv_R_50_FPN_1x.yaml"))
    cfg.merge_from_list(["MODEL.DEVICE", "cpu", "MODEL.ROI_HEADS.SCORE_THRESH_TEST", 0.0])
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    deformable = [n for n, m in model.named_modules() if isinstance(m, DeformConv2d)]
    assert len(deformable) == 4 + 6 + 3 and all(n.split(".")[2] in ("res3", "res4", "res5") for n in deformable)
    with torch.no_grad():
        out = model([{"image": torch.randint(0, 256, (3, 96, 128), dtype=torch.uint8)}])[0]["instances"]
    assert len(out) > 0 and out.pred_masks.shape[1:] == (96, 128)
