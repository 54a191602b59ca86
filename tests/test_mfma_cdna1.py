"""CDNA1 (gfx908, MI100) f16 and bf16 MFMAs, ``BlockFMA(block_sum="exact")``: MMA-Sim 2.1.1's
``MMA_E_FDPA`` vectors at value and register level, GEMMs as chains of the instruction, and a
property test against exact rational arithmetic (Python Fractions, not tcemu's integers).

Vectors: the six distributions of ``tests/data/mmasim_amd_vectors.npz`` and the three that stress
an exact adder (``exact_cancel``, ``ties``, ``wide``) of ``tests/data/mmasim_amd_cdna1_vectors.npz``
(``experiments/mmasim/generate_amd_vectors.py``; MMA-Sim is not a test dependency). NaN compares as
NaN: MMA-Sim's NaNs are its host CPU's float64 ones. CI runs every instruction at value level on
every vector (x64 off and on, alternately), the register level on two; ``TCEMU_ALL_VECTORS=1``
runs all of it both ways.
"""
from __future__ import annotations

import functools
import os
from fractions import Fraction as Fr

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import tcemu
from conftest import DATA
from tcemu._src.isa.mfma import TABLE
from exact_reference import value
from test_mfma import DISTS, DTYPES, tcemu_ins, vectors
from test_mfma_regs import _d_bits, _regfile

EVERY = os.environ.get("TCEMU_ALL_VECTORS") == "1"
STRESS = ("exact_cancel", "ties", "wide")
# every f16/bf16 MFMA of gfx908, as MMA-Sim spells it (the 5 f16 and 5 bf16 shapes of the ISA table)
SUFFIXES = tuple(s.removeprefix("v_mfma_") for s, (t, *_) in TABLE["gfx908"].items() if t in ("f16", "bf16"))
REGS = SUFFIXES if EVERY else ("f32_32x32x4f16", "f32_16x16x8bf16")  # CI: two at register level
# CI's x64 mode per instruction (the others run with it off, as the tests below that share their compilations)
X64_ON = ("f32_32x32x4f16", "f32_16x16x16f16", "f32_4x4x4f16", "f32_16x16x8bf16", "f32_4x4x2bf16")


@functools.cache
def stress():
    return np.load(DATA / "mmasim_amd_cdna1_vectors.npz")


def _instances(suffix):
    """(a, b, c, d) bit patterns of every instance of ``suffix``: 6 + 3 distributions, 2 each."""
    parts = [[z[f"CDNA1|{suffix}|{d}|{p}"] for p in "abcd"] for z, ds in ((vectors(), DISTS), (stress(), STRESS))
             for d in ds]
    return [np.concatenate(x) for x in zip(*parts)]


def _same(got, want):
    gn, wn = np.isnan(got.view(np.float32)), np.isnan(want.view(np.float32))
    assert np.array_equal(gn, wn)
    bad = np.flatnonzero(got[~gn] != want[~wn])
    assert bad.size == 0, f"{bad.size} of {got.size} differ: got {got[~gn][bad[0]]:#x}, MMA-Sim {want[~wn][bad[0]]:#x}"


def _mma(suffix, a, b, c):
    """tcemu.mma on bit patterns, one instance at a time (the shapes the other tests use too)."""
    ins = tcemu_ins("CDNA1", suffix)
    return np.stack([np.asarray(tcemu.mma(ins.spelling, x.view(DTYPES[ins.atype]), y.view(DTYPES[ins.btype]),
                                          z.view(np.float32), arch="MI100")).view(np.uint32)
                     for x, y, z in zip(a, b, c)])


@pytest.mark.parametrize("x64,suffix", [(x64, s) for s in SUFFIXES for x64 in (False, True)
                                        if EVERY or x64 == (s in X64_ON)])
def test_value_level(x64, suffix):
    """Every instance of the 6 + 3 distributions, bit for bit (NaN as NaN)."""
    a, b, c, d = _instances(suffix)
    with jax.enable_x64(x64):
        _same(_mma(suffix, a, b, c), d)


@pytest.mark.parametrize("suffix", REGS)
def test_register_level(suffix):
    """The vectors through a wavefront's registers (the calculator's layouts), the blocks filled
    with consecutive instances."""
    ins = tcemu_ins("CDNA1", suffix)
    f = tcemu.ptx(ins.spelling, arch="MI100")
    a, b, c, d = _instances(suffix)
    for i in range(0, len(a), ins.blocks):  # every instance (the last call wraps around)
        pick = np.arange(i, i + ins.blocks) % len(a)
        regs, ix = _regfile(f, a[pick], b[pick], c[pick])
        _same(_d_bits(f, np.asarray(f(regs, **ix)), ix).astype(np.uint32), d[pick])


@pytest.mark.parametrize("instruction", ["v_mfma_f32_32x32x8f16", "v_mfma_f32_32x32x4bf16"])
def test_gemm_chains_the_instruction(instruction):
    """tcemu.matmul on MI100 (pure-JAX engine) is the chain of the MFMA over K tiles."""
    cfg = tcemu.GemmConfig(arch="MI100", instruction=instruction)
    ins = cfg.ins
    assert tcemu._src.gemm.execute.kernel_of(cfg) is None
    rng = np.random.default_rng(3)
    M, N, K = 2 * ins.m, ins.n, 3 * ins.k
    dt = DTYPES[ins.atype]  # inputs the instruction's type holds (quantising them changes nothing)
    qa = (rng.standard_normal((M, K)) * 2.0 ** rng.integers(-12, 12, (M, K))).astype(dt)
    qb = rng.standard_normal((K, N)).astype(dt)
    d = np.asarray(tcemu.matmul(jnp.asarray(qa.astype(np.float32)), jnp.asarray(qb.astype(np.float32)), config=cfg))
    acc = np.zeros((M, N), np.float32)
    for k0 in range(0, K, ins.k):
        for m0 in range(0, M, ins.m):
            acc[m0:m0 + ins.m] = tcemu.mma(instruction, qa[m0:m0 + ins.m, k0:k0 + ins.k], qb[k0:k0 + ins.k],
                                           acc[m0:m0 + ins.m], arch="MI100")
    assert np.array_equal(d.view(np.uint32), acc.view(np.uint32))


def _f32_bits(x: Fr) -> int:
    """binary32 bits of the exact ``x`` rounded to nearest even (subnormals, overflow to inf, a
    negative value that rounds to zero -0, an exact zero +0)."""
    if x == 0:
        return 0
    sign, x = (x < 0) << 31, abs(x)
    e = x.numerator.bit_length() - x.denominator.bit_length()
    e = max(e - (Fr(2) ** e > x), -126)
    q = x / Fr(2) ** (e - 23)
    n = q.numerator // q.denominator
    r = q - n
    n += r > Fr(1, 2) or (r == Fr(1, 2) and n % 2 == 1)
    if n == 1 << 24:
        n, e = 1 << 23, e + 1
    if e > 127:
        return sign | 0x7F800000
    return sign | (n if n < 1 << 23 else ((e + 127) << 23) | (n - (1 << 23)))


def _mul(x, y):
    return float(x) * float(y) if isinstance(x, float) or isinstance(y, float) else x * y


def _reference(a, b, c_bits: int, fmt: str, L: int) -> int:
    """The exact model: C and each block of L products summed exactly and rounded once; IEEE
    infinities and NaN (0x7FFFFFFF) where an operand is one."""
    bits = c_bits
    for k0 in range(0, len(a), L):
        terms = [_mul(value(x, fmt), value(y, fmt)) for x, y in zip(a[k0:k0 + L], b[k0:k0 + L])]
        terms.append(value(bits, "f32"))  # a zero C of either sign adds nothing to an exact sum
        if any(isinstance(t, float) for t in terms):  # inf or NaN: IEEE sums (finite terms do not matter)
            s = sum(float(t) for t in terms)
            bits = 0x7FFFFFFF if s != s else (0xFF800000 if s < 0 else 0x7F800000)
        else:
            bits = _f32_bits(sum(terms, Fr(0)))
    return bits


EDGES = {"f16": [0, 0x8000, 1, 0x8001, 0x03FF, 0x0400, 0x7BFF, 0xFBFF, 0x3C00, 0xBC00, 0x7C00],
         "bf16": [0, 0x8000, 1, 0x8001, 0x007F, 0x0080, 0x7F7F, 0xFF7F, 0x3F80, 0xBF80, 0xFF80]}
C_EDGES = [0, 0x80000000, 1, 0x80000001, 0x00800000, 0x807FFFFF, 0x7F7FFFFF, 0xFF7FFFFF, 0x3F800000]


def _tie(data, fmt):
    """Codes of 2**x and 2**y and the bits of a C whose ulp is 2**(x + y + 1) (C of either sign,
    its significand drawn; subnormal where the ulp is 2**-149)."""
    bits, frac = {"f16": (5, 10), "bf16": (8, 7)}[fmt]
    bias = (1 << (bits - 1)) - 1
    lo, hi = 1 - bias - frac, bias

    def code(e):
        return ((e + bias) << frac) if e >= 1 - bias else 1 << (e - lo)

    x = data.draw(st.integers(max(lo, -150 - hi), min(hi, 103 - lo)))
    y = data.draw(st.integers(max(lo, -150 - x), min(hi, 103 - x)))
    t = x + y + 1
    S = data.draw(st.integers(1 if t == -149 else 1 << 23, (1 << 24) - 1))
    return code(x), code(y), _f32_bits(Fr(S) * Fr(2) ** t * data.draw(st.sampled_from([1, -1])))


@pytest.mark.parametrize("spelling,fmt", [("v_mfma_f32_32x32x8f16", "f16"), ("v_mfma_f32_32x32x4bf16", "bf16")])
@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_against_exact_fractions(spelling, fmt, data):
    """One output of a two-block MFMA (rows and columns of any codes, edge codes and zeros
    favoured) equals the exact model; C is any code (alone: no products), a tie with the k = 0
    product, or minus the first block's exact sum or one product, rounded (massive cancellation)."""
    ins = tcemu._src.isa.mfma.parse_mfma(spelling, "MI100")
    L = 4 if fmt == "f16" else 2
    codes = st.one_of(st.integers(0, 0xFFFF), st.sampled_from(EDGES[fmt]))
    a = data.draw(st.lists(codes, min_size=ins.k, max_size=ins.k))
    b = data.draw(st.lists(codes, min_size=ins.k, max_size=ins.k))
    zero = data.draw(st.lists(st.booleans(), min_size=ins.k, max_size=ins.k))  # zero products are common
    a = [0 if z else x for x, z in zip(a, zero)]
    mode = data.draw(st.sampled_from(["code", "alone", "tie", "cancel", "cancel_one"]))
    if mode == "alone":  # no products: D is C
        a = [0] * ins.k
    if mode == "tie":  # the k = 0 product a power of two, exactly half an ulp of C
        a[0], b[0], c = _tie(data, fmt)
    prods = [_mul(value(x, fmt), value(y, fmt)) for x, y in zip(a[:L], b[:L])]
    if mode in ("code", "alone", "tie") or any(isinstance(p, float) for p in prods):
        c = c if mode == "tie" else data.draw(st.one_of(st.integers(0, 0xFFFFFFFF), st.sampled_from(C_EDGES)))
    elif mode == "cancel":
        c = _f32_bits(-sum(prods, Fr(0)))
    else:
        c = _f32_bits(-prods[data.draw(st.integers(0, L - 1))])
    A = np.zeros((ins.m, ins.k), np.uint16)
    B = np.zeros((ins.k, ins.n), np.uint16)
    C = np.zeros((1, ins.m, ins.n), np.uint32)
    A[0], B[:, 0], C[0, 0, 0] = a, b, c
    got = int(_mma(spelling[7:], A[None], B[None], C)[0, 0, 0])
    want = _reference(a, b, c, fmt, L)
    assert got == want or (want == 0x7FFFFFFF and (got >> 23) & 0xFF == 0xFF and got & 0x7FFFFF), (hex(got), hex(want))


# (a row, b column, C, the exact model's D bits, MMA-Sim 2.1.1's) on v_mfma_f32_32x32x2bf16 (one block)
BF16_CASES = [
    ([1.0, 1.0], [1.0, -1.0], 0.0, 0x00000000, 0x00000000),  # exact cancellation: +0
    ([-0.0, -0.0], [1.0, 1.0], -0.0, 0x00000000, 0x00000000),  # -0 + -0 + -0: +0 (an exact zero)
    ([-2.0**-80, 0.0], [2.0**-80, 0.0], 0.0, 0x80000000, 0x80000000),  # -2**-160 rounds to -0
    ([2.0**-75, 2.0**-100], [2.0**-75, 2.0**-100], 0.0, 0x00000001, 0x00000001),  # 2**-150 + tiny: up
    ([2.0**-75, 0.0], [2.0**-75, 0.0], 0.0, 0x00000000, 0x00000000),  # 2**-150 exactly: even (+0)
    ([2.0**100, 2.0**-70], [2.0**20, 2.0**-70], -2.0**120, 0x00000200, 0x00000200),  # 2**120 cancels: 2**-140
    # MMA-Sim's two float64 artefacts (experiments/mmasim/README.md):
    ([-2.0**-75, -2.0**-100], [2.0**-75, 2.0**-100], 2.0**-126, 0x007FFFFF, 0x00800000),  # tie below 2**-126
    ([2.0**52, -2.0**30], [2.0**51, 2.0**30], float(np.finfo(np.float32).max), 0x7F7FFFFF, 0x7F800000),
]


def test_zeros_ties_and_mmasim_artefacts():
    """Signed zeros and ties as MMA-Sim gives them, and the two places where its float64
    arithmetic rounds twice: just below 2**-126 (C = 2**-126, a product of -2**-150 and a smaller
    negative one: the sum lies below the midpoint, MMA-Sim's tie test assumes an ulp of 2**-150
    below 2**-126) and just below the overflow threshold (FLT_MAX + 2**103 - 2**60: MMA-Sim's
    float64 sum of the terms, which it uses to find infinities, rounds to 2**128 - 2**103 and then
    to inf). tcemu gives the exact model's bits there."""
    A = np.zeros((len(BF16_CASES), 32, 2), np.float32)
    B = np.zeros((len(BF16_CASES), 2, 32), np.float32)
    C = np.zeros((len(BF16_CASES), 32, 32), np.float32)
    for i, (a, b, c, _, _) in enumerate(BF16_CASES):
        A[i, 0], B[i, :, 0], C[i, 0, 0] = a, b, c
    bf = DTYPES["bf16"]
    got = _mma("f32_32x32x2bf16", A.astype(bf).view(np.uint16), B.astype(bf).view(np.uint16), C.view(np.uint32))
    exact = [t[3] for t in BF16_CASES]
    assert [int(x) for x in got[:, 0, 0]] == exact
    assert sum(t[3] != t[4] for t in BF16_CASES) == 2


def test_exact_block_sum_model():
    """BlockFMA(block_sum="exact") names its valid settings; other block sizes (a K that they do
    not divide: a shorter last block) follow the exact model; products wider than 24 bits are
    refused."""
    with pytest.raises(ValueError, match="block_sum must be one of 'fused', 'separate', 'pairwise', 'exact'"):
        tcemu.BlockFMA(block_sum="kulisch")
    with pytest.raises(ValueError, match=r"block_sum='exact' needs block_size 1\.\.16 and rounding='rne'"):
        tcemu.BlockFMA(block_sum="exact")
    with pytest.raises(ValueError, match=r"block_size 1\.\.16 and the fields it has; got block_size=17"):
        tcemu.BlockFMA(block_sum="exact", rounding="rne", block_size=17)
    from tcemu._src import formats as fm
    from tcemu._src.numerics.exact_sum import exact_dot

    rng = np.random.default_rng(5)
    a = rng.integers(0, 0x7C00, (6, 1, 5)) | (rng.integers(0, 2, (6, 1, 5)) << 15)
    b = rng.integers(0, 0x7C00, (6, 5, 1)) | (rng.integers(0, 2, (6, 5, 1)) << 15)
    c = rng.integers(0, 0x4F800000, (6, 1, 1))
    m = tcemu.BlockFMA(block_sum="exact", rounding="rne", block_size=3)  # K = 5: blocks of 3 and 2
    d = np.asarray(jax.jit(lambda a, b, c: exact_dot(a, fm.F16, b, fm.F16, c, m))(a, b, c))
    want = [_reference(a[i, 0].tolist(), b[i, :, 0].tolist(), int(c[i, 0, 0]), "f16", 3) for i in range(6)]
    assert d[:, 0, 0].tolist() == want
    with pytest.raises(ValueError, match="at most 24 bits; f32 x f32 has 48"):
        exact_dot(c, fm.F32, c, fm.F32, c, m)
