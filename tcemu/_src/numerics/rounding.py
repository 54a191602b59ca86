"""Normalise and round a wide integer to a floating-point format, in 32-bit integer arithmetic.

A magnitude ``M`` is held as two uint32 words, ``M = hi * 2**16 + lo`` with ``lo < 2**16``
(``hi < 2**31``), so sums of up to ~2**46 fit without 64-bit integers. :func:`round_pack` turns
``(-1)**sign * M * 2**q`` into the bit pattern of a :class:`~tcemu._src.formats.FloatFormat`;
:func:`round_pack32` does the same in fewer operations for magnitudes below 2**32 (one word).

Rounding modes: ``"rz"`` (toward zero), ``"rne"`` (nearest, ties to even), ``"rna"`` (nearest,
ties away), ``"ru"`` (toward +inf), ``"rd"`` (toward -inf), ``"stochastic"`` (up with probability
equal to the discarded fraction, from 31 random bits per value).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from tcemu._src import formats as fm
from tcemu._src.formats import FloatFormat

ROUNDING_MODES = ("rz", "rne", "rna", "ru", "rd", "stochastic")
_U = jnp.uint32


def word_shifts(word):
    """``(shl, shr)``: ``x << n`` and logical ``x >> n`` for unsigned words ``x`` of type ``word``
    (``jnp.uint32``, ``jnp.uint64``) and int32 ``n >= 0``; 0 when ``n`` is the word's width or more."""
    width = jnp.iinfo(word).bits

    def shl(x, n):
        """``x << n``; 0 when ``n >= width``."""
        n = jnp.asarray(n)
        return jnp.where(n >= width, word(0), x << jnp.clip(n, 0, width - 1).astype(word))

    def shr(x, n):
        """Logical ``x >> n``; 0 when ``n >= width``."""
        n = jnp.asarray(n)
        return jnp.where(n >= width, word(0), x >> jnp.clip(n, 0, width - 1).astype(word))

    return shl, shr


shl, shr = word_shifts(_U)  # uint32


def window(hi, lo, s, nbits: int):
    """Bits ``[s, s + nbits)`` of ``M = hi * 2**16 + lo`` (``s`` may be negative: zero fill)."""
    upper = shr(hi, s - 16)
    low_part = jnp.where(s >= 0, shr(lo, s), shl(lo, -s))
    lower = shl(hi, 16 - s) | low_part
    return jnp.where(s >= 16, upper, lower) & _U((1 << nbits) - 1)


def low_bits_nonzero(hi, lo, n):
    """Whether ``M mod 2**n`` is nonzero (``n <= 0`` gives False)."""
    lo_mask = shl(_U(1), jnp.clip(n, 0, 16)) - _U(1)
    hi_mask = shl(_U(1), jnp.clip(n - 16, 0, 31)) - _U(1)
    return ((lo & lo_mask) != 0) | ((hi & hi_mask) != 0)


def leading_bit(hi, lo):
    """Index of the most significant set bit of M (-1 for M == 0)."""
    hz = jax.lax.clz(hi).astype(jnp.int32)
    lz = jax.lax.clz(lo).astype(jnp.int32)
    return jnp.where(hi != 0, 47 - hz, 31 - lz)


def split_signed(total_hi, total_lo):
    """Normalise a signed two-word sum ``S = total_hi * 2**16 + total_lo`` (int32 words, any
    range) into ``(sign, hi, lo)`` with the magnitude in the :func:`round_pack` representation."""
    hi = total_hi + (total_lo >> 16)
    lo = total_lo & 0xFFFF
    neg = hi < 0
    nlo = (-lo) & 0xFFFF
    nhi = -hi - (lo != 0).astype(jnp.int32)
    return (neg.astype(jnp.int32), jnp.where(neg, nhi, hi).astype(_U), jnp.where(neg, nlo, lo).astype(_U))


def round_pack(sign, hi, lo, q, fmt: FloatFormat, mode: str, *, overflow: str = "inf",
               subnormals: bool = True, rand=None):
    """Bits of ``fmt`` nearest (per ``mode``) to ``(-1)**sign * (hi * 2**16 + lo) * 2**q``.

    ``overflow="inf"`` returns infinity whenever the rounded exponent exceeds the format's range
    (what NVIDIA tensor cores do even when rounding toward zero); ``"ieee"`` follows IEEE 754
    (RZ/RD/RU saturate to the largest finite value in the directions they round toward zero);
    ``"saturate"`` always gives the largest finite value (formats without infinities, fp6/fp4).
    A zero magnitude gives a zero with the given sign.
    """
    _check_mode(mode, rand)
    p = fmt.fraction_bits
    x = jnp.maximum(q + leading_bit(hi, lo), fmt.emin)
    sh = x - p - q
    fields = (window(hi, lo, sh, p + 2), jnp.where(sh >= 1, window(hi, lo, sh - 1, 1), _U(0)),
              low_bits_nonzero(hi, lo, sh - 1), window(hi, lo, sh - 31, 31) if mode == "stochastic" else None)
    return _finish(sign, x, *fields, (hi | lo) != 0, fmt, mode, overflow, subnormals, rand)


def round_pack32(sign, m, q, fmt: FloatFormat, mode: str, *, overflow: str = "inf",
                 subnormals: bool = True, rand=None):
    """:func:`round_pack` of a magnitude that fits one uint32 word, ``(-1)**sign * m * 2**q``:
    the same bits in about half the operations."""
    _check_mode(mode, rand)
    p = fmt.fraction_bits
    lz = jax.lax.clz(m).astype(jnp.int32)  # 32 for m == 0
    top = m << jnp.minimum(lz, 31).astype(_U)  # leading bit at position 31
    x = jnp.maximum(q + 31 - lz, fmt.emin)
    r = x - p - q + lz  # bits of `top` below the kept p + 1; at least 31 - p, so no left shifts
    rbit = shr(top, r - 1) & _U(1)
    sticky = (top & (shl(_U(1), r - 1) - _U(1))) != 0  # shl gives 0 from 32 on: all bits
    frac = None
    if mode == "stochastic":  # the 31 bits below the kept ones
        s = r - 31
        frac = jnp.where(s >= 0, shr(top, s), shl(top, -s)) & _U((1 << 31) - 1)
    return _finish(sign, x, shr(top, r), rbit, sticky, frac, m != 0, fmt, mode, overflow, subnormals, rand)


def divide(x, y):
    """``x / y`` of float32 values rounded to nearest even, as IEEE 754 divides, on every backend.

    XLA's float32 division is not that everywhere: on GPUs it is not correctly rounded (on an
    H100, ``1 / x`` is one ulp off for about 14 % of random ``x``), and on CPUs it flushes
    subnormal operands and results to zero. tcemu's recipes that divide (the NVFP4 scales) use
    this to give the same bits on every backend: on CPUs XLA's division where operands and
    quotient are normal numbers (the rest, if any, as below); elsewhere :func:`divide_exact`.

    >>> import jax.numpy as jnp
    >>> float(divide(jnp.float32(1), jnp.float32(3))) == float(jnp.float32(1) / jnp.float32(3))
    True
    """
    x, y = jnp.broadcast_arrays(jnp.asarray(x, jnp.float32), jnp.asarray(y, jnp.float32))
    return jax.lax.platform_dependent(x, y, cpu=_divide_cpu, default=divide_exact)


def _divide_cpu(x, y):
    """XLA's CPU division, correctly rounded where no subnormal (flushed) is involved."""
    q = x / y

    def normal(v):  # a normal number (not zero, subnormal, inf or NaN)
        d = fm.decode(jax.lax.bitcast_convert_type(v, _U), fm.F32)
        return (d.sig >= (1 << 23)) & ~d.is_inf & ~d.is_nan

    # above the smallest normal, so no underflow near it (false for NaN)
    ok = normal(x) & normal(y) & (jnp.abs(q) > jnp.float32(2.0 ** -126))
    return jax.lax.cond(jnp.all(ok), lambda: q, lambda: jnp.where(ok, q, divide_exact(x, y)))


def divide_exact(x, y):
    """``x / y`` of float32 values rounded to nearest even, in integers: a 26-bit long division of
    the significands with a sticky bit, then :func:`round_pack32`. NaN operands, ``0 / 0`` and
    ``inf / inf`` give NaN.

    >>> import jax.numpy as jnp
    >>> float(divide_exact(jnp.float32(1), jnp.float32(3))) == float(jnp.float32(1) / jnp.float32(3))
    True
    """
    x, y = jnp.broadcast_arrays(jnp.asarray(x, jnp.float32), jnp.asarray(y, jnp.float32))
    dx, dy = (fm.decode(jax.lax.bitcast_convert_type(v, _U), fm.F32) for v in (x, y))

    def normalise(d):  # significand with its leading bit at 23, and its exponent
        lz = jax.lax.clz(d.sig.astype(_U)).astype(jnp.int32) - 8
        return d.sig.astype(_U) << jnp.clip(lz, 0, 23).astype(_U), d.exp - lz

    mx, ex = normalise(dx)
    my, ey = normalise(dy)
    my = jnp.where(my == 0, _U(1 << 23), my)  # zero divisors are handled below

    def step(_, qr):  # one quotient bit; a loop, not 26 unrolled steps (XLA compiles loops quickly)
        quo, r = qr
        bit = r >= my
        return (quo << 1) | bit.astype(_U), jnp.where(bit, r - my, r) << 1

    # quo = floor(mx * 2**25 / my) in [2**24, 2**26); r the remainder (< 2**25) doubled
    quo, r = jax.lax.fori_loop(0, 26, step, (jnp.zeros_like(mx), mx))
    sign = dx.sign ^ dy.sign
    bits = round_pack32(sign, (quo << 1) | (r != 0).astype(_U), ex - ey - 26, fm.F32, "rne")
    zx, zy = dx.sig == 0, dy.sig == 0
    signed = sign.astype(_U) << 31
    bits = jnp.where(dx.is_inf | zy, signed | _U(0x7F800000), bits)
    bits = jnp.where(zx | dy.is_inf, signed, bits)
    bits = jnp.where(dx.is_nan | dy.is_nan | (zx & zy) | (dx.is_inf & dy.is_inf), _U(0x7FC00000), bits)
    return jax.lax.bitcast_convert_type(bits, jnp.float32)


def _check_mode(mode, rand):
    if mode not in ROUNDING_MODES:
        raise ValueError(f"unknown rounding mode {mode!r}; valid: {ROUNDING_MODES}")
    if mode == "stochastic" and rand is None:
        raise ValueError("stochastic rounding needs random bits (pass a PRNG key)")


def _finish(sign, x, n, rbit, sticky, frac, nonzero, fmt: FloatFormat, mode, overflow, subnormals, rand):
    """Round the kept bits ``n`` (p + 2 bits, exponent ``x``) given the round bit, the sticky bit
    (and, for stochastic rounding, the 31 bits below ``n``), then pack, with overflow."""
    p = fmt.fraction_bits
    inexact = (rbit != 0) | sticky
    neg = sign != 0
    if mode == "rz":
        inc = jnp.zeros_like(inexact)
    elif mode == "rne":
        inc = (rbit != 0) & (sticky | ((n & 1) != 0))
    elif mode == "rna":
        inc = rbit != 0
    elif mode == "ru":
        inc = inexact & ~neg
    elif mode == "rd":
        inc = inexact & neg
    else:
        inc = (rand >> 1) < frac
    n = n + inc.astype(_U)
    carry = (n >> (p + 1)) != 0
    n = jnp.where(carry, n >> 1, n)
    x = x + carry.astype(jnp.int32)
    normal = (n >> p) != 0
    biased = jnp.where(normal, x + fmt.bias, 0).astype(_U)
    frac_field = n & _U((1 << p) - 1)
    if not subnormals:
        frac_field = jnp.where(normal, frac_field, _U(0))
    sbit = jnp.where(neg, _U(fmt.sign_bit >> fmt.shift), _U(0))
    body = sbit | (biased << p) | frac_field
    # beyond the top exponent, or at it with a fraction above the largest finite one (e4m3's S.1111.111 is NaN)
    too_big = ((x > fmt.emax) | ((x == fmt.emax) & normal & (frac_field > fmt.max_fraction))) & nonzero
    if overflow == "inf":
        big = (sbit | _U(((1 << fmt.exponent_bits) - 1) << p)) if fmt.has_inf else sbit | _U(
            (fmt.canonical_nan >> fmt.shift))
    elif overflow == "ieee":
        to_inf = {"rz": jnp.zeros_like(neg), "rne": jnp.ones_like(neg), "rna": jnp.ones_like(neg),
                  "ru": ~neg, "rd": neg, "stochastic": jnp.ones_like(neg)}[mode]
        inf = sbit | _U(((1 << fmt.exponent_bits) - 1) << p)
        maxf = sbit | _U((((fmt.emax + fmt.bias) << p) | fmt.max_fraction))
        big = jnp.where(to_inf, inf, maxf)
    elif overflow == "saturate":  # the largest finite value of the sign (OCP MX conversions to fp6/fp4)
        big = sbit | _U((((fmt.emax + fmt.bias) << p) | fmt.max_fraction))
    else:
        raise ValueError(f"overflow must be 'inf', 'ieee' or 'saturate', got {overflow!r}")
    body = jnp.where(too_big, big, body)
    return body << fmt.shift
