"""The package's shape, read from its source: layers import only downward (no circles), no module
over 400 lines and no function over 80 (``tcemu/_src/README.md`` says what each layer owns)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from conftest import ROOT

PACKAGE = ROOT / "tcemu"
# lowest first; a module may import its own layer and the ones before it
LAYERS = [
    ("base", ["tcemu._src.formats", "tcemu._src.arch", "tcemu._src.checks", "tcemu._src.sharding"]),
    ("layouts", ["tcemu._src.layouts"]),
    ("numerics", ["tcemu._src.numerics"]),
    ("kernels", ["tcemu._src.native"]),
    ("quantise", ["tcemu._src.quant"]),
    ("memory", ["tcemu._src.memory"]),
    ("isa", ["tcemu._src.isa"]),
    ("value", ["tcemu._src.api", "tcemu._src.api_mfma"]),
    ("gemm", ["tcemu._src.gemm"]),
    ("tools", ["tcemu._src.identify", "tcemu._src.library", "tcemu._src.library_layers", "tcemu._src.library_records",
               "tcemu._src.library_fit", "tcemu._src.library_xla",
               "tcemu._src.record", "tcemu._src.captures", "tcemu._src.studies",
               "tcemu._src.probe", "tcemu._src.probe_amd", "tcemu._src.probe_box", "tcemu._src.draw", "tcemu._src.emulate"]),
    ("face", ["tcemu"]),
    ("cli", ["tcemu.__main__"]),
]


def _modules():
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _layer(module: str) -> int:
    best = None
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and (best is None or len(p) > len(best[1])):
                best = (i, p)
    if best is None:
        raise AssertionError(f"{module} is in no layer of tests/test_architecture.py: place it in one")
    return best[0]


def _imports(module: str, path: Path) -> set[str]:
    """The tcemu modules ``module`` imports anywhere in its source (function bodies too)."""
    tree = ast.parse(path.read_text())
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1] + ([base] if base else []))
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        for name in names:
            while name and name not in MODULES:
                name = name.rpartition(".")[0]
            if name and name.startswith("tcemu") and name != module:
                found.add(name)
    return found


GRAPH = {m: _imports(m, p) for m, p in MODULES.items()}


def test_every_module_has_a_layer():
    for m in MODULES:
        _layer(m)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_only_downward(module):
    mine = _layer(module)
    up = sorted(f"{dep} ({LAYERS[_layer(dep)][0]})" for dep in GRAPH[module]
                if _layer(dep) > mine and not module.startswith(dep + "."))
    assert not up, f"{module} ({LAYERS[mine][0]}) imports upward: {', '.join(up)}"


def test_no_circular_imports():
    """Tarjan's strongly connected components of the import graph (a package's ``__init__``
    importing its own submodules is not a circle)."""
    index, low, stack, on, circles = {}, {}, [], set(), []

    def edges(m):
        return [d for d in GRAPH[m] if not d.startswith(m + ".")]

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges(v):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                circles.append(sorted(comp))

    for m in MODULES:
        if m not in index:
            visit(m)
    assert not circles, f"modules that import each other: {circles}"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_sizes(module):
    """At most 400 lines a module and 80 a function."""
    path = MODULES[module]
    lines = len(path.read_text().splitlines())
    assert lines <= 400, f"{path.relative_to(ROOT)}: {lines} lines"
    long = [f"{n.name} ({n.end_lineno - n.lineno + 1})" for n in ast.walk(ast.parse(path.read_text()))
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno + 1 > 80]
    assert not long, f"{path.relative_to(ROOT)}: functions over 80 lines: {', '.join(long)}"


def test_the_checker_sees_an_upward_import(tmp_path):
    """The import reader finds a function-level upward import (the form that hid them before)."""
    src = tmp_path / "mod.py"
    src.write_text("def f():\n    from tcemu._src.gemm import matmul\n    return matmul\n")
    assert "tcemu._src.gemm" in _imports("tcemu._src.numerics.fake", src)
    assert _layer("tcemu._src.gemm") > _layer("tcemu._src.numerics.engine")
