"""Blackwell kinds beyond MMA-Sim's presets: the engine on fp6/fp4 elements and block scales
against exact rational arithmetic (tests/exact_reference.py) for models other than the presets,
and every way the new spellings, arrays and registers can be wrong."""
from __future__ import annotations

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tcemu
from tcemu._src import formats as fm
from tcemu._src.isa.parse import F8F6F4, parse
from tcemu._src.numerics import grouped, presets

import exact_reference as X

SPELL = {
    "f8f6f4": "mma.sync.aligned.m16n8k32.row.col.kind::f8f6f4.{d}.{a}.{b}.{d}",
    "mxf8f6f4": "mma.sync.aligned.m16n8k32.row.col.kind::mxf8f6f4.block_scale.scale_vec::1X.f32.{a}.{b}.f32.ue8m0",
    "nvf4": "mma.sync.aligned.m16n8k64.row.col.kind::mxf4nvf4.block_scale.scale_vec::4X.f32.e2m1.e2m1.f32.ue4m3",
}


def _codes(rng, t, shape, extreme=False):
    """Finite element codes of ``t``; ``extreme``: the smallest and largest exponents only."""
    eb, fb, _ = X.FMT[t]
    n = 1 + eb + fb
    c = rng.integers(0, 1 << n, shape)
    if extreme:
        e = rng.choice([0, 1, (1 << eb) - 2, (1 << eb) - 1], size=shape)
        c = (c & ~(((1 << eb) - 1) << fb)) | (e << fb)
    if t in ("e4m3", "e5m2"):  # no NaN/inf here
        top = ((1 << eb) - 1) << fb
        bad = (c & top) == top if t == "e5m2" else (c & 0x7F) == 0x7F
        c = np.where(bad, c & ~(1 << fb), c)
    return c.astype(np.uint32)


def _c_bits(rng, n):
    v = rng.standard_normal(n) * 2.0 ** rng.integers(-140, 100, n)
    return np.where(rng.random(n) < 0.2, 0, v.astype(np.float32).view(np.uint32)).astype(np.uint32)


GROUPED = [presets.MXF4, presets.MXF4.replace(fraction_bits=20), presets.MXF4.replace(fraction_bits=28),
           presets.MXF4.replace(scale_group=8, block_size=32), presets.MXF4.replace(scale_group=32, rounding="rne"),
           presets.MXF4.replace(zero_exponent=-126, rounding="rd")]


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mi=st.integers(0, len(GROUPED) - 1), stype=st.sampled_from(["ue8m0", "ue4m3"]), block=st.sampled_from([16, 32]),
       extreme=st.booleans(), seed=st.integers(0, 2 ** 31 - 1))
def test_grouped_fp4_equals_exact(mi, stype, block, extreme, seed):
    """kind::mxf4/mxf4nvf4 numerics (groups of products aligned by their scales) for the preset and
    other fraction bits, group sizes, block sizes, roundings and zero exponents."""
    m = GROUPED[mi]
    if block % m.scale_group:
        block = m.scale_group
    rng = np.random.default_rng(seed)
    n, K = 12, 64
    a = _codes(rng, "e2m1", (n, K), extreme)
    b = _codes(rng, "e2m1", (n, K), extreme)
    if extreme:
        a[:, : K // 2] &= 8  # zero groups (signed zeros)
    lo, hi = (0, 255) if stype == "ue8m0" else (0, 0x7F)
    sa = rng.integers(lo, hi, (n, K // block)) if extreme else rng.integers(100 if stype == "ue8m0" else 0x20, 150 if stype == "ue8m0" else 0x60, (n, K // block))
    sb = rng.integers(lo, hi, (n, K // block)) if extreme else rng.integers(100 if stype == "ue8m0" else 0x20, 150 if stype == "ue8m0" else 0x60, (n, K // block))
    c = _c_bits(rng, n)
    got = grouped.grouped_dot(jnp.asarray(a)[:, None, :], jnp.asarray(b)[:, :, None], jnp.asarray(c)[:, None, None],
                              fm.decode_scale(jnp.asarray(sa)[:, None, :], stype),
                              fm.decode_scale(jnp.asarray(sb)[:, :, None], stype), block, m)
    got = np.asarray(got)[:, 0, 0]
    for i in range(n):
        want = X.scaled_dot(a[i].tolist(), "e2m1", b[i].tolist(), "e2m1", [(int(x), stype) for x in sa[i]],
                            [(int(x), stype) for x in sb[i]], int(c[i]), m.fraction_bits, m.block_size, block,
                            m.zero_exponent, group=m.scale_group, mode=m.rounding)
        if want is None:
            continue
        assert int(got[i]) == X.to_bits(want, "f32"), (i, hex(int(got[i])), want)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(a=st.sampled_from(F8F6F4), b=st.sampled_from(F8F6F4), scaled=st.booleans(), extreme=st.booleans(),
       F=st.sampled_from([25, 13, 28]), L=st.sampled_from([32, 8]), seed=st.integers(0, 2 ** 31 - 1))
def test_f8f6f4_equals_exact(a, b, scaled, extreme, F, L, seed):
    """kind::f8f6f4 and kind::mxf8f6f4 (power-of-two scales added to the exponents) for any element
    pair, against exact arithmetic, with the preset and other fraction bits and block sizes."""
    m = presets.F8F6F4.replace(fraction_bits=F, block_size=L)
    rng = np.random.default_rng(seed)
    A = _codes(rng, a, (16, 32), extreme)
    B = _codes(rng, b, (32, 8), extreme)
    C = _c_bits(rng, 16 * 8).reshape(16, 8)
    sp = SPELL["mxf8f6f4" if scaled else "f8f6f4"].format(a=a, b=b, d="f32")
    sa = rng.integers(0, 255, (16, 1)) if scaled else np.full((16, 1), 127)
    sb = rng.integers(0, 255, (1, 8)) if scaled else np.full((1, 8), 127)
    from tcemu._src.numerics import mma as mma_numerics

    kw = dict(scale_a=jnp.asarray(sa), scale_b=jnp.asarray(sb)) if scaled else {}
    got = np.asarray(mma_numerics.mma_bits(parse(sp), jnp.asarray(A), jnp.asarray(B), jnp.asarray(C), m,
                                           arch="sm_120", **kw))
    for i in range(0, 16, 3):
        for j in range(8):
            want = X.scaled_dot(A[i].tolist(), a, B[:, j].tolist(), b, [(int(sa[i, 0]), "ue8m0")], [(int(sb[0, j]), "ue8m0")],
                                int(C[i, j]), F, L, 32, m.zero_exponent)
            if want is not None:
                assert int(got[i, j]) == X.to_bits(want, "f32"), (i, j)


def test_fp6_fp4_formats_match_ml_dtypes():
    """Every code of e3m2/e2m3/e2m1 decodes to ml_dtypes' value; none is NaN or infinite."""
    for t, dt in (("e3m2", ml_dtypes.float6_e3m2fn), ("e2m3", ml_dtypes.float6_e2m3fn), ("e2m1", ml_dtypes.float4_e2m1fn)):
        fmt = fm.FORMATS[t]
        codes = np.arange(1 << fmt.bits, dtype=np.uint8)
        d = fm.decode(jnp.asarray(codes), fmt)
        vals = np.where(np.asarray(d.sign) != 0, -1.0, 1.0) * np.asarray(d.sig) * 2.0 ** (np.asarray(d.exp) - fmt.fraction_bits)
        np.testing.assert_array_equal(vals, codes.view(dt).astype(np.float64))
        assert not np.asarray(d.is_nan).any() and not np.asarray(d.is_inf).any()
    s = fm.decode_scale(jnp.arange(256), "ue8m0")
    assert np.asarray(s.is_nan).tolist() == [False] * 255 + [True]
    np.testing.assert_array_equal(np.asarray(s.exp)[:255], np.arange(255) - 127)
    s4 = fm.decode_scale(jnp.arange(256), "ue4m3")  # the sign bit is ignored: 0x7F and 0xFF are NaN
    assert np.flatnonzero(np.asarray(s4.is_nan)).tolist() == [0x7F, 0xFF]


def test_value_level_accepts_codes_numpy_and_traced_fp4():
    rng = np.random.default_rng(0)
    a = rng.integers(0, 16, (16, 64)).astype(np.uint8)
    b = rng.integers(0, 16, (64, 8)).astype(np.uint8)
    sa = np.full((16, 2), 127, np.uint8)
    sb = np.full((2, 8), 126, np.uint8)
    sp = "mma.sync.aligned.m16n8k64.row.col.kind::mxf4.block_scale.f32.e2m1.e2m1.f32.ue8m0"
    c = jnp.zeros((16, 8), jnp.float32)
    d0 = tcemu.mma(sp, a, b, c, arch="sm_120", scale_a=sa, scale_b=sb)
    fa, fb = a.view(ml_dtypes.float4_e2m1fn), b.view(ml_dtypes.float4_e2m1fn)
    d1 = tcemu.mma(sp, fa, fb, c, arch="sm_120", scale_a=sa.view(ml_dtypes.float8_e8m0fnu), scale_b=sb)
    import jax

    d2 = jax.jit(lambda x, y: tcemu.mma(sp, x, y, c, arch="sm_120", scale_a=sa, scale_b=sb))(jnp.asarray(fa), jnp.asarray(fb))
    want = (fa.astype(np.float64) @ fb.astype(np.float64)) / 2  # exact: small integers and halves
    for d in (d0, d1, d2):
        np.testing.assert_array_equal(np.asarray(d), want.astype(np.float32))


BAD_SPELLINGS = [
    ("mma.sync.aligned.m16n8k32.row.col.f32.e2m1.e2m1.f32", "need .kind::f8f6f4"),
    ("mma.sync.aligned.m16n8k16.row.col.kind::f8f6f4.f32.e4m3.e4m3.f32", "has shape .m16n8k32"),
    ("mma.sync.aligned.m16n8k32.col.row.kind::f8f6f4.f32.e4m3.e4m3.f32", "must be .row.col"),
    ("mma.sync.aligned.m16n8k32.row.col.kind::f8f6f4.f32.e4m3.e4m3.f16", "dtype = ctype"),
    ("mma.sync.aligned.m16n8k32.row.col.kind::f8f6f4.f32.bf16.e4m3.f32", "atype, btype in"),
    ("mma.sync.aligned.m16n8k32.row.col.kind::f8f6f4.block_scale.f32.e4m3.e4m3.f32", "not block-scaled"),
    ("mma.sync.aligned.m16n8k32.row.col.kind::mxf8f6f4.f32.e4m3.e4m3.f32.ue8m0", "needs .block_scale"),
    ("mma.sync.aligned.m16n8k32.row.col.kind::mxf8f6f4.block_scale.scale_vec::2X.f32.e4m3.e4m3.f32.ue8m0",
     "not valid with .kind::mxf8f6f4"),
    ("mma.sync.aligned.m16n8k32.row.col.kind::mxf8f6f4.block_scale.f32.e4m3.e4m3.f32.ue4m3", "stype in {ue8m0}"),
    ("mma.sync.aligned.m16n8k64.row.col.kind::mxf4nvf4.block_scale.f32.e2m1.e2m1.f32.ue8m0", "needs a .scale_vec"),
    ("mma.sync.aligned.m16n8k64.row.col.kind::mxf4nvf4.block_scale.scale_vec::2X.f32.e2m1.e2m1.f32.ue4m3",
     "stype in {ue8m0}"),
    ("mma.sync.aligned.m16n8k64.row.col.kind::mxf4.block_scale.f32.e2m1.e4m3.f32.ue8m0", "atype, btype in {e2m1}"),
    ("mma.sync.aligned.m16n8k64.row.col.kind::mxf4.block_scale.f32.e2m1.e2m1.f32", "five types"),
    ("mma.sync.aligned.m16n8k32.row.col.block_scale.f32.e4m3.e4m3.f32", "need a block-scaled .kind"),
    ("mma.sync.aligned.m16n8k32.row.col.kind::f8f6f4.satfinite.f32.e4m3.e4m3.f32", "no .satfinite"),
    ("mma.sync.aligned.m16n8k32.row.col.kind::f9.f32.e4m3.e4m3.f32", "unknown qualifier .kind::f9"),
    ("tcgen05.mma.cta_group::2.kind::f16", "only .cta_group::1"),
    ("tcgen05.mma.kind::f16", "missing the cta_group"),
    ("tcgen05.mma.cta_group::1.kind::f16.block_scale", "not block-scaled"),
    ("tcgen05.mma.cta_group::1.kind::mxf4nvf4.block_scale", "needs a .scale_vec"),
    ("tcgen05.mma.cta_group::1.kind::mxf8f6f4", "needs .block_scale"),
    ("tcgen05.mma.cta_group::1.kind::mxf4.block_scale.block16", "not valid with .kind::mxf4"),
]


@pytest.mark.parametrize("sp,msg", BAD_SPELLINGS)
def test_bad_spellings(sp, msg):
    with pytest.raises(ValueError, match=msg.replace(".", r"\.").replace("{", r"\{").replace("}", r"\}")):
        parse(sp)


def test_spellings_in_any_qualifier_order_and_defaults():
    cut = "mma.sync.aligned.kind::mxf8f6f4.block_scale.scale_vec::1X.m16n8k32.row.col.f32.e4m3.e4m3.f32.ue8m0"
    ins = parse(cut)  # CUTLASS writes the kind before the shape
    assert (ins.family, ins.scale_block, ins.stype) == ("mxf8f6f4", 32, "ue8m0")
    assert parse("mma.sync.aligned.m16n8k64.row.col.kind::mxf4.block_scale.f32.e2m1.e2m1.f32.ue8m0").scale_vec == 2
    assert parse("tcgen05.mma.cta_group::1.kind::mxf4nvf4.block_scale.block16").scale_vec == 4
    assert parse("tcgen05.mma.cta_group::1.kind::mxf8f6f4.block_scale").scale_vec == 1


def _nvf4_args():
    a = np.zeros((16, 64), ml_dtypes.float4_e2m1fn)
    b = np.zeros((64, 8), ml_dtypes.float4_e2m1fn)
    c = np.zeros((16, 8), np.float32)
    sa = np.ones((16, 4), ml_dtypes.float8_e4m3fn)
    sb = np.ones((4, 8), ml_dtypes.float8_e4m3fn)
    return a, b, c, sa, sb


def test_value_level_errors():
    a, b, c, sa, sb = _nvf4_args()
    sp = SPELL["nvf4"]
    with pytest.raises(ValueError, match="pass scale_a of shape"):
        tcemu.mma(sp, a, b, c, arch="sm_120", scale_b=sb)
    with pytest.raises(ValueError, match=r"scale_b must have shape \(\.\.\., 4, 8\)"):
        tcemu.mma(sp, a, b, c, arch="sm_120", scale_a=sa, scale_b=sb[:2])
    with pytest.raises(TypeError, match="scale_a must have dtype float8_e4m3fn or uint8"):
        tcemu.mma(sp, a, b, c, arch="sm_120", scale_a=sa.astype(np.float32), scale_b=sb)
    with pytest.raises(TypeError, match="a must have dtype float4_e2m1fn or uint8"):
        tcemu.mma(sp, a.astype(np.float32), b, c, arch="sm_120", scale_a=sa, scale_b=sb)
    with pytest.raises(ValueError, match="codes above 15"):
        tcemu.mma(sp, np.full((16, 64), 16, np.uint8), b, c, arch="sm_120", scale_a=sa, scale_b=sb)
    with pytest.raises(ValueError, match="exists only on sm_120"):
        tcemu.mma(sp, a, b, c, arch="B200", scale_a=sa, scale_b=sb)
    with pytest.raises(ValueError, match="only for block-scaled kinds"):
        tcemu.mma(SPELL["f8f6f4"].format(a="e2m1", b="e2m1", d="f32"), a[:, :32], b[:32], c, arch="sm_120", scale_a=sa)
    with pytest.raises(ValueError, match="scale_group is for the block-scaled fp4 kinds"):
        tcemu.mma(sp, a, b, c, arch="sm_120", scale_a=sa, scale_b=sb, model=presets.F8F6F4)
    with pytest.raises(ValueError, match="scale_group is for the block-scaled fp4 kinds"):
        tcemu.mma(SPELL["f8f6f4"].format(a="e2m1", b="e2m1", d="f32"), a[:, :32], b[:32], c, arch="sm_120",
                  model=presets.MXF4)
    with pytest.raises(ValueError, match="must divide the scale block"):
        tcemu.mma(sp, a, b, c, arch="sm_120", scale_a=sa, scale_b=sb, model=presets.MXF4.replace(scale_group=32))
    with pytest.raises(ValueError, match="runs with the defaults of addend"):
        tcemu.mma(sp, a, b, c, arch="sm_120", scale_a=sa, scale_b=sb, model=presets.MXF4.replace(addend="last"))
    with pytest.raises(ValueError, match=r"fraction_bits must be in 1\.\.28"):
        tcemu.BlockFMA(fraction_bits=35)
    with pytest.raises(ValueError, match=r"fraction_bits must be in 1\.\.35"):
        tcemu.BlockFMA(fraction_bits=36, scale_group=16)


def test_tcgen05_value_level_and_errors():
    sp = "tcgen05.mma.cta_group::1.kind::f16"
    a = np.ones((64, 16), np.float16)
    b = np.ones((16, 24), np.float16)
    d = tcemu.mma(sp, a, b, np.zeros((64, 24), np.float16), arch="B200")
    assert d.dtype == jnp.float16 and d.shape == (64, 24) and float(d[0, 0]) == 16
    with pytest.raises(ValueError, match="exists only on sm_100"):
        tcemu.mma(sp, a, b, np.zeros((64, 24), np.float16), arch="sm_120")
    with pytest.raises(ValueError, match="M=32, N=24 is not a cta_group::1 shape"):
        tcemu.mma(sp, a[:32], b, np.zeros((32, 24), np.float32), arch="B200")
    with pytest.raises(ValueError, match="N = 8..256 step 8"):
        tcemu.mma(sp, a, b[:, :20], np.zeros((64, 20), np.float32), arch="B200")
    with pytest.raises(ValueError, match="must be f32, got f16"):
        tcemu.mma(sp, a.astype(ml_dtypes.bfloat16), b.astype(ml_dtypes.bfloat16), np.zeros((64, 24), np.float16),
                  arch="B200")
    with pytest.raises(TypeError, match="takes its types from the arrays"):
        tcemu.mma(sp, a.astype(np.int8), b, np.zeros((64, 24), np.float32), arch="B200")
    with pytest.raises(ValueError, match=r"M in \{128\}"):
        tcemu.mma("tcgen05.mma.cta_group::1.kind::mxf8f6f4.block_scale", np.zeros((64, 32), ml_dtypes.float8_e4m3fn),
                  np.zeros((32, 8), ml_dtypes.float8_e4m3fn), np.zeros((64, 8), np.float32), arch="B200",
                  scale_a=np.zeros((64, 1), np.uint8), scale_b=np.zeros((1, 8), np.uint8))
    with pytest.raises(tcemu._src.isa.parse.Unsupported, match="value level only"):
        tcemu.ptx(sp, arch="B200")


def test_register_level_errors():
    f = tcemu.ptx(SPELL["nvf4"], arch="sm_120")
    regs = tcemu.regfile(16)
    ok = dict(d=range(0, 4), a=range(4, 8), b=range(8, 10), c=range(10, 14), scale_a=14, scale_b=15)
    f(regs, **ok)
    with pytest.raises(ValueError, match="byte_id_a must be one of 0 with .scale_vec::4X"):
        f(regs, **ok, byte_id_a=2)
    with pytest.raises(ValueError, match="thread_id_a must be one of 0, 1"):
        f(regs, **ok, thread_id_a=2)
    with pytest.raises(ValueError, match="scale_b= registers"):
        f(regs, **{**ok, "scale_b": 16})
    with pytest.raises(TypeError, match="scale_a"):
        f(regs, **{k: v for k, v in ok.items() if k != "scale_a"})


def test_quantize_fp6_fp4_equals_ml_dtypes():
    """RNE, saturation, infinities and NaN as ml_dtypes converts float32 to fp6/fp4; stochastic
    rounding lands on one of the two neighbours."""
    rng = np.random.default_rng(4)
    x = (rng.standard_normal(50000) * 2.0 ** rng.integers(-14, 9, 50000)).astype(np.float32)
    x[:8] = [np.inf, -np.inf, np.nan, 0.0, -0.0, 1e-30, 0.25, 0.75]  # (ties among them)
    for t, dt in (("e2m1", ml_dtypes.float4_e2m1fn), ("e2m3", ml_dtypes.float6_e2m3fn), ("e3m2", ml_dtypes.float6_e3m2fn)):
        q = np.asarray(tcemu.quantize(x, t))
        np.testing.assert_array_equal(q.view(np.uint32), x.astype(dt).astype(np.float32).view(np.uint32))
        s = np.asarray(tcemu.quantize(x[8:], t, "stochastic", key=__import__("jax").random.key(1)))
        lo = np.asarray(tcemu.quantize(x[8:], t))
        grid = np.sort(np.unique(np.arange(1 << fm.FORMATS[t].bits, dtype=np.uint8).view(dt).astype(np.float32)))
        i = np.clip(np.searchsorted(grid, x[8:]), 1, len(grid) - 1)
        ok = (s == grid[i]) | (s == grid[i - 1]) | (s == lo)
        assert ok.all() and (s != lo).any()


def test_matmul_with_f8f6f4_equals_exact_chain():
    """A GEMM of kind::f8f6f4 instructions (K = 64: two chained from +0) equals the exact-rational
    block model, inputs quantised to fp4 and fp6."""
    rng = np.random.default_rng(5)
    a = rng.standard_normal((18, 64)).astype(np.float32)
    b = (rng.standard_normal((64, 10)) * 4).astype(np.float32)
    cfg = tcemu.GemmConfig(arch="sm_120", instruction=SPELL["f8f6f4"].format(a="e2m1", b="e3m2", d="f32"))
    got = np.asarray(tcemu.matmul(a, b, config=cfg)).view(np.uint32)
    qa = a.astype(ml_dtypes.float4_e2m1fn).view(np.uint8).astype(int)
    qb = b.astype(ml_dtypes.float6_e3m2fn).view(np.uint8).astype(int)
    for i in range(0, 18, 5):
        for j in range(10):
            want = X.scaled_dot(qa[i].tolist(), "e2m1", qb[:, j].tolist(), "e3m2", [(127, "ue8m0")] * 2,
                                [(127, "ue8m0")] * 2, 0, 25, 32, 32, -133)
            assert int(got[i, j]) == X.to_bits(want, "f32"), (i, j)


# ---------------------------------------------------------------------------------------------
# block-scaled GEMMs: the recipes written again in numpy from their sources (OCP MX v1.0 6.3;
# NVFP4: arXiv 2509.25149), with ml_dtypes' conversions


def _np_quantize(x, etype, stype, block):
    """(element values, scale values, element codes, scale codes, tensor scale) of the recipes."""
    edt = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2, "e3m2": ml_dtypes.float6_e3m2fn,
           "e2m3": ml_dtypes.float6_e2m3fn, "e2m1": ml_dtypes.float4_e2m1fn}[etype]
    top = float(ml_dtypes.finfo(edt).max)
    xb = x.reshape(x.shape[0], -1, block).astype(np.float64)
    amax = np.abs(xb).max(-1)
    if stype == "ue8m0":
        emax = int(np.floor(np.log2(top)))
        with np.errstate(divide="ignore"):
            e = np.where(amax > 0, np.floor(np.log2(np.where(amax > 0, amax, 1))) - emax, -127)
        e = np.clip(e, -127, 127).astype(int)
        scale = 2.0 ** e
        y, codes, tensor = xb / scale[..., None], e + 127, 1.0
    else:
        tensor = np.float32(6 * 448) / np.float32(np.abs(x).max())
        scale = np.minimum(amax / 6 * tensor, 448).astype(np.float32).astype(ml_dtypes.float8_e4m3fn).astype(np.float64)
        codes = scale.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
        with np.errstate(divide="ignore", invalid="ignore"):
            y = np.where(scale[..., None] > 0, xb.astype(np.float32) * (np.float32(tensor) / scale.astype(np.float32))[..., None], 0)
    elem = np.clip(y, -top, top).astype(np.float32).astype(edt)
    return (elem.astype(np.float64).reshape(x.shape), scale, elem.view(np.uint8).reshape(x.shape), codes, tensor)


BLOCK_FORMS = [("mxf8f6f4", "e4m3", "e2m1", "ue8m0"), ("mxf8f6f4", "e3m2", "e5m2", "ue8m0"),
               ("mxf4", "e2m1", "e2m1", "ue8m0"), ("mxf4nvf4", "e2m1", "e2m1", "ue4m3")]


def _block_spelling(kind, a, b, st):
    if kind == "mxf8f6f4":
        return SPELL["mxf8f6f4"].format(a=a, b=b)
    vec = "4X" if st == "ue4m3" else "2X"
    return f"mma.sync.aligned.m16n8k64.row.col.kind::{kind}.block_scale.scale_vec::{vec}.f32.e2m1.e2m1.f32.{st}"


@pytest.mark.parametrize("kind,at,bt,st", BLOCK_FORMS)
def test_block_quantize_equals_recipe(kind, at, bt, st):
    from tcemu._src.quant.blocks import block_quantize

    rng = np.random.default_rng(6)
    x = (rng.standard_normal((8, 64)) * 2.0 ** rng.integers(-20, 20, (8, 1))).astype(np.float32)
    x[1, :16] = 0  # a zero block
    blk = parse(_block_spelling(kind, at, bt, st)).scale_block
    q = block_quantize(x, at, st, block=blk)
    ev, sv, ec, sc, t = _np_quantize(x, at, st, blk)
    np.testing.assert_array_equal(np.asarray(q.elements), ev.astype(np.float32))
    np.testing.assert_array_equal(np.asarray(q.scales), sv.astype(np.float32))
    np.testing.assert_array_equal(np.asarray(q.scale_codes), sc)
    assert float(q.tensor_scale) == np.float32(t)


@pytest.mark.parametrize("kind,at,bt,st", BLOCK_FORMS)
def test_block_scaled_matmul_equals_instruction_chain(kind, at, bt, st):
    """matmul of a block-scaled instruction = its value-level instructions chained over K from +0
    on the recipe's codes (independent quantiser), times the NVFP4 tensor scales; the gradient
    is straight through: the dequantised operands."""
    import jax

    sp = _block_spelling(kind, at, bt, st)
    ins = parse(sp)
    rng = np.random.default_rng(7)
    M, K, N = 16, 2 * ins.k, 8
    a = rng.standard_normal((M, K)).astype(np.float32)
    b = (rng.standard_normal((K, N)) * 3).astype(np.float32)
    cfg = tcemu.GemmConfig(arch="RTX5090", instruction=sp)
    got = np.asarray(tcemu.matmul(a, b, config=cfg))
    blk = ins.scale_block
    ea, sa, ca, sca, ta = _np_quantize(a, at, st, blk)
    eb, sb, cb, scb, tb = _np_quantize(b.T, bt, st, blk)
    d = np.zeros((M, N), np.float32)
    for k0 in range(0, K, ins.k):
        ks = slice(k0, k0 + ins.k)
        bs = slice(k0 // blk, (k0 + ins.k) // blk)
        typed = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}
        xa, xb = (np.ascontiguousarray(x).view(typed[t]) if t in typed else np.ascontiguousarray(x)
                  for x, t in ((ca[:, ks], at), (cb[:, ks].T, bt)))
        d = np.asarray(tcemu.mma(sp, xa, xb, d, arch="sm_120",
                                 scale_a=sca[:, bs].astype(np.uint8), scale_b=np.ascontiguousarray(scb[:, bs].T).astype(np.uint8)))
    alpha = (np.float32(1) / np.float32(ta)) * (np.float32(1) / np.float32(tb))
    np.testing.assert_array_equal(got.view(np.uint32), (d * alpha).view(np.uint32))
    if kind != "mxf4nvf4":  # (CI time: one gradient check)
        return
    g = np.asarray(jax.grad(lambda x: tcemu.matmul(x, b, config=cfg).sum())(a))
    deq_b = (eb * np.repeat(sb, blk, axis=1) / tb).astype(np.float32).T
    np.testing.assert_allclose(g, np.ones((M, N)) @ deq_b.T.astype(np.float64), rtol=1e-5)  # (f32 sums)


def test_block_scaled_gemm_errors():
    sp = _block_spelling("mxf8f6f4", "e4m3", "e4m3", "ue8m0")
    cfg = tcemu.GemmConfig(arch="sm_120", instruction=sp)
    with pytest.raises(ValueError, match="K a multiple of the scale block 32"):
        tcemu.matmul(np.ones((4, 48), np.float32), np.ones((48, 4), np.float32), config=cfg)
    with pytest.raises(tcemu._src.isa.parse.Unsupported, match="cuts K across scale blocks"):
        tcemu.matmul(np.ones((4, 96), np.float32), np.ones((96, 4), np.float32),
                     config=cfg.replace(schedule=tcemu.KSchedule(slices=2, slice_align=1)))
    with pytest.raises(ValueError, match="quantize='stochastic' is not available"):
        tcemu.GemmConfig(arch="sm_120", instruction=sp, quantize="stochastic")


@pytest.mark.parametrize("kw,msg", [(dict(etype="f16"), "etype must be one of e4m3"), (dict(stype="e8m0"), "stype must be one of"),
                                    (dict(etype="e4m3", stype="ue4m3"), "elements are e2m1"), (dict(block=5), "dividing the last axis"),
                                    (dict(block=0), "positive integer"), (dict(x="abc"), "x must be a real numeric array")])
def test_block_quantize_errors(kw, msg):
    args = dict(x=np.ones((2, 32), np.float32), etype="e2m1", stype="ue8m0", block=16) | kw
    with pytest.raises((ValueError, TypeError), match=msg):
        tcemu.block_quantize(args.pop("x"), args.pop("etype"), args.pop("stype"), **args)


def test_error_vs_k_fp4_fp6_and_block_scaled():
    """Dot products of U[0, 1) quantised to e2m1 (products multiples of 2**-2, sums below 2**14)
    are exact in binary32 at every K: zero error, unscaled and with ue4m3 block scales (multiples of
    2**-8 below 2**16); MXFP8 (e4m3 products, ue8m0 scales) loses bits as K grows."""
    nv = "mma.sync.aligned.m16n8k64.row.col.kind::mxf4nvf4.block_scale.scale_vec::4X.f32.e2m1.e2m1.f32.ue4m3"
    for fmt, ins in (("e2m1", None), ("e2m1", nv)):
        r = tcemu.error_vs_k(fmt, "RTX5090", ks=(64, 4096), outputs=32, instruction=ins)
        assert r.max_rel == (0.0, 0.0)
    mx = "mma.sync.aligned.m16n8k32.row.col.kind::mxf8f6f4.block_scale.scale_vec::1X.f32.e4m3.e4m3.f32.ue8m0"
    r = tcemu.error_vs_k("e4m3", "RTX5090", ks=(32, 4096), outputs=32, instruction=mx)
    assert r.max_rel[0] == 0.0 and 0 < r.max_rel[1] < 1e-5
    with pytest.raises(ValueError, match="kind::f8f6f4"):
        tcemu.error_vs_k("e2m3", "H100", ks=(32,))


NV_UE8 = "mma.sync.aligned.m16n8k64.row.col.kind::mxf4nvf4.block_scale.scale_vec::4X.f32.e2m1.e2m1.f32.ue8m0"


@pytest.mark.parametrize("model,want", [
    (None, dict(fraction_bits=35, accumulator_bits=23, block_size=64, rounding="rz")),  # the preset
    (presets.MXF4.replace(fraction_bits=30, rounding="rd"), dict(fraction_bits=30, block_size=64, rounding="rd")),
    (presets.MXF4.replace(fraction_bits=28, rounding="rne", block_size=32), dict(fraction_bits=28, block_size=None,
                                                                                rounding="rne"))])
def test_probe_block_scaled_fp4_through_scales(model, want):
    """probe recovers the grouped alignment's fraction bits, the fused block (in scale blocks; None
    when it ends before the third) and the rounding of a model it is not told."""
    sp = NV_UE8 if model is not None else NV_UE8.replace("ue8m0", "ue4m3")
    r = tcemu.probe("RTX5090", instruction=sp, model=model)
    assert {k: getattr(r, k) for k in want} == want and r.subnormal_inputs and r.subnormal_outputs
    from tcemu._src.probe import expected

    m = model or presets.MXF4
    assert all(getattr(r, k) == v for k, v in expected(m, sp).items())  # what the CLI compares with


def test_probe_fp6_fp4_without_scales_is_refused():
    with pytest.raises(ValueError, match="fp6/fp4 inputs cannot form"):
        tcemu.probe("RTX5090", instruction=SPELL["f8f6f4"].format(a="e2m1", b="e2m1", d="f32"))
