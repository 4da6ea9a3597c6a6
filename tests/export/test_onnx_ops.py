"""detcore's ops exported to ONNX, alone, by both of torch.onnx's exporters, and run in
onnxruntime: the same indices (nms, batched_nms) and values (roi_align) as detcore in eager, on
random boxes with many tied scores, empty inputs, sizes not seen at export time and both
`aligned` settings."""
import warnings

import numpy as np
import pytest
import torch

onnxruntime = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

import detcore.export  # noqa: E402  (registers the TorchScript-exporter symbolics)
from detcore.layers import batched_nms, nms, roi_align  # noqa: E402

EXPORTERS = ["dynamo", "torchscript"]


class Ops(torch.nn.Module):
    def __init__(self, aligned, sampling_ratio):
        super().__init__()
        self.aligned = aligned
        self.sampling_ratio = sampling_ratio

    def forward(self, boxes, scores, idxs, features, rois):
        return (
            nms(boxes, scores, 0.5),
            batched_nms(boxes, scores, idxs, 0.4),
            roi_align(features, rois, (3, 4), 0.5, self.sampling_ratio, self.aligned),
        )


def _inputs(n, num_rois, seed, size=(12, 14), classes=5):
    g = torch.Generator().manual_seed(seed)
    corner = torch.rand(n, 2, generator=g) * 100
    boxes = torch.cat([corner, corner + 1 + torch.rand(n, 2, generator=g) * 40], dim=1)
    scores = torch.randint(0, 20, (n,), generator=g).float() / 20  # many ties
    idxs = torch.randint(0, classes, (n,), generator=g) * 3  # sparse category ids
    features = torch.rand(2, 3, *size, generator=g)
    h, w = size
    corner = torch.rand(num_rois, 2, generator=g) * torch.tensor([2.0 * w, 2.0 * h]) - 2
    far = corner + torch.rand(num_rois, 2, generator=g) * 12
    index = torch.randint(0, 2, (num_rois, 1), generator=g).float()
    rois = torch.cat([index, corner, far], dim=1)
    return boxes, scores, idxs, features, rois


def _export(module, exporter, path):
    example = _inputs(50, 6, seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "dynamo":
            n, k = torch.export.Dim("n"), torch.export.Dim("k")
            h, w = torch.export.Dim("h"), torch.export.Dim("w")
            program = detcore.export.export_onnx(
                module, example, dynamic_shapes=({0: n}, {0: n}, {0: n}, {2: h, 3: w}, {0: k}), verbose=False
            )
            program.save(str(path))
        else:
            names = ["boxes", "scores", "idxs", "features", "rois"]
            torch.onnx.export(
                module, example, str(path), dynamo=False, opset_version=detcore.export.OPSET,
                input_names=names,
                dynamic_axes={"boxes": [0], "scores": [0], "idxs": [0], "features": [2, 3], "rois": [0]},
            )
    return onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("aligned,sampling_ratio", [(True, 0), (False, 2)])
def test_exported_ops_equal_eager(tmp_path, exporter, aligned, sampling_ratio):
    module = Ops(aligned, sampling_ratio)
    session = _export(module, exporter, tmp_path / "ops.onnx")
    names = [i.name for i in session.get_inputs()]
    for seed, (n, num_rois, size) in enumerate([(50, 6, (12, 14)), (333, 17, (9, 21)), (1, 1, (5, 5)), (0, 0, (12, 14))]):
        inputs = _inputs(n, num_rois, seed=seed + 1, size=size)
        got = session.run(None, dict(zip(names, (t.numpy() for t in inputs))))
        keep, batched_keep, pooled = module(*inputs)
        assert np.array_equal(got[0], keep.numpy()), (n, got[0], keep)
        assert np.array_equal(got[1], batched_keep.numpy()), (n, got[1], batched_keep)
        assert got[2].shape == tuple(pooled.shape)
        np.testing.assert_allclose(got[2], pooled.numpy(), rtol=1e-5, atol=1e-6)


def test_export_onnx_keeps_the_callers_translations(tmp_path):
    calls = []

    def relu(x):
        from onnxscript import opset18 as op

        calls.append(1)
        return op.Relu(x)

    class ReluThenNms(torch.nn.Module):
        def forward(self, boxes, scores):
            return nms(torch.relu(boxes), scores, 0.5)

    boxes, scores = _inputs(20, 1, seed=3)[:2]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        detcore.export.export_onnx(
            ReluThenNms(), (boxes, scores), custom_translation_table={torch.ops.aten.relu.default: relu}, verbose=False
        )
    assert calls
