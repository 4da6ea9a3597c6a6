import math

import pytest
import torch

from detcore.config import get_cfg
from detcore.layers import ShapeSpec
from detcore.modeling.anchor_generator import (
    ANCHOR_GENERATOR_REGISTRY,
    DefaultAnchorGenerator,
    build_anchor_generator,
)
from detcore.structures import Boxes

S = math.sqrt(2.0)


def _features(shapes, channels=2):
    return [torch.zeros(1, channels, h, w) for h, w in shapes]


def test_counts_per_level():
    gen = DefaultAnchorGenerator([[32], [64], [128]], [[0.5, 1.0, 2.0]], [4, 8, 16])
    assert gen.num_cell_anchors == [3, 3, 3]
    anchors = gen(_features([(10, 12), (5, 6), (3, 3)]))
    assert all(isinstance(a, Boxes) for a in anchors)
    assert [len(a) for a in anchors] == [10 * 12 * 3, 5 * 6 * 3, 3 * 3 * 3]


def test_first_anchors_hand_computed():
    gen = DefaultAnchorGenerator([[32]], [[0.5, 1.0, 2.0]], [4])
    anchors = gen(_features([(2, 3)]))[0].tensor
    a, b = 16 * S, 8 * S  # half sides of the 0.5 and 2.0 anchors: 32 / sqrt(2) / ... = 22.63, 11.31
    cell = torch.tensor([[-a, -b, a, b], [-16.0, -16.0, 16.0, 16.0], [-b, -a, b, a]])
    torch.testing.assert_close(anchors[0:3], cell)
    # Location-major: location (x=1, y=0) next, shifted by one stride in x; row 1 starts at index 3 * 3.
    torch.testing.assert_close(anchors[3:6], cell + torch.tensor([4.0, 0.0, 4.0, 0.0]))
    torch.testing.assert_close(anchors[9:12], cell + torch.tensor([0.0, 4.0, 0.0, 4.0]))
    torch.testing.assert_close(anchors[-3:], cell + torch.tensor([8.0, 4.0, 8.0, 4.0]))


def test_offset_centers_anchors_in_cells():
    gen = DefaultAnchorGenerator([[16]], [[1.0]], [8], offset=0.5)
    anchors = gen(_features([(2, 2)]))[0]
    centers = anchors.get_centers()
    torch.testing.assert_close(centers, torch.tensor([[4.0, 4.0], [12.0, 4.0], [4.0, 12.0], [12.0, 12.0]]))
    torch.testing.assert_close(anchors.tensor[0], torch.tensor([-4.0, -4.0, 12.0, 12.0]))


@pytest.mark.parametrize("offset", [0.0, 0.5])
def test_centers_on_grid(offset):
    gen = DefaultAnchorGenerator([[32, 64]], [[0.5, 1.0, 2.0]], [16], offset=offset)
    h, w = 4, 5
    centers = gen(_features([(h, w)]))[0].get_centers().view(h, w, 6, 2)
    ys, xs = torch.meshgrid(torch.arange(h) + offset, torch.arange(w) + offset, indexing="ij")
    expected = torch.stack([xs, ys], dim=-1).float()[:, :, None, :].expand(h, w, 6, 2) * 16
    torch.testing.assert_close(centers, expected)


def test_sizes_and_aspect_ratios():
    sizes, ratios = [16.0, 40.0], [0.25, 0.5, 1.0, 3.0]
    gen = DefaultAnchorGenerator([sizes], [ratios], [4])
    boxes = gen(_features([(1, 1)]))[0]
    assert len(boxes) == 8
    # Size-major: all ratios of size 16, then of size 40.
    expected_area = torch.tensor([s * s for s in sizes for _ in ratios])
    expected_ratio = torch.tensor([r for _ in sizes for r in ratios])
    torch.testing.assert_close(boxes.area(), expected_area)
    torch.testing.assert_close(boxes.heights() / boxes.widths(), expected_ratio)


def test_broadcast_of_per_level_params():
    gen = DefaultAnchorGenerator([[32], [64]], [0.5, 1.0], [4, 8])
    assert gen.aspect_ratios == [[0.5, 1.0], [0.5, 1.0]]
    gen = DefaultAnchorGenerator([32, 64], [[1.0], [2.0]], [4, 8])
    assert gen.sizes == [[32.0, 64.0], [32.0, 64.0]] and gen.num_cell_anchors == [2, 2]
    with pytest.raises(ValueError, match="sizes has 3 lists for 2"):
        DefaultAnchorGenerator([[32], [64], [128]], [[1.0]], [4, 8])
    with pytest.raises(ValueError, match="offset"):
        DefaultAnchorGenerator([[32]], [[1.0]], [4], offset=1.0)
    with pytest.raises(ValueError, match="2 feature maps"):
        DefaultAnchorGenerator([[32]], [[1.0]], [4])(_features([(2, 2), (1, 1)]))


def test_cell_anchors_follow_device_but_not_state_dict():
    gen = DefaultAnchorGenerator([[32], [64]], [[1.0]], [4, 8])
    assert gen.state_dict() == {}
    # Buffers, so Module.to() moves (and casts) them with the model.
    assert len(list(gen.buffers())) == 2
    gen.to(torch.float64)
    assert all(c.dtype == torch.float64 for c in gen.cell_anchors)
    assert gen(_features([(2, 2), (1, 1)]))[1].tensor.dtype == torch.float64


def test_build_from_config():
    cfg = get_cfg()
    shapes = [ShapeSpec(channels=8, stride=2**k) for k in range(2, 7)]
    gen = build_anchor_generator(cfg, shapes)
    assert isinstance(gen, DefaultAnchorGenerator)
    assert "DefaultAnchorGenerator" in ANCHOR_GENERATOR_REGISTRY
    assert gen.strides == [4, 8, 16, 32, 64]
    assert gen.num_cell_anchors == [3] * 5
    assert gen.sizes == [[32.0], [64.0], [128.0], [256.0], [512.0]]


def test_matches_torchvision_up_to_rounding():
    anchor_utils = pytest.importorskip("torchvision.models.detection.anchor_utils")
    image_list = pytest.importorskip("torchvision.models.detection.image_list")
    sizes = ((32,), (64,), (128,))
    ratios = ((0.5, 1.0, 2.0),) * 3
    strides = [4, 8, 16]
    ours = DefaultAnchorGenerator([list(s) for s in sizes], [list(r) for r in ratios], strides, offset=0.0)
    theirs = anchor_utils.AnchorGenerator(sizes, ratios)
    images = image_list.ImageList(torch.zeros(1, 3, 64, 96), [(64, 96)])
    feats = [torch.zeros(1, 4, 64 // s, 96 // s) for s in strides]
    tv = theirs(images, feats)[0]
    mine = ours(feats)
    assert tv.shape[0] == sum(len(a) for a in mine)
    # torchvision rounds its cell anchors to integers; everything else (grid, order) agrees. With
    # one size per level the orders also coincide (torchvision is ratio-major, detcore size-major).
    rebuilt = []
    for anchors, cell in zip(mine, ours.cell_anchors):
        shifts = anchors.tensor.view(-1, len(cell), 4) - cell[None]
        rebuilt.append((shifts + cell.round()[None]).reshape(-1, 4))
    torch.testing.assert_close(torch.cat(rebuilt), tv)
    assert (torch.cat([a.tensor for a in mine]) - tv).abs().max() <= 0.5


def test_torchvision_retinanet_anchors_exactly():
    """torchvision's RetinaNet anchors (3 truncated octave sizes x 3 ratios per level, ratio-major,
    rounded corners, strides from the image size) come out of the generator's three options."""
    anchor_utils = pytest.importorskip("torchvision.models.detection.anchor_utils")
    image_list = pytest.importorskip("torchvision.models.detection.image_list")
    sizes = [[x, int(x * 2 ** (1 / 3)), int(x * 2 ** (2 / 3))] for x in (32, 64, 128, 256, 512)]
    ratios = [[0.5, 1.0, 2.0]]
    theirs = anchor_utils.AnchorGenerator(tuple(map(tuple, sizes)), ((0.5, 1.0, 2.0),) * 5)
    ours = DefaultAnchorGenerator(
        sizes, ratios, [8, 16, 32, 64, 128], round_cell_anchors=True, strides_from_image_size=True,
        cell_anchor_order="ratio_major",
    )
    h, w = 224, 320  # p7 is 2 x 3: strides 112 and 106, not 128
    images = image_list.ImageList(torch.zeros(1, 3, h, w), [(h, w)])
    feats = [torch.zeros(1, 4, -(-h // s), -(-w // s)) for s in (8, 16, 32, 64, 128)]
    expected = theirs(images, feats)[0]
    got = torch.cat([b.tensor for b in ours(feats, image_size=(h, w))])
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    # The default (size-major) order is a permutation of the same anchors, different per location.
    size_major = DefaultAnchorGenerator(sizes, ratios, [8, 16, 32, 64, 128], round_cell_anchors=True)
    first = size_major.cell_anchors[0]
    assert not torch.equal(first, ours.cell_anchors[0])
    assert torch.equal(first.view(3, 3, 4).transpose(0, 1).reshape(9, 4), ours.cell_anchors[0])


def test_cell_anchor_order_is_checked():
    with pytest.raises(ValueError, match="cell_anchor_order must be one of"):
        DefaultAnchorGenerator([[32]], [[1.0]], [8], cell_anchor_order="sizes_first")
