"""The exported graph's input rule, as the ExportedProgram holds it, applied by the other formats.

``ExportableDetector`` states the rule once (a uint8 tensor; the layout's rank, channel count and
batch size; height and width of at least ``min_side``). torch.export keeps it in the program: the
dtype and fixed sizes as the input's spec, the bound on height and width as the range of the
input's symbolic sizes. ``torch.export.load(file).module()`` checks both before running (torch's
own messages: "Tensor dtype mismatch! ...", "Guard failed: image.size()[1] >= 65"). The TorchScript
and ONNX forms are converted from that program, so they read the contract from it
(``input_contracts``) and apply the same one:

* TorchScript: a check of each input at the graph's start that raises ValueError with a sentence
  (torchscript.py);
* ONNX has no assertion op: ``add_onnx_input_checks`` reshapes each checked input to its own
  shape, or to an impossible one when a size is out of bounds, so the run fails at that node,
  whose name says what the graph takes (onnxruntime: "Non-zero status code returned while running
  Reshape node. Name:'input check: the exported detector takes image as a uint8 tensor of shape
  [3, >=65, >=65]' ..."). dtype, rank and fixed sizes onnxruntime checks itself against the
  graph's declared input.
"""
from dataclasses import dataclass
from typing import List, Optional, Tuple

import sympy
import torch
from torch.utils._sympy.numbers import int_oo

__all__ = ["InputContract", "add_onnx_input_checks", "input_contracts"]


@dataclass(frozen=True)
class InputContract:
    """What one input of an exported graph must be: its dtype and, per axis, the lowest and the
    highest size (None: no upper bound)."""

    name: str
    dtype: torch.dtype
    bounds: Tuple[Tuple[int, Optional[int]], ...]

    @property
    def dtype_name(self) -> str:
        return str(self.dtype).replace("torch.", "")

    def shape(self) -> str:
        """``[3, >=65, >=65]``: a fixed size as it is, a bounded one as its bounds."""
        return "[" + ", ".join(_describe_axis(low, high) for low, high in self.bounds) + "]"

    def describe(self) -> str:
        return f"the exported detector takes {self.name} as a {self.dtype_name} tensor of shape {self.shape()}"


def _describe_axis(low: int, high: Optional[int]) -> str:
    if low == high:
        return str(low)
    if high is None:
        return "*" if low <= 0 else f">={low}"
    return f"{low}..{high}"


def input_contracts(program: torch.export.ExportedProgram) -> List[InputContract]:
    """The contract of each user input of ``program``, as ``program.module()`` enforces it."""
    user_inputs = set(program.graph_signature.user_inputs)
    contracts = []
    for node in program.graph.nodes:
        if node.op != "placeholder" or node.name not in user_inputs:
            continue
        example = node.meta["val"]
        bounds, symbols = [], set()
        for axis, size in enumerate(example.shape):
            if isinstance(size, int):
                bounds.append((size, size))
                continue
            expr = size.node.expr
            if not isinstance(expr, sympy.Symbol) or expr in symbols:
                # A size tied to another (H == W, 2 * H) is a relation the bounds cannot say.
                raise NotImplementedError(
                    f"input_contracts: {node.name}'s size {axis} is {expr}, not a size of its own; only "
                    "independent bounded sizes can be checked outside torch"
                )
            symbols.add(expr)
            bound = program.range_constraints.get(expr)
            if bound is None:  # no constraint recorded: any size
                bounds.append((0, None))
            else:
                bounds.append((int(bound.lower), None if bound.upper in (int_oo, sympy.oo) else int(bound.upper)))
        contracts.append(InputContract(node.name, example.dtype, tuple(bounds)))
    return contracts


def add_onnx_input_checks(model, contracts: List[InputContract]) -> None:
    """Make the ONNX model (an ``onnx_ir.Model``, as ``torch.onnx.export`` gives it in
    ``ONNXProgram.model``) fail its run when an input's sizes are out of the contract's bounds."""
    graph = model.graph
    inputs = {value.name: value for value in graph.inputs}
    added = []
    for contract in contracts:
        if all((low <= 0 and high is None) or low == high for low, high in contract.bounds):
            continue  # nothing the declared input does not say already
        image = inputs[contract.name]
        uses = list(image.uses())
        nodes, checked = onnx_size_check(
            image, None, [low for low, _ in contract.bounds], [high for _, high in contract.bounds],
            contract.describe(), f"{contract.name}_input_check",
        )
        added += nodes
        for user, index in uses:
            user.replace_input_with(index, checked)
    if added:
        graph.insert_before(graph.node(0), added)


def onnx_size_check(value, sizes, lows, highs, description: str, name: str):
    """ONNX nodes (the first result) passing ``value`` on unchanged (the second) when each of
    ``sizes`` (a 1-D int64 ONNX value; None: ``value``'s shape) is within ``lows`` / ``highs``
    (None: no upper bound), and failing the run otherwise, at a Reshape node named
    ``input check: {description}``."""
    import onnx_ir as ir

    added = []
    highs = [torch.iinfo(torch.int64).max if high is None else high for high in highs]

    def node(op_type, inputs, suffix, **attributes):
        made = ir.node(op_type, inputs, attributes=attributes, name=f"{name}_{suffix}")
        made.outputs[0].name = f"{name}_{suffix}"
        added.append(made)
        return made.outputs[0]

    def constant(values, suffix):
        return node("Constant", [], suffix, value=ir.tensor(values, dtype=ir.DataType.INT64))

    shape = node("Shape", [value], "shape")
    sizes = shape if sizes is None else sizes
    within = node(
        "And", [node("GreaterOrEqual", [sizes, constant(list(lows), "lows")], "above"),
                node("LessOrEqual", [sizes, constant(highs, "highs")], "below")], "within",
    )
    all_within = node(
        "Cast", [node("ReduceMin", [node("Cast", [within], "as_int", to=ir.DataType.INT64)], "all", keepdims=0)],
        "ok", to=ir.DataType.BOOL,
    )
    # -2 is no size, so Reshape refuses it; the node's name is what onnxruntime's error shows.
    refused = node("Sub", [node("Mul", [shape, constant([0], "zero")], "zeros"), constant([2], "two")], "refused")
    target = node("Where", [all_within, shape, refused], "target")
    check = ir.node("Reshape", [value, target], name=f"input check: {description}")
    check.outputs[0].name = f"{name}_checked"
    added.append(check)
    return added, check.outputs[0]
