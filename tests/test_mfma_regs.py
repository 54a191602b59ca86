"""AMD MFMA at register level (``tcemu.ptx("v_mfma_...", arch=...)``): MMA-Sim 2.1.1's vectors run
through a wavefront's registers (packed by the calculator-checked layouts), the modifiers equal to
the value level, and bad input."""
from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tcemu
from tcemu._src.layouts import mfma as L
from test_mfma import DISTS, GFX, _compare, _emulated, forms, tcemu_ins, vectors

EVERY = os.environ.get("TCEMU_ALL_VECTORS") == "1"
# CI: every second emulated MFMA, one distribution each (a rotation); TCEMU_ALL_VECTORS=1: all
CASES = [(a, s, d) for i, (a, s) in enumerate(forms()) if _emulated(a, s) and (EVERY or i % 2 == 0)
         for d in (DISTS if EVERY else (DISTS[(i + 1) % 6],))]


def _words(x, bits):
    """Element bits as uint32, f64 as (..., 2) (low, high)."""
    x = np.asarray(x)
    if bits == 64:
        return np.stack([(x & 0xFFFFFFFF).astype(np.uint32), (x >> 32).astype(np.uint32)], -1)
    return x.astype(np.uint32)


def _regfile(f, a, b, c):
    """A register file holding A, B and C (``pack``) and room for D after them."""
    lay = f.layout
    parts = [np.asarray(L.pack(lay, m, _words(x, lay.bits(m)))) for m, x in (("a", a), ("b", b), ("c", c))]
    na, nb, nc = (p.shape[1] for p in parts)
    regs = np.concatenate(parts + [np.zeros((64, nc), np.uint32)], 1)
    ix = {"a": range(na), "b": range(na, na + nb), "c": range(na + nb, na + nb + nc),
          "d": range(na + nb + nc, na + nb + 2 * nc)}
    return jnp.asarray(regs), ix


def _d_bits(f, out, ix):
    d = np.asarray(L.unpack(f.layout, "d", out[:, list(ix["d"])]))
    return (d[..., 0].astype(np.uint64) | (d[..., 1].astype(np.uint64) << 32)) if d.ndim == 4 else d


@pytest.mark.parametrize("arch,suffix,dist", CASES)
def test_register_level_on_mmasim_vectors(arch, suffix, dist):
    """Every emulated MFMA (CI: every second one, one distribution, a rotation over the six): the vectors'
    instances fill the blocks, run through the registers, and D read back equals MMA-Sim's."""
    ins = tcemu_ins(arch, suffix)
    z = vectors()
    get = lambda p: np.resize(z[f"{arch}|{suffix}|{dist}|{p}"], (ins.blocks,) + z[f"{arch}|{suffix}|{dist}|{p}"].shape[1:])  # noqa: E731
    f = tcemu.ptx(ins.spelling, arch=GFX[arch])
    regs, ix = _regfile(f, get("a"), get("b"), get("c"))
    with jax.enable_x64(ins.family == "f64"):
        out = np.asarray(f(regs, **ix))
    want = get("d")
    _compare(ins, _d_bits(f, out, ix).astype(want.dtype), want)


MODIFIED = [("v_mfma_f32_32x32x4_2b_f16", "MI300X", dict(cbsz=1, abid=1)),
            ("v_mfma_f32_4x4x4_16b_f16", "MI300X", dict(cbsz=3, abid=5)),
            ("v_mfma_f32_16x16x1_4b_f32", "MI250X", dict(cbsz=2, abid=2, blgp=5)),
            ("v_mfma_f32_32x32x2_f32", "MI300X", dict(blgp=3)),
            ("v_mfma_f32_16x16x8bf16", "MI250X", dict(blgp=7)),
            ("v_mfma_f64_16x16x4_f64", "MI300X", dict(neg=(1, 0, 1)))]


@pytest.mark.parametrize("spelling,arch,mods", MODIFIED)
def test_modifiers_equal_the_value_level(spelling, arch, mods):
    """CBSZ/ABID and CDNA3 f64's neg as the value level applies them; BLGP as the value level on
    the B the calculator's lane pattern reads."""
    f = tcemu.ptx(spelling, arch=arch)
    ins, lay = f.ins, f.layout
    rng = np.random.default_rng(7)
    dt = {"f16": np.float16, "f32": np.float32, "f64": np.float64, "bf16": jnp.bfloat16}
    a, b, c = (rng.standard_normal(lay.shape(m)).astype(dt[t]) for m, t in
               (("a", ins.atype), ("b", ins.btype), ("c", ins.dtype)))
    bits = lambda x: np.asarray(x).view({2: np.uint16, 4: np.uint32, 8: np.uint64}[np.asarray(x).itemsize])  # noqa: E731
    with jax.enable_x64(ins.family == "f64"):
        regs, ix = _regfile(f, bits(a), bits(b), bits(c))
        out = _d_bits(f, np.asarray(f(regs, **ix, **mods)), ix)
        vb = b
        if mods.get("blgp"):  # the B each lane reads under BLGP, from the registers B was packed into
            vb = np.asarray(L.unpack(lay, "b", regs[:, list(ix["b"])], blgp=mods["blgp"])).astype(np.uint32)
            vb = vb.astype({2: np.uint16, 4: np.uint32}[np.dtype(dt[ins.btype]).itemsize]).view(dt[ins.btype])
        vmods = {k: v for k, v in mods.items() if k != "blgp"}
        want = np.asarray(tcemu.mma(spelling, a, vb, c, arch=arch, **vmods))
    assert np.array_equal(out, bits(want)), spelling


def test_bad_input():
    f = tcemu.ptx("v_mfma_f32_32x32x8_f16", arch="MI300X")
    regs = tcemu.regfile(20, lanes=64)
    ix = dict(a=range(2), b=range(2, 4), c=range(4, 20), d=range(4, 20))
    with pytest.raises(ValueError, match=r"regs must have shape \(64, nregs\)"):
        f(tcemu.regfile(20), **ix)
    with pytest.raises(ValueError, match="cbsz must be an integer in 0..0"):
        f(regs, **ix, cbsz=1)
    with pytest.raises(ValueError, match="blgp must be an integer in 0..0"):
        f(regs, **ix, blgp=1)   # gfx942's single-block f16 MFMA takes no BLGP
    with pytest.raises(ValueError, match="neg is only for the f64 MFMAs of gfx942"):
        f(regs, **ix, neg=(1, 0, 0))
    with pytest.raises(ValueError, match="a= .* 2 registers|needs 2"):
        f(regs, a=range(3), b=range(2, 4), c=range(4, 20), d=range(4, 20))
    with pytest.raises(ValueError, match="is not an MFMA of gfx908"):
        tcemu.ptx("v_mfma_f32_16x16x32_fp8_fp8", arch="MI100")
    with pytest.raises(ValueError, match="lanes must be 32 .*, 64 .* or 128"):
        tcemu.regfile(4, lanes=16)
