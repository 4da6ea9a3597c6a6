"""TorchScript from the graph torch.export made: the same ops, the same symbolic sizes.

``torch.jit.script`` of a detector's Python code would need the whole model written in
TorchScript's subset (typed containers, no ``Instances``), and ``torch.jit.trace`` turns every
size computed in Python into a constant of the traced image. The ExportedProgram already holds
the detector as one graph of ATen and detcore ops whose image sizes and instance counts are
symbolic; this module prints that graph as TorchScript:

* ``aten.sym_size`` becomes ``aten.size`` and each op overload its overload packet (TorchScript
  picks the overload from the argument types, as it did when the graph was traced);
* the symbolic-integer helpers (``torch.sym_min`` ...) become their Python builtins;
* parameters, buffers and constants go onto one flat module;
* the input checks torch.export runs in Python (dtype, fixed sizes, the bounds of the symbolic
  sizes: the smallest image) become one TorchScript check of each input at the graph's start, with
  a sentence for the user (input_checks.py).

The result is a ``torch.jit.ScriptModule`` that ``torch.jit.save`` writes and ``torch.jit.load``
reads in Python or C++ (where detcore's ops come from loading detcore's ``_C`` library).
"""
import builtins
import math
import operator
from typing import List

import torch
from torch import Tensor, fx

from .input_checks import input_contracts

__all__ = ["script_exported_program"]

# What each symbolic-integer helper is on plain Python ints.
_SYMBOLIC_TO_BUILTIN = {
    torch.sym_min: builtins.min,
    torch.sym_max: builtins.max,
    torch.sym_float: builtins.float,
    torch.sym_int: builtins.int,
    torch.sym_not: operator.not_,
}
# Plain Python operations that TorchScript compiles as they are.
_PLAIN_FUNCTIONS = {
    operator.getitem, operator.add, operator.sub, operator.mul, operator.floordiv, operator.truediv,
    operator.mod, operator.neg, operator.pow, operator.eq, operator.ne, operator.lt, operator.le,
    operator.gt, operator.ge, operator.and_, operator.or_, operator.not_, builtins.min, builtins.max,
    builtins.float, builtins.int, math.ceil, math.floor, math.sqrt,
}


def script_exported_program(program: torch.export.ExportedProgram) -> torch.jit.ScriptModule:
    """The ExportedProgram's graph as a TorchScript module taking the same inputs (positionally)
    and returning the same outputs as a tuple."""
    module = program.module()
    graph = module.graph
    root = torch.nn.Module()
    for node in list(graph.nodes):
        if node.op == "call_module":
            if node.users:
                raise NotImplementedError(
                    f"script_exported_program: the graph calls submodule {node.target!r} for a value; only "
                    "torch.export's input guard (whose result is unused) can be dropped"
                )
            graph.erase_node(node)
        elif node.op == "get_attr":
            node.target = _move_attribute(module, node.target, root)
        elif node.op == "call_function":
            node.target = _scriptable_target(node.target)
            node.args = fx.node.map_aggregate(node.args, _scriptable_argument)
            node.kwargs = fx.node.map_aggregate(node.kwargs, _scriptable_argument)
        elif node.op == "output":
            # A tuple, whatever container the program's output spec flattened.
            node.args = (tuple(node.args[0]),) if isinstance(node.args[0], (list, tuple)) else node.args
    _check_inputs_first(program, graph)
    graph._codegen = fx.graph.CodeGen()  # positional inputs, no pytree (un)flattening
    scriptable = fx.GraphModule(root, graph)
    scriptable.graph.lint()
    return torch.jit.script(scriptable)


def _check_input(value: Tensor, dtype: torch.dtype, lows: List[int], highs: List[int], description: str):
    """The program's contract for one input (input_checks.py): ``highs`` is -1 where a size has no
    upper bound. (Compiled by TorchScript with the graph.)"""
    if value.dtype != dtype:
        # TorchScript prints a dtype as its enum number only: the description names the expected one.
        raise ValueError("{}, got another dtype".format(description))
    fits = value.dim() == len(lows)
    if fits:
        for axis, low in enumerate(lows):
            if value.shape[axis] < low or (highs[axis] >= 0 and value.shape[axis] > highs[axis]):
                fits = False
    if not fits:
        raise ValueError("{}, got shape {}".format(description, value.shape))


def _check_inputs_first(program: torch.export.ExportedProgram, graph: fx.Graph) -> None:
    # The module's placeholders are the program's user inputs, in order.
    placeholders = [node for node in graph.nodes if node.op == "placeholder"]
    contracts = input_contracts(program)
    if len(placeholders) != len(contracts):
        raise NotImplementedError(
            f"script_exported_program: the graph takes {len(placeholders)} inputs, the program {len(contracts)}"
        )
    with graph.inserting_after(placeholders[-1]):
        for node, contract in reversed(list(zip(placeholders, contracts))):
            lows = [low for low, _ in contract.bounds]
            highs = [-1 if high is None else high for _, high in contract.bounds]
            graph.call_function(_check_input, (node, contract.dtype, lows, highs, contract.describe()))


def _move_attribute(module: torch.nn.Module, target: str, root: torch.nn.Module) -> str:
    value = module
    for part in target.split("."):
        value = getattr(value, part)
    name = "attr_" + target.replace(".", "_")
    if isinstance(value, torch.nn.Parameter):
        root.register_parameter(name, value)
    elif isinstance(value, torch.Tensor):
        root.register_buffer(name, value)
    else:
        raise NotImplementedError(
            f"script_exported_program: graph attribute {target!r} is a {type(value).__name__}, not a tensor"
        )
    return name


def _scriptable_target(target):
    if target is torch.ops.aten.sym_size.int:
        return torch.ops.aten.size
    if isinstance(target, torch._ops.OpOverload):
        return target.overloadpacket
    if target in _SYMBOLIC_TO_BUILTIN:
        return _SYMBOLIC_TO_BUILTIN[target]
    if target in _PLAIN_FUNCTIONS or target is _check_input:
        return target
    raise NotImplementedError(
        f"script_exported_program: no TorchScript form for {getattr(target, '__name__', target)!r} in the graph"
    )


def _scriptable_argument(value):
    # The graph's code prints a torch.device as device(type=...), which TorchScript cannot parse;
    # its string converts to the schema's Device.
    return str(value) if isinstance(value, torch.device) else value
