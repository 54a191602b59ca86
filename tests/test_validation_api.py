"""Bad and edge inputs of the value-level and GEMM API (quantize, mma, ptx, matmul/dot_general/
einsum, GemmConfig, BlockFMA, ArchNumerics, arch names): a TypeError/ValueError raised by tcemu
that names the argument, or the result an independent reference gives."""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import tcemu
from tcemu._src.arch import SM

F16_WMMA = "wmma.mma.sync.aligned.row.col.m16n16k16.f32.f32"
E4M3 = "m16n8k32.f32.e4m3.e4m3.f32"
DTYPES = {"f16": np.float16, "bf16": ml_dtypes.bfloat16, "e4m3": ml_dtypes.float8_e4m3fn,
          "e5m2": ml_dtypes.float8_e5m2}


# ---------------------------------------------------------------------------------------------
# quantize


def _float32_sample():
    """Every bf16-representable float32 (all 2**16 top halves), each also with the halfway bit set
    (bf16 ties) and with low bits set, plus random float32 patterns and named edge values."""
    top = np.arange(1 << 16, dtype=np.uint32) << 16
    rng = np.random.default_rng(0)
    edges = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 448.0, 464.0, 464.0001, 480.0, 57344.0,
                      61440.0, 65504.0, 65520.0, 65519.99, 2.0 ** -24, 2.0 ** -25, 3 * 2.0 ** -26, 2.0 ** -9,
                      2.0 ** -10, 1e-45, -1e-45, 1.2e-38, 3.4e38, -3.4e38], np.float32).view(np.uint32)
    bits = np.concatenate([top, top | 0x8000, top | 0x7FFF, top | 0x1000, top | 0x0FFF,
                           rng.integers(0, 1 << 32, 200_000, dtype=np.uint64).astype(np.uint32), edges])
    return bits.view(np.float32)


def _same(got, want):
    """Same NaN-ness everywhere and the same bits where not NaN."""
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))


@pytest.mark.parametrize("etype", sorted(DTYPES))
def test_quantize_rne_equals_ml_dtypes(etype):
    x = _float32_sample()
    with np.errstate(over="ignore", invalid="ignore"):
        want = x.astype(DTYPES[etype]).astype(np.float32)
    _same(tcemu.quantize(x, etype), want)
    _same(jax.jit(lambda v: tcemu.quantize(v, etype))(x), want)


def test_quantize_tf32_rne_equals_integer_rounding():
    x = _float32_sample()
    u = x.view(np.uint32).astype(np.uint64)
    # round to nearest even at bit 13 of the float32 pattern, hand-derived in integers
    want = ((u + 0xFFF + ((u >> 13) & 1)) & ~np.uint64(0x1FFF)).astype(np.uint32).view(np.float32)
    got = tcemu.quantize(x, "tf32")
    _same(got, np.where(np.isnan(x), np.nan, want))
    nan_bits = np.asarray(got).view(np.uint32)[np.isnan(x)]
    assert np.all(nan_bits == 0x7FFFE000)  # a tf32 NaN, also where the float32 payload was below bit 13


def test_e4m3_has_no_infinity():
    np.testing.assert_array_equal(np.isnan(tcemu.quantize([500.0, 1000.0, np.inf, -np.inf, 448.0, 464.0], "e4m3")),
                                  [True, True, True, True, False, False])
    sr = tcemu.quantize([np.inf, -np.inf, 1000.0, 448.0], "e4m3", "stochastic", key=jax.random.key(0))
    np.testing.assert_array_equal(np.isnan(sr), [True, True, True, False])
    # fp8 GEMM inputs of that size are NaN too: their rows of the product are NaN
    rng = np.random.default_rng(1)
    a = rng.standard_normal((16, 32)).astype(np.float32)
    b = rng.standard_normal((32, 8)).astype(np.float32)
    a[3, 5] = 500.0
    y = np.asarray(tcemu.matmul(a, b, arch="H100", instruction=E4M3))
    assert np.isnan(y[3]).all() and not np.isnan(np.delete(y, 3, axis=0)).any()


@pytest.mark.parametrize("etype", ["fp16", "float16", "f32", "e4m3fn", 16, None])
def test_quantize_unknown_format(etype):
    with pytest.raises(ValueError, match="f16, bf16, tf32, e4m3, e5m2"):
        tcemu.quantize([1.0], etype)


@pytest.mark.parametrize("mode", ["RNE", "nearest", "sr", 0])
def test_quantize_unknown_mode(mode):
    with pytest.raises(ValueError, match="mode must be one of rne, stochastic"):
        tcemu.quantize([1.0], "bf16", mode)


def test_quantize_rejects_complex_and_needs_key():
    with pytest.raises(TypeError, match="x must be a real numeric array"):
        tcemu.quantize(np.array([1 + 2j]), "bf16")
    with pytest.raises(ValueError, match="needs key"):
        tcemu.quantize([1.0], "bf16", "stochastic")


def test_quantize_same_bits_with_x64():
    x = _float32_sample()[::7]
    got = {}
    for on in (False, True):
        with jax.enable_x64(on):
            got[on] = [np.asarray(tcemu.quantize(x, f, m, key=jax.random.key(3))).view(np.uint32)
                       for f in ("f16", "bf16", "tf32", "e4m3", "e5m2") for m in ("rne", "stochastic")]
    for off, on in zip(got[False], got[True]):
        np.testing.assert_array_equal(off, on)


# ---------------------------------------------------------------------------------------------
# PRNG keys


BAD_KEYS = [(0, TypeError), (1.5, TypeError), ("key", TypeError), (np.int32([0, 0]), TypeError),
            (np.zeros(3, np.uint32), ValueError), (np.zeros((2, 2), np.uint32), ValueError),
            (jax.random.split(jax.random.key(0), 2), ValueError)]


@pytest.mark.parametrize("key,exc", BAD_KEYS, ids=range(len(BAD_KEYS)))
def test_bad_prng_keys(key, exc):
    a = jnp.ones((16, 16), jnp.float16)
    c = jnp.zeros((16, 16), jnp.float32)
    sr = tcemu.BlockFMA(rounding="stochastic")
    calls = [lambda: tcemu.quantize([1.0], "bf16", "stochastic", key=key),
             lambda: tcemu.matmul(a, a, quantize="stochastic", key=key),
             lambda: tcemu.einsum("ij,jk->ik", a, a, key=key),
             lambda: tcemu.mma(F16_WMMA, a, a, c, model=sr, key=key)]
    for call in calls:
        with pytest.raises(exc, match=r"key.*jax\.random\.key"):
            call()


def test_legacy_and_typed_keys_agree():
    x = np.linspace(-3, 3, 101, dtype=np.float32)
    typed = tcemu.quantize(x, "e5m2", "stochastic", key=jax.random.key(7))
    legacy = tcemu.quantize(x, "e5m2", "stochastic", key=jax.random.PRNGKey(7))
    np.testing.assert_array_equal(np.asarray(typed), np.asarray(legacy))
    a = jnp.asarray(np.random.default_rng(2).standard_normal((16, 16)), jnp.float32)
    cfg = tcemu.GemmConfig(quantize="stochastic")
    np.testing.assert_array_equal(np.asarray(tcemu.matmul(a, a, config=cfg, key=jax.random.key(1))),
                                  np.asarray(tcemu.matmul(a, a, config=cfg, key=jax.random.PRNGKey(1))))


# ---------------------------------------------------------------------------------------------
# model= and config=


@pytest.mark.parametrize("model", ["rz", 3, {"fraction_bits": 24}, [tcemu.BlockFMA()], tcemu.GemmConfig()],
                         ids=["str", "int", "dict", "list", "GemmConfig"])
def test_model_must_be_a_model(model):
    a = jnp.ones((16, 16), jnp.float16)
    c = jnp.zeros((16, 16), jnp.float32)
    for call in (lambda: tcemu.mma(F16_WMMA, a, a, c, model=model), lambda: tcemu.ptx(F16_WMMA, model=model),
                 lambda: tcemu.GemmConfig(model=model), lambda: tcemu.matmul(a, a, model=model)):
        with pytest.raises(TypeError, match="model must be a tcemu.BlockFMA, a tcemu.ArchNumerics or None"):
            call()


@pytest.mark.parametrize("spelling", ["wmma.load.a.sync.aligned.row.m16n16k16.f16",
                                      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32"])
def test_model_only_for_floating_point_mma(spelling):
    with pytest.raises(ValueError, match="model= applies to floating-point MMAs"):
        tcemu.ptx(spelling, model=tcemu.BlockFMA())
    if spelling.startswith("mma"):
        with pytest.raises(ValueError, match="model= applies to floating-point MMAs"):
            tcemu.mma(spelling, np.ones((16, 32), np.int8), np.ones((32, 8), np.int8), np.zeros((16, 8), np.int32),
                      model=tcemu.BlockFMA())


def test_arch_numerics_model_is_used():
    a = jnp.asarray(np.random.default_rng(3).standard_normal((16, 16)), jnp.float16)
    c = jnp.zeros((16, 16), jnp.float32)
    np.testing.assert_array_equal(np.asarray(tcemu.mma(F16_WMMA, a, a, c, model=tcemu.numerics("V100"))),
                                  np.asarray(tcemu.mma(F16_WMMA, a, a, c, arch="V100")))


@pytest.mark.parametrize("config", [{}, {"arch": "H100"}, "H100", tcemu.BlockFMA()], ids=["empty", "dict", "str", "model"])
def test_config_must_be_a_gemm_config(config):
    a = jnp.ones((4, 4))
    for call in (lambda: tcemu.matmul(a, a, config=config),
                 lambda: tcemu.dot_general(a, a, (((1,), (0,)), ((), ())), config=config),
                 lambda: tcemu.einsum("ij,jk->ik", a, a, config=config)):
        with pytest.raises(TypeError, match="config must be a tcemu.GemmConfig or None"):
            call()


def test_unknown_fields_are_named():
    with pytest.raises(TypeError, match="GemmConfig has no field splitk; fields: arch"):
        tcemu.matmul(jnp.ones((4, 4)), jnp.ones((4, 4)), splitk=2)
    with pytest.raises(TypeError, match="BlockFMA has no field bits; fields: fraction_bits"):
        tcemu.BlockFMA().replace(bits=3)


# ---------------------------------------------------------------------------------------------
# GemmConfig, BlockFMA, ArchNumerics fields

GEMM_BAD = [
    (dict(split_k=2.5), TypeError, "split_k must be >= 1"), (dict(split_k=True), TypeError, "split_k"),
    (dict(split_k=0), ValueError, "split_k must be >= 1"), (dict(split_k="4"), TypeError, "split_k"),
    (dict(promotion_interval=0), ValueError, "promotion_interval must be >= 1"),
    (dict(promotion_interval=-128), ValueError, "promotion_interval must be >= 1"),
    (dict(promotion_interval=128.0), TypeError, "promotion_interval"),
    (dict(promotion_interval=[128]), TypeError, "promotion_interval"),
    (dict(k_order=["sequential"]), TypeError, "k_order must be one of 'sequential'"),
    (dict(k_order="Sequential"), ValueError, "k_order must be one of 'sequential'"),
    (dict(quantize="stochastic_rounding"), ValueError, "quantize must be one of 'rne', 'stochastic'"),
    (dict(quantize=None), TypeError, "quantize must be one of"),
    (dict(grad_lhs="exact"), TypeError, "grad_lhs must be a tcemu.GemmConfig or None"),
    (dict(grad_rhs={}), TypeError, "grad_rhs must be a tcemu.GemmConfig or None"),
    (dict(arch="sm_99"), ValueError, "unknown arch 'sm_99'"), (dict(arch=90), TypeError, "arch must be a string"),
    (dict(arch=None), TypeError, "arch must be a string"),
    (dict(instruction=("m16n8k16",)), TypeError, "instruction must be a PTX spelling"),
    (dict(instruction=None), TypeError, "instruction must be a PTX spelling"),
    (dict(instruction="m16n8k16.bf16"), ValueError, "instruction 'm16n8k16.bf16'"),
    (dict(arch="V100", instruction="m16n8k8.f32.tf32.tf32.f32"), ValueError, "requires sm_80"),
]


@pytest.mark.parametrize("kwargs,exc,match", GEMM_BAD, ids=[str(k) for k, _, _ in GEMM_BAD])
def test_gemm_config_fields(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        tcemu.GemmConfig(**kwargs)
    with pytest.raises(exc, match=match):
        tcemu.GemmConfig().replace(**kwargs)


def test_gemm_config_without_numerics_for_the_instruction():
    with pytest.raises(ValueError, match="no bf16 mma numerics for mine"):
        tcemu.GemmConfig(model=tcemu.ArchNumerics("mine", f16=tcemu.BlockFMA()))


BLOCK_BAD = [
    (dict(fraction_bits=24.5), TypeError, "fraction_bits must be in 1..28"),
    (dict(fraction_bits=True), TypeError, "fraction_bits"), (dict(fraction_bits="24"), TypeError, "fraction_bits"),
    (dict(fraction_bits=0), ValueError, "fraction_bits must be in 1..28"),
    (dict(block_size=0), ValueError, "block_size must be >= 1"), (dict(block_size=8.0), TypeError, "block_size"),
    (dict(block_size=False), TypeError, "block_size"),
    (dict(accumulator_fraction_bits=24), ValueError, "accumulator_fraction_bits must be in 1..23"),
    (dict(rounding="RZ"), ValueError, "rounding must be one of 'rz', 'rne'"),
    (dict(f16_rounding=None), TypeError, "f16_rounding must be one of"),
    (dict(addend_rounding="nearest"), ValueError, "addend_rounding must be one of"),
    (dict(sticky=1), TypeError, "sticky must be True or False"),
    (dict(normalize_products="yes"), TypeError, "normalize_products must be True or False"),
    (dict(subnormal_inputs=None), TypeError, "subnormal_inputs"), (dict(subnormal_outputs=0.0), TypeError, "subnormal_outputs"),
    (dict(zero_exponent=-126.0), TypeError, "zero_exponent must be in -512..512"),
    (dict(zero_exponent=True), TypeError, "zero_exponent"),
    (dict(min_exponent=10 ** 6), ValueError, "min_exponent must be in -512..512"),
    (dict(min_exponent="-100"), TypeError, "min_exponent"),
    (dict(overflow="saturate"), ValueError, "overflow must be one of 'inf', 'ieee'"),
    (dict(tf32_conversion="rn"), ValueError, "tf32_conversion must be one of 'truncate', 'rna'"),
    (dict(block_order="0213"), TypeError, "block_order must be None or a tuple of ints"),
    (dict(block_order=(0, 1.0)), TypeError, "block_order"), (dict(block_order=5), TypeError, "block_order"),
    (dict(block_order=()), ValueError, "permutation"), (dict(block_order=(1, 2)), ValueError, "permutation"),
    (dict(addend="middle"), ValueError, "addend must be one of 'first', 'last'"),
    (dict(f16_accumulation="f16"), ValueError, "f16_accumulation must be one of 'native', 'f32'"),
]


@pytest.mark.parametrize("kwargs,exc,match", BLOCK_BAD, ids=[str(k) for k, _, _ in BLOCK_BAD])
def test_block_fma_fields(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        tcemu.BlockFMA(**kwargs)


def test_block_fma_normalises_numpy_and_lists():
    m = tcemu.BlockFMA(fraction_bits=np.int64(24), sticky=np.bool_(True), block_order=[1, 0])
    assert m == tcemu.BlockFMA(fraction_bits=24, sticky=True, block_order=(1, 0))
    assert type(m.fraction_bits) is int and type(m.sticky) is bool
    hash(m)  # usable as a static jit argument


@pytest.mark.parametrize("kwargs,match", [(dict(arch="x", f16="rz"), "ArchNumerics.f16 must be a tcemu.BlockFMA"),
                                          (dict(arch="x", tf32={}), "ArchNumerics.tf32"),
                                          (dict(arch=90), "ArchNumerics.arch"),
                                          (dict(arch="x", notes=None), "ArchNumerics.notes")])
def test_arch_numerics_fields(kwargs, match):
    with pytest.raises(TypeError, match=match):
        tcemu.ArchNumerics(**kwargs)


FIELD_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-10 ** 6, 10 ** 6), st.floats(allow_nan=True),
                         st.text(max_size=12), st.sampled_from(["rz", "rne", "stochastic", "first", "f32", "rna",
                                                                "inf", "split_k", "sm_90", "H100"]),
                         st.lists(st.integers(-2, 40), max_size=5), st.dictionaries(st.text(max_size=3), st.integers()))


@settings(max_examples=300, deadline=None)
@given(cls=st.sampled_from([tcemu.BlockFMA, tcemu.GemmConfig]), data=st.data())
def test_constructors_raise_a_named_error_or_build(cls, data):
    """Random values for random fields: a config that builds is hashable and keeps usable field
    types; anything else is a TypeError/ValueError whose message names the field."""
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = data.draw(st.dictionaries(st.sampled_from(names), FIELD_VALUES, max_size=3))
    try:
        obj = cls(**kwargs)
    except (TypeError, ValueError) as e:
        msg = str(e)
        assert any(k in msg for k in kwargs) or "instruction" in msg or "requires sm_" in msg, msg
        return
    hash(obj)
    for name, v in kwargs.items():
        got = getattr(obj, name)
        assert got is None or isinstance(got, (int, str, tuple, tcemu.BlockFMA, tcemu.ArchNumerics, tcemu.GemmConfig))


# ---------------------------------------------------------------------------------------------
# shapes: empty dimensions, batches


EMPTY = [((3, 0), (0, 4)), ((0, 5), (5, 4)), ((3, 5), (5, 0)), ((2, 3, 0), (2, 0, 4)), ((0, 3, 5), (5, 4)),
         ((2, 3, 0), (0, 4)), ((1, 3, 5), (0, 5, 4))]


@pytest.mark.parametrize("sa,sb", EMPTY, ids=[f"{a}@{b}" for a, b in EMPTY])
def test_empty_dimensions_like_jnp(sa, sb):
    a, b = jnp.ones(sa, jnp.float32), jnp.ones(sb, jnp.float32)
    want = jnp.matmul(a, b)
    got = tcemu.matmul(a, b)
    assert got.shape == want.shape and got.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(got).view(np.uint32), np.zeros(want.shape, np.uint32))  # +0
    ga, gb = jax.grad(lambda x, y: tcemu.matmul(x, y).sum(), argnums=(0, 1))(a, b)
    assert ga.shape == sa and gb.shape == sb and not np.asarray(ga).any() and not np.asarray(gb).any()
    jitted = jax.jit(lambda x, y: tcemu.matmul(x, y, k_order="pairwise"))(a, b)
    assert jitted.shape == want.shape


def test_empty_contraction_through_dot_general_and_einsum():
    x, y = jnp.ones((2, 3, 0)), jnp.ones((2, 0, 4))
    dn = (((2,), (1,)), ((0,), (0,)))
    got = tcemu.dot_general(x, y, dn)
    assert got.shape == jax.lax.dot_general(x, y, dn).shape == (2, 3, 4)
    assert not np.signbit(np.asarray(got)).any() and not np.asarray(got).any()
    assert tcemu.einsum("bij,bjk->bik", x, y).shape == (2, 3, 4)
    g = jax.grad(lambda v: tcemu.dot_general(v, y, dn).sum())(x)
    assert g.shape == x.shape


def test_batch_mismatch_named():
    with pytest.raises(ValueError, match=r"batch axes of a \(2, 3, 4\) and b \(3, 4, 5\) do not broadcast"):
        tcemu.matmul(jnp.ones((2, 3, 4)), jnp.ones((3, 4, 5)))
    a = jnp.ones((2, 16, 16), jnp.float16)
    with pytest.raises(ValueError, match=r"batch axes of a \(2, 16, 16\), b \(3, 16, 16\) and c \(16, 16\)"):
        tcemu.mma(F16_WMMA, a, jnp.ones((3, 16, 16), jnp.float16), jnp.zeros((16, 16), jnp.float32))
    with pytest.raises(ValueError, match="do not broadcast"):
        tcemu.mma(F16_WMMA, a, a, jnp.zeros((4, 16, 16), jnp.float32))


def test_matmul_rejects_complex_inputs():
    with pytest.raises(TypeError, match="b must be a real numeric array"):
        tcemu.matmul(jnp.ones((4, 4)), jnp.ones((4, 4), jnp.complex64))


# ---------------------------------------------------------------------------------------------
# dot_general dimension numbers

DN_BAD = [((((5,), (0,)), ((), ())), ValueError, r"lhs_contracting \(5,\) out of range"),
          ((((-1,), (0,)), ((), ())), ValueError, r"lhs_contracting \(-1,\) out of range"),
          ((((1,), (-2,)), ((), ())), ValueError, r"rhs_contracting \(-2,\) out of range"),
          ((((1, 1), (0, 0)), ((), ())), ValueError, "must be distinct"),
          ((((1,), (0,)), ((1,), (0,))), ValueError, "must be distinct"),
          ((((0,), (0,)), ((), ())), ValueError, r"contracting dimensions \(0,\) of lhs \(3, 4\)"),
          ((((1,), (0, 1)), ((), ())), ValueError, "1 lhs and 2 rhs contracting"),
          ((((1,), (0,)), ((0,), ())), ValueError, "1 lhs and 0 rhs batch"),
          ((((1,), (0,)), ((0,), (1,))), ValueError, r"batch dimensions \(0,\) of lhs \(3, 4\) and \(1,\) of rhs"),
          ((((1.0,), (0,)), ((), ())), TypeError, "lhs_contracting must be ints"),
          ((((True,), (0,)), ((), ())), TypeError, "must be ints"),
          (((1,), (0,)), TypeError, "dimension_numbers must be"), ("ij", TypeError, "dimension_numbers must be"),
          (None, TypeError, "dimension_numbers must be")]


@pytest.mark.parametrize("dn,exc,match", DN_BAD, ids=[str(d) for d, _, _ in DN_BAD])
def test_dot_general_dimension_numbers(dn, exc, match):
    x, y = jnp.ones((3, 4)), jnp.ones((4, 5))
    with pytest.raises(exc, match=match):
        tcemu.dot_general(x, y, dn)


def test_dot_general_numpy_integer_dims():
    x = jnp.asarray(np.random.default_rng(4).standard_normal((5, 3, 4)), jnp.float32)
    y = jnp.asarray(np.random.default_rng(5).standard_normal((5, 4, 2)), jnp.float32)
    dn = (((np.int64(2),), (np.int32(1),)), ((0,), (0,)))
    cfg = tcemu.GemmConfig(instruction="m16n8k8.f32.tf32.tf32.f32")
    got = tcemu.dot_general(x, y, dn, config=cfg)
    want = jax.lax.dot_general(tcemu.quantize(x, "tf32"), tcemu.quantize(y, "tf32"), (((2,), (1,)), ((0,), (0,))),
                               precision="highest")
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------------------------------------
# narrow integer operands of the value-level mma

S4 = "mma.sync.aligned.m16n8k32.row.col.s32.s4.s4.s32"
U4 = "mma.sync.aligned.m16n8k32.row.col.s32.u4.u4.s32"
B1 = "mma.sync.aligned.m16n8k256.row.col.s32.b1.b1.s32.and.popc"
INT_CASES = [(S4, "s4", np.int8, 9, -7, "a"), (S4, "s4", np.int32, -9, 7, "b"), (U4, "u4", np.uint8, 17, 1, "a"),
             (U4, "u4", np.int32, -1, 15, "b"), (B1, "b1", np.uint8, 2, 0, "a"), (B1, "b1", np.int32, 3, 1, "b")]


@pytest.mark.parametrize("spelling,etype,dt,bad,wrapped,operand", INT_CASES,
                         ids=[f"{e}-{np.dtype(d).name}-{b}" for _, e, d, b, _, _ in INT_CASES])
def test_narrow_integer_operands(spelling, etype, dt, bad, wrapped, operand):
    k = 256 if etype == "b1" else 32
    hi = 2 if etype == "b1" else 8
    rng = np.random.default_rng(6)
    ops = {"a": rng.integers(0, hi, (16, k)).astype(dt), "b": rng.integers(0, hi, (k, 8)).astype(dt)}
    ref = {n: x.astype(np.int64) for n, x in ops.items()}
    ops[operand][0, 0] = bad
    ref[operand][0, 0] = wrapped
    c = np.zeros((16, 8), np.int32)
    with pytest.raises(ValueError, match=f"{operand} holds .{etype} values outside"):
        tcemu.mma(spelling, ops["a"], ops["b"], c)
    # traced: wrapped to the low bits (sign-extended for s4), as a register holds them; for 0/1
    # values b1's popc(a & b) is the integer product
    got = jax.jit(lambda x, y: tcemu.mma(spelling, x, y, c))(ops["a"], ops["b"])
    np.testing.assert_array_equal(np.asarray(got), ref["a"] @ ref["b"])


def test_integer_dtypes_checked():
    with pytest.raises(TypeError, match="a must have dtype int8 for .s8, got int32"):
        tcemu.mma("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32", np.ones((16, 32), np.int32),
                  np.ones((32, 8), np.int8), np.zeros((16, 8), np.int32))


# ---------------------------------------------------------------------------------------------
# architectures


def test_every_arch_has_a_preset():
    for name in SM:
        assert tcemu.numerics(name).arch == name


@pytest.mark.parametrize("jetson,generation", [("sm_87", "sm_80"), ("sm_72", "sm_70")])
def test_jetson_presets_follow_their_generation(jetson, generation):
    nj, ng = tcemu.numerics(jetson), tcemu.numerics(generation)
    assert "assumed" in nj.notes
    assert dataclasses.replace(nj, arch=ng.arch, notes=ng.notes) == ng
    a = jnp.asarray(np.random.default_rng(7).standard_normal((16, 16)), jnp.float16)
    c = jnp.asarray(np.random.default_rng(8).standard_normal((16, 16)), jnp.float32)
    np.testing.assert_array_equal(np.asarray(tcemu.mma(F16_WMMA, a, a, c, arch=jetson)),
                                  np.asarray(tcemu.mma(F16_WMMA, a, a, c, arch=generation)))
    y = tcemu.matmul(np.ones((4, 40), np.float32), np.ones((40, 3), np.float32), arch=jetson, instruction=F16_WMMA)
    np.testing.assert_array_equal(np.asarray(y), np.full((4, 3), 40.0, np.float32))


@pytest.mark.parametrize("arch,exc", [("sm_88", ValueError), ("Orin Nano", ValueError), (87, TypeError)])
def test_unknown_arch_named(arch, exc):
    with pytest.raises(exc, match="arch"):
        tcemu.numerics(arch)


def test_64_bit_integer_inputs_do_not_wrap_with_x64_off():
    """int64 operands become float32 (one rounding) rather than wrapping through int32."""
    a = np.array([[2**40, 3]], np.int64)
    b = np.array([[1], [1]], np.int64)
    with jax.enable_x64(False):
        out = tcemu.matmul(a, b, arch="A100", instruction="m16n8k8.f32.tf32.tf32.f32")
        q = tcemu.quantize(np.array([2**40 + 2**20], np.int64), "bf16")
    assert float(out[0, 0]) == 2.0**40 and float(q[0]) == 2.0**40
