"""Conversions between float formats on bit patterns (PTX ``cvt``): exact widening, narrowing
rounded once in any of the rounding modes of :func:`~tcemu._src.numerics.rounding.round_pack32`
(tf32 from binary32 directly on the bit patterns), and :func:`encode` for the bit patterns of
float32 values of any format, fp6 included. All in uint32 arithmetic, as the fused block is.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from tcemu._src import formats as fm
from tcemu._src.numerics.rounding import round_pack32


def convert(bits, src: fm.FloatFormat, dst: fm.FloatFormat, mode: str = "rne", *,
            overflow: str = "ieee", rand=None):
    """Convert float bit patterns between formats (``cvt``): exact widening, rounded narrowing.
    NaN becomes the destination's canonical NaN."""
    if (src is fm.F32 and dst.exponent_bits == 8 and dst.shift and dst.shift + dst.fraction_bits == 23
            and mode in _FRACTION_ROUNDING and overflow == "ieee" and rand is None):
        return _round_fraction(bits, dst, mode)
    d = fm.decode(bits, src)
    sig = d.sig.astype(jnp.uint32)
    out = round_pack32(d.sign, sig, d.exp - src.fraction_bits, dst, mode, overflow=overflow, rand=rand)
    out = jnp.where(d.is_inf, dst.inf_bits(d.sign), out)
    return jnp.where(d.is_nan, jnp.uint32(dst.canonical_nan), out)


_FRACTION_ROUNDING = ("rz", "rne", "rna")


def _round_fraction(bits, dst: fm.FloatFormat, mode: str):
    """:func:`convert` from binary32 to a format with its exponent field and fewer fraction bits
    (tf32), on the bit patterns: the magnitude's pattern rounded at the destination's last
    fraction bit (a carry moves into the exponent, up to infinity), sign and NaN apart."""
    bits = jnp.asarray(bits).astype(jnp.uint32)
    mag = bits & jnp.uint32(0x7FFFFFFF)
    low = jnp.uint32((1 << dst.shift) - 1)
    if mode == "rna":
        mag = mag + jnp.uint32(1 << (dst.shift - 1))
    elif mode == "rne":
        mag = mag + jnp.uint32((1 << (dst.shift - 1)) - 1) + ((mag >> dst.shift) & jnp.uint32(1))
    out = (bits & jnp.uint32(0x80000000)) | (jnp.minimum(mag, jnp.uint32(0x7F800000)) & ~low)
    nan = (bits & jnp.uint32(0x7FFFFFFF)) > jnp.uint32(0x7F800000)
    return jnp.where(nan, jnp.uint32(dst.canonical_nan), out)


def encode(values, fmt: fm.FloatFormat):
    """Bit patterns (uint32) of float32 values exactly representable in ``fmt``, in integers
    (also fp6, which JAX cannot hold as an array type)."""
    bits = jax.lax.bitcast_convert_type(jnp.asarray(values, jnp.float32), jnp.uint32)
    return convert(bits, fm.F32, fmt, "rne", overflow="saturate")
