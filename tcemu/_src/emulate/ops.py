"""The GEMMs of a jaxpr as :class:`GemmOp` descriptions: which primitive, where (name scope),
fed by which arguments, the operands' shapes and types and the GEMM's M, N, K and batch.

    >>> import jax, jax.numpy as jnp
    >>> from tcemu._src.emulate.ops import op_of
    >>> eqn = jax.make_jaxpr(lambda a, b: a @ b)(jnp.ones((2, 8), jnp.float32), jnp.ones((8, 3), jnp.float32)).jaxpr.eqns[0]
    >>> op = op_of(eqn, "mlp", ("0",))
    >>> (op.M, op.N, op.K, op.batch, op.backward), str(op)
    ((2, 3, 8, None, False), "dot_general 'mlp' float32[2,8] x float32[8,3] -> float32 (M=2 N=3 K=8) params 0")

A GEMM is a gradient GEMM (``backward``) when its name stack shows it was made by JAX's
transpose (``transpose(jvp(...))``), except forward GEMMs recomputed for ``jax.checkpoint``
(``.../rematted_computation/...``).
"""
from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp
import numpy as np

GEMMS = ("dot_general", "conv_general_dilated")


@dataclasses.dataclass(frozen=True)
class GemmOp:
    """One GEMM of a function run through :func:`tcemu.emulate`: what a :class:`tcemu.Policy`
    matches and a policy callable receives.

    Attributes:
      primitive: "dot_general" or "conv_general_dilated".
      scope: the name scope (``jax.named_scope``, Flax linen module paths; JAX's transforms show
        as ``jvp(...)`` / ``transpose(jvp(...))``), e.g. "D/mlp_in".
      params: key paths (form "0/l1/kernel/value": positional argument index or keyword name,
        then attribute names, dict keys and sequence indices joined by "/") of the argument
        leaves that feed lhs or rhs through layout and type conversions only.
      lhs_shape, rhs_shape: operand shapes; lhs_dtype, rhs_dtype, out_dtype: dtype names.
      M, N, K, batch: the GEMM (a convolution's implicit GEMM: M = batch x output pixels,
        N = output channels and K = kernel taps x input channels, per group); ``batch`` is the
        product of the batch dimensions (a convolution's groups), None without any.
      backward: a gradient GEMM made by JAX's transpose inside the function.
      dimension_numbers: the primitive's ``dimension_numbers``.

    >>> import tcemu
    >>> op = tcemu.GemmOp("dot_general", "attn", (), (4, 8), (8, 4), "bfloat16", "bfloat16", "float32",
    ...                   4, 4, 8, None, False, (((1,), (0,)), ((), ())))
    >>> op.K, op.backward
    (8, False)
    """

    primitive: str
    scope: str
    params: tuple
    lhs_shape: tuple
    rhs_shape: tuple
    lhs_dtype: str
    rhs_dtype: str
    out_dtype: str
    M: int
    N: int
    K: int
    batch: int | None
    backward: bool
    dimension_numbers: object

    def __str__(self):
        shape = lambda s: ",".join(map(str, s))  # noqa: E731
        out = (f"{self.primitive} {self.scope!r} {self.lhs_dtype}[{shape(self.lhs_shape)}] x "
               f"{self.rhs_dtype}[{shape(self.rhs_shape)}] -> {self.out_dtype} (M={self.M} N={self.N} K={self.K}"
               f"{'' if self.batch is None else f' batch={self.batch}'})")
        return out + (f" params {', '.join(self.params)}" if self.params else "")


def is_backward(scope: str) -> bool:
    """A gradient GEMM: made by JAX's transpose, not a forward GEMM recomputed for remat."""
    return "transpose(" in scope and "rematted_computation" not in scope


def _prod(xs) -> int:
    return int(math.prod(int(x) for x in xs))


def gemm_sizes(primitive: str, params: dict, lhs_shape, rhs_shape, out_shape):
    """(M, N, K, batch) of a dot_general, or of a convolution's implicit GEMM per group."""
    if primitive == "dot_general":
        (lc, rc), (lb, rb) = params["dimension_numbers"]
        M = _prod(lhs_shape[i] for i in range(len(lhs_shape)) if i not in lc and i not in lb)
        N = _prod(rhs_shape[i] for i in range(len(rhs_shape)) if i not in rc and i not in rb)
        return M, N, _prod(lhs_shape[i] for i in lc), (_prod(lhs_shape[i] for i in lb) if lb else None)
    lhs_spec, rhs_spec, out_spec = params["dimension_numbers"]
    groups = params["feature_group_count"] * params["batch_group_count"]
    M = _prod(out_shape[d] for d in (out_spec[0],) + tuple(out_spec[2:]))
    K = _prod(rhs_shape[d] for d in rhs_spec[1:])
    return M, rhs_shape[rhs_spec[0]] // groups, K, (groups if groups > 1 else None)


def op_of(eqn, scope: str, params: tuple) -> GemmOp:
    """The :class:`GemmOp` of a dot_general / conv_general_dilated equation."""
    lhs, rhs = (v.aval for v in eqn.invars[:2])
    out = eqn.outvars[0].aval
    M, N, K, batch = gemm_sizes(eqn.primitive.name, eqn.params, lhs.shape, rhs.shape, out.shape)
    name = lambda a: np.dtype(a.dtype).name  # noqa: E731
    return GemmOp(eqn.primitive.name, scope, tuple(params), tuple(lhs.shape), tuple(rhs.shape), name(lhs), name(rhs),
                  name(out), M, N, K, batch, is_backward(scope), eqn.params.get("dimension_numbers"))


def operand_problem(op: GemmOp) -> str | None:
    """Why tcemu's GEMM cannot emulate ``op`` whatever the config (its types), or None."""
    for what, name in (("lhs", op.lhs_dtype), ("rhs", op.rhs_dtype), ("output", op.out_dtype)):
        dt = np.dtype(name)
        if not jnp.issubdtype(dt, jnp.floating):
            return (f"{what} is {name}: tcemu's GEMM emulates floating-point tensor-core instructions only "
                    "(no integer, bool or complex GEMMs)")
        if what != "output" and dt.itemsize > 4:
            return (f"{what} is {name}: tcemu's GEMM emulates tensor-core instructions with inputs of at most "
                    "32 bits (f16, bf16, tf32, fp8, fp6, fp4); float64 GEMMs have no emulation")
    return None
