"""The fused block-FMA engine: bit-exact ``d = c + a @ b`` for floating-point tensor-core MMAs.

All arithmetic is on int32/uint32 (no float64; the same bits with ``jax_enable_x64`` on). Operands
are bit patterns: ``a`` (..., M, K) in format ``afmt``, ``b`` (..., K, N) in ``bfmt``, ``c``
(..., M, N) in ``cfmt``.
See :class:`~tcemu._src.numerics.model.BlockFMA` for the model. This module decodes the operands
and walks K block by block; one block (alignment, exact sum, one rounding) is
:mod:`~tcemu._src.numerics.fused_block`, the format conversions :mod:`~tcemu._src.numerics.cvt`.

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

import functools
import os
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from tcemu._src import formats as fm
from tcemu._src.numerics.cvt import convert, encode
from tcemu._src.numerics.exact_sum import exact_dot
from tcemu._src.numerics.fused_block import (BIG, Terms, add, deferred_specials, float_align, fused_block,
                                             int_align, prepare_operand, rounded_add, unroll_terms)
from tcemu._src.numerics.model import BlockFMA
from tcemu._src.numerics.pairwise import pairwise_dot
from tcemu._src.numerics.two_stage import floor_dot

# engine is the face of the numerics: the names other modules read as engine.X are re-exported
# from cvt and fused_block (native reads _BIG, numerics.mma _add)
__all__ = ["Prepared", "accumulator_format", "add", "alignment_path", "convert", "deferred_specials", "encode",
           "fused_dot", "fused_dot_prepared", "prepare", "unroll_terms"]
_BIG, _add = BIG, rounded_add


def accumulator_format(model: BlockFMA, acc: str) -> fm.FloatFormat:
    """Storage format of the running sum: binary16, binary32, or binary32 with fewer fraction bits."""
    if acc == "f16":
        return fm.F16
    if model.accumulator_fraction_bits == 23:
        return fm.F32
    afb = model.accumulator_fraction_bits
    # stored as float32 with the low bits zero; NaN is float32's canonical 0x7FFFFFFF ([H200] wgmma fp8)
    return fm.FloatFormat(f"e8m{afb}", 8, afb, 32, shift=23 - afb, nan=0x7FFFFFFF)


# Formats whose products are exact float32 numbers far from the float32 range limits.
_FLOAT_SAFE = ("f16", "e4m3", "e5m2")


def _as_f32(bits, fmt: fm.FloatFormat, flush: bool):
    """Exact float32 values of fp16/fp8 bit patterns (NaN/inf stay NaN/inf)."""
    x = fm.from_bits(bits, fmt.name).astype(jnp.float32)
    if flush:
        efield = (bits >> fmt.fraction_bits) & ((1 << fmt.exponent_bits) - 1)
        x = jnp.where(efield == 0, jnp.float32(0), x)
    return x


def _at(x):  # (..., M, K) -> (..., K, M, 1)
    return jnp.swapaxes(x, -1, -2)[..., :, :, None]


def _bt(x):  # (..., K, N) -> (..., K, 1, N)
    return x[..., :, None, :]


def _product_flags(a: fm.Decoded, b: fm.Decoded) -> Terms:
    """Signs and NaN/inf flags of every product (the slow path; specials are rare)."""
    a_zero, b_zero = a.sig == 0, b.sig == 0
    nan = _at(a.is_nan) | _bt(b.is_nan) | (_at(a.is_inf) & _bt(b_zero)) | (_at(a_zero) & _bt(b.is_inf))
    return Terms(_at(a.sign) ^ _bt(b.sign), nan, (_at(a.is_inf) | _bt(b.is_inf)) & ~nan)


def _order(K: int, model: BlockFMA):
    """The permutation of an instruction's K products given by ``model.block_order``: the pattern
    applied to every P consecutive k, or restricted to k < K when K < P."""
    if model.block_order is None:
        return None
    P = len(model.block_order)
    if K < P:
        return np.asarray([k for k in model.block_order if k < K], np.int32)
    if K % P:
        raise ValueError(f"block_order of length {P} does not tile K={K}")
    return np.concatenate([np.asarray(model.block_order, np.int32) + P * i for i in range(K // P)])


class Prepared(NamedTuple):
    """Operands decoded once per element (shapes (..., M, K) and (..., K, N)); produced by
    :func:`prepare` outside any loop so that XLA materialises them instead of decoding both
    operands again for every product."""

    a_bits: jnp.ndarray  # uint32, for the rare special-value path
    b_bits: jnp.ndarray
    sa: jnp.ndarray  # signed significands (A scaled by 2**max(pre, 0))
    ea: jnp.ndarray  # exponents with the sentinels of prepare_operand
    sb: jnp.ndarray
    eb: jnp.ndarray
    fa: jnp.ndarray | None  # exact float32 values (fp16/fp8 operands only)
    fb: jnp.ndarray | None


@functools.cache
def alignment_path() -> str:
    """How fp16/fp8 products are aligned when both ways are exact: "float" (float32 scaling and a
    truncating conversion; the default, measured faster on CPU and H200) or "int" (integer
    shifts, as for bf16/tf32). ``TCEMU_ALIGN=int|float`` selects, read once per process at first
    use (``alignment_path.cache_clear()`` reads it again); both give the same bits."""
    env = os.environ.get("TCEMU_ALIGN") or "float"
    if env not in ("int", "float"):
        raise ValueError(f"TCEMU_ALIGN={env!r}; valid: int, float (the default)")
    return env


def _use_float(afmt, bfmt, model: BlockFMA) -> bool:
    return (afmt.name in _FLOAT_SAFE and bfmt.name in _FLOAT_SAFE and not model.sticky
            and not model.normalize_products and alignment_path() == "float")


def prepare(a_bits, afmt: fm.FloatFormat, b_bits, bfmt: fm.FloatFormat, model: BlockFMA, *,
            a_exp=None, b_exp=None) -> Prepared:
    """Decode the multiplicands of :func:`fused_dot` (tf32 rounding, block order, sentinels).

    ``a_exp`` (..., M, K) / ``b_exp`` (..., K, N): int32 exponents added to every element (the
    power-of-two block scales of ``kind::mxf8f6f4``); the alignment then runs in integers."""
    flush = not model.subnormal_inputs
    if afmt is fm.TF32 and model.tf32_conversion == "rna":
        a_bits = convert(a_bits, fm.F32, fm.TF32, "rna")
    if bfmt is fm.TF32 and model.tf32_conversion == "rna":
        b_bits = convert(b_bits, fm.F32, fm.TF32, "rna")
    a_bits = jnp.asarray(a_bits).astype(jnp.uint32)
    b_bits = jnp.asarray(b_bits).astype(jnp.uint32)
    perm = _order(a_bits.shape[-1], model)
    if perm is not None:
        a_bits, b_bits = a_bits[..., perm], b_bits[..., perm, :]
        a_exp = None if a_exp is None else a_exp[..., perm]
        b_exp = None if b_exp is None else b_exp[..., perm, :]
    pre = model.fraction_bits - (afmt.fraction_bits + bfmt.fraction_bits)
    sa, ea = prepare_operand(fm.decode(a_bits, afmt, flush_subnormals=flush), max(pre, 0))
    sb, eb = prepare_operand(fm.decode(b_bits, bfmt, flush_subnormals=flush), 0)
    scaled = a_exp is not None or b_exp is not None
    if a_exp is not None:  # |scale exponents| < 2**10 keep the sentinels on their side
        ea = ea + a_exp
    if b_exp is not None:
        eb = eb + b_exp
    fa = fb = None
    if not scaled and _use_float(afmt, bfmt, model):  # exact float32 values (XLA's conversions are exact here)
        fa, fb = _as_f32(a_bits, afmt, flush), _as_f32(b_bits, bfmt, flush)
    return Prepared(a_bits, b_bits, sa, ea, sb, eb, fa, fb)


def fused_dot(a_bits, afmt: fm.FloatFormat, b_bits, bfmt: fm.FloatFormat, c_bits,
              cfmt: fm.FloatFormat, model: BlockFMA, *, acc: str = "f32", key=None):
    """``d = c + a @ b`` of one instruction, in blocks of ``model.block_size`` along K.

    ``c`` is read in ``cfmt``; every block result (and the returned bits) is in
    :func:`accumulator_format` ``(model, acc)``.
    """
    return fused_dot_prepared(prepare(a_bits, afmt, b_bits, bfmt, model), afmt, bfmt, c_bits, cfmt, model,
                              acc=acc, key=key)


def fused_dot_prepared(p: Prepared, afmt: fm.FloatFormat, bfmt: fm.FloatFormat, c_bits,
                       cfmt: fm.FloatFormat, model: BlockFMA, *, acc: str = "f32", key=None, min_scale_exp: int = 0):
    """:func:`fused_dot` on operands already :func:`prepare`-d (``min_scale_exp``: the smallest
    exponent the ``a_exp + b_exp`` of :func:`prepare` can add to a product)."""
    if model.addend_alignment == "floor":  # CDNA3's two-stage adder: binary32 C and D only
        if acc != "f32" or cfmt is not fm.F32 or min_scale_exp:
            raise ValueError("a BlockFMA with addend_alignment='floor' takes binary32 C and D and no block scales")
        return floor_dot(p.a_bits, afmt, p.b_bits, bfmt, c_bits, model)
    if model.block_sum in ("pairwise", "exact"):  # CDNA2's tree of binary32 additions, CDNA1's exact sums
        if acc != "f32" or cfmt is not fm.F32 or min_scale_exp:
            raise ValueError(f"a BlockFMA with block_sum={model.block_sum!r} takes binary32 C and D and no block "
                             "scales")
        dot = pairwise_dot if model.block_sum == "pairwise" else exact_dot
        return dot(p.a_bits, afmt, p.b_bits, bfmt, c_bits, model)
    flush = not model.subnormal_inputs
    K = p.a_bits.shape[-1]
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
    separate = model.block_sum == "separate"
    neutral = lambda: fm.decode(jnp.full_like(c_bits, acc_fmt.sign_bit), acc_fmt)  # noqa: E731 - -0: x + -0 == x
    for blk, k0 in enumerate(range(0, K, L)):
        sl = slice(k0, k0 + L)
        ab, bb = p.a_bits[..., sl], p.b_bits[..., sl, :]
        flags = lambda ab=ab, bb=bb: _product_flags(fm.decode(ab, afmt), fm.decode(bb, bfmt))  # noqa: E731
        c = lambda d=d, f=read_fmt: fm.decode(d, f, flush_subnormals=flush)  # noqa: E731
        texp = _at(p.ea[..., sl]) + _bt(p.eb[..., sl, :])
        if p.fa is not None:
            emax, align = float_align(_at(p.fa[..., sl]) * _bt(p.fb[..., sl, :]), texp, F)
        else:
            emax, align = int_align(_at(p.sa[..., sl]) * _bt(p.sb[..., sl, :]), texp, max(-pre, 0), model.sticky,
                                    F + max(-pre, 0) + 1 if model.normalize_products else None)
        if separate:  # the block alone, rounded, then one addition into the accumulator
            t = fused_block(emax, align, flags, neutral, acc_fmt.fraction_bits, model, fraction_bits=F,
                            sticky=model.sticky, out=out, mode=mode, rand=rand_for(blk), min_exp=afmt.emin + bfmt.emin + min_scale_exp)
            d = rounded_add(t, acc_fmt, d, read_fmt, model, out=out, mode=model.addend_rounding, rand=rand_for(K + blk))
        else:
            d = fused_block(emax, align, flags, c, read_fmt.fraction_bits, model, fraction_bits=F, sticky=model.sticky,
                            out=out, mode=mode, rand=rand_for(blk), min_exp=afmt.emin + bfmt.emin + min_scale_exp)
        read_fmt = acc_fmt
    if model.addend == "last":
        d = rounded_add(d, acc_fmt, c_bits, cfmt, model, out=out, mode=model.addend_rounding, rand=rand_for(-1))
    return d
