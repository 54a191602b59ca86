"""The documentation runs: every module's doctests pass, every public name (``tcemu.__all__``) has
a runnable example in its own docstring, and ``tcemu.__all__`` is exactly what the package exports.

Every module of the package is collected (nothing skipped): none of the examples needs a GPU or a
package outside the test extras. An example that cannot run on the CPU must not hide behind
``# doctest: +SKIP``: mark its module here with a reason instead.
"""
from __future__ import annotations

import doctest
import importlib
import inspect
import pkgutil
import types

import jax
import pytest

import tcemu

MODULES = sorted(["tcemu"] + [m.name for m in pkgutil.walk_packages(tcemu.__path__, "tcemu.")])
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def _doctests(module) -> list[doctest.DocTest]:
    return [t for t in doctest.DocTestFinder().find(module) if t.examples]


@pytest.mark.parametrize("name", MODULES)
def test_module_doctests(name):
    module = importlib.import_module(name)
    tests = _doctests(module)
    skipped = [f"{t.name} (line {t.lineno + e.lineno + 1 if t.lineno is not None else '?'})"
               for t in tests for e in t.examples if e.options.get(doctest.SKIP)]
    assert not skipped, f"examples skipped with +SKIP: {skipped}"
    out: list[str] = []
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    x64 = jax.config.jax_enable_x64
    try:
        for test in tests:
            runner.run(test, out=out.append)
    finally:  # an example may turn x64 on (fma64's does); the next module runs as the session does
        jax.config.update("jax_enable_x64", x64)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, "".join(out)


def test_module_list_is_complete():
    assert {"tcemu._src.api", "tcemu._src.gemm.api", "tcemu._src.numerics.engine", "tcemu._src.quant.blocks",
            "tcemu._src.isa.parse", "tcemu._src.native.build"} <= set(MODULES)


@pytest.mark.parametrize("name", tcemu.__all__)
def test_public_name_has_an_example(name):
    obj = getattr(tcemu, name)
    doc = inspect.getdoc(obj) or ""
    assert ">>>" in doc, f"tcemu.{name}: its docstring has no >>> example"
    # the example is one that test_module_doctests runs: found in its defining module
    found = {t.name for t in _doctests(importlib.import_module(obj.__module__))}
    assert f"{obj.__module__}.{obj.__qualname__}" in found, f"tcemu.{name}: its example is not collected"


def test_all_is_the_public_surface():
    assert len(tcemu.__all__) == len(set(tcemu.__all__)), "tcemu.__all__ repeats a name"
    missing = [n for n in tcemu.__all__ if not hasattr(tcemu, n)]
    assert not missing, f"in tcemu.__all__ but not defined: {missing}"
    exported = {n for n in dir(tcemu) if not n.startswith("_") and not isinstance(getattr(tcemu, n), types.ModuleType)
                and (inspect.isclass(getattr(tcemu, n)) or callable(getattr(tcemu, n)))
                and getattr(getattr(tcemu, n), "__module__", "").startswith("tcemu")}
    assert exported == set(tcemu.__all__), (f"exported but not in __all__: {sorted(exported - set(tcemu.__all__))}; "
                                            f"in __all__ but not a tcemu function/class: "
                                            f"{sorted(set(tcemu.__all__) - exported)}")
    others = {n for n in dir(tcemu) if not n.startswith("_") and n not in exported}
    assert all(isinstance(getattr(tcemu, n), types.ModuleType) for n in others), \
        f"public names that are neither in __all__ nor submodules: {sorted(others)}"
