"""Property test of the public API with random bad and edge inputs: every call either gives the
correct result or raises a ValueError/TypeError/IndexError from tcemu's own code whose message
names the argument that was bad. Never a JAX-internal error, never a wrong number.

Valid calls use small integers (exact in every format), so the correct result is exact integer
arithmetic in NumPy; one argument at a time is replaced by a value from a pool of bad ones."""
from __future__ import annotations

import traceback

import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import tcemu

SETTINGS = settings(max_examples=60, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

BAD_ANY = [None, "x", 2.5, -1, [1, 2], {"a": 1}, object()]


def _check_error(err: BaseException, names):
    """The error is one of ours, raised in tcemu's own code, naming one of ``names``."""
    assert isinstance(err, (ValueError, TypeError, IndexError)), f"{type(err).__name__}: {err}"
    frames = traceback.extract_tb(err.__traceback__)
    assert "/tcemu/" in frames[-1].filename.replace("\\", "/"), \
        f"raised outside tcemu ({frames[-1].filename}:{frames[-1].lineno}): {err}"
    msg = str(err)
    assert any(n in msg for n in names), f"message does not name {names}: {msg}"


def _run(call, bad_names):
    """Run ``call``; with a bad argument it must raise our error naming it. Returns the result
    (or None after an expected error)."""
    try:
        out = call()
        if isinstance(out, jax.Array):
            out.block_until_ready()
    except Exception as err:  # noqa: BLE001 - checked below
        if not bad_names:
            raise
        _check_error(err, bad_names)
        return None
    assert not bad_names, f"bad {bad_names} accepted"
    return out


def _ints(draw, shape, lo=-3, hi=3):
    return np.asarray(draw(st.lists(st.integers(lo, hi), min_size=int(np.prod(shape)),
                                    max_size=int(np.prod(shape))))).reshape(shape).astype(np.float64)


# ---------------------------------------------------------------------------------------------
# tcemu.mma

MMAS = [  # spelling, (m, n, k), a/b dtype, c/d dtype
    ("wmma.mma.sync.aligned.row.col.m16n16k16.f32.f32", (16, 16, 16), jnp.float16, jnp.float32),
    ("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32", (16, 8, 16), jnp.bfloat16, jnp.float32),
    ("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32", (16, 8, 8), jnp.float32, jnp.float32),
    ("mma.sync.aligned.m16n8k32.row.col.f16.e4m3.e4m3.f16", (16, 8, 32), ml_dtypes.float8_e4m3fn, jnp.float16),
    ("wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16", (64, 8, 16), jnp.float16, jnp.float32),
]
MMA_BAD = {
    "spelling": ["wmma.mma.sync.aligned.row.col.m16n16k16.f32.f31", "mma.sync", "", 7, None,
                 "wmma.load.a.sync.aligned.row.m16n16k16.f16"],
    "arch": ["sm_10", "H900", 90, None, ""],
    "model": ["rz", 25, {"fraction_bits": 25}],
    "a": ["shape", "dtype"], "b": ["shape", "dtype"], "c": ["shape", "dtype"],
}


@SETTINGS
@given(st.data())
def test_mma(data):
    sp, (m, n, k), ab, cd = data.draw(st.sampled_from(MMAS))
    batch = data.draw(st.sampled_from([(), (2,), (3, 1)]))
    A = _ints(data.draw, batch + (m, k))
    B = _ints(data.draw, batch + (k, n))
    C = _ints(data.draw, batch + (m, n), -8, 8)
    args = {"spelling": sp, "a": jnp.asarray(A, ab), "b": jnp.asarray(B, ab), "c": jnp.asarray(C, cd),
            "arch": "H100", "model": None}
    bad = data.draw(st.sampled_from([None] + sorted(MMA_BAD)))
    if bad is not None:
        v = data.draw(st.sampled_from(MMA_BAD[bad]))
        if bad in "abc" and v == "shape":
            args[bad] = args[bad][..., :-1]
        elif bad in "abc":
            args[bad] = args[bad].astype(jnp.int32 if args[bad].dtype != jnp.int32 else jnp.float32)
        else:
            args[bad] = v
    names = [] if bad is None else ([bad, "shape", "dtype"] if bad in "abc" else
                                    [bad, "spelling", "instruction", "qualifier"] if bad == "spelling" else [bad])
    out = _run(lambda: tcemu.mma(args["spelling"], args["a"], args["b"], args["c"], arch=args["arch"],
                                 model=args["model"]), names)
    if out is not None:
        np.testing.assert_array_equal(np.asarray(out, np.float64), A @ B + C)


# ---------------------------------------------------------------------------------------------
# matmul / dot_general / configs

GEMM_BAD = {
    "k_order": ["random", 3, None], "split_k": [0, 2.5, "4", True], "promotion_interval": [0, -128, 100.0, "128"],
    "arch": ["sm_10", 80, ""], "instruction": ["m16n8k16", 16, "m16n8k16.f32.s8.s8.s32"],
    "model": ["rz", 1], "quantize": ["rtz", 1], "grad_lhs": ["exact", 1], "config": [{"arch": "H100"}, "H100"],
}


@SETTINGS
@given(st.data())
def test_matmul(data):
    M = data.draw(st.sampled_from([0, 1, 5, 17]))
    K = data.draw(st.sampled_from([0, 3, 16, 40]))
    N = data.draw(st.sampled_from([0, 2, 9]))
    a, b = _ints(data.draw, (M, K)), _ints(data.draw, (K, N))
    kw = {"arch": "H100", "instruction": data.draw(st.sampled_from(
        ["m16n8k16.f32.bf16.bf16.f32", "m16n8k8.f32.tf32.tf32.f32", "m16n8k32.f32.e4m3.e4m3.f32"])),
        "k_order": data.draw(st.sampled_from(["sequential", "split_k", "promotion", "pairwise"]))}
    if kw["k_order"] == "promotion":
        kw["promotion_interval"] = 128
    bad = data.draw(st.sampled_from([None] + sorted(GEMM_BAD)))
    config = None
    if bad == "config":
        config = data.draw(st.sampled_from(GEMM_BAD["config"]))
    elif bad is not None:
        kw[bad] = data.draw(st.sampled_from(GEMM_BAD[bad]))
    out = _run(lambda: tcemu.matmul(jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32), config=config, **kw),
               [] if bad is None else [bad])
    if out is not None:
        assert out.shape == (M, N)
        np.testing.assert_array_equal(np.asarray(out, np.float64), a @ b)


@SETTINGS
@given(st.data())
def test_dot_general(data):
    a = _ints(data.draw, (2, 3, 4))
    b = _ints(data.draw, (4, 2, 5))
    dn = (((2,), (0,)), ((), ()))
    bad = data.draw(st.booleans())
    if bad:
        dn = data.draw(st.sampled_from([(((5,), (0,)), ((), ())), (((2,), (1,)), ((), ())), (((2, 2), (0, 0)), ((), ())),
                                        (((-1,), (0,)), ((), ())), (((0,), (2,)), ((), ())), (((2,), (0,)), ((0,), (2,))),
                                        "ij", (((2,), (0,)),)]))
    out = _run(lambda: tcemu.dot_general(jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32), dn),
               ["dimension_numbers"] if bad else [])
    if out is not None:
        np.testing.assert_array_equal(np.asarray(out, np.float64), np.einsum("ijk,klm->ijlm", a, b))


BLOCKFMA_BAD = {
    "fraction_bits": [0, 24.5, "25", True, 99], "block_size": [0, -4, 8.0, "8"], "rounding": ["rn", 1, None],
    "f16_rounding": ["rz-ish"], "accumulator_fraction_bits": [0, 24, 13.0], "sticky": ["yes", 2],
    "zero_exponent": [1.5, "low"], "overflow": ["saturate"], "block_order": [(0, 0), (1, 2), "01", 3],
    "addend": ["middle"], "f16_accumulation": ["f64"], "tf32_conversion": ["rne"],
}


@SETTINGS
@given(st.sampled_from(sorted(BLOCKFMA_BAD)), st.data())
def test_blockfma_fields(field, data):
    v = data.draw(st.sampled_from(BLOCKFMA_BAD[field]))
    _run(lambda: tcemu.BlockFMA(**{field: v}), [field])


# ---------------------------------------------------------------------------------------------
# quantize: ml_dtypes' RNE casts are the truth

Q_DTYPES = {"f16": np.float16, "bf16": ml_dtypes.bfloat16, "e4m3": ml_dtypes.float8_e4m3fn,
            "e5m2": ml_dtypes.float8_e5m2}


@SETTINGS
@given(st.sampled_from(sorted(Q_DTYPES)), st.lists(st.floats(width=32, allow_nan=True), min_size=1, max_size=30))
def test_quantize_rne_equals_ml_dtypes(fmt, xs):
    x = np.asarray(xs, np.float32)
    padded = np.zeros(30, np.float32)  # one shape for every example: one compilation per format
    padded[:x.size] = x
    got = np.asarray(tcemu.quantize(padded, fmt))[:x.size]
    with np.errstate(over="ignore", invalid="ignore"):
        want = x.astype(Q_DTYPES[fmt]).astype(np.float32)
    np.testing.assert_array_equal(got.view(np.uint32)[~np.isnan(want)], want.view(np.uint32)[~np.isnan(want)])
    assert np.all(np.isnan(got) == np.isnan(want))


@pytest.mark.parametrize("fmt", ["fp16", "float16", "e4m3fn", "", None, 3])
def test_quantize_bad_format(fmt):
    _run(lambda: tcemu.quantize(np.ones(3, np.float32), fmt), ["etype", "format"])


# ---------------------------------------------------------------------------------------------
# memory and the register file

MEM_BAD = {"p": [-2, 0.5, "0", 10 ** 6, None], "layout": ["rows", "C", 1], "stride": [3, 0, -16, 16.5],
           "etype": ["f8", "float16", 16]}


@SETTINGS
@given(st.data())
def test_put_get_matrix(data):
    rows, cols = data.draw(st.sampled_from([(4, 4), (16, 16), (8, 2)]))
    x = _ints(data.draw, (rows, cols), -100, 100).astype(np.float16)
    args = {"p": 64, "layout": data.draw(st.sampled_from(["row", "col"])), "stride": None, "etype": "f16"}
    bad = data.draw(st.sampled_from([None] + sorted(MEM_BAD)))
    if bad is not None:
        args[bad] = data.draw(st.sampled_from(MEM_BAD[bad]))
    mem = tcemu.memory(4096)
    out = _run(lambda: tcemu.put_matrix(mem, x, **args), [] if bad is None else [bad])
    if out is not None:
        back = tcemu.get_matrix(out, (rows, cols), "f16", p=args["p"], layout=args["layout"], stride=args["stride"])
        np.testing.assert_array_equal(np.asarray(back), x)


@pytest.mark.parametrize("n", [0, -5, 2.7, "8", None, True])
def test_regfile_and_memory_sizes(n):
    _run(lambda: tcemu.regfile(n), ["nregs"])
    _run(lambda: tcemu.memory(n), ["nbytes"])


LOAD = "wmma.load.a.sync.aligned.row.m16n16k16.f16"
LOAD_BAD = {"dst": [range(0, 7), range(0, 9), [0.0, 1, 2, 3, 4, 5, 6, 7], range(-1, 7), [0, 0, 1, 2, 3, 4, 5, 6],
                    range(20, 28)],
            "p": [-32, 0.5, 8, 10 ** 6, "0"], "stride": [8, 0, 16.0, -16], "regs": ["float", "shape"],
            "mem": ["dtype", "ndim"]}


@SETTINGS
@given(st.data())
def test_wmma_load(data):
    x = _ints(data.draw, (16, 16), -50, 50).astype(np.float16)
    mem = tcemu.put_matrix(tcemu.memory(2048), x, p=512)
    args = {"regs": tcemu.regfile(16), "mem": mem, "dst": range(0, 8), "p": 512, "stride": None}
    bad = data.draw(st.sampled_from([None] + sorted(LOAD_BAD)))
    if bad is not None:
        v = data.draw(st.sampled_from(LOAD_BAD[bad]))
        if bad == "regs":
            v = jnp.zeros((32, 16), jnp.float32) if v == "float" else jnp.zeros((16, 16), jnp.uint32)
        elif bad == "mem":
            v = jnp.zeros(2048, jnp.int32) if v == "dtype" else jnp.zeros((2, 1024), jnp.uint8)
        args[bad] = v
    ld = tcemu.ptx(LOAD, arch="sm_90")
    out = _run(lambda: ld(args["regs"], args["mem"], dst=args["dst"], p=args["p"], stride=args["stride"]),
               [] if bad is None else [bad])
    if out is not None:  # every register slot holds the element the measured fragment table names
        coords = ld.fragment.coords
        vals = np.asarray(out)[:, :8].view(np.float16).reshape(32, -1)
        np.testing.assert_array_equal(vals, x[coords[..., 0], coords[..., 1]])


@pytest.mark.parametrize("p", [-64, -1, 2048, 4000])
def test_traced_out_of_range_store_drops_and_load_reads_zero(p):
    st_d = tcemu.ptx("wmma.store.d.sync.aligned.row.m16n16k16.f32", arch="sm_90")
    ld_c = tcemu.ptx("wmma.load.c.sync.aligned.row.m16n16k16.f32", arch="sm_90")
    regs = jnp.full((32, 8), 0x3F800000, jnp.uint32)
    mem = jnp.arange(2048, dtype=jnp.int32).astype(jnp.uint8)
    out = jax.jit(lambda m, r, q: st_d(m, r, src=range(8), p=q))(mem, regs, p)
    inside = max(0, min(2048, p + 1024) - max(p, 0))
    changed = np.asarray(out) != np.asarray(mem)
    assert changed.sum() <= inside and not changed[:max(p, 0)].any()
    got = jax.jit(lambda m, q: ld_c(jnp.zeros((32, 8), jnp.uint32), m, dst=range(8), p=q))(out, p)
    if p + 1024 <= 0 or p >= 2048:
        assert not np.asarray(got).any()


@pytest.mark.parametrize("subscripts, shapes", [("ij,jk->ik", [(4, 5), (4, 3)]), ("ij,jk->iq", [(4, 5), (5, 3)]),
                                                ("ij", [(4, 5), (5, 3)]), (3, [(4, 5), (5, 3)])])
def test_einsum_bad_subscripts(subscripts, shapes):
    _run(lambda: tcemu.einsum(subscripts, *(jnp.ones(s) for s in shapes)), ["subscripts"])


@pytest.mark.parametrize("spelling,words", [("tcgen05.mma.cta_group::1.kind::f16", ["value level"]),
                                            ("ldmatrix.sync.aligned.m16n16.x1.trans.shared.b8", ["register"])])
def test_instructions_without_register_level_raise_value_error(spelling, words):
    _run(lambda: tcemu.ptx(spelling, arch="sm_100"), words)


@pytest.mark.parametrize("dtype", ["float99", 3.5, object()])
def test_dot_general_bad_preferred_element_type(dtype):
    _run(lambda: tcemu.dot_general(jnp.ones((2, 3)), jnp.ones((3, 2)), (((1,), (0,)), ((), ())),
                                   preferred_element_type=dtype), ["preferred_element_type"])


# ---------------------------------------------------------------------------------------------
# block_quantize / dequantize and the block-scaled GEMMs: the exact recipes of
# tests/test_quant_blocks.py (Fractions, ml_dtypes) are the truth

from test_quant_blocks import assert_same_bits, ref_dequantize, reference  # noqa: E402

BQ_SETTINGS = settings(SETTINGS, max_examples=40)
BQ_FORMS = [("e4m3", "ue8m0"), ("e5m2", "ue8m0"), ("e3m2", "ue8m0"), ("e2m3", "ue8m0"), ("e2m1", "ue8m0"),
            ("e2m1", "ue4m3")]
BQ_DTYPES = [np.float32, np.float16, ml_dtypes.bfloat16, np.float64, np.int32]
BQ_BAD = {"etype": ["e8m0", "f16", "E4M3", None, 4], "stype": ["e8m0", "UE8M0", None, 1],
          "block": [0, -16, 2.5, "16", True, None, 5, 7, np.int64(3)],
          "x": ["text", None, "complex", "scalar", "ragged", "object"]}


def _bad_x(v, x):
    return {"complex": x.astype(np.complex64), "scalar": np.float32(1.0), "ragged": [[1.0], [1.0, 2.0]],
            "object": object()}.get(v, v)


def _block_ok(block, K):
    return (isinstance(block, (int, np.integer)) and not isinstance(block, bool) and block >= 1
            and K % block == 0)


@BQ_SETTINGS
@given(st.data())
def test_block_quantize(data):
    """Random shapes (empty, K not a multiple of the block), input dtypes, formats, values
    (subnormals, infinities, NaN) and one bad argument at a time: the exact recipe's fields and
    dequantised values bit for bit, or tcemu's error naming the argument."""
    etype, stype = data.draw(st.sampled_from(BQ_FORMS))
    block = data.draw(st.sampled_from([16, 32, 4]))
    lead = data.draw(st.sampled_from([(3,), (2, 2), (1,), (), (0,)]))  # (hypothesis favours the first)
    K = data.draw(st.sampled_from([2 * block, block, block + 3, 0]))
    dt = data.draw(st.sampled_from(BQ_DTYPES))
    n = int(np.prod(lead + (K,)))
    if dt == np.int32:
        vals = data.draw(st.lists(st.integers(-2 ** 31, 2 ** 31 - 1), min_size=n, max_size=n))
    else:
        vals = data.draw(st.lists(st.floats(width=32), min_size=n, max_size=n))
    with np.errstate(over="ignore"):  # float16: to infinity
        x = np.asarray(vals, np.float32 if dt != np.int32 else np.int32).reshape(lead + (K,)).astype(dt)
    args = {"x": x, "etype": etype, "stype": stype, "block": block}
    bad = data.draw(st.sampled_from([None] * 3 + sorted(BQ_BAD)))
    if bad is not None:
        v = data.draw(st.sampled_from(BQ_BAD[bad]))
        args[bad] = _bad_x(v, x) if bad == "x" else v
    names = [] if bad is None else [bad]
    if bad == "block" and _block_ok(args["block"], K):
        names = []  # (5 divides K = 0)
    elif not _block_ok(block, K):
        names = [*names, "block"]  # K not a multiple of the block
    if bad == "x" and isinstance(args["x"], np.generic):
        names = ["block"]  # a scalar has no block axis
    q = _run(lambda: tcemu.block_quantize(args["x"], args["etype"], args["stype"], block=args["block"]), names)
    if q is None:
        return
    want = reference(x.astype(np.float32), etype, stype, int(args["block"]))
    for g, w in zip(q, want):
        assert_same_bits(g, w)
    assert_same_bits(q.dequantize(int(args["block"])), ref_dequantize(want[0], want[1], want[4], int(args["block"])))


DQ_BAD = {"block": [0, -1, 2.5, "16", True, None, 8, 32, 5], "scales": ["drop", "extra", "axis", "text"],
          "elements": ["scalar", "drop"], "tensor_scale": ["vector"]}


@BQ_SETTINGS
@given(st.data())
def test_dequantize(data):
    """BlockQuantized.dequantize with a wrong block, scales, elements or tensor scale: tcemu's
    ValueError/TypeError naming the field (the shapes given and expected); otherwise the exact
    f32(f32(element * scale) / tensor_scale)."""
    etype, stype = data.draw(st.sampled_from(BQ_FORMS))
    lead = data.draw(st.sampled_from([(2,), (1, 3), (0,)]))
    K = data.draw(st.sampled_from([64, 16, 0]))
    n = int(np.prod(lead + (K,)))
    x = np.asarray(data.draw(st.lists(st.floats(width=32), min_size=n, max_size=n)), np.float32).reshape(lead + (K,))
    q = tcemu.block_quantize(x, etype, stype, block=16)
    block = 16
    bad = data.draw(st.sampled_from([None] * 2 + sorted(DQ_BAD)))
    if bad == "block":
        block = data.draw(st.sampled_from(DQ_BAD["block"]))
    elif bad is not None:
        v = data.draw(st.sampled_from(DQ_BAD[bad]))
        f = getattr(q, bad)
        f = {"drop": lambda: f[..., :-1], "extra": lambda: np.concatenate([f, f[..., :1]], -1), "axis": lambda: f[None],
             "text": lambda: "text", "scalar": lambda: f.ravel()[:1].reshape(()) if f.size else np.float32(0),
             "vector": lambda: np.ones(2, np.float32)}[v]()
        q = q._replace(**{bad: f})
    e, s, t = (np.shape(getattr(q, n)) if not isinstance(getattr(q, n), str) else None for n in
               ("elements", "scales", "tensor_scale"))
    ok = (s is not None and len(e) >= 1 and _block_ok(block, e[-1]) and s == e[:-1] + (e[-1] // block,) and t == ())
    names = [] if ok else [bad or "block"]
    out = _run(lambda: q.dequantize(block), names)
    if out is not None:
        want_e, want_s = np.asarray(q.elements), np.asarray(q.scales)
        assert_same_bits(out, ref_dequantize(want_e, want_s, np.float32(q.tensor_scale), block))


BLOCK_GEMMS = [  # spelling, scale block, A type, B type
    (f"mma.sync.aligned.m16n8k{k}.row.col.kind::{kind}.block_scale.scale_vec::{v}.f32.{at}.{bt}.f32.{st_}", blk, at, bt)
    for k, kind, v, at, bt, st_, blk in [(32, "mxf8f6f4", "1X", "e4m3", "e4m3", "ue8m0", 32),
                                         (32, "mxf8f6f4", "1X", "e2m1", "e3m2", "ue8m0", 32),
                                         (64, "mxf4", "2X", "e2m1", "e2m1", "ue8m0", 32),
                                         (64, "mxf4nvf4", "4X", "e2m1", "e2m1", "ue4m3", 16)]]
BLOCK_GEMM_BAD = {"K": ["+8"], "a": ["complex"], "b": ["text"], "quantize": ["stochastic"]}


def _nvfp4_exact(x, blk):
    """Small integers with each block's first element 3 (every block's amax the tensor's): NVFP4's
    block scales are all 448 and its elements 2x, exactly."""
    x = x.copy()
    x[..., ::blk] = 3
    return x


@BQ_SETTINGS
@given(st.data())
def test_block_scaled_matmul(data):
    """matmul with MX / NVFP4 instructions on random small integers (exact through the recipes)
    with empty and bad shapes: a @ b exactly (NVFP4: times the rounded products of the encode
    scales' reciprocals, as its epilogue applies them), or tcemu's error naming the argument."""
    sp, blk, at, bt = data.draw(st.sampled_from(BLOCK_GEMMS))
    M = data.draw(st.sampled_from([5, 17, 1, 0]))
    N = data.draw(st.sampled_from([9, 2, 0]))
    K = data.draw(st.sampled_from([2 * blk, 96, blk, 0]))
    bad = data.draw(st.sampled_from([None] * 3 + sorted(BLOCK_GEMM_BAD)))
    Ka = K + 8 if bad == "K" else K
    a, b = _ints(data.draw, (M, Ka)), _ints(data.draw, (Ka, N))
    nv = "ue4m3" in sp
    if nv and Ka:
        a, b = _nvfp4_exact(a, blk), _nvfp4_exact(b.T, blk).T
    A, B = jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32)
    kw = {"arch": "RTX5090", "instruction": sp}
    if bad == "a":
        A = A.astype(jnp.complex64)
    elif bad == "b":
        B = "text"
    elif bad == "quantize":
        kw["quantize"] = "stochastic"
    names = [] if bad is None else [bad]
    if bad == "K" and (M == 0 or N == 0):
        names = []  # an empty result needs no GEMM
    out = _run(lambda: tcemu.matmul(A, B, **kw), names)
    if out is None:
        return
    assert out.shape == (M, N) and out.dtype == jnp.float32
    want = (a @ b).astype(np.float32)
    if nv and M and N and Ka:
        ta, tb = (reference(x.astype(np.float32), "e2m1", "ue4m3", blk)[4] for x in (a, b.T))
        alpha = (np.float32(1) / ta) * (np.float32(1) / tb)
        want = (np.float32(4 * 448 ** 2) * want) * alpha  # the codes' products, then the epilogue
    np.testing.assert_array_equal(np.asarray(out).view(np.uint32), want.view(np.uint32))


MMA_BLOCK_BAD = {"scale_a": ["missing", "shape", "dtype"], "scale_b": ["missing", "shape", "dtype"], "a": ["shape"]}


@settings(SETTINGS, max_examples=30)
@given(st.data())
def test_block_scaled_mma(data):
    """tcemu.mma of the block-scaled kinds on the reference recipe's codes and scale codes of
    small integers: a @ b + c exactly (the scales undo the quantisation), or tcemu's error."""
    sp, blk, at, bt = data.draw(st.sampled_from(BLOCK_GEMMS))
    m, n, k = 16, 8, int(sp.split(".m16n8k")[1].split(".")[0])
    a, b = _ints(data.draw, (m, k)), _ints(data.draw, (k, n))
    nv = "ue4m3" in sp
    if nv:
        a, b = _nvfp4_exact(a, blk), _nvfp4_exact(b.T, blk).T
    c = _ints(data.draw, (m, n), -8, 8) * (4 * 448 ** 2 if nv else 1)
    st_ = "ue4m3" if nv else "ue8m0"
    qa, qb = reference(a.astype(np.float32), at, st_, blk), reference(b.T.astype(np.float32), bt, st_, blk)
    typed = {"e4m3": ml_dtypes.float8_e4m3fn}

    def codes(q, t):
        return q[2].astype(np.uint8).view(typed[t]) if t in typed else q[2].astype(np.uint8)

    args = {"a": codes(qa, at), "b": np.ascontiguousarray(codes(qb, bt).T), "scale_a": qa[3].astype(np.uint8),
            "scale_b": np.ascontiguousarray(qb[3].T).astype(np.uint8)}
    bad = data.draw(st.sampled_from([None] * 2 + sorted(MMA_BLOCK_BAD)))
    if bad is not None:
        v = data.draw(st.sampled_from(MMA_BLOCK_BAD[bad]))
        args[bad] = {"missing": None, "shape": args[bad][..., :-1], "dtype": args[bad].astype(np.float32)}[v]
    names = [] if bad is None else [bad]
    out = _run(lambda: tcemu.mma(sp, args["a"], args["b"], jnp.asarray(c, jnp.float32), arch="RTX5090",
                                 scale_a=args["scale_a"], scale_b=args["scale_b"]), names)
    if out is not None:
        want = (4 * 448 ** 2 if nv else 1) * (a @ b) + c  # NVFP4: (2a * 448) (2b * 448) per product
        np.testing.assert_array_equal(np.asarray(out, np.float64), want)
