"""Sparse mma.sp against an H100 (tests/data/mma_sp_sm90.npz: development capture, the metadata layout
was read from it; mma_sp_sm90_heldout.npz: a fresh seed captured after the layout and the numerics
rule were frozen; experiments/hardware/mma_sp.py). Registers in -> registers out, every form of
``mma.sp`` and ``mma.sp::ordered_metadata`` of sm_80/89/90.

What the H100 showed: the metadata layout of tcemu/_src/layouts/sparse.py (decoded from the
index-coded tiles, independently of tcemu), and the numerics: the K/2 kept products as the dense
MMA of K/2 with the sm_90 preset, not the dense MMA of K on the decompressed A (which sums
f16/bf16 m16n8k32 and tf32 m16n8k16 in two blocks, and multiplies the unselected rows of B by 0).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import tcemu
from tcemu._src import formats as fm
from tcemu._src.isa import sparse as SP
from tcemu._src.isa.parse import parse
from tcemu._src.layouts import sparse as L
from conftest import capture

CAPS = ("mma_sp_sm90.npz", "mma_sp_sm90_heldout.npz")
# tf32 metadata other than 0b0100 / 0b1110 is undefined (PTX ISA): the H100 then assembles each B
# value from two 16-bit halves (tcemu/_src/layouts/sparse.py tf32_halves), which the register level
# emulates and value-level metadata (a column per element) cannot express
UNDEFINED_TF32 = ("map_unordered", "map_invalid")


def spellings():
    return sorted({k.rsplit(".", 1)[0] for k in capture(CAPS[0]) if k.startswith("mma.")})


def unplace(regs, fr):
    """(T, 32, nregs) u32 -> (T, rows, cols) element patterns (uint32), numpy only."""
    rc = fr.coords
    per = 32 // fr.bits
    lane, v = np.meshgrid(np.arange(32), np.arange(fr.nvalues), indexing="ij")
    w = regs[:, lane, v // per].astype(np.uint64) >> ((v % per) * fr.bits).astype(np.uint64)
    out = np.zeros((regs.shape[0], fr.rows, fr.cols), np.uint64)
    out[:, rc[..., 0], rc[..., 1]] = w & np.uint64((1 << fr.bits) - 1)
    return out.astype(np.uint32)


def tiles(z, sp, keep=None):
    """Logical operands of capture ``z`` for ``sp``: A, B, C patterns, dense positions of the
    kept elements (from the metadata registers and metadata_table), the hardware D patterns."""
    ins = parse(sp)
    fa, fb, fc, fd = SP.sparse_fragments(ins)
    na, nb, nc, nd = (int(x) for x in z[sp + ".nregs"])
    classes = list(z[sp + ".classes"])
    t = np.ones(len(z[sp + ".sel"]), bool) if keep is None else keep(ins, classes, z[sp + ".class"])
    r, sel = z[sp + ".regs_in"][t], z[sp + ".sel"][t]
    pos = np.zeros((len(sel), 16, ins.k // 2), np.int64)
    for s in ins.selectors:
        tab = L.metadata_table(ins.rbits, s, L.unit_bits(ins.bits))
        bit = (r[sel == s][:, tab[..., 0], -1].astype(np.int64) >> tab[..., 1]) & 1
        pos[sel == s] = L.dense_positions(bit[..., 0::2] | (bit[..., 1::2] << 1), ins.bits)
    return (unplace(r[:, :, :na], fa), unplace(r[:, :, na:na + nb], fb), unplace(r[:, :, na + nb:na + nb + nc], fc),
            pos, unplace(z[sp + ".regs_out"][t], fd), r, sel)


def typed(bits, t):
    if t in ("s8", "u8", "s4", "u4", "s32"):
        w = {"s32": 32, "s8": 8, "u8": 8, "s4": 4, "u4": 4}[t]
        v = bits.astype(np.int64)
        v = np.where(v >= 1 << (w - 1), v - (1 << w), v) if t[0] == "s" else v
        return v.astype({"s32": np.int32, "s8": np.int8, "u8": np.uint8, "s4": np.int8, "u4": np.uint8}[t])
    return np.asarray(fm.from_bits(jnp.asarray(bits), t)).astype(
        {"tf32": np.float32, "f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16,
         "e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}[t])


def test_every_form_captured_in_both():
    assert len(spellings()) == 64
    assert sorted(spellings()) == sorted({k.rsplit(".", 1)[0] for k in capture(CAPS[1]) if k.startswith("mma.")})


def test_metadata_layout_read_back_from_h100():
    """The index-coded tiles: D's bits say where each compressed element landed (no tcemu model
    involved); tcemu's layout table predicts every one, for every selector, sorted and unsorted
    index pairs (tf32: its two valid nibbles)."""
    checked = 0
    for cap in CAPS:
        z = capture(cap)
        for sp in spellings():
            plane = z[sp + ".plane"]
            if not np.any(plane[:, 0] > -2):
                continue
            ins = parse(sp)
            keep = ["map"] + ([] if ins.atype == "tf32" else ["map_unordered"])
            A, B, C, pos, D, r, sel = tiles(z, sp, lambda i, cl, c: np.isin(c, [cl.index(n) for n in keep]))
            d = typed(D, ins.dtype).astype(np.int64)
            P = ins.k // 8
            e = r[:, :, -1]
            groups = {}
            pl = plane[np.isin(z[sp + ".class"], [list(z[sp + ".classes"]).index(n) for n in keep])]
            for t in range(len(sel)):  # tiles of one metadata configuration: the bit planes and windows
                key = (e[t].tobytes(), int(sel[t]))
                hits = groups.setdefault(key, [np.zeros((17, 16, ins.k), np.int64), pos[t]])[0]
                b, q = pl[t]
                for n in range(8):
                    for w in range(min(4, P - 4 * q)):
                        hits[b + 1, :, P * n + 4 * q + w] += (d[t, :, n] >> w) & 1
            for hits, want in groups.values():
                nb = int(np.log2(ins.k // 2))
                assert np.all(hits[0].sum(1) == ins.k // 2)
                got = np.full(want.shape, -1)
                for row, k in zip(*np.nonzero(hits[0])):
                    got[row, sum(int(hits[b + 1, row, k]) << b for b in range(nb))] = k
                np.testing.assert_array_equal(got, want)
                checked += 1
    # per capture and map form: 16 sorted (tf32: 20) and 3 unsorted configurations a selector
    want = sum(len(parse(sp).selectors) * (20 if ".tf32." in sp else 19) for sp in spellings()
               if np.any(capture(CAPS[0])[sp + ".plane"][:, 0] > -2))
    assert checked == 2 * want


def _keep_defined(ins, classes, cls):
    bad = [classes.index(n) for n in UNDEFINED_TF32] if ins.atype == "tf32" else []
    return ~np.isin(cls, bad)


@pytest.mark.parametrize("sp", [s for s in spellings() if s.startswith("mma.sp.")])
def test_value_level_matches_h100(sp):
    """tcemu.mma on the compressed A and metadata the registers hold gives the H100's D, on both
    captures and both variants (run as ``mma.sp``: the value level rejects the unsorted and equal
    indices some ``::ordered_metadata`` tiles hold, which the H100 ran as ``mma.sp``)."""
    ins = parse(sp)
    parts = []
    for cap in CAPS:
        z = capture(cap)
        for name in (sp, sp.replace("mma.sp.", "mma.sp::ordered_metadata.")):
            parts.append(tiles(z, name, lambda i, cl, c: _keep_defined(i, cl, c) & ~np.isin(
                c, [cl.index(n) for n in cl if n == "map_invalid"])))
    A, B, C, pos, D = (np.concatenate([p[i] for p in parts]) for i in range(5))
    meta = pos - (np.arange(ins.k // 2) // ins.kept) * ins.group
    d = tcemu.mma(sp, typed(A, ins.atype), typed(B, ins.btype), typed(C, ins.ctype), metadata=meta, arch="H100")
    got = np.asarray(d).view(np.uint32) if ins.dtype != "f16" else np.asarray(d).view(np.uint16)
    bad = got != D
    assert not bad.any(), f"{int(bad.sum())} of {bad.size} outputs differ"


@pytest.mark.parametrize("sp", ["mma.sp::ordered_metadata.sync.aligned.m16n8k32.row.col.f32.f16.f16.f32",
                                "mma.sp.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32",
                                "mma.sp::ordered_metadata.sync.aligned.m16n8k64.row.col.f32.e5m2.e4m3.f32",
                                "mma.sp.sync.aligned.m16n8k128.row.col.satfinite.s32.s4.s4.s32"])
def test_register_level_matches_h100(sp):
    """tcemu.ptx(sp) on the captured registers (every selector; equal-index metadata included,
    which the H100 runs as two products of the same B row; tf32's undefined metadata too) gives the
    H100's registers."""
    ins = parse(sp)
    f = tcemu.ptx(sp, arch="sm_90")
    parts = []
    for cap in CAPS:
        z = capture(cap)
        nregs = [int(x) for x in z[sp + ".nregs"]]
        parts.append((z[sp + ".regs_in"], z[sp + ".sel"], z[sp + ".regs_out"]))
    r, sel, want = (np.concatenate([p[i] for p in parts]) for i in range(3))
    na, nb, nc, nd = nregs
    for s in ins.selectors:
        run = jax.jit(jax.vmap(lambda x: f(x, a=range(na), b=range(na, na + nb), c=range(na + nb, na + nb + nc),
                                           e=na + nb + nc, f=s, d=range(nd))[:, :nd]))
        np.testing.assert_array_equal(np.asarray(run(jnp.asarray(r[sel == s]))), want[sel == s],
                                      err_msg=f"selector {s}")


def test_sparse_is_not_dense_on_the_decompressed_a():
    """Two measured differences from a dense MMA of K on the decompressed A (held-out capture):
    ``blocks``: products 1 and 2**-24 in K's first half and 2**-24 in its second give 1 + 2**-23
    (one fused block of the 16 kept products), where two f16 m16n8k16 MMAs over the halves give 1;
    ``hiddenB``: inf/NaN in the B rows no metadata selects do not reach D, where 0 * inf would."""
    z = capture(CAPS[1])
    sp = "mma.sp::ordered_metadata.sync.aligned.m16n8k32.row.col.f32.f16.f16.f32"
    dense = "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"
    classes = list(z[sp + ".classes"])
    for name, want in (("blocks", 1 + 2.0 ** -23), ("hiddenB", None)):
        A, B, C, pos, D, _, _ = tiles(z, sp, lambda i, cl, c: c == cl.index(name))
        hw = D.view(np.float32)
        Ad = np.zeros((len(A), 16, 32), np.float16)
        np.put_along_axis(Ad, pos, typed(A, "f16"), axis=-1)
        Bv, Cv = typed(B, "f16"), typed(C, "f32")
        half = tcemu.mma(dense, Ad[..., :16], Bv[:, :16], Cv, arch="H100")
        two_blocks = np.asarray(tcemu.mma(dense, Ad[..., 16:], Bv[:, 16:], half, arch="H100"))
        if want is not None:
            assert np.all(hw == np.float32(want)) and np.all(two_blocks == 1.0)
        else:
            assert np.isfinite(hw).all() and np.isnan(two_blocks).any()


def test_tf32_undefined_metadata_on_random_operands():
    """tf32 with any index pairs in every lane on raw float32 A, B, C (H200, two captures made
    after the halves rule was frozen): every output register as tcemu assembles the B values."""
    for name, sp in [(n, s) for n in ("mma_sp_tf32any_sm90_20261202.npz", "mma_sp_tf32any_sm90_20261203.npz")
                     for s in sorted({k.rsplit(".", 1)[0] for k in capture(n) if k.startswith("mma.")})]:
        z = capture(name)
        ins, f = parse(sp), tcemu.ptx(sp, arch="sm_90")
        na, nb, nc, nd = (int(x) for x in z[sp + ".nregs"])
        r, sel, want = z[sp + ".regs_in"], z[sp + ".sel"], z[sp + ".regs_out"]
        for s in ins.selectors:
            run = jax.jit(jax.vmap(lambda x: f(x, a=range(na), b=range(na, na + nb), c=range(na + nb, na + nb + nc),
                                               e=na + nb + nc, f=s, d=range(nd))[:, :nd]))
            np.testing.assert_array_equal(np.asarray(run(jnp.asarray(r[sel == s]))), want[sel == s],
                                          err_msg=f"{name} {sp} selector {s}")
