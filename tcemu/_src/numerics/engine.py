"""The fused block-FMA engine: bit-exact ``d = c + a @ b`` for floating-point tensor-core MMAs.

All arithmetic is on int32/uint32 (no float64; the same bits with ``jax_enable_x64`` on). Operands
are bit patterns: ``a`` (..., M, K) in format ``afmt``, ``b`` (..., K, N) in ``bfmt``, ``c``
(..., M, N) in ``cfmt``.
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

import contextlib
import os
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from tcemu._src import formats as fm
from tcemu._src.numerics.model import BlockFMA
from tcemu._src.numerics.rounding import round_pack, round_pack32, split_signed

class _Terms(NamedTuple):
    """Addends of one fused block, (..., M, N, L), for the special-value and signed-zero paths."""

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
    # stored as float32 with the low bits zero; NaN is float32's canonical 0x7FFFFFFF ([H200] wgmma fp8)
    return fm.FloatFormat(f"e8m{afb}", 8, afb, 32, shift=23 - afb, nan=0x7FFFFFFF)


# Sentinel exponents of zero and of NaN/inf operands. A product exponent below _ZERO_BELOW marks a
# zero term; one above _SPECIAL_ABOVE a term with a NaN or infinity (inf * 0 included), which
# makes the block's alignment exponent flag the output for the special-value path for free.
_BIG = 1 << 20
_ZERO_BELOW, _SPECIAL_ABOVE = -_BIG // 8, _BIG // 2


def _prepare(d: fm.Decoded, scale: int):
    """Per element, once: the signed significand times 2**scale, and the exponent (sentinels for
    zero: -_BIG/4, NaN/inf: +_BIG)."""
    sig = d.sig << scale if scale > 0 else d.sig
    exp = jnp.where(d.sig == 0, -_BIG // 4, d.exp)
    return jnp.where(d.sign != 0, -sig, sig), jnp.where(d.is_nan | d.is_inf, _BIG, exp)


# Formats whose products are exact float32 numbers far from the float32 range limits.
_FLOAT_SAFE = ("f16", "e4m3", "e5m2")


def _as_f32(bits, fmt: fm.FloatFormat, flush: bool):
    """Exact float32 values of fp16/fp8 bit patterns (NaN/inf stay NaN/inf)."""
    x = fm.from_bits(bits, fmt.name).astype(jnp.float32)
    if flush:
        efield = (bits >> fmt.fraction_bits) & ((1 << fmt.exponent_bits) - 1)
        x = jnp.where(efield == 0, jnp.float32(0), x)
    return x


# Terms are laid out (..., L, M, N): the block's products along a major axis, so that the sums
# and maxima over them are elementwise vector operations across the output columns.
_T = -3


def _at(x):  # (..., M, K) -> (..., K, M, 1)
    return jnp.swapaxes(x, -1, -2)[..., :, :, None]


def _bt(x):  # (..., K, N) -> (..., K, 1, N)
    return x[..., :, None, :]


def _product_flags(a: fm.Decoded, b: fm.Decoded) -> _Terms:
    """Signs and NaN/inf flags of every product (the slow path; specials are rare)."""
    a_zero, b_zero = a.sig == 0, b.sig == 0
    nan = _at(a.is_nan) | _bt(b.is_nan) | (_at(a.is_inf) & _bt(b_zero)) | (_at(a_zero) & _bt(b.is_inf))
    return _Terms(_at(a.sign) ^ _bt(b.sign), nan, (_at(a.is_inf) | _bt(b.is_inf)) & ~nan)


_UNROLL = 32  # term axes up to this length may be reduced by explicit elementwise ops


def unroll_terms() -> bool:
    """Reduce short term axes by unrolled elementwise ops (GPUs) rather than XLA reductions
    (CPUs, where the unrolled form is several times slower); ``TCEMU_UNROLL=0|1`` overrides."""
    env = os.environ.get("TCEMU_UNROLL")
    if env is not None:
        return env == "1"
    return jax.default_backend() != "cpu"


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


def _specials(terms: _Terms, c: fm.Decoded):
    """(is_nan, pos_inf, neg_inf) per output: NaN if any NaN, inf*0 or inf-inf."""
    pos_inf = jnp.any(terms.inf & (terms.neg == 0), axis=_T) | (c.is_inf & (c.sign == 0))
    neg_inf = jnp.any(terms.inf & (terms.neg != 0), axis=_T) | (c.is_inf & (c.sign != 0))
    is_nan = jnp.any(terms.nan, axis=_T) | c.is_nan | (pos_inf & neg_inf)
    return is_nan, pos_inf, neg_inf


def _int_align(tsig, texp, rs: int, sticky: bool, normalize: int | None):
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


def _float_align(prod, texp, F: int):
    """Alignment with exact float32 arithmetic, for products that are exact float32 numbers of
    small magnitude (fp16 and fp8 inputs): ``trunc(p * 2**(F - E))`` — the product, the scaling by
    a power of two and the truncating conversion are all exact, so no rounding (and no
    re-association) can change a bit; results below 1 truncate to 0 whatever their precision."""

    def align(E):
        scale = jax.lax.bitcast_convert_type(((F - E + 127) << 23).astype(jnp.int32), jnp.float32)
        return (prod * scale[..., None, :, :]).astype(jnp.int32)

    return texp, align


def _fused(exp_for_max, align, make_flags, make_c, cfrac: int, model: BlockFMA, *,
           fraction_bits: int, sticky: bool, out: fm.FloatFormat, mode: str, rand, min_exp: int):
    """One fused block: align every term and the addend to the largest exponent, truncate toward
    zero ``fraction_bits`` below it, sum exactly, normalise and round once into ``out``.

    ``exp_for_max`` (..., M, N, L): term exponents with the sentinels of :func:`_prepare`;
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
    c_exp = jnp.where(c.sig == 0, -_BIG if model.zero_exponent is None else model.zero_exponent, c.exp)
    E = jnp.maximum(_treduce(exp_for_max, jnp.maximum), c_exp)
    if model.min_exponent is not None:
        E = jnp.maximum(E, model.min_exponent)
    parts = _group_sums(align(E), F)
    csig = c.sig << (F - cfrac) if F >= cfrac else c.sig
    cshift = jnp.minimum(E - c.exp + max(cfrac - F, 0), 31)
    tc = csig >> cshift
    if sticky:
        tc = tc | ((csig & ((1 << cshift) - 1)) != 0).astype(jnp.int32)
    tc = jnp.where(c.sign != 0, -tc, tc)
    rounding = dict(overflow=model.overflow, subnormals=model.subnormal_outputs, rand=rand)
    if exp_for_max.shape[_T] * 2 ** (F + 2) + 2 ** (F + 1) <= 2 ** 32 and parts.shape[_T] == 1:
        # |terms| < 2**(F+2) and |C| < 2**(F+1), so |sum| < 2**32: the one int32 partial sum plus C
        # with wrap-around, the sign taken from the overflow, and a one-word rounding (the usual
        # case; half the operations of the two-word path below)
        g = parts[..., 0, :, :]
        S = g + tc
        neg = jnp.where(((g ^ S) & (tc ^ S)) < 0, g < 0, S < 0)
        u = jax.lax.bitcast_convert_type(S, jnp.uint32)
        mag = jnp.where(neg, jnp.uint32(0) - u, u)
        bits = round_pack32(neg.astype(jnp.int32), mag, E - F, out, mode, **rounding)
        exact_zero = mag == 0
    else:
        hi = _treduce(parts >> 16, jnp.add) + (tc >> 16)
        lo = _treduce(parts & 0xFFFF, jnp.add) + (tc & 0xFFFF)
        sign, mhi, mlo = split_signed(hi, lo)
        bits = round_pack(sign, mhi, mlo, E - F, out, mode, **rounding)
        exact_zero = (mhi | mlo) == 0
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
    ea: jnp.ndarray  # exponents with the sentinels of _prepare
    sb: jnp.ndarray
    eb: jnp.ndarray
    fa: jnp.ndarray | None  # exact float32 values (fp16/fp8 operands only)
    fb: jnp.ndarray | None


def alignment_path() -> str:
    """How fp16/fp8 products are aligned when both ways are exact: "float" (float32 scaling and a
    truncating conversion; the default, measured faster on CPU and H200) or "int" (integer
    shifts, as for bf16/tf32). ``TCEMU_ALIGN=int|float`` selects; both give the same bits."""
    env = os.environ.get("TCEMU_ALIGN", "float")
    if env not in ("int", "float"):
        raise ValueError(f"TCEMU_ALIGN={env!r}; valid: int, float")
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
    sa, ea = _prepare(fm.decode(a_bits, afmt, flush_subnormals=flush), max(pre, 0))
    sb, eb = _prepare(fm.decode(b_bits, bfmt, flush_subnormals=flush), 0)
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
            emax, align = _float_align(_at(p.fa[..., sl]) * _bt(p.fb[..., sl, :]), texp, F)
        else:
            emax, align = _int_align(_at(p.sa[..., sl]) * _bt(p.sb[..., sl, :]), texp, max(-pre, 0), model.sticky,
                                     F + max(-pre, 0) + 1 if model.normalize_products else None)
        if separate:  # the block alone, rounded, then one addition into the accumulator
            t = _fused(emax, align, flags, neutral, acc_fmt.fraction_bits, model, fraction_bits=F,
                       sticky=model.sticky, out=out, mode=mode, rand=rand_for(blk), min_exp=afmt.emin + bfmt.emin + min_scale_exp)
            d = _add(t, acc_fmt, d, read_fmt, model, out=out, mode=model.addend_rounding, rand=rand_for(K + blk))
        else:
            d = _fused(emax, align, flags, c, read_fmt.fraction_bits, model, fraction_bits=F, sticky=model.sticky,
                       out=out, mode=mode, rand=rand_for(blk), min_exp=afmt.emin + bfmt.emin + min_scale_exp)
        read_fmt = acc_fmt
    if model.addend == "last":
        d = _add(d, acc_fmt, c_bits, cfmt, model, out=out, mode=model.addend_rounding, rand=rand_for(-1))
    return d


def _add(x_bits, xfmt: fm.FloatFormat, y_bits, yfmt: fm.FloatFormat, model: BlockFMA, *, out, mode, rand=None):
    """One correctly rounded addition x + y into ``out`` (3 guard bits and a sticky bit make a
    two-term sum exactly rounded): a CUDA-core FADD, so IEEE signed zeros; ``model`` supplies the
    overflow and subnormal policies."""
    flush = not model.subnormal_inputs
    if model.exact_zero != "ieee":
        model = model.replace(exact_zero="ieee")
    xs, xe = _prepare(fm.decode(x_bits, xfmt), 26 - xfmt.fraction_bits)

    def xflags():
        x = fm.decode(x_bits, xfmt)
        return _Terms(x.sign[..., None, :, :], x.is_nan[..., None, :, :], x.is_inf[..., None, :, :])

    emax, align = _int_align(xs[..., None, :, :], xe[..., None, :, :], 0, True, None)
    return _fused(emax, align, xflags, lambda: fm.decode(y_bits, yfmt, flush_subnormals=flush),
                  yfmt.fraction_bits, model, fraction_bits=26, sticky=True, out=out, mode=mode, rand=rand,
                  min_exp=xfmt.emin)


def add(x_bits, y_bits, fmt: fm.FloatFormat = fm.F32, mode: str = "rne", *, rand=None):
    """IEEE addition of two bit-pattern arrays of ``fmt`` (shape (..., M, N)) in integer
    arithmetic: what a CUDA-core FADD does with the partial sums of a GEMM (NaN canonical)."""
    return _add(jnp.asarray(x_bits).astype(jnp.uint32), fmt, jnp.asarray(y_bits).astype(jnp.uint32), fmt,
                _FADD, out=fmt, mode=mode, rand=rand)


_FADD = BlockFMA(overflow="ieee", exact_zero="ieee")
