"""ONNX's tie order for OpenVINO's TopK, without OpenVINO's stable TopK.

ONNX's TopK puts equal values in the order of their position, and detcore's graphs rely on it
(batched_nms orders its kept boxes by decreasing score, ties by lower index; the RPN keeps the
first of equal scores at its top-k boundary, as eager does). OpenVINO's TopK has a ``stable``
attribute for that, but the CPU plugin's stable TopK costs about n x k (a full sort of 200,000
values, k = n, took seconds). ``replace_stable_topks`` rewrites each TopK whose indices are used
into the same result from unstable TopKs, which cost about n log k:

1. an unstable TopK gives the k largest values, exact whatever the ties; the smallest of them is
   the threshold t;
2. every value above t is in, and of those equal to t the first ``k - count(> t)`` by position
   (a cumulative count over the positions): exactly ONNX's set, in position order;
3. those k are sorted by an unstable TopK; its equal values form runs, numbered in order; a
   second unstable TopK on (run number, position), unique keys, puts each run in position order.

The values are the first sort's (a run's values are all equal). Non-finite values: NaN compares
neither above nor equal to the threshold, so the rewrite is only for TopKs whose inputs are
finite or infinite, which detcore's are (scores come through sigmoid / softmax and the -inf fill
of batched_nms). Only a TopK with mode max, sort by value, and every dimension but its axis 1 is
rewritten (all of detcore's), on floating-point values; any other stays stable, counted in the
result.
"""
from typing import Tuple

__all__ = ["replace_stable_topks"]


def replace_stable_topks(model) -> Tuple[int, int]:
    """Rewrites, in place, each TopK of ``model`` (an ov.Model from the ONNX frontend) as the
    module docstring says: a TopK whose indices are unused becomes unstable (the values are the
    same either way), one whose indices are used becomes the unstable construction, and one this
    cannot express stays stable. Returns (rewritten, left stable)."""
    rewritten = left = 0
    for node in list(model.get_ordered_ops()):
        if node.get_type_name() != "TopK" or "stable" not in node.get_attributes():
            continue
        if not node.output(1).get_target_inputs():
            node.set_attribute("stable", False)
        elif _rewritable(node):
            _rewrite(node)
            rewritten += 1
        else:
            node.set_attribute("stable", True)
            left += 1
    model.validate_nodes_and_infer_types()
    return rewritten, left


def _rewritable(node) -> bool:
    attributes = node.get_attributes()
    shape = node.get_input_partial_shape(0)
    if attributes["mode"] != "max" or attributes["sort"] != "value" or shape.rank.is_dynamic:
        return False
    if not node.get_input_element_type(0).is_real():  # the +inf fill below is a float
        return False
    axis = attributes["axis"] % shape.rank.get_length()
    return all(d.is_static and d.get_length() == 1 for i, d in enumerate(shape) if i != axis)


def _rewrite(node) -> None:
    import numpy as np
    import openvino.opset13 as ops

    def i64(*values):
        return ops.constant(np.array(values, dtype=np.int64))

    axis0 = ops.constant(np.int64(0))  # a scalar: CumSum and Gather take no other axis

    index_type = node.get_attributes()["index_element_type"]
    rank = node.get_input_partial_shape(0).rank.get_length()
    x = ops.reshape(node.input_value(0), i64(-1), special_zero=False)  # the axis alone
    k = ops.convert(ops.reshape(node.input_value(1), i64(1), special_zero=False), "i64")

    # 1-2: ONNX's set, in position order.
    top = ops.topk(x, ops.squeeze(k, i64(0)), axis=0, mode="max", sort="value", index_element_type="i64")
    fill = ops.convert_like(ops.constant(np.array([np.inf], dtype=np.float32)), x)
    threshold = ops.reduce_min(ops.concat([top.output(0), fill], 0), i64(0), keep_dims=False)
    above = ops.greater(x, threshold)
    equal = ops.equal(x, threshold)
    room = ops.subtract(ops.squeeze(k, i64(0)), ops.reduce_sum(ops.convert(above, "i64"), i64(0), keep_dims=False))
    place_among_equal = ops.cumsum(ops.convert(equal, "i64"), axis0)
    chosen = ops.logical_or(above, ops.logical_and(equal, ops.less_equal(place_among_equal, room)))
    positions = ops.reshape(ops.non_zero(chosen, "i64"), i64(-1), special_zero=False)
    values = ops.gather(x, positions, axis0)

    # 3: sorted, each run of equal values in position order.
    count = ops.squeeze(ops.shape_of(positions, "i64"), i64(0))
    by_value = ops.topk(values, count, axis=0, mode="max", sort="value", index_element_type="i64")
    sorted_values, order = by_value.output(0), by_value.output(1)
    changes = ops.convert(
        ops.not_equal(
            ops.slice(sorted_values, i64(1), i64(np.iinfo(np.int64).max), i64(1)),
            ops.slice(sorted_values, i64(0), i64(-1), i64(1)),
        ),
        "i64",
    )
    run = ops.cumsum(ops.concat([i64(0), changes], 0), axis0)
    key = ops.add(ops.multiply(run, count), order)
    within_runs = ops.topk(key, count, axis=0, mode="min", sort="value", index_element_type="i64").output(1)
    indices = ops.gather(positions, ops.gather(order, within_runs, axis0), axis0)

    # Back to the TopK's shape: k along its axis, 1 elsewhere.
    axis = node.get_attributes()["axis"] % rank
    shape = [1] * rank
    shape[axis] = -1
    out_values = ops.reshape(sorted_values, i64(*shape), special_zero=False)
    out_indices = ops.reshape(ops.convert(indices, index_type), i64(*shape), special_zero=False)
    for old, new in ((node.output(0), out_values.output(0)), (node.output(1), out_indices.output(0))):
        for target in list(old.get_target_inputs()):
            target.replace_source_output(new)
