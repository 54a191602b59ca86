"""The GEMM epilogue (``tcemu.Epilogue``, ``matmul(..., c=, bias=, alpha=, beta=, scale_a=,
scale_b=, out_type=)``): binary32 arithmetic in integers against numpy's IEEE float32, the
epilogue's steps against a numpy/ml_dtypes model of the stated order, the matmul composition,
gradients and bad input."""
from __future__ import annotations

import zlib

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import tcemu
from tcemu._src import formats as fm
from tcemu._src.gemm.epilogue import Epilogue, apply
from tcemu._src.numerics import fp32

NP_TYPES = {"f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16, "e4m3": ml_dtypes.float8_e4m3fn,
            "e5m2": ml_dtypes.float8_e5m2}


def _random_f32_bits(rng, n):
    """Random bit patterns over every binade, subnormals, zeros, infinities and NaN included."""
    b = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    special = np.array([0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 1, 0x807FFFFF, 0x7F7FFFFF, 0x00800000],
                       np.uint32)
    return np.concatenate([b, np.repeat(special, 9)]), np.concatenate([rng.permutation(b), np.tile(special, 9)])


def _same(out_bits, ref_f32):
    ref = np.asarray(ref_f32, np.float32)
    got = np.asarray(out_bits, np.uint32).view(np.float32)
    nan = np.isnan(ref)
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(got[~nan].view(np.uint32), ref[~nan].view(np.uint32))


def test_mul_is_ieee_binary32():
    rng = np.random.default_rng(1)
    x, y = _random_f32_bits(rng, 40000)
    y[::3] = (y[::3] & 0x807FFFFF) | ((253 - ((x[::3] >> 23) & 0xFF)) % 256 << 23).astype(np.uint32)  # near overflow
    y[1::3] = (y[1::3] & 0x807FFFFF) | (np.maximum(0, 103 - ((x[1::3] >> 23) & 0xFF).astype(np.int64)) << 23).astype(np.uint32)
    with np.errstate(all="ignore"):
        _same(fp32.mul(jnp.asarray(x), jnp.asarray(y)), x.view(np.float32) * y.view(np.float32))


def test_fp8_outputs_saturate_at_the_top_binade():
    """e4m3 has no S.1111.111 number (NaN): values rounding up to it saturate to 448 as
    ``cvt.rn.satfinite`` does, not to NaN; e5m2's top values to 57344."""
    v = np.float32([464.0, 470.0, -479.0, 480.0, 1e6, 57344.0, 61439.0, -61440.0])
    for out in ("e4m3", "e5m2"):
        got = fm.from_bits(apply(jnp.asarray(v), out, Epilogue()), out)
        assert np.array_equal(np.asarray(got).view(np.uint8), _round_np(v, out, True).view(np.uint8)), out


def test_add_is_ieee_binary32():
    rng = np.random.default_rng(2)
    x, y = _random_f32_bits(rng, 40000)
    with np.errstate(all="ignore"):
        _same(fp32.add(jnp.asarray(x), jnp.asarray(y)), x.view(np.float32) + y.view(np.float32))


def _round_np(t, out, saturate):
    if out in ("e4m3", "e5m2") or saturate:
        big = float(ml_dtypes.finfo(NP_TYPES[out]).max)
        t = np.where(np.isnan(t), t, np.clip(t, -big, big))
    return t.astype(NP_TYPES[out])


def _model(acc, out, epi, alpha=None, beta=None, c=None, bias=None, scale_a=None, scale_b=None):
    """The epilogue's documented order in numpy float32 (IEEE, subnormals kept) and ml_dtypes."""
    t = acc.astype(np.float32)
    if scale_a is not None and scale_b is not None and epi.scales == "product":
        t = t * (scale_a * scale_b)
    else:
        for s in ((scale_b, scale_a) if epi.scales == "sequential_ba" else (scale_a, scale_b)):
            t = t if s is None else t * s
    if alpha is not None:
        t = t * alpha
    cb = None if c is None else (c if beta is None else beta * c)
    if cb is not None and epi.c == "accumulator":
        t = t + cb
    if bias is not None and epi.bias == "accumulator":
        t = t + bias
    y = _round_np(t, out, epi.saturate)
    if (cb is not None and epi.c == "output") or (bias is not None and epi.bias == "output"):
        t = y.astype(np.float32)
        if cb is not None and epi.c == "output":
            t = t + cb
        if bias is not None and epi.bias == "output":
            t = t + bias
        y = _round_np(t, out, epi.saturate)
    return y


EPILOGUES = [Epilogue(), Epilogue(c="output"), Epilogue(bias="output"), Epilogue(c="output", bias="output"),
             Epilogue(scales="sequential"), Epilogue(scales="sequential_ba"), Epilogue(saturate=True)]


@pytest.mark.parametrize("out", list(NP_TYPES))
@pytest.mark.parametrize("epi", EPILOGUES, ids=repr)
def test_epilogue_against_numpy_model(out, epi):
    rng = np.random.default_rng(zlib.crc32(f"{out} {epi!r}".encode()))
    M, N = 16, 24
    scale = 2.0 ** rng.integers(-12, 12, (M, N))
    if out in ("e4m3", "e5m2"):
        scale = scale * 2.0**-6
    acc = (rng.standard_normal((M, N)) * scale).astype(np.float32)
    acc[0, :4] = [1e-40, -3e-39, 7e4, -1e6]  # subnormal, overflow of the narrow types
    ops = dict(alpha=np.float32(rng.choice([1.0, 0.7, -3.1])), beta=np.float32(1.3),
               c=(rng.standard_normal((M, N)) * scale).astype(NP_TYPES[out]).astype(np.float32),
               bias=rng.standard_normal(N).astype(NP_TYPES[out]).astype(np.float32),
               scale_a=(2.0 ** rng.uniform(-3, 3, (M, 1))).astype(np.float32),
               scale_b=np.float32(0.0123))
    for drop in ((), ("c", "beta"), ("bias",), ("scale_a", "scale_b", "alpha")):
        sub = {k: v for k, v in ops.items() if k not in drop}
        with np.errstate(all="ignore"):
            ref = _model(acc, out, epi, **sub)
        got = fm.from_bits(apply(jnp.asarray(acc), out, epi, **{k: jnp.asarray(v) for k, v in sub.items()}), out)
        got = np.asarray(got)
        assert got.dtype == ref.dtype
        nan = np.isnan(ref.astype(np.float32))
        assert np.array_equal(np.isnan(got.astype(np.float32)), nan), (drop,)
        assert np.array_equal(got[~nan].view(f"u{got.itemsize}"), ref[~nan].view(f"u{ref.itemsize}")), (drop,)


def test_fp8_outputs_saturate_and_f16_overflows():
    acc = jnp.float32([[1e6, -1e6, 300.0]])
    e4 = np.asarray(tcemu.matmul(acc, jnp.eye(3), out_type="e4m3", arch="A100", instruction="m16n8k8.f32.tf32.tf32.f32"))
    assert e4.astype(np.float32).tolist() == [[448.0, -448.0, 288.0]]
    f16 = tcemu.matmul(jnp.float32([[1e5]]), jnp.float32([[1.0]]), out_type="f16", arch="A100",
                       instruction="m16n8k8.f32.tf32.tf32.f32")
    assert np.isinf(np.asarray(f16, np.float32)).all()


@pytest.mark.parametrize("out", ["f32", "bf16", "f16"])
def test_matmul_epilogue_is_product_then_epilogue(out):
    rng = np.random.default_rng(3)
    a = jnp.asarray(rng.standard_normal((2, 20, 48)), jnp.bfloat16)
    b = jnp.asarray(rng.standard_normal((48, 24)), jnp.bfloat16)
    c = jnp.asarray(rng.standard_normal((2, 20, 24)), jnp.float32)
    bias = jnp.asarray(rng.standard_normal(24), jnp.float32)
    cfg = tcemu.GemmConfig(arch="H100", k_order="split_k", split_k=3, epilogue=Epilogue(bias="output"))
    acc = np.asarray(tcemu.matmul(a, b, config=cfg))
    got = tcemu.matmul(a, b, c=c, beta=0.5, bias=bias, alpha=2.0, out_type=out, config=cfg)
    ref = _model(acc, out, cfg.epilogue, alpha=np.float32(2), beta=np.float32(0.5), c=np.asarray(c),
                 bias=np.asarray(bias))
    assert got.dtype == ref.dtype and np.array_equal(np.asarray(got).view(np.uint8), ref.view(np.uint8))
    with jax.enable_x64(True):
        again = tcemu.matmul(a, b, c=c, beta=0.5, bias=bias, alpha=2.0, out_type=out, config=cfg)
    assert np.array_equal(np.asarray(again).view(np.uint8), ref.view(np.uint8))


def test_dot_general_rounds_subnormal_outputs_exactly():
    """bf16 outputs below the normal range are kept (XLA's CPU conversion flushes them)."""
    x = jnp.asarray([[2.0**-130, 3 * 2.0**-131]], jnp.float32)
    out = tcemu.dot_general(x, jnp.ones((1, 1)), (((0,), (0,)), ((), ())), preferred_element_type=jnp.bfloat16,
                            config=tcemu.GemmConfig(arch="A100", instruction="m16n8k8.f32.tf32.tf32.f32"))
    assert np.asarray(out, np.float32).ravel().tolist() == [2.0**-130, 3 * 2.0**-131]


def test_dot_general_epilogue_layout():
    x = jnp.ones((3, 5), jnp.bfloat16)
    w = jnp.ones((5, 4), jnp.bfloat16)
    out = tcemu.dot_general(x, w, (((1,), (0,)), ((), ())), bias=jnp.arange(4.0), c=jnp.ones((3, 4)), beta=-1.0,
                            config=tcemu.GemmConfig(arch="H100"))
    assert out.dtype == jnp.bfloat16 and np.asarray(out, np.float32)[1].tolist() == [4.0, 5.0, 6.0, 7.0]


def test_gradients_through_the_epilogue():
    rng = np.random.default_rng(4)
    a = jnp.asarray(rng.integers(-3, 4, (4, 16)), jnp.float32)
    b = jnp.asarray(rng.integers(-3, 4, (16, 8)), jnp.float32)
    c = jnp.asarray(rng.integers(-3, 4, (4, 8)), jnp.float32)
    bias = jnp.asarray(rng.integers(-3, 4, 8), jnp.float32)
    g = jnp.asarray(rng.integers(-3, 4, (4, 8)), jnp.float32)
    cfg = tcemu.GemmConfig(arch="H100")

    def emu(a, b, c, bias, alpha, beta):
        return (tcemu.matmul(a, b, c=c, bias=bias, alpha=alpha, beta=beta, out_type="bf16", config=cfg)
                .astype(jnp.float32) * g).sum()

    def ref(a, b, c, bias, alpha, beta):
        return ((alpha * (a @ b) + beta * c + bias) * g).sum()

    args = (a, b, c, bias, jnp.float32(2.0), jnp.float32(0.5))
    got = jax.grad(emu, argnums=range(6))(*args)
    want = jax.grad(ref, argnums=range(6))(*args)
    for x, y in zip(got, want):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.parametrize("kwargs, match", [
    (dict(out_type="f64"), "out_type must be one of f32, f16, bf16, e4m3, e5m2"),
    (dict(out_type=jnp.int8), "out_type"),
    (dict(beta=2.0), "beta scales c"),
    (dict(bias=jnp.ones(5)), r"bias of shape \(5,\) does not broadcast"),
    (dict(c=jnp.ones((3, 3))), r"c of shape \(3, 3\) does not broadcast"),
    (dict(alpha=jnp.ones(2)), "alpha must be a scalar"),
    (dict(scale_a=jnp.ones((4, 2))), "scale_a of shape"),
    (dict(bias="x"), "bias"),
])
def test_bad_epilogue_operands(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        tcemu.matmul(jnp.ones((2, 8)), jnp.ones((8, 4)), **kwargs)


@pytest.mark.parametrize("field, value, match", [
    ("c", "before", "c must be one of"), ("bias", None, "bias must be one of"),
    ("scales", "a_first", "scales must be one of"), ("saturate", 1, "saturate must be True or False"),
])
def test_bad_epilogue_config(field, value, match):
    with pytest.raises((ValueError, TypeError), match=match):
        Epilogue(**{field: value})
    with pytest.raises(TypeError, match="epilogue must be a tcemu.Epilogue"):
        tcemu.GemmConfig(epilogue="output")


@pytest.mark.parametrize("place_c, place_bias", [("accumulator", "accumulator"), ("accumulator", "output"),
                                                 ("output", "accumulator"), ("output", "output")])
def test_identify_finds_the_epilogue(place_c, place_bias):
    """The truth is built from an exact-sum GEMM (small integers: every schedule gives the same
    accumulator) and the numpy model of the epilogue, so only the epilogue's place decides."""
    rng = np.random.default_rng(5)
    a = rng.integers(-8, 9, (32, 64)).astype(ml_dtypes.bfloat16)
    b = (rng.integers(-8, 9, (64, 24)) * 2.0**-3).astype(ml_dtypes.bfloat16)
    acc = a.astype(np.float32) @ b.astype(np.float32) + np.float32(2.0**-7)  # 2**-7: below a bf16 ulp of the sums
    acc = acc.astype(np.float32)
    bias = (rng.standard_normal(24) * 3).astype(ml_dtypes.bfloat16).astype(np.float32)
    c = (rng.standard_normal((32, 24)) * 5).astype(ml_dtypes.bfloat16).astype(np.float32)
    epi = Epilogue(c=place_c, bias=place_bias)
    # a is given one extra column whose product is the 2**-7 offset, so the GEMM computes acc exactly
    a2 = np.concatenate([a, np.ones((32, 1), ml_dtypes.bfloat16)], 1)
    b2 = np.concatenate([b, np.full((1, 24), 2.0**-7, ml_dtypes.bfloat16)], 0)
    d = _model(acc, "bf16", epi, c=c, bias=bias)
    cfg = tcemu.identify(a2, b2, d, arch="H100", instruction="m16n8k16.f32.bf16.bf16.f32", c=c, bias=bias,
                         candidates=[tcemu.KSchedule()])
    assert cfg.epilogue == epi
    out = tcemu.matmul(a2, b2, c=c, bias=bias, out_type="bf16", config=cfg)
    assert np.array_equal(np.asarray(out).view(np.uint16), d.view(np.uint16))


def test_identify_epilogue_errors():
    a = np.ones((16, 16), np.float16); b = np.ones((16, 8), np.float16); d = np.zeros((16, 8), np.float16)
    with pytest.raises(ValueError, match=r"bias must have shape \(8,\)"):
        tcemu.identify(a, b, d, arch="H100", bias=np.ones(3))
    with pytest.raises(ValueError, match="beta scales c"):
        tcemu.identify(a, b, d, arch="H100", beta=2.0)
    with pytest.raises(TypeError, match="epilogues must be a non-empty list of tcemu.Epilogue"):
        tcemu.identify(a, b, d, arch="H100", bias=np.ones(8), epilogues=["output"])


def test_einsum_epilogue_is_dot_general_epilogue():
    rng = np.random.default_rng(6)
    x = jnp.asarray(rng.standard_normal((2, 12, 40)), jnp.bfloat16)
    w = jnp.asarray(rng.standard_normal((40, 16)), jnp.bfloat16)
    bias = jnp.asarray(rng.standard_normal(16), jnp.float32)
    cfg = tcemu.GemmConfig(arch="H100", epilogue=Epilogue(bias="output"))
    got = tcemu.einsum("bsk,kn->bsn", x, w, bias=bias, config=cfg)
    want = tcemu.dot_general(x, w, (((2,), (0,)), ((), ())), bias=bias, config=cfg)
    assert got.dtype == jnp.bfloat16 and np.array_equal(np.asarray(got).view(np.uint16), np.asarray(want).view(np.uint16))
    with pytest.raises(ValueError, match="epilogue operands need two operands"):
        tcemu.einsum("ij,jk,kl->il", jnp.ones((2, 3)), jnp.ones((3, 4)), jnp.ones((4, 5)), bias=jnp.ones(5))
