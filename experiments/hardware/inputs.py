"""Deterministic random and adversarial inputs for the MMA captures (numpy + ml_dtypes only).

Values are produced as IEEE bit patterns of the element format so that nothing is lost between
the generator, the GPU and the committed test data.
"""
from __future__ import annotations

import numpy as np
import ml_dtypes

# (exponent bits, fraction bits, has infinities)
FORMATS = {
    "f16": (5, 10, True), "bf16": (8, 7, True), "tf32": (8, 10, True), "f32": (8, 23, True),
    "f64": (11, 52, True), "e4m3": (4, 3, False), "e5m2": (5, 2, True),
}
STORAGE = {"f16": np.uint16, "bf16": np.uint16, "tf32": np.uint32, "f32": np.uint32,
           "f64": np.uint64, "e4m3": np.uint8, "e5m2": np.uint8}
_NP = {"f16": np.float16, "bf16": ml_dtypes.bfloat16, "f32": np.float32, "f64": np.float64,
       "e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}

FLOAT_CLASSES = ("normal", "positive", "spread", "cancel", "dominant", "special", "bigc", "tiny",
                 "overflow")
INT_CLASSES = ("random", "extreme", "small")
# Results that are zero or nearly so, for the sign of zero (capture.py --only signed_zeros):
# products cancelling in exact pairs, products cancelling only after alignment (the small terms are
# truncated away), all products signed zeros, and C = -(A @ B) exactly; C is +-0, tiny
# (subnormal, truncated away), small or ordinary, of both signs.
ZERO_CLASSES = ("zcancel", "ztrunc", "zprod", "zexact")
# Nonzero sums that round to zero (capture.py --only underflow): is such a zero signed?
UNDERFLOW_CLASSES = ("zunder",)


def from_float(x: np.ndarray, fmt: str) -> np.ndarray:
    """Round float64 values to ``fmt`` (RNE, saturating nothing) and return the bit patterns."""
    if fmt == "tf32":
        b = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
        # round to nearest even on the 13 dropped bits (finite values only)
        r = (b + 0xFFF + ((b >> 13) & 1)) & ~np.uint64(0x1FFF)
        fin = np.isfinite(np.asarray(x, np.float32))
        return np.where(fin, r, b).astype(np.uint32)
    return np.asarray(x).astype(_NP[fmt]).view(STORAGE[fmt])


def assemble(fmt: str, sign, expo, frac) -> np.ndarray:
    eb, mb, _ = FORMATS[fmt]
    sign = np.asarray(sign, np.uint64)
    expo = np.asarray(expo, np.uint64)
    frac = np.asarray(frac, np.uint64)
    bits = (sign << np.uint64(eb + mb)) | (expo << np.uint64(mb)) | frac
    if fmt == "tf32":
        bits = bits << np.uint64(13)
    return bits.astype(STORAGE[fmt])


def pack_slots(vals_bits: np.ndarray, bits: int, nregs: int) -> np.ndarray:
    """(T, threads, nregs*per) element patterns -> (T, threads, nregs) u32 registers, element 0
    lowest (a 64-bit element: two registers, low word first)."""
    T, threads = vals_bits.shape[:2]
    if bits == 64:
        v = vals_bits.astype(np.uint64)
        lo = (v & np.uint64(0xFFFFFFFF)).astype(np.uint32)
        hi = (v >> np.uint64(32)).astype(np.uint32)
        return np.stack([lo, hi], -1).reshape(T, threads, nregs)
    per = 32 // bits
    v = vals_bits.astype(np.uint64).reshape(T, threads, nregs, per)
    out = np.zeros(v.shape[:3], np.uint64)
    for s in range(per):
        out |= (v[..., s] & np.uint64((1 << bits) - 1)) << np.uint64(s * bits)
    return out.astype(np.uint32)


def _rand_frac(rng, fmt, shape):
    mb = FORMATS[fmt][1]
    return rng.integers(0, 1 << mb, size=shape, dtype=np.uint64)


def exps_bits(rng, fmt, shape, lo, hi, sign=None):
    """Random values with biased exponent field uniform in [lo, hi] (0 gives subnormals)."""
    eb, mb, has_inf = FORMATS[fmt]
    s = rng.integers(0, 2, size=shape) if sign is None else np.full(shape, sign)
    e = rng.integers(lo, hi + 1, size=shape)
    f = _rand_frac(rng, fmt, shape)
    if not has_inf:  # e4m3: exponent 15 with fraction 7 is NaN; keep it finite
        f = np.where((e == (1 << eb) - 1) & (f == (1 << mb) - 1), f - 1, f)
    return assemble(fmt, s, e, f)


def max_exp_field(fmt):
    eb, _, has_inf = FORMATS[fmt]
    return (1 << eb) - 2 if has_inf else (1 << eb) - 1


def specials(rng, fmt, shape):
    """A mix of zeros, subnormals, min normal, max finite, infinities, NaN and ordinary values."""
    eb, mb, has_inf = FORMATS[fmt]
    emax = max_exp_field(fmt)
    s = rng.integers(0, 2, size=shape)
    kind = rng.integers(0, 10, size=shape)
    e = rng.integers(max(emax // 2 - 3, 1), emax // 2 + 4, size=shape)
    f = _rand_frac(rng, fmt, shape)
    e = np.where(kind == 0, 0, e)
    f = np.where(kind == 0, 0, f)  # +-0
    e = np.where(kind == 1, 0, e)  # subnormal (or zero when f == 0)
    e = np.where(kind == 2, 1, e)
    f = np.where(kind == 2, 0, f)  # min normal
    maxf = (1 << mb) - 1 if has_inf else (1 << mb) - 2
    e = np.where(kind == 3, emax, e)
    f = np.where(kind == 3, maxf, f)  # max finite
    if has_inf:
        e = np.where(kind == 4, emax + 1, e)
        f = np.where(kind == 4, 0, f)  # inf
        e = np.where(kind == 5, emax + 1, e)
        f = np.where(kind == 5, 1 + (f % ((1 << mb) - 1)), f)  # nan
    else:
        e = np.where(kind >= 4, np.where(kind == 5, emax, e), e)
        f = np.where(kind == 5, (1 << mb) - 1, f)  # nan (S.1111.111)
    return assemble(fmt, s, e, f.astype(np.uint64))


def float_operands(cls: str, rng: np.random.Generator, fmt_ab, fmt_c, T, M, N, K):
    """A (T,M,K), B (T,K,N) bits in ``fmt_ab`` (a pair for mixed fp8) and C (T,M,N) in ``fmt_c``."""
    fa, fb = (fmt_ab, fmt_ab) if isinstance(fmt_ab, str) else fmt_ab
    sa, sb, sc = (T, M, K), (T, K, N), (T, M, N)
    randn = rng.standard_normal
    if cls == "normal":
        return from_float(randn(sa), fa), from_float(randn(sb), fb), from_float(randn(sc), fmt_c)
    if cls == "positive":
        return (from_float(abs(randn(sa)), fa), from_float(abs(randn(sb)), fb),
                from_float(abs(randn(sc)), fmt_c))
    if cls == "spread":
        a = exps_bits(rng, fa, sa, 1, max_exp_field(fa))
        b = exps_bits(rng, fb, sb, 1, max_exp_field(fb))
        bias_c = (1 << (FORMATS[fmt_c][0] - 1)) - 1
        span = min(bias_c - 1, 2 * ((1 << (FORMATS[fa][0] - 1)) - 1))
        c = exps_bits(rng, fmt_c, sc, bias_c - span, bias_c + span)
        return a, b, c
    if cls == "cancel":
        a = randn(sa)
        b = randn(sb)
        h = 2 * (K // 2)
        a[..., 1:h:2] = -a[..., 0:h:2]
        b[:, 1:h:2, :] = b[:, 0:h:2, :]
        if K >= 2:  # leave a small residual in the last pair of some rows
            pert = rng.random((T, M)) < 0.5
            a[..., h - 1] = np.where(pert, -a[..., h - 2] * (1 + 2.0 ** -7), a[..., h - 1])
        c = randn(sc) * 2.0 ** -12 * (rng.random(sc) < 0.5)
        return from_float(a, fa), from_float(b, fb), from_float(c, fmt_c)
    if cls == "dominant":
        a = randn(sa) * 2.0 ** -5
        b = randn(sb)
        k = rng.integers(0, K, size=(T, M))
        big = np.sign(randn((T, M))) * (1 + rng.random((T, M))) * 2.0 ** 6
        np.put_along_axis(a, k[..., None], big[..., None], axis=2)
        c = randn(sc) * 2.0 ** -6
        return from_float(a, fa), from_float(b, fb), from_float(c, fmt_c)
    if cls == "special":
        return specials(rng, fa, sa), specials(rng, fb, sb), specials(rng, fmt_c, sc)
    if cls == "bigc":
        c = randn(sc) * 2.0 ** rng.integers(6, 26, size=sc)
        if fmt_c == "f16":
            c = np.clip(c, -60000, 60000)
        return from_float(randn(sa), fa), from_float(randn(sb), fb), from_float(c, fmt_c)
    if cls == "tiny":
        a = exps_bits(rng, fa, sa, 0, 3)
        b = exps_bits(rng, fb, sb, 0, 3)
        c = exps_bits(rng, fmt_c, sc, 0, 3)
        # some rows with ordinary B so that products land just above the subnormal range
        mix = rng.random((T, 1, N)) < 0.3
        b = np.where(mix, from_float(randn(sb), fb), b)
        return a, b, c
    if cls in ZERO_CLASSES + UNDERFLOW_CLASSES:
        return zero_operands(cls, rng, fa, fb, fmt_c, T, M, N, K)
    if cls == "overflow":
        a = exps_bits(rng, fa, sa, max_exp_field(fa) - 1, max_exp_field(fa))
        b = exps_bits(rng, fb, sb, max_exp_field(fb) - 1, max_exp_field(fb))
        c = exps_bits(rng, fmt_c, sc, max_exp_field(fmt_c) - 1, max_exp_field(fmt_c))
        return a, b, c
    raise ValueError(cls)


INT_RANGE = {"s8": (-128, 127), "u8": (0, 255), "s4": (-8, 7), "u4": (0, 15), "b1": (0, 1)}


def int_operands(cls: str, rng, t: str, T, M, N, K):
    """A (T,M,K), B (T,K,N) integers of type ``t`` (as int32) and C (T,M,N) int32."""
    lo, hi = INT_RANGE[t]
    sa, sb, sc = (T, M, K), (T, K, N), (T, M, N)
    if cls == "random":
        a, b = rng.integers(lo, hi + 1, sa), rng.integers(lo, hi + 1, sb)
        c = rng.integers(-(2 ** 31), 2 ** 31, sc)
    elif cls == "extreme":
        a = rng.choice([lo, hi], sa)
        b = rng.choice([lo, hi], sb)
        c = rng.choice([-(2 ** 31), -(2 ** 31) + 1, 2 ** 31 - 1, 2 ** 31 - 2], sc) - rng.integers(-4000, 4000, sc)
        c = np.clip(c, -(2 ** 31), 2 ** 31 - 1)
    elif cls == "small":
        a = rng.integers(max(lo, -3), min(hi, 3) + 1, sa)
        b = rng.integers(max(lo, -3), min(hi, 3) + 1, sb)
        c = rng.integers(-100, 100, sc)
    else:
        raise ValueError(cls)
    return a.astype(np.int32), b.astype(np.int32), c.astype(np.int32)


def _signed_c(rng, fmt_c, shape, scale):
    """C of every sign and size around a result near zero: +-0, +-tiny (exponent field 0..3, i.e.
    subnormal or barely normal), +-small (``scale`` * 2**-30) and +-ordinary (``scale``)."""
    kind = rng.integers(0, 4, size=shape)
    sign = rng.integers(0, 2, size=shape)
    tiny = exps_bits(rng, fmt_c, shape, 0, 3, sign=0)
    mag = np.abs(rng.standard_normal(shape)) + 0.5
    small = from_float(mag * scale * 2.0 ** -30, fmt_c)
    ordinary = from_float(mag * scale, fmt_c)
    c = np.where(kind == 0, np.zeros_like(tiny), np.where(kind == 1, tiny, np.where(kind == 2, small, ordinary)))
    eb, mb, _ = FORMATS[fmt_c]
    sbit = (1 << (eb + mb)) << (13 if fmt_c == "tf32" else 0)
    return np.where(sign == 1, c | STORAGE[fmt_c](sbit), c).astype(STORAGE[fmt_c])


def _pow2(rng, shape, lo, hi):
    return 2.0 ** rng.integers(lo, hi + 1, size=shape)


def zero_operands(cls, rng, fa, fb, fmt_c, T, M, N, K):
    """Operands of the ZERO_CLASSES (bit patterns as :func:`float_operands` returns them)."""
    sa, sb, sc = (T, M, K), (T, K, N), (T, M, N)
    # magnitudes every input format holds exactly (at most 3 significant bits times a power of
    # two): "big" products 2**12..2**14 and "small" ones 2**-18..2**-10, most of them below the
    # alignment window of 25 bits under the big ones (e4m3's small values are its subnormals)
    small_exp = (-7, -7) if "e4m3" in (fa, fb) else (-7, -6)
    sig = lambda shape: rng.integers(1, 8, size=shape) / 4.0  # noqa: E731
    sgn = lambda shape: np.where(rng.random(shape) < 0.5, -1.0, 1.0)  # noqa: E731
    h = 2 * (K // 2)
    if cls == "zcancel":  # products in pairs p, -p
        a = sgn(sa) * sig(sa) * _pow2(rng, sa, 1, 6)
        b = sgn(sb) * sig(sb) * _pow2(rng, sb, 1, 6)
        a[..., 1:h:2] = -a[..., 0:h:2]
        b[:, 1:h:2, :] = b[:, 0:h:2, :]
        scale = 2.0 ** 4
    elif cls == "ztrunc":  # one big pair cancelling, the other terms far below the alignment window
        a = sig(sa) * _pow2(rng, sa, *small_exp)
        b = sig(sb) * _pow2(rng, sb, *small_exp)
        # per tile, the small products' signs: random, all negative or all positive
        mode = rng.integers(0, 3, size=(T, 1, 1))
        a = np.where(mode == 0, sgn(sa) * a, np.where(mode == 1, -a, a))
        big_a = rng.integers(4, 8, size=(T, M)) / 4.0 * 2.0 ** 6
        big_b = rng.integers(4, 8, size=(T, N)) / 4.0 * 2.0 ** 6
        k = rng.integers(0, h // 2, size=T) * 2
        for t in range(T):
            a[t, :, k[t]] = big_a[t]
            a[t, :, k[t] + 1] = -big_a[t]
            b[t, k[t], :] = big_b[t]
            b[t, k[t] + 1, :] = big_b[t]
        scale = 2.0 ** 12
    elif cls == "zprod":  # every product a signed zero
        mode = rng.integers(0, 4, size=(T, 1, 1))  # signs: random, all -0 products, all +0, mixed by row
        za = np.where(rng.random(sa) < 0.5, -0.0, 0.0)
        vb = sgn(sb) * sig(sb) * _pow2(rng, sb, 0, 4)
        za = np.where(mode == 1, -0.0, np.where(mode == 2, 0.0, za))
        vb = np.where((mode == 1) | (mode == 2), np.abs(vb), vb)
        rows = rng.random((T, M, 1)) < 0.5
        za = np.where((mode == 3) & rows, -0.0, np.where(mode == 3, 0.0, za))
        # half the tiles take the zeros in B instead of A
        swap = rng.random((T, 1, 1)) < 0.5
        va = sgn(sa) * sig(sa) * _pow2(rng, sa, 0, 4)
        zb = np.where(rng.random(sb) < 0.5, -0.0, 0.0)
        a = np.where(swap, np.abs(va), za)
        b = np.where(swap, np.where(mode == 1, -0.0, np.where(mode == 2, 0.0, zb)), vb)
        scale = 1.0
    elif cls == "zunder":  # nonzero sums below the output's smallest subnormal: the sign of that zero
        # products of 2**-36..2**-32 for a binary16 D; 2**-168..2**-156 for a binary32 D where the
        # inputs reach (bf16, tf32); otherwise just tiny; per tile all negative, all positive or mixed
        wide = fa in ("bf16", "tf32") and fb in ("bf16", "tf32")
        lo, hi = (-18, -16) if fmt_c == "f16" and "e4m3" not in (fa, fb) and "e5m2" not in (fa, fb) else (
            (-84, -78) if wide else ((-7, -6) if "e4m3" in (fa, fb) else (-22, -20)))
        a = sig(sa) * _pow2(rng, sa, lo, hi)
        b = sig(sb) * _pow2(rng, sb, lo, hi)
        mode = rng.integers(0, 3, size=(T, 1, 1))
        a = np.where(mode == 0, sgn(sa) * a, np.where(mode == 1, -a, a))
        zeros = np.where(rng.random(sc) < 0.5, -0.0, 0.0)
        c = np.where(rng.random(sc) < 0.75, from_float(zeros, fmt_c), _signed_c(rng, fmt_c, sc, 1.0))
        return from_float(a, fa), from_float(b, fb), c.astype(STORAGE[fmt_c])
    else:  # zexact: C = -(A @ B) exactly for most outputs (small integers times powers of two)
        ea = rng.integers(-2, 1, size=(T, 1, 1))
        eb = rng.integers(-2, 1, size=(T, 1, 1))
        a = rng.integers(-3, 4, size=sa) * 2.0 ** ea
        b = rng.integers(-3, 4, size=sb) * 2.0 ** eb
        exact = a @ b
        c = -exact
        flip = rng.random(sc) < 0.25  # the others: C = +(A @ B), or -(A @ B) -+ a small offset
        c = np.where(flip, np.where(rng.random(sc) < 0.5, exact, -exact + sgn(sc) * 2.0 ** -4), c)
        c_bits = from_float(c, fmt_c)
        return from_float(a, fa), from_float(b, fb), c_bits
    return from_float(a, fa), from_float(b, fb), _signed_c(rng, fmt_c, sc, scale)
