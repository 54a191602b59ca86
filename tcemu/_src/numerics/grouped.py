"""Block-scaled fp4 MMAs whose products are summed in groups (``kind::mxf4``, ``kind::mxf4nvf4``).

Blackwell tensor cores compute ``d = c + sum_k a_k b_k sa_k sb_k`` of packed fp4 (e2m1) inputs
differently from the per-product block FMA of :mod:`~tcemu._src.numerics.engine` ([MS25]
``MMA_GST_FDPA``): every ``G`` consecutive products are summed exactly, the group sum is multiplied
by its two scale factors, and the groups and ``c`` are aligned to the largest *scale* exponent (a
group's own magnitude does not count), truncated ``fraction_bits`` below it, summed exactly and
rounded once into binary32. A group whose products are all zero, or whose scale product is zero,
and a zero ``c`` count with ``zero_exponent``.

Everything is int32 arithmetic: e2m1 values are integers times 2**-1, scale significands integers
times 2**-3, and the aligned terms (up to 2**47 with 35 fraction bits) are summed as two words.

Example (one k64 block, unit scales)::

    >>> import jax.numpy as jnp
    >>> from tcemu._src import formats as fm
    >>> from tcemu._src.numerics import grouped, presets
    >>> a = jnp.full((1, 64), 0x2, jnp.uint32)   # e2m1 1.0
    >>> b = jnp.full((64, 1), 0x1, jnp.uint32)   # e2m1 0.5
    >>> one = fm.decode_scale(jnp.full((1, 2), 127), "ue8m0")
    >>> d = grouped.grouped_dot(a, b, jnp.zeros((1, 1), jnp.uint32), one,
    ...                         fm.decode_scale(jnp.full((2, 1), 127), "ue8m0"), 32, presets.MXF4)
    >>> float(fm.from_bits(d, "f32")[0, 0])
    32.0
"""
from __future__ import annotations

import jax.numpy as jnp

from tcemu._src import formats as fm
from tcemu._src.numerics.model import BlockFMA
from tcemu._src.numerics.rounding import round_pack, shl, shr

_U = jnp.uint32
_LO = (1 << 24) - 1


def check_grouped(model: BlockFMA, where: str, *, k: int, block: int) -> None:
    """Raise a ValueError naming ``where`` unless ``model`` can run grouped on this instruction."""
    G, L = model.scale_group, model.block_size
    bad = [name for name, v, ok in (("block_sum", model.block_sum, "fused"), ("addend", model.addend, "first"),
                                    ("exact_zero", model.exact_zero, "+0"), ("block_order", model.block_order, None),
                                    ("accumulator_fraction_bits", model.accumulator_fraction_bits, 23),
                                    ("sticky", model.sticky, False), ("normalize_products", model.normalize_products, False))
           if v != ok]
    if bad:
        raise ValueError(f"{where}: a model with scale_group runs with the defaults of {', '.join(bad)}")
    if model.stochastic:
        raise ValueError(f"{where}: a model with scale_group does not take stochastic rounding")
    if block % G or L % G or k % L and L < k:
        raise ValueError(f"{where}: scale_group={G} must divide the scale block ({block}) and block_size "
                         f"({L}), and block_size must divide K={k}")


def _terms(m, sh):
    """``m * 2**sh`` truncated toward zero (``m`` uint32 < 2**24, ``sh`` <= 31) as two int32 words
    ``hi * 2**24 + lo``."""
    mt = jnp.where(sh < 0, shr(m, -sh), m)
    s2 = jnp.maximum(sh, 0)
    hi = jnp.where(s2 >= 24, shl(mt, s2 - 24), shr(mt, 24 - s2))
    lo = shl(mt, s2) & _U(_LO)
    return hi.astype(jnp.int32), lo.astype(jnp.int32)


def grouped_dot(a_bits, b_bits, c_bits, sa: fm.Scale, sb: fm.Scale, block: int, model: BlockFMA):
    """``d = c + a @ b`` of e2m1 codes ``a`` (..., M, K), ``b`` (..., K, N) with scales ``sa``
    (..., M, K / block) and ``sb`` (..., K / block, N), binary32 ``c`` and ``d`` bit patterns.
    Scale NaN is not handled here (the caller sets those outputs to NaN)."""
    G, F, L = model.scale_group, model.fraction_bits, model.block_size
    K = a_bits.shape[-1]
    L = min(L, K)
    flush = not model.subnormal_inputs

    def values(bits):  # e2m1 as signed integers times 2**-1
        d = fm.decode(jnp.asarray(bits).astype(_U), fm.E2M1, flush_subnormals=flush)
        v = d.sig << (d.exp - fm.E2M1.emin)
        return jnp.where(d.sign != 0, -v, v)

    va = values(a_bits)  # (..., M, K)
    vb = jnp.swapaxes(values(b_bits), -1, -2)  # (..., N, K)
    per = block // G
    sa_sig, sa_exp = (jnp.repeat(x, per, axis=-1) for x in (sa.sig, sa.exp))  # (..., M, K/G)
    sb_sig, sb_exp = (jnp.swapaxes(jnp.repeat(x, per, axis=-2), -1, -2) for x in (sb.sig, sb.exp))  # (..., N, K/G)
    ze = model.zero_exponent if model.zero_exponent is not None else -(1 << 20)
    d = jnp.asarray(c_bits).astype(_U)
    for k0 in range(0, K, L):
        ks, gs = slice(k0, k0 + L), slice(k0 // G, (k0 + L) // G)
        prod = va[..., :, None, ks] * vb[..., None, :, ks]  # (..., M, N, L), products times 2**-2
        shape = prod.shape[:-1] + (L // G, G)
        P = jnp.sum(prod.reshape(shape), axis=-1, dtype=jnp.int32)
        nonzero = jnp.any(prod.reshape(shape) != 0, axis=-1)
        S = sa_sig[..., :, None, gs] * sb_sig[..., None, :, gs]  # scale significands times 2**-6
        T = P * S  # the group sum times 2**8, |T| < 2**19
        e_g = jnp.where(nonzero & (S != 0), sa_exp[..., :, None, gs] + sb_exp[..., None, :, gs], ze)
        c = fm.decode(d, fm.F32, flush_subnormals=flush)
        e_c = jnp.where(c.sig == 0, ze, c.exp)
        E = jnp.maximum(jnp.max(e_g, axis=-1), e_c)
        gh, gl = _terms(jnp.abs(T).astype(_U), F - 8 + e_g - E[..., None])
        gneg = T < 0
        ch, cl = _terms(c.sig.astype(_U), F - 23 + c.exp - E)
        cneg = (c.sign != 0) & (c.sig != 0)
        S_hi = jnp.sum(jnp.where(gneg, -gh, gh), axis=-1, dtype=jnp.int32) + jnp.where(cneg, -ch, ch)
        S_lo = jnp.sum(jnp.where(gneg, -gl, gl), axis=-1, dtype=jnp.int32) + jnp.where(cneg, -cl, cl)
        hi = S_hi + (S_lo >> 24)
        lo = S_lo & _LO
        neg = hi < 0
        mlo = jnp.where(neg & (lo != 0), (1 << 24) - lo, lo)
        mhi = jnp.where(neg, -hi - (lo != 0).astype(jnp.int32), hi)
        small = mhi < (1 << 15)  # below 2**39 the magnitude fits round_pack's two words exactly
        hi16 = jnp.where(small, (mhi << 8) | (mlo >> 16), mhi).astype(_U)
        lo16 = jnp.where(small, mlo & 0xFFFF, (mlo >> 8) | ((mlo & 0xFF) != 0).astype(jnp.int32)).astype(_U)
        q = E - F + 8 * (~small).astype(jnp.int32)  # above: the low 8 bits only as a sticky bit
        out = round_pack(neg.astype(jnp.int32), hi16, lo16, q, fm.F32, model.rounding,
                         overflow=model.overflow, subnormals=model.subnormal_outputs)
        out = jnp.where(out == _U(fm.F32.sign_bit), _U(0), out)  # exact_zero "+0": no -0 result
        out = jnp.where(c.is_inf, fm.F32.inf_bits(c.sign), out)
        d = jnp.where(c.is_nan, _U(fm.F32.canonical_nan), out)
    return d
