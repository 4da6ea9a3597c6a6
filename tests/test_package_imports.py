"""The package's import graph: every module imports in a fresh interpreter, no module imports one
that (directly or through others) imports it back, and no part of the package imports a part of
a higher layer. Circles work only by the luck of import order and break when someone imports a
module first from elsewhere; an import running back up the layers is a circle waiting to happen
and a part that can no longer be understood (or tested) without the ones above it."""
import ast
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "detcore"


def package_modules():
    """{module name: source file} for every .py file of the package."""
    modules = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def import_edges(modules):
    """module -> the package modules it imports, anywhere in its code (functions included):
    ``from X import y`` counts as importing X.y when that is a module, else X."""
    edges = {}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        here = name if is_package else name.rsplit(".", 1)[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base_parts = here.split(".")[: len(here.split(".")) - (node.level - 1)]
                    base = ".".join(base_parts + ([node.module] if node.module else []))
                else:
                    base = node.module
                for alias in node.names:
                    child = f"{base}.{alias.name}"
                    targets.add(child if child in modules else base)
        edges[name] = sorted(t for t in targets if t in modules and t != name)
    return edges


def cycles(edges):
    """The strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, []):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


# The package's layers, lowest first: a part (a subpackage of detcore) may import its own modules
# and those of the parts in lower layers, never a part of its own layer or a higher one. A new
# subpackage must be given its place here.
LAYERS = [
    ("config",),  # the keys, their defaults and allowed values: imports no other part
    ("layers",),  # the compiled ops (detcore._C) and the model's building blocks
    ("structures",),  # boxes, masks, keypoints, instances, image lists
    ("utils",),  # registries, distributed helpers, logging, precision, drawing, the env report
    ("data", "solver"),  # datasets, transforms, loaders; optimizers and LR schedules
    ("modeling", "evaluation"),  # the models; the evaluators
    ("checkpoint", "export"),  # other projects' weights and the model zoo; export of a built model
    ("engine",),  # training, inference, the Predictor: everything together
    ("cli",),  # the detcore command (``python -m detcore`` too): the user's jobs on top of all
]


def part_of(module):
    """The subpackage a module belongs to: detcore.X... -> X. The package's own __init__
    (``import detcore``) loads the compiled ops, so it counts as part of layers; its __main__
    (``python -m detcore``) is the command line, part of cli."""
    parts = module.split(".")
    if len(parts) == 1:
        return "layers"
    return "cli" if parts[1] == "__main__" else parts[1]


def layer_violations(edges, layers, part=part_of):
    """One sentence per import from a part to a part of the same or a higher layer, and per
    part that has no layer."""
    rank = {name: i for i, group in enumerate(layers) for name in group}
    problems = sorted({f"{part(m)}/ (module {m}) has no layer: declare it in LAYERS"
                       for m in edges if part(m) not in rank})
    for importer, imported in sorted((a, b) for a, targets in edges.items() for b in targets):
        a, b = part(importer), part(imported)
        if a == b or a not in rank or b not in rank:
            continue
        if rank[b] >= rank[a]:
            where = "the same layer as" if rank[b] == rank[a] else "a higher layer than"
            problems.append(f"{importer} imports {imported}: {b}/ is in {where} {a}/ "
                            f"(layer {rank[b]} vs {rank[a]} in LAYERS)")
    return problems


def test_every_module_imports_in_a_fresh_interpreter():
    names = [n for n in package_modules() if not n.startswith("detcore.csrc")]
    code = "import importlib, json, sys\n" f"for name in {names!r}:\n    importlib.import_module(name)\n" \
           "print(json.dumps(sorted(m for m in sys.modules if m.startswith('detcore'))))"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    loaded = set(json.loads(result.stdout.strip().splitlines()[-1]))
    assert set(names) <= loaded


def test_no_module_imports_one_that_imports_it_back():
    edges = import_edges(package_modules())
    assert "detcore.modeling.proposal_generator.rpn" in edges  # the graph is really built
    assert "detcore.modeling.proposal_generator.build" in edges["detcore.modeling.proposal_generator.rpn"]
    assert cycles(edges) == []


def test_no_part_imports_one_of_its_own_or_a_higher_layer():
    edges = import_edges(package_modules())
    assert len({part_of(m) for m in edges}) == len([p for group in LAYERS for p in group])  # all parts seen
    assert layer_violations(edges, LAYERS) == []


def test_the_layer_check_names_both_modules_of_an_import_that_runs_up():
    layers = [("low",), ("mid_a", "mid_b"), ("high",)]
    edges = {
        "pkg.low.x": ["pkg.high.y"],  # up two layers: wrong
        "pkg.mid_a.x": ["pkg.low.x", "pkg.mid_b.x"],  # down: fine; sideways: wrong
        "pkg.mid_b.x": [],
        "pkg.high.y": ["pkg.mid_a.x", "pkg.high.z"],  # down, and within its own part: fine
        "pkg.high.z": [],
        "pkg.stray.w": [],
    }
    assert layer_violations(edges, layers) == [
        "stray/ (module pkg.stray.w) has no layer: declare it in LAYERS",
        "pkg.low.x imports pkg.high.y: high/ is in a higher layer than low/ (layer 2 vs 0 in LAYERS)",
        "pkg.mid_a.x imports pkg.mid_b.x: mid_b/ is in the same layer as mid_a/ (layer 1 vs 1 in LAYERS)",
    ]


def test_the_cycle_finder_finds_a_circle_through_a_function_level_import(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from .b import x\n")
    (package / "b.py").write_text("x = 1\ndef late():\n    from . import a\n")
    (package / "c.py").write_text("from pkg import b\n")
    modules = {"pkg": package / "__init__.py", "pkg.a": package / "a.py", "pkg.b": package / "b.py", "pkg.c": package / "c.py"}
    edges = import_edges(modules)
    assert edges == {"pkg": [], "pkg.a": ["pkg.b"], "pkg.b": ["pkg.a"], "pkg.c": ["pkg.b"]}
    assert cycles(edges) == [["pkg.a", "pkg.b"]]


def test_the_extension_imports_first_thing_in_a_fresh_interpreter():
    # `import detcore._C` before anything else: the extension links libc10 / libtorch, which only
    # torch's own import puts in the process, so the package must import torch before it.
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run(
        [sys.executable, "-c", "import detcore._C, torch; print(torch.ops.detcore.nms)"],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "detcore.nms" in result.stdout
