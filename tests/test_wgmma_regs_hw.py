"""wgmma at register level against the H100 (experiments/hardware/wgmma_regs.py): shared-memory
descriptors of every swizzle mode, K- and MN-major, A from registers or shared memory, N up to
256, every input type, ``imm-scale``, ``scale-d``.

* ``wgmma_regs_sm90.npz`` (development: the layout rule was read off it): 256 random descriptors
  over images whose bytes encode their own offset.
* ``wgmma_regs_sm90_20261129.npz`` (held out, captured after the rule was frozen): 256 new
  descriptors (base offsets without swizzle too), random and adversarial numerics at canonical
  descriptors, and random descriptors of every type over hashed images.
"""
from __future__ import annotations

import numpy as np
import pytest

import tcemu
from tcemu._src.formats import ELEMENT_BITS
from tcemu._src.isa.fragments import matrix_to_fragment
from tcemu._src.isa.wgmma import wgmma_fragments
from tcemu._src.isa.parse import parse
from conftest import capture

DEV, HELD = "wgmma_regs_sm90.npz", "wgmma_regs_sm90_20261129.npz"


def forms(name, prefix):
    return sorted({k.split(".")[0] for k in capture(name) if k.startswith(prefix)})


def descs(info, t):
    """(base of the buffer, A descriptor, B descriptor) of tile ``t`` as the kernel used them."""
    return int(info[t, 0]), int(info[t, 1]) | int(info[t, 2]) << 32, int(info[t, 3]) | int(info[t, 4]) << 32


def smem(img, base, size):
    out = np.zeros(base + size, np.uint8)
    out[base:base + img.shape[0]] = img
    return out


# ---------------------------------------------------------------------------------------------
# layout: D is one element of the operand under test, whose value encodes its address


def plane_image(u8, plane, size):
    """Bytes at offset x: ``(x >> 8 plane) & 255`` (u8); f16 element g: ``(g >> 10 plane) & 1023``."""
    if u8:
        return ((np.arange(size) >> (8 * plane)) & 255).astype(np.uint8)
    return ((np.arange(size // 2) >> (10 * plane)) & 1023).astype(np.float16).view(np.uint8)


def onehot_b(img, u8, n, at):
    """B[k, n] = (k == n % K), K-major without swizzle (LBO 128, SBO 256), written by hand."""
    K, eb = (32, 1) if u8 else (16, 2)
    for j in range(n):
        for k in range(K):
            off = at + (j % 8) * 16 + (j // 8) * 256 + (k * eb // 16) * 128 + (k * eb) % 16
            v = (1 if u8 else 0x3C00) if k == j % K else 0
            img[off:off + eb] = np.frombuffer(v.to_bytes(eb, "little"), np.uint8)


@pytest.mark.parametrize("name", [DEV, HELD])
def test_layout_rule_on_every_descriptor(name):
    z = capture(name)
    size, at = int(z["img_bytes"]), int(z["onehot"])
    for f in forms(name, "lay_"):
        sp = str(z[f + ".spelling"])
        ins = parse(sp)
        wg = tcemu.ptx(sp, arch="H100")
        u8 = ins.atype == "u8"
        tnsp_a, tnsp_b = (int(x) for x in z[f + ".tnsp"])
        a_regs = "_b" in f  # lay_<type>_b...: B under test, A one-hot in registers
        fa, fd = wgmma_fragments(ins)
        regs = np.zeros((128, 4 + fd.nregs), np.uint32)
        if a_regs:  # A[m, k] = (k == m % K)
            A = (np.arange(ins.k)[None, :] == np.arange(64)[:, None] % ins.k) * (1 if u8 else 0x3C00)
            regs[:, :4] = np.asarray(matrix_to_fragment(A.astype(np.uint32), fa))
        want = z[f + ".d_ints"].astype(np.int64)
        info = z[f + ".info"]
        for t, plane in enumerate(z[f + ".plane"]):
            base, da, db = descs(info, t)
            img = plane_image(u8, int(plane), size)
            if not a_regs:
                onehot_b(img, u8, ins.n, at)
            a = dict(a=range(4)) if a_regs else dict(a_desc=da, tnsp_a=tnsp_a)
            out = np.asarray(wg(regs, smem(img, base, size), d=range(4, 4 + fd.nregs), b_desc=db, tnsp_b=tnsp_b, **a))
            got = out[:, 4:].view(np.float32 if ins.dtype == "f32" else np.int32)
            assert np.array_equal(got.astype(np.int64), want[t]), (f, t, tcemu.WgmmaDescriptor.decode(da if not a_regs else db))


# ---------------------------------------------------------------------------------------------
# numerics: canonical descriptors (num_) and random descriptors over hashed images (rd_)

FINITE_BIT = {"f16": 14, "bf16": 14, "tf32": 30, "e4m3": 6, "e5m2": 6}


def hashed_image(seed, etype, size):
    """Byte x: the top byte of (x * 0x9E3779B1 + seed) mod 2**32, the top exponent bit of every
    ``etype`` element cleared (a finite value)."""
    x = np.arange(size, dtype=np.uint64)
    img = (((x * np.uint64(0x9E3779B1) + np.uint64(seed)) & np.uint64(0xFFFFFFFF)) >> np.uint64(24)).astype(np.uint8)
    if etype in FINITE_BIT:
        b, eb = FINITE_BIT[etype], ELEMENT_BITS[etype] // 8
        img[b // 8::eb] &= np.uint8(255 ^ (1 << (b % 8)))
    return img


@pytest.mark.parametrize("f", forms(HELD, "num_") + forms(HELD, "rd_"))
def test_numerics_bit_exact(f):
    z = capture(HELD)
    size = int(z["img_bytes"])
    sp = str(z[f + ".spelling"])
    ins = parse(sp)
    wg = tcemu.ptx(sp, arch="H100")
    tnsp_a, tnsp_b, neg_a, neg_b = (int(x) for x in z[f + ".imm"])
    a_in_regs = bool(z[f + ".a_regs"].any())
    info, nd = z[f + ".info"], z[f + ".d_regs"].shape[2]
    for t in range(info.shape[0]):
        base, da, db = descs(info, t)
        img = z[f + ".img"][t] if f + ".img" in z else hashed_image(int(z[f + ".hash_seed"][t]), ins.atype, size)
        regs = np.concatenate([z[f + ".a_regs"][t][:, :4] if a_in_regs else np.zeros((128, 4), np.uint32),
                               z[f + ".c_regs"][t]], 1)
        kw = dict(a=range(4)) if a_in_regs else dict(a_desc=da)
        if ins.atype in ("f16", "bf16"):
            kw.update(tnsp_b=tnsp_b, **({} if a_in_regs else {"tnsp_a": tnsp_a}))
        if ins.dtype != "s32":
            kw.update(imm_scale_a=-1 if neg_a else 1, imm_scale_b=-1 if neg_b else 1)
        out = wg(regs, smem(img, base, size), d=range(4, 4 + nd), b_desc=db, scale_d=int(z[f + ".scale_d"][t]), **kw)
        np.testing.assert_array_equal(np.asarray(out)[:, 4:], z[f + ".d_regs"][t], err_msg=f"{f} tile {t}")
