"""The fused block-FMA engine: bit-exact ``d = c + a @ b`` for floating-point tensor-core MMAs.

All arithmetic is on int32/uint32 (no float64, no ``jax_enable_x64``). Operands are bit patterns:
``a`` (..., M, K) in format ``afmt``, ``b`` (..., K, N) in ``bfmt``, ``c`` (..., M, N) in ``cfmt``.
See :class:`~tcemu._src.numerics.model.BlockFMA` for the model.

Example (one fp16 dot product of length 4 with an fp32 addend, V100 numerics)::

    >>> import jax.numpy as jnp
    >>> from tcemu._src import formats
    >>> from tcemu._src.numerics import engine, model
    >>> a = formats.to_bits(jnp.ones((1, 4), jnp.float16), "f16")
    >>> b = formats.to_bits(jnp.full((4, 1), 2.0 ** -24, jnp.float16), "f16")
    >>> c = formats.to_bits(jnp.ones((1, 1), jnp.float32), "f32")
    >>> d = engine.fused_dot(a, formats.F16, b, formats.F16, c, formats.F32,
    ...                      model.BlockFMA(fraction_bits=23, block_size=4))
    >>> float(formats.from_bits(d, "f32")[0, 0])   # the four 2**-24 are truncated away
    1.0
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from tcemu._src import formats as fm
from tcemu._src.numerics.model import BlockFMA
from tcemu._src.numerics.rounding import round_pack, shr, split_signed

_NO_EXPONENT = -(1 << 20)


class _Terms(NamedTuple):
    """Addends of one fused block, (..., M, N, L): value = (-1)**neg * sig * 2**(exp - frac)."""

    sig: jnp.ndarray  # int32, already scaled by 2**pre where pre > 0
    exp: jnp.ndarray
    neg: jnp.ndarray
    nan: jnp.ndarray
    inf: jnp.ndarray


def accumulator_format(model: BlockFMA, acc: str) -> fm.FloatFormat:
    """Storage format of the running sum: binary16, binary32, or binary32 with fewer fraction bits."""
    if acc == "f16":
        return fm.F16
    if model.accumulator_fraction_bits == 23:
        return fm.F32
    afb = model.accumulator_fraction_bits
    return fm.FloatFormat(f"e8m{afb}", 8, afb, 32, shift=23 - afb)


def _product_terms(a: fm.Decoded, b: fm.Decoded, pre: int) -> _Terms:
    """Exact products of every (i, k) with every (k, j)."""
    ma = a.sig << pre if pre > 0 else a.sig
    bt = lambda x: jnp.swapaxes(x, -1, -2)[..., None, :, :]  # noqa: E731  (..., 1, N, L)
    at = lambda x: x[..., :, None, :]  # noqa: E731                         (..., M, 1, L)
    a_zero, b_zero = a.sig == 0, b.sig == 0
    nan = at(a.is_nan) | bt(b.is_nan) | (at(a.is_inf) & bt(b_zero)) | (at(a_zero) & bt(b.is_inf))
    return _Terms(at(ma) * bt(b.sig), at(a.exp) + bt(b.exp), at(a.sign) ^ bt(b.sign), nan,
                  (at(a.is_inf) | bt(b.is_inf)) & ~nan)


def _lost(x, n):
    """1 where ``x >> n`` dropped nonzero bits (the sticky bit), else 0."""
    mask = jnp.where(n >= 32, jnp.uint32(0xFFFFFFFF),
                     (jnp.uint32(1) << jnp.clip(n, 0, 31).astype(jnp.uint32)) - jnp.uint32(1))
    return ((x & mask) != 0).astype(jnp.uint32)


def _align(sig, shift, sticky: bool):
    u = sig.astype(jnp.uint32)
    t = shr(u, shift)
    if sticky:
        t = t | _lost(u, shift)
    return t.astype(jnp.int32)


def _fused(terms: _Terms, tfrac: int, c: fm.Decoded, cfrac: int, model: BlockFMA, *,
           fraction_bits: int, sticky: bool, out: fm.FloatFormat, mode: str, rand):
    """Align ``terms`` and ``c`` to the largest exponent, truncate, sum exactly, round to ``out``."""
    F = fraction_bits
    pre = F - tfrac  # terms' significands were multiplied by 2**max(pre, 0) already
    ze = _NO_EXPONENT if model.zero_exponent is None else model.zero_exponent
    exp_for_max = terms.exp
    if model.normalize_products:
        top = F + 1 if pre >= 0 else tfrac + 1
        exp_for_max = exp_for_max + ((terms.sig >> top) != 0).astype(jnp.int32)
    exp_for_max = jnp.where(terms.sig == 0, ze, exp_for_max)
    E = jnp.maximum(jnp.max(exp_for_max, axis=-1), jnp.where(c.sig == 0, ze, c.exp))
    if model.min_exponent is not None:
        E = jnp.maximum(E, model.min_exponent)
    t = _align(terms.sig, jnp.maximum(E[..., None] - terms.exp + max(-pre, 0), 0), sticky)
    t = jnp.where(terms.neg != 0, -t, t)
    csig = c.sig << (F - cfrac) if F >= cfrac else c.sig
    tc = _align(csig, jnp.maximum(E - c.exp + max(cfrac - F, 0), 0), sticky)
    tc = jnp.where(c.sign != 0, -tc, tc)
    hi = jnp.sum(t >> 16, axis=-1) + (tc >> 16)
    lo = jnp.sum(t & 0xFFFF, axis=-1) + (tc & 0xFFFF)
    sign, mhi, mlo = split_signed(hi, lo)
    # An exact zero is -0 only when every addend is negative (IEEE sum of signed zeros).
    all_neg = jnp.all(terms.neg != 0, axis=-1) & (c.sign != 0)
    sign = jnp.where((mhi | mlo) == 0, all_neg.astype(jnp.int32), sign)
    bits = round_pack(sign, mhi, mlo, E - F, out, mode, overflow=model.overflow,
                      subnormals=model.subnormal_outputs, rand=rand)
    # IEEE special values: NaN if any NaN, inf*0 or inf-inf; otherwise an infinity wins.
    pos_inf = jnp.any(terms.inf & (terms.neg == 0), axis=-1) | (c.is_inf & (c.sign == 0))
    neg_inf = jnp.any(terms.inf & (terms.neg != 0), axis=-1) | (c.is_inf & (c.sign != 0))
    is_nan = jnp.any(terms.nan, axis=-1) | c.is_nan | (pos_inf & neg_inf)
    bits = jnp.where(pos_inf | neg_inf, out.inf_bits(neg_inf), bits)
    return jnp.where(is_nan, jnp.uint32(out.canonical_nan), bits)


def convert(bits, src: fm.FloatFormat, dst: fm.FloatFormat, mode: str = "rne", *,
            overflow: str = "ieee", rand=None):
    """Convert float bit patterns between formats (``cvt``): exact widening, rounded narrowing.
    NaN becomes the destination's canonical NaN."""
    d = fm.decode(bits, src)
    sig = d.sig.astype(jnp.uint32)
    out = round_pack(d.sign, sig >> 16, sig & 0xFFFF, d.exp - src.fraction_bits, dst, mode,
                     overflow=overflow, rand=rand)
    out = jnp.where(d.is_inf, dst.inf_bits(d.sign), out)
    return jnp.where(d.is_nan, jnp.uint32(dst.canonical_nan), out)


def _order(K: int, model: BlockFMA):
    if model.block_order is None:
        return None
    P = len(model.block_order)
    if K % P:
        raise ValueError(f"block_order of length {P} does not tile K={K}")
    return np.concatenate([np.asarray(model.block_order) + P * i for i in range(K // P)])


def fused_dot(a_bits, afmt: fm.FloatFormat, b_bits, bfmt: fm.FloatFormat, c_bits,
              cfmt: fm.FloatFormat, model: BlockFMA, *, acc: str = "f32", key=None):
    """``d = c + a @ b`` of one instruction, in blocks of ``model.block_size`` along K.

    ``c`` is read in ``cfmt``; every block result (and the returned bits) is in
    :func:`accumulator_format` ``(model, acc)``.
    """
    flush = not model.subnormal_inputs
    if afmt is fm.TF32 and model.tf32_conversion == "rna":
        a_bits = convert(a_bits, fm.F32, fm.TF32, "rna")
    if bfmt is fm.TF32 and model.tf32_conversion == "rna":
        b_bits = convert(b_bits, fm.F32, fm.TF32, "rna")
    a = fm.decode(a_bits, afmt, flush_subnormals=flush)
    b = fm.decode(b_bits, bfmt, flush_subnormals=flush)
    K = a.sig.shape[-1]
    perm = _order(K, model)
    if perm is not None:
        a = fm.Decoded(*(x[..., perm] for x in a))
        b = fm.Decoded(*(x[..., perm, :] for x in b))
    out = accumulator_format(model, acc)
    acc_fmt = fm.F16 if acc == "f16" else fm.F32
    mode = model.f16_rounding if acc == "f16" else model.rounding
    c_bits = jnp.asarray(c_bits).astype(jnp.uint32)
    if model.addend == "last":
        d, read_fmt = jnp.zeros_like(c_bits), acc_fmt
    else:
        d, read_fmt = c_bits, cfmt
    F = model.fraction_bits
    pre = F - (afmt.fraction_bits + bfmt.fraction_bits)

    def rand_for(i):
        if "stochastic" not in (mode, model.addend_rounding):
            return None
        if key is None:
            raise ValueError("stochastic rounding needs a PRNG key: pass key=jax.random.key(...)")
        return jax.random.bits(jax.random.fold_in(key, i), c_bits.shape, jnp.uint32)

    L = model.block_size
    for blk, k0 in enumerate(range(0, K, L)):
        sl = slice(k0, min(k0 + L, K))
        terms = _product_terms(fm.Decoded(*(x[..., sl] for x in a)),
                               fm.Decoded(*(x[..., sl, :] for x in b)), pre)
        c = fm.decode(d, read_fmt, flush_subnormals=flush)
        d = _fused(terms, afmt.fraction_bits + bfmt.fraction_bits, c, read_fmt.fraction_bits, model,
                   fraction_bits=F, sticky=model.sticky, out=out, mode=mode, rand=rand_for(blk))
        read_fmt = acc_fmt
    if model.addend == "last":
        # one correctly rounded addition: 3 guard bits + sticky make a 2-term sum exact-rounded
        x = fm.decode(d, acc_fmt)
        pre_x = 26 - acc_fmt.fraction_bits
        xt = _Terms(x.sig[..., None] << pre_x, x.exp[..., None], x.sign[..., None], x.is_nan[..., None],
                    x.is_inf[..., None])
        c = fm.decode(c_bits, cfmt, flush_subnormals=flush)
        d = _fused(xt, acc_fmt.fraction_bits, c, cfmt.fraction_bits, model, fraction_bits=26,
                   sticky=True, out=out, mode=model.addend_rounding, rand=rand_for(-1))
    return d
