"""Tests of paste_masks_in_image.

Timing, for the record (not asserted): 100 masks of 28x28 with random boxes of 10-400 px sides
on an 800x1333 image, CPU, torch 2.15, single thread, median of 5 on the shared 2-core dev
machine: mode="aligned" 0.11 s and mode="torchvision" 0.11 s (0.07 s of either is zero-filling
the 107 MB bool output); torchvision's own per-mask loop on the same input 0.7 s. With all 100
boxes covering the whole image: 0.8 s. (With 2 threads on the busy machine the numbers were
noisy and several times worse for every implementation.)
"""
import math

import pytest
import torch

import detcore.structures.mask_paste as mask_paste
from detcore.structures.boxes import Boxes
from detcore.structures.mask_paste import paste_masks_in_image
from detcore.structures.masks import BitMasks


def paste_reference(mask, box, height, width):
    """One mask, one pixel at a time: probability at every pixel center, plain Python floats."""
    m = mask.shape[-1]
    x1, y1, x2, y2 = (float(v) for v in box)
    values = mask.double().tolist()
    out = torch.zeros(height, width, dtype=torch.float64)
    for r in range(height):
        cy = r + 0.5
        if not (y1 <= cy < y2):
            continue
        v = min(max((cy - y1) * m / (y2 - y1) - 0.5, 0.0), m - 1.0)
        for c in range(width):
            cx = c + 0.5
            if not (x1 <= cx < x2):
                continue
            u = min(max((cx - x1) * m / (x2 - x1) - 0.5, 0.0), m - 1.0)
            i0, j0 = int(math.floor(v)), int(math.floor(u))
            i1, j1 = min(i0 + 1, m - 1), min(j0 + 1, m - 1)
            a, b = v - i0, u - j0
            out[r, c] = (
                (1 - a) * ((1 - b) * values[i0][j0] + b * values[i0][j1])
                + a * ((1 - b) * values[i1][j0] + b * values[i1][j1])
            )
    return out


def random_case(n, m, height, width, seed, max_side=None, margin=10.0):
    g = torch.Generator().manual_seed(seed)
    masks = torch.rand(n, m, m, generator=g)
    max_side = max_side or max(height, width)
    xy = torch.rand(n, 2, generator=g) * torch.tensor([width + margin, height + margin]) - margin
    wh = torch.rand(n, 2, generator=g) * max_side + 0.5
    return masks, torch.cat([xy, xy + wh], dim=1)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_aligned_matches_per_pixel_reference(seed):
    masks, boxes = random_case(4, 7, 23, 31, seed, max_side=20)
    out = paste_masks_in_image(masks, boxes, (23, 31), threshold=0.5)
    assert out.shape == (4, 23, 31) and out.dtype == torch.bool
    for i in range(4):
        ref = paste_reference(masks[i], boxes[i], 23, 31)
        clear = (ref - 0.5).abs() > 1e-5  # only float-rounding ties may differ
        assert torch.equal(out[i][clear], ref[clear] >= 0.5)
        assert (~clear).sum() <= 2


def test_threshold_is_applied():
    masks, boxes = random_case(2, 5, 12, 15, seed=3, max_side=12)
    for thr in (0.2, 0.8):
        out = paste_masks_in_image(masks, boxes, (12, 15), threshold=thr)
        for i in range(2):
            ref = paste_reference(masks[i], boxes[i], 12, 15)
            clear = (ref - thr).abs() > 1e-5
            assert torch.equal(out[i][clear], ref[clear] >= thr)


def test_full_mask_fills_exactly_the_box_pixels():
    masks = torch.ones(3, 28, 28)
    boxes = torch.tensor([[3.0, 4.0, 10.0, 6.0], [2.2, 2.7, 5.6, 5.4], [-5.0, -5.0, 100.0, 100.0]])
    out = paste_masks_in_image(masks, Boxes(boxes), (12, 16))
    expected = torch.zeros(3, 12, 16, dtype=torch.bool)
    expected[0, 4:6, 3:10] = True
    expected[1, 3:5, 2:6] = True  # pixel centers 2.5..5.5 in x, 3.5..4.5 in y lie in the box
    expected[2] = True
    assert torch.equal(out, expected)


def test_inverts_crop_and_resize():
    # A blob cut out with crop_and_resize and pasted back should give (nearly) the blob.
    yy, xx = torch.meshgrid(torch.arange(60.0), torch.arange(80.0), indexing="ij")
    blob = ((xx - 40) / 25) ** 2 + ((yy - 30) / 15) ** 2 < 1
    bits = BitMasks(blob[None])
    box = bits.get_bounding_boxes().tensor
    target = bits.crop_and_resize(box, 28).float()
    back = paste_masks_in_image(target, box, (60, 80))[0]
    iou = (back & blob).sum() / (back | blob).sum()
    assert iou > 0.97


@pytest.mark.parametrize("mode", ["aligned", "torchvision"])
def test_accepts_n1mm_and_degenerate_boxes_paste_nothing(mode):
    masks = torch.ones(5, 1, 6, 6)
    nan, inf = float("nan"), float("inf")
    boxes = torch.tensor(
        [[50.0, 50.0, 60.0, 60.0], [nan, 0.0, 4.0, 4.0], [0.0, nan, inf, inf], [5.0, 5.0, 4.0, 9.0], [1.0, 1.0, 3.0, 3.0]]
    )
    out = paste_masks_in_image(masks, boxes, (20, 20), mode=mode)
    assert out.shape == (5, 20, 20)
    assert not out[:4].any()
    # torchvision grows the 2x2 box to the 4x4 pixels 0..3 and rounds its corners off.
    assert out[4].sum() == (4 if mode == "aligned" else 12)


def test_empty_and_errors():
    assert paste_masks_in_image(torch.zeros(0, 28, 28), torch.zeros(0, 4), (7, 9)).shape == (0, 7, 9)
    assert paste_masks_in_image(torch.zeros(0, 1, 28, 28), Boxes([]), (7, 9), mode="torchvision").shape == (0, 7, 9)
    with pytest.raises(ValueError, match="float"):
        paste_masks_in_image(torch.zeros(1, 5, 5, dtype=torch.uint8), torch.zeros(1, 4), (4, 4))
    with pytest.raises(ValueError, match=r"\[N, M, M\]"):
        paste_masks_in_image(torch.zeros(1, 5, 6), torch.zeros(1, 4), (4, 4))
    with pytest.raises(ValueError, match=r"boxes must be \[2, 4\]"):
        paste_masks_in_image(torch.zeros(2, 5, 5), torch.zeros(3, 4), (4, 4))
    with pytest.raises(ValueError, match="mode"):
        paste_masks_in_image(torch.zeros(1, 5, 5), torch.zeros(1, 4), (4, 4), mode="legacy")


@pytest.mark.parametrize("mode", ["aligned", "torchvision"])
def test_chunking_does_not_change_the_result(monkeypatch, mode):
    masks, boxes = random_case(40, 14, 90, 120, seed=4)
    whole = paste_masks_in_image(masks, boxes, (90, 120), mode=mode)
    # Tiny chunks: one mask each, blocks shifted inside the image at every border.
    monkeypatch.setattr(mask_paste, "_CHUNK_FLOATS", 1)
    assert torch.equal(paste_masks_in_image(masks, boxes, (90, 120), mode=mode), whole)
    # Never split by padding: every mask in one chunk padded to the largest block.
    monkeypatch.setattr(mask_paste, "_CHUNK_FLOATS", 1 << 28)
    monkeypatch.setattr(mask_paste, "_MIN_BLOCK_AREA", 1 << 30)
    assert torch.equal(paste_masks_in_image(masks, boxes, (90, 120), mode=mode), whole)


@pytest.mark.parametrize(
    "n,m,height,width,max_side,seed",
    [(30, 28, 120, 160, 100, 0), (20, 14, 50, 70, 200, 1), (25, 28, 200, 150, 12, 2)],
)
def test_torchvision_mode_matches_torchvision(n, m, height, width, max_side, seed):
    roi_heads = pytest.importorskip("torchvision.models.detection.roi_heads")
    masks, boxes = random_case(n, m, height, width, seed, max_side=max_side)
    # Keep boxes whose integer box is not left of / above the image: torchvision's slicing
    # fails on those (it slices with a negative end), so they are no valid comparison.
    keep = (boxes[:, 2] > 0) & (boxes[:, 3] > 0) & (boxes[:, 0] < width - 1) & (boxes[:, 1] < height - 1)
    masks, boxes = masks[keep], boxes[keep]
    ref = roi_heads.paste_masks_in_image(masks[:, None], boxes, (height, width))[:, 0] >= 0.5
    out = paste_masks_in_image(masks, boxes, (height, width), mode="torchvision")
    agree = (out == ref).float().mean().item()
    assert agree >= 0.999, agree


@pytest.mark.parametrize("mode", ["aligned", "torchvision"])
def test_bfloat16_autocast_pastes_as_float32(mode):
    """TEST.PRECISION bfloat16 runs the model, postprocessing included, under autocast; pasting
    switches it off, so the masks are those of float32 (bfloat16 matmuls flip edge pixels)."""
    masks, boxes = random_case(30, 28, 120, 160, seed=5)
    expected = paste_masks_in_image(masks, boxes, (120, 160), mode=mode)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = paste_masks_in_image(masks.bfloat16(), boxes, (120, 160), mode=mode)
    # The mask probabilities arrive as float32 (the mask head's sigmoid is in float32).
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(paste_masks_in_image(masks, boxes, (120, 160), mode=mode), expected)
    # bfloat16 inputs are rounded already: only pixels near the threshold may differ.
    assert (got != expected).float().mean() < 0.01
