"""The package's import graph: every module imports in a fresh interpreter, and no module
imports one that (directly or through others) imports it back. Circles work only by the luck of
import order and break when someone imports a module first from elsewhere."""
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
