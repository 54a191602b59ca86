"""Sparse ``wgmma.mma_async.sp``: register level equal to value level on every type, the metadata
packing (``tcemu.sparse_metadata``) against the positions it encodes, and bad input."""
from __future__ import annotations

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import tcemu
from tcemu._src.isa import sparse as SP
from tcemu._src.isa.parse import parse

P = "wgmma.mma_async.sp.sync.aligned"
NP = {"f16": np.float16, "bf16": ml_dtypes.bfloat16, "tf32": np.float32, "e4m3": ml_dtypes.float8_e4m3fn,
      "e5m2": ml_dtypes.float8_e5m2, "s8": np.int8, "u8": np.uint8}
FORMS = [  # (spelling, A in registers, tnsp_a, tnsp_b, swizzles)
    (f"{P}.m64n24k32.f32.f16.f16", True, 0, 1, ("none", "32B")),
    (f"{P}.m64n16k32.f16.f16.f16", False, 1, 1, ("64B", "128B")),
    (f"{P}.m64n40k32.f32.bf16.bf16", False, 0, 0, ("128B", "32B")),
    (f"{P}.m64n8k16.f32.tf32.tf32", True, 0, 0, ("none", "64B")),
    (f"{P}.m64n32k16.f32.tf32.tf32", False, 0, 0, ("32B", "none")),
    (f"{P}.m64n16k64.f16.e4m3.e5m2", False, 0, 0, ("none", "32B")),
    (f"{P}.m64n8k64.f32.e5m2.e5m2", True, 0, 0, ("none", "128B")),
    (f"{P}.m64n48k64.satfinite.s32.s8.u8", False, 0, 0, ("64B", "64B")),
    (f"{P}.m64n24k64.s32.u8.u8", True, 0, 0, ("none", "none")),
]


def operands(ins, rng):
    kc = ins.k // 2
    if ins.atype in ("s8", "u8"):
        lo = -128 if ins.atype == "s8" else 0
        a = rng.integers(lo, lo + 256, (64, kc)).astype(NP[ins.atype])
        b = rng.integers(0, 256, (ins.k, ins.n)).astype(NP[ins.btype]) if ins.btype == "u8" else \
            rng.integers(-128, 128, (ins.k, ins.n)).astype(np.int8)
        c = rng.integers(-2**31, 2**31, (64, ins.n)).astype(np.int32)
        return a, b, c
    a = rng.standard_normal((64, kc)).astype(NP[ins.atype])
    b = rng.standard_normal((ins.k, ins.n)).astype(NP[ins.btype])
    return a, b, rng.standard_normal((64, ins.n)).astype(np.float16 if ins.dtype == "f16" else np.float32)


def metadata(ins, rng):
    """Random sorted index pairs (tf32: one of the two columns) for every row and group."""
    kc = ins.k // 2
    if ins.atype == "tf32":
        return rng.integers(0, 2, (64, kc)).astype(np.int8)
    pairs = np.array([(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)])
    return pairs[rng.integers(0, 6, (64, kc // 2))].reshape(64, kc).astype(np.int8)


@pytest.mark.parametrize("spelling,a_regs,tnsp_a,tnsp_b,swz", FORMS)
def test_register_level_equals_value_level(spelling, a_regs, tnsp_a, tnsp_b, swz):
    rng = np.random.default_rng(abs(hash(spelling)) % 2**32)
    ins = parse(spelling)
    a, b, c = operands(ins, rng)
    meta = metadata(ins, rng)
    sel = int(rng.choice(ins.selectors))
    want = np.asarray(tcemu.mma(spelling, a, b, c, metadata=meta, arch="H100"))

    f = tcemu.ptx(spelling, arch="H100")
    smem = tcemu.memory(32768)
    db = _desc(ins, "b", swz[1], tnsp_b, 16384)
    smem = db.put(smem, b, ins.btype, operand="b", tnsp=tnsp_b, sparse=True)
    nd = f.fd.nregs
    regs = np.zeros((128, 5 + nd), np.uint32)
    regs[:, 4] = tcemu.sparse_metadata(spelling, meta, selector=sel)
    cbits = np.asarray(c).view(np.uint16 if ins.dtype == "f16" else np.uint32).astype(np.uint32)
    regs[:, 5:] = np.asarray(_frag(f.fd, cbits, ins.dtype))
    kw = {}
    if a_regs:
        abits = np.asarray(a).view({8: np.uint8, 16: np.uint16, 32: np.uint32}[ins.bits]).astype(np.uint32)
        regs[:, :4] = np.asarray(_frag(f.fa, abits, ins.atype))
        kw["a"] = range(4)
    else:
        da = _desc(ins, "a", swz[0], tnsp_a, 0)
        smem = da.put(smem, a, ins.atype, operand="a", tnsp=tnsp_a)
        kw["a_desc"] = da.encode()
        if ins.atype in ("f16", "bf16"):
            kw["tnsp_a"] = tnsp_a
    if ins.atype in ("f16", "bf16"):
        kw["tnsp_b"] = tnsp_b
    out = np.asarray(f(regs, smem, d=range(5, 5 + nd), b_desc=db.encode(), sp_meta=4, sp_sel=sel, **kw))
    d = np.zeros((64, ins.n), np.uint32)
    d[f.fd.coords[..., 0], f.fd.coords[..., 1]] = _values(out[:, 5:], f.fd, ins.dtype)
    wbits = want.view(np.uint16 if ins.dtype == "f16" else np.uint32).astype(np.uint32)
    np.testing.assert_array_equal(d, wbits)


def _desc(ins, operand, swz, tnsp, start):
    W = {"none": 1, "32B": 2, "64B": 4, "128B": 8}[swz]
    rows = 64 if operand == "a" else ins.n
    k = ins.k // 2 if operand == "a" else ins.k
    kbytes = k * ins.bits // 8
    if tnsp:
        if swz == "none":
            return tcemu.WgmmaDescriptor(start, 128 * (rows * ins.bits // 128), 128)
        return tcemu.WgmmaDescriptor(start, 128 * W * (k // 8), 128 * W, swz)
    if W == 1:  # core matrices of 8 rows x 16 bytes: K chunks at LBO, 8-row groups at SBO
        return tcemu.WgmmaDescriptor(start, 128, 128 * (kbytes // 16))
    lbo = 128 * W * (rows // 8) if kbytes > 16 * W else 16  # the next K atom after all row groups
    return tcemu.WgmmaDescriptor(start, lbo, 128 * W, swz)


def _frag(fr, mat_bits, etype):
    from tcemu._src.isa.fragments import matrix_to_fragment
    return matrix_to_fragment(jnp.asarray(mat_bits, jnp.uint32), fr)


def _values(regs, fr, etype):
    """(128, values) element bits from the fragment's registers (16-bit: two a register)."""
    if fr.bits == 16:
        return np.stack([regs & 0xFFFF, regs >> 16], -1).reshape(128, -1)
    return regs


@settings(max_examples=30, deadline=None)
@given(st.sampled_from([f"{P}.m64n8k32.f32.f16.f16", f"{P}.m64n8k16.f32.tf32.tf32", f"{P}.m64n8k64.s32.s8.s8",
                        "mma.sp.sync.aligned.m16n8k32.row.col.f32.bf16.bf16.f32",
                        "mma.sp::ordered_metadata.sync.aligned.m16n8k128.row.col.s32.u4.u4.s32",
                        "mma.sp.sync.aligned.m16n8k16.row.col.f32.tf32.tf32.f32"]), st.integers(0, 2**32 - 1))
def test_sparse_metadata_round_trip(spelling, seed):
    """The registers ``sparse_metadata`` writes read back (as the instruction reads them) to the
    dense columns the value-level metadata names."""
    rng = np.random.default_rng(seed)
    ins = SP._parse_sparse(spelling)
    dense = np.zeros((ins.m, ins.k), np.float32)
    g, pair = ins.group, 2 if ins.bits == 4 else 1
    for r in range(ins.m):
        for q in range(ins.k // g):
            units = np.sort(rng.choice(g // pair, g // pair // 2, replace=False))
            for u in units:
                dense[r, q * g + u * pair:q * g + u * pair + pair] = 1 + rng.integers(0, 3)
    _, meta = tcemu.sparsify(dense, spelling)
    sel = int(rng.choice(ins.selectors))
    e = tcemu.sparse_metadata(spelling, meta, selector=sel)
    got = np.asarray(SP.register_positions(ins, jnp.asarray(e), sel))
    want = np.asarray(SP.positions(ins, meta))
    if ins.bits == 32:  # the low and high halves of B row pos
        want = np.stack([2 * want, 2 * want + 1], -1)
    np.testing.assert_array_equal(got, want)


def test_bad_input():
    sp = f"{P}.m64n8k32.f32.f16.f16"
    f = tcemu.ptx(sp, arch="H100")
    regs, smem = tcemu.regfile(8, lanes=128), tcemu.memory(8192)
    desc = tcemu.wgmma_descriptor(0, 128, 256)
    with pytest.raises(ValueError, match="sp_sel .* must be one of 0, 1"):
        f(regs, smem, d=range(4), b_desc=desc, a=range(4), sp_meta=4, sp_sel=2)
    with pytest.raises(TypeError, match="sp_meta= .* one integer register index"):
        f(regs, smem, d=range(4), b_desc=desc, a=range(4), sp_meta=[4, 5])
    with pytest.raises(TypeError, match="sp_meta"):
        f(regs, smem, d=range(4), b_desc=desc, a=range(4))
    with pytest.raises(ValueError, match="selector must be one of 0 for"):
        tcemu.sparse_metadata(f"{P}.m64n8k64.s32.s8.s8", np.zeros((64, 32), np.int8), selector=1)
    with pytest.raises(ValueError, match=r"must be an integer array \(\.\.\., 64, 16\)"):
        tcemu.sparse_metadata(sp, np.zeros((16, 16), np.int8))
    with pytest.raises(ValueError, match="columns kept in a group must be distinct"):
        tcemu.sparse_metadata(sp, np.zeros((64, 16), np.int8))
    with pytest.raises(ValueError, match="sparse must be False, or True"):
        tcemu.WgmmaDescriptor(0, 128, 256).put(smem, np.zeros((32, 8), np.uint8), "b1", operand="b", sparse=True)
    with pytest.raises(ValueError, match="needs metadata="):
        tcemu.mma(sp, np.zeros((64, 16), np.float16), np.zeros((32, 8), np.float16), np.zeros((64, 8), np.float32),
                  arch="H100")
