"""The test-time resize and the mapping back to the input's pixels, as graph ops: what lets an
exported detector take the raw image (export.json's ``input.contract`` "raw_image").

The eager path resizes on the host (``ResizeShortestEdge.test_transform``, OpenCV's bilinear of
the uint8 image) and rescales the detections in ``detector_postprocess``. Here the model's graph
is traced once, at the model's resolution, as for the pre-resized contract (tracing the resize
with it makes torch.export carry the size rule through every shape of the network: ten times
slower), and ``add_onnx_raw_image_io`` puts the same steps as ONNX ops before and after that
graph, for any input size; the OpenVINO IR is converted from the result:

* The output size, with integers only: ``round_half_up(side * min(MIN / short, MAX / long))``
  is ``min(round_half_up(side * MIN / short), round_half_up(side * MAX / long))`` (rounding is
  monotone), and ``round_half_up(a / b)`` is ``(2a + b) // (2b)``: ONNX's Shape, Min, Max, Mul,
  Add and integer Div, without a branch, the same numbers in every runtime. Eager computes
  ``int(side * scale + 0.5)`` in float64, which agrees with the exact rational rounding except
  where ``side * scale`` is exactly a half-integer and float64's rounding of ``scale`` lands
  below it (e.g. 298 x 149 at 800 / 1333: eager 1333 x 666, here 1333 x 667; a handful of
  (height, width, size) triples in a million). The detections are then those of an image one
  pixel wider, mapped back with the graph's own factors.
* The resize: bilinear with half-pixel centers and no antialiasing (OpenCV's INTER_LINEAR, the
  ONNX Resize ``linear`` / ``half_pixel`` mode), rounded half up to whole 0-255 levels as OpenCV's
  uint8 output is. OpenCV interpolates in 11-bit fixed point, so a fraction of the pixels (up
  to about one in eight on noise) differ from its by one level; an unchanged size is an exact
  copy, as OpenCV returns the image as it is.
* The mapping back: boxes scaled by ``input size / resized size`` per axis, clipped to the
  input, empty ones dropped (``detector_postprocess``; with MODEL.BOX_LEGACY_PLUS_ONE its
  inclusive-corner rule instead of the clip).

INPUT.RESIZE_MODE's other rules (torchvision's truncated sizes and float image, PIL's antialiased
bilinear) are not reproduced: every export resizes as OpenCV does, as the pre-resized contract
asks of its caller (exported_detector.py imposes the same when an export is evaluated).
"""
from dataclasses import dataclass
from typing import Optional, Tuple

from .input_checks import onnx_size_check

__all__ = ["RawImageIO", "add_onnx_raw_image_io", "describe_resize", "resized_size"]


@dataclass(frozen=True)
class RawImageIO:
    """What the raw-image graph adds around the model's: the resize (INPUT.MIN_SIZE_TEST,
    MAX_SIZE_TEST), the input's layout and batch size, the smallest side the model's graph serves,
    its outputs (all per detection, "boxes" among them) and MODEL.BOX_LEGACY_PLUS_ONE."""

    min_size: int
    max_size: int
    input_layout: str
    batch_size: Optional[int]
    min_side: int
    output_names: Tuple[str, ...]
    legacy_plus_one: bool = False

    KEYPOINTS_REFUSED = (
        "the raw_image input contract is not available for keypoint models: their heatmaps are decoded against the "
        "boxes at the model's resolution (decode_keypoints), which a graph giving boxes in the raw image's pixels no "
        "longer shows. Export with input_contract 'resized_image' (tools/export_model.py --input-contract "
        "resized_image)"
    )

    @classmethod
    def of(cls, detector, cfg) -> "RawImageIO":
        """For an ``ExportableDetector`` built from ``cfg``."""
        if detector.keypoint_on:
            raise ValueError(cls.KEYPOINTS_REFUSED)
        return cls(
            int(cfg.INPUT.MIN_SIZE_TEST), int(cfg.INPUT.MAX_SIZE_TEST), detector.input_layout, detector.batch_size,
            detector.min_side, tuple(detector.output_names),
            bool(cfg.MODEL.BOX_LEGACY_PLUS_ONE) and not detector.proposals_only,
        )


def resized_size(height: int, width: int, min_size: int, max_size: int) -> Tuple[int, int]:
    """``(new_height, new_width)`` of the graph's resize: shortest side to ``min_size``, longest
    at most ``max_size``, each rounded half up and at least 1 (the rule the ONNX nodes compute; a
    side below the graph's smallest is refused there, so its floor of 1 never shows)."""
    short, long = max(min(height, width), 1), max(max(height, width), 1)

    def one(side):
        return max(min((2 * side * min_size + short) // (2 * short), (2 * side * max_size + long) // (2 * long)), 1)

    return one(height), one(width)


def describe_resize(min_size: int, max_size: int) -> str:
    return (
        f"shortest side to {min_size} px, longest at most {max_size} px (sizes rounded half up), bilinear with "
        "half-pixel centers and no antialiasing (OpenCV's INTER_LINEAR), rounded to whole levels"
    )


def add_onnx_raw_image_io(model, io: RawImageIO) -> None:
    """Make the ONNX model (an ``onnx_ir.Model`` whose graph takes an image at the model's
    resolution as its first input and gives ``io.output_names``) take the raw image and give its
    detections in the raw image's pixels: the resize before the graph (with a check that it leaves
    at least ``io.min_side`` px on each side), boxes mapped back after it and the detections whose
    boxes are left empty dropped from every output."""
    import onnx_ir as ir

    min_size, max_size, input_layout, batch_size = io.min_size, io.max_size, io.input_layout, io.batch_size
    min_side, output_names, legacy_plus_one = io.min_side, io.output_names, io.legacy_plus_one

    graph = model.graph
    image = graph.inputs[0]
    added = []

    def node(op_type, inputs, name, **attributes):
        made = ir.node(op_type, inputs, attributes=attributes, name=f"raw_image_{name}")
        made.outputs[0].name = f"raw_image_{name}"
        added.append(made)
        return made.outputs[0]

    def constant(values, name, dtype=ir.DataType.INT64):
        return node("Constant", [], name, value=ir.tensor(values, dtype=dtype))

    # The image as [B, 3, H, W] float, whatever the layout.
    first = 0 if batch_size is None else 1
    height_axis, width_axis = (first, first + 1) if input_layout == "HWC" else (first + 1, first + 2)
    shape = node("Shape", [image], "shape")
    height = node("Gather", [shape, constant([height_axis], "height_axis")], "height", axis=0)
    width = node("Gather", [shape, constant([width_axis], "width_axis")], "width", axis=0)
    pixels = node("Cast", [image], "float", to=ir.DataType.FLOAT)
    if input_layout == "HWC":
        pixels = node("Transpose", [pixels], "chw", perm=[2, 0, 1] if batch_size is None else [0, 3, 1, 2])
    if batch_size is None:
        pixels = node("Unsqueeze", [pixels, constant([0], "batch_axis")], "batched")

    # The size rule (resized_size), with a floor of 1 on the divisors: an empty image gets size 0
    # and fails the check below rather than dividing by zero.
    one = constant([1], "one")
    short = node("Max", [node("Min", [height, width], "short_or_0"), one], "short")
    long = node("Max", [node("Max", [height, width], "long_or_0"), one], "long")
    two = constant([2], "two")

    def round_half_up(side, size, divisor, name):
        numerator = node("Add", [node("Mul", [side, constant([2 * size], f"{name}_2x")], f"{name}_scaled"), divisor],
                         f"{name}_num")
        return node("Div", [numerator, node("Mul", [divisor, two], f"{name}_den")], name)

    def new_side(side, name):
        return node("Min", [round_half_up(side, min_size, short, f"{name}_by_min"),
                            round_half_up(side, max_size, long, f"{name}_by_max")], name)

    new_height, new_width = new_side(height, "new_height"), new_side(width, "new_width")
    new_sizes = node("Concat", [new_height, new_width], "new_sizes", axis=0)
    check_nodes, pixels = onnx_size_check(
        pixels, new_sizes, [min_side, min_side], [None, None],
        f"the exported detector takes image as a uint8 tensor of shape {_shape(input_layout, batch_size)} whose "
        f"resize ({describe_resize(min_size, max_size)}) is at least {min_side} px on each side",
        "raw_image_check",
    )
    added += check_nodes
    sizes = node("Concat", [node("Slice", [node("Shape", [pixels], "batched_shape"), constant([0], "zero"), two],
                                 "batch_and_channels"), new_sizes], "sizes", axis=0)
    empty = constant([], "no_roi", ir.DataType.FLOAT)
    resized = node("Resize", [pixels, empty, empty, sizes], "resize", mode="linear",
                   coordinate_transformation_mode="half_pixel")
    rounded = node("Clip", [node("Floor", [node("Add", [resized, constant(0.5, "half", ir.DataType.FLOAT)],
                                                "plus_half")], "floor"),
                            constant(0.0, "black", ir.DataType.FLOAT), constant(255.0, "white", ir.DataType.FLOAT)],
                   "rounded")
    if batch_size is None:
        rounded = node("Squeeze", [rounded, constant([0], "batch_axis_again")], "unbatched")
    if input_layout == "HWC":
        rounded = node("Transpose", [rounded], "hwc", perm=[1, 2, 0] if batch_size is None else [0, 2, 3, 1])
    model_input = node("Cast", [rounded], "model_input", to=ir.DataType.UINT8)
    # The model's graph names its sizes after its input's symbolic height and width, which now
    # belong to the resized image; the raw input gets its own names.
    model_input.shape, model_input.dtype = image.shape, image.dtype
    dims = list(image.shape)
    dims[height_axis], dims[width_axis] = ir.SymbolicDim("raw_height"), ir.SymbolicDim("raw_width")
    image.shape = ir.Shape(dims)
    for user, index in list(image.uses()):
        if user not in added:
            user.replace_input_with(index, model_input)
    graph.insert_before(graph.node(0), added)

    # After the graph: boxes scaled by input / resized size, clipped (or Detectron's inclusive
    # corners scaled), the empty ones dropped everywhere.
    added = []
    outputs = {value.name: (i, value) for i, value in enumerate(graph.outputs)}
    _, boxes = outputs["boxes"]
    as_float = {name: node("Cast", [value], f"{name}_float", to=ir.DataType.FLOAT)
                for name, value in (("height", height), ("width", width), ("new_height", new_height),
                                    ("new_width", new_width))}
    scale_x = node("Div", [as_float["width"], as_float["new_width"]], "scale_x")
    scale_y = node("Div", [as_float["height"], as_float["new_height"]], "scale_y")
    factors = node("Concat", [scale_x, scale_y, scale_x, scale_y], "factors", axis=0)
    if legacy_plus_one:
        corner = constant([0.0, 0.0, 1.0, 1.0], "inclusive_corner", ir.DataType.FLOAT)
        mapped = node("Add", [node("Mul", [node("Sub", [boxes, corner], "inclusive"), factors], "inclusive_scaled"),
                              corner], "mapped")
    else:
        limits = node("Concat", [as_float["width"], as_float["height"], as_float["width"], as_float["height"]],
                      "limits", axis=0)
        scaled = node("Mul", [boxes, factors], "scaled")
        mapped = node("Min", [node("Max", [scaled, constant(0.0, "origin", ir.DataType.FLOAT)], "above_0"), limits],
                      "mapped")
    sides = node("Sub", [node("Slice", [mapped, constant([2], "x2"), constant([4], "end"), one], "far_corners"),
                         node("Slice", [mapped, constant([0], "x1"), two, one], "near_corners")], "sides")
    nonempty = node("ReduceMin", [sides, one], "smaller_side", keepdims=0)
    kept = node("Squeeze", [node("NonZero", [node("Greater", [nonempty, constant(0.0, "zero_size", ir.DataType.FLOAT)],
                                                  "nonempty")], "kept_2d"), constant([0], "kept_axis")], "kept")
    for name in output_names:
        index, value = outputs[name]
        source = mapped if name == "boxes" else value
        value.name = f"{name}_at_model_resolution"
        made = ir.node("Gather", [source, kept], attributes={"axis": 0}, name=f"raw_image_{name}")
        made.outputs[0].name = name
        made.outputs[0].dtype = value.dtype
        added.append(made)
        graph.outputs[index] = made.outputs[0]
    graph.extend(added)


def _shape(input_layout: str, batch_size: Optional[int]) -> str:
    image = "[H, W, 3]" if input_layout == "HWC" else "[3, H, W]"
    return image if batch_size is None else f"[{batch_size}, {image[1:]}"
