"""IEEE binary32 arithmetic on bit patterns (uint32), in integers: what a CUDA core's FMUL and
FADD compute (round to nearest even, subnormals kept, NaN canonical), the same on every backend.
XLA's own float32 arithmetic flushes subnormals on CPUs; the GEMM epilogues (scales, alpha,
beta, bias) use these instead.

    >>> import jax.numpy as jnp, numpy as np
    >>> x = jnp.float32([3.0, 1e-38, 2.0**-100]); y = jnp.float32([1 / 3, 0.5, 2.0**-40])
    >>> out = mul(bits(x), bits(y))
    >>> values(out).tolist() == (np.float32([3.0, 1e-38, 2.0**-100]) * np.float32([1 / 3, 0.5, 2.0**-40])).tolist()
    True
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from tcemu._src import formats as fm
from tcemu._src.numerics import fused_block
from tcemu._src.numerics.rounding import round_pack

__all__ = ["add", "bits", "mul", "values"]
_U = jnp.uint32


def bits(x):
    """The bit patterns (uint32) of float32 values (exact, no arithmetic)."""
    return jax.lax.bitcast_convert_type(jnp.asarray(x, jnp.float32), _U)


def values(b):
    """float32 values of bit patterns (exact, no arithmetic)."""
    return jax.lax.bitcast_convert_type(jnp.asarray(b).astype(_U), jnp.float32)


def add(x_bits, y_bits):
    """``x + y`` of float32 bit patterns (broadcast), rounded to nearest even (a FADD)."""
    x_bits, y_bits = jnp.broadcast_arrays(jnp.asarray(x_bits).astype(_U), jnp.asarray(y_bits).astype(_U))
    shape = x_bits.shape
    return fused_block.add(x_bits.reshape(-1, 1), y_bits.reshape(-1, 1)).reshape(shape)


def mul(x_bits, y_bits):
    """``x * y`` of float32 bit patterns (broadcast), rounded to nearest even: the 48-bit product
    of the significands, exact in two words, rounded once. ``inf * 0`` and NaN give the canonical
    NaN; a zero product keeps the sign of the exact product."""
    x_bits, y_bits = jnp.broadcast_arrays(jnp.asarray(x_bits).astype(_U), jnp.asarray(y_bits).astype(_U))
    dx, dy = fm.decode(x_bits, fm.F32), fm.decode(y_bits, fm.F32)
    sx, sy = dx.sig.astype(_U), dy.sig.astype(_U)
    xh, xl, yh, yl = sx >> 12, sx & _U(0xFFF), sy >> 12, sy & _U(0xFFF)
    mid = xh * yl + xl * yh  # < 2**25
    low = xl * yl + ((mid & _U(0xFFF)) << 12)  # < 2**25
    hi = (xh * yh << 8) + ((mid >> 12) << 8) + (low >> 16)  # product = hi * 2**16 + lo
    lo = low & _U(0xFFFF)
    sign = dx.sign ^ dy.sign
    out = round_pack(sign, hi, lo, dx.exp + dy.exp - 46, fm.F32, "rne", overflow="ieee")
    zero = (dx.sig == 0) | (dy.sig == 0)
    out = jnp.where(dx.is_inf | dy.is_inf, fm.F32.inf_bits(sign), out)
    nan = dx.is_nan | dy.is_nan | ((dx.is_inf | dy.is_inf) & zero)
    return jnp.where(nan, _U(fm.F32.canonical_nan), out)
