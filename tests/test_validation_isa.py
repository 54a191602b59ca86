"""Register-level and memory contracts under bad and edge inputs (issue 11): traced addresses outside
``mem`` read zero / are dropped (never wrap), and every bad argument of ``memory``, ``regfile``,
``put_matrix``, ``get_matrix``, ``ptx`` and the wmma/ldmatrix/stmatrix functions is a ValueError,
TypeError or IndexError raised by tcemu that names the argument.

Expected memory contents come from a NumPy model of the storage rules with exact Python-integer
addresses (``_place_bits`` / ``_fetch_bits``); expected registers of a traced access come from the
same instruction at a concrete, in-range address (checked against the H200 in other tests)."""
from __future__ import annotations

import re
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tcemu

TCEMU_SRC = str(Path(tcemu.__file__).parent)
LD_C = "wmma.load.c.sync.aligned.row.m16n16k16.f32"
ST_D = "wmma.store.d.sync.aligned.row.m16n16k16.f32"
LD_A = "wmma.load.a.sync.aligned.row.m16n16k16.f16"
LDM = "ldmatrix.sync.aligned.m8n8.x4.shared.b16"
STM = "stmatrix.sync.aligned.m8n8.x4.shared.b16"
BITS = {"f16": 16, "bf16": 16, "f32": 32, "tf32": 32, "f64": 64, "e4m3": 8, "e5m2": 8, "s8": 8, "u8": 8,
        "s32": 32, "s4": 4, "u4": 4, "b1": 1}
INT_RANGE = {"s8": (-128, 127), "u8": (0, 255), "s4": (-8, 7), "u4": (0, 15), "b1": (0, 1),
             "s32": (-2 ** 31, 2 ** 31 - 1)}
DTYPE = {"f16": np.float16, "bf16": ml_dtypes.bfloat16, "f32": np.float32, "tf32": np.float32,
         "f64": np.float64, "e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2, "s8": np.int8,
         "u8": np.uint8, "s32": np.int32, "s4": np.int8, "u4": np.uint8, "b1": np.uint8}


# ---------------------------------------------------------------------------------------------
# NumPy model: element (r, c) at bit p * 8 + (lead * stride + inner) * bits, little-endian


def _element_bits(x, etype):
    """Python ints: the bit pattern of every element of ``x`` as stored for ``etype``."""
    x = np.asarray(x)
    bits = BITS[etype]
    if etype in INT_RANGE:
        return [[int(v) & ((1 << bits) - 1) for v in row] for row in x.astype(np.int64)]
    return x.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[x.dtype.itemsize]).astype(object).tolist()


def _positions(rows, cols, p, layout, stride, bits):
    for r in range(rows):
        for c in range(cols):
            lead, inner = (r, c) if layout == "row" else (c, r)
            yield r, c, 8 * p + (lead * stride + inner) * bits


def _place_bits(mem, x, etype, p, layout, stride):
    """``mem`` after storing ``x``; bits outside ``mem`` are dropped."""
    bits = BITS[etype]
    flat = np.unpackbits(np.asarray(mem), bitorder="little")
    vals = _element_bits(x, etype)
    for r, c, at in _positions(*np.shape(x), p, layout, stride, bits):
        for t in range(bits):
            if 0 <= at + t < flat.size:
                flat[at + t] = (vals[r][c] >> t) & 1
    return np.packbits(flat, bitorder="little")


def _fetch_bits(mem, shape, etype, p, layout, stride):
    """Element bit patterns (Python ints) read from ``mem``; bits outside read as zero."""
    bits = BITS[etype]
    flat = np.unpackbits(np.asarray(mem), bitorder="little")
    out = [[0] * shape[1] for _ in range(shape[0])]
    for r, c, at in _positions(*shape, p, layout, stride, bits):
        out[r][c] = sum(int(flat[at + t]) << t for t in range(bits) if 0 <= at + t < flat.size)
    return out


def _got_bits(y, etype):
    y = np.asarray(y)
    if etype in INT_RANGE:
        return (y.astype(np.int64) & ((1 << BITS[etype]) - 1)).tolist()
    return y.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[y.dtype.itemsize]).astype(object).tolist()


def _random_mem(n, seed=0):
    return jnp.asarray(np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8))


# ---------------------------------------------------------------------------------------------
# traced addresses: outside bytes read zero / are dropped, never wrap

# (8, 16) f16 row-major (256 bytes, rows of 32 bytes) in a 512-byte memory
TRACED_P = [-4096, -64, -1, 0, 384, 500, 512, 2 ** 31 - 16, -2 ** 31]


@pytest.mark.parametrize("layout", ["row", "col"])
@pytest.mark.parametrize("p", TRACED_P)
def test_traced_put_get_outside_bytes_dropped_and_zero(p, layout):
    rng = np.random.default_rng(abs(p) % 1000)
    x = rng.standard_normal((8, 16)).astype(np.float16)
    mem = _random_mem(512)
    stride = 16 if layout == "row" else 8
    out = jax.jit(lambda p: tcemu.put_matrix(mem, x, p=p, layout=layout))(jnp.int32(p))
    np.testing.assert_array_equal(np.asarray(out), _place_bits(mem, x, "f16", p, layout, stride))
    got = jax.jit(lambda p: tcemu.get_matrix(mem, (8, 16), "f16", p=p, layout=layout))(jnp.int32(p))
    assert _got_bits(got, "f16") == _fetch_bits(mem, (8, 16), "f16", p, layout, stride)


@pytest.mark.parametrize("p,stride", [(0, 16), (64, 40), (0, 2 ** 28), (-2 ** 30, 2 ** 26), (480, -32),
                                      (-64, 2 ** 31 - 1), (0, -2 ** 31)])
@pytest.mark.parametrize("etype", ["f16", "s4", "b1"])
def test_traced_stride_is_used_as_given(p, stride, etype):
    """A traced stride is not checked: every element lands where p + offset says, exactly, and
    what falls outside mem is dropped (a negative stride steps backwards)."""
    rng = np.random.default_rng(stride % 997)
    lo, hi = INT_RANGE.get(etype, (0, 0))
    x = (rng.integers(lo, hi + 1, (4, 16)).astype(DTYPE[etype]) if etype in INT_RANGE
         else rng.standard_normal((4, 16)).astype(np.float16))
    mem = _random_mem(512, 1)
    out = jax.jit(lambda p, s: tcemu.put_matrix(mem, x, p=p, stride=s, etype=etype))(jnp.int32(p), jnp.int32(stride))
    np.testing.assert_array_equal(np.asarray(out), _place_bits(mem, x, etype, p, "row", stride))
    got = jax.jit(lambda p, s: tcemu.get_matrix(mem, (4, 16), etype, p=p, stride=s))(jnp.int32(p), jnp.int32(stride))
    assert _got_bits(got, etype) == _fetch_bits(mem, (4, 16), etype, p, "row", stride)


# 16x16 f32 row-major: 1024 bytes in a 2048-byte memory
WMMA_P = [-4096, -1024, -64, -4, 1024, 1536, 2044, 2048, 2 ** 31 - 64, -2 ** 31]


def _d_matrix(regs):
    """The D matrix the registers hold, from a concrete, in-range wmma.store.d."""
    st_ = tcemu.ptx(ST_D, arch="sm_90")
    return np.asarray(tcemu.get_matrix(st_(tcemu.memory(1024), regs, src=range(8), p=0), (16, 16), "f32"))


@pytest.mark.parametrize("p", WMMA_P)
def test_traced_wmma_store_drops_outside_bytes(p):
    st_ = tcemu.ptx(ST_D, arch="sm_90")
    regs = jnp.asarray(np.random.default_rng(2).integers(0, 2 ** 32, (32, 8), dtype=np.uint32))
    mem = _random_mem(2048, 3)
    out = jax.jit(lambda p: st_(mem, regs, src=range(8), p=p))(jnp.int32(p))
    np.testing.assert_array_equal(np.asarray(out), _place_bits(mem, _d_matrix(regs), "f32", p, "row", 16))


@pytest.mark.parametrize("p", WMMA_P)
def test_traced_wmma_load_reads_zero_outside(p):
    ld = tcemu.ptx(LD_C, arch="sm_90")
    mem = _random_mem(2048, 4)
    got = jax.jit(lambda p: ld(tcemu.regfile(8), mem, dst=range(8), p=p))(jnp.int32(p))
    seen = np.array(_fetch_bits(mem, (16, 16), "f32", p, "row", 16), np.uint32).view(np.float32)
    want = ld(tcemu.regfile(8), tcemu.put_matrix(tcemu.memory(1024), seen, p=0), dst=range(8), p=0)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_vmapped_wmma_store_with_negative_addresses():
    """regs (W, 32, n) and p (W,) under jax.vmap: each warp sees (32, n) and its own traced p."""
    st_ = tcemu.ptx(ST_D, arch="sm_90")
    regs = jnp.asarray(np.random.default_rng(5).integers(0, 2 ** 32, (4, 32, 8), dtype=np.uint32))
    ps = [-1024, -64, 512, 1536]
    mem = _random_mem(2048, 6)
    out = jax.jit(jax.vmap(lambda r, p: st_(mem, r, src=range(8), p=p)))(regs, jnp.asarray(ps, jnp.int32))
    for w, p in enumerate(ps):
        np.testing.assert_array_equal(np.asarray(out[w]), _place_bits(mem, _d_matrix(regs[w]), "f32", p, "row", 16))


def test_traced_int64_addresses_with_x64():
    """With jax_enable_x64 a traced p may be int64: addresses beyond 32 bits are outside mem."""
    st_ = tcemu.ptx(ST_D, arch="sm_90")
    regs = jnp.ones((32, 8), jnp.uint32)
    mem = _random_mem(2048, 7)
    with jax.enable_x64(True):
        for p in (2 ** 32, -2 ** 32, 2 ** 32 - 64, 2 ** 40):
            out = jax.jit(lambda p: st_(mem, regs, src=range(8), p=p))(jnp.int64(p))
            np.testing.assert_array_equal(np.asarray(out), np.asarray(mem))
        out = jax.jit(lambda p: st_(mem, regs, src=range(8), p=p))(jnp.int64(-64))
    np.testing.assert_array_equal(np.asarray(out), _place_bits(mem, _d_matrix(regs), "f32", -64, "row", 16))


LANE_ADDRS = [-16, -8, -2 ** 31, 2 ** 31 - 16, 1016, 1024, 4096, 40]  # memory of 1024 bytes


def _traced_addrs(seed):
    """Lane addresses: in range, below 0, past the end, partly outside, misaligned; no two rows
    overlap (overlapping stmatrix rows are undefined)."""
    rng = np.random.default_rng(seed)
    addrs = rng.permutation(np.arange(64, 1008, 16))[:32]
    addrs[rng.permutation(32)[:len(LANE_ADDRS)]] = LANE_ADDRS
    return addrs.astype(np.int64)


def _row_bytes(mem, a):
    m = np.asarray(mem)
    return np.array([m[a + j] if 0 <= a + j < m.size else 0 for j in range(16)], np.uint8)


@pytest.mark.parametrize("seed", [0, 1])
def test_traced_ldmatrix_reads_zero_outside(seed):
    ld = tcemu.ptx(LDM, arch="sm_90")
    addrs = _traced_addrs(seed)
    mem = _random_mem(1024, seed)
    got = jax.jit(lambda a: ld(tcemu.regfile(4), mem, dst=range(4), addrs=a))(jnp.asarray(addrs, jnp.int32))
    rows = jnp.asarray(np.concatenate([_row_bytes(mem, int(a)) for a in addrs]))
    want = ld(tcemu.regfile(4), rows, dst=range(4), addrs=np.arange(32) * 16)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


@pytest.mark.parametrize("seed", [0, 1])
def test_traced_stmatrix_drops_outside_bytes(seed):
    st_ = tcemu.ptx(STM, arch="sm_90")
    addrs = _traced_addrs(seed)
    regs = jnp.asarray(np.random.default_rng(seed).integers(0, 2 ** 32, (32, 4), dtype=np.uint32))
    mem = _random_mem(1024, seed + 10)
    got = jax.jit(lambda a: st_(mem, regs, src=range(4), addrs=a))(jnp.asarray(addrs, jnp.int32))
    rows = np.asarray(st_(tcemu.memory(512), regs, src=range(4), addrs=np.arange(32) * 16)).reshape(32, 16)
    want = np.asarray(mem).copy()
    for lane, a in enumerate(addrs):
        for j in range(16):
            if 0 <= a + j < want.size:
                want[a + j] = rows[lane, j]
    np.testing.assert_array_equal(np.asarray(got), want)


# ---------------------------------------------------------------------------------------------
# concrete out-of-range addresses raise IndexError


def test_concrete_negative_addresses_raise_index_error():
    ld, st_ = tcemu.ptx(LD_C, arch="sm_90"), tcemu.ptx(ST_D, arch="sm_90")
    mem, regs = tcemu.memory(2048), tcemu.regfile(8)
    with pytest.raises(IndexError, match="p=-64"):
        ld(regs, mem, dst=range(8), p=-64)
    with pytest.raises(IndexError, match="p=-64"):
        st_(mem, regs, src=range(8), p=-64)
    with pytest.raises(IndexError, match="p=-64"):  # also with a traced stride
        jax.jit(lambda s: st_(mem, regs, src=range(8), p=-64, stride=s))(jnp.int32(16))
    with pytest.raises(IndexError, match="p=-2"):
        tcemu.put_matrix(mem, np.ones((2, 2), np.float16), p=-2)
    with pytest.raises(IndexError, match="p=-2"):
        tcemu.get_matrix(mem, (2, 2), "f16", p=-2)
    with pytest.raises(IndexError, match="p=2047"):
        tcemu.get_matrix(mem, (2, 2), "f16", p=2047)
    for f, args in ((tcemu.ptx(LDM, arch="sm_90"), "dst"), (tcemu.ptx(STM, arch="sm_90"), "src")):
        addrs = np.where(np.arange(32) == 5, -16, np.arange(32) * 16)
        with pytest.raises(IndexError, match=r"addrs\[5\]=-16"):
            if args == "dst":
                f(tcemu.regfile(4), mem, dst=range(4), addrs=addrs)
            else:
                f(mem, tcemu.regfile(4), src=range(4), addrs=addrs)


# ---------------------------------------------------------------------------------------------
# put_matrix / get_matrix arguments


@pytest.mark.parametrize("dtype,etype", [(np.float32, "f16"), (np.float16, "f32"), (np.float32, "bf16"),
                                         (np.float64, "f32"), (np.int32, "f16"), (np.float32, "e4m3"),
                                         (ml_dtypes.bfloat16, "f16"), (np.float16, "s8"), (np.float32, "b1")])
def test_put_matrix_data_dtype_must_match_etype(dtype, etype):
    with pytest.raises(TypeError, match=f"dtype {np.dtype(dtype).name}.*{etype}"):
        tcemu.put_matrix(tcemu.memory(64), np.ones((2, 2), dtype), etype=etype)


@pytest.mark.parametrize("etype,bad", [("s4", 8), ("s4", -9), ("u4", 16), ("u4", -1), ("b1", 2), ("u8", 256),
                                       ("u8", -1), ("s8", 128)])
def test_put_matrix_integer_values_must_fit(etype, bad):
    x = np.zeros((2, 8), np.int32)
    x[1, 3] = bad
    with pytest.raises(ValueError, match=f"values of x must lie in.*{etype}"):
        tcemu.put_matrix(tcemu.memory(64), x, etype=etype)


@pytest.mark.parametrize("etype", ["f16", "bf16", "f32", "tf32", "e4m3", "e5m2", "s8", "u8", "s32", "s4", "u4",
                                   "b1"])
@pytest.mark.parametrize("layout", ["row", "col"])
def test_put_get_roundtrip_matches_model(etype, layout):
    rng = np.random.default_rng(BITS[etype])
    if etype in INT_RANGE:
        lo, hi = INT_RANGE[etype]
        x = rng.integers(lo, hi + 1, (4, 8)).astype(np.int64)  # any integer dtype is accepted
    else:
        x = rng.standard_normal((4, 8)).astype(DTYPE[etype])
    stride = 8 if layout == "row" else 16
    mem = _random_mem(512, 8)
    out = tcemu.put_matrix(mem, x, p=8, layout=layout, stride=stride, etype=etype)
    np.testing.assert_array_equal(np.asarray(out), _place_bits(mem, x, etype, 8, layout, stride))
    got = tcemu.get_matrix(out, (4, 8), etype, p=8, layout=layout, stride=stride)
    assert _got_bits(got, etype) == _element_bits(x, etype)


def test_put_matrix_infers_fp8_and_accepts_bool_b1():
    x = np.array([[0.5, -3.0]], ml_dtypes.float8_e4m3fn)
    got = tcemu.get_matrix(tcemu.put_matrix(tcemu.memory(8), x), (1, 2), "e4m3")
    np.testing.assert_array_equal(np.asarray(got).view(np.uint8), x.view(np.uint8))
    b = np.array([[True, False, True, True, False, False, False, True]])
    out = tcemu.put_matrix(tcemu.memory(2), b, etype="b1")
    assert np.asarray(out).tolist() == [0b10001101, 0]


@pytest.mark.parametrize("fn", ["put", "get"])
@pytest.mark.parametrize("layout,exc", [("rows", ValueError), ("ROW", ValueError), ("", ValueError),
                                        ("r", ValueError), (None, TypeError), (0, TypeError)])
def test_layouts_are_row_or_col(fn, layout, exc):
    mem = tcemu.memory(64)
    with pytest.raises(exc, match="layout must be 'row' or 'col'"):
        if fn == "put":
            tcemu.put_matrix(mem, np.ones((2, 2), np.float16), layout=layout)
        else:
            tcemu.get_matrix(mem, (2, 2), "f16", layout=layout)


@pytest.mark.parametrize("fn", ["put", "get"])
@pytest.mark.parametrize("layout,stride,minimum", [("row", 3, 4), ("row", 0, 4), ("row", -4, 4), ("col", 1, 2)])
def test_stride_shorter_than_a_row_is_rejected(fn, layout, stride, minimum):
    mem = tcemu.memory(256)
    with pytest.raises(ValueError, match=f"stride={stride} .*minimum stride is {minimum}"):
        if fn == "put":
            tcemu.put_matrix(mem, np.ones((2, 4), np.float16), layout=layout, stride=stride)
        else:
            tcemu.get_matrix(mem, (2, 4), "f16", layout=layout, stride=stride)


@pytest.mark.parametrize("name,value", [("p", 0.5), ("p", 2.0), ("p", True), ("p", "0"), ("p", None),
                                        ("p", np.float32(0)), ("p", np.zeros(2, np.int32)), ("stride", 4.5),
                                        ("stride", np.bool_(True)), ("stride", "8")])
def test_put_get_integer_arguments(name, value):
    kw = {name: value}
    with pytest.raises(TypeError, match=f"{name} must be"):
        tcemu.put_matrix(tcemu.memory(64), np.ones((2, 4), np.float16), **kw)
    with pytest.raises(TypeError, match=f"{name} must be"):
        tcemu.get_matrix(tcemu.memory(64), (2, 4), "f16", **kw)


def test_put_get_numpy_and_traced_integers_are_accepted():
    x = np.arange(8, dtype=np.float16).reshape(2, 4)
    mem = tcemu.put_matrix(tcemu.memory(64), x, p=np.int64(16), stride=np.uint8(4))
    np.testing.assert_array_equal(np.asarray(tcemu.get_matrix(mem, (2, 4), "f16", p=jnp.int32(16))), x)
    got = jax.jit(lambda p, s: tcemu.get_matrix(mem, (2, 4), "f16", p=p, stride=s))(jnp.uint32(16), jnp.int16(4))
    np.testing.assert_array_equal(np.asarray(got), x)
    with pytest.raises(TypeError, match="p must be an integer, got an array of dtype float32"):
        jax.jit(lambda p: tcemu.get_matrix(mem, (2, 4), "f16", p=p))(jnp.float32(16))


@pytest.mark.parametrize("shape,exc,message", [((2, 2, 2), ValueError, "shape must be"), ((2.0, 2), TypeError, "shape"),
                                               ((0, 2), ValueError, "positive"), (4, ValueError, "shape must be"),
                                               ((-1, 2), ValueError, "positive")])
def test_get_matrix_shape(shape, exc, message):
    with pytest.raises(exc, match=message):
        tcemu.get_matrix(tcemu.memory(64), shape, "f16")


@pytest.mark.parametrize("etype,exc", [("F16", ValueError), ("f16 ", ValueError), ("fp16", ValueError),
                                       (None, TypeError), (np.float16, TypeError)])
def test_etype_must_be_a_known_name(etype, exc):
    with pytest.raises(exc, match="etype"):
        tcemu.get_matrix(tcemu.memory(64), (2, 2), etype)
    if etype is not None:  # put_matrix infers it from x.dtype
        with pytest.raises(exc, match="etype"):
            tcemu.put_matrix(tcemu.memory(64), np.ones((2, 2), np.float16), etype=etype)


@pytest.mark.parametrize("x,exc,message", [
    (np.ones(4, np.float16), ValueError, "2-D"), (np.ones((0, 4), np.float16), ValueError, "non-empty"),
    (np.ones((2, 2), np.int64), TypeError, "cannot infer"), (np.ones((2, 2), np.complex64), TypeError, "cannot infer"),
])
def test_put_matrix_x(x, exc, message):
    with pytest.raises(exc, match=message):
        tcemu.put_matrix(tcemu.memory(64), x)


@pytest.mark.parametrize("mem,exc", [(np.zeros(64, np.int32), TypeError), (jnp.zeros((2, 64), jnp.uint8), ValueError),
                                     (jnp.zeros(0, jnp.uint8), ValueError), ([0] * 64, TypeError)])
def test_mem_must_be_1d_uint8(mem, exc):
    with pytest.raises(exc, match="mem must"):
        tcemu.put_matrix(mem, np.ones((2, 2), np.float16))
    with pytest.raises(exc, match="mem must"):
        tcemu.get_matrix(mem, (2, 2), "f16")
    with pytest.raises(exc, match="mem must"):
        tcemu.ptx(LD_A, arch="sm_90")(tcemu.regfile(8), mem, dst=range(8), p=0)


def test_f64_needs_x64():
    x = np.array([[1.0 + 2.0 ** -40, -3.5]])
    with jax.enable_x64(False):
        with pytest.raises(ValueError, match="jax_enable_x64"):
            tcemu.put_matrix(tcemu.memory(64), x)
        with pytest.raises(ValueError, match="jax_enable_x64"):
            tcemu.get_matrix(tcemu.memory(64), (1, 2), "f64")
    with jax.enable_x64(True):
        mem = tcemu.put_matrix(tcemu.memory(64), x, p=8)
        got = np.asarray(tcemu.get_matrix(mem, (1, 2), "f64", p=8))
    np.testing.assert_array_equal(np.asarray(mem)[8:24], x.view(np.uint8).ravel())
    np.testing.assert_array_equal(got, x)


def test_register_level_f64_mma_needs_x64():
    mma = tcemu.ptx("wmma.mma.sync.aligned.row.col.m8n8k4.f64.f64.f64.f64", arch="sm_90")
    with jax.enable_x64(False), pytest.raises(ValueError, match="jax_enable_x64"):
        mma(tcemu.regfile(12), d=range(4), a=range(4, 6), b=range(6, 8), c=range(8, 12))


@pytest.mark.parametrize("nbytes,exc", [(-5, ValueError), (0, ValueError), (2 ** 31, ValueError), (2.5, TypeError),
                                        ("8", TypeError), (True, TypeError), (None, TypeError)])
def test_memory_nbytes(nbytes, exc):
    with pytest.raises(exc, match="nbytes"):
        tcemu.memory(nbytes)


@pytest.mark.parametrize("nregs,exc", [(2.7, TypeError), ("8", TypeError), (True, TypeError), (8.0, TypeError),
                                       (0, ValueError), (-1, ValueError), (None, TypeError)])
def test_regfile_nregs(nregs, exc):
    with pytest.raises(exc, match="nregs"):
        tcemu.regfile(nregs)


def test_memory_and_regfile_take_numpy_integers():
    assert tcemu.memory(np.int32(16)).shape == (16,)
    assert tcemu.regfile(np.uint8(3)).shape == (32, 3)


# ---------------------------------------------------------------------------------------------
# instruction arguments


@pytest.mark.parametrize("dst,exc,message", [
    ([0.0, 1, 2, 3, 4, 5, 6, 7], TypeError, "integer register indices"),
    ([0, 1, 2, 3, 4, 5, 6, 7.5], TypeError, "integer register indices"),
    ([0, 1, 2, 3, 4, 5, 6, True], TypeError, "integer register indices"),
    ("01234567", TypeError, "sequence of integer"), (3, TypeError, "sequence of integer"),
    (None, TypeError, "sequence of integer"), ([0, 1, 2, 3, 4, 5, 6, -1], ValueError, r"\[-1\] out of range"),
    ([0, 1, 2, 3, 4, 5, 6, 10], ValueError, r"\[10\] out of range 0..9"),
    ([0, 1, 2, 3, 4, 5, 6, 6], ValueError, "twice"), (range(9), ValueError, "needs 8 registers"),
])
def test_register_indices(dst, exc, message):
    ld = tcemu.ptx(LD_A, arch="sm_90")
    with pytest.raises(exc, match="dst=.*" + message):
        ld(tcemu.regfile(10), tcemu.memory(1024), dst=dst, p=0)


def test_register_indices_accept_numpy_integers_but_not_traced():
    ld = tcemu.ptx(LD_A, arch="sm_90")
    mem = _random_mem(1024, 9)
    want = ld(tcemu.regfile(8), mem, dst=range(8), p=0)
    np.testing.assert_array_equal(np.asarray(ld(tcemu.regfile(8), mem, dst=np.arange(8), p=0)), np.asarray(want))
    with pytest.raises(TypeError, match="dst= must hold concrete integer"):
        jax.jit(lambda d: ld(tcemu.regfile(8), mem, dst=[d] + list(range(1, 8)), p=0))(jnp.int32(0))


@pytest.mark.parametrize("regs,exc,message", [
    (jnp.zeros((32, 8), jnp.float32), TypeError, "uint32"), (jnp.zeros((32, 8), jnp.int32), TypeError, "uint32"),
    (jnp.zeros((16, 8), jnp.uint32), ValueError, r"shape \(32, nregs\)"),
    (jnp.zeros((32, 0), jnp.uint32), ValueError, r"shape \(32, nregs\)"),
    (jnp.zeros((256,), jnp.uint32), ValueError, r"shape \(32, nregs\)"),
    ([[0] * 8] * 32, TypeError, "regs must be"), ("regs", TypeError, "regs must be"),
])
def test_regs_must_be_a_warp_register_file(regs, exc, message):
    mma = tcemu.ptx("wmma.mma.sync.aligned.row.col.m16n16k16.f32.f32", arch="sm_90")
    with pytest.raises(exc, match=message):
        tcemu.ptx(LD_A, arch="sm_90")(regs, tcemu.memory(1024), dst=range(8), p=0)
    with pytest.raises(exc, match=message):
        tcemu.ptx(ST_D, arch="sm_90")(tcemu.memory(1024), regs, src=range(8), p=0)
    with pytest.raises(exc, match=message):
        mma(regs, d=range(8), a=range(8), b=range(8), c=range(8))


@pytest.mark.parametrize("key,exc", [(5, TypeError), ("0", TypeError), (np.zeros(3, np.uint32), ValueError),
                                     (np.zeros(2, np.int32), TypeError)])
def test_register_level_mma_key(key, exc):
    mma = tcemu.ptx("wmma.mma.sync.aligned.row.col.m16n16k16.f32.f32", arch="sm_90")
    with pytest.raises(exc, match="key"):
        mma(tcemu.regfile(32), d=range(8), a=range(8, 16), b=range(16, 24), c=range(24, 32), key=key)


@pytest.mark.parametrize("name,value", [("p", 0.5), ("p", 32.0), ("p", True), ("p", "0"), ("p", None),
                                        ("stride", 16.0), ("stride", False), ("stride", np.float64(16))])
def test_wmma_p_and_stride_are_integers(name, value):
    kw = {"p": 0, name: value}
    with pytest.raises(TypeError, match=f"{name} must be"):
        tcemu.ptx(LD_A, arch="sm_90")(tcemu.regfile(8), tcemu.memory(1024), dst=range(8), **kw)
    with pytest.raises(TypeError, match=f"{name} must be"):
        tcemu.ptx(ST_D, arch="sm_90")(tcemu.memory(1024), tcemu.regfile(8), src=range(8), **kw)


def test_wmma_traced_float_address_fails_at_trace_time():
    ld = tcemu.ptx(LD_A, arch="sm_90")
    with pytest.raises(TypeError, match="p must be an integer, got an array of dtype float32"):
        jax.jit(lambda p: ld(tcemu.regfile(8), tcemu.memory(1024), dst=range(8), p=p))(jnp.float32(0))
    with pytest.raises(TypeError, match="stride must be an integer, got an array of dtype bool"):
        jax.jit(lambda s: ld(tcemu.regfile(8), tcemu.memory(1024), dst=range(8), p=0, stride=s))(jnp.bool_(True))


@pytest.mark.parametrize("addrs,exc,message", [
    (np.arange(32) * 16.0, TypeError, "integer array"), (np.zeros(32, bool), TypeError, "integer array"),
    (np.arange(16) * 16, ValueError, r"\(32,\) array"), (np.zeros((32, 1), np.int32), ValueError, r"\(32,\) array"),
    ([16.0] * 32, TypeError, "integer array"), (None, TypeError, "addrs"), ("0", TypeError, "addrs"),
])
def test_matrix_move_addrs(addrs, exc, message):
    ld, st_ = tcemu.ptx(LDM, arch="sm_90"), tcemu.ptx(STM, arch="sm_90")
    with pytest.raises(exc, match=message):
        ld(tcemu.regfile(4), tcemu.memory(1024), dst=range(4), addrs=addrs)
    with pytest.raises(exc, match=message):
        st_(tcemu.memory(1024), tcemu.regfile(4), src=range(4), addrs=addrs)


def test_matrix_move_traced_float_addrs_fail_at_trace_time():
    ld = tcemu.ptx(LDM, arch="sm_90")
    with pytest.raises(TypeError, match="integer array"):
        jax.jit(lambda a: ld(tcemu.regfile(4), tcemu.memory(1024), dst=range(4), addrs=a))(jnp.zeros(32))


# ---------------------------------------------------------------------------------------------
# spellings


@pytest.mark.parametrize("spelling", [" wmma.load.a.sync.aligned.row.m16n16k16.f16", LD_A + " ", LD_A + "\n",
                                      LD_A + " ;", "\t" + LD_A + ";"])
def test_surrounding_whitespace_is_ignored(spelling):
    assert tcemu.ptx(spelling, arch="sm_90").fragment == tcemu.ptx(LD_A, arch="sm_90").fragment


@pytest.mark.parametrize("spelling,exc,message", [
    ("wmma.load.a.sync.aligned.row.m16n16k16. f16", ValueError, "whitespace inside"),
    ("wmma.load.a.sync.aligned.row .m16n16k16.f16", ValueError, "whitespace inside"),
    ("", ValueError, "empty PTX spelling"), ("   ", ValueError, "empty PTX spelling"),
    (None, TypeError, "must be a string"), (5, TypeError, "must be a string"),
    (b"wmma.load.a.sync.aligned.row.m16n16k16.f16", TypeError, "must be a string"),
    ("wmma.load.a.sync..aligned.row.m16n16k16.f16", ValueError, "empty qualifier"),
    ("wmma.load.a.sync.aligned.row.m16n16k16.f16.", ValueError, "empty qualifier"),
    ("wmma.load.a.sync.aligned.row.m16n16k16.F16", ValueError, r"lower case: \.f16"),
    ("WMMA.LOAD.A.SYNC.ALIGNED.ROW.M16N16K16.F16", ValueError, "case-sensitive"),
    ("wmma.load", ValueError, "needs its qualifiers"),
])
def test_spelling_errors(spelling, exc, message):
    with pytest.raises(exc, match=message):
        tcemu.ptx(spelling, arch="sm_90")


@pytest.mark.parametrize("bad", ["f16\u200b", "F16", "f16x", "bf 16", "rows", "sync_"])
def test_never_suggests_the_qualifier_written(bad):
    spelling = f"wmma.load.a.sync.aligned.row.m16n16k16.{bad}"
    with pytest.raises(ValueError) as e:
        tcemu.ptx(spelling, arch="sm_90")
    m = re.search(r"did you mean ([^?]*)\?", str(e.value))
    assert m is None or "." + bad not in [s.strip() for s in m.group(1).split(",")], str(e.value)


# ---------------------------------------------------------------------------------------------
# property: random (also bad) arguments give a tcemu error naming the argument, or the right bytes

ARG_NAMES = ("p", "stride", "layout", "etype", "x", "mem", "shape")


def _assert_tcemu_error(e, names=ARG_NAMES):
    assert isinstance(e, (ValueError, TypeError, IndexError)), repr(e)
    tb = e.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    assert tb.tb_frame.f_code.co_filename.startswith(TCEMU_SRC), f"raised outside tcemu: {e!r}"
    assert any(re.search(rf"\b{n}\b", str(e)) for n in names), str(e)


_ints = st.one_of(st.integers(-300, 700), st.sampled_from([-2 ** 31, 2 ** 31 - 1, 2 ** 40]))
_bad = st.sampled_from([0.5, 16.0, True, None, "8", np.float32(4)])


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(etype=st.sampled_from(list(BITS) + ["F16", "fp16", None]),
       dtype=st.sampled_from([np.float16, np.float32, ml_dtypes.bfloat16, np.int8, np.uint8, np.int32, np.int64,
                              ml_dtypes.float8_e4m3fn]),
       shape=st.tuples(st.integers(1, 4), st.integers(1, 6)),
       p=st.one_of(_ints, _bad), stride=st.one_of(st.none(), st.integers(-3, 12), _bad),
       layout=st.sampled_from(["row", "col", "rows", None]), traced=st.booleans(), seed=st.integers(0, 99))
def test_put_get_random_arguments(etype, dtype, shape, p, stride, layout, traced, seed):
    rng = np.random.default_rng(seed)
    x = (rng.integers(-2, 2, shape) if np.issubdtype(dtype, np.integer) else rng.standard_normal(shape)).astype(dtype)
    mem = _random_mem(256, seed)
    jit_p = traced and isinstance(p, int) and not isinstance(p, bool) and -2 ** 31 <= p < 2 ** 31
    kw = {"layout": layout, **({} if stride is None else {"stride": stride})}
    put = (lambda p: tcemu.put_matrix(mem, x, p=p, etype=etype, **kw))
    get_et = etype if etype is not None else "f16"
    get = (lambda p: tcemu.get_matrix(mem, shape, get_et, p=p, **kw))
    for f, kind in ((put, "put"), (get, "get")):
        try:
            out = jax.jit(f)(jnp.int32(p)) if jit_p else f(p)
        except (ValueError, TypeError, IndexError) as e:
            _assert_tcemu_error(e)
            continue
        et = etype if kind == "put" and etype is not None else get_et
        if kind == "put" and etype is None:
            et = {np.dtype(np.float16): "f16", np.dtype(np.float32): "f32", np.dtype(ml_dtypes.bfloat16): "bf16",
                  np.dtype(np.int8): "s8", np.dtype(np.uint8): "u8", np.dtype(np.int32): "s32",
                  np.dtype(ml_dtypes.float8_e4m3fn): "e4m3"}[np.dtype(dtype)]
        lead_len = shape[1] if layout == "row" else shape[0]
        s = lead_len if stride is None else stride
        if kind == "put":
            np.testing.assert_array_equal(np.asarray(out), _place_bits(mem, x, et, p, layout, s))
        else:
            assert _got_bits(out, et) == _fetch_bits(mem, shape, et, p, layout, s)
