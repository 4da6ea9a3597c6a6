"""detcore's ops through the OpenVINO path (ONNX export, OpenVINO's ONNX frontend, its CPU plugin
in float32), alone: the same indices (nms, batched_nms, with many tied scores) and values
(roi_align with both `aligned` settings and adaptive / fixed sampling, on boxes from below a pixel
to larger than the map; roi_pool) as detcore in eager, at sizes not seen
at export and on empty inputs. This is where OpenVINO's ROIAlign semantics (aligned_mode
half_pixel_for_nn / asymmetric) are held to detcore's. Tolerances as for onnxruntime
(test_onnx_ops.py): indices and roi_pool equal, roi_align rtol 1e-5 atol 1e-6, deform_conv2d
rtol / atol 1e-5. OpenVINO has no conversion of ONNX's DeformConv: that refusal is tested too."""
import os
import warnings

import numpy as np
import pytest
import torch

pytest.importorskip("openvino")
pytest.importorskip("onnxscript")

import detcore.export  # noqa: E402
from detcore.export.openvino_format import compile_openvino, onnx_to_openvino  # noqa: E402
from detcore.layers import roi_pool  # noqa: E402
from tests.export.test_onnx_ops import DEFORM_CASES, Ops, _inputs, _pool_and_deform_inputs  # noqa: E402


def _compiled(program, tmp_path):
    path = str(tmp_path / "ops.xml")
    onnx_to_openvino(program, path)
    return compile_openvino(path, num_threads=1)


def _run(compiled, inputs):
    results = compiled([t.numpy() for t in inputs])
    return [results[port] for port in compiled.outputs]


@pytest.mark.parametrize("aligned,sampling_ratio", [(True, 0), (False, 2), (False, 0), (True, 3)])
def test_openvino_ops_equal_eager(tmp_path, aligned, sampling_ratio):
    module = Ops(aligned, sampling_ratio)
    n, k = torch.export.Dim("n"), torch.export.Dim("k")
    h, w = torch.export.Dim("h"), torch.export.Dim("w")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = detcore.export.export_onnx(
            module, _inputs(50, 6, seed=0), dynamic_shapes=({0: n}, {0: n}, {0: n}, {2: h, 3: w}, {0: k}), verbose=False
        )
    compiled = _compiled(program, tmp_path)
    for seed, (count, num_rois, size) in enumerate([(50, 6, (12, 14)), (333, 17, (9, 21)), (1, 1, (5, 5))]):
        inputs = _inputs(count, num_rois, seed=seed + 1, size=size)
        _assert_equal_eager(module, inputs, _run(compiled, inputs))


def _assert_equal_eager(module, inputs, got):
    keep, batched_keep, pooled = module(*inputs)
    count = inputs[0].shape[0]
    assert np.array_equal(got[0], keep.numpy()), (count, got[0], keep)
    assert np.array_equal(got[1], batched_keep.numpy()), (count, got[1], batched_keep)
    assert got[2].shape == tuple(pooled.shape)
    np.testing.assert_allclose(got[2], pooled.numpy(), rtol=1e-5, atol=1e-6)


# Runs the IR on each inputs_<i>.npz (in order, one compiled model) into outputs_<i>.npz, with
# its address space capped: OpenVINO's CPU Unique once gave batched_nms a class count from
# uninitialized memory on zero boxes, and the run grew to many GB instead of failing.
_RUN_CAPPED = """
import resource, sys
import numpy as np
resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
sys.modules["openvino_telemetry"] = None  # as detcore imports openvino: no usage reports
import openvino as ov
folder, runs = sys.argv[1], int(sys.argv[2])
config = {"INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": 1}
compiled = ov.Core().compile_model(folder + "/ops.xml", "CPU", config)
for i in range(runs):
    with np.load(f"{folder}/inputs_{i}.npz") as inputs:
        results = compiled([inputs[f"arr_{j}"] for j in range(len(inputs.files))])
    np.savez(f"{folder}/outputs_{i}.npz", *[results[port] for port in compiled.outputs])
"""


def test_openvino_ops_empty_inputs(tmp_path):
    """Zero boxes and / or zero rois, first on a fresh compiled model and again after non-empty
    runs: empty outputs (no stale ones from the previous run), at a bounded memory cost."""
    import subprocess
    import sys

    module = Ops(True, 0)
    n, k = torch.export.Dim("n"), torch.export.Dim("k")
    h, w = torch.export.Dim("h"), torch.export.Dim("w")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = detcore.export.export_onnx(
            module, _inputs(50, 6, seed=0), dynamic_shapes=({0: n}, {0: n}, {0: n}, {2: h, 3: w}, {0: k}), verbose=False
        )
    onnx_to_openvino(program, str(tmp_path / "ops.xml"))
    cases = [(0, 0), (0, 3), (50, 6), (0, 3), (5, 0), (0, 0)]
    all_inputs = [_inputs(count, num_rois, seed=seed + 1) for seed, (count, num_rois) in enumerate(cases)]
    for i, inputs in enumerate(all_inputs):
        np.savez(tmp_path / f"inputs_{i}.npz", *[t.numpy() for t in inputs])
    result = subprocess.run([sys.executable, "-c", _RUN_CAPPED, str(tmp_path), str(len(cases))],
                            capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    for i, inputs in enumerate(all_inputs):
        with np.load(tmp_path / f"outputs_{i}.npz") as outputs:
            _assert_equal_eager(module, inputs, [outputs[f"arr_{j}"] for j in range(3)])


class Pool(torch.nn.Module):
    def forward(self, features, rois):
        return roi_pool(features, rois, (3, 4), 0.5)


def test_openvino_roi_pool_equals_eager(tmp_path):
    example = _pool_and_deform_inputs(DEFORM_CASES[0], 6, seed=0, size=(12, 14))[:2]
    k, h, w = torch.export.Dim("k"), torch.export.Dim("h", min=6), torch.export.Dim("w", min=6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = detcore.export.export_onnx(Pool(), example, dynamic_shapes=({2: h, 3: w}, {0: k}), verbose=False)
    compiled = _compiled(program, tmp_path)
    for seed, (num_rois, size) in enumerate([(6, (12, 14)), (40, (9, 21)), (0, (12, 14))]):
        features, rois = _pool_and_deform_inputs(DEFORM_CASES[0], num_rois, seed + 1, size)[:2]
        (got,) = _run(compiled, [features, rois])
        pooled = Pool()(features, rois)
        assert got.shape == tuple(pooled.shape) and np.array_equal(got, pooled.numpy())


def test_deformable_models_are_refused_before_tracing(tmp_path):
    from detcore.config import get_cfg

    cfg = get_cfg()
    cfg.merge_from_list(["MODEL.RESNETS.DEFORM_ON_PER_STAGE", [False, True, True, True]])
    with pytest.raises(ValueError, match=r"OpenVINO cannot convert this model: .*DeformConv.*--format onnx"):
        detcore.export.check_export_request(cfg, "openvino", str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_conversion_sends_no_telemetry(tmp_path):
    """``import openvino`` and ov.convert_model start openvino-telemetry, which reports usage to
    Intel over the network unless the user opted out; detcore's import of openvino and its
    conversion must never start it (checked in a fresh process, where openvino is not imported
    yet: Telemetry's setup is replaced by one that records the call)."""
    import subprocess
    import sys

    script = (
        "import openvino_telemetry\n"
        "started = []\n"
        "def refuse(self, *args, **kwargs):\n"
        "    started.append(kwargs.get('app_name') or args[:1])\n"
        "    raise RuntimeError('detcore started OpenVINO telemetry')\n"
        "openvino_telemetry.Telemetry.init = refuse\n"
        "import onnx\n"
        "from onnx import TensorProto, helper\n"
        "from detcore.export.openvino_format import onnx_to_openvino\n"
        "graph = helper.make_graph([helper.make_node('Relu', ['x'], ['y'])], 'relu',\n"
        "    [helper.make_tensor_value_info('x', TensorProto.FLOAT, [2, 3])],\n"
        "    [helper.make_tensor_value_info('y', TensorProto.FLOAT, [2, 3])])\n"
        "model = helper.make_model(graph, opset_imports=[helper.make_opsetid('', 19)])\n"
        "class Program:  # what onnx_to_openvino reads of a torch.onnx.ONNXProgram\n"
        "    def save(self, path):\n"
        "        onnx.save(model, path)\n"
        f"onnx_to_openvino(Program(), {str(tmp_path / 'relu.xml')!r})\n"
        "assert not started, started\n"
    )
    root = __file__.rsplit("/tests/", 1)[0]
    result = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "relu.bin").exists()


def test_no_topk_is_left_stable(tmp_path):
    """ONNX orders a TopK's ties by position, the CPU plugin only when ``stable``, at about n x k
    cost. onnx_to_openvino rewrites every TopK whose indices are used into unstable ones
    (openvino_topk.py; the tie-heavy equality test above holds the order), and leaves the
    others unstable: no stable TopK remains in detcore's ops."""
    ov = detcore.export.openvino_format.import_openvino()
    n, k = torch.export.Dim("n"), torch.export.Dim("k")
    h, w = torch.export.Dim("h"), torch.export.Dim("w")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = detcore.export.export_onnx(
            Ops(True, 0), _inputs(50, 6, seed=0), dynamic_shapes=({0: n}, {0: n}, {0: n}, {2: h, 3: w}, {0: k}),
            verbose=False,
        )
    path = str(tmp_path / "ops.xml")
    onnx_to_openvino(program, path)
    model = ov.Core().read_model(path)  # held: the ops' consumers go with the model
    topks = [op for op in model.get_ordered_ops() if op.get_type_name() == "TopK"]
    assert topks and not any(op.get_attributes()["stable"] for op in topks)
