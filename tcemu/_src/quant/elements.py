"""Rounding values to an MMA's element formats, as bit patterns (codes) and as exact float32
values; every conversion is JAX's own or the engine's, so the bits are the same with x64 on or
off and on every backend.

    >>> from tcemu._src.quant.elements import quantize_codes, code_values
    >>> codes = quantize_codes([1.0, 3.3], "e4m3")
    >>> [hex(int(c)) for c in codes], code_values(codes, "e4m3").tolist()
    (['0x38', '0x45'], [1.0, 3.25])
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from tcemu._src import formats as fm
from tcemu._src.checks import real_array
from tcemu._src.numerics import engine
from tcemu._src.numerics.rounding import round_pack32
from tcemu._src.checks import check_key

FORMATS = ("f16", "bf16", "tf32", "e4m3", "e5m2", "e3m2", "e2m3", "e2m1", "e4m3fnuz", "e5m2fnuz")
MX = ("e3m2", "e2m3", "e2m1")  # OCP MX fp6/fp4: no NaN, no infinity
MODES = ("rne", "stochastic")


def quantize(x, etype: str, mode: str = "rne", key=None):
    """Round values to the element format ``etype`` ("f16", "bf16", "tf32", "e4m3", "e5m2", and
    the OCP MX fp6/fp4 "e3m2", "e2m3", "e2m1", AMD's fnuz fp8 "e4m3fnuz", "e5m2fnuz"); the result holds the quantised values in float32
    (exact; NaN as 0x7FFFFFFF, or the canonical tf32 NaN 0x7FFFE000). Inputs are converted to
    float32 first, so the bits do not depend on ``jax_enable_x64``.

    ``mode="rne"``: JAX's own round-to-nearest-even conversion (``astype``; tf32:
    ``jax.lax.reduce_precision`` to 10 fraction bits); e4m3 has no infinity, so its overflows
    (above 464) and infinities become NaN, as do those of the fnuz formats (whose only NaN is
    0x80, the code of -0: negative values that round to zero become +0). fp6/fp4 have neither: overflows and infinities
    saturate to the largest finite value and NaN becomes -0, as ml_dtypes converts them (JAX
    cannot hold fp6 arrays, so those are rounded in integers). ``mode="stochastic"`` (needs
    ``key``): rounds up with probability equal to the discarded fraction.

    >>> import tcemu
    >>> tcemu.quantize([0.2, 2.5, 3.5, 100.0], "e2m1").tolist()
    [0.0, 2.0, 4.0, 6.0]
    """
    if not isinstance(etype, str) or etype not in FORMATS:
        raise ValueError(f"quantize: unknown format {etype!r}; valid: {', '.join(FORMATS)}")
    if not isinstance(mode, str) or mode not in MODES:
        raise ValueError(f"quantize: mode must be one of {', '.join(MODES)}, got {mode!r}")
    return code_values(quantize_codes(real_array(x, "quantize", "x"), etype, mode, key), etype)


def quantize_codes(x, etype: str, mode: str = "rne", key=None):
    """:func:`quantize`'s result as the element format's bit patterns (uint32; tf32 as float32
    patterns), from one conversion (arguments already checked)."""
    x = as_float32(x)
    fmt = fm.FORMATS[etype]
    if etype in MX:
        return _quantize_mx_element(x, fmt, mode, key)
    if mode == "rne":
        if etype == "tf32":
            # float32 NaNs whose payload lies below the tf32 fraction would read as inf: canonical NaN
            q = jax.lax.reduce_precision(x, exponent_bits=8, mantissa_bits=10)
            return jax.lax.bitcast_convert_type(jnp.where(jnp.isnan(x), _f32(fm.TF32.canonical_nan), q), jnp.uint32)
        return fm.to_bits(x.astype(fm.VALUE_DTYPES[etype]), etype)
    bits = jax.lax.bitcast_convert_type(x, jnp.uint32)
    q = engine.convert(bits, fm.F32, fmt, "stochastic", overflow="inf", rand=_random_bits(key, x.shape))
    if not fmt.has_inf:  # engine.convert maps infinities to S.1111.000 (256), e4m3's NaN is S.1111.111
        q = jnp.where(jnp.isinf(x), jnp.uint32(fmt.canonical_nan), q)
    if fmt.fnuz:  # no -0: 0x80 is NaN
        q = jnp.where((q == fmt.sign_bit) & (jnp.abs(x) < 1), jnp.uint32(0), q)
    return q


def as_float32(x):
    """``x`` (any real dtype) as float32, rounded once to nearest even. float64 (which exists only
    with ``jax_enable_x64`` on) is narrowed in integers: XLA's CPU conversion flushes results
    below 2**-126 to zero, where NumPy's (x64 off: on the host) keeps them.

    >>> import jax, numpy as np
    >>> with jax.enable_x64(True):
    ...     print(as_float32(np.float64(2.0**-140)) == np.float32(2.0**-140))
    True
    """
    x = jnp.asarray(x)
    if x.dtype != jnp.float64:
        return x.astype(jnp.float32)
    return _narrow64(x)


@jax.custom_jvp
def _narrow64(x):
    """float64 -> float32 in integers; differentiable as the cast (its derivative is 1)."""
    b = jax.lax.bitcast_convert_type(x, jnp.uint64)
    sign = (b >> 63).astype(jnp.int32)
    efield = ((b >> 52) & 0x7FF).astype(jnp.int32)
    frac = b & jnp.uint64((1 << 52) - 1)
    sig = jnp.where(efield != 0, frac | jnp.uint64(1 << 52), frac)
    # the top 30 of the 53 significand bits, the rest folded into a sticky bit (below the round bit)
    m = (sig >> 23).astype(jnp.uint32) | ((sig & jnp.uint64((1 << 23) - 1)) != 0).astype(jnp.uint32)
    out = round_pack32(sign, m, jnp.maximum(efield, 1) - 1023 - 29, fm.F32, "rne", overflow="ieee")
    special = jnp.where(frac != 0, jnp.uint32(0x7FC00000), fm.F32.inf_bits(sign))
    return jax.lax.bitcast_convert_type(jnp.where(efield == 0x7FF, special, out), jnp.float32)


@_narrow64.defjvp
def _narrow64_jvp(primals, tangents):
    return _narrow64(primals[0]), tangents[0].astype(jnp.float32)


def code_values(codes, etype: str):
    """Element bit patterns -> their exact values in float32 (widened in integers: under jit, XLA
    on GPUs drops a float convert pair such as f32 -> bf16 -> f32)."""
    if etype == "tf32":
        return jax.lax.bitcast_convert_type(codes, jnp.float32)
    return widen(codes, fm.FORMATS[etype])


def to_codes(x, etype: str):
    """float32 container of exactly representable values -> element bit patterns (uint32)."""
    if etype in MX:  # exact: the values are representable
        return engine.encode(x, fm.FORMATS[etype])
    if etype == "tf32":
        return jax.lax.bitcast_convert_type(jnp.asarray(x, jnp.float32), jnp.uint32)
    return fm.to_bits(jnp.asarray(x).astype(fm.VALUE_DTYPES[etype]), etype)


def f32_bits(bits, fmt: fm.FloatFormat):
    """Bits of ``fmt`` -> float32 bits, widened exactly in integers (NaN -> 0x7FFFFFFF as
    cvt.f32.f16 gives it, on every backend)."""
    return bits if fmt is fm.F32 else engine.convert(bits, fmt, fm.F32)


def widen(bits, fmt: fm.FloatFormat):
    """Bits of ``fmt`` -> float32 values."""
    return jax.lax.bitcast_convert_type(f32_bits(bits, fmt), jnp.float32)


def _random_bits(key, shape):
    if check_key(key, "quantize") is None:
        raise ValueError("quantize: mode='stochastic' needs key=jax.random.key(...)")
    return jax.random.bits(key, shape, jnp.uint32)


def _quantize_mx_element(x, fmt, mode, key):
    """fp6/fp4 rounding in integers (bit patterns): saturating, infinities to the largest finite
    value, NaN to -0."""
    rand = _random_bits(key, x.shape) if mode == "stochastic" else None
    bits = jax.lax.bitcast_convert_type(x, jnp.uint32)
    d = fm.decode(bits, fm.F32)
    q = engine.convert(bits, fm.F32, fmt, mode, overflow="saturate", rand=rand)
    top = jnp.uint32(((fmt.emax + fmt.bias) << fmt.fraction_bits) | fmt.max_fraction)
    q = jnp.where(d.is_inf, jnp.where(d.sign != 0, jnp.uint32(fmt.sign_bit), 0) | top, q)
    return jnp.where(d.is_nan, jnp.uint32(fmt.sign_bit), q)


def _f32(bits: int):
    return jax.lax.bitcast_convert_type(jnp.uint32(bits), jnp.float32)
