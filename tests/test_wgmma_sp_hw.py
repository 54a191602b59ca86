"""Sparse ``wgmma.mma_async.sp`` at register level against the H200
(experiments/hardware/wgmma_sp.py): the metadata register and selector, the compressed A from
registers or a descriptor, the dense B at its descriptor, numerics.

* ``wgmma_sp_sm90.npz`` (development, H200: the rules were read off it): index-coded tiles (B the
  identity, the compressed A coding its columns, random metadata in every lane), random
  descriptors over offset-coded images, numerics at canonical descriptors.
* ``wgmma_sp_sm90_20261201.npz`` (held out, H100, captured after the rules were frozen): the same
  kinds and random descriptors over hashed images.
* ``wgmma_sp_tf32any_sm90_20261202.npz`` (H200): tf32 with any index pairs on raw float32
  operands. The halves rule was frozen before it (register A: held out); that ``imm-scale-b``
  negates the assembled value was read off its descriptor form, then held out on
  ``..._20261203.npz`` (H200, captured after that rule was committed).
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

import tcemu
from tcemu._src.isa.fragments import matrix_to_fragment
from tcemu._src.isa.parse import parse
from tcemu._src.isa.wgmma import wgmma_fragments
from conftest import capture
from test_wgmma_regs_hw import descs, hashed_image, plane_image, smem

DEV = "wgmma_sp_sm90.npz"
HELD = "wgmma_sp_sm90_20261201.npz"
CAPTURES = [DEV, HELD]
# tf32 with undefined metadata (any index pairs) on random operands: B values assembled from halves
TF32ANY = ["wgmma_sp_tf32any_sm90_20261202.npz", "wgmma_sp_tf32any_sm90_20261203.npz"]


def forms(name, prefix):
    return sorted({k.split(".")[0] for k in capture(name) if k.startswith(prefix)})


def image(z, f, t):
    if f + ".hash_seed" in z:
        return hashed_image(int(z[f + ".hash_seed"][t]), parse(str(z[f + ".spelling"])).atype, int(z["img_bytes"]))
    return z[f + ".img"][z[f + ".img_index"][t]]


def run_tile(z, f, t, wg, ins, regs, **kw):
    """D registers (128, nd) of tile ``t`` of kernel ``f`` as tcemu computes them."""
    size = int(z["img_bytes"])
    base, da, db = descs(z[f + ".info"], t)
    tnsp_a, tnsp_b, neg_a, neg_b = (int(x) for x in z[f + ".imm"])
    a_in_regs = int(z[f + ".desc"][t, 0]) == 0
    nd = z[f + ".d_regs"].shape[2] if f + ".d_regs" in z else ins.n // 2
    kw |= dict(a=range(4)) if a_in_regs else dict(a_desc=da)
    if ins.atype in ("f16", "bf16"):
        kw.update(tnsp_b=tnsp_b, **({} if a_in_regs else {"tnsp_a": tnsp_a}))
    if ins.dtype != "s32":
        kw.update(imm_scale_a=-1 if neg_a else 1, imm_scale_b=-1 if neg_b else 1)
    img = image(z, f, t)
    out = wg(regs, smem(img, base, max(size, img.shape[0])), d=range(5, 5 + nd), b_desc=db, sp_meta=4,
             sp_sel=int(z[f + ".sel"][t]), **kw)
    return np.asarray(out)[:, 5:]


def regfile(z, f, t, ins):
    a = z[f + ".a_regs"][t][:, :4]
    a = a if a.shape[1] == 4 else np.zeros((128, 4), np.uint32)
    c = z[f + ".c_regs"][t] if z[f + ".c_regs"].shape[2] else np.zeros((128, ins.n // (2 if ins.dtype != "f16"
                                                                                        else 4)), np.uint32)
    return np.concatenate([a, z[f + ".e"][t][:, None], c], 1)


@pytest.mark.parametrize("name", CAPTURES)
def test_metadata_and_operand_layouts_index_coded(name):
    """Every index-coded tile: each compressed element lands in the dense column its metadata names
    (unsorted and equal index pairs included); tf32 only with the defined chunks 0b0100/0b1110."""
    z = capture(name)
    checked = 0
    for f in forms(name, "map_"):
        sp = str(z[f + ".spelling"])
        ins, wg = parse(sp), tcemu.ptx(sp, arch="H100")
        for t in range(len(z[f + ".sel"])):
            got = run_tile(z, f, t, wg, ins, regfile(z, f, t, ins))
            np.testing.assert_array_equal(got, z[f + ".d_regs"][t], err_msg=f"{f} tile {t}")
            checked += 1
    assert checked >= 400


@pytest.mark.parametrize("name", CAPTURES)
def test_descriptor_layouts_random(name):
    """Random descriptors of every swizzle over offset-coded images: B (K-major, and MN-major for
    f16) with A one-hot in registers, and A (the compressed K/2) with B one-hot."""
    z = capture(name)
    size, onehot = int(z["img_bytes"]), 46 * 1024
    for f in forms(name, "lay_"):
        sp = str(z[f + ".spelling"])
        ins, wg = parse(sp), tcemu.ptx(sp, arch="H100")
        u8, kc = ins.atype == "u8", ins.k // 2
        one = 1 if u8 else 0x3C00
        tnsp_a, tnsp_b = (int(x) for x in z[f + ".tnsp"])
        a_regs = "_b" in f
        fa, fd = wgmma_fragments(parse(sp.replace(".sp", "").replace(f"k{ins.k}", f"k{kc}")))
        for t, (plane, pat) in enumerate(zip(z[f + ".plane"], z[f + ".pattern"])):
            base, da, db = descs(z[f + ".info"], t)
            kept = 4 * (np.arange(kc) // 2) + np.array([[0, 1], [2, 3]])[pat][np.arange(kc) % 2]
            img = plane_image(u8, int(plane), size)
            regs = np.zeros((128, 5 + fd.nregs), np.uint32)
            regs[:, 4] = 0x44444444 if pat == 0 else 0xEEEEEEEE  # every chunk: (0, 1) or (2, 3)
            if a_regs:  # compressed A[m, j] = (j == m % K/2)
                A = (np.arange(kc)[None, :] == np.arange(64)[:, None] % kc) * one
                regs[:, :4] = np.asarray(matrix_to_fragment(A.astype(np.uint32), fa))
                kw = dict(a=range(4), tnsp_b=tnsp_b) if not u8 else dict(a=range(4))
            else:  # B[k, n] = (k == kept(n % K/2)), K-major, no swizzle, at 46 KiB
                B = np.zeros((ins.k, ins.n), np.float16 if not u8 else np.uint8)
                B[kept[np.arange(ins.n) % kc], np.arange(ins.n)] = 1
                desc = tcemu.WgmmaDescriptor(onehot, 128, 128 * (ins.k * (8 if u8 else 16) // 128))
                img = np.asarray(desc.put(jnp.asarray(img), B, ins.btype, operand="b", sparse=True))
                kw = dict(a_desc=da) | ({} if u8 else dict(tnsp_a=tnsp_a))
            out = np.asarray(wg(regs, smem(img, base, size), d=range(5, 5 + fd.nregs), b_desc=db, sp_meta=4, **kw))
            got = out[:, 5:].view(np.float32 if ins.dtype == "f32" else np.int32)
            np.testing.assert_array_equal(got.astype(np.int64), z[f + ".d_ints"][t].astype(np.int64),
                                          err_msg=f"{f} tile {t}")


@pytest.mark.parametrize("name", CAPTURES + TF32ANY)
def test_numerics_bit_exact(name):
    z = capture(name)
    for f in forms(name, "num_") + forms(name, "rd_") + forms(name, "any_"):
        sp = str(z[f + ".spelling"])
        ins, wg = parse(sp), tcemu.ptx(sp, arch="H100")
        for t in range(len(z[f + ".sel"])):
            got = run_tile(z, f, t, wg, ins, regfile(z, f, t, ins), scale_d=int(z[f + ".scale_d"][t]))
            np.testing.assert_array_equal(got, z[f + ".d_regs"][t], err_msg=f"{f} tile {t}")
