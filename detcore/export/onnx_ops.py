"""detcore's ops in standard ONNX, for both of torch.onnx's exporters.

- nms → NonMaxSuppression on one batch and one class, whose kept boxes come out in decreasing
  score order with ties broken by the lower index, as detcore's.
- batched_nms → NonMaxSuppression over a class dimension: each box scores in its own category's
  row only, so categories never suppress each other (exact, unlike a coordinate offset), then the
  kept boxes are put back in decreasing score order (ties: lower index first).
- roi_align → RoiAlign (opset 16+), `aligned` as coordinate_transformation_mode half_pixel
  (True) or output_half_pixel (False); sampling_ratio <= 0 as 0 (adaptive).

With torch.onnx.export(..., dynamo=True), pass ``custom_translation_table=onnx_translation_table()``
(``detcore.export.export_onnx`` does). The TorchScript-based exporter (dynamo=False) finds the ops
through ``register_onnx_symbolics()``, which importing detcore.export calls.

Boxes of one category in batched_nms whose score is -inf are dropped in ONNX (NonMaxSuppression
keeps only scores above its threshold, and -inf marks the other categories' rows).
"""
import sys

import torch

import detcore.layers  # noqa: F401  (loads torch.ops.detcore)

OPSET = 18  # RoiAlign's coordinate_transformation_mode needs 16; 18 is the exporters' default
_INT64_MAX = sys.maxsize
_LOWEST_FLOAT = -3.4028234663852886e38  # NonMaxSuppression keeps scores strictly above this


def _roi_align_attributes(spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned):
    return dict(
        mode="avg",
        output_height=int(pooled_height),
        output_width=int(pooled_width),
        sampling_ratio=max(int(sampling_ratio), 0),
        spatial_scale=float(spatial_scale),
        coordinate_transformation_mode="half_pixel" if aligned else "output_half_pixel",
    )


# --- torch.onnx.export(dynamo=True): onnxscript translations ---------------------------------------


def onnx_translation_table():
    """``{torch.ops.detcore.<op>.default: translation}`` for torch.onnx.export's
    ``custom_translation_table``."""
    from onnxscript import opset18 as op

    def box_indices(selected):
        # selected_indices rows are (batch, class, box): the box column, as a 1-D int64 tensor.
        return op.Reshape(op.Gather(selected, op.Constant(value_ints=[2]), axis=1), op.Constant(value_ints=[-1]))

    def nms(boxes, scores, iou_threshold: float):
        selected = op.NonMaxSuppression(
            op.Unsqueeze(boxes, op.Constant(value_ints=[0])),
            op.Unsqueeze(scores, op.Constant(value_ints=[0, 1])),
            op.Constant(value_ints=[_INT64_MAX]),
            op.Constant(value_floats=[float(iou_threshold)]),
        )
        return box_indices(selected)

    def batched_nms(boxes, scores, idxs, iou_threshold: float):
        # Categories numbered 0..C-1 whatever idxs' dtype (bool, float, sparse ids).
        _, _, category, _ = op.Unique(idxs, sorted=1)
        classes = op.Add(op.ReduceMax(category, keepdims=1), op.Constant(value_ints=[1]))
        rows = op.Range(op.Constant(value_int=0), op.Squeeze(classes), op.Constant(value_int=1))
        member = op.Equal(op.Unsqueeze(category, op.Constant(value_ints=[0])), op.Unsqueeze(rows, op.Constant(value_ints=[1])))
        lowest = op.CastLike(op.Constant(value_float=float("-inf")), scores)
        class_scores = op.Where(member, op.Unsqueeze(scores, op.Constant(value_ints=[0])), lowest)
        selected = op.NonMaxSuppression(
            op.Unsqueeze(boxes, op.Constant(value_ints=[0])),
            op.Unsqueeze(class_scores, op.Constant(value_ints=[0])),
            op.Constant(value_ints=[_INT64_MAX]),
            op.Constant(value_floats=[float(iou_threshold)]),
            op.Constant(value_floats=[_LOWEST_FLOAT]),
        )
        kept = box_indices(selected)
        # Decreasing score, ties by lower index: sort by index first, then a stable TopK on score
        # (TopK puts equal values in the order of their position).
        count = op.Shape(kept)
        by_index = op.Neg(op.TopK(op.Neg(kept), count, largest=1, sorted=1)[0])
        _, order = op.TopK(op.Gather(scores, by_index), count, largest=1, sorted=1)
        return op.Gather(by_index, order)

    def roi_align(input, rois, spatial_scale: float, pooled_height: int, pooled_width: int,
                  sampling_ratio: int, aligned: bool):
        batch_index = op.Cast(op.Squeeze(op.Slice(rois, [0], [1], [1]), [1]), to=7)  # INT64
        corners = op.Slice(rois, [1], [5], [1])
        return op.RoiAlign(
            input, corners, batch_index,
            **_roi_align_attributes(spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned),
        )

    return {
        torch.ops.detcore.nms.default: nms,
        torch.ops.detcore.batched_nms.default: batched_nms,
        torch.ops.detcore.roi_align.default: roi_align,
    }


# --- torch.onnx.export(dynamo=False): TorchScript symbolics ---------------------------------------


def _symbolics():
    from torch.onnx.symbolic_helper import parse_args

    def const(g, value, dtype):
        return g.op("Constant", value_t=torch.tensor(value, dtype=dtype))

    def unsqueeze(g, value, axes):
        return g.op("Unsqueeze", value, const(g, axes, torch.int64))

    def box_indices(g, selected):
        column = g.op("Gather", selected, const(g, [2], torch.int64), axis_i=1)
        return g.op("Reshape", column, const(g, [-1], torch.int64))

    @parse_args("v", "v", "f")
    def nms(g, boxes, scores, iou_threshold):
        selected = g.op(
            "NonMaxSuppression", unsqueeze(g, boxes, [0]), unsqueeze(g, scores, [0, 1]),
            const(g, [_INT64_MAX], torch.int64), const(g, [iou_threshold], torch.float32),
        )
        return box_indices(g, selected)

    @parse_args("v", "v", "v", "f")
    def batched_nms(g, boxes, scores, idxs, iou_threshold):
        _, _, category, _ = g.op("Unique", idxs, sorted_i=1, outputs=4)
        classes = g.op("Add", g.op("ReduceMax", category, keepdims_i=1), const(g, [1], torch.int64))
        rows = g.op(
            "Range", const(g, 0, torch.int64), g.op("Squeeze", classes), const(g, 1, torch.int64)
        )
        member = g.op("Equal", unsqueeze(g, category, [0]), unsqueeze(g, rows, [1]))
        lowest = g.op("CastLike", const(g, float("-inf"), torch.float32), scores)
        class_scores = g.op("Where", member, unsqueeze(g, scores, [0]), lowest)
        selected = g.op(
            "NonMaxSuppression", unsqueeze(g, boxes, [0]), unsqueeze(g, class_scores, [0]),
            const(g, [_INT64_MAX], torch.int64), const(g, [iou_threshold], torch.float32),
            const(g, [_LOWEST_FLOAT], torch.float32),
        )
        kept = box_indices(g, selected)
        count = g.op("Shape", kept)
        ascending, _ = g.op("TopK", g.op("Neg", kept), count, largest_i=1, sorted_i=1, outputs=2)
        by_index = g.op("Neg", ascending)
        _, order = g.op(
            "TopK", g.op("Gather", scores, by_index, axis_i=0), count, largest_i=1, sorted_i=1,
            outputs=2,
        )
        return g.op("Gather", by_index, order, axis_i=0)

    @parse_args("v", "v", "f", "i", "i", "i", "b")
    def roi_align(g, input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned):
        index = g.op("Gather", rois, const(g, 0, torch.int64), axis_i=1)
        batch_index = g.op("Cast", index, to_i=7)  # INT64
        corners = g.op(
            "Slice", rois, const(g, [1], torch.int64), const(g, [5], torch.int64),
            const(g, [1], torch.int64),
        )
        attributes = _roi_align_attributes(spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned)
        return g.op(
            "RoiAlign", input, corners, batch_index,
            mode_s=attributes["mode"], output_height_i=attributes["output_height"],
            output_width_i=attributes["output_width"], sampling_ratio_i=attributes["sampling_ratio"],
            spatial_scale_f=attributes["spatial_scale"],
            coordinate_transformation_mode_s=attributes["coordinate_transformation_mode"],
        )

    return {"detcore::nms": nms, "detcore::batched_nms": batched_nms, "detcore::roi_align": roi_align}


def register_onnx_symbolics():
    """Teaches the TorchScript-based exporter (torch.onnx.export(..., dynamo=False)) detcore's ops,
    for every opset from 16 (RoiAlign's coordinate_transformation_mode) on."""
    for name, symbolic in _symbolics().items():
        for opset in range(16, 24):
            torch.onnx.register_custom_op_symbolic(name, symbolic, opset)


def export_onnx(model, args, f=None, **kwargs):
    """``torch.onnx.export(model, args, f, dynamo=True, opset_version=OPSET, ...)`` with detcore's
    op translations added to any ``custom_translation_table`` given. Returns the ONNXProgram."""
    table = dict(onnx_translation_table())
    table.update(kwargs.pop("custom_translation_table", None) or {})
    kwargs.setdefault("opset_version", OPSET)
    kwargs.setdefault("dynamo", True)
    if not kwargs["dynamo"]:
        raise ValueError("export_onnx: use torch.onnx.export directly for dynamo=False (importing "
                         "detcore.export registered the ops with it)")
    return torch.onnx.export(model, args, f, custom_translation_table=table, **kwargs)
