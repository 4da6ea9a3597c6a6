"""Keypoints and the heatmap coding: hand-computed cells, torchvision's functions on random inputs
(the reference the published weights were trained with), a round trip, and the mirror swap."""
import pytest
import torch

from detcore.structures import (
    Boxes,
    Instances,
    Keypoints,
    flip_indices,
    heatmaps_to_keypoints,
    keypoints_to_heatmap,
    swap_flip_pairs,
)

tv_roi_heads = pytest.importorskip("torchvision.models.detection.roi_heads")

NAMES = ["head", "left_hand", "right_hand", "left_foot", "right_foot"]
FLIP_MAP = [("left_hand", "right_hand"), ("left_foot", "right_foot")]


def _random_case(n=12, k=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    xy1 = torch.rand(n, 2, generator=g) * 100
    wh = torch.rand(n, 2, generator=g) * 80 + 1
    rois = torch.cat([xy1, xy1 + wh], dim=1)
    # Points around their box, some outside it, some on its edges, some unlabeled.
    pts = xy1[:, None] + (torch.rand(n, k, 2, generator=g) * 1.4 - 0.2) * wh[:, None]
    pts[0, 0] = rois[0, 2:]  # bottom-right corner: belongs to the last cell
    pts[1, 1] = rois[1, :2]  # top-left corner
    vis = torch.randint(0, 3, (n, k), generator=g).float()
    return torch.cat([pts, vis[..., None]], dim=2), rois


# --- the container ------------------------------------------------------------------------------------
def test_keypoints_follow_instances_indexing_and_concatenation():
    kp = Keypoints(torch.arange(2 * 5 * 3, dtype=torch.float32).reshape(2, 5, 3))
    inst = Instances((10, 10), gt_keypoints=kp, gt_boxes=Boxes(torch.zeros(2, 4)))
    assert inst[1].gt_keypoints.tensor.shape == (1, 5, 3)
    assert torch.equal(inst[torch.tensor([True, False])].gt_keypoints.tensor, kp.tensor[:1])
    assert torch.equal(Instances.cat([inst, inst]).gt_keypoints.tensor, torch.cat([kp.tensor, kp.tensor]))
    assert Keypoints([[[1, 2, 2]]]).tensor.dtype == torch.float32


@pytest.mark.parametrize("shape", [(3, 5), (2, 5, 2), (5, 3, 1, 3)])
def test_keypoints_refuse_other_shapes(shape):
    with pytest.raises(ValueError, match=r"\[N, K, 3\]"):
        Keypoints(torch.zeros(shape))


def test_cat_refuses_different_keypoint_counts():
    with pytest.raises(ValueError, match="different keypoint counts"):
        Keypoints.cat([Keypoints(torch.zeros(1, 5, 3)), Keypoints(torch.zeros(1, 4, 3))])


# --- encoding -------------------------------------------------------------------------------------
def test_heatmap_cells_by_hand():
    # Box 56 px wide and 28 px high, S = 56: cells are 1 px wide and 0.5 px high.
    rois = torch.tensor([[10.0, 20.0, 66.0, 48.0]])
    kp = torch.tensor(
        [
            [
                [12.7, 30.2, 2],  # col floor(2.7) = 2, row floor(10.2 / 0.5) = 20
                [10.0, 20.0, 1],  # top-left corner: cell 0, occluded points count
                [66.0, 48.0, 2],  # bottom-right corner: the last cell
                [9.99, 30.0, 2],  # left of the box
                [30.0, 30.0, 0],  # unlabeled
            ]
        ]
    )
    targets, valid = keypoints_to_heatmap(kp, rois, 56)
    assert valid.tolist() == [[True, True, True, False, False]]
    assert targets[0, :3].tolist() == [20 * 56 + 2, 0, 56 * 56 - 1]
    assert targets[0, 3:].tolist() == [0, 0]  # invalid points get 0


def test_heatmap_encoding_equals_torchvision():
    kp, rois = _random_case(n=40, k=17)
    targets, valid = keypoints_to_heatmap(kp, rois, 56)
    tv_targets, tv_valid = tv_roi_heads.keypoints_to_heatmap(kp, rois, 56)
    assert valid.sum() > 100 and (~valid).sum() > 100  # both kinds exercised
    assert torch.equal(valid, tv_valid.bool()) and torch.equal(targets, tv_targets)
    # The structure's method is the same function.
    assert torch.equal(Keypoints(kp).to_heatmap(Boxes(rois), 56)[0], targets)


def test_heatmap_encoding_checks_its_arguments():
    with pytest.raises(ValueError, match=r"rois must have shape \[2, 4\]"):
        keypoints_to_heatmap(torch.zeros(2, 5, 3), torch.zeros(3, 4), 56)
    with pytest.raises(ValueError, match="heatmap_size must be a positive int"):
        keypoints_to_heatmap(torch.zeros(2, 5, 3), torch.zeros(2, 4), 0)


# --- decoding -------------------------------------------------------------------------------------
def test_heatmap_decoding_equals_torchvision():
    g = torch.Generator().manual_seed(1)
    maps = torch.randn(9, 17, 56, 56, generator=g)
    _, rois = _random_case(n=9, k=17, seed=1)
    rois[0, 2:] = rois[0, :2] + 0.3  # a box under a pixel: its maps are resized to 1 x 1
    got = heatmaps_to_keypoints(maps, rois)
    xy, scores = tv_roi_heads.heatmaps_to_keypoints(maps, rois)
    assert torch.equal(got[..., :2], xy[..., :2])
    assert torch.equal(got[..., 2], scores)


def test_decoding_no_rois():
    assert heatmaps_to_keypoints(torch.zeros(0, 17, 56, 56), torch.zeros(0, 4)).shape == (0, 17, 3)


def test_encode_decode_round_trip():
    """A heatmap peaked on the encoded cell decodes to within half a cell (plus the half pixel of
    the decoding grid) of the original point."""
    kp, rois = _random_case(n=30, k=17, seed=2)
    rois[:, 2:] = rois[:, :2] + (rois[:, 2:] - rois[:, :2]).clamp(min=20)  # boxes of 20 px and more
    size = 56
    targets, valid = keypoints_to_heatmap(kp, rois, size)
    rows, cols = targets // size, targets % size
    grid = torch.arange(size, dtype=torch.float32)
    # A smooth peak (a Gaussian of the cell distance) at the target cell of each point.
    maps = -((grid[None, None, :, None] - rows[..., None, None]) ** 2 + (grid[None, None, None, :] - cols[..., None, None]) ** 2)
    decoded = heatmaps_to_keypoints(maps / 4.0, rois)
    widths, heights = rois[:, 2] - rois[:, 0], rois[:, 3] - rois[:, 1]
    bound_x = (0.5 * widths / size + 0.5)[:, None] + 1e-4
    bound_y = (0.5 * heights / size + 0.5)[:, None] + 1e-4
    err_x, err_y = (decoded[..., 0] - kp[..., 0]).abs(), (decoded[..., 1] - kp[..., 1]).abs()
    assert valid.sum() > 150
    assert bool((err_x[valid] <= bound_x.expand_as(err_x)[valid]).all())
    assert bool((err_y[valid] <= bound_y.expand_as(err_y)[valid]).all())


# --- flips ----------------------------------------------------------------------------------------
def test_flip_indices_name_each_points_mirror_partner():
    assert flip_indices(NAMES, FLIP_MAP) == [0, 2, 1, 4, 3]
    assert flip_indices(NAMES, []) == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match="'left_knee', which is not a keypoint name"):
        flip_indices(NAMES, [("left_knee", "right_knee")])
    with pytest.raises(ValueError, match="more than one flip_map pair"):
        flip_indices(NAMES, [("left_hand", "right_hand"), ("left_hand", "left_foot")])


def test_hflip_twice_is_identity_and_swaps_left_and_right():
    kp = Keypoints(torch.tensor([[[50.0, 10, 2], [70, 40, 2], [30, 40, 1], [60, 90, 2], [0, 0, 0]]]))
    indices = flip_indices(NAMES, FLIP_MAP)
    flipped = kp.hflip(100, indices)
    # The left hand (image right, x = 70) is now drawn at x = 30, on the image's left: as a
    # figure seen in a mirror, it is the mirrored figure's right hand.
    assert flipped.tensor[0, NAMES.index("right_hand")].tolist() == [30.0, 40.0, 2.0]
    assert flipped.tensor[0, NAMES.index("left_hand")].tolist() == [70.0, 40.0, 1.0]
    assert flipped.tensor[0, NAMES.index("head")].tolist() == [50.0, 10.0, 2.0]
    # The unlabeled right foot becomes the unlabeled left foot, and stays (0, 0, 0).
    assert flipped.tensor[0, NAMES.index("left_foot")].tolist() == [0.0, 0.0, 0.0]
    assert flipped.tensor[0, NAMES.index("right_foot")].tolist() == [40.0, 90.0, 2.0]
    assert torch.equal(flipped.hflip(100, indices).tensor, kp.tensor)


def test_swap_flip_pairs_needs_a_permutation():
    with pytest.raises(ValueError, match="permutation of 0..4"):
        swap_flip_pairs(torch.zeros(1, 5, 3), [0, 1, 1, 3, 4])
