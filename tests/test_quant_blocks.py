"""Block quantisation (tcemu.block_quantize, BlockQuantized.dequantize) against the recipes
written again here in exact rational arithmetic (Fractions; NumPy on the CPU keeps subnormals):
the OCP MX v1.0 recipe (section 6.3, FLOOR scale) and NVIDIA's NVFP4 recipe (arXiv 2509.25149,
with Transformer Engine's clamps of the encode scale), ml_dtypes for the codes' bit layouts.
Subnormal inputs, zeros, -0, infinities and NaN; x64 on and off; empty inputs; bad arguments."""
from __future__ import annotations

import functools
import math
import traceback
from fractions import Fraction

import jax
import ml_dtypes
import numpy as np
import pytest

import tcemu

F32_MAX = float(np.finfo(np.float32).max)
# element formats: fraction bits, smallest normal exponent, largest finite value, ml_dtypes type
ELEM = {"e4m3": (3, -6, 448.0, ml_dtypes.float8_e4m3fn), "e5m2": (2, -14, 57344.0, ml_dtypes.float8_e5m2),
        "e3m2": (2, -2, 28.0, ml_dtypes.float6_e3m2fn), "e2m3": (3, 0, 7.5, ml_dtypes.float6_e2m3fn),
        "e2m1": (1, 0, 6.0, ml_dtypes.float4_e2m1fn)}
MXFP8 = "mma.sync.aligned.m16n8k32.row.col.kind::mxf8f6f4.block_scale.scale_vec::1X.f32.e4m3.e4m3.f32.ue8m0"


def _floor_log2(a: Fraction) -> int:
    e = a.numerator.bit_length() - a.denominator.bit_length()
    return e - 1 if Fraction(2) ** e > a else e


def rne(v: Fraction, frac_bits: int, emin: int, top: float | None = None) -> float:
    """``v`` rounded to nearest even in a binary format (``frac_bits`` fraction bits, normal
    exponents from ``emin``, subnormals below), saturated to ``top`` (or inf above float32's
    range when ``top`` is None); the sign kept on zeros."""
    sign = -1.0 if v < 0 else 1.0
    a = abs(v)
    if a == 0:
        return math.copysign(0.0, sign)
    ulp = Fraction(2) ** (max(_floor_log2(a), emin) - frac_bits)
    n, r = divmod(a, ulp)
    n += 2 * r > ulp or (2 * r == ulp and n % 2)
    m = float(n * ulp)
    if top is not None:
        m = min(m, top)
    elif m > F32_MAX:
        m = math.inf
    return math.copysign(m, sign)


def f32(v: Fraction) -> float:
    """IEEE binary32 round to nearest even (subnormals kept, overflow to inf)."""
    return rne(v, 23, -126)


def _amax(vals):
    return max((abs(v) for v in vals if not math.isnan(v)), default=0.0)


def ref_mx(x, etype, block):
    """OCP MX: (elements, scales, element codes, scale codes, tensor scale) of x (..., K)."""
    fb, emin, top, dt = ELEM[etype]
    emax = math.frexp(top)[1] - 1
    rows = x.astype(np.float64).reshape(-1, block)
    elems, scales, scodes = [], [], []
    for row in rows:
        amax = _amax(row)
        e = -127 if amax == 0 else 127 if math.isinf(amax) else min(max(math.frexp(amax)[1] - 1 - emax, -127), 127)
        nan = any(math.isnan(v) for v in row)
        scales.append(math.nan if nan else 2.0 ** e)
        scodes.append(0xFF if nan else e + 127)
        for v in row:
            if math.isnan(v):
                elems.append(0.0)
            elif math.isinf(v):
                elems.append(math.copysign(top, v))
            else:
                elems.append(math.copysign(rne(Fraction(v) / Fraction(2) ** e, fb, emin, top), v))
    return _pack(x, block, elems, scales, scodes, 1.0, dt)


def ref_nvfp4(x, block=16):
    """NVFP4: s = 2688 / amax(x) (TE: clamped to the float32 maximum, 1 for amax 0 or inf), block
    scales e4m3(f32(f32(amax_b / 6) * s)) saturated at 448, elements e2m1(f32(x * min(f32(s /
    scale), FLT_MAX))) saturated; a zero scale zeroes its block."""
    fb, emin, top, dt = ELEM["e2m1"]
    flat = x.astype(np.float64).ravel()
    t = _amax(flat)
    s = 1.0 if t == 0 or math.isinf(t) else min(f32(Fraction(6 * 448) / Fraction(t)), F32_MAX)
    elems, scales, scodes = [], [], []
    for row in flat.reshape(-1, block):
        amax = _amax(row)
        d = math.inf if math.isinf(amax) else f32(Fraction(amax) / 6)
        p = min(math.inf if math.isinf(d) else f32(Fraction(d) * Fraction(s)), 448.0)
        sc = rne(Fraction(p), 3, -6, 448.0)
        nan = any(math.isnan(v) for v in row)
        scales.append(math.nan if nan else sc)
        scodes.append(0x7F if nan else int(np.float32(sc).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)))
        r = min(f32(Fraction(s) / Fraction(sc)), F32_MAX) if sc else 0.0
        for v in row:
            if sc == 0 or math.isnan(v):
                elems.append(0.0)
                continue
            y = math.copysign(math.inf if math.isinf(v) else f32(Fraction(v) * Fraction(r)), v)  # r > 0
            elems.append(math.copysign(top if math.isinf(y) else rne(Fraction(y), fb, emin, top), y))
    return _pack(x, block, elems, scales, scodes, s, dt)


def _pack(x, block, elems, scales, scodes, tensor, dt):
    e = np.asarray(elems, np.float32).reshape(x.shape)
    sshape = x.shape[:-1] + (x.shape[-1] // block,)
    return (e, np.asarray(scales, np.float32).reshape(sshape), e.astype(dt).view(np.uint8).astype(np.uint32),
            np.asarray(scodes, np.uint32).reshape(sshape), np.float32(tensor))


def ref_dequantize(e, s, t, block):
    """f32(f32(element * scale) / tensor_scale), exactly (a zero keeps the sign of the product)."""
    out = []
    for ev, sv in zip(e.ravel().astype(float), np.repeat(s, block, axis=-1).ravel().astype(float)):
        if math.isnan(sv) or math.isnan(ev):
            out.append(math.nan)
        else:
            p = f32(Fraction(ev) * Fraction(sv))  # inf when it overflows (448 * 2**127)
            v = p if math.isinf(p) else f32(Fraction(p) / Fraction(float(t)))
            out.append(math.copysign(v, math.copysign(1, ev) * math.copysign(1, sv)))
    return np.asarray(out, np.float32).reshape(e.shape)


def reference(x, etype, stype, block):
    return ref_mx(x, etype, block) if stype == "ue8m0" else ref_nvfp4(x, block)


def assert_same_bits(got, want):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype, want.shape, want.dtype)
    if got.dtype == np.float32:
        nan = np.isnan(want)
        np.testing.assert_array_equal(np.isnan(got), nan)
        got, want = got.view(np.uint32)[~nan], want.view(np.uint32)[~nan]
    np.testing.assert_array_equal(got, want)


def check(x, etype, stype, block, **kw):
    """block_quantize(x) and its dequantize equal the reference, every field bit for bit."""
    q = tcemu.block_quantize(x, etype, stype, block=block, **kw)
    want = reference(np.asarray(x, np.float32), etype, stype, block)
    for got, w in zip(q, want):
        assert_same_bits(got, w)
    assert_same_bits(q.dequantize(block), ref_dequantize(want[0], want[1], want[4], block))
    return q


# ---------------------------------------------------------------------------------------------
# inputs


def _f32(bits):
    return np.asarray(bits, np.uint32).view(np.float32)


def tensors(seed=0, block=32):
    """Named float32 test tensors (rows of blocks): subnormals, mixes, zeros, -0, inf, NaN."""
    rng = np.random.default_rng(seed)
    sign = lambda shape: rng.integers(0, 2, shape, dtype=np.uint32) << np.uint32(31)  # noqa: E731
    out = {
        "subnormal": _f32(rng.integers(1, 1 << 23, (4, 2 * block), dtype=np.uint32) | sign((4, 2 * block))),
        "tiny_subnormal": _f32(rng.integers(1, 64, (2, 2 * block), dtype=np.uint32) | sign((2, 2 * block))),
        "1e-40": np.full((2, block), 1e-40, np.float32) * np.where(np.arange(block) % 3, 1, -1).astype(np.float32),
        "issue": np.array([[2.0 ** -120] + [2.0 ** -127] * (block - 1)], np.float32),
        "zeros": np.array([[0.0, -0.0] * (block // 2)], np.float32),
    }
    # each block: one exponent field (0..254) and a spread of 0..30 below it, some elements subnormal
    top = rng.integers(0, 255, (6, 4, 1))
    e = np.clip(top - rng.integers(0, 31, (6, 4, block)), 0, 254).astype(np.uint32)
    frac = rng.integers(0, 1 << 23, e.shape, dtype=np.uint32)
    mixed = _f32((e << np.uint32(23)) | frac | sign(e.shape)).reshape(6, 4 * block)
    mixed[0, :block:3] = 0.0
    mixed[0, 1:block:3] = -0.0
    mixed[1, :block] = 2.0 ** -126 - 2.0 ** -149  # the largest subnormal: rounding near the normal range
    out["mixed"] = mixed
    special = mixed.copy()
    special[2, 5] = np.inf
    special[3, block + 2] = -np.inf
    special[4, 2 * block + 7] = np.nan
    special[5, :block] = np.nan
    out["special"] = special
    out["near_max"] = np.array([[3.4e38, -3e38] + [1.0] * (block - 2)], np.float32)
    return out


FORMS = [("e4m3", "ue8m0", 32), ("e5m2", "ue8m0", 32), ("e3m2", "ue8m0", 32), ("e2m3", "ue8m0", 32),
         ("e2m1", "ue8m0", 32), ("e2m1", "ue4m3", 16), ("e2m1", "ue8m0", 16)]


@pytest.mark.parametrize("etype,stype,block", FORMS)
def test_block_quantize_equals_recipe_subnormals_and_specials(etype, stype, block):
    """Every field, and dequantize, bit for bit as the recipe computes it exactly (XLA's CPU
    arithmetic flushes subnormals: blocks of them used to quantise to zeros). The tensors, padded
    with zeros to one shape, go through one vmapped call (NVFP4's tensor scale is per tensor)."""
    named = tensors(block=block)
    R, C = max(x.shape[0] for x in named.values()), max(x.shape[1] for x in named.values())
    xs = np.stack([np.pad(x, ((0, R - x.shape[0]), (0, C - x.shape[1]))) for x in named.values()])
    got = jax.vmap(lambda x: tcemu.block_quantize(x, etype, stype, block=block))(xs)
    deq = jax.vmap(lambda q: q.dequantize(block))(got)
    for i, name in enumerate(named):
        want = reference(xs[i], etype, stype, block)
        try:
            for g, w in zip(got, want):
                assert_same_bits(g[i], w)
            assert_same_bits(deq[i], ref_dequantize(want[0], want[1], want[4], block))
        except AssertionError as e:
            raise AssertionError(f"{name}: {e}") from None
        if name == "subnormal" or (name == "1e-40" and etype in ("e4m3", "e5m2")):  # not flushed to zeros
            assert np.asarray(got.elements[i][:named[name].shape[0]]).any(axis=-1).all()


def test_block_quantize_issue_block():
    """[2**-120, 2**-127 x 31] in MXFP8: scale 2**-127, elements 128 and 1 (not 128 and 0)."""
    x = np.array([[2.0 ** -120] + [2.0 ** -127] * 31], np.float32)
    q = tcemu.block_quantize(x, "e4m3", "ue8m0", block=32)
    assert q.elements.tolist() == [[128.0] + [1.0] * 31]
    assert q.scale_codes.tolist() == [[0]] and np.asarray(q.scales).view(np.uint32).tolist() == [[1 << 22]]
    np.testing.assert_array_equal(np.asarray(q.dequantize(32)).view(np.uint32), x.view(np.uint32))


@pytest.mark.parametrize("etype,stype,block", [("e4m3", "ue8m0", 32), ("e2m1", "ue4m3", 16)])
def test_block_quantize_same_bits_x64_jit_and_float64(etype, stype, block):
    """x64 off and on, eagerly and under jit, float32 and float64 inputs (float64 under x64 is
    narrowed in integers: XLA's CPU conversion flushes what NumPy keeps): the same bits."""
    x = np.concatenate([tensors(1, block)["mixed"][:, :2 * block], tensors(2, block)["subnormal"]])
    x64 = x.astype(np.float64)
    x64[0, 1] = 2.0 ** -150 * 1.5  # below float32's range: rounds to its smallest subnormal
    x = x64.astype(np.float32)
    want = reference(x, etype, stype, block)
    fn = functools.partial(tcemu.block_quantize, etype=etype, stype=stype, block=block)
    for on in (False, True):
        with jax.enable_x64(on):
            for arr in (x, x64):
                for got in (fn(arr), jax.jit(fn)(arr)):
                    for g, w in zip(got, want):
                        assert_same_bits(g, w)


def test_mxfp8_gemm_of_subnormal_block():
    """The MXFP8 GEMM of the block [2**-120, 2**-127 x 31] by ones is 159 * 2**-127, the recipe's
    and the exact product (it was 128 * 2**-127: the small elements were flushed); a block of
    k * 2**-130 by 2**-10 gives the exact, subnormal, sum; x64 off and on, float32 and float64."""
    a = np.array([2.0 ** -120] + [2.0 ** -127] * 31)
    k = np.arange(32) % 8
    cases = [(a, np.ones(32), 159 * 2.0 ** -127), (k * 2.0 ** -130, np.full(32, 2.0 ** -10), k.sum() * 2.0 ** -140)]
    for av, bv, want in cases:
        A = np.tile(av, (16, 1))
        B = np.tile(bv[:, None], (1, 8))
        assert want == sum(Fraction(x) * Fraction(y) for x, y in zip(av, bv))  # exact
        for on in (False, True):
            with jax.enable_x64(on):
                for dt in (np.float32, np.float64):
                    got = np.asarray(tcemu.matmul(A.astype(dt), B.astype(dt), arch="RTX5090", instruction=MXFP8))
                    assert got.dtype == np.float32
                    np.testing.assert_array_equal(got.view(np.uint32),
                                                  np.full((16, 8), want, np.float32).view(np.uint32))


# ---------------------------------------------------------------------------------------------
# NVFP4's tensor scale


@pytest.mark.parametrize("amax", [1e-37, 2.0 ** -126, 1e-40, 2.0 ** -149, 4e-36])
def test_nvfp4_tensor_scale_clamped_to_float32_max(amax):
    """6 * 448 / amax overflows float32 for amax below ~7.9e-36: Transformer Engine clamps the
    encode scale to the float32 maximum (it was inf, and every value dequantised to 0)."""
    x = np.float32(amax) * np.array([[1, -1, 0.5, 0.25] * 4], np.float32)
    q = check(x, "e2m1", "ue4m3", 16)
    want = min(f32(Fraction(6 * 448) / Fraction(float(np.float32(amax)))), F32_MAX)
    assert float(q.tensor_scale) == want and np.isfinite(float(q.tensor_scale))
    deq = np.asarray(q.dequantize(16))
    if amax >= 1e-37:  # enough range left: within e2m1 / e4m3 precision of x
        np.testing.assert_allclose(deq, x, rtol=0.25)
        assert deq[0, 0] != 0


def test_nvfp4_zero_and_infinite_amax():
    """TE: amax 0 (also all-NaN) or infinite gives the encode scale 1."""
    for x in (np.zeros((2, 16), np.float32), np.full((1, 16), np.nan, np.float32),
              np.array([[np.inf] + [1.0] * 15], np.float32)):
        q = check(x, "e2m1", "ue4m3", 16)
        assert float(q.tensor_scale) == 1.0


# ---------------------------------------------------------------------------------------------
# empty inputs and bad arguments: tcemu's own errors


def _ours(err, *names):
    """A ValueError/TypeError raised in tcemu's code whose message names one of ``names``."""
    assert isinstance(err, (ValueError, TypeError)), f"{type(err).__name__}: {err}"
    assert "/tcemu/" in traceback.extract_tb(err.__traceback__)[-1].filename.replace("\\", "/"), err
    assert any(n in str(err) for n in names), str(err)


@pytest.mark.parametrize("etype,stype,block", [("e2m1", "ue4m3", 16), ("e4m3", "ue8m0", 32)])
@pytest.mark.parametrize("shape", [(0, 16 * 2), (3, 0), (2, 0, 32), (0,)])
def test_block_quantize_empty(etype, stype, block, shape):
    """Empty inputs give empty results of the right shapes (tensor scale 1), eagerly and jitted."""
    x = np.zeros(shape, np.float32)
    fn = functools.partial(tcemu.block_quantize, etype=etype, stype=stype, block=block)
    for q in (fn(x), jax.jit(fn)(x)):
        sshape = shape[:-1] + (shape[-1] // block,)
        assert q.elements.shape == q.element_codes.shape == shape
        assert q.scales.shape == q.scale_codes.shape == sshape
        assert float(q.tensor_scale) == 1.0
        assert q.dequantize(block).shape == shape


def _q():
    return tcemu.block_quantize(np.arange(64, dtype=np.float32).reshape(2, 32), "e2m1", "ue4m3", block=16)


@pytest.mark.parametrize("block,names", [(8, ["scales", "(2, 2)", "(2, 4)"]), (5, ["block 5", "block=16"]),
                                         (0, ["block"]), (-16, ["block"]), (16.0, ["block"]), ("16", ["block"]),
                                         (True, ["block"]), (None, ["block"]), (64, ["block 64", "block=16"])])
def test_dequantize_bad_block(block, names):
    with pytest.raises((ValueError, TypeError)) as e:
        _q().dequantize(block)
    _ours(e.value, *names)
    for n in names[1:]:  # the shape given and the shape expected
        assert n in str(e.value), str(e.value)


@pytest.mark.parametrize("field,value,names", [
    ("scales", lambda s: s[:, :1], ["scales", "(2, 1)", "(2, 2)"]),
    ("scales", lambda s: s[:1], ["scales", "(1, 2)", "(2, 2)"]),
    ("scales", lambda s: s[..., None], ["scales", "(2, 2, 1)", "(2, 2)"]),
    ("scales", lambda s: s[None], ["scales", "(1, 2, 2)", "(2, 2)"]),
    ("scales", lambda s: "abc", ["scales"]),
    ("elements", lambda e: e[0, 0], ["elements", "()"]),
    ("elements", lambda e: None, ["elements"]),
    ("tensor_scale", lambda t: np.ones(2, np.float32), ["tensor_scale", "(2,)"]),
])
def test_dequantize_mismatched_fields(field, value, names):
    q = _q()
    bad = q._replace(**{field: value(getattr(q, field))})
    with pytest.raises((ValueError, TypeError)) as e:
        bad.dequantize(16)
    _ours(e.value, *names)
    for n in names[1:]:
        assert n in str(e.value), str(e.value)


@pytest.mark.parametrize("kw,names", [(dict(x=np.float32(1.0)), ["block", "scalar"]),
                                      (dict(x=np.ones((2, 32), np.complex64)), ["x"]),
                                      (dict(x=[[1.0], [1.0, 2.0]]), ["x"]), (dict(x=None), ["x"]),
                                      (dict(stype=None), ["stype"]), (dict(stype=["ue8m0"]), ["stype"]),
                                      (dict(etype=None), ["etype"]), (dict(block=np.int64(0)), ["block"]),
                                      (dict(block=48), ["block", "32"]), (dict(block=2.0), ["block"])])
def test_block_quantize_bad_arguments(kw, names):
    args = dict(x=np.ones((2, 32), np.float32), etype="e2m1", stype="ue8m0", block=16) | kw
    with pytest.raises((ValueError, TypeError)) as e:
        tcemu.block_quantize(args.pop("x"), args.pop("etype"), args.pop("stype"), **args)
    _ours(e.value, *names)
