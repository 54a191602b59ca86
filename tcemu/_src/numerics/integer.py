"""Integer and single-bit MMAs: exact dot products, int32 accumulation that wraps or saturates.

Products of 8-bit (or 4-bit, 1-bit) integers and their sum over one instruction's K fit in int32
exactly; only the addition of C can overflow. Without ``.satfinite`` it wraps modulo 2**32, with
it the result is clamped to [-2**31, 2**31 - 1] (PTX ISA, wmma.mma / mma "Saturation").

    >>> import jax.numpy as jnp
    >>> from tcemu._src.numerics.integer import int_mma
    >>> a = jnp.full((1, 16), 127, jnp.int32); b = jnp.full((16, 1), 127, jnp.int32)
    >>> int(int_mma(a, b, jnp.full((1, 1), 2**31 - 1000, jnp.int32), satfinite=True)[0, 0])
    2147483647
"""
from __future__ import annotations

import jax.numpy as jnp

INT32_MIN, INT32_MAX = -(2 ** 31), 2 ** 31 - 1


def _add(c, p, satfinite: bool):
    d = c + p  # int32 addition wraps
    if satfinite:
        over = ((c ^ d) & (p ^ d)) < 0
        d = jnp.where(over, jnp.where(c < 0, jnp.int32(INT32_MIN), jnp.int32(INT32_MAX)), d)
    return d


def int_mma(a, b, c, *, satfinite: bool = False):
    """``c + a @ b`` for int32-valued a (..., M, K), b (..., K, N), c (..., M, N)."""
    p = jnp.matmul(a.astype(jnp.int32), b.astype(jnp.int32), preferred_element_type=jnp.int32)
    return _add(c.astype(jnp.int32), p, satfinite)


def b1_mma(a, b, c, *, op: str):
    """``c + popc(row_i(a) OP col_j(b))`` for 0/1 matrices; OP is "and" or "xor"."""
    a = a.astype(jnp.int32)
    b = b.astype(jnp.int32)
    both = jnp.matmul(a, b, preferred_element_type=jnp.int32)
    if op == "and":
        p = both
    elif op == "xor":
        p = jnp.sum(a, -1, dtype=jnp.int32)[..., :, None] + jnp.sum(b, -2, dtype=jnp.int32)[..., None, :] - 2 * both
    else:
        raise ValueError(f"b1 op must be 'and' or 'xor', got {op!r}")
    return _add(c.astype(jnp.int32), p, False)
