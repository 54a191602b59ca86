"""Same bits with ``jax_enable_x64`` on and off, on every path; f64 and narrower MMAs in one program.

Each computation runs twice, under ``jax.enable_x64(False)`` and ``jax.enable_x64(True)``, and the
results must agree bit for bit (NaN payloads and signed zeros included). The hardware-comparison
modules also run whole under x64 (tests/conftest.py), and :func:`test_no_64_bit_values_in_numerics`
checks that the numerics of every captured instruction form never touch a 64-bit value.
"""
from __future__ import annotations


import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.extend import core as jcore

import tcemu
from tcemu._src import formats as fm

from tcemu._src.isa.parse import parse
from tcemu._src.numerics import mma as mma_numerics
from conftest import capture, tcemu_env

def bits(x) -> np.ndarray:
    x = np.asarray(x)
    return x.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[x.dtype.itemsize])


def off_and_on(fn):
    """``fn()`` with x64 off and on; asserts both give the same dtype and bits, returns the first."""
    out = []
    for on in (False, True):
        with jax.enable_x64(on):
            out.append(jax.tree.map(np.asarray, fn()))
    leaves_off, leaves_on = jax.tree.leaves(out[0]), jax.tree.leaves(out[1])
    assert len(leaves_off) == len(leaves_on)
    for x, y in zip(leaves_off, leaves_on):
        assert x.dtype == y.dtype and x.shape == y.shape
        np.testing.assert_array_equal(bits(x), bits(y))
    return out[0]


def operand(rng, etype, shape):
    """Typed values of ``etype``, ``shape`` (tiles, rows, cols): scaled normals (a large exponent
    spread), the middle two tiles random bit patterns (NaN, inf, subnormals, signed zeros)."""
    dt = np.dtype(fm.VALUE_DTYPES[etype])
    nbits = 8 * np.dtype(dt).itemsize
    t = shape[0]
    vals = rng.standard_normal(shape) * 2.0 ** rng.integers(-12, 12, shape)
    x = vals.astype(np.float32).astype(dt)
    raw = rng.integers(0, 1 << nbits, shape, dtype=np.uint64).astype({8: np.uint8, 16: np.uint16, 32: np.uint32}[nbits])
    x[t // 2:t // 2 + 2] = raw[t // 2:t // 2 + 2].view(dt)
    return x


def mma_operands(spelling, seed=0, tiles=6):
    """a, b, c of ``tiles`` (>= 4) instructions; the last tile an exact cancellation with a tiny C."""
    ins = parse(spelling)
    rng = np.random.default_rng(seed)
    a = operand(rng, ins.atype, (tiles, ins.m, ins.k))
    b = operand(rng, ins.btype, (tiles, ins.k, ins.n))
    c = operand(rng, ins.ctype, (tiles, ins.m, ins.n))
    # last tile: x - x in the first two products of every row, C a tiny value of either sign
    a[-1] = 0
    b[-1] = 0
    a[-1, :, 0] = np.asarray(rng.uniform(1, 2, ins.m), np.float32).astype(a.dtype)
    a[-1, :, 1] = -a[-1, :, 0]
    b[-1, 0] = b[-1, 1] = np.float32(1.5)
    tiny = np.float32(2.0 ** -20) if ins.ctype not in ("f32", "tf32") else np.float32(2.0 ** -140)
    c[-1] = (np.sign(rng.standard_normal((ins.m, ins.n))) * tiny).astype(c.dtype)
    return a, b, c


VALUE_FORMS = [
    ("wmma.mma.sync.aligned.row.col.m16n16k16.f16.f16", "sm_90"),
    ("wmma.mma.sync.aligned.row.col.m16n16k16.f32.f32", "sm_90"),
    ("wmma.mma.sync.aligned.row.col.m16n16k16.f32.f16", "V100"),
    ("wmma.mma.sync.aligned.col.row.m32n8k16.f16.f32", "A100"),
    ("wmma.mma.sync.aligned.row.col.m16n16k16.f32.bf16.bf16.f32", "sm_90"),
    ("wmma.mma.sync.aligned.row.col.m16n16k8.f32.tf32.tf32.f32", "sm_90"),
    ("mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16", "sm_90"),
    ("mma.sync.aligned.m8n8k4.row.col.f16.f16.f16.f16", "sm_90"),
    ("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32", "A100"),
    ("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32", "B200"),
    ("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e5m2.f32", "sm_90"),
    ("mma.sync.aligned.m16n8k32.row.col.f16.e5m2.e4m3.f16", "Ada"),
    ("wgmma.mma_async.sync.aligned.m64n8k16.f16.f16.f16", "sm_90"),
    ("wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16", "sm_90"),
    ("wgmma.mma_async.sync.aligned.m64n8k8.f32.tf32.tf32", "sm_90"),
    ("wgmma.mma_async.sync.aligned.m64n8k32.f16.e4m3.e4m3", "sm_90"),
    ("wgmma.mma_async.sync.aligned.m64n8k32.f32.e5m2.e5m2", "sm_90"),
]


@pytest.mark.parametrize("sp,arch", VALUE_FORMS)
def test_value_level_same_bits(sp, arch):
    a, b, c = mma_operands(sp)
    d = off_and_on(lambda: tcemu.mma(sp, a, b, c, arch=arch))
    assert d.dtype == np.dtype(fm.VALUE_DTYPES[parse(sp).dtype])


BLACKWELL = ["sm120.f8f6f4.f16.e5m2.e2m1", "sm120.mxf8f6f4.e3m2.e4m3", "sm120.mxf4nvf4.4x.ue4m3",
             "sm100.tcgen05.mxf4.2x.ue8m0", "sm100.tcgen05.m128.f16.f16.f16"]


@pytest.mark.parametrize("fid", BLACKWELL)
def test_blackwell_same_bits_no_64_bit_values(fid):
    """MMA-Sim's vectors of the Blackwell kinds (tests/test_mmasim.py): the same bits with x64 on
    and off, and (sm_120 forms) numerics traced under x64 that hold no 64-bit value."""
    import test_mmasim

    m, (a, b, c), kw, want = test_mmasim._inputs(fid)
    d = off_and_on(lambda: tcemu.mma(m["spelling"], a, b, c, arch=m["arch"], **kw))
    np.testing.assert_array_equal(bits(d), want)
    if m["arch"] == "sm_120":
        ins = parse(m["spelling"])
        S = ins.scale_vec or 1
        shapes = ((2, ins.m, ins.k), (2, ins.k, ins.n), (2, ins.m, ins.n), (2, ins.m, S), (2, S, ins.n))
        with jax.enable_x64(True):
            j = jax.make_jaxpr(lambda a, b, c, sa, sb: mma_numerics.mma_bits_batched(
                ins, a, b, c, None, arch="sm_120", scale_a=sa if ins.scale_vec else None,
                scale_b=sb if ins.scale_vec else None))(*(jnp.zeros(s, jnp.uint32) for s in shapes))
        assert not _wide_values(j.jaxpr, [])


STOCHASTIC = tcemu.BlockFMA(fraction_bits=24, block_size=8, rounding="stochastic", f16_rounding="stochastic")


@pytest.mark.parametrize("sp", ["wmma.mma.sync.aligned.row.col.m16n16k16.f16.f16",
                                "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"])
def test_stochastic_rounding_same_bits(sp):
    a, b, c = mma_operands(sp, seed=3)
    off_and_on(lambda: tcemu.mma(sp, a, b, c, model=STOCHASTIC, key=jax.random.key(7)))


# every engine path: integer or float32 alignment, XLA reductions or unrolled term sums
# the pure-JAX engine's paths (TCEMU_NATIVE=0: on the CPU the compiled kernel would run instead)
PATHS = [{"TCEMU_ALIGN": al, "TCEMU_UNROLL": un, "TCEMU_NATIVE": "0"} for al in ("int", "float") for un in ("0", "1")]


@pytest.mark.parametrize("env", PATHS, ids=lambda e: f"align={e['TCEMU_ALIGN']}-unroll={e['TCEMU_UNROLL']}")
@pytest.mark.parametrize("sp", ["wmma.mma.sync.aligned.row.col.m16n16k16.f16.f16",
                                "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e5m2.f32",
                                "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"])
def test_engine_paths_same_bits(sp, env):
    """The numerics traced afresh under each TCEMU_ALIGN / TCEMU_UNROLL setting (no jit cache)."""
    ins = parse(sp)
    a, b, c = mma_operands(sp, seed=1, tiles=4)
    A, B, C = (fm.to_bits(x, t) for x, t in ((a, ins.atype), (b, ins.btype), (c, ins.ctype)))
    want = bits(tcemu.mma(sp, a, b, c))  # the default path
    with tcemu_env(env):
        d = off_and_on(lambda: jax.jit(lambda x, y, z: mma_numerics.mma_bits(ins, x, y, z, None))(A, B, C))
    assert np.array_equal(d, want)


def test_chunked_batches_same_bits():
    """Batches larger than one chunk (the lax.scan path of mma_bits_batched)."""
    sp = "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"
    a, b, c = mma_operands(sp, seed=2, tiles=10)
    ins = parse(sp)
    A, B, C = (fm.to_bits(x, t) for x, t in ((a, ins.atype), (b, ins.btype), (c, ins.ctype)))
    with tcemu_env({"TCEMU_CHUNK_TERMS": "4096"}):
        d = off_and_on(lambda: jax.jit(lambda x, y, z: mma_numerics.mma_bits_batched(ins, x, y, z, None))(A, B, C))
    assert np.array_equal(d, bits(tcemu.mma(sp, a, b, c)))


# ------------------------------------------------------------------------------------------
# integer MMAs

INT_FORMS = ["wmma.mma.sync.aligned.row.col.m16n16k16.s32.s8.s8.s32",
             "wmma.mma.sync.aligned.row.col.m16n16k16.s32.u8.u8.s32.satfinite",
             "mma.sync.aligned.m16n8k32.row.col.satfinite.s32.s8.u8.s32",
             "mma.sync.aligned.m16n8k64.row.col.s32.s4.u4.s32",
             "wmma.mma.sync.aligned.row.col.m8n8k32.s32.s4.s4.s32.satfinite",
             "wmma.mma.xor.popc.sync.aligned.row.col.m8n8k128.s32.b1.b1.s32",
             "mma.sync.aligned.m16n8k256.row.col.s32.b1.b1.s32.and.popc"]
_INT_VALUES = {"s8": (-128, 128, np.int8), "u8": (0, 256, np.uint8), "s4": (-8, 8, np.int8),
               "u4": (0, 16, np.uint8), "b1": (0, 2, np.uint8)}


@pytest.mark.parametrize("sp", INT_FORMS)
def test_integer_mma_same_bits_and_exact(sp):
    """Against int64 NumPy: wrap-around modulo 2**32, or clamping with .satfinite; C near both
    int32 limits."""
    ins = parse(sp)
    rng = np.random.default_rng(4)
    (alo, ahi, adt), (blo, bhi, bdt) = _INT_VALUES[ins.atype], _INT_VALUES[ins.btype]
    a = rng.integers(alo, ahi, (4, ins.m, ins.k)).astype(adt)
    b = rng.integers(blo, bhi, (4, ins.k, ins.n)).astype(bdt)
    a[0], b[0] = ahi - 1, bhi - 1  # the largest products
    a[1], b[1] = alo, bhi - 1
    c = rng.integers(-2 ** 31, 2 ** 31, (4, ins.m, ins.n)).astype(np.int32)
    c[0], c[1] = 2 ** 31 - 5, -2 ** 31 + 5
    d = off_and_on(lambda: tcemu.mma(sp, a, b, c))
    a64, b64 = a.astype(np.int64), b.astype(np.int64)
    if ins.op == "xor":
        p = (a64[..., :, None, :] ^ np.swapaxes(b64, -1, -2)[..., None, :, :]).sum(-1)
    else:  # and.popc of 0/1 values, and integer products, are both a @ b
        p = a64 @ b64
    exact = c.astype(np.int64) + p
    want = np.clip(exact, -2 ** 31, 2 ** 31 - 1) if ins.satfinite else (exact + 2 ** 31) % 2 ** 32 - 2 ** 31
    np.testing.assert_array_equal(d, want.astype(np.int32))


# ------------------------------------------------------------------------------------------
# register level, memory helpers, loads and stores


def test_wmma_register_level_through_memory_same_bits():
    """put_matrix -> wmma.load (concrete and traced p) -> wmma.mma -> wmma.store -> get_matrix:
    the same memory bytes with x64 on and off, and D equal to the value level."""
    sp = "wmma.mma.sync.aligned.row.col.m16n16k16.f16.f16"
    a, b, c = (x[0] for x in mma_operands(sp, seed=5))

    def run():
        mem = tcemu.memory(4096)
        mem = tcemu.put_matrix(mem, a, p=0)
        mem = tcemu.put_matrix(mem, b, p=1024, layout="col")
        mem = tcemu.put_matrix(mem, c, p=2048)
        ld = lambda m, l: tcemu.ptx(f"wmma.load.{m}.sync.aligned.{l}.m16n16k16.f16", arch="sm_90")  # noqa: E731
        regs = tcemu.regfile(32)
        regs = ld("a", "row")(regs, mem, dst=range(8), p=0)
        regs = jax.jit(lambda r, m, p: ld("b", "col")(r, m, dst=range(8, 16), p=p))(regs, mem, 1024)
        regs = ld("c", "row")(regs, mem, dst=range(16, 20), p=2048)
        regs = tcemu.ptx(sp, arch="sm_90")(regs, a=range(8), b=range(8, 16), c=range(16, 20), d=range(20, 24))
        st = tcemu.ptx("wmma.store.d.sync.aligned.row.m16n16k16.f16", arch="sm_90")
        mem = st(mem, regs, src=range(20, 24), p=3072)
        mem = jax.jit(lambda m, r, p: st(m, r, src=range(20, 24), p=p))(mem, regs, 3584)
        return regs, mem, tcemu.get_matrix(mem, (16, 16), "f16", p=3072), tcemu.get_matrix(mem, (16, 16), "f16", p=3584)

    regs, mem, d1, d2 = off_and_on(run)
    want = bits(tcemu.mma(sp, a, b, c))
    np.testing.assert_array_equal(bits(d1), want)
    np.testing.assert_array_equal(bits(d2), want)


def test_mma_sync_register_level_same_bits():
    """Random register words (any bit patterns) through an mma.sync fp8 form."""
    sp = "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32"
    f = tcemu.ptx(sp, arch="sm_90")
    na, nb, nc = f.fa.nregs, f.fb.nregs, f.fc.nregs
    n = na + nb + 2 * nc
    regs = np.random.default_rng(6).integers(0, 1 << 32, (8, 32, n), dtype=np.uint64).astype(np.uint32)

    def run():
        def one(r):
            return f(r, a=range(na), b=range(na, na + nb), c=range(na + nb, na + nb + nc), d=range(n - nc, n))

        return jax.jit(jax.vmap(one))(regs)

    off_and_on(run)


_MEM_TYPES = [("f16", np.float16), ("bf16", ml_dtypes.bfloat16), ("tf32", np.float32), ("e4m3", ml_dtypes.float8_e4m3fn),
              ("s8", np.int8), ("u4", np.uint8), ("s4", np.int8), ("b1", np.uint8), ("s32", np.int32)]


@pytest.mark.parametrize("etype,dtype,layout", [(e, d, ("row", "col")[(i + j) % 2]) for i, (e, d) in enumerate(_MEM_TYPES)
                                                for j in range(2 if e in ("f16", "s4", "b1") else 1)])
def test_memory_helpers_same_bytes(etype, dtype, layout):
    """Every element type, each in one layout (both for f16, s4 and b1; CI time)."""
    rng = np.random.default_rng(8)
    if etype in ("u4", "s4", "b1"):
        lo, hi, _ = _INT_VALUES[etype]
        x = rng.integers(lo, hi, (6, 10)).astype(dtype)
    else:
        x = rng.integers(0, 1 << 32, (6, 10), dtype=np.uint64).astype(np.uint32).view(np.uint8)
        x = x.view(dtype)[:, :10] if np.dtype(dtype).itemsize < 4 else x.view(dtype)
    kw = {"etype": etype} if etype in ("tf32", "u4", "s4", "b1") else {}

    def run():
        mem = tcemu.put_matrix(tcemu.memory(1024), x, p=32, layout=layout, **kw)
        mem = jax.jit(lambda m, p: tcemu.put_matrix(m, x, p=p, layout=layout, **kw))(mem, 512)
        return mem, tcemu.get_matrix(mem, x.shape, etype, p=32, layout=layout)

    mem, back = off_and_on(run)
    np.testing.assert_array_equal(bits(back), bits(x))


def test_ldmatrix_stmatrix_same_bits():
    ld = tcemu.ptx("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16", arch="sm_90")
    st = tcemu.ptx("stmatrix.sync.aligned.m8n8.x4.shared.b16", arch="sm_90")
    mem0 = np.random.default_rng(9).integers(0, 256, 1024).astype(np.uint8)
    addrs = np.arange(32, dtype=np.int32) * 16

    def run():
        regs = ld(tcemu.regfile(4), jnp.asarray(mem0), dst=range(4), addrs=addrs)
        mem = jax.jit(lambda m, r, ad: st(m, r, src=range(4), addrs=ad))(jnp.zeros(1024, jnp.uint8), regs, addrs + 512)
        return regs, mem

    off_and_on(run)


# ------------------------------------------------------------------------------------------
# GEMMs and studies


@pytest.mark.parametrize("ins,k_order", [("m16n8k16.f32.bf16.bf16.f32", "split_k"), ("m16n8k32.f32.e4m3.e4m3.f32", "promotion"),
                                         ("m16n8k16.f16.f16.f16.f16", "sequential"), ("m16n8k16.f16.f16.f16.f16", "pairwise")])
def test_matmul_same_bits(ins, k_order):
    rng = np.random.default_rng(10)
    a = (rng.standard_normal((20, 96)) * 2.0 ** rng.integers(-8, 8, (20, 96))).astype(np.float32)
    b = rng.standard_normal((96, 12)).astype(np.float32)
    b[3, 4] = np.inf
    cfg = tcemu.GemmConfig(arch="H100", instruction=ins, k_order=k_order, split_k=2, promotion_interval=32)
    off_and_on(lambda: tcemu.matmul(a, b, config=cfg))


def test_matmul_stochastic_dot_general_and_grad_same_bits():
    rng = np.random.default_rng(11)
    a, b = rng.standard_normal((2, 8, 40)).astype(np.float32), rng.standard_normal((40, 8)).astype(np.float32)
    cfg = tcemu.GemmConfig(arch="H100", quantize="stochastic", grad_lhs=tcemu.GemmConfig(arch="H100"))

    def run():
        key = jax.random.key(3)
        y = tcemu.matmul(a, b, config=cfg, key=key)
        z = tcemu.dot_general(a, b, (((2,), (0,)), ((), ())), config=tcemu.GemmConfig(arch="A100"))
        g = jax.grad(lambda x: tcemu.matmul(x, b, config=cfg, key=key).sum())(jnp.asarray(a))
        return y, z, g

    off_and_on(run)


def test_probe_same_result():
    res = []
    for on in (False, True):
        with jax.enable_x64(on):
            res.append(tcemu.probe("H100", "bf16"))
    assert res[0] == res[1]


def test_error_vs_k_same_result():
    res = []
    for on in (False, True):
        with jax.enable_x64(on):
            res.append(tcemu.error_vs_k("f16", "A100", ks=(16, 256), outputs=8))
    assert res[0] == res[1]


# ------------------------------------------------------------------------------------------
# f64 and narrower MMAs in one x64 program


def test_f64_and_f16_mma_in_one_program():
    """Under x64, one jitted function runs a DMMA and an HMMA: the f64 result is exact for small
    integers (NumPy), the f16 one has the bits it has with x64 off."""
    s64 = "mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64"
    s16 = "wmma.mma.sync.aligned.row.col.m16n16k16.f16.f16"
    a16, b16, c16 = mma_operands(s16, seed=12, tiles=4)
    with jax.enable_x64(False):
        want16 = bits(tcemu.mma(s16, a16, b16, c16))
    rng = np.random.default_rng(12)
    a = rng.integers(-1000, 1000, (3, 8, 4)).astype(np.float64)
    b = rng.integers(-1000, 1000, (3, 4, 8)).astype(np.float64)
    c = rng.integers(-10 ** 6, 10 ** 6, (3, 8, 8)).astype(np.float64)
    with jax.enable_x64(True):
        d64, d16 = jax.jit(lambda: (tcemu.mma(s64, a, b, c), tcemu.mma(s16, a16, b16, c16)))()
        e64, e16 = tcemu.mma(s64, a, b, c), tcemu.mma(s16, a16, b16, c16)
    for x64, x16 in ((d64, d16), (e64, e16)):
        assert x64.dtype == np.float64
        np.testing.assert_array_equal(np.asarray(x64), a @ b + c)
        np.testing.assert_array_equal(bits(x16), want16)


# ------------------------------------------------------------------------------------------
# structure: no 64-bit value anywhere in the numerics of the captured instruction forms


def _wide_values(jaxpr, out):
    for eqn in jaxpr.eqns:
        for v in eqn.outvars:
            dt = v.aval.dtype
            if not jax.dtypes.issubdtype(dt, jax.dtypes.prng_key) and np.dtype(dt).itemsize == 8:
                out.append(f"{eqn.primitive.name} -> {dt}")
        for p in eqn.params.values():
            for sub in p if isinstance(p, (list, tuple)) else [p]:
                if isinstance(sub, jcore.ClosedJaxpr):
                    _wide_values(sub.jaxpr, out)
                elif isinstance(sub, jcore.Jaxpr):
                    _wide_values(sub, out)
    return out


def _captured_forms():
    forms = set()
    for name in ("wmma_mma_f16_sm90.npz", "wmma_mma_bf16tf32_sm90.npz", "wmma_mma_int_sm90.npz", "wgmma_sm90.npz"):
        forms |= {k.rsplit(".", 1)[0] for k in capture(name)}
    forms |= {"mma.sync.aligned." + k.rsplit(".", 1)[0] for k in capture("mma_sync_sm90.npz")}
    return sorted(forms)


@pytest.mark.parametrize("env", PATHS[::3], ids=["int-xla", "float-unrolled"])
def test_no_64_bit_values_in_numerics(env):
    """Traced under x64, the numerics (value and register level share them) of every captured
    non-f64 form, with the default model and a stochastic one, hold only 8-, 16- and 32-bit
    values: x64 cannot change a bit."""
    wide = {}
    with tcemu_env(env), jax.enable_x64(True):
        for sp in _captured_forms():
            ins = parse(sp)
            if ins.family == "f64":
                continue
            dt = jnp.int32 if ins.family in ("int", "b1") else jnp.uint32
            shapes = ((2, ins.m, ins.k), (2, ins.k, ins.n), (2, ins.m, ins.n))
            models = [None] if ins.family in ("int", "b1") else [None, STOCHASTIC]
            for model in models:
                j = jax.make_jaxpr(lambda a, b, c, k: mma_numerics.mma_bits_batched(ins, a, b, c, model, key=k))(
                    *(jnp.zeros(s, dt) for s in shapes), jax.random.key(0))
                found = _wide_values(j.jaxpr, [])
                if found:
                    wide[(sp, model is not None)] = sorted(set(found))
    assert not wide, wide


def test_gradients_with_float64_inputs():
    """With x64 on, float64 inputs are narrowed to float32 in integers (no flush) and the
    gradients still flow: the same as from float32 inputs, for the plain, block-scaled (MX) and
    K-block-scaled GEMMs, and forward mode."""
    rng = np.random.default_rng(11)
    a, b = rng.standard_normal((8, 256)), rng.standard_normal((256, 4))
    fp8 = "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3"
    mx = "mma.sync.aligned.m16n8k32.row.col.kind::mxf8f6f4.block_scale.scale_vec::1X.f32.e4m3.e4m3.f32.ue8m0"
    cases = [(tcemu.GemmConfig(arch="H100"), {}), (tcemu.GemmConfig(arch="RTX5090", instruction=mx), {}),
             (tcemu.GemmConfig(arch="H100", instruction=fp8, k_order="promotion", promotion_interval=128,
                               epilogue=tcemu.Epilogue(scale_block=128)),
              dict(scale_a=np.full((8, 2), 0.5), scale_b=np.full((2, 4), 2.0)))]
    for cfg, kw in cases:
        f = lambda a, b: tcemu.matmul(a, b, config=cfg, **kw).sum()  # noqa: E731
        want = jax.grad(f, argnums=(0, 1))(a.astype(np.float32), b.astype(np.float32))
        with jax.enable_x64(True):
            got = jax.grad(f, argnums=(0, 1))(a, b)
            tangent = jax.jvp(f, (a, b), (np.ones_like(a), np.zeros_like(b)))[1]
        for g, w in zip(got, want):
            assert np.abs(np.asarray(w)).max() > 0 and np.array_equal(np.asarray(g), np.asarray(w)), cfg.instruction
        assert float(tangent) == float(jax.jvp(f, (a.astype(np.float32), b.astype(np.float32)),
                                               (np.ones_like(a, np.float32), np.zeros_like(b, np.float32)))[1])
