"""One fused block of the block-FMA model (:class:`~tcemu._src.numerics.model.BlockFMA`): its
terms aligned to the largest exponent and truncated ``fraction_bits`` below it, summed exactly in
int32 words with the addend, then normalised and rounded once; NaN, infinities and the sign of an
exact zero on a rarely taken path. The terms are products of :mod:`~tcemu._src.numerics.engine`'s
:func:`~tcemu._src.numerics.engine.fused_dot`, or the two addends of :func:`rounded_add`, the
correctly rounded CUDA-core addition (FADD) that joins partial sums.
"""
from __future__ import annotations

import contextlib
import functools
import os
from typing import NamedTuple

import jax
import jax.numpy as jnp

from tcemu._src import formats as fm
from tcemu._src.numerics.model import BlockFMA
from tcemu._src.numerics.rounding import round_pack, round_pack32, split_signed


class Terms(NamedTuple):
    """Addends of one fused block, (..., M, N, L), for the special-value and signed-zero paths."""

    neg: jnp.ndarray
    nan: jnp.ndarray
    inf: jnp.ndarray


# Sentinel exponents of zero and of NaN/inf operands. A product exponent below _ZERO_BELOW marks a
# zero term; one above _SPECIAL_ABOVE a term with a NaN or infinity (inf * 0 included), which
# makes the block's alignment exponent flag the output for the special-value path for free.
BIG = 1 << 20
_ZERO_BELOW, _SPECIAL_ABOVE = -BIG // 8, BIG // 2


def prepare_operand(d: fm.Decoded, scale: int):
    """Per element, once: the signed significand times 2**scale, and the exponent (sentinels for
    zero: -BIG/4, NaN/inf: +BIG)."""
    sig = d.sig << scale if scale > 0 else d.sig
    exp = jnp.where(d.sig == 0, -BIG // 4, d.exp)
    return jnp.where(d.sign != 0, -sig, sig), jnp.where(d.is_nan | d.is_inf, BIG, exp)


# Terms are laid out (..., L, M, N): the block's products along a major axis, so that the sums
# and maxima over them are elementwise vector operations across the output columns.
_T = -3
_UNROLL = 32  # term axes up to this length may be reduced by explicit elementwise ops


@functools.cache
def unroll_terms() -> bool:
    """Reduce short term axes by unrolled elementwise ops (GPUs) rather than XLA reductions
    (CPUs, where the unrolled form is several times slower); ``TCEMU_UNROLL=0|1`` overrides, read
    once per process at first use (``unroll_terms.cache_clear()`` reads it again)."""
    env = os.environ.get("TCEMU_UNROLL")
    if env not in (None, "", "0", "1"):
        raise ValueError(f"TCEMU_UNROLL={env!r}; valid: 0 (XLA reductions), 1 (unrolled), unset (by backend)")
    return env == "1" if env else jax.default_backend() != "cpu"


def _treduce(x, op, axis: int = _T):
    """Reduce over the term axis. Short axes become a chain of elementwise ``op`` on slices,
    which XLA fuses with the term computation and the rounding into one loop (on GPUs its
    reductions over a middle axis run at a fraction of that speed)."""
    n = x.shape[axis]
    if n > _UNROLL or not unroll_terms():
        if op is jnp.add:  # dtype: jnp.sum widens int32 to int64 under jax_enable_x64
            return jnp.sum(x, axis=axis, dtype=x.dtype)
        return jnp.max(x, axis=axis)
    parts = [jax.lax.index_in_dim(x, i, axis, keepdims=False) for i in range(n)]
    out = parts[0]
    for p in parts[1:]:
        out = op(out, p)
    return out


def _group_sums(t, F: int):
    """Sum int32 terms (|t| < 2**(F+2)) over the term axis in groups small enough not to overflow
    int32; returns (..., G, M, N) partial sums."""
    L = t.shape[_T]
    g = max(1, min(L, 1 << (29 - F)))
    if g == L:
        return _treduce(t, jnp.add)[..., None, :, :]
    lead, (M, N) = t.shape[:_T], t.shape[_T + 1:]
    if L % g:
        t = jnp.concatenate([t, jnp.zeros(lead + (g - L % g, M, N), t.dtype)], _T)
    return _treduce(t.reshape(lead + (t.shape[_T] // g, g, M, N)), jnp.add, _T)


def _specials(terms: Terms, c: fm.Decoded):
    """(is_nan, pos_inf, neg_inf) per output: NaN if any NaN, inf*0 or inf-inf."""
    pos_inf = jnp.any(terms.inf & (terms.neg == 0), axis=_T) | (c.is_inf & (c.sign == 0))
    neg_inf = jnp.any(terms.inf & (terms.neg != 0), axis=_T) | (c.is_inf & (c.sign != 0))
    is_nan = jnp.any(terms.nan, axis=_T) | c.is_nan | (pos_inf & neg_inf)
    return is_nan, pos_inf, neg_inf


def int_align(tsig, texp, rs: int, sticky: bool, normalize: int | None):
    """Alignment in integers: ``tsig`` (..., M, N, L) signed significands with ``F + rs`` fraction
    bits and exponents ``texp``. Returns (exponents for the max, align(E) -> int32 terms)."""
    mag = jnp.abs(tsig)
    exp_for_max = texp
    if normalize is not None:  # products >= 2 count one exponent higher
        exp_for_max = texp + ((mag >> normalize) != 0).astype(jnp.int32)

    def align(E):
        # shifts of 32 or more give 0 for a non-negative operand (XLA semantics): no clamp
        shift = E[..., None, :, :] - texp + rs
        t = mag >> shift
        if sticky:
            lost = mag.astype(jnp.uint32) & ((jnp.uint32(1) << shift.astype(jnp.uint32)) - jnp.uint32(1))
            t = t | (lost != 0).astype(jnp.int32)
        neg = tsig >> 31  # -1 for negative terms: (t ^ -1) + 1 == -t
        return (t ^ neg) - neg

    return exp_for_max, align


def float_align(prod, texp, F: int):
    """Alignment with exact float32 arithmetic, for products that are exact float32 numbers of
    small magnitude (fp16 and fp8 inputs): ``trunc(p * 2**(F - E))`` — the product, the scaling by
    a power of two and the truncating conversion are all exact, so no rounding (and no
    re-association) can change a bit; results below 1 truncate to 0 whatever their precision."""

    def align(E):
        scale = jax.lax.bitcast_convert_type(((F - E + 127) << 23).astype(jnp.int32), jnp.float32)
        return (prod * scale[..., None, :, :]).astype(jnp.int32)

    return texp, align


def _align_addend(c: fm.Decoded, E, F: int, cfrac: int, sticky: bool):
    """The addend's signed significand (``cfrac`` fraction bits) aligned as the terms are:
    truncated at ``2**(E - F)``, with a sticky bit when ``sticky``."""
    csig = c.sig << (F - cfrac) if F >= cfrac else c.sig
    cshift = jnp.minimum(E - c.exp + max(cfrac - F, 0), 31)
    tc = csig >> cshift
    if sticky:
        tc = tc | ((csig & ((1 << cshift) - 1)) != 0).astype(jnp.int32)
    return jnp.where(c.sign != 0, -tc, tc)


def _round_sum(parts, tc, L: int, E, F: int, out: fm.FloatFormat, mode: str, rounding: dict):
    """The exact sum of the partial sums ``parts`` of ``L`` terms and the aligned addend ``tc``
    (units of ``2**(E - F)``), normalised and rounded once into ``out``: (bits, exact zero)."""
    if L * 2 ** (F + 2) + 2 ** (F + 1) <= 2 ** 32 and parts.shape[_T] == 1:
        # |terms| < 2**(F+2) and |C| < 2**(F+1), so |sum| < 2**32: the one int32 partial sum plus C
        # with wrap-around, the sign taken from the overflow, and a one-word rounding (the usual
        # case; half the operations of the two-word path below)
        g = parts[..., 0, :, :]
        S = g + tc
        neg = jnp.where(((g ^ S) & (tc ^ S)) < 0, g < 0, S < 0)
        u = jax.lax.bitcast_convert_type(S, jnp.uint32)
        mag = jnp.where(neg, jnp.uint32(0) - u, u)
        return round_pack32(neg.astype(jnp.int32), mag, E - F, out, mode, **rounding), mag == 0
    hi = _treduce(parts >> 16, jnp.add) + (tc >> 16)
    lo = _treduce(parts & 0xFFFF, jnp.add) + (tc & 0xFFFF)
    sign, mhi, mlo = split_signed(hi, lo)
    return round_pack(sign, mhi, mlo, E - F, out, mode, **rounding), (mhi | mlo) == 0


def fused_block(exp_for_max, align, make_flags, make_c, cfrac: int, model: BlockFMA, *,
                fraction_bits: int, sticky: bool, out: fm.FloatFormat, mode: str, rand, min_exp: int):
    """One fused block: align every term and the addend to the largest exponent, truncate toward
    zero ``fraction_bits`` below it, sum exactly, normalise and round once into ``out``.

    ``exp_for_max`` (..., M, N, L): term exponents with the sentinels of :func:`prepare_operand`;
    ``align(E)``: the terms truncated at ``2**(E - fraction_bits)`` as int32 integers. ``min_exp``:
    the smallest exponent a nonzero term can have (when it is above ``zero_exponent`` the
    zero-term policy cannot change the result and is skipped). ``make_flags()`` / ``make_c()``
    decode the term flags and the addend from raw bits; the flags only run inside a rarely taken
    branch (some output has a NaN/inf operand, or is an exact zero), so XLA never materialises
    large arrays for them.
    """
    c = make_c()
    F = fraction_bits
    if model.zero_exponent is not None and min_exp < model.zero_exponent:
        exp_for_max = jnp.where(exp_for_max < _ZERO_BELOW, model.zero_exponent, exp_for_max)
    c_exp = jnp.where(c.sig == 0, -BIG if model.zero_exponent is None else model.zero_exponent, c.exp)
    E = jnp.maximum(_treduce(exp_for_max, jnp.maximum), c_exp)
    if model.min_exponent is not None:
        E = jnp.maximum(E, model.min_exponent)
    parts = _group_sums(align(E), F)
    tc = _align_addend(c, E, F, cfrac, sticky)
    rounding = dict(overflow=model.overflow, subnormals=model.subnormal_outputs, rand=rand)
    bits, exact_zero = _round_sum(parts, tc, exp_for_max.shape[_T], E, F, out, mode, rounding)
    if model.exact_zero == "+0":  # also a negative sum that rounded to zero
        bits = jnp.where(bits == jnp.uint32(out.sign_bit), jnp.uint32(0), bits)
    # One reduction tells whether any output needs the slow path: an exact zero (its sign is -
    # only when every addend is negative, as in an IEEE sum of signed zeros) or a NaN/inf operand
    # (the alignment exponent carries the sentinel). Only then are term flags computed.
    special = (E > _SPECIAL_ABOVE) | c.is_nan | c.is_inf

    ieee_zero = model.exact_zero == "ieee"

    def slow(bits):
        flags = make_flags()
        if ieee_zero:  # IEEE 754: -0 when every addend is -0, and any exact zero under "rd"
            if mode == "rd":
                neg_zero = ~(jnp.all(flags.neg == 0, axis=_T) & (c.sign == 0))
            else:
                neg_zero = jnp.all(flags.neg != 0, axis=_T) & (c.sign != 0)
            bits = jnp.where(exact_zero & neg_zero, bits | jnp.uint32(out.sign_bit), bits)
        is_nan, pos_inf, neg_inf = _specials(flags, c)
        bits = jnp.where(pos_inf | neg_inf, out.inf_bits(neg_inf), bits)
        return jnp.where(is_nan, jnp.uint32(out.canonical_nan), bits)

    # With exact_zero "+0" an exact zero is +0 as computed; with "ieee" it may be -0: only when
    # its addends are all negative (so C is negative and aligns to 0: a -0 or a tiny C, since any
    # other negative C would make the sum nonzero), or under "rd".
    if not ieee_zero:
        zero_sign = jnp.zeros_like(exact_zero)
    elif mode == "rd":
        zero_sign = exact_zero
    else:
        zero_sign = exact_zero & (c.sign != 0) & (tc == 0)
    if _DEFERRED:  # outputs the slow path could change become NaN
        return jnp.where(zero_sign | special, jnp.uint32(out.canonical_nan), bits)
    return jax.lax.cond(jnp.any(zero_sign | special), slow, lambda bits: bits, bits)


_DEFERRED = False


@contextlib.contextmanager
def deferred_specials():
    """Trace-time context for long chains of MMAs (GEMMs): fused blocks traced inside it skip their
    special-value branch (a ``lax.cond`` per call, a third of a GEMM's time on GPUs) and return
    NaN for every output that branch could have changed. Results that are not NaN are exact; NaN
    then propagates through the chain, and a caller that finds NaN in the result computes it
    again outside the context."""
    global _DEFERRED
    prev, _DEFERRED = _DEFERRED, True
    try:
        yield
    finally:
        _DEFERRED = prev


def rounded_add(x_bits, xfmt: fm.FloatFormat, y_bits, yfmt: fm.FloatFormat, model: BlockFMA, *, out, mode, rand=None):
    """One correctly rounded addition x + y into ``out`` (3 guard bits and a sticky bit make a
    two-term sum exactly rounded): a CUDA-core FADD, so IEEE signed zeros; ``model`` supplies the
    overflow and subnormal policies."""
    flush = not model.subnormal_inputs
    if model.exact_zero != "ieee":
        model = model.replace(exact_zero="ieee")
    xs, xe = prepare_operand(fm.decode(x_bits, xfmt), 26 - xfmt.fraction_bits)

    def xflags():
        x = fm.decode(x_bits, xfmt)
        return Terms(x.sign[..., None, :, :], x.is_nan[..., None, :, :], x.is_inf[..., None, :, :])

    emax, align = int_align(xs[..., None, :, :], xe[..., None, :, :], 0, True, None)
    return fused_block(emax, align, xflags, lambda: fm.decode(y_bits, yfmt, flush_subnormals=flush),
                       yfmt.fraction_bits, model, fraction_bits=26, sticky=True, out=out, mode=mode, rand=rand,
                       min_exp=xfmt.emin)


def add(x_bits, y_bits, fmt: fm.FloatFormat = fm.F32, mode: str = "rne", *, rand=None):
    """IEEE addition of two bit-pattern arrays of ``fmt`` (shape (..., M, N)) in integer
    arithmetic: what a CUDA-core FADD does with the partial sums of a GEMM (NaN canonical)."""
    return rounded_add(jnp.asarray(x_bits).astype(jnp.uint32), fmt, jnp.asarray(y_bits).astype(jnp.uint32), fmt,
                       _FADD, out=fmt, mode=mode, rand=rand)


_FADD = BlockFMA(overflow="ieee", exact_zero="ieee")
