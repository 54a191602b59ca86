""":func:`emulate`: a function with every GEMM emulated, and its :class:`Report`.

    >>> import jax.numpy as jnp, tcemu
    >>> mm = tcemu.emulate(lambda x, w: x @ w, tcemu.GemmConfig(arch="H100"))
    >>> print(mm.report(jnp.ones((2, 16), jnp.float32), jnp.ones((16, 4), jnp.float32)))
    # primitive   scope operands                M N K  params status   config
    0 dot_general       f32[2,16] x f32[16,4] -> f32 2 4 16 0; 1 emulated H100 m16n8k16.f32.bf16.bf16.f32
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import sys

import jax
import numpy as np

from tcemu._src.emulate.gemms import Gemms
from tcemu._src.emulate.interpret import run
from tcemu._src.emulate.policy import Policy, as_policy

UNSUPPORTED = ("error", "native")
CACHE_SIZE = 32
_SHORT = {"bfloat16": "bf16", "float16": "f16", "float32": "f32", "float64": "f64", "float8_e4m3fn": "e4m3",
          "float8_e5m2": "e5m2"}


def _graph_node(x) -> bool:
    """A Flax nnx graph node (Module, Optimizer, ...), when Flax is loaded."""
    nnx = sys.modules.get("flax.nnx")
    if nnx is None:
        return False
    kinds = tuple(k for k in (getattr(nnx, n, None) for n in ("Module", "Pytree", "Object")) if isinstance(k, type))
    return bool(kinds) and isinstance(x, kinds)


def _model(fn) -> bool:
    """A callable model whose arrays are its parameters (nnx or Equinox module): an argument."""
    eqx = sys.modules.get("equinox")
    return _graph_node(fn) or (eqx is not None and isinstance(fn, eqx.Module))


def _is_array(x) -> bool:
    return isinstance(x, (jax.Array, np.ndarray, np.generic))


def _path(path) -> str:
    """A key path of (model, args, kwargs) as "0/l1/kernel/value" (args), "name/..." (kwargs)
    or "fn/..." (the model called)."""
    keys = [str(next((getattr(k, a) for a in ("idx", "key", "name") if hasattr(k, a)), k)) for k in path]
    return "/".join((["fn"] if keys[0] == "0" else []) + keys[1:])


def _nodes(root) -> list:
    return [x for x in jax.tree_util.tree_leaves(root, is_leaf=_graph_node) if _graph_node(x)]


@dataclasses.dataclass(frozen=True)
class _Program:
    closed: object  # ClosedJaxpr of (fn's outputs, the final states of its nnx arguments)
    out_tree: object
    paths: list  # per array input, its key path (a frozenset of one)


class Report(list):
    """The GEMMs of a function in program order (rows with ``op``, ``config`` and ``status``);
    ``str()`` / :meth:`format` give a table."""

    def format(self) -> str:
        """The rows as a table."""
        def cfg(c):
            return "-" if c is None else f"{c.arch} {c.instruction}" + ("" if c.k_order == "sequential" else f" {c.k_order}")

        def shape(dt, s):
            return f"{_SHORT.get(dt, dt)}[{','.join(map(str, s))}]"

        head = ("#", "primitive", "scope", "operands", "M", "N", "K", "params", "status", "config")
        rows = [head] + [(str(i), r.op.primitive, r.op.scope or "",
                          f"{shape(r.op.lhs_dtype, r.op.lhs_shape)} x {shape(r.op.rhs_dtype, r.op.rhs_shape)} -> "
                          f"{_SHORT.get(r.op.out_dtype, r.op.out_dtype)}", str(r.op.M), str(r.op.N), str(r.op.K),
                          "; ".join(r.op.params) or "-", r.status, cfg(r.config)) for i, r in enumerate(self)]
        widths = [max(len(row[j]) for row in rows) for j in range(len(head) - 1)]
        return "\n".join(" ".join([c.ljust(w) for c, w in zip(row, widths)] + [row[-1]]).rstrip() for row in rows)

    def __str__(self):
        return self.format()


class Emulated:
    """``fn`` with every GEMM run as its :class:`tcemu.Policy` says (what :func:`emulate`
    returns): call it as ``fn``; :meth:`report` lists the GEMMs without computing."""

    def __init__(self, fn, policy: Policy, unsupported: str):
        self.fn, self.policy, self.unsupported = fn, policy, unsupported
        self._cache: collections.OrderedDict = collections.OrderedDict()
        functools.update_wrapper(self, fn, updated=())

    def _program(self, args, kwargs):
        root = (self.fn if _model(self.fn) else None, args, kwargs)
        leaves, treedef = jax.tree_util.tree_flatten_with_path(root)
        values = [x for _, x in leaves]
        mask = [_is_array(x) for x in values]
        arrays = [x for x, m in zip(values, mask) if m]
        statics = tuple((i, x) for i, (x, m) in enumerate(zip(values, mask)) if not m)
        key = (treedef, tuple(jax.typeof(x) for x in arrays), statics, bool(jax.config.jax_enable_x64))
        try:
            prog = self._cache.get(key)
        except TypeError:  # unhashable static leaves: traced every call
            key = prog = None
        if prog is None:
            prog = self._trace(treedef, values, mask, [p for p, _ in leaves], arrays)
            if key is not None and not any(isinstance(c, jax.core.Tracer) for c in prog.closed.consts):
                self._cache[key] = prog
                if len(self._cache) > CACHE_SIZE:
                    self._cache.popitem(last=False)
        return root, prog, arrays

    def _trace(self, treedef, values, mask, paths, arrays) -> _Program:
        def traced(*arrs):
            it = iter(arrs)
            model, args, kwargs = jax.tree_util.tree_unflatten(treedef, [next(it) if m else x for x, m in zip(values, mask)])
            out = (self.fn if model is None else model)(*args, **kwargs)
            nnx = sys.modules.get("flax.nnx")
            return out, [nnx.state(n) for n in _nodes((model, args, kwargs))]

        closed, shape = jax.make_jaxpr(traced, return_shape=True)(*arrays)
        return _Program(closed, jax.tree_util.tree_structure(shape),
                        [frozenset({_path(p)}) for p, m in zip(paths, mask) if m])

    def __call__(self, *args, **kwargs):
        root, prog, arrays = self._program(args, kwargs)
        outs = run(prog.closed, arrays, prog.paths, Gemms(self.policy, self.unsupported))
        out, states = jax.tree_util.tree_unflatten(prog.out_tree, outs)
        for node, state in zip(_nodes(root), states):  # nnx arguments mutated by fn
            sys.modules["flax.nnx"].update(node, state)
        return out

    def report(self, *args, **kwargs) -> Report:
        """The GEMMs ``fn(*args, **kwargs)`` runs, in program order, each with its config and
        status ("emulated", "native (policy)", "exact float32 (vjp)" or "unsupported: <reason>");
        traces only (nothing computed, nothing raised or warned for unsupported GEMMs)."""
        _, prog, arrays = self._program(args, kwargs)
        gemms = Gemms(self.policy, self.unsupported, collect=True)
        jax.eval_shape(lambda *a: run(prog.closed, a, prog.paths, gemms), *arrays)
        return Report(gemms.rows.values())

    def __repr__(self):
        return f"tcemu.emulate({getattr(self.fn, '__name__', self.fn)!s}, {self.policy!r})"


def emulate(fn, policy, *, unsupported: str = "error") -> Emulated:
    """``fn`` with every ``dot_general`` and ``conv_general_dilated`` in it (Flax nnx / linen,
    Equinox or plain JAX models, unchanged) run with tcemu's emulated tensor-core numerics.

    ``policy``: a :class:`tcemu.GemmConfig` (every GEMM), a :class:`tcemu.Policy`, or a callable
    ``op -> GemmConfig | None`` (``op`` a :class:`tcemu.GemmOp`; None runs it natively). The
    result has ``fn``'s signature and outputs, and composes with ``jax.jit``, ``jax.grad``,
    ``jax.vmap`` both ways round (``fn`` may differentiate inside: see ``Policy.backward``).
    ``fn`` is traced once per argument structure and shapes (``jax.make_jaxpr``; non-array leaves
    such as Python numbers are static, and the trace is kept per their values), and the trace is
    evaluated with the GEMMs emulated by
    ``tcemu.dot_general`` (convolutions as implicit GEMMs, K over (kernel taps, input channels),
    channel fastest: :mod:`tcemu._src.emulate.conv`). How JAX's higher-order primitives are
    handled (custom_jvp / custom_vjp functions with GEMMs inside lose their custom rule):
    :mod:`tcemu._src.emulate.interpret`. Flax nnx modules passed as arguments (or called as
    ``fn``) get the state ``fn`` leaves them in, as when called directly. An nnx or Equinox
    module called as ``fn`` is an argument too: its param paths start with "fn/". Under
    ``jax.jit`` the program is the one of the model written with ``tcemu.dot_general``; run
    eagerly, the jitted functions ``fn`` calls (``jnp.einsum``'s, for one) are evaluated op by
    op, which may change the last bits of what XLA would have compiled together.

    GEMMs tcemu cannot emulate (integer, complex or float64 operands, a config ``tcemu.dot_general``
    rejects for the shape, GEMMs inside primitives the interpreter cannot look into) raise a
    ValueError naming the op and the reason (``unsupported="error"``) or run natively with a
    warning per GEMM (``unsupported="native"``). ``.report(*args, **kwargs)`` lists every GEMM
    with its config and status without computing.

    >>> import jax, jax.numpy as jnp, tcemu
    >>> mm = tcemu.emulate(lambda x, w: x @ w, tcemu.GemmConfig(arch="H100"))
    >>> x = jnp.full((2, 16), 1 + 2.0**-10, jnp.float32); w = jnp.ones((16, 4), jnp.float32)
    >>> float((x @ w)[0, 0]), float(mm(x, w)[0, 0])          # bf16 inputs: 1 + 2**-10 rounds to 1
    (16.015625, 16.0)
    >>> jax.jit(jax.grad(lambda w: mm(x, w).sum()))(w)[0].tolist()   # dW = (bf16 x)^T dY
    [2.0, 2.0, 2.0, 2.0]
    """
    if not callable(fn):
        raise TypeError(f"emulate: fn must be callable, got {fn!r}")
    if not isinstance(unsupported, str) or unsupported not in UNSUPPORTED:
        raise ValueError(f"emulate: unsupported must be one of {', '.join(map(repr, UNSUPPORTED))}, got {unsupported!r}")
    return Emulated(fn, as_policy(policy), unsupported)

