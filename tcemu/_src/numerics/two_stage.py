"""The two-stage block adder of AMD CDNA3 matrix cores (``BlockFMA(addend_alignment="floor")``).

[MS25] ``MMA_TR_FDPA`` (f16, bf16, xf32) and ``MMA_GTR_FDPA`` (fp8/bf8): a block's products are
aligned to their largest exponent and truncated toward zero ``F`` bits below it and summed
(fp8: even and odd k apart, both sums then aligned by rounding toward -inf ``F`` bits below the
larger); the sum and C are aligned to the larger exponent by rounding toward -inf (the sum
``F2 + 1`` bits below it, C ``F`` bits below it), added exactly, normalised, rounded toward -inf
to ``F2`` fraction bits and rounded into binary32. All of it is int32 arithmetic: terms below
2**31, the stage-two sum as two words (:mod:`~tcemu._src.numerics.rounding`).

    >>> import jax.numpy as jnp
    >>> from tcemu._src import formats as fm
    >>> from tcemu._src.numerics import presets, two_stage
    >>> one = fm.to_bits(jnp.ones((1, 1), jnp.float16), "f16")
    >>> c = fm.to_bits(jnp.full((1, 1), -2.0**-30, jnp.float32), "f32")
    >>> d = two_stage.floor_dot(one, fm.F16, one, fm.F16, c, presets.numerics("MI300X").f16)
    >>> float(fm.from_bits(d, "f32")[0, 0]) == 1.0 - 2.0**-24    # C floors to -2**-24 at the sum's exponent
    True
"""
from __future__ import annotations

import jax.numpy as jnp

from tcemu._src import formats as fm
from tcemu._src.numerics.model import BlockFMA
from tcemu._src.numerics.rounding import leading_bit, round_pack, shl, split_signed

_NONE = -(1 << 20)  # alignment exponent of a group without nonzero products
_U = jnp.uint32


def _shift_signed(v, s):
    """``floor(v * 2**s)`` of int32 ``v`` for any int32 ``s`` (right shifts clamped at 31)."""
    return jnp.where(s >= 0, v << jnp.clip(s, 0, 31), v >> jnp.clip(-s, 0, 31))


def _two_words(v, s: int | jnp.ndarray):
    """``floor(v * 2**s)`` (``s <= 16``) as int32 words ``hi * 2**16 + lo``, ``0 <= lo < 2**16``."""
    left = jnp.clip(s, 0, 16)
    w = v >> jnp.clip(-s, 0, 31)
    hi = jnp.where(s >= 0, v >> (16 - left), w >> 16)
    lo = jnp.where(s >= 0, (v << left) & 0xFFFF, w & 0xFFFF)
    return hi, lo


def _group_sum(P, texp, keep, F: int, pre: int):
    """Sum of the terms selected by ``keep`` (..., M, N, L), aligned to their largest exponent and
    truncated toward zero ``F`` bits below it: (sum in units of 2**(e - F), e)."""
    e = jnp.max(jnp.where(keep & (P != 0), texp, _NONE), axis=-1)
    mag = _shift_signed(jnp.abs(P), texp - e[..., None] + F - pre)
    t = jnp.where(P < 0, -mag, mag)
    return jnp.sum(jnp.where(keep, t, 0), axis=-1, dtype=jnp.int32), e


def _floor_sig(sign, hi, lo, d):
    """The magnitude ``hi * 2**16 + lo`` of a value of sign ``sign`` rounded toward -inf at 2**d."""
    d = jnp.maximum(d, 0)
    mask_lo = shl(_U(1), jnp.minimum(d, 16)) - _U(1)
    mask_hi = shl(_U(1), jnp.clip(d - 16, 0, 31)) - _U(1)
    dropped = ((lo & mask_lo) | (hi & mask_hi)) != 0
    lo, hi = lo & ~mask_lo, hi & ~mask_hi
    up = dropped & (sign != 0)
    lo = lo + jnp.where(up & (d < 16), shl(_U(1), d), _U(0))
    hi = hi + jnp.where(up & (d >= 16), shl(_U(1), d - 16), _U(0)) + (lo >> 16)
    return hi, lo & _U(0xFFFF)


def _block(a: fm.Decoded, b: fm.Decoded, afmt, bfmt, c_bits, model: BlockFMA):
    """One block: a (..., M, 1, L), b (..., 1, N, L) decoded; C f32 bits (..., M, N)."""
    F, F2 = model.fraction_bits, model.sum_fraction_bits
    pre = afmt.fraction_bits + bfmt.fraction_bits
    P = a.sig * b.sig
    P = jnp.where((a.sign ^ b.sign) != 0, -P, P)
    texp = a.exp + b.exp
    zero_a, zero_b = a.sig == 0, b.sig == 0
    nan = a.is_nan | b.is_nan | (a.is_inf & zero_b) | (zero_a & b.is_inf)
    inf = a.is_inf | b.is_inf
    if model.product_overflow == "inf":
        inf = inf | (texp + (jnp.abs(P) >> (pre + 1) != 0).astype(jnp.int32) >= 128) & (P != 0)
    inf = inf & ~nan
    if model.split_even_odd:
        k = jnp.arange(P.shape[-1]) % 2
        (se, ee), (so, eo) = (_group_sum(P, texp, k == g, F, pre) for g in (0, 1))
        e_dot = jnp.maximum(ee, eo)
        s_dot = _shift_signed(se, ee - e_dot) + _shift_signed(so, eo - e_dot)
    else:
        s_dot, e_dot = _group_sum(P, texp, jnp.ones(P.shape[-1:], bool), F, pre)
    c = fm.decode(c_bits, fm.F32)
    E = jnp.maximum(e_dot, c.exp)
    s = F2 + 1 - F  # units 2**(E - F) -> 2**(E - F2 - 1)
    h1, l1 = _two_words(s_dot, e_dot - E + s)
    cv = _shift_signed(jnp.where(c.sign != 0, -c.sig, c.sig), c.exp - E + F - 23)
    if model.split_even_odd:
        cv = jnp.where(c.exp < E - F - 1, 0, cv)
    h2, l2 = _two_words(cv, s)
    sign, mhi, mlo = split_signed(h1 + h2, l1 + l2)
    q = E - F2 - 1
    lb = leading_bit(mhi, mlo)
    mhi, mlo = _floor_sig(sign, mhi, mlo, jnp.maximum(lb - F2, fm.F32.emin - F2 - q))
    bits = round_pack(sign, mhi, mlo, q, fm.F32, model.rounding, overflow=model.overflow)
    neg = P < 0
    pos_inf = jnp.any(inf & ~neg, axis=-1) | (c.is_inf & (c.sign == 0))
    neg_inf = jnp.any(inf & neg, axis=-1) | (c.is_inf & (c.sign != 0))
    is_nan = jnp.any(nan, axis=-1) | c.is_nan | (pos_inf & neg_inf)
    bits = jnp.where(pos_inf | neg_inf, fm.F32.inf_bits(neg_inf), bits)
    return jnp.where(is_nan, _U(fm.F32.canonical_nan), bits)


def floor_dot(a_bits, afmt: fm.FloatFormat, b_bits, bfmt: fm.FloatFormat, c_bits, model: BlockFMA):
    """``d = c + a @ b`` (binary32 C and D bit patterns) with the two-stage adder of ``model``,
    block by block along K (a block is ``min(block_size, K)`` products)."""
    a = fm.decode(jnp.asarray(a_bits).astype(_U), afmt)
    b = fm.decode(jnp.asarray(b_bits).astype(_U), bfmt)
    at = lambda x, sl: x[..., :, None, sl]  # noqa: E731 - (..., M, K) -> (..., M, 1, L)
    bt = lambda x, sl: jnp.swapaxes(x, -1, -2)[..., None, :, sl]  # noqa: E731 - (..., K, N) -> (..., 1, N, L)
    K = a.sig.shape[-1]
    L = min(model.block_size, K)
    d = jnp.asarray(c_bits).astype(_U)
    for k0 in range(0, K, L):
        sl = slice(k0, k0 + L)
        d = _block(fm.Decoded(*(at(x, sl) for x in a)), fm.Decoded(*(bt(x, sl) for x in b)), afmt, bfmt, d, model)
    return d
