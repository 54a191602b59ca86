"""AMD integer MFMAs (int8 A and B, int32 C and D) of CDNA1 (gfx908), CDNA2 (gfx90a) and CDNA3
(gfx942) at value and register level.

The truth is the ISA's arithmetic computed here independently: the exact int64 sum
``A @ B + C`` per block, wrapped to int32 (two's complement, modulo 2**32). The wrap is assumed
from the ISA text (no saturation described, no clamp bit in the VOP3P-MAI encoding); no peer
model exists (MMA-Sim 2.1.1 has no integer MFMA), so these tests check the emulator against that
reading, not against hardware. Operands: random, the extremes -128 and 127, and C near
+-2**31 so that the sum wraps both ways.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tcemu
from tcemu._src.isa.mfma import TABLE, parse_mfma
from tcemu._src.layouts import mfma as L

I8 = [(arch, s) for arch, table in TABLE.items() for s in table if s.startswith("v_mfma_i32")]
CASES = 4  # operand sets per instruction (the leading axis of _operands)


def _wrap(x):
    """int64 -> int32 modulo 2**32 (two's complement)."""
    return ((np.asarray(x, np.int64) + 2**31) % 2**32 - 2**31).astype(np.int32)


def _truth(a, b, c):
    """The ISA's D: exact int64 ``a @ b + c`` (batched), wrapped to int32."""
    return _wrap(np.matmul(a.astype(np.int64), b.astype(np.int64)) + c.astype(np.int64))


def _operands(ins, seed):
    """(CASES, blocks, ...) int8 a, b and int32 c: random; all -128 (largest positive sum) with C just
    below 2**31; -128 x 127 (largest negative sum) with C just above -2**31; extremes mixed."""
    rng = np.random.default_rng(seed)
    sa, sb, sc = (ins.blocks, ins.m, ins.k), (ins.blocks, ins.k, ins.n), (ins.blocks, ins.m, ins.n)
    ext = np.array([-128, 127, -1, 0, 1], np.int8)
    a = np.stack([rng.integers(-128, 128, sa), np.full(sa, -128), np.full(sa, -128), rng.choice(ext, sa)])
    b = np.stack([rng.integers(-128, 128, sb), np.full(sb, -128), np.full(sb, 127), rng.choice(ext, sb)])
    near = rng.integers(0, 1 << 16, (2,) + sc)
    c = np.stack([rng.integers(-2**31, 2**31, sc), 2**31 - 1 - near[0], -2**31 + near[1],
                  rng.choice([-2**31, 2**31 - 1], sc)])
    return a.astype(np.int8), b.astype(np.int8), c.astype(np.int32)


def _gfx(arch):
    return {"gfx908": "MI100", "gfx90a": "MI250X", "gfx942": "MI300X"}[arch]


def test_table():
    """Five integer MFMAs per target; CDNA3 replaced CDNA1/2's K=8/16 single-block forms by K=16/32."""
    shapes = {arch: sorted((i.m, i.n, i.k, i.blocks) for i in (parse_mfma(s, arch) for a, s in I8 if a == arch))
              for arch in TABLE}
    old = [(4, 4, 4, 16), (16, 16, 4, 4), (16, 16, 16, 1), (32, 32, 4, 2), (32, 32, 8, 1)]
    assert shapes == {"gfx908": old, "gfx90a": old,
                      "gfx942": [(4, 4, 4, 16), (16, 16, 4, 4), (16, 16, 32, 1), (32, 32, 4, 2), (32, 32, 16, 1)]}
    ins = parse_mfma("v_mfma_i32_32x32x4i8", "MI300X")  # the CDNA1/2 spelling of a CDNA3 MFMA
    assert (ins.spelling, ins.atype, ins.btype, ins.dtype, ins.family) == ("v_mfma_i32_32x32x4_2b_i8", "s8", "s8",
                                                                           "s32", "int")
    assert parse_mfma("v_mfma_i32_4x4x4_16b_i8", "MI250X").spelling == "v_mfma_i32_4x4x4i8"
    for sp, arch in (("v_mfma_i32_32x32x8i8", "MI300X"), ("v_mfma_i32_16x16x32_i8", "MI250X")):
        with pytest.raises(ValueError, match="is not an MFMA of"):
            parse_mfma(sp, arch)


@pytest.mark.parametrize("x64", [False, True], ids=["x32", "x64"])
@pytest.mark.parametrize("arch,spelling", I8)
def test_value_level(arch, spelling, x64):
    ins = parse_mfma(spelling, arch)
    a, b, c = _operands(ins, I8.index((arch, spelling)))
    want = _truth(a, b, c)
    assert not np.array_equal(want[1:3], np.matmul(a[1:3].astype(np.int64), b[1:3]) + c[1:3])  # it wraps
    with jax.enable_x64(x64):
        d = tcemu.mma(spelling, a, b, c, arch=_gfx(arch))
    assert d.dtype == jnp.int32 and d.shape == want.shape
    np.testing.assert_array_equal(np.asarray(d), want)


def _run_regs(f, a, b, c, **mods):
    """D of the register-level MFMA ``f`` on one case's (blocks, ...) a, b, c (packed by the layouts)."""
    lay = f.layout
    bits = {np.dtype(np.int8): np.uint8, np.dtype(np.int32): np.uint32}
    parts = [np.asarray(L.pack(lay, m, jnp.asarray(x.view(bits[x.dtype]).astype(np.uint32))))
             for m, x in (("a", a), ("b", b), ("c", c))]
    na, nb, nc = (p.shape[1] for p in parts)
    regs = jnp.asarray(np.concatenate(parts + [np.zeros((64, nc), np.uint32)], 1))
    out = np.asarray(f(regs, a=range(na), b=range(na, na + nb), c=range(na + nb, na + nb + nc),
                       d=range(na + nb + nc, na + nb + 2 * nc), **mods))
    assert np.array_equal(out[:, :na + nb + nc], np.asarray(regs)[:, :na + nb + nc])  # only D written
    return np.asarray(L.unpack(lay, "d", out[:, na + nb + nc:])).view(np.int32), regs, (na, nb)


@pytest.mark.parametrize("arch,spelling", I8)
def test_register_level(arch, spelling):
    """Every case through a wavefront's registers (four int8 a VGPR): D equals the truth and the
    value level."""
    f = tcemu.ptx(spelling, arch=_gfx(arch))
    a, b, c = _operands(f.ins, 100 + I8.index((arch, spelling)))
    value = np.asarray(tcemu.mma(spelling, a, b, c, arch=_gfx(arch)))
    for i in range(CASES):
        d, *_ = _run_regs(f, a[i], b[i], c[i])
        np.testing.assert_array_equal(d, _truth(a[i], b[i], c[i]), err_msg=f"{spelling} case {i}")
        np.testing.assert_array_equal(d, value[i])


MODIFIED = [("v_mfma_i32_4x4x4_16b_i8", "MI300X", dict(cbsz=2, abid=1)),
            ("v_mfma_i32_32x32x4_2b_i8", "MI300X", dict(cbsz=1, abid=1, blgp=3)),
            ("v_mfma_i32_16x16x4i8", "MI100", dict(cbsz=2, abid=3, blgp=6)),
            ("v_mfma_i32_32x32x8i8", "MI250X", dict(blgp=1))]


@pytest.mark.parametrize("spelling,arch,mods", MODIFIED)
def test_modifiers(spelling, arch, mods):
    """CBSZ/ABID (block j reads the A of block (j >> cbsz << cbsz) + abid) and BLGP (the lanes B
    is read from) at register level equal the truth on the A and B they select, and the value level."""
    f = tcemu.ptx(spelling, arch=arch)
    a, b, c = (x[0] for x in _operands(f.ins, 5))
    d, regs, (na, nb) = _run_regs(f, a, b, c, **mods)
    vb = b
    if mods.get("blgp"):  # the B each lane reads under BLGP, from the registers B was packed into
        vb = np.asarray(L.unpack(f.layout, "b", regs[:, na:na + nb], blgp=mods["blgp"])).astype(np.uint8).view(np.int8)
        assert not np.array_equal(vb, b)
    src = (np.arange(f.ins.blocks) >> mods.get("cbsz", 0) << mods.get("cbsz", 0)) + mods.get("abid", 0)
    np.testing.assert_array_equal(d, _truth(a[src], vb, c))
    vmods = {k: v for k, v in mods.items() if k != "blgp"}
    np.testing.assert_array_equal(d, np.asarray(tcemu.mma(spelling, a, vb, c, arch=arch, **vmods)))


def test_jit_and_batch():
    """Blocks as the last batch axis behind others, under jit."""
    sp = "v_mfma_i32_16x16x4_4b_i8"
    a, b, c = _operands(parse_mfma(sp, "MI300X"), 3)
    d = jax.jit(lambda a, b, c: tcemu.mma(sp, a, b, c, arch="MI300X"))(a, b, c[0])
    np.testing.assert_array_equal(np.asarray(d), _truth(a, b, c[0]))


def test_bad_input():
    sp = "v_mfma_i32_32x32x16_i8"
    a, b, c = np.ones((32, 16), np.int8), np.ones((16, 32), np.int8), np.zeros((32, 32), np.int32)
    for bad, name, want in ((dict(a=a.astype(np.float32)), "a", "int8"), (dict(a=a.view(np.uint8)), "a", "int8"),
                            (dict(b=b.astype(np.int32)), "b", "int8"), (dict(c=c.astype(np.int64)), "c", "int32"),
                            (dict(c=c.astype(np.float32)), "c", "int32")):
        args = {"a": a, "b": b, "c": c, **bad}
        with jax.enable_x64(True), pytest.raises(TypeError, match=f"{sp}: {name} must have dtype {want}"):
            tcemu.mma(sp, args["a"], args["b"], args["c"], arch="MI300X")
    with pytest.raises(ValueError, match=r"b must have shape \(\.\.\., 16, 32\)"):
        tcemu.mma(sp, a, b[:8], c, arch="MI300X")
    with pytest.raises(ValueError, match="model= does not apply"):
        tcemu.mma(sp, a, b, c, arch="MI300X", model=tcemu.numerics("MI300X"))
    with pytest.raises(ValueError, match=r"cbsz must be an integer in 0\.\.0"):
        tcemu.mma(sp, a, b, c, arch="MI300X", cbsz=1)
    with pytest.raises(ValueError, match="neg is only for the f64 MFMAs"):
        tcemu.mma(sp, a, b, c, arch="MI300X", neg=(1, 0, 0))
    f = tcemu.ptx(sp, arch="MI300X")
    regs = tcemu.regfile(24, lanes=64)
    ix = dict(a=range(2), b=range(2, 4), c=range(4, 20), d=range(4, 20))
    with pytest.raises(ValueError, match="takes no BLGP"):  # gfx942's single-block i8 MFMAs take no BLGP
        f(regs, **ix, blgp=1)
    with pytest.raises(ValueError, match="needs 2"):
        f(regs, a=range(1), b=range(2, 4), c=range(4, 20), d=range(4, 20))
    with pytest.raises(ValueError, match="model= does not apply"):
        tcemu.ptx(sp, arch="MI300X", model=tcemu.numerics("MI300X"))
    with pytest.raises(ValueError, match="integer MFMAs are exact"):
        tcemu.GemmConfig(arch="MI300X", instruction=sp)
    with pytest.raises(ValueError, match="integer MFMA"):
        tcemu.probe("MI300X", instruction=sp)
