"""Generate MMA test vectors with MMA-Sim (Xie et al., arXiv 2511.10909; pip package ``mmasim``).

MMA-Sim is an independent arithmetic model of NVIDIA tensor cores that its authors validated on
B200 and RTX 5090 hardware. tcemu cannot run those GPUs, so for the Blackwell forms (sm_120
``mma.sync`` ``.kind::f8f6f4`` and its block-scaled kinds, sm_100 ``tcgen05.mma``) these vectors are
the truth tcemu is tested against; for the forms tcemu already had (Volta to Hopper ``mma.sync``,
Hopper ``wgmma``, B200 ``mma.sync``) they are a cross-check beside tcemu's own hardware captures.

Run in an environment with MMA-Sim (not a tcemu dependency)::

    python -m venv /tmp/mmsvenv && . /tmp/mmsvenv/bin/activate
    pip install mmasim==2.1.1 torch numpy
    python experiments/mmasim/generate_vectors.py --out tests/data/mmasim_vectors.npz

Every form gets one instruction-shaped instance per input distribution (stacked on a leading
axis): ``random`` (finite codes of the whole range), ``cancel`` (C nearly cancels A @ B, so the
truncated low bits show), ``extreme`` (largest and smallest exponents, scale extremes, float32
overflow and underflow), ``special`` (NaN/Inf elements where the format has them, NaN scale
codes, NaN/Inf C), ``tiny`` (the smallest exponents, zeros among them, C a signed zero or the
smallest subnormal: results that underflow, and zero terms that set the alignment). Arrays hold bit patterns: element codes in the low bits of uint8 (fp4/fp6
unpacked, one per byte, as tcemu's value level takes them), uint16/uint32 for 16/32-bit types.

Conventions met when feeding MMA-Sim 2.1.1 (recorded, checked by tests/test_mmasim.py):
under kind::f8f6f4/mxf8f6f4 it reads an e2m1 element from bits 5:2 of its byte and fp6 from
bits 5:0; under kind::mxf4/mxf4nvf4 it takes two e2m1 per byte with element 2j in the high
nibble; ue4m3 scales are e4m3 codes with the sign bit ignored.
"""
from __future__ import annotations

import argparse
import json

import numpy as np
import torch

import mmasim
from mmasim import nv_ptx

DISTS = ("random", "cancel", "extreme", "special", "tiny")
F8F6F4 = ("e4m3", "e5m2", "e3m2", "e2m3", "e2m1")
# (exponent bits, fraction bits, has inf, has nan)
FMT = {"e4m3": (4, 3), "e5m2": (5, 2), "e3m2": (3, 2), "e2m3": (2, 3), "e2m1": (2, 1),
       "f16": (5, 10), "bf16": (8, 7), "tf32": (8, 10)}
TORCH = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2, "f16": torch.float16, "bf16": torch.bfloat16,
         "tf32": torch.float32, "f32": torch.float32}
STORE = {"f16": np.uint16, "bf16": np.uint16, "tf32": np.uint32, "f32": np.uint32}


def nbits(t):
    e, m = FMT[t]
    return 1 + e + m


def is_special(codes, t):
    """NaN/Inf codes of a format (fp6/fp4 have none)."""
    e, m = FMT[t]
    c = codes.astype(np.int64)
    ef = (c >> m) & ((1 << e) - 1)
    fr = c & ((1 << m) - 1)
    if t in ("e3m2", "e2m3", "e2m1"):
        return np.zeros(c.shape, bool)
    if t == "e4m3":
        return (ef == 15) & (fr == 7)
    return ef == (1 << e) - 1


def element_codes(t, shape, dist, rng):
    """Bit patterns (uint32, in the low bits) of element type ``t``."""
    e, m = FMT[t]
    n = nbits(t)
    if dist == "tiny":  # the smallest exponent fields, a quarter of the elements zero
        codes = (rng.integers(0, 2, shape) << (n - 1)) | (rng.integers(0, 2, shape) << m) | rng.integers(0, 1 << m, shape)
        codes = np.where(rng.random(shape) < 0.25, codes & (1 << (n - 1)), codes)
    elif dist == "extreme":  # largest / smallest exponent fields, random fraction and sign
        ef = rng.choice([0, 1, (1 << e) - 2, (1 << e) - 1 if t in ("e4m3", "e3m2", "e2m3", "e2m1") else (1 << e) - 2],
                        size=shape)
        codes = (rng.integers(0, 2, shape) << (n - 1)) | (ef << m) | rng.integers(0, 1 << m, shape)
    else:
        codes = rng.integers(0, 1 << n, shape)
    codes = codes.astype(np.uint32)
    spec = is_special(codes, t)
    if dist != "special":  # finite elements only
        while spec.any():
            codes[spec] = rng.integers(0, 1 << n, int(spec.sum())).astype(np.uint32)
            spec = is_special(codes, t)
    elif t not in ("e3m2", "e2m3", "e2m1"):  # a few NaN/Inf
        pick = rng.random(shape) < 0.03
        top = ((1 << e) - 1) << m
        sp = np.where(rng.random(shape) < 0.5, top | ((1 << m) - 1), top if t != "e4m3" else top | 7)
        codes = np.where(pick, sp | (rng.integers(0, 2, shape) << (n - 1)), codes)
    if t == "tf32":  # a float32 register: the low 13 bits (random) are dropped by the tensor core
        codes = (codes.astype(np.uint32) << 13) | rng.integers(0, 1 << 13, shape).astype(np.uint32)
    return codes.astype(np.uint32)


def values(codes, t):
    """float64 values of element codes (for building the 'cancel' C)."""
    e, m = FMT[t]
    c = (codes >> 13 if t == "tf32" else codes).astype(np.int64)
    s = np.where((c >> (e + m)) & 1, -1.0, 1.0)
    ef = (c >> m) & ((1 << e) - 1)
    fr = c & ((1 << m) - 1)
    bias = (1 << (e - 1)) - 1
    v = np.where(ef == 0, fr * 2.0 ** (1 - bias - m), (fr + (1 << m)) * 2.0 ** (ef - bias - m))
    return np.nan_to_num(s * v)


def scale_codes(st, shape, dist, rng):
    if st == "ue8m0":
        if dist == "tiny":
            c = rng.integers(0, 40, shape)
        elif dist == "extreme":
            c = rng.choice([0, 1, 2, 64, 127, 190, 253, 254], size=shape)
        else:
            c = rng.integers(117, 138, shape)
        if dist == "special":
            c = np.where(rng.random(shape) < 0.1, 0xFF, c)
    else:  # ue4m3: e4m3 codes, sign bit random (ignored)
        if dist == "tiny":
            c = rng.integers(0x00, 0x10, shape)
        elif dist == "extreme":
            c = rng.choice([0x00, 0x01, 0x07, 0x08, 0x38, 0x77, 0x7E], size=shape)
        else:
            c = rng.integers(0x08, 0x78, shape)
        if dist == "special":
            c = np.where(rng.random(shape) < 0.1, 0x7F, c)
        c = c | (rng.integers(0, 2, shape) << 7)
    return c.astype(np.uint8)


def scale_values(codes, st):
    """float64 values of scale codes (NaN as 0: only used to build the 'cancel' C)."""
    c = codes.astype(np.int64)
    if st == "ue8m0":
        return np.where(c == 0xFF, 0.0, 2.0 ** (c - 127))
    return np.where((c & 0x7F) == 0x7F, 0.0, values(c & 0x7F, "e4m3"))


def c_bits(ct, shape, dist, rng, dot=None):
    """C bit patterns (uint32 for f32, uint16 for f16)."""
    np_t = np.float32 if ct == "f32" else np.float16
    v = (rng.standard_normal(shape) * 2.0 ** rng.integers(-6, 7, shape)).astype(np_t)
    if dist == "cancel" and dot is not None:
        with np.errstate(over="ignore", invalid="ignore"):
            v = np.where(rng.random(shape) < 0.8, -dot, v).astype(np_t)
    bits = v.view(np.uint32 if ct == "f32" else np.uint16).copy()
    if dist == "tiny":  # zeros of both signs and the smallest subnormals
        pool = [0, 0x80000000, 1, 0x80000001] if ct == "f32" else [0, 0x8000, 1, 0x8001]
        bits = np.asarray(pool, bits.dtype)[rng.integers(0, len(pool), shape)]
    if dist == "extreme":
        pool = ([0x7F7FFFFF, 0xFF7FFFFF, 0x00000001, 0x80000001, 0x00800000, 0x7F000000, 0, 0x80000000]
                if ct == "f32" else [0x7BFF, 0xFBFF, 0x0001, 0x8001, 0x0400, 0x7800, 0, 0x8000])
        pick = rng.random(shape) < 0.5
        bits = np.where(pick, np.asarray(pool, bits.dtype)[rng.integers(0, len(pool), shape)], bits)
    if dist == "special":
        pool = [0x7FC00000, 0x7F800000, 0xFF800000, 0x80000000] if ct == "f32" else [0x7E00, 0x7C00, 0xFC00, 0x8000]
        pick = rng.random(shape) < 0.2
        bits = np.where(pick, np.asarray(pool, bits.dtype)[rng.integers(0, len(pool), shape)], bits)
    return bits.astype(np.uint32 if ct == "f32" else np.uint16)


def to_torch(codes, t, *, container=False, packed=False):
    """MMA-Sim's input for element codes: torch float dtypes where torch has them, otherwise
    uint8 (fp6 in bits 5:0, fp4 in bits 5:2 under f8f6f4 kinds; packed fp4 pairs under mxf4)."""
    if packed:  # (..., K) -> (..., K/2): element 2j in the high nibble
        c = codes.astype(np.uint8)
        return torch.from_numpy(((c[..., 0::2] << 4) | c[..., 1::2]).copy())
    if t in ("e3m2", "e2m3", "e2m1"):
        c = codes.astype(np.uint8)
        return torch.from_numpy(c << 2 if t == "e2m1" else c.copy())
    if t in ("e4m3", "e5m2"):
        return torch.from_numpy(codes.astype(np.uint8)).view(TORCH[t])
    if t in ("f16", "bf16"):
        return torch.from_numpy(codes.astype(np.uint16).view(np.int16)).view(TORCH[t])
    return torch.from_numpy(codes.astype(np.uint32).view(np.int32)).view(torch.float32)


def from_torch(d, dt):
    if dt == "f16":
        return d.view(torch.int16).numpy().view(np.uint16).copy()
    return d.view(torch.int32).numpy().view(np.uint32).copy()


def c_torch(bits, ct):
    if ct == "f16":
        return torch.from_numpy(bits.view(np.int16)).view(torch.float16)
    return torch.from_numpy(bits.view(np.int32)).view(torch.float32)


def forms():
    """(id, tcemu arch, tcemu spelling, MMA-Sim class, MMA-Sim arch, MMA-Sim form, M, N, K, a, b, d, stype, scale_vec)."""
    out = []
    for d in ("f32", "f16"):
        for a in F8F6F4:
            for b in F8F6F4:
                out.append((f"sm120.f8f6f4.{d}.{a}.{b}", "sm_120",
                            f"mma.sync.aligned.m16n8k32.row.col.kind::f8f6f4.{d}.{a}.{b}.{d}",
                            "MMA", "RTX Blackwell", f"m16n8k32.kind::f8f6f4.{d}.{a}.{b}.{d}", 16, 8, 32, a, b, d, None, None))
                m = 64 if d == "f32" else 128  # both M, without doubling the file
                out.append((f"sm100.tcgen05.m{m}.f8f6f4.{d}.{a}.{b}", "sm_100", "tcgen05.mma.cta_group::1.kind::f8f6f4",
                            "TCGen05MMA", "Blackwell", f"m{m}n8k32.kind::f8f6f4.{d}.{a}.{b}", m, 8, 32, a, b, d, None, None))
    for a in F8F6F4:
        for b in F8F6F4:
            out.append((f"sm120.mxf8f6f4.{a}.{b}", "sm_120",
                        f"mma.sync.aligned.m16n8k32.row.col.kind::mxf8f6f4.block_scale.scale_vec::1X.f32.{a}.{b}.f32.ue8m0",
                        "MMABlockScale", "RTX Blackwell", f"m16n8k32.kind::mxf8f6f4.block32.f32.{a}.{b}.f32.ue8m0",
                        16, 8, 32, a, b, "f32", "ue8m0", 1))
            out.append((f"sm100.tcgen05.mxf8f6f4.{a}.{b}", "sm_100", "tcgen05.mma.cta_group::1.kind::mxf8f6f4.block_scale",
                        "TCGen05MMABlockScale", "Blackwell", f"m128n8k32.kind::mxf8f6f4.block32.f32.{a}.{b}.ue8m0",
                        128, 8, 32, a, b, "f32", "ue8m0", 1))
    for kind, vec, st in (("mxf4", 2, "ue8m0"), ("mxf4nvf4", 2, "ue8m0"), ("mxf4nvf4", 4, "ue8m0"), ("mxf4nvf4", 4, "ue4m3")):
        blk = 64 // vec
        out.append((f"sm120.{kind}.{vec}x.{st}", "sm_120",
                    f"mma.sync.aligned.m16n8k64.row.col.kind::{kind}.block_scale.scale_vec::{vec}X.f32.e2m1.e2m1.f32.{st}",
                    "MMABlockScale", "RTX Blackwell", f"m16n8k64.kind::{kind}.block{blk}.f32.e2m1.e2m1.f32.{st}",
                    16, 8, 64, "e2m1", "e2m1", "f32", st, vec))
        out.append((f"sm100.tcgen05.{kind}.{vec}x.{st}", "sm_100",
                    f"tcgen05.mma.cta_group::1.kind::{kind}.block_scale.block{blk}",
                    "TCGen05MMABlockScale", "Blackwell", f"m128n8k64.kind::{kind}.block{blk}.f32.e2m1.e2m1.{st}",
                    128, 8, 64, "e2m1", "e2m1", "f32", st, vec))
    for m in (64, 128):
        out.append((f"sm100.tcgen05.m{m}.tf32", "sm_100", "tcgen05.mma.cta_group::1.kind::tf32", "TCGen05MMA", "Blackwell",
                    f"m{m}n8k8.kind::tf32.f32.tf32.tf32", m, 8, 8, "tf32", "tf32", "f32", None, None))
        for a, d in (("f16", "f32"), ("bf16", "f32"), ("f16", "f16")):
            out.append((f"sm100.tcgen05.m{m}.f16.{d}.{a}", "sm_100", "tcgen05.mma.cta_group::1.kind::f16", "TCGen05MMA",
                        "Blackwell", f"m{m}n8k16.kind::f16.{d}.{a}.{a}", m, 8, 16, a, a, d, None, None))
    # forms tcemu had before (a cross-check): mma.sync Volta..Blackwell and Hopper wgmma
    legacy = [("sm_70", "Volta", "m8n8k4", "f32", "f16", "f32"), ("sm_70", "Volta", "m8n8k4", "f16", "f16", "f16"),
              ("sm_75", "Turing", "m16n8k8", "f32", "f16", "f32"), ("sm_75", "Turing", "m16n8k8", "f16", "f16", "f16"),
              ("sm_80", "Ampere", "m16n8k16", "f32", "f16", "f32"), ("sm_80", "Ampere", "m16n8k16", "f32", "bf16", "f32"),
              ("sm_80", "Ampere", "m16n8k8", "f32", "tf32", "f32"), ("sm_80", "Ampere", "m16n8k4", "f32", "tf32", "f32"),
              ("sm_89", "Ada Lovelace", "m16n8k32", "f32", "e4m3", "f32"), ("sm_89", "Ada Lovelace", "m16n8k32", "f16", "e5m2", "f16"),
              ("sm_90", "Hopper", "m16n8k16", "f32", "f16", "f32"), ("sm_90", "Hopper", "m16n8k16", "f16", "f16", "f16"),
              ("sm_90", "Hopper", "m16n8k16", "f32", "bf16", "f32"), ("sm_90", "Hopper", "m16n8k8", "f32", "tf32", "f32"),
              ("sm_100", "Blackwell", "m16n8k16", "f32", "f16", "f32"), ("sm_100", "Blackwell", "m16n8k16", "f32", "bf16", "f32"),
              ("sm_100", "Blackwell", "m16n8k8", "f32", "tf32", "f32"),
              ("sm_120", "RTX Blackwell", "m16n8k16", "f32", "f16", "f32"), ("sm_120", "RTX Blackwell", "m16n8k16", "f32", "bf16", "f32"),
              ("sm_120", "RTX Blackwell", "m16n8k8", "f32", "tf32", "f32"), ("sm_120", "RTX Blackwell", "m16n8k32", "f32", "e4m3", "f32"),
              ("sm_120", "RTX Blackwell", "m16n8k32", "f16", "e5m2", "f16")]
    for arch, sim_arch, shape, d, a, c in legacy:
        mm, nn, kk = (int(x) for x in shape[1:].replace("n", " ").replace("k", " ").split())
        b = "e4m3" if a == "e5m2" else a
        lay = "row.row" if shape == "m8n8k4" else "row.col"
        out.append((f"{arch}.mma.{shape}.{d}.{a}.{b}.{c}", arch, f"mma.sync.aligned.{shape}.{lay}.{d}.{a}.{b}.{c}",
                    "MMA", sim_arch, f"{shape}.{d}.{a}.{b}.{c}", mm, nn, kk, a, b, d, None, None))
    for d, a, k in (("f32", "f16", 16), ("f16", "f16", 16), ("f32", "bf16", 16), ("f32", "tf32", 8), ("f32", "e4m3", 32),
                    ("f16", "e5m2", 32)):
        out.append((f"sm_90.wgmma.m64n8k{k}.{d}.{a}", "sm_90", f"wgmma.mma_async.sync.aligned.m64n8k{k}.{d}.{a}.{a}",
                    "WGMMA", "Hopper", f"m64n8k{k}.{d}.{a}.{a}", 64, 8, k, a, a, d, None, None))
    return out


def generate(seed: int):
    rng = np.random.default_rng(seed)
    arrays, meta = {}, {}
    for (fid, arch, spelling, cls, sim_arch, sim_form, M, N, K, at, bt, dt, st, vec) in forms():
        op = getattr(nv_ptx, cls)(sim_arch, sim_form)
        packed = cls.endswith("BlockScale") and K == 64
        A, B, C, D, SA, SB = [], [], [], [], [], []
        for dist in DISTS:
            a = element_codes(at, (M, K), dist, rng)
            b = element_codes(bt, (K, N), dist, rng)
            va, vb = values(a, at), values(b, bt)
            sa = sb = None
            if st is not None:
                sa = scale_codes(st, (M, vec), dist, rng)
                sb = scale_codes(st, (vec, N), dist, rng)
                va = va * np.repeat(scale_values(sa, st), K // vec, axis=1)
                vb = vb * np.repeat(scale_values(sb, st), K // vec, axis=0)
            with np.errstate(over="ignore", invalid="ignore"):
                dot = np.nan_to_num(va @ vb)
            c = c_bits(dt, (M, N), dist, rng, dot)
            ta = to_torch(a, at, packed=packed)
            tb = to_torch(b.T, bt, packed=packed).T if packed else to_torch(b, bt)
            args = [ta, tb, c_torch(c, dt)]
            if st is not None:
                sdt = torch.float8_e8m0fnu if st == "ue8m0" else torch.float8_e4m3fn
                args += [torch.from_numpy(sa).view(sdt), torch.from_numpy(sb).view(sdt)]
            d = from_torch(op(*args), dt)
            A.append(a), B.append(b), C.append(c), D.append(d)
            if st is not None:
                SA.append(sa), SB.append(sb)
        store = np.uint8 if at in F8F6F4 else STORE[at]
        arrays[f"{fid}/a"] = np.stack(A).astype(store)
        arrays[f"{fid}/b"] = np.stack(B).astype(np.uint8 if bt in F8F6F4 else STORE[bt])
        arrays[f"{fid}/c"] = np.stack(C)
        arrays[f"{fid}/d"] = np.stack(D)
        if st is not None:
            arrays[f"{fid}/scale_a"] = np.stack(SA)
            arrays[f"{fid}/scale_b"] = np.stack(SB)
        meta[fid] = dict(arch=arch, spelling=spelling, atype=at, btype=bt, dtype=dt, stype=st, M=M, N=N, K=K,
                         mmasim=f"{cls}({sim_arch!r}, {sim_form!r})")
    return arrays, meta


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="tests/data/mmasim_vectors.npz")
    p.add_argument("--seed", type=int, default=2026)
    args = p.parse_args()
    arrays, meta = generate(args.seed)
    info = dict(meta=meta, dists=DISTS, seed=args.seed, mmasim=getattr(mmasim, "__version__", "2.1.1"),
                torch=torch.__version__, command=f"python experiments/mmasim/generate_vectors.py --out {args.out} "
                                                 f"--seed {args.seed}")
    np.savez_compressed(args.out, meta=np.frombuffer(json.dumps(info).encode(), np.uint8), **arrays)
    print(f"{len(meta)} forms x {len(DISTS)} distributions -> {args.out}")


if __name__ == "__main__":
    main()
