"""tcemu against MMA-Sim's vectors (tests/data/mmasim_vectors.npz, made by
``experiments/mmasim/generate_vectors.py``): every Blackwell form (sm_120 ``mma.sync``
``.kind::f8f6f4`` for all 25 type pairs and both accumulators, the block-scaled kinds mxf8f6f4,
mxf4 and mxf4nvf4 with every scale_vec and scale type, sm_100 ``tcgen05.mma`` of every kind with
M = 64 and 128) and, as a cross-check, forms tcemu had before (mma.sync Volta to Blackwell, Hopper
wgmma). Five input distributions per form: random, near cancellation, exponent and scale
extremes, NaN/Inf, and tiny (underflowing) results.

CI runs a sample of the forms (every kind, scale type, element type as A and as B, both
accumulators and M sizes, one form per architecture of the cross-check);
``TCEMU_ALL_VECTORS=1`` runs all of them. Register level: the sm_120 forms with their fragments
(fp6/fp4 in 8-bit containers with junk padding bits, packed fp4) and scale registers.
"""
from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import tcemu
from tcemu._src.isa.parse import F8F6F4, parse
from tcemu._src.isa.wmma import matrix_to_fragment, mma_sync_fragments
from conftest import capture

CAP = "mmasim_vectors.npz"
VIEW = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2, "e3m2": ml_dtypes.float6_e3m2fn,
        "e2m3": ml_dtypes.float6_e2m3fn, "e2m1": ml_dtypes.float4_e2m1fn, "f16": np.float16,
        "bf16": ml_dtypes.bfloat16, "tf32": np.float32, "f32": np.float32, "ue8m0": ml_dtypes.float8_e8m0fnu,
        "ue4m3": ml_dtypes.float8_e4m3fn}


def meta():
    return json.loads(bytes(capture(CAP)["meta"]).decode())["meta"]


def _sample(fid: str) -> bool:
    """The CI sample: each element type once as A and once as B (a rotation of the five), per
    kind and accumulator; every fp4 block-scaled form; one cross-check form per architecture."""
    parts = fid.split(".")
    if "f8f6f4" in parts and "mxf8f6f4" not in parts:
        a, b = parts[-2:]
        return b == F8F6F4[(F8F6F4.index(a) + (1 if parts[-3] == "f32" else 2)) % 5]
    if "mxf8f6f4" in parts:
        return parts[-1] == F8F6F4[(F8F6F4.index(parts[-2]) + 3) % 5] or (parts[-2] == parts[-1] == "e2m1")
    if parts[0] in ("sm120", "sm100"):
        return True
    return fid in ("sm_70.mma.m8n8k4.f16.f16.f16.f16", "sm_75.mma.m16n8k8.f32.f16.f16.f32",
                   "sm_80.mma.m16n8k4.f32.tf32.tf32.f32", "sm_89.mma.m16n8k32.f16.e5m2.e4m3.f16",
                   "sm_90.wgmma.m64n8k32.f16.e5m2", "sm_90.mma.m16n8k16.f16.f16.f16.f16",
                   "sm_100.mma.m16n8k16.f32.bf16.bf16.f32", "sm_120.mma.m16n8k32.f32.e4m3.e4m3.f32")


def forms(keep=lambda fid, m: True):
    every = os.environ.get("TCEMU_ALL_VECTORS") == "1"
    return [fid for fid, m in meta().items() if keep(fid, m) and (every or _sample(fid))]


def _inputs(fid):
    z, m = capture(CAP), meta()[fid]
    args = [z[f"{fid}/{x}"].view(VIEW[t]) for x, t in (("a", m["atype"]), ("b", m["btype"]), ("c", m["dtype"]))]
    kw = {}
    if m["stype"]:
        kw = {k: z[f"{fid}/{k}"].view(VIEW[m["stype"]]) for k in ("scale_a", "scale_b")}
    return m, args, kw, z[f"{fid}/d"]


def _report(got, want, fid):
    dists = json.loads(bytes(capture(CAP)["meta"]).decode())["dists"]
    bad = {d: int((got[i] != want[i]).sum()) for i, d in enumerate(dists) if (got[i] != want[i]).any()}
    assert not bad, f"{fid}: outputs differing from MMA-Sim per distribution: {bad}"


def test_vectors_cover_every_form():
    ids = set(meta())
    pairs = [(a, b) for a in F8F6F4 for b in F8F6F4]
    assert all(f"sm120.f8f6f4.{d}.{a}.{b}" in ids for d in ("f32", "f16") for a, b in pairs)
    assert all(f"sm120.mxf8f6f4.{a}.{b}" in ids and f"sm100.tcgen05.mxf8f6f4.{a}.{b}" in ids for a, b in pairs)
    assert {f"sm100.tcgen05.m{64 if d == 'f32' else 128}.f8f6f4.{d}.{a}.{b}" for d in ("f32", "f16") for a, b in pairs} <= ids
    fp4 = ("mxf4.2x.ue8m0", "mxf4nvf4.2x.ue8m0", "mxf4nvf4.4x.ue8m0", "mxf4nvf4.4x.ue4m3")
    assert all(f"sm120.{k}" in ids and f"sm100.tcgen05.{k}" in ids for k in fp4)
    assert {f"sm100.tcgen05.m{m}.{k}" for m in (64, 128) for k in ("tf32", "f16.f32.f16", "f16.f32.bf16", "f16.f16.f16")} <= ids
    z = capture(CAP)
    d = z["sm120.mxf4nvf4.4x.ue4m3/d"]  # the distributions reach NaN, infinities, +0 and huge results
    assert (d == 0x7FFFFFFF).any() and (d == 0x7F800000).any() and (d == 0).any()


@pytest.mark.parametrize("fid", forms())
def test_value_level(fid):
    m, (a, b, c), kw, want = _inputs(fid)
    got = np.asarray(tcemu.mma(m["spelling"], a, b, c, arch=m["arch"], **kw)).view(want.dtype)
    _report(got, want, fid)


def _sm120_kind(fid, m):
    return m["arch"] == "sm_120" and "kind::" in m["spelling"]


def _container(codes, etype, rng):
    """fp6/fp4 codes in 8-bit containers as PTX places them, with random padding bits."""
    junk = rng.integers(0, 256, codes.shape).astype(np.uint32)
    if etype == "e2m1":
        return (codes.astype(np.uint32) << 2) | (junk & 0xC3)
    if etype in ("e3m2", "e2m3"):
        return codes.astype(np.uint32) | (junk & 0xC0)
    return codes.astype(np.uint32)


@pytest.mark.parametrize("fid", forms(_sm120_kind))
def test_register_level_sm120(fid):
    """Fragments (PTX ISA layouts) and block-scale registers with random selectors: the
    instruction on a warp's registers gives MMA-Sim's D."""
    z, m = capture(CAP), meta()[fid]
    ins = parse(m["spelling"])
    f = tcemu.ptx(m["spelling"], arch="sm_120")
    fa, fb, fc, fd = mma_sync_fragments(ins)
    rng = np.random.default_rng(len(fid))
    A, B = (z[f"{fid}/{x}"].astype(np.uint32) for x in "ab")
    if fa.bits == 8:
        A, B = _container(A, ins.atype, rng), _container(B, ins.btype, rng)
    C = z[f"{fid}/c"].astype(np.uint32)
    T = A.shape[0]
    to_regs = jax.vmap(matrix_to_fragment, in_axes=(0, None))
    na, nb, nc, nd = fa.nregs, fb.nregs, fc.nregs, fd.nregs
    regs = np.concatenate([to_regs(jnp.asarray(x), fr) for x, fr in ((A, fa), (B, fb), (C, fc))], axis=2)
    regs = np.concatenate([regs, rng.integers(0, 2**32, (T, 32, nd + 2), dtype=np.uint32)], axis=2)
    r = np.cumsum([0, na, nb, nc, nd])
    kw = {}
    if ins.scale_vec:
        S, (sa_reg, sb_reg) = ins.scale_vec, (r[4], r[4] + 1)
        bid = {1: rng.integers(0, 4), 2: 2 * rng.integers(0, 2), 4: 0}[S]
        tida, tidb = int(rng.integers(0, 2)), int(rng.integers(0, 4))
        sa, sb = z[f"{fid}/scale_a"].astype(np.uint32), z[f"{fid}/scale_b"].astype(np.uint32)
        for t in range(T):
            for row in range(16):
                lane = 4 * (row % 8) + 2 * tida + row // 8
                word = int(regs[t, lane, sa_reg])
                for j in range(S):
                    word = (word & ~(0xFF << (8 * (bid + j)))) | (int(sa[t, row, j]) << (8 * (bid + j)))
                regs[t, lane, sa_reg] = word
            for n in range(8):
                lane = 4 * n + tidb
                word = int(regs[t, lane, sb_reg])
                for j in range(S):
                    word = (word & ~(0xFF << (8 * (bid + j)))) | (int(sb[t, j, n]) << (8 * (bid + j)))
                regs[t, lane, sb_reg] = word
        kw = dict(scale_a=sa_reg, scale_b=sb_reg, byte_id_a=int(bid), thread_id_a=tida, byte_id_b=int(bid),
                  thread_id_b=tidb)
    out = jax.vmap(lambda x: f(x, a=range(r[0], r[1]), b=range(r[1], r[2]), c=range(r[2], r[3]),
                               d=range(r[3], r[4]), **kw))(jnp.asarray(regs))
    want = np.asarray(to_regs(jnp.asarray(z[f"{fid}/d"].astype(np.uint32)), fd))
    got = np.asarray(out)[:, :, r[3]:r[4]]
    _report(got, want, fid)
    np.testing.assert_array_equal(np.asarray(out)[:, :, r[4]:], regs[:, :, r[4]:])  # scale registers unchanged
