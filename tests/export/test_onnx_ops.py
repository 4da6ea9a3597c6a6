"""detcore's ops exported to ONNX, alone, by both of torch.onnx's exporters, and run in
onnxruntime: the same indices (nms, batched_nms) and values (roi_align, roi_pool, deform_conv2d)
as detcore in eager, on random boxes with many tied scores, empty inputs, sizes not seen at export
time, both `aligned` settings, and deformable convolutions with and without a mask, with groups,
offset groups, stride, padding and dilation."""
import warnings

import numpy as np
import pytest
import torch

onnxruntime = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

import detcore.export  # noqa: E402  (registers the TorchScript-exporter symbolics)
from detcore.layers import batched_nms, deform_conv2d, nms, roi_align, roi_pool  # noqa: E402

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


class PoolAndDeform(torch.nn.Module):
    """roi_pool, and a deformable conv with the geometry of one case of DEFORM_CASES."""

    def __init__(self, modulated, biased, stride, padding, dilation):
        super().__init__()
        self.modulated, self.biased = modulated, biased
        self.stride, self.padding, self.dilation = stride, padding, dilation

    def forward(self, features, rois, weight, offset, mask, bias):
        deformed = deform_conv2d(
            features, offset, weight, bias if self.biased else None, self.stride, self.padding, self.dilation,
            mask if self.modulated else None,
        )
        return roi_pool(features, rois, (3, 4), 0.5), deformed


# modulated, biased, stride, padding, dilation, groups, offset groups
DEFORM_CASES = [(True, True, 1, 1, 1, 1, 2), (False, True, 2, 0, 1, 2, 1), (True, False, 1, 2, 2, 1, 1)]


def _pool_and_deform_inputs(case, num_rois, seed, size):
    _, _, stride, padding, dilation, groups, offset_groups = case
    features, rois = _inputs(1, num_rois, seed, size=size, classes=1)[3:]
    g = torch.Generator().manual_seed(seed)
    features = torch.randn(2, 4, *size, generator=g)  # negative values: an empty roi_pool bin's 0 is not a maximum
    out_h, out_w = ((side + 2 * padding - dilation * 2 - 1) // stride + 1 for side in size)
    weight = torch.randn(6, 4 // groups, 3, 3, generator=g)
    offset = torch.randn(2, offset_groups * 18, out_h, out_w, generator=g) * 3
    mask = torch.rand(2, offset_groups * 9, out_h, out_w, generator=g)
    return features, rois, weight, offset, mask, torch.randn(6, generator=g)


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("case", DEFORM_CASES, ids=lambda c: "-".join(map(str, c)))
def test_roi_pool_and_deform_conv_equal_eager(tmp_path, exporter, case):
    module = PoolAndDeform(*case[:5])
    example = _pool_and_deform_inputs(case, 6, seed=0, size=(12, 14))
    path = str(tmp_path / "ops.onnx")
    names = ["features", "rois", "weight", "offset", "mask", "bias"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "dynamo":
            k, h, w = torch.export.Dim("k"), torch.export.Dim("h", min=6), torch.export.Dim("w", min=6)
            oh, ow = torch.export.Dim.AUTO, torch.export.Dim.AUTO
            dynamic = ({2: h, 3: w}, {0: k}, None, {2: oh, 3: ow}, {2: oh, 3: ow}, None)
            detcore.export.export_onnx(module, example, dynamic_shapes=dynamic, verbose=False).save(path)
        else:
            torch.onnx.export(
                module, example, path, dynamo=False, opset_version=detcore.export.OPSET, input_names=names,
                dynamic_axes={"features": [2, 3], "rois": [0], "offset": [2, 3], "mask": [2, 3]},
            )
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    inputs = [i.name for i in session.get_inputs()]
    for seed, (num_rois, size) in enumerate([(6, (12, 14)), (40, (9, 21)), (0, (12, 14))]):
        given = dict(zip(names, _pool_and_deform_inputs(case, num_rois, seed + 1, size)))
        got = session.run(None, {name: given[name].numpy() for name in inputs})
        pooled, deformed = module(*given.values())
        assert got[0].shape == tuple(pooled.shape) and np.array_equal(got[0], pooled.numpy())
        np.testing.assert_allclose(got[1], deformed.numpy(), rtol=1e-5, atol=1e-5)


def test_roi_pool_positions_have_no_onnx_form():
    class Positions(torch.nn.Module):
        def forward(self, features, rois):
            return torch.ops.detcore.roi_pool(features, rois, 0.5, 2, 2)[1]

    features, rois = _inputs(1, 3, seed=0)[3:]
    with warnings.catch_warnings(), pytest.raises(Exception, match="argmax|came from"):
        warnings.simplefilter("ignore")
        detcore.export.export_onnx(Positions(), (features, rois), verbose=False)
