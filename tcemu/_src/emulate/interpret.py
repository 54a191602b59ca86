"""The jaxpr interpreter behind :func:`tcemu.emulate`: evaluates a jaxpr equation by equation,
binding every primitive as it is except the GEMMs (:mod:`.gemms`), and looks into the
higher-order primitives that hold GEMMs.

Higher-order primitives whose jaxprs hold no GEMM anywhere are bound unchanged (so their results,
and custom differentiation rules such as ``jax.nn.relu``'s, stay those of JAX). Those that do:

* ``jit`` / ``pjit``, ``closed_call``: the inner jaxpr is evaluated in place;
* ``custom_jvp_call`` / ``custom_vjp_call``: the primal jaxpr is evaluated in place, **dropping
  the custom rule**: derivatives then come from the emulated GEMMs' own VJP and JAX's rules for
  the rest;
* ``remat`` / ``checkpoint``: ``jax.checkpoint`` (same ``policy`` and ``prevent_cse``) of the
  interpreted jaxpr; ``scan``, ``while``, ``cond``, ``shard_map``: ``jax.lax.scan`` (same
  ``length``, ``reverse``, ``unroll``), ``jax.lax.while_loop``, ``jax.lax.switch`` and
  ``jax.shard_map`` (same mesh and specs) of the interpreted jaxprs, each traced by JAX;
* any other primitive: its GEMMs are unsupported (an error, or native with a warning).

Each value also carries the key paths of the arguments it comes from through layout ops
(reshape, transpose, convert_element_type, broadcast_in_dim, squeeze, expand_dims, copy), slices
(``slice``, ``dynamic_slice``, and a ``scan`` over stacked weights) and calls: the ``params`` of
the GEMMs it feeds.

    >>> import jax, jax.numpy as jnp, tcemu
    >>> from tcemu._src.emulate.gemms import Gemms
    >>> from tcemu._src.emulate.interpret import run
    >>> from tcemu._src.emulate.policy import as_policy
    >>> f = jax.jit(lambda x, w: jnp.tanh(jax.lax.scan(lambda c, _: (c @ w, None), x, length=2)[0]))
    >>> closed = jax.make_jaxpr(f)(jnp.ones((2, 8), jnp.float32), jnp.eye(8, dtype=jnp.float32))
    >>> g = Gemms(as_policy(tcemu.GemmConfig(arch="H100")), "error")
    >>> out = run(closed, [jnp.ones((2, 8), jnp.float32), jnp.eye(8, dtype=jnp.float32)], [frozenset({"0"}), frozenset({"1"})], g)
    >>> [(r.status, r.op.params) for r in g.rows.values()]
    [('emulated', ('1',))]
"""
from __future__ import annotations

import contextlib
import functools
import weakref

import jax
from jax.extend import core as jcore

from tcemu._src.emulate.gemms import Gemms
from tcemu._src.emulate.ops import GEMMS, op_of

EMPTY = frozenset()
# ops whose output is (part of) their first operand, laid out or typed anew: params pass through
LAYOUT = ("reshape", "transpose", "convert_element_type", "broadcast_in_dim", "squeeze", "expand_dims", "copy",
          "copy_p", "slice", "dynamic_slice")
PASS = ("jit", "pjit", "closed_call", "core_call")  # calls evaluated in place whose outputs keep param paths
CUSTOM = ("custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr")
REMAT = ("remat2", "checkpoint", "remat")

_HAS_GEMM: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def has_gemm(jaxpr) -> bool:
    """Whether ``jaxpr`` (a Jaxpr) holds a GEMM, at any depth."""
    try:
        return _HAS_GEMM[jaxpr]
    except (KeyError, TypeError):
        pass
    out = any(e.primitive.name in GEMMS or any(has_gemm(j) for j in jcore.jaxprs_in_params(e.params))
              for e in jaxpr.eqns)
    with contextlib.suppress(TypeError):
        _HAS_GEMM[jaxpr] = out
    return out


def join(scope: str, inner: str) -> str:
    """An inner name scope under an outer one."""
    return f"{scope}/{inner}" if scope and inner else scope or inner


def scope_of(eqn, scope: str) -> str:
    return join(scope, str(eqn.source_info.name_stack))


def gemm_sites(params, scope: str):
    """(eqn, scope) of every GEMM in the jaxprs of ``params``, depth first."""
    for jaxpr in jcore.jaxprs_in_params(params):
        for e in jaxpr.eqns:
            if e.primitive.name in GEMMS:
                yield e, scope_of(e, scope)
            yield from gemm_sites(e.params, scope_of(e, scope))


def _closed(j):
    """(jaxpr, consts) of a ClosedJaxpr or a Jaxpr."""
    return (j.jaxpr, j.consts) if isinstance(j, jcore.ClosedJaxpr) else (j, ())


def _inner(params):
    return _closed(params["jaxpr"] if "jaxpr" in params else params["call_jaxpr"])


def _read(env, v, default=None):
    if isinstance(v, jcore.Literal):
        return default if default is not None else v.val
    return env[v] if default is None else env.get(v, default)


def walk_paths(jaxpr, paths) -> list:
    """The param paths of ``jaxpr``'s outputs, from those of its inputs (no evaluation)."""
    prov = dict(zip(jaxpr.invars, paths))
    for e in jaxpr.eqns:
        for v, p in zip(e.outvars, static_paths(e, [_read(prov, v, EMPTY) for v in e.invars])):
            prov[v] = p
    return [_read(prov, v, EMPTY) for v in jaxpr.outvars]


def static_paths(eqn, paths) -> list:
    """The param paths of an equation's outputs: through layout ops and calls, else none."""
    name = eqn.primitive.name
    if name in LAYOUT:
        return [paths[0]]
    if name in PASS:
        return walk_paths(_inner(eqn.params)[0], paths)
    return [EMPTY] * len(eqn.outvars)


def bind(eqn, invals) -> list:
    """The equation's primitive bound on ``invals``, as ``jax.core.eval_jaxpr`` binds it."""
    params = eqn.primitive.get_bind_params(eqn.params)
    subfuns, params = params if isinstance(params, tuple) else ((), params)  # (subfuns, params) before jax 0.8
    ctx = getattr(eqn, "ctx", None)
    with ctx.manager if ctx is not None else contextlib.nullcontext():
        out = eqn.primitive.bind(*subfuns, *invals, **params)
    return list(out) if eqn.primitive.multiple_results else [out]


def _scan_counts(params, invals) -> tuple[int, int]:
    """(consts, carry) counts of a scan's operands: its ``num_consts`` / ``num_carry`` params
    (jax <= 0.10), or its ``ft_in`` FlatTree of (consts, carry, xs) (jax >= 0.11)."""
    if "num_consts" in params:
        return params["num_consts"], params["num_carry"]
    consts, carry, _ = params["ft_in"].update(list(invals)).unpack()
    return len(list(consts)), len(list(carry))


class Interpreter:
    """Evaluates jaxprs with the GEMMs handed to ``gemms``; ``site`` is the stack of enclosing
    equations (a GEMM's site, so the report has one row per GEMM, however often JAX traces it)."""

    def __init__(self, gemms: Gemms):
        self.gemms = gemms
        self.site: tuple = ()

    def eval(self, jaxpr, consts, args, scope: str, paths):
        """(outputs, their param paths) of ``jaxpr`` on ``args``."""
        env, prov = dict(zip(jaxpr.constvars, consts)), {}
        for v, x, p in zip(jaxpr.invars, args, paths):
            env[v], prov[v] = x, p
        for eqn in jaxpr.eqns:
            invals = [_read(env, v) for v in eqn.invars]
            outs, outpaths = self.eqn(eqn, invals, scope_of(eqn, scope), [_read(prov, v, EMPTY) for v in eqn.invars])
            for v, x, p in zip(eqn.outvars, outs, outpaths):
                env[v], prov[v] = x, p
        return [_read(env, v) for v in jaxpr.outvars], [_read(prov, v, EMPTY) for v in jaxpr.outvars]

    def eqn(self, eqn, invals, scope: str, paths):
        site = self.site + (id(eqn),)
        if eqn.primitive.name in GEMMS:
            params = tuple(sorted(paths[0] | paths[1]))
            return self.gemms.run(eqn, invals, scope, params, site), [EMPTY]
        if not any(has_gemm(j) for j in jcore.jaxprs_in_params(eqn.params)):
            outs = bind(eqn, invals)
            self.gemms.follow(eqn, invals, outs)
            return outs, static_paths(eqn, paths)
        handler = _HANDLERS.get(eqn.primitive.name, Interpreter._opaque)
        saved, self.site = self.site, site
        try:
            return handler(self, eqn, invals, scope, paths)
        finally:
            self.site = saved

    def traced(self, jaxpr, consts, args, scope: str, paths) -> list:
        """``jaxpr``'s outputs inside a function JAX traces (its own forward operands)."""
        saved, self.gemms.records = self.gemms.records, {}
        try:
            return self.eval(jaxpr, consts, args, scope, paths)[0]
        finally:
            self.gemms.records = saved

    def _inline(self, eqn, invals, scope, paths):
        jaxpr, consts = _inner(eqn.params)
        outs, outpaths = self.eval(jaxpr, consts, invals, scope, paths)
        return outs, outpaths if eqn.primitive.name in PASS else [EMPTY] * len(outs)

    def _remat(self, eqn, invals, scope, paths):
        p = eqn.params
        jaxpr, consts = _inner(p)
        fun = lambda *a: self.traced(jaxpr, consts, a, scope, paths)  # noqa: E731
        outs = jax.checkpoint(fun, prevent_cse=p.get("prevent_cse", True), policy=p.get("policy"))(*invals)
        return list(outs), walk_paths(jaxpr, paths)

    def _scan(self, eqn, invals, scope, paths):
        p = eqn.params
        jaxpr, consts = _closed(p["jaxpr"])
        nc, nk = _scan_counts(p, invals)
        inner_paths = [*paths[:nc], *[EMPTY] * nk, *paths[nc + nk:]]  # a slice of xs keeps its param path

        def body(carry, xs):
            outs = self.traced(jaxpr, consts, [*invals[:nc], *carry, *xs], scope, inner_paths)
            return outs[:nk], outs[nk:]

        carry, ys = jax.lax.scan(body, list(invals[nc:nc + nk]), list(invals[nc + nk:]), length=p["length"],
                                 reverse=p["reverse"], unroll=p["unroll"])
        return [*carry, *ys], [EMPTY] * len(eqn.outvars)

    def _while(self, eqn, invals, scope, paths):
        p = eqn.params
        cn, bn = p["cond_nconsts"], p["body_nconsts"]
        (cj, cc), (bj, bc) = _closed(p["cond_jaxpr"]), _closed(p["body_jaxpr"])
        init = invals[cn + bn:]
        free = [EMPTY] * len(init)
        cond = lambda c: self.traced(cj, cc, [*invals[:cn], *c], scope, [*paths[:cn], *free])[0]  # noqa: E731
        body = lambda c: self.traced(bj, bc, [*invals[cn:cn + bn], *c], scope, [*paths[cn:cn + bn], *free])  # noqa: E731
        return list(jax.lax.while_loop(cond, body, list(init))), free

    def _cond(self, eqn, invals, scope, paths):
        def branch(closed, *ops):
            return self.traced(*_closed(closed), ops, scope, paths[1:])

        fns = [functools.partial(branch, b) for b in eqn.params["branches"]]
        return list(jax.lax.switch(invals[0], fns, *invals[1:])), [EMPTY] * len(eqn.outvars)

    def _shard_map(self, eqn, invals, scope, paths):
        p = eqn.params
        jaxpr, consts = _closed(p["jaxpr"])
        fun = lambda *a: tuple(self.traced(jaxpr, consts, a, scope, paths))  # noqa: E731
        f = jax.shard_map(fun, mesh=p["mesh"], in_specs=tuple(p["in_specs"]), out_specs=tuple(p["out_specs"]),
                          axis_names=set(p.get("newly_manual_axes") or ()), check_vma=p.get("check_vma", True))
        return list(f(*invals)), [EMPTY] * len(eqn.outvars)

    def _opaque(self, eqn, invals, scope, paths):
        """A primitive holding GEMMs that the interpreter cannot look into: bound unchanged."""
        for inner, s in gemm_sites(eqn.params, scope):
            self.gemms.opaque(op_of(inner, s, ()), self.site + (id(inner),), eqn.primitive.name)
        return bind(eqn, invals), [EMPTY] * len(eqn.outvars)


_HANDLERS = {**{n: Interpreter._inline for n in PASS + CUSTOM}, **{n: Interpreter._remat for n in REMAT},
             "scan": Interpreter._scan, "while": Interpreter._while, "cond": Interpreter._cond,
             "shard_map": Interpreter._shard_map}


def run(closed, args, paths, gemms: Gemms) -> list:
    """The outputs of the ClosedJaxpr ``closed`` on ``args`` (``paths``: each argument's param
    paths, frozensets), its GEMMs run by ``gemms``."""
    return Interpreter(gemms).eval(closed.jaxpr, closed.consts, args, "", paths)[0]
