"""The fused block-FMA engine against exact rational arithmetic (tests/exact_reference.py), the
published feature tests of Fasi et al. (2021), and ml_dtypes' conversions."""
from __future__ import annotations

import math
from fractions import Fraction as Fr

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tcemu
from tcemu._src import formats as fm
from tcemu._src.numerics import engine
from tcemu._src.numerics.rounding import divide, divide_exact, round_pack, round_pack32

import exact_reference as X
from conftest import tcemu_env

MODELS = [
    tcemu.BlockFMA(fraction_bits=23, block_size=4),
    tcemu.BlockFMA(fraction_bits=24, block_size=8),
    tcemu.BlockFMA(fraction_bits=25, block_size=16),
    tcemu.BlockFMA(fraction_bits=13, block_size=32, accumulator_fraction_bits=13),
    tcemu.BlockFMA(fraction_bits=28, block_size=2, rounding="rne"),
    tcemu.BlockFMA(fraction_bits=20, block_size=3, rounding="ru"),
    tcemu.BlockFMA(fraction_bits=27, block_size=5, rounding="rd"),
    tcemu.BlockFMA(fraction_bits=24, block_size=16, rounding="rna", normalize_products=True),
    tcemu.BlockFMA(fraction_bits=25, block_size=16, zero_exponent=None),
]
FORMATS = {"f16": fm.F16, "bf16": fm.BF16, "tf32": fm.TF32, "e4m3": fm.E4M3, "e5m2": fm.E5M2}


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mi=st.integers(0, len(MODELS) - 1), fmt=st.sampled_from(sorted(FORMATS)), acc=st.sampled_from(["f32", "f16"]),
       spread=st.booleans(), seed=st.integers(0, 2 ** 31 - 1))
def _engine_vs_exact_examples(mi, fmt, acc, spread, seed):
    _engine_vs_exact(MODELS[mi], fmt, acc, spread, seed)


@pytest.mark.parametrize("path", ["default", "int-unrolled"])
def test_engine_equals_exact_rational_model(path):
    """Both code paths: the default (CPU) one, and integer alignment with unrolled term sums."""
    with tcemu_env({"TCEMU_ALIGN": "int", "TCEMU_UNROLL": "1"} if path == "int-unrolled" else {}):
        _engine_vs_exact_examples()


def _engine_vs_exact(m, fmt, acc, spread, seed):
    if acc == "f16" and m.accumulator_fraction_bits != 23:
        return
    rng = np.random.default_rng(seed)
    K, n = 32, 24
    a = [X.random_bits(rng, fmt, K, spread) for _ in range(n)]
    b = [X.random_bits(rng, fmt, K, spread) for _ in range(n)]
    cfmt = acc
    scale = 2.0 ** rng.integers(-30, 30 if acc == "f32" else 14, n) if spread else 1.0
    cv = (rng.standard_normal(n) * scale).astype(np.float32 if acc == "f32" else np.float16)
    c = [int(x) for x in cv.view(np.uint32 if acc == "f32" else np.uint16)]
    got = engine.fused_dot(jnp.asarray(np.array(a, np.uint32))[:, None, :], FORMATS[fmt],
                           jnp.asarray(np.array(b, np.uint32))[:, :, None], FORMATS[fmt],
                           jnp.asarray(np.array(c, np.uint32))[:, None, None], fm.FORMATS[cfmt], m, acc=acc)
    got = np.asarray(got)[:, 0, 0]
    mode = m.f16_rounding if acc == "f16" else m.rounding
    for i in range(n):
        want = X.fused_dot(a[i], fmt, b[i], fmt, c[i], cfmt, m.fraction_bits, m.block_size, mode, acc,
                           m.accumulator_fraction_bits, m.zero_exponent, m.normalize_products)
        if want is None:
            continue
        assert int(got[i]) == X.to_bits(want, acc), (i, want)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mi=st.integers(0, len(MODELS) - 1), fmt=st.sampled_from(sorted(FORMATS)), seed=st.integers(0, 2 ** 31 - 1),
       exact_zero=st.sampled_from(["+0", "ieee"]))
def test_deferred_specials_flag_every_output_they_change(mi, fmt, seed, exact_zero):
    """Under ``engine.deferred_specials`` (GEMM fast path) every output whose bits would differ
    from the exact path comes back as NaN: random bit patterns (NaN, inf, subnormals, zeros of both
    signs), C with specials, all-negative-zero rows and exact cancellations."""
    m, f = MODELS[mi].replace(exact_zero=exact_zero), FORMATS[fmt]
    rng = np.random.default_rng(seed)
    n, K = 64, 32
    keep = np.uint32(((1 << f.storage_bits) - 1) & ~((1 << f.shift) - 1))
    a = rng.integers(0, 1 << 32, (n, K), dtype=np.uint64).astype(np.uint32) & keep
    b = rng.integers(0, 1 << 32, (n, K), dtype=np.uint64).astype(np.uint32) & keep
    c = rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32)
    c[:8] = [0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0x80000000, 0x80000000, 0x80000001]
    sign = np.uint32(1 << (f.storage_bits - 1))
    a[5:8], b[5:8] = sign, 0                        # all products -0: with C = -0 the sum is -0
    a[8:12] = a[8:12] & ~np.uint32(sign)            # finite positive rows
    b[8:12, :] = b[8:12, :1]
    x, y = (jnp.asarray(v) for v in (a[:, None, :], b[:, :, None]))
    exact = np.asarray(engine.fused_dot(x, f, y, f, jnp.asarray(c)[:, None, None], fm.F32, m)).ravel()
    with engine.deferred_specials():
        fast = np.asarray(engine.fused_dot(x, f, y, f, jnp.asarray(c)[:, None, None], fm.F32, m)).ravel()
    flagged = np.isnan(fast.view(np.float32))
    np.testing.assert_array_equal(fast[~flagged], exact[~flagged])
    assert flagged[2:5].all()
    if exact_zero == "ieee" and m.rounding != "rd":  # all addends -0: IEEE -0 (the slow path's sign)
        assert flagged[5:7].all() and (exact[5:7] == 0x80000000).all()
    elif exact_zero == "+0":  # a tensor core's exact zero is +0, also when every addend is -0
        assert (exact[5:7] == 0).all()


@pytest.mark.parametrize("mode", ["rz", "rne", "ru", "rd"])
def test_exact_zero_sign(mode):
    """Sums that are exactly zero: +0 under exact_zero="+0"; under "ieee" -0 when every addend is
    -0, and under "rd" for every exact zero that is not a sum of +0s (IEEE 754, 6.3)."""
    one, mone, neg0 = 0x3C00, 0xBC00, 0x8000
    a = np.array([[one, one], [neg0, neg0], [0, 0], [one, one]], np.uint32)[:, None, :]
    b = np.array([[one, mone], [one, one], [one, one], [one, mone]], np.uint32)[:, :, None]
    c = np.array([0x80000000, 0x80000000, 0, 0], np.uint32)[:, None, None]  # 1 - 1 - 0, -0 - 0 - 0, +0, 1 - 1 + 0
    want = {"+0": [0, 0, 0, 0],
            "ieee": [0x80000000, 0x80000000, 0, 0x80000000] if mode == "rd" else [0, 0x80000000, 0, 0]}
    for ez, w in want.items():
        m = tcemu.BlockFMA(fraction_bits=25, block_size=2, rounding=mode, exact_zero=ez)
        got = engine.fused_dot(jnp.asarray(a), fm.F16, jnp.asarray(b), fm.F16, jnp.asarray(c), fm.F32, m)
        assert np.asarray(got).ravel().tolist() == w, (ez, mode)


def _fasi(model, a, b, c, out="f32"):
    """One dot product of fp16 a, b (lists) and c (f32, or f16 when out='f16')."""
    A = jnp.asarray(np.array(a, np.float16))[None, :]
    B = jnp.asarray(np.array(b, np.float16))[:, None]
    cdt = jnp.float32 if out == "f32" else jnp.float16
    C = jnp.asarray(np.array([[c]], cdt))
    d = engine.fused_dot(fm.to_bits(A, "f16"), fm.F16, fm.to_bits(B, "f16"), fm.F16, fm.to_bits(C, out),
                         fm.FORMATS[out], model, acc=out)
    return float(fm.from_bits(d, out)[0, 0])


V100, A100 = tcemu.numerics("V100").f16, tcemu.numerics("A100").f16
T = 2.0 ** -24


@pytest.mark.parametrize("model,a,b,c,want", [
    # Fasi et al. 2021 (tensor-cores-numerical-behavior): extra alignment bits
    (V100, [1, 0, 0, 0], [1, 0, 0, 0], -(1 - T), 2.0 ** -23),
    (A100, [1] + [0] * 7, [1] + [0] * 7, -(1 - T), 2.0 ** -24),
    # normalisation in subtraction
    (V100, [1, 1, 0, 0], [1, -T, 0, 0], -1 + T, 2.0 ** -23),
    (A100, [1, 1] + [0] * 6, [1, -T] + [0] * 6, -1 + T, 0.0),
    # round toward zero, positive and negative (truncation, not floor)
    (V100, [1, 1, 1, 1], [2, 2.0 ** -23 + T, 0, 0], 0.0, 2.0),
    (V100, [1, 1, 1, 1], [-2, -(2.0 ** -23 + T), 0, 0], 0.0, -2.0),
    # carry-out bits
    (V100, [1, 1, 1, 1], [2.0 ** -23, 1, 1, 1], 1 + 2.0 ** -22 + 2.0 ** -23, 4 + 2.0 ** -21),
    (V100, [1, 1, 1, 1], [1, 1.5, 1.75, 1.875], 1.875, 8.0),
    (V100, [1, 1, 1, 1], [1, 1, 1, 1], 1 + 2.0 ** -22 + 2.0 ** -23, 5.0),
])
def test_fasi_feature_tests(model, a, b, c, want):
    assert _fasi(model, a, b, c) == want


def test_fasi_non_monotonicity_v100():
    """Increasing c by one ulp decreases the V100 result (Fasi et al. 2021, section D5)."""
    lo = _fasi(V100, [1] * 4, [T] * 4, 1 - T)
    hi = _fasi(V100, [1] * 4, [T] * 4, 1.0)
    assert hi < lo


def test_fp16_output_rounds_to_nearest():
    assert _fasi(V100, [T, T, 0, 0], [0.5, 0.25, 0, 0], 0.0, out="f16") == T


def test_correctly_rounded_fma_chain():
    """BlockFMA(26, 1, rne, sticky) is an exact-then-RNE FMA per product (vs Fractions)."""
    fma = tcemu.BlockFMA(fraction_bits=26, block_size=1, rounding="rne", sticky=True)
    rng = np.random.default_rng(3)
    n = 200
    a, b = rng.standard_normal((2, n)).astype(np.float16)
    c = (rng.standard_normal(n) * 2.0 ** rng.integers(-20, 20, n)).astype(np.float32)
    d = engine.fused_dot(fm.to_bits(jnp.asarray(a)[:, None, None], "f16"), fm.F16,
                         fm.to_bits(jnp.asarray(b)[:, None, None], "f16"), fm.F16,
                         fm.to_bits(jnp.asarray(c)[:, None, None], "f32"), fm.F32, fma)
    got = np.asarray(fm.from_bits(d, "f32")).ravel()
    for i in range(n):
        want = X.round_to(Fr(float(a[i])) * Fr(float(b[i])) + Fr(float(c[i])), 23, -126, 127, "rne")
        assert got[i] == float(want), i


@settings(max_examples=200, deadline=None)
@given(hi=st.integers(0, 2 ** 20), lo=st.integers(0, 2 ** 16 - 1), q=st.integers(-170, 120),
       sign=st.integers(0, 1), mode=st.sampled_from(["rz", "rne", "rna", "ru", "rd"]),
       fmt=st.sampled_from(["f32", "f16"]), ovf=st.sampled_from(["inf", "ieee"]))
def test_round_pack_equals_exact_rounding(hi, lo, q, sign, mode, fmt, ovf):
    F = fm.FORMATS[fmt]
    got = int(round_pack(jnp.int32(sign), jnp.uint32(hi), jnp.uint32(lo), jnp.int32(q), F, mode, overflow=ovf))
    x = Fr(hi * 65536 + lo) * Fr(2) ** q * (-1 if sign else 1)
    want = X.round_to(x, F.fraction_bits, F.emin, F.emax, mode, ovf)
    if want == 0:
        want_bits = (1 << (F.storage_bits - 1)) if sign else 0
    else:
        want_bits = X.to_bits(want, fmt)
    assert got == want_bits


@pytest.mark.parametrize("fmt", ["f32", "f16"])
@pytest.mark.parametrize("ovf", ["inf", "ieee"])
def test_round_pack32_equals_exact_rounding(fmt, ovf):
    """The one-word rounding (magnitudes below 2**32) against exact rounding of Fractions, for
    magnitudes of every bit length and exponents through subnormals and overflow; stochastic
    rounding against the two-word round_pack with the same random bits."""
    F = fm.FORMATS[fmt]
    rng = np.random.default_rng(len(fmt) + len(ovf))
    n = 600
    m = (rng.integers(0, 2 ** 32, n, dtype=np.uint64) >> rng.integers(0, 33, n).astype(np.uint64)).astype(np.uint32)
    q = rng.integers(-170, 110, n).astype(np.int32)
    sign = rng.integers(0, 2, n).astype(np.int32)
    for mode in ("rz", "rne", "rna", "ru", "rd"):
        got = np.asarray(round_pack32(jnp.asarray(sign), jnp.asarray(m), jnp.asarray(q), F, mode, overflow=ovf))
        for i in range(n):
            want = X.round_to(Fr(int(m[i])) * Fr(2) ** int(q[i]) * (-1 if sign[i] else 1), F.fraction_bits, F.emin,
                              F.emax, mode, ovf)
            want_bits = ((1 << (F.storage_bits - 1)) if sign[i] else 0) if want == 0 else X.to_bits(want, fmt)
            assert int(got[i]) == want_bits, (int(m[i]), int(q[i]), int(sign[i]), mode)
    rand = jnp.asarray(rng.integers(0, 2 ** 32, n, dtype=np.uint64).astype(np.uint32))
    args = (jnp.asarray(sign), jnp.asarray(m >> 16), jnp.asarray(m & 0xFFFF), jnp.asarray(q), F, "stochastic")
    np.testing.assert_array_equal(
        np.asarray(round_pack32(jnp.asarray(sign), jnp.asarray(m), jnp.asarray(q), F, "stochastic", overflow=ovf,
                                rand=rand)),
        np.asarray(round_pack(*args, overflow=ovf, rand=rand)))


@pytest.mark.parametrize("div", [divide, divide_exact], ids=["divide", "divide_exact"])
def test_divide_is_correctly_rounded(div):
    """The float32 division of the NVFP4 recipe (XLA's on the CPU where no subnormal is involved,
    else the integer one that GPUs run) and the integer one alone, against exact rounding of
    Fractions, and against the host's IEEE division on random bit patterns of every class
    (subnormals, zeros, infinities, NaN)."""
    rng = np.random.default_rng(7)
    n = 1 << 16
    xb, yb = (rng.integers(0, 2 ** 32, n, dtype=np.uint64).astype(np.uint32) for _ in range(2))
    xb[:500], yb[500:1000] = (rng.integers(0, 1 << 23, 500).astype(np.uint32) for _ in range(2))
    special = np.array([0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 1, 0x807FFFFF, 0x7F7FFFFF], np.uint32)
    xb[1000:1064], yb[1000:1064] = (v.ravel() for v in np.meshgrid(special, special))
    x, y = xb.view(np.float32), yb.view(np.float32)
    got = np.asarray(jax.jit(div)(x, y))
    with np.errstate(all="ignore"):
        want = x / y
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)
    np.testing.assert_array_equal(got.view(np.uint32)[ok], want.view(np.uint32)[ok])
    for i in range(0, 1000, 5):  # finite nonzero operands, subnormals among them
        if y[i] != 0 and np.isfinite(x[i]) and np.isfinite(y[i]):
            q = X.round_to(Fr(float(x[i])) / Fr(float(y[i])), 23, -126, 127, "rne")
            zero = (int(xb[i] ^ yb[i]) >> 31) << 31  # an underflow to zero keeps the quotient's sign
            assert (zero if q == 0 else X.to_bits(q, "f32")) == int(got.view(np.uint32)[i]), i


@pytest.mark.parametrize("dst,dtype", [(fm.BF16, ml_dtypes.bfloat16), (fm.F16, np.float16),
                                       (fm.E5M2, ml_dtypes.float8_e5m2)])
def test_convert_matches_ml_dtypes(dst, dtype):
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(20000) * 2.0 ** rng.integers(-140, 127, 20000)).astype(np.float32)
    x = np.concatenate([x, np.array([0.0, -0.0, np.inf, -np.inf, 65504, 65520, 1e-45], np.float32)])
    got = np.asarray(engine.convert(jnp.asarray(x.view(np.uint32)), fm.F32, dst, "rne"))
    with np.errstate(over="ignore"):
        want = x.astype(dtype)
    want = want.view({1: np.uint8, 2: np.uint16}[np.dtype(dtype).itemsize]).astype(np.uint32)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("mode", ["rz", "rne", "rna"])
def test_convert_f32_to_tf32_matches_exact_rounding(mode):
    # binary32 bit patterns (normal, subnormal, near the top, specials) rounded to tf32's 10 fraction
    # bits, against Fractions; NaN gives tf32's canonical NaN, an underflow keeps the sign
    rng = np.random.default_rng(5)
    x = rng.integers(0, 2 ** 32, 3000, dtype=np.uint64).astype(np.uint32)
    x[:600] = (x[:600] & np.uint32(0x807FFFFF)) | (rng.integers(0, 3, 600).astype(np.uint32) << 23)  # subnormal
    x[600:900] = (x[600:900] & np.uint32(0x807FFFFF)) | np.uint32(0x7F000000)  # the top binade
    x[900:1200] = (x[900:1200] & np.uint32(0x80003FFF)) | np.uint32(0x3F800000) | np.uint32(0x1000)  # ties
    x = np.concatenate([x, np.array([0, 0x80000000, 0x7F800000, 0xFF800000, 0x7F800001, 0xFFC00000, 0x7F7FFFFF,
                                     0x7F7FF000, 0x7F7FEFFF, 1, 0x1000, 0x80001001], np.uint32)])
    got = np.asarray(engine.convert(jnp.asarray(x), fm.F32, fm.TF32, mode))
    for bits, out in zip(x.tolist(), got.tolist()):
        v = X.value(bits, "f32")
        if isinstance(v, float) and math.isnan(v):
            assert out == fm.TF32.canonical_nan, hex(bits)
            continue
        q = v if isinstance(v, float) else X.round_to(v, 10, -126, 127, mode)
        want = (bits & 0x80000000) if q == 0 else X.to_bits(q, "f32")
        assert out == want, (hex(bits), hex(out), hex(want))


def test_stochastic_rounding_is_unbiased_and_keyed():
    """1 + 2**-25 lies a quarter of the way from 1 to the next float32: rounded up 1/4 of the time."""
    m = tcemu.BlockFMA(fraction_bits=28, block_size=1, rounding="stochastic")
    n = 4000
    bits16 = lambda v: jnp.full((n, 1, 1), np.float16(v)).view(jnp.uint16).astype(jnp.uint32)  # noqa: E731
    a, b = bits16(2.0 ** -12), bits16(2.0 ** -13)
    c = jnp.full((n, 1, 1), np.float32(1.0)).view(jnp.uint32)
    key = jax.random.key(0)
    d = engine.fused_dot(a, fm.F16, b, fm.F16, c, fm.F32, m, key=key)
    vals = np.asarray(d).view(np.float32).ravel()
    assert set(np.unique(vals)) <= {np.float32(1.0), np.float32(1 + 2.0 ** -23)}
    assert 0.22 < np.mean(vals == np.float32(1 + 2.0 ** -23)) < 0.28
    np.testing.assert_array_equal(np.asarray(engine.fused_dot(a, fm.F16, b, fm.F16, c, fm.F32, m, key=key)),
                                  np.asarray(d))
    with pytest.raises(ValueError, match="PRNG key"):
        engine.fused_dot(a, fm.F16, b, fm.F16, c, fm.F32, m)


def test_model_validation():
    with pytest.raises(ValueError, match="fraction_bits must be in 1..28"):
        tcemu.BlockFMA(fraction_bits=40)
    with pytest.raises(ValueError, match="rounding must be one of"):
        tcemu.BlockFMA(rounding="nearest")
    with pytest.raises(ValueError, match="permutation"):
        tcemu.BlockFMA(block_order=(0, 0, 1))
