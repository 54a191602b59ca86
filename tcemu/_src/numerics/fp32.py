"""IEEE binary32 arithmetic on bit patterns (uint32), in integers: what a CUDA core's FMUL, FADD
and FFMA compute (round to nearest even, subnormals kept, NaN canonical), the same on every
backend. XLA's own float32 arithmetic flushes subnormals on CPUs; the GEMM epilogues (scales,
alpha, beta, bias) and the block-scaled promotions use these instead.

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
from tcemu._src.numerics.words import Words

__all__ = ["add", "bits", "fma", "mul", "values"]
_U = jnp.uint32
_W = Words(_U)


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


def _product(dx, dy):
    """The exact product of two decoded significands (< 2**48) as ``hi * 2**16 + lo``, lo < 2**16."""
    sx, sy = dx.sig.astype(_U), dy.sig.astype(_U)
    xh, xl, yh, yl = sx >> 12, sx & _U(0xFFF), sy >> 12, sy & _U(0xFFF)
    mid = xh * yl + xl * yh  # < 2**25
    low = xl * yl + ((mid & _U(0xFFF)) << 12)  # < 2**25
    hi = (xh * yh << 8) + ((mid >> 12) << 8) + (low >> 16)
    return hi, low & _U(0xFFFF)


def mul(x_bits, y_bits):
    """``x * y`` of float32 bit patterns (broadcast), rounded to nearest even: the 48-bit product
    of the significands, exact in two words, rounded once. ``inf * 0`` and NaN give the canonical
    NaN; a zero product keeps the sign of the exact product."""
    x_bits, y_bits = jnp.broadcast_arrays(jnp.asarray(x_bits).astype(_U), jnp.asarray(y_bits).astype(_U))
    dx, dy = fm.decode(x_bits, fm.F32), fm.decode(y_bits, fm.F32)
    hi, lo = _product(dx, dy)
    sign = dx.sign ^ dy.sign
    out = round_pack(sign, hi, lo, dx.exp + dy.exp - 46, fm.F32, "rne", overflow="ieee")
    zero = (dx.sig == 0) | (dy.sig == 0)
    out = jnp.where(dx.is_inf | dy.is_inf, fm.F32.inf_bits(sign), out)
    nan = dx.is_nan | dy.is_nan | ((dx.is_inf | dy.is_inf) & zero)
    return jnp.where(nan, _U(fm.F32.canonical_nan), out)


def fma(x_bits, y_bits, z_bits):
    """``x * y + z`` of float32 bit patterns (broadcast), rounded once to nearest even (an FFMA):
    the exact 48-bit product and the addend placed in a 96-bit window (three words) with a
    sticky bit for what falls below it, added, and rounded. An exact zero sum is +0 unless both
    addends are -0; NaN operands and invalid operations give the canonical NaN.

    >>> import numpy as np
    >>> x = np.float32(1 + 2.0**-12)                      # x * x = 1 + 2**-11 + 2**-24
    >>> float(values(fma(bits(x), bits(x), bits(np.float32(-1.0))))) == 2.0**-11 + 2.0**-24
    True
    >>> float(x * x - np.float32(1)) == 2.0**-11            # the product rounded first
    True
    """
    x_bits, y_bits, z_bits = (a.astype(_U) for a in jnp.broadcast_arrays(*(jnp.asarray(v) for v in (x_bits, y_bits, z_bits))))
    dx, dy, dz = (fm.decode(v, fm.F32) for v in (x_bits, y_bits, z_bits))
    hi, lo = _product(dx, dy)
    p = (jnp.zeros_like(hi), hi >> 16, ((hi & _U(0xFFFF)) << 16) | lo)  # the product, three words
    c = (jnp.zeros_like(hi), jnp.zeros_like(hi), dz.sig.astype(_U))
    ep, ec = dx.exp + dy.exp - 46, dz.exp - 23  # exponents of bit 0
    pz, cz = (dx.sig == 0) | (dy.sig == 0), dz.sig == 0
    top = jnp.maximum(jnp.where(pz, -(1 << 20), ep + _W.top(p)), jnp.where(cz, -(1 << 20), ec + _W.top(c)))
    low = jnp.where(pz, ec, jnp.where(cz, ep, jnp.minimum(ep, ec)))
    L = jnp.maximum(low, top - 94)  # two bits of headroom for the carry
    P, stp = _W.shift(p, ep - L)
    C, stc = _W.shift(c, ec - L)
    sp = dx.sign ^ dy.sign
    same = sp == dz.sign
    R, p_ge, sticky = _W.signed_sum(P, stp & ~pz, C, stc & ~cz, same)
    sign = jnp.where(same, sp, jnp.where(p_ge, sp, dz.sign))
    # R * 2**L to round_pack's two words: the leading bit at bit 40, what falls below into a sticky bit
    sh = _W.top(R) - 41
    (_, r1, r0), lost = _W.shift(R, -sh)
    m = r1 * _U(1 << 16) + (r0 >> 16)  # < 2**25
    lo = (r0 & _U(0xFFFF)) | (lost | sticky).astype(_U)
    out = round_pack(sign, m, lo, L + sh, fm.F32, "rne", overflow="ieee")
    nonzero = (R[0] | R[1] | R[2]) != 0
    zsign = jnp.where(same, sp, 0)  # an exact zero: -0 only as -0 + -0
    out = jnp.where(nonzero | sticky, out, zsign.astype(_U) << 31)
    p_nan = dx.is_nan | dy.is_nan | (dx.is_inf & (dy.sig == 0)) | (dy.is_inf & (dx.sig == 0))
    p_inf = (dx.is_inf | dy.is_inf) & ~p_nan
    out = jnp.where(p_inf | dz.is_inf, fm.F32.inf_bits(jnp.where(p_inf, sp, dz.sign)), out)
    nan = p_nan | dz.is_nan | (p_inf & dz.is_inf & (sp != dz.sign))
    return jnp.where(nan, _U(fm.F32.canonical_nan), out)
