"""detcore/export/openvino_topk.py: OpenVINO TopKs rewritten from unstable TopKs give ONNX's
order (decreasing value, ties by position; the first of equal values at the k boundary) on
inputs made of ties, against numpy's stable sort, for the shapes detcore's graphs have: 1-D with
k = n (batched_nms's score sort) and [1, n] along axis 1 with k < n (the RPN's top-k)."""
import numpy as np
import pytest

pytest.importorskip("openvino")
onnx = pytest.importorskip("onnx")

from onnx import TensorProto, helper  # noqa: E402

from detcore.export.openvino_format import import_openvino  # noqa: E402
from detcore.export.openvino_topk import replace_stable_topks  # noqa: E402


def _topk_model(rank, dtype=TensorProto.FLOAT):
    """An ONNX graph: TopK(x, k) along the last axis, x of shape [n] or [1, n], k an input."""
    shape = ["n"] if rank == 1 else [1, "n"]
    x = helper.make_tensor_value_info("x", dtype, shape)
    k = helper.make_tensor_value_info("k", TensorProto.INT64, [1])
    values = helper.make_tensor_value_info("values", dtype, None)
    indices = helper.make_tensor_value_info("indices", TensorProto.INT64, None)
    node = helper.make_node("TopK", ["x", "k"], ["values", "indices"], axis=-1, largest=1, sorted=1)
    graph = helper.make_graph([node], "topk", [x, k], [values, indices])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return model.SerializeToString()


def _compiled(rank, rewrite, dtype=TensorProto.FLOAT):
    ov = import_openvino()
    core = ov.Core()
    model = core.read_model(_topk_model(rank, dtype), b"")
    counts = replace_stable_topks(model) if rewrite else None
    return core.compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"}), counts


def _cases(rng):
    for n in (0, 1, 2, 7, 50, 1000, 20000):
        x = rng.integers(0, 4, n).astype(np.float32)  # nearly all ties
        x[rng.random(n) < 0.05] = -np.inf  # batched_nms's fill for other categories
        # k = 0 only on an empty input: OpenVINO's CPU TopK refuses k = 0 otherwise, rewritten or not.
        for k in sorted({min(1, n), max(n // 3, min(1, n)), max(n - 1, min(1, n)), n}):
            yield x, k


@pytest.mark.parametrize("rank", [1, 2])
def test_rewritten_topk_gives_onnx_order_on_ties(rank):
    compiled, counts = _compiled(rank, rewrite=True)
    assert counts == (1, 0)
    rng = np.random.default_rng(0)
    for x, k in _cases(rng):
        inputs = [x if rank == 1 else x[None], np.array([k], dtype=np.int64)]
        result = compiled(inputs)
        values, indices = (result[port] for port in compiled.outputs)
        expected = np.argsort(-x, kind="stable")[:k]
        assert indices.reshape(-1).tolist() == expected.tolist(), (len(x), k)
        assert np.array_equal(values.reshape(-1), x[expected])
        assert indices.shape == ((k,) if rank == 1 else (1, k))


def test_the_unstable_topk_alone_orders_ties_otherwise():
    """Without the rewrite, OpenVINO's unstable TopK (as the ONNX frontend makes it) breaks ONNX's
    order on these inputs: the test above is not passing by luck."""
    compiled, _ = _compiled(1, rewrite=False)
    rng = np.random.default_rng(0)
    wrong = 0
    for x, k in _cases(rng):
        result = compiled([x, np.array([k], dtype=np.int64)])
        indices = result[compiled.outputs[1]]
        wrong += indices.tolist() != np.argsort(-x, kind="stable")[:k].tolist()
    assert wrong > 0


def test_an_integer_topk_is_left_stable_and_right():
    """The construction's threshold fill is a float: an integer TopK is not rewritten (it stays
    OpenVINO's stable TopK, counted) and keeps ONNX's order."""
    compiled, counts = _compiled(1, rewrite=True, dtype=TensorProto.INT32)
    assert counts == (0, 1)
    x = np.array([3, 1, 3, 2, 1, 3], dtype=np.int32)
    result = compiled([x, np.array([4], dtype=np.int64)])
    assert result[compiled.outputs[1]].tolist() == np.argsort(-x, kind="stable")[:4].tolist()
