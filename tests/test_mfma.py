"""AMD MFMA at value level against MMA-Sim 2.1.1's vectors (tests/data/mmasim_amd_vectors.npz,
made by experiments/mmasim/generate_amd_vectors.py; MMA-Sim is not a test dependency).

Every CDNA3 (gfx942) and CDNA2 (gfx90a) MFMA and the f32/f64 MFMAs of CDNA1 x six input
distributions, bit for bit, with ``jax_enable_x64`` off and on (f64: on only); CDNA1's f16/bf16
MFMAs run on every vector in tests/test_mfma_cdna1.py. The f32/f64 MFMAs
(chains of FMAs) and CDNA2's f16/bf16 (binary32 multiplies and adds) compare a NaN result as NaN:
MMA-Sim computes them with the host CPU's arithmetic, whose NaN payloads are not a model of the
GPU's; the two-stage-adder forms return MMA-Sim's canonical 0x7FFFFFFF, compared as bits. CI runs every instruction on one distribution (a rotation over the six), with x64 on only for the
f64 MFMAs and every fifth other case; ``TCEMU_ALL_VECTORS=1`` runs all six both ways.
"""
from __future__ import annotations

import functools
import os
from fractions import Fraction

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import assume, given, settings, strategies as st

import tcemu
from conftest import DATA
from tcemu._src import formats as fm
from tcemu._src.isa.mfma import TABLE

GFX = {"CDNA1": "gfx908", "CDNA2": "gfx90a", "CDNA3": "gfx942"}
DTYPES = {"f16": np.float16, "bf16": ml_dtypes.bfloat16, "tf32": np.float32, "f32": np.float32, "f64": np.float64,
          "e4m3fnuz": ml_dtypes.float8_e4m3fnuz, "e5m2fnuz": ml_dtypes.float8_e5m2fnuz}
DISTS = ("random", "cancel", "extreme", "special", "tiny", "subnormal")


@functools.cache
def vectors():
    return np.load(DATA / "mmasim_amd_vectors.npz")


@functools.cache
def forms():
    """(gfx, MMA-Sim suffix) of every instruction in the file."""
    return sorted({tuple(k.split("|")[:2]) for k in vectors().files if k != "meta"})


def _emulated(arch, suffix):
    """In this module's rotation: every form but CDNA1's f16/bf16 (tests/test_mfma_cdna1.py)."""
    ins = tcemu_ins(arch, suffix)
    return arch != "CDNA1" or ins.family in ("f32", "f64")


def tcemu_ins(arch, suffix):
    from tcemu._src.isa.mfma import parse_mfma

    return parse_mfma("v_mfma_" + suffix, GFX[arch])


def _cases():
    every = os.environ.get("TCEMU_ALL_VECTORS") == "1"
    out = []
    for i, (arch, suffix) in enumerate(forms()):
        if not _emulated(arch, suffix):
            continue
        dists = DISTS if every else (DISTS[i % 6],)
        out += [(arch, suffix, d) for d in dists]
    return out


def _x64_cases():
    every = os.environ.get("TCEMU_ALL_VECTORS") == "1"
    f64 = lambda a, s: tcemu_ins(a, s).family == "f64"  # noqa: E731
    return [(x64, *c) for i, c in enumerate(_cases()) for x64 in (False, True)
            if every or (x64 if f64(*c[:2]) else not x64 or i % 5 == 0)]


def _run(arch, suffix, dist):
    z = vectors()
    ins = tcemu_ins(arch, suffix)
    get = lambda p: z[f"{arch}|{suffix}|{dist}|{p}"]  # noqa: E731
    a = get("a").view(DTYPES[ins.atype])
    b = get("b").view(DTYPES[ins.btype])
    c = get("c").view(DTYPES[ins.dtype])
    d = np.asarray(tcemu.mma(ins.spelling, a, b, c, arch=GFX[arch]))
    return ins, d.view(get("d").dtype), get("d")


def _compare(ins, got, want):
    if ins.family in ("f32", "f64") or ins.arch == "gfx90a":  # NaN as NaN (host-CPU payloads), bits elsewhere
        fdt = np.float64 if ins.family == "f64" else np.float32
        gn, wn = np.isnan(got.view(fdt)), np.isnan(want.view(fdt))
        assert np.array_equal(gn, wn)
        got, want = got[~gn], want[~wn]
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, f"{bad.size} of {got.size} outputs differ; first: got {got.flat[bad[0]]:#x}, " \
                          f"MMA-Sim {want.flat[bad[0]]:#x}"


@pytest.mark.parametrize("x64,arch,suffix,dist", _x64_cases())
def test_value_level(x64, arch, suffix, dist):
    ins = tcemu_ins(arch, suffix)
    if ins.family == "f64" and not x64:
        with jax.enable_x64(False), pytest.raises(Exception, match="x64"):
            _run(arch, suffix, dist)
        return
    with jax.enable_x64(x64):
        _compare(*_run(arch, suffix, dist))


def test_vectors_cover_every_instruction():
    """The file holds every MFMA of the three targets' tables (as MMA-Sim spells them) x six
    distributions, and CI's sample covers every CDNA3 instruction and every distribution."""
    have = {(GFX[a], tcemu_ins(a, s).spelling) for a, s in forms()}
    assert have == {(arch, s) for arch, t in TABLE.items() for s in t if "_i32_" not in s}  # i8: test_mfma_i8.py
    cases = _cases()
    for gen in ("CDNA2", "CDNA3"):
        assert {s for a, s, _ in cases if a == gen} == {s for a, s in forms() if a == gen}
    assert {d for *_, d in cases} == set(DISTS)
    assert {(x64, tcemu_ins(a, s).family == "f64") for x64, a, s, _ in _x64_cases()} >= {(True, True), (True, False),
                                                                                          (False, False)}


@pytest.mark.parametrize("spelling,arch,match", [
    ("v_mfma_f32_32x32x8_f17", "MI300X", "valid: v_mfma_f64_16x16x4_f64"),
    ("v_mfma_f32_16x16x32_fp8_bf8", "MI250X", "not an MFMA of gfx90a"),
    ("v_mfma_f32_32x32x8_f16", "H100", "arch must be an AMD target"),
    ("v_mfma_f32_32x32x8_f16", "MI400", "unknown arch"),
    ("v_mfma_f32_32x32x4bf16", "MI300X", "not an MFMA of gfx942"),
])
def test_bad_spellings_and_archs(spelling, arch, match):
    a = np.ones((32, 8), np.float16)
    with pytest.raises(ValueError, match=match):
        tcemu.mma(spelling, a, a.T.copy(), np.zeros((32, 32), np.float32), arch=arch)


def test_bad_operands_and_modifiers():
    sp = "v_mfma_f32_32x32x4_2b_f16"
    a, b, c = np.ones((2, 32, 4), np.float16), np.ones((2, 4, 32), np.float16), np.zeros((2, 32, 32), np.float32)
    with pytest.raises(TypeError, match="a must have dtype float16"):
        tcemu.mma(sp, a.astype(np.float32), b, c, arch="MI300X")
    with pytest.raises(ValueError, match=r"b must have shape \(\.\.\., 4, 32\)"):
        tcemu.mma(sp, a, b[..., :16], c, arch="MI300X")
    with pytest.raises(ValueError, match=r"cbsz must be an integer in 0\.\.1"):
        tcemu.mma(sp, a, b, c, arch="MI300X", cbsz=2)
    with pytest.raises(ValueError, match=r"abid must be an integer in 0\.\.1"):
        tcemu.mma(sp, a, b, c, arch="MI300X", cbsz=1, abid=2)
    with pytest.raises(ValueError, match="neg is only for the f64"):
        tcemu.mma(sp, a, b, c, arch="MI300X", neg=(1, 0, 0))
    with pytest.raises(TypeError, match="cbsz, abid and neg are for AMD"):
        tcemu.mma("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32", np.ones((16, 16), np.float16),
                  np.ones((16, 8), np.float16), np.zeros((16, 8), np.float32), arch="H100", cbsz=1)


def test_cbsz_abid_broadcast_a_blocks():
    """cbsz=2, abid=3 on a 16-block MFMA: every group of 4 blocks reads the A of its block 3."""
    rng = np.random.default_rng(0)
    sp = "v_mfma_f32_4x4x4_16b_f16"
    a = rng.standard_normal((16, 4, 4)).astype(np.float16)
    b = rng.standard_normal((16, 4, 4)).astype(np.float16)
    c = rng.standard_normal((16, 4, 4)).astype(np.float32)
    d = np.asarray(tcemu.mma(sp, a, b, c, arch="MI300X", cbsz=2, abid=3))
    src = np.repeat(np.arange(3, 16, 4), 4)
    assert np.array_equal(d, np.asarray(tcemu.mma(sp, a[src], b, c, arch="MI300X")))
    assert not np.array_equal(d, np.asarray(tcemu.mma(sp, a, b, c, arch="MI300X")))


def test_f64_neg(x64):
    a = np.array([[1.5, -2.0, 0.0, 3.0]] * 4)
    b = np.array([[0.25], [1.0], [-0.0], [2.0]]) * np.ones((1, 4))
    c = np.full((4, 4), -0.0)
    sp = "v_mfma_f64_4x4x4_4b_f64"
    d = np.asarray(tcemu.mma(sp, a, b, c, arch="MI300X", neg=(1, 0, 1)))
    ref = np.asarray(tcemu.mma(sp, -a, b, -c, arch="MI300X"))
    assert np.array_equal(d.view(np.uint64), ref.view(np.uint64)) and d[0, 0] == -(0.375 - 2.0 + 6.0)


def test_batch_and_jit():
    """Blocks as batch entries (with more batch axes before them), under jit."""
    rng = np.random.default_rng(1)
    a = rng.standard_normal((3, 4, 16, 4)).astype(np.float16)
    b = rng.standard_normal((3, 4, 4, 16)).astype(np.float16)
    c = np.zeros((4, 16, 16), np.float32)
    sp = "v_mfma_f32_16x16x4_4b_f16"
    d = jax.jit(lambda a, b, c: tcemu.mma(sp, a, b, c, arch="MI300X"))(a, b, c)
    assert d.shape == (3, 4, 16, 16)
    one = tcemu.mma(sp, a[1, 2], b[1, 2], c[2], arch="MI300X")
    assert np.array_equal(np.asarray(d[1, 2]), np.asarray(one))


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(-255, 255), st.integers(-3, 3), st.integers(-255, 255), st.integers(-3, 3)),
                min_size=16, max_size=16), st.integers(-(1 << 23), 1 << 23), st.integers(-2, 6))
def test_cdna3_f16_against_exact(terms, cm, ce):
    """Against exact rational sums: when every product and C lie on the alignment grid (23 bits
    below the largest term; CDNA3's truncation keeps ``fraction_bits`` = 24), the truncation loses
    nothing and each block of 8 is the exact sum rounded once to nearest even (the floor to 31 bits
    cannot act on sums that fit 31 bits). Products of 8-bit integers scaled by 2**-6..2**6 can
    span 28 bits: cases with a term below the grid are left out."""
    a = np.array([[x * 2.0 ** e for x, e, _, _ in terms]], np.float16)
    b = np.array([[y * 2.0 ** e] for _, _, y, e in terms], np.float16)
    c = np.float32(cm * 2.0 ** ce)
    d = np.asarray(tcemu.mma("v_mfma_f32_16x16x16_f16", np.tile(a, (16, 1)), np.tile(b, (1, 16)),
                             np.full((16, 16), c, np.float32), arch="MI300X"))[0, 0]
    acc = Fraction(float(c))
    for k0 in (0, 8):  # two blocks of 8; the rounded first is the second's C
        prods = [Fraction(float(a[0, k])) * Fraction(float(b[k, 0])) for k in range(k0, k0 + 8)]
        nz = [p for p in prods if p] + ([acc] if acc else [])
        top = max((int(np.floor(np.log2(abs(float(p)))))) for p in nz) if nz else 0
        grid = Fraction(2) ** (top - 23)
        exact = acc + sum(prods)
        assume(all((p / grid).denominator == 1 for p in nz) and not (exact and abs(exact) >= Fraction(2) ** (top + 8)))
        acc = Fraction(float(np.float32(float(exact))))   # one RNE (float() of a Fraction is exact-then-round)
    assert Fraction(float(d)) == acc


@pytest.mark.parametrize("instruction", ["v_mfma_f32_32x32x8_f16", "v_mfma_f32_16x16x32_fp8_bf8"])
def test_gemm_chains_the_instruction(instruction):
    """tcemu.matmul with an MFMA (sequential K order) is the chain of that MFMA over K tiles of
    the quantised inputs, tile by tile; gradients flow (straight-through, as for NVIDIA)."""
    cfg = tcemu.GemmConfig(arch="MI300X", instruction=instruction)
    ins = cfg.ins
    rng = np.random.default_rng(2)
    M, N, K = 2 * ins.m, ins.n, 3 * ins.k
    a = rng.standard_normal((M, K)).astype(np.float32)
    b = rng.standard_normal((K, N)).astype(np.float32)
    d = np.asarray(tcemu.matmul(jnp.asarray(a), jnp.asarray(b), config=cfg))
    qa = np.asarray(tcemu.quantize(a, ins.atype)).astype(DTYPES[ins.atype])
    qb = np.asarray(tcemu.quantize(b, ins.btype)).astype(DTYPES[ins.btype])
    acc = np.zeros((M, N), np.float32)
    for k0 in range(0, K, ins.k):
        for m0 in range(0, M, ins.m):
            acc[m0:m0 + ins.m] = tcemu.mma(instruction, qa[m0:m0 + ins.m, k0:k0 + ins.k], qb[k0:k0 + ins.k],
                                           acc[m0:m0 + ins.m], arch="MI300X")
    assert np.array_equal(d.view(np.uint32), acc.view(np.uint32))
    g = jax.grad(lambda x: tcemu.matmul(x, jnp.asarray(b), config=cfg).sum())(jnp.asarray(a))
    assert g.shape == a.shape and np.isfinite(np.asarray(g)).all()


def test_gemm_config_errors():
    with pytest.raises(ValueError, match="f32/f64 MFMAs are FMA chains"):
        tcemu.GemmConfig(arch="MI300X", instruction="v_mfma_f32_32x32x2_f32")
    with pytest.raises(ValueError, match="not an MFMA of gfx942"):
        tcemu.GemmConfig(arch="MI300X", instruction="v_mfma_f32_32x32x8_f17")
    with pytest.raises(ValueError, match="no f16 mfma numerics for gfx90a"):
        tcemu.GemmConfig(arch="MI250X", instruction="v_mfma_f32_32x32x8f16", model=tcemu.ArchNumerics("gfx90a"))


@pytest.mark.parametrize("etype,dtype", [("e4m3fnuz", ml_dtypes.float8_e4m3fnuz), ("e5m2fnuz", ml_dtypes.float8_e5m2fnuz)])
def test_quantize_fnuz(etype, dtype):
    """RNE is ml_dtypes' conversion (overflow, inf, NaN -> NaN 0x80; -0 -> +0); stochastic rounding
    lands on one of the two neighbours and never on 0x80 for a number in range."""
    x = np.array([-0.0, 1e6, -1e6, np.inf, np.nan, -1e-9, 0.3, -17.5, 2.0 ** -10], np.float32)
    assert np.array_equal(np.asarray(tcemu.quantize(x, etype)), x.astype(dtype).astype(np.float32), equal_nan=True)
    s = np.asarray(tcemu.quantize(x, etype, "stochastic", key=jax.random.key(0)))
    assert np.isnan(s[1:5]).all() and not np.isnan(s[[0, 5, 6, 7, 8]]).any()
    codes = tcemu._src.quant.elements.quantize_codes(jnp.asarray(x), etype, "stochastic", jax.random.key(1))
    assert int(np.asarray(codes)[5]) == 0 and int(np.asarray(codes)[0]) == 0


# (C, A's k = 0, 1, B's k = 0, 1, D bits): MMA-Sim 2.1.1's MFMA("CDNA3", "f32_16x16x16_f16") on these
# (the other products zero); sums one half ulp above 1 plus a bit at 2**-31 or 2**-32, where the
# floor to F2 = 31 fraction bits decides the tie, and toward -inf for negative sums
TIES = [(1.0, (2**-12, 2**-16), (2**-12, 2**-15), 0x3F800001),
        (1.0, (2**-12, 2**-16), (2**-12, 2**-16), 0x3F800000),
        (-1.0, (-2**-12, -2**-16), (2**-12, 2**-16), 0xBF800001),
        (-1.0, (2**-12, 0.0), (-2**-12, 0.0), 0xBF800000),
        (1.0, (-2**-12, 2**-16), (2**-12, -2**-16), 0x3F7FFFFF)]


def test_cdna3_floor_to_f2_bits_decides_ties():
    """The random vectors do not tell F2 = 30 from 31; these MMA-Sim outputs do (and the floor's
    direction): tcemu's preset gives them, sum_fraction_bits 30 or the plain RNE of 26 do not."""
    A = np.zeros((len(TIES), 16, 16), np.float16)
    B = np.zeros((len(TIES), 16, 16), np.float16)
    C = np.zeros((len(TIES), 16, 16), np.float32)
    for i, (c, a, b, _) in enumerate(TIES):
        A[i, :, :2], B[i, :2, :], C[i] = a, np.array(b)[:, None], c
    want = np.array([t[-1] for t in TIES], np.uint32)
    sp = "v_mfma_f32_16x16x16_f16"
    got = np.asarray(tcemu.mma(sp, A, B, C, arch="MI300X"))[:, 0, 0].view(np.uint32)
    assert np.array_equal(got, want)
    m = tcemu.numerics("MI300X").f16
    for other in (m.replace(sum_fraction_bits=30), m.replace(sum_fraction_bits=26)):
        assert not np.array_equal(np.asarray(tcemu.mma(sp, A, B, C, arch="MI300X", model=other))[:, 0, 0]
                                  .view(np.uint32), want)


def test_error_vs_k_on_mi300x_fnuz():
    """error_vs_k takes the fnuz formats and AMD GPUs (the default MFMA per format)."""
    r = tcemu.error_vs_k("e5m2fnuz", "MI300X", ks=(32, 64), outputs=32)
    assert r.instruction == "v_mfma_f32_32x32x16_bf8_bf8" and all(np.isfinite(r.max_rel))
    with pytest.raises(ValueError, match="fnuz fp8 formats are AMD's"):
        tcemu.error_vs_k("e4m3fnuz", "H100", ks=(32,), outputs=32)
