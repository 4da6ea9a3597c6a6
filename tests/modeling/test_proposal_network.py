"""ProposalNetwork (RPN-only): the RPN's losses in training; at inference the RPN's proposals in
the original image's pixels, as computed here by hand from the backbone and the RPN; the first
stage of a GeneralizedRCNN viewed as one gives that detector's own proposals."""
import numpy as np
import pytest
import torch

from detcore.modeling import GeneralizedRCNN, ProposalNetwork, build_model
from detcore.structures import Boxes, Instances

from .small_config import small_cfg

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return build_model(small_cfg("rpn_R_18_FPN_shapes.yaml")).eval()


def _image(h, w, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (3, h, w), dtype=torch.uint8, generator=g)


def _gt(h, w):
    return Instances((h, w), gt_boxes=Boxes(torch.tensor([[6.0, 8.0, 30.0, 36.0], [34.0, 12.0, 60.0, 40.0]])),
                     gt_classes=torch.tensor([0, 2]))


def test_it_is_backbone_and_rpn_only(model):
    assert isinstance(model, ProposalNetwork) and not hasattr(model, "roi_heads")
    assert {k.split(".")[0] for k in model.state_dict()} == {"backbone", "proposal_generator"}


def test_training_returns_the_rpn_losses_and_trains_every_parameter():
    torch.manual_seed(0)
    net = build_model(small_cfg("rpn_R_18_FPN_shapes.yaml")).train()
    inputs = [{"image": _image(64, 80, 1), "instances": _gt(64, 80)}, {"image": _image(72, 64, 2), "instances": _gt(72, 64)}]
    losses = net(inputs)
    assert set(losses) == {"loss_rpn_cls", "loss_rpn_loc"}
    assert all(v.dim() == 0 and torch.isfinite(v) for v in losses.values())
    sum(losses.values()).backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in net.parameters() if p.requires_grad)
    with pytest.raises(ValueError, match="ProposalNetwork in training mode needs 'instances'"):
        net([{"image": _image(64, 64)}])


def test_inference_gives_the_rpns_proposals_in_the_original_pixels(model):
    image = _image(60, 80, seed=3)
    out = model([{"image": image, "height": 90, "width": 100}])
    assert len(out) == 1 and set(out[0]) == {"proposals"}
    proposals = out[0]["proposals"]
    assert proposals.image_size == (90, 100)
    assert set(proposals.fields()) == {"proposal_boxes", "objectness_logits"}

    # By hand: the RPN on the backbone's features, boxes scaled by (100/80, 90/60) and clipped.
    with torch.no_grad():
        images = model.preprocess_image([{"image": image}])
        raw, _ = model.proposal_generator(images, model.backbone(images.tensor), None)
    boxes = raw[0].proposal_boxes.tensor.numpy().astype(np.float64) * [100 / 80, 90 / 60, 100 / 80, 90 / 60]
    boxes[:, 0::2] = boxes[:, 0::2].clip(0, 100)
    boxes[:, 1::2] = boxes[:, 1::2].clip(0, 90)
    keep = (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])
    np.testing.assert_allclose(proposals.proposal_boxes.tensor.numpy(), boxes[keep], rtol=1e-6, atol=1e-4)
    np.testing.assert_array_equal(proposals.objectness_logits.numpy(), raw[0].objectness_logits.numpy()[keep])
    logits = proposals.objectness_logits
    assert 0 < len(logits) <= 50 and torch.all(logits[:-1] >= logits[1:])  # POST_NMS_TOPK_TEST, sorted


def test_a_batch_gives_each_image_its_own_proposals(model):
    inputs = [{"image": _image(64, 64, 4)}, {"image": _image(40, 90, 5), "height": 80, "width": 180}]
    batch = model(inputs)
    for x, got in zip(inputs, batch):
        alone = model([x])[0]["proposals"]
        assert got["proposals"].image_size == alone.image_size
        torch.testing.assert_close(got["proposals"].proposal_boxes.tensor, alone.proposal_boxes.tensor, rtol=1e-5, atol=1e-3)


def test_from_detector_shares_the_first_stage_and_gives_its_proposals():
    torch.manual_seed(0)
    detector = build_model(small_cfg()).eval()
    assert isinstance(detector, GeneralizedRCNN)
    rpn = ProposalNetwork.from_detector(detector)
    assert rpn.backbone is detector.backbone and rpn.proposal_generator is detector.proposal_generator
    assert not rpn.training and rpn.size_divisibility == detector.size_divisibility
    seen = []
    hook = detector.proposal_generator.register_forward_hook(lambda m, args, out: seen.append(out[0]) and None)
    image = _image(70, 90, 6)
    detector([{"image": image}])
    hook.remove()
    got = rpn([{"image": image}])[0]["proposals"]
    expected = seen[0][0]
    torch.testing.assert_close(got.proposal_boxes.tensor, expected.proposal_boxes.tensor[expected.proposal_boxes.nonempty()])
    with pytest.raises(TypeError, match="from_detector: needs a detector"):
        ProposalNetwork.from_detector(rpn.backbone)


def test_a_proposal_network_checkpoint_is_the_first_stage_of_an_rcnn(model):
    detector = build_model(small_cfg())
    missing, unexpected = detector.load_state_dict(model.state_dict(), strict=False)
    assert not unexpected and missing and all(k.startswith("roi_heads.") for k in missing)
