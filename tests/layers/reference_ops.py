"""Plain-PyTorch reference implementations of NMS and ROIAlign, for the op tests.

They are written to be obviously correct, not fast: NMS is the textbook greedy loop, ROIAlign
builds its bilinear sampling as two small weight matrices (one per axis) so that a bin is
``Wy @ feature @ Wx.T`` averaged over its samples. Semantics follow torchvision.ops: xyxy boxes,
width = x2 - x1 (no "+1"), suppression when IoU > threshold strictly, ROIAlign's half-pixel
shift when ``aligned`` and the legacy "at least 1x1" rois when not.
"""
import math

import torch


def box_area(boxes):
    return (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])


def iou_one_to_many(box, boxes):
    """IoU of one box [4] against boxes [M, 4], in their dtype, in torchvision's operation order."""
    area_one = (box[2] - box[0]) * (box[3] - box[1])
    areas = box_area(boxes)
    w = (torch.minimum(box[2], boxes[:, 2]) - torch.maximum(box[0], boxes[:, 0])).clamp(min=0)
    h = (torch.minimum(box[3], boxes[:, 3]) - torch.maximum(box[1], boxes[:, 1])).clamp(min=0)
    inter = w * h
    return inter / (area_one + areas - inter)


def score_order(scores):
    """Indices by decreasing score; equal scores keep their input order (lower index first).

    NaN counts as larger than any number, as in torch.sort (and so torchvision.ops.nms).
    """
    return torch.sort(scores, descending=True, stable=True)[1]


def nms_reference(boxes, scores, iou_threshold):
    """Greedy NMS: walk boxes by decreasing score, keep one, drop everything overlapping it more."""
    if boxes.numel() == 0:
        return torch.empty(0, dtype=torch.int64)
    boxes = boxes.cpu()
    order = score_order(scores.cpu())
    sorted_boxes = boxes[order]
    suppressed = torch.zeros(len(order), dtype=torch.bool)
    keep = []
    for i in range(len(order)):
        if suppressed[i]:
            continue
        keep.append(int(order[i]))
        rest = sorted_boxes[i + 1 :]
        # IoU in the boxes' dtype, compared in float64 (as torchvision compares with a double).
        iou = iou_one_to_many(sorted_boxes[i], rest).to(torch.float64)
        suppressed[i + 1 :] |= iou > iou_threshold
    return torch.tensor(keep, dtype=torch.int64)


def batched_nms_reference(boxes, scores, idxs, iou_threshold):
    """NMS within each category independently; the union is sorted by decreasing score."""
    boxes, scores, idxs = boxes.cpu(), scores.cpu(), idxs.cpu()
    kept = []
    for category in torch.unique(idxs).tolist():
        members = torch.nonzero(idxs == category).flatten()
        kept.append(members[nms_reference(boxes[members], scores[members], iou_threshold)])
    if not kept:
        return torch.empty(0, dtype=torch.int64)
    # Ascending indices first, so the stable score sort breaks ties by lower index.
    keep = torch.cat(kept).sort().values
    return keep[score_order(scores[keep])]


def _axis_weights(start, bin_size, pooled, grid, size):
    """Bilinear weights along one axis: a [pooled * grid, size] float64 matrix.

    Row b * grid + i holds the weights the i-th sample of bin b gives to each pixel. A sample
    more than one pixel outside the map gets a zero row (it contributes nothing); one in
    [-1, 0] reads pixel 0; one past the last pixel centre reads the last pixel.
    """
    rows = []
    for b in range(pooled):
        for i in range(grid):
            row = [0.0] * size
            rows.append(row)
            coord = start + b * bin_size + (i + 0.5) * bin_size / grid
            if coord < -1.0 or coord > size:
                continue
            coord = max(coord, 0.0)
            low = int(coord)
            if low >= size - 1:
                low = high = size - 1
                coord = float(low)
            else:
                high = low + 1
            frac = coord - low
            row[low] += 1.0 - frac
            row[high] += frac
    return torch.tensor(rows, dtype=torch.float64).reshape(pooled * grid, size)


def roi_align_reference(
    input, rois, output_size, spatial_scale=1.0, sampling_ratio=-1, aligned=False
):
    """ROIAlign of ``input`` [N, C, H, W] over ``rois`` [K, 5] (batch index, x1, y1, x2, y2).

    Computed in float64 and returned in the input's dtype. Differentiable in ``input`` through
    plain autograd (it is matrix products and a mean), so it also gives reference gradients.
    """
    if isinstance(output_size, int):
        output_size = (output_size, output_size)
    pooled_h, pooled_w = output_size
    _, channels, height, width = input.shape
    features = input.to(torch.float64)
    outputs = []
    for roi in rois.detach().cpu().to(torch.float64).tolist():
        batch = int(roi[0])
        offset = 0.5 if aligned else 0.0
        x1, y1, x2, y2 = (v * spatial_scale - offset for v in roi[1:])
        roi_w, roi_h = x2 - x1, y2 - y1
        if not aligned:
            roi_w, roi_h = max(roi_w, 1.0), max(roi_h, 1.0)
        bin_h, bin_w = roi_h / pooled_h, roi_w / pooled_w
        grid_h = sampling_ratio if sampling_ratio > 0 else math.ceil(bin_h)
        grid_w = sampling_ratio if sampling_ratio > 0 else math.ceil(bin_w)
        if grid_h <= 0 or grid_w <= 0:  # an empty (negative-size aligned) roi samples nothing
            outputs.append(features.new_zeros(channels, pooled_h, pooled_w))
            continue
        wy = _axis_weights(y1, bin_h, pooled_h, grid_h, height).to(features.device)
        wx = _axis_weights(x1, bin_w, pooled_w, grid_w, width).to(features.device)
        samples = wy @ features[batch] @ wx.T  # [C, pooled_h * grid_h, pooled_w * grid_w]
        bins = samples.reshape(channels, pooled_h, grid_h, pooled_w, grid_w)
        outputs.append(bins.mean(dim=(2, 4)))
    if not outputs:
        return input.new_zeros(0, channels, pooled_h, pooled_w)
    return torch.stack(outputs).to(input.dtype)


def boxes_to_rois(boxes_list):
    """A list of [L_i, 4] boxes (one per image) as [sum L_i, 5] rois with the image index first."""
    rois = [
        torch.cat([torch.full_like(b[:, :1], i), b], dim=1) for i, b in enumerate(boxes_list)
    ]
    return torch.cat(rois, dim=0)


def random_boxes(n, generator, dtype=torch.float32, xy_max=1000.0, wh_range=(10.0, 200.0)):
    """The issue's box distribution: top-left uniform in [0, xy_max], size uniform in wh_range."""
    xy = torch.rand(n, 2, generator=generator, dtype=torch.float64) * xy_max
    lo, hi = wh_range
    wh = lo + torch.rand(n, 2, generator=generator, dtype=torch.float64) * (hi - lo)
    return torch.cat([xy, xy + wh], dim=1).to(dtype)


def distinct_scores(n, generator, dtype=torch.float32):
    """Scores in (0, 1) with no two equal (a random permutation of evenly spaced values)."""
    perm = torch.randperm(n, generator=generator)
    return ((perm.to(torch.float64) + 1) / (n + 1)).to(dtype)


# How close a CUDA kernel (real or emulated) must come to the CPU kernel, per dtype: half types
# are computed in float32 from exactly upcast values, so only their final rounding differs.
CUDA_VS_CPU_TOLERANCE = {
    torch.float32: dict(atol=1e-5, rtol=1e-5),
    torch.float64: dict(atol=1e-10, rtol=1e-10),
    torch.float16: dict(atol=5e-3, rtol=5e-3),
    torch.bfloat16: dict(atol=3e-2, rtol=3e-2),
}

# The dtypes the CUDA kernels take, each compared under the CUDA emulation with the CPU kernel.
EMULATED_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


def seeded(seed):
    return torch.Generator().manual_seed(seed)


def in_cpu_dtype(t):
    """t as the CPU kernels compute it: half and bfloat16 upcast (exactly) to float32 (None stays)."""
    if t is None:
        return None
    return t if t.dtype in (torch.float32, torch.float64) else t.float()
