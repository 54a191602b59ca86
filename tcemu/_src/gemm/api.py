"""The public GEMM entry points: :func:`matmul`, :func:`dot_general` (a ``jax.lax.dot_general``
drop-in for Flax/Equinox layers) and :func:`einsum`, each checking its arguments and running the
pipeline (config -> quantise -> plan -> execute -> reduce -> epilogue, differentiable).

    >>> import functools, jax.numpy as jnp, tcemu
    >>> dot = functools.partial(tcemu.dot_general, config=tcemu.GemmConfig(arch="A100"))
    >>> dot(jnp.ones((2, 8)), jnp.ones((8, 3)), (((1,), (0,)), ((), ()))).tolist()[0]
    [8.0, 8.0, 8.0]
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from tcemu._src.checks import check_key, real_array
from tcemu._src.gemm.autodiff import emulated_matmul
from tcemu._src.gemm.config import GemmConfig, as_config


def matmul(a, b, *, config: GemmConfig | None = None, key=None, **kwargs):
    """``a @ b`` for (..., M, K) and (..., K, N) (or (K, N)) with a tensor core's exact numerics.

    ``config`` (a :class:`GemmConfig`) or its fields as keywords (``arch=``, ``instruction=``,
    ``k_order=``, ...). Inputs are rounded to the instruction's formats (straight-through
    gradient); the result is float32 (float16 for f16-accumulating instructions, widened).
    Differentiable: the backward GEMMs follow ``config.grad_lhs`` / ``config.grad_rhs``.
    ``key``: PRNG key for stochastic quantisation or rounding. With K = 0 the result is +0 (the
    accumulator's initial value), with M = 0 or N = 0 an empty array, as ``jnp.matmul`` gives.

    >>> import jax.numpy as jnp, tcemu
    >>> a = jnp.array([[1.0] + [2.0**-12] * 4], jnp.bfloat16)      # 1 + four products of 2**-25
    >>> b = jnp.array([[1.0] + [2.0**-13] * 4], jnp.bfloat16).T
    >>> [float(tcemu.matmul(a, b, arch=g)[0, 0]) for g in ("A100", "H100")]   # 24 and 25 fraction bits
    [1.0, 1.0000001192092896]
    """
    cfg = as_config(config, kwargs, "matmul")
    key = check_key(key, "matmul")
    a = real_array(a, "matmul", "a")
    b = real_array(b, "matmul", "b")
    if a.ndim < 2 or b.ndim < 2 or a.shape[-1] != b.shape[-2]:
        raise ValueError(f"matmul needs (..., M, K) @ (..., K, N), got {a.shape} and {b.shape}")
    batch = a.shape[:-2]
    if b.ndim > 2:
        try:
            batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        except ValueError:
            raise ValueError(f"matmul: the batch axes of a {a.shape} and b {b.shape} do not broadcast "
                             f"({a.shape[:-2]} vs {b.shape[:-2]})") from None
    if cfg.quantize == "stochastic" and key is None:
        raise ValueError("quantize='stochastic' needs key=jax.random.key(...)")
    out_shape = tuple(batch) + (a.shape[-2], b.shape[-1])
    if a.shape[-1] == 0 or 0 in out_shape:  # no products: D = +0, the chain's first C
        return jnp.zeros(out_shape, jnp.float32)
    return emulated_matmul(a, b, key, cfg)


def _dimension_numbers(dimension_numbers, lhs, rhs):
    """Checked ((lhs_contracting, rhs_contracting), (lhs_batch, rhs_batch)) as tuples of ints,
    with the rules of :func:`jax.lax.dot_general`."""
    form = "((lhs_contracting, rhs_contracting), (lhs_batch, rhs_batch))"
    try:
        (lc, rc), (lb, rb) = dimension_numbers
        dims = [tuple(d) for d in (lc, rc, lb, rb)]
    except (TypeError, ValueError):
        raise TypeError(f"dot_general: dimension_numbers must be {form} (sequences of ints), "
                        f"got {dimension_numbers!r}") from None
    names = ("lhs_contracting", "rhs_contracting", "lhs_batch", "rhs_batch")
    for name, d, x in zip(names, dims, (lhs, rhs, lhs, rhs)):
        if any(not isinstance(i, (int, np.integer)) or isinstance(i, (bool, np.bool_)) for i in d):
            raise TypeError(f"dot_general: dimension_numbers {name} must be ints, got {d}")
        if any(not 0 <= i < x.ndim for i in d):
            raise ValueError(f"dot_general: dimension_numbers {name} {d} out of range for an operand of rank "
                             f"{x.ndim} (valid: 0..{x.ndim - 1}; negative dimensions are not accepted, as in "
                             "jax.lax.dot_general)")
    lc, rc, lb, rb = (tuple(int(i) for i in d) for d in dims)
    for side, c, bt in (("lhs", lc, lb), ("rhs", rc, rb)):
        if len(set(c + bt)) != len(c + bt):
            raise ValueError(f"dot_general: dimension_numbers {side} contracting {c} and batch {bt} dimensions "
                             "must be distinct")
    for what, ld, rd in (("contracting", lc, rc), ("batch", lb, rb)):
        if len(ld) != len(rd):
            raise ValueError(f"dot_general: dimension_numbers give {len(ld)} lhs and {len(rd)} rhs {what} dimensions")
        ls, rs = tuple(lhs.shape[i] for i in ld), tuple(rhs.shape[i] for i in rd)
        if ls != rs:
            raise ValueError(f"dot_general: dimension_numbers {what} dimensions {ld} of lhs {lhs.shape} and {rd} of "
                             f"rhs {rhs.shape} have sizes {ls} and {rs}")
    return lc, rc, lb, rb


def dot_general(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None, *,
                out_sharding=None, config: GemmConfig | None = None, key=None):
    """Drop-in for :func:`jax.lax.dot_general` computing with :func:`matmul`'s emulated numerics.

    Use ``functools.partial(tcemu.dot_general, config=tcemu.GemmConfig(...))`` as the
    ``dot_general`` of ``flax.nnx.Linear`` / ``flax.linen.Dense``. ``precision`` is ignored (the
    config decides); ``preferred_element_type`` sets the output dtype (default: the promoted
    input dtype, as in JAX).

    >>> import jax.numpy as jnp, tcemu
    >>> x = jnp.ones((8, 2), jnp.bfloat16); y = jnp.ones((8, 3), jnp.bfloat16)
    >>> out = tcemu.dot_general(x, y, (((0,), (0,)), ((), ())), config=tcemu.GemmConfig(arch="H100"))
    >>> out.shape, out.dtype, float(out[0, 0])                  # x.T @ y
    ((2, 3), dtype(bfloat16), 8.0)
    """
    cfg = as_config(config, {}, "dot_general")
    lhs = real_array(lhs, "dot_general", "lhs")
    rhs = real_array(rhs, "dot_general", "rhs")
    lc, rc, lb, rb = _dimension_numbers(dimension_numbers, lhs, rhs)
    try:
        dtype = jnp.dtype(preferred_element_type or jnp.result_type(lhs.dtype, rhs.dtype))
    except TypeError:
        raise TypeError(f"dot_general: preferred_element_type must be a dtype such as jnp.float32, "
                        f"got {preferred_element_type!r}") from None
    lf = [i for i in range(lhs.ndim) if i not in lc and i not in lb]
    rf = [i for i in range(rhs.ndim) if i not in rc and i not in rb]
    ls, rs = lhs.shape, rhs.shape
    size = lambda shape, idx: int(np.prod([shape[i] for i in idx], dtype=np.int64))  # noqa: E731
    L = jnp.transpose(lhs, lb + tuple(lf) + lc).reshape(size(ls, lb), size(ls, lf), size(ls, lc))
    R = jnp.transpose(rhs, rb + rc + tuple(rf)).reshape(size(rs, rb), size(rs, rc), size(rs, rf))
    out = matmul(L if lb else L[0], R if rb else R[0], config=cfg, key=key)
    out = out.reshape(tuple(ls[i] for i in lb) + tuple(ls[i] for i in lf) + tuple(rs[i] for i in rf))
    out = out.astype(dtype)
    if out_sharding is not None:
        out = jax.lax.with_sharding_constraint(out, out_sharding)
    return out


def einsum(subscripts, *operands, config: GemmConfig | None = None, key=None, **kwargs):
    """:func:`jax.numpy.einsum` whose contractions run through :func:`dot_general`. Subscripts
    that do not fit the operands raise a ValueError naming ``subscripts``.

    >>> import jax.numpy as jnp, tcemu
    >>> a = jnp.ones((2, 1, 16), jnp.float16); b = jnp.ones((2, 16, 3), jnp.float16)
    >>> out = tcemu.einsum("bij,bjk->bik", a, b, config=tcemu.GemmConfig(arch="A100"))
    >>> out.shape, out[1].tolist()
    ((2, 1, 3), [[16.0, 16.0, 16.0]])
    """
    cfg = as_config(config, {}, "einsum")
    dg = functools.partial(dot_general, config=cfg, key=check_key(key, "einsum"))
    if not isinstance(subscripts, str):
        raise TypeError(f"einsum: subscripts must be a string such as 'ij,jk->ik', got {type(subscripts).__name__}")
    operands = [real_array(x, "einsum", f"operand {i}") for i, x in enumerate(operands)]
    try:  # jnp.einsum's own checks of the subscripts against the operands, before any contraction
        jax.eval_shape(lambda *xs: jnp.einsum(subscripts, *xs, **kwargs), *operands)
    except (ValueError, TypeError, IndexError) as e:
        raise ValueError(f"einsum: subscripts {subscripts!r} do not fit operands of shapes "
                         f"{[x.shape for x in operands]}: {e}") from None
    return jnp.einsum(subscripts, *operands, _dot_general=dg, **kwargs)
