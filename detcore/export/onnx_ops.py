"""detcore's ops in standard ONNX, for both of torch.onnx's exporters.

- nms → NonMaxSuppression on one batch and one class, whose kept boxes come out in decreasing
  score order with ties broken by the lower index, as detcore's.
- batched_nms → NonMaxSuppression over a class dimension: each box scores in its own category's
  row only, so categories never suppress each other (exact, unlike a coordinate offset), then the
  kept boxes are put back in decreasing score order (ties: lower index first).
  Empty inputs: OpenVINO's CPU Unique on an empty tensor leaves its outputs as they were (the
  previous inference's, or uninitialized memory: a class count in the billions, then a Range and
  Where that fill the machine's memory), so Unique gets idxs' first value (0 for none) in front
  and that value's number is dropped; C counts Unique's values (at least 1), not
  ReduceMax(category) + 1 (OpenVINO's ReduceMax of an empty int64 tensor is INT32's lowest).
- roi_align → RoiAlign (opset 16+), `aligned` as coordinate_transformation_mode half_pixel
  (True) or output_half_pixel (False); sampling_ratio <= 0 as 0 (adaptive).
- roi_pool → MaxRoiPool (the same rounding of box corners and bins as torchvision's and ours).
  roi_pool also returns, for its backward, where each maximum came from; ONNX has no such output,
  so for the current exporter ``split_roi_pool`` first makes it two ops computed by the same
  kernel (values, positions), and torch.export drops the positions where nothing reads them.
- deform_conv2d → DeformConv (opset 19), v1 and v2 (mask), groups and offset groups.

With torch.onnx.export(..., dynamo=True), use ``detcore.export.export_onnx`` (which also splits
roi_pool), or pass ``custom_translation_table=onnx_translation_table()`` yourself. The
TorchScript-based exporter (dynamo=False) finds the ops through ``register_onnx_symbolics()``,
which importing detcore.export calls.

Boxes of one category in batched_nms whose score is -inf are dropped in ONNX (NonMaxSuppression
keeps only scores above its threshold, and -inf marks the other categories' rows).
"""
import sys

import torch
from torch import Tensor

import detcore.layers  # noqa: F401  (loads torch.ops.detcore)

OPSET = 19  # DeformConv needs 19 (RoiAlign's coordinate_transformation_mode 16)
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


def _deform_conv_attributes(stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w, groups, offset_groups):
    return dict(
        strides=[int(stride_h), int(stride_w)],
        pads=[int(pad_h), int(pad_w), int(pad_h), int(pad_w)],
        dilations=[int(dilation_h), int(dilation_w)],
        group=int(groups),
        offset_group=int(offset_groups),
    )


# --- roi_pool's two outputs, apart ------------------------------------------------------------------


@torch.library.custom_op("detcore_onnx::roi_pool_values", mutates_args=())
def roi_pool_values(input: Tensor, rois: Tensor, spatial_scale: float, pooled_height: int, pooled_width: int) -> Tensor:
    """The pooled values of ``torch.ops.detcore.roi_pool`` (what MaxRoiPool computes)."""
    return torch.ops.detcore.roi_pool(input, rois, spatial_scale, pooled_height, pooled_width)[0]


@torch.library.custom_op("detcore_onnx::roi_pool_argmax", mutates_args=())
def roi_pool_argmax(input: Tensor, rois: Tensor, spatial_scale: float, pooled_height: int, pooled_width: int) -> Tensor:
    """Where each maximum of ``torch.ops.detcore.roi_pool`` came from (for its backward only)."""
    return torch.ops.detcore.roi_pool(input, rois, spatial_scale, pooled_height, pooled_width)[1]


@roi_pool_values.register_fake
def _(input, rois, spatial_scale, pooled_height, pooled_width):
    return input.new_empty((rois.shape[0], input.shape[1], pooled_height, pooled_width))


@roi_pool_argmax.register_fake
def _(input, rois, spatial_scale, pooled_height, pooled_width):
    return input.new_empty((rois.shape[0], input.shape[1], pooled_height, pooled_width), dtype=torch.int64)


def _roi_pool_as_two_ops(input, rois, spatial_scale, pooled_height, pooled_width):
    args = (input, rois, spatial_scale, pooled_height, pooled_width)
    return roi_pool_values(*args), roi_pool_argmax(*args)


def split_roi_pool(program: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """The program with each roi_pool as roi_pool_values (+ roi_pool_argmax where something reads
    the positions): what ONNX can express, whenever the positions are unused."""
    if not any(node.target is torch.ops.detcore.roi_pool.default for node in program.graph.nodes):
        return program
    return program.run_decompositions({torch.ops.detcore.roi_pool.default: _roi_pool_as_two_ops})


# --- torch.onnx.export(dynamo=True): onnxscript translations ---------------------------------------


def onnx_translation_table():
    """``{torch.ops.detcore.<op>.default: translation}`` for torch.onnx.export's
    ``custom_translation_table``."""
    from onnxscript import opset19 as op

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
        # Categories numbered 0..C-1 whatever idxs' dtype (bool, float, sparse ids). Unique never
        # sees an empty tensor: idxs' first value (0 when there is none) goes in front and its
        # number is dropped, so C >= 1 and the numbering is unchanged (module docstring: empty inputs).
        first = op.Slice(op.Concat(idxs, op.CastLike(op.Constant(value_ints=[0]), idxs), axis=0), [0], [1])
        values, _, category, _ = op.Unique(op.Concat(first, idxs, axis=0), sorted=1)
        category = op.Slice(category, [1], [_INT64_MAX])
        classes = op.Shape(values)
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

    def roi_pool_values(input, rois, spatial_scale: float, pooled_height: int, pooled_width: int):
        return op.MaxRoiPool(input, rois, pooled_shape=[pooled_height, pooled_width], spatial_scale=spatial_scale)

    def roi_pool_argmax(input, rois, spatial_scale: float, pooled_height: int, pooled_width: int):
        raise NotImplementedError(
            "roi_pool's second output (where each maximum came from, for its backward) has no ONNX form; "
            "export a graph that uses the pooled values only"
        )

    def roi_pool(input, rois, spatial_scale: float, pooled_height: int, pooled_width: int):
        raise NotImplementedError(
            "detcore's roi_pool exports to ONNX through detcore.export.export_onnx (or split_roi_pool on the "
            "ExportedProgram first): ONNX's MaxRoiPool has no output for roi_pool's argmax"
        )

    def deform_conv2d(input, weight, offset, mask, bias, stride_h: int, stride_w: int, pad_h: int, pad_w: int,
                      dilation_h: int, dilation_w: int, groups: int, offset_groups: int):
        return op.DeformConv(
            input, weight, offset, bias, mask,
            **_deform_conv_attributes(stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w, groups, offset_groups),
        )

    return {
        torch.ops.detcore.nms.default: nms,
        torch.ops.detcore.batched_nms.default: batched_nms,
        torch.ops.detcore.roi_align.default: roi_align,
        torch.ops.detcore.roi_pool.default: roi_pool,
        torch.ops.detcore_onnx.roi_pool_values.default: roi_pool_values,
        torch.ops.detcore_onnx.roi_pool_argmax.default: roi_pool_argmax,
        torch.ops.detcore.deform_conv2d.default: deform_conv2d,
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
        padded = g.op("Concat", idxs, g.op("CastLike", const(g, [0], torch.int64), idxs), axis_i=0)
        first = g.op("Slice", padded, const(g, [0], torch.int64), const(g, [1], torch.int64))
        values, _, category, _ = g.op("Unique", g.op("Concat", first, idxs, axis_i=0), sorted_i=1, outputs=4)
        category = g.op("Slice", category, const(g, [1], torch.int64), const(g, [_INT64_MAX], torch.int64))
        classes = g.op("Shape", values)
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

    @parse_args("v", "v", "f", "i", "i")
    def roi_pool(g, input, rois, spatial_scale, pooled_height, pooled_width):
        pooled = g.op("MaxRoiPool", input, rois, pooled_shape_i=(pooled_height, pooled_width), spatial_scale_f=spatial_scale)
        return pooled, None  # no ONNX form for the positions: an error only if something reads them

    @parse_args("v", "v", "v", "v", "v", "i", "i", "i", "i", "i", "i", "i", "i")
    def deform_conv2d(g, input, weight, offset, mask, bias, stride_h, stride_w, pad_h, pad_w, dilation_h,
                      dilation_w, groups, offset_groups):
        geometry = (stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w, groups, offset_groups)
        attributes = {f"{key}_i": value  # ints and int lists alike
                      for key, value in _deform_conv_attributes(*geometry).items()}
        inputs = [input, weight, offset, bias, mask]
        while inputs and _is_none(inputs[-1]):  # trailing optional inputs left out
            inputs.pop()
        inputs = [g.op("prim::Constant").setType(torch._C.OptionalType.ofTensor()) if _is_none(v) else v for v in inputs]
        return g.op("DeformConv", *inputs, **attributes)

    return {
        "detcore::nms": (nms, 16), "detcore::batched_nms": (batched_nms, 16), "detcore::roi_align": (roi_align, 16),
        "detcore::roi_pool": (roi_pool, 16), "detcore::deform_conv2d": (deform_conv2d, 19),
    }


def _is_none(value) -> bool:
    return value.node().mustBeNone()


def register_onnx_symbolics():
    """Teaches the TorchScript-based exporter (torch.onnx.export(..., dynamo=False)) detcore's ops,
    for every opset from the first that has their ONNX form (RoiAlign's coordinate modes: 16,
    DeformConv: 19) on."""
    for name, (symbolic, first_opset) in _symbolics().items():
        for opset in range(first_opset, 24):
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
    if not isinstance(model, torch.export.ExportedProgram):
        # torch.export here rather than inside torch.onnx.export: roi_pool is split in between.
        if kwargs.get("dynamic_axes") is not None:
            raise ValueError("export_onnx: give torch.export's dynamic_shapes, not dynamic_axes")
        kwargs.pop("dynamic_axes", None)
        model = torch.export.export(
            model, tuple(args), kwargs=kwargs.pop("kwargs", None), dynamic_shapes=kwargs.pop("dynamic_shapes", None),
            strict=False,
        )
    return torch.onnx.export(split_roi_pool(model), args, f, custom_translation_table=table, **kwargs)
