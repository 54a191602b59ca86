"""Sparse mma.sp without hardware: spellings, architectures, operands and selectors that are
refused with errors naming them, tcemu.sparsify, the value-level metadata rules, and register level
equal to value level (x64 off and on). Hardware agreement: tests/test_mma_sp_hw.py."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tcemu
from tcemu._src.isa.parse import parse
from tcemu._src.isa.sparse import sparse_fragments
from tcemu._src.isa.fragments import matrix_to_fragment
from test_x64 import _wide_values, off_and_on

F16 = "mma.sp::ordered_metadata.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"
S8 = "mma.sp.sync.aligned.m16n8k64.row.col.satfinite.s32.s8.u8.s32"


@pytest.mark.parametrize("spelling, match", [
    ("mma.sp.sync.aligned.m16n8k16.row.col.f32.f16.f16.f16", "not a valid mma.sp type combination"),
    ("mma.sp.sync.aligned.m16n8k64.row.col.f16.e4m3.e4m3.f16", "not a valid mma.sp type combination"),
    ("mma.sp.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32", r"\.m16n8k8 is not valid for f16 mma.sp; valid: \.m16n8k16, \.m16n8k32"),
    ("mma.sp.sync.aligned.m16n8k32.row.col.f32.tf32.tf32.f32", "valid: .m16n8k8, .m16n8k16"),
    ("mma.sp.sync.aligned.m16n8k16.row.col.satfinite.f32.f16.f16.f32", "only valid for integer"),
    ("mma.sp.sync.aligned.m16n8k16.col.row.f32.f16.f16.f32", "needs .row.col"),
    ("mma.sp::ordered.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32", "starts mma.sp or mma.sp::ordered_metadata"),
    ("mma.sp.aligned.m16n8k16.row.col.f32.f16.f16.f32", "mandatory .sync"),
])
def test_bad_spellings(spelling, match):
    with pytest.raises(ValueError, match=match):
        tcemu.ptx(spelling)


def test_architectures():
    with pytest.raises(ValueError, match="requires sm_89 or newer; sm_80"):
        tcemu.ptx("mma.sp.sync.aligned.m16n8k64.row.col.f32.e4m3.e4m3.f32", arch="A100")
    with pytest.raises(ValueError, match="requires sm_80 or newer"):
        tcemu.ptx(F16, arch="T4")
    assert tcemu.ptx("mma.sp.sync.aligned.m16n8k64.row.col.f32.e4m3.e4m3.f32", arch="L40S").arch.sm == 89


def test_register_operands_and_selector():
    f = tcemu.ptx("mma.sp.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32", arch="A100")
    regs = tcemu.regfile(12)
    ok = dict(a=range(2), b=range(2, 4), c=range(4, 8), d=range(8, 12), e=11)
    with pytest.raises(ValueError, match=r"f \(the sparsity selector\) must be one of 0, 1 .* got 2"):
        f(regs, **ok, f=2)
    with pytest.raises(ValueError, match=r"e= registers \[12\] out of range 0..11"):
        f(regs, **{**ok, "e": 12})
    with pytest.raises(TypeError, match=r"e= \(the metadata register\) must be one integer register index, got 1.5"):
        f(regs, **{**ok, "e": 1.5})
    with pytest.raises(ValueError, match="a= needs 2 registers"):
        f(regs, **{**ok, "a": range(3)})
    k64 = tcemu.ptx("mma.sp.sync.aligned.m16n8k64.row.col.f32.e4m3.e4m3.f32", arch="sm_90")
    with pytest.raises(ValueError, match="must be one of 0 for this shape"):
        k64(tcemu.regfile(17), a=range(4), b=range(4, 8), c=range(8, 12), d=range(12, 16), e=16, f=1)


def test_value_level_operands():
    a, b, c = np.ones((16, 8), np.float16), np.ones((16, 8), np.float16), np.zeros((16, 8), np.float32)
    meta = np.tile(np.array([0, 1], np.int8), (16, 4))
    with pytest.raises(ValueError, match="mma.sp needs metadata="):
        tcemu.mma(F16, a, b, c)
    with pytest.raises(ValueError, match="metadata= is only for sparse"):
        tcemu.mma("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32", np.ones((16, 16), np.float16), b, c, metadata=meta)
    with pytest.raises(ValueError, match=r"a must have shape \(\.\.\., 16, 8\), got \(16, 16\)"):
        tcemu.mma(F16, np.ones((16, 16), np.float16), b, c, metadata=meta)
    with pytest.raises(ValueError, match=r"metadata must have shape \(\.\.\., 16, 8\)"):
        tcemu.mma(F16, a, b, c, metadata=meta[:, :4])
    with pytest.raises(TypeError, match="metadata must be an integer array"):
        tcemu.mma(F16, a, b, c, metadata=meta.astype(np.float32))
    with pytest.raises(ValueError, match="must be 0..3"):
        tcemu.mma(F16, a, b, c, metadata=meta + 3)
    with pytest.raises(ValueError, match=r"row 0, group 0 is \[1, 0\]; .* increasing \(::ordered_metadata\)"):
        tcemu.mma(F16, a, b, c, metadata=meta[:, ::-1])
    with pytest.raises(ValueError, match=r"row 0, group 0 is \[1, 1\]; .* distinct"):
        tcemu.mma(F16.replace("::ordered_metadata", ""), a, b, c, metadata=np.ones_like(meta))
    # mma.sp takes unsorted pairs: element 2c lands on the first index, 2c + 1 on the second
    # (measured on the H100: tests/test_mma_sp_hw.py)
    av = np.arange(1, 9, dtype=np.float16)[None, :].repeat(16, 0)
    bv = np.arange(128, dtype=np.float16).reshape(16, 8)
    d = tcemu.mma(F16.replace("::ordered_metadata", ""), av, bv, c, metadata=np.tile(np.array([1, 0], np.int8), (16, 4)))
    assert float(d[0, 0]) == sum(av[0, 2 * g] * bv[4 * g + 1, 0] + av[0, 2 * g + 1] * bv[4 * g, 0] for g in range(4))
    s4 = "mma.sp.sync.aligned.m16n8k64.row.col.s32.s4.s4.s32"
    with pytest.raises(ValueError, match=r"row 0, group 0 is \[1, 2, 4, 5\]; .* distinct pairs \(2u, 2u \+ 1\)"):
        tcemu.mma(s4, np.zeros((16, 32), np.int8), np.zeros((64, 8), np.int8), np.zeros((16, 8), np.int32),
                  metadata=np.tile(np.array([1, 2, 4, 5], np.int8), (16, 8)))


def test_sparsify():
    rng = np.random.default_rng(0)
    a = np.zeros((2, 16, 32), np.float16)
    for g in range(8):
        a[..., 4 * g + 1] = rng.integers(1, 4, (2, 16))
    comp, meta = tcemu.sparsify(a, "mma.sp.sync.aligned.m16n8k32.row.col.f16.f16.f16.f16")
    assert comp.shape == meta.shape == (2, 16, 16) and meta.dtype == np.int8
    assert np.all(meta[..., 0::2] <= 1) and np.all(meta[..., 1::2] >= 1)
    a[1, 5, 8] = 1
    a[1, 5, 10] = 1
    with pytest.raises(ValueError, match=r"row 5, group 2 \(columns 8..11\) \(batch index \(1,\)\) has 3 nonzeros"):
        tcemu.sparsify(a, "mma.sp.sync.aligned.m16n8k32.row.col.f16.f16.f16.f16")
    t = np.zeros((16, 8), np.float32)
    t[:, [0, 1]] = 1
    with pytest.raises(ValueError, match=r"row 0, group 0 \(columns 0..1\) has 2 nonzeros; mma.sp .tf32 keeps at most 1"):
        tcemu.sparsify(t, "mma.sp.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32")
    s4 = np.zeros((16, 64), np.int8)
    s4[:, [1, 4, 7]] = 1
    with pytest.raises(ValueError, match=r"has 3 nonzero pairs; mma.sp .s4 keeps at most 2 pairs in every 8"):
        tcemu.sparsify(s4, "mma.sp.sync.aligned.m16n8k64.row.col.s32.s4.s4.s32")
    with pytest.raises(ValueError, match="K a multiple of 4"):
        tcemu.sparsify(np.zeros((16, 6), np.float16), F16)
    with pytest.raises(ValueError, match="starts mma.sp"):
        tcemu.sparsify(a, "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32")
    with pytest.raises(TypeError, match="concrete array"):
        jax.jit(lambda x: tcemu.sparsify(x, F16))(jnp.zeros((16, 16), jnp.float16))


def test_value_level_is_the_product_of_the_sparse_matrix():
    """sparsify -> mma equals exact arithmetic on the dense A (small integers), s4 pairs included."""
    rng = np.random.default_rng(1)
    a = np.zeros((16, 128), np.int8)
    for r in range(16):
        for g in range(16):
            for u in rng.choice(4, 2, replace=False):
                a[r, 8 * g + 2 * u:8 * g + 2 * u + 2] = rng.integers(-8, 8, 2)
    b = rng.integers(-8, 8, (128, 8)).astype(np.int8)
    sp = "mma.sp.sync.aligned.m16n8k128.row.col.s32.s4.s4.s32"
    comp, meta = tcemu.sparsify(a, sp)
    d = tcemu.mma(sp, comp, b, np.zeros((16, 8), np.int32), metadata=meta, arch="A100")
    np.testing.assert_array_equal(np.asarray(d), a.astype(np.int64) @ b)


@pytest.mark.parametrize("sp, sel", [(F16, 2), (S8, 0)])
def test_register_level_equals_value_level(sp, sel):
    """The same operands through tcemu.ptx (registers, metadata read with selector ``sel``) and
    tcemu.mma (compressed A and metadata) give the same bits, with x64 off and on."""
    ins = parse(sp)
    rng = np.random.default_rng(2)
    kc = ins.k // 2
    idx = np.sort(np.stack([rng.choice(4, 2, replace=False) for _ in range(16 * kc // 2)]), -1).reshape(16, kc)
    if ins.atype == "f16":
        a = (rng.standard_normal((16, kc)) * 4).astype(np.float16)
        b = rng.standard_normal((ins.k, 8)).astype(np.float16)
        c = rng.standard_normal((16, 8)).astype(np.float32)
        bits = lambda x: np.asarray(x).view({2: np.uint16, 4: np.uint32}[x.dtype.itemsize])  # noqa: E731
    else:
        a = rng.integers(-128, 128, (16, kc)).astype(np.int8)
        b = rng.integers(0, 256, (ins.k, 8)).astype(np.uint8)
        c = rng.integers(-2 ** 31, 2 ** 31, (16, 8)).astype(np.int32)
        bits = lambda x: np.asarray(x).astype(np.int64) & {1: 0xFF, 4: 0xFFFFFFFF}[x.dtype.itemsize]  # noqa: E731
    # metadata registers: row r's 2-bit indices at the lanes and bits of metadata_table
    from tcemu._src.layouts import sparse as L

    tab = L.metadata_table(ins.rbits, sel, L.unit_bits(ins.bits))
    e = np.zeros(32, np.uint64)
    flat = idx.astype(np.uint64)
    for r in range(16):
        for p in range(ins.rbits):
            e[tab[r, p, 0]] |= ((flat[r, p // 2] >> np.uint64(p % 2)) & np.uint64(1)) << np.uint64(tab[r, p, 1])
    fa, fb, fc, fd = sparse_fragments(ins)
    regs = jnp.concatenate([matrix_to_fragment(jnp.asarray(bits(x), jnp.uint32), fr)
                            for x, fr in ((a, fa), (b, fb), (c, fc))] + [jnp.asarray(e.astype(np.uint32))[:, None]], 1)
    na, nb, nc = fa.nregs, fb.nregs, fc.nregs
    f = tcemu.ptx(sp, arch="H100")

    def both():
        out = f(regs, a=range(na), b=range(na, na + nb), c=range(na + nb, na + nb + nc), e=na + nb + nc, f=sel,
                d=range(fd.nregs))[:, :fd.nregs]
        d = tcemu.mma(sp, a, b, c, metadata=idx.astype(np.int8), arch="H100")
        return out, matrix_to_fragment(jnp.asarray(bits(np.asarray(d)), jnp.uint32), fd)

    reg, val = off_and_on(both)
    np.testing.assert_array_equal(reg, val)


def test_no_64_bit_values_under_x64():
    """Traced under x64, the sparse numerics of every form (metadata values or registers to
    positions, the gather of B, the dense MMA of K/2) hold no 64-bit value. (The fragment moves
    shared with mma.sync index with 64-bit integers under x64, which changes no bit.)"""
    from tcemu._src.isa import sparse as SP
    from tcemu._src.isa.sparse import SPARSE_FORMS

    wide = {}
    with jax.enable_x64(True):
        for fam, shapes in SPARSE_FORMS.items():
            t = {"fp8": "e4m3", "int8": "s8", "int4": "u4"}.get(fam, fam)
            acc = "s32" if fam.startswith("int") else "f32"
            for shape in shapes:
                ins = parse(f"mma.sp.sync.aligned.{shape}.row.col.{acc}.{t}.{t}.{acc}")
                dt = jnp.int32 if acc == "s32" else jnp.uint32
                args = (jnp.zeros((2, 16, ins.k // 2), dt), jnp.zeros((2, ins.k, 8), dt), jnp.zeros((2, 16, 8), dt),
                        jnp.zeros((2, 16, ins.k // 2), jnp.int8))
                j = jax.make_jaxpr(lambda a, b, c, m: SP.sparse_mma_bits(ins, a, b, c, SP.positions(ins, m), None,
                                                                         arch="sm_90"))(*args)
                r = jax.make_jaxpr(lambda e: SP.register_positions(ins, e, 0))(jnp.zeros(32, jnp.uint32))
                found = _wide_values(j.jaxpr, []) + _wide_values(r.jaxpr, [])
                if found:
                    wide[ins.spelling] = sorted(set(found))
    assert not wide, wide
