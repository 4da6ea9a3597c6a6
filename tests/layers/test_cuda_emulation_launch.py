"""The emulated ops launch their kernels as detcore's CUDA launchers do.

The emulated ops run the launchers' own host sequences (detcore/csrc/cuda/*_launch.h) with the
emulation's launch policy (tests/layers/cuda_emulation/emulated_launch.h), which records every
launch: here each op's grids, blocks and shared memory are compared with what
detcore/csrc/cuda/launch_config.h documents, computed again in the test. The kernels' grid-stride
loops give the right answer on any grid, so a wrong grid size shows here only. Inputs with
nothing to compute launch nothing (CUDA refuses an empty grid).
"""
import pytest
import torch

import detcore.layers  # noqa: F401  (loads torch.ops.detcore)

try:
    from .reference_ops import distinct_scores, random_boxes, seeded
except ImportError:  # tests/ run as rootdir-relative modules, without packages
    from reference_ops import distinct_scores, random_boxes, seeded

THREADS = 256  # roi_align, roi_pool, deform_conv2d, focal loss: threads per block; NMS unwrap
BOX_BLOCK = 64  # NMS: boxes per block, threads of the mask kernel
MAX_GRID = 65535
MAX_SHARED_WORDS = (48 * 1024 - 2048) // 8


def _blocks(work, max_blocks=MAX_GRID):
    return min(-(-work // THREADS), max_blocks)


def _one_d(blocks, shared=0):
    """A launch row: grid (x, y, z), block (x, y, z), dynamic shared bytes."""
    return [blocks, 1, 1, THREADS, 1, 1, shared]


@pytest.fixture
def launches(emu):
    """The launches of the code run between two calls."""
    emu.launches()  # forget earlier ones
    return lambda: emu.launches().tolist()


def _rois(k, seed=0):
    g = seeded(seed)
    boxes = random_boxes(k, g, xy_max=40.0, wh_range=(1.0, 30.0))
    return torch.cat([(torch.arange(k) % 2).float()[:, None], boxes], dim=1)


@pytest.mark.parametrize("max_blocks", [MAX_GRID, 3])
def test_roi_align(emu, launches, max_blocks):
    x, rois = torch.randn(2, 3, 11, 13), _rois(30)
    out = emu.roi_align(x, rois, 0.25, 5, 4, 2, True, max_blocks)
    assert launches() == [_one_d(_blocks(30 * 3 * 5 * 4, max_blocks))]
    emu.roi_align_backward(out, rois, 0.25, 5, 4, 2, 3, 11, 13, 2, True, max_blocks)
    assert launches() == [_one_d(_blocks(out.numel(), max_blocks))]
    emu.roi_align(x, rois[:0], 0.25, 5, 4, 2, True)  # no rois
    emu.roi_align(x[:, :, :0], rois, 0.25, 5, 4, 2, True)  # a map without pixels
    emu.roi_align_backward(out[:0], rois[:0], 0.25, 5, 4, 2, 3, 11, 13, 2, True)
    assert launches() == []


@pytest.mark.parametrize("max_blocks", [MAX_GRID, 2])
def test_roi_pool(emu, launches, max_blocks):
    x, rois = torch.randn(2, 3, 11, 13), _rois(40)
    out, argmax = emu.roi_pool(x, rois, 0.5, 3, 4, max_blocks)
    assert launches() == [_one_d(_blocks(40 * 3 * 3 * 4, max_blocks))]
    emu.roi_pool_backward(out, rois, argmax, 2, 3, 11, 13, max_blocks)
    assert launches() == [_one_d(_blocks(out.numel(), max_blocks))]
    out, argmax = emu.roi_pool(x, rois[:0], 0.5, 3, 4)
    emu.roi_pool_backward(out, rois[:0], argmax, 2, 3, 11, 13)
    assert launches() == []


@pytest.mark.parametrize("max_blocks", [MAX_GRID, 2])
def test_sigmoid_focal_loss(emu, launches, max_blocks):
    """The sum: a block sum per block of the elementwise grid, then one block adds them."""
    x, t = torch.randn(3000), torch.rand(3000)
    blocks = _blocks(3000, max_blocks)
    emu.sigmoid_focal_loss(x, t, 0.25, 2.0, "none", max_blocks)
    assert launches() == [_one_d(blocks)]
    for reduction in ("sum", "mean"):
        emu.sigmoid_focal_loss(x, t, 0.25, 2.0, reduction, max_blocks)
        assert launches() == [_one_d(blocks), _one_d(1)]
    emu.sigmoid_focal_loss_backward(torch.tensor(1.0), x, t, 0.25, 2.0, "sum", True, max_blocks)
    assert launches() == [_one_d(blocks)]
    for reduction in ("none", "sum"):
        emu.sigmoid_focal_loss(x[:0], t[:0], 0.25, 2.0, reduction)
    emu.sigmoid_focal_loss_backward(x[:0], x[:0], t[:0], 0.25, 2.0, "none", True)
    assert launches() == []


def test_deform_conv2d(emu, launches):
    """One image at a time: im2col for the forward; col2im, the offset gradients and im2col again
    for the backward."""
    batch, cin, cout, h, w, og = 2, 4, 3, 7, 6, 2
    x, weight = torch.randn(batch, cin, h, w), torch.randn(cout, cin, 3, 3)
    offset = torch.randn(batch, 2 * og * 9, h, w)
    mask = torch.rand(batch, og * 9, h, w)
    args = (1, 1, 1, 1, 1, 1, 1, og)
    out = emu.deform_conv2d(x, weight, offset, mask, None, *args)
    positions = h * w
    assert launches() == [_one_d(_blocks(cin * positions))] * batch
    emu.deform_conv2d_backward(torch.ones_like(out), x, weight, offset, mask, *args)
    per_image = [cin * 9 * positions, og * 9 * positions, cin * positions]
    assert launches() == [_one_d(_blocks(work)) for work in per_image] * batch
    emu.deform_conv2d(x[:0], weight, offset[:0], mask[:0], None, *args)
    assert launches() == []


def _nms_launches(n, max_grid_dim=MAX_GRID, max_shared_words=MAX_SHARED_WORDS):
    """The mask kernel: column blocks x row blocks of 64 threads; the unwrap: one block, the
    removed bitmap (a word per 64 boxes) in shared memory while it fits."""
    words = -(-n // BOX_BLOCK)
    grid = min(words, max_grid_dim)
    shared = words * 8 if words <= max_shared_words else 0
    return [[grid, grid, 1, BOX_BLOCK, 1, 1, 0], [1, 1, 1, THREADS, 1, 1, shared]]


@pytest.mark.parametrize("n", [1, 64, 65, 300])
@pytest.mark.parametrize("limits", [(MAX_GRID, MAX_SHARED_WORDS), (2, 1)])
def test_nms(emu, launches, n, limits):
    g = seeded(n)
    boxes, scores = random_boxes(n, g, xy_max=100.0, wh_range=(5.0, 50.0)), distinct_scores(n, g)
    idxs = torch.randint(0, 3, (n,), generator=g)
    emu.nms(boxes, scores, None, 0.5, *limits)
    assert launches() == _nms_launches(n, *limits)
    emu.nms(boxes, scores, idxs, 0.5, *limits)
    assert launches() == _nms_launches(n, *limits)
    emu.nms(boxes[:0], scores[:0], None, 0.5)
    emu.nms(boxes[:0], scores[:0], idxs[:0], 0.5)
    assert launches() == []


def _band_launches(lengths, max_grid_dim=MAX_GRID, max_shared_words=MAX_SHARED_WORDS):
    """batched_nms's banded path, for categories of `lengths` boxes: the mask kernel, column blocks
    of the widest category x row blocks of all, 64 threads; the unwrap, a block per category, the
    removed bitmap of the widest category in shared memory while it fits."""
    blocks = [-(-m // BOX_BLOCK) for m in lengths]
    widest = max(blocks)
    shared = widest * 8 if widest <= max_shared_words else 0
    return [[min(widest, max_grid_dim), min(sum(blocks), max_grid_dim), 1, BOX_BLOCK, 1, 1, 0],
            [min(len(lengths), max_grid_dim), 1, 1, THREADS, 1, 1, shared]]


@pytest.mark.parametrize("limits", [(MAX_GRID, MAX_SHARED_WORDS), (2, 1)])
def test_batched_nms_band(emu, launches, limits):
    """Above band_above boxes (the last argument) the banded path; at it, the single mask."""
    lengths = [64, 65, 1, 200]
    g = seeded(4)
    idxs = torch.cat([torch.full((m,), 10 - c) for c, m in enumerate(lengths)])
    idxs = idxs[torch.randperm(len(idxs), generator=g)]
    n = len(idxs)
    boxes, scores = random_boxes(n, g, xy_max=100.0, wh_range=(5.0, 50.0)), distinct_scores(n, g)
    emu.nms(boxes, scores, idxs, 0.5, *limits, n - 1)
    assert launches() == _band_launches(lengths, *limits)
    emu.nms(boxes, scores, idxs, 0.5, *limits, n)
    assert launches() == _nms_launches(n, *limits)
    emu.nms(boxes, scores, None, 0.5, *limits, 0)  # plain nms: never banded
    assert launches() == _nms_launches(n, *limits)
    emu.nms(boxes[:0], scores[:0], idxs[:0], 0.5, *limits, 0)
    assert launches() == []
