"""Generate AMD MFMA test vectors with MMA-Sim 2.1.1 (``mmasim.amd.MFMA``; Xie et al., arXiv 2511.10909).

MMA-Sim models the CDNA1-3 matrix cores (MI100, MI200, MI300); tcemu cannot run AMD GPUs, so these
vectors are the truth tcemu's AMD presets are tested against (``tests/test_mfma.py``). Run in an
environment with MMA-Sim (not a tcemu dependency)::

    python -m venv /tmp/mmsvenv && . /tmp/mmsvenv/bin/activate
    pip install mmasim==2.1.1 torch numpy
    python experiments/mmasim/generate_amd_vectors.py --out tests/data/mmasim_amd_vectors.npz

Every instruction (MMA-Sim's suffix, per architecture) gets ``--n`` instruction-shaped instances
per input distribution: ``random`` (finite codes of the whole range, or for 32/64-bit inputs normal
values scaled by 2**-20..2**20), ``cancel`` (C nearly cancels A @ B), ``extreme`` (largest and
smallest exponents: float32 overflow and underflow), ``special`` (NaN/Inf elements and C),
``tiny`` (the smallest exponents, zeros among them; C a signed zero or the smallest subnormal),
``subnormal`` (subnormal elements among normal ones). Arrays hold bit patterns (uint8/16/32/64);
the key is ``ARCH|SUFFIX|DIST|part``, part one of a, b, c, d.
"""
from __future__ import annotations

import argparse
import json

import numpy as np
import torch

import mmasim
from mmasim.amd import MFMA
from mmasim.amd.isa_mfma import arch_mfma_suffix

DISTS = ("random", "cancel", "extreme", "special", "tiny", "subnormal")
# (exponent bits, fraction bits, bias)
FMT = {"f16": (5, 10, 15), "bf16": (8, 7, 127), "f32": (8, 23, 127), "f64": (11, 52, 1023),
       "fp8": (4, 3, 8), "bf8": (5, 2, 16)}
NP = {"f16": np.uint16, "bf16": np.uint16, "f32": np.uint32, "f64": np.uint64, "fp8": np.uint8, "bf8": np.uint8}
TORCH = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32, "f64": torch.float64,
         "fp8": torch.float8_e4m3fnuz, "bf8": torch.float8_e5m2fnuz}
TORCH_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def nbits(t):
    e, m, _ = FMT[t]
    return 1 + e + m


def is_special(c, t):
    e, m, _ = FMT[t]
    if t in ("fp8", "bf8"):
        return c == 0x80
    return ((c >> m) & ((1 << e) - 1)) == (1 << e) - 1


def values(c, t):
    """float64 values of codes (NaN/Inf as 0)."""
    e, m, bias = FMT[t]
    c = c.astype(np.uint64)
    s = np.where((c >> np.uint64(e + m)) & np.uint64(1), -1.0, 1.0)
    ef = ((c >> np.uint64(m)) & np.uint64((1 << e) - 1)).astype(np.float64)
    fr = (c & np.uint64((1 << m) - 1)).astype(np.float64)
    v = np.where(ef == 0, fr * 2.0 ** (1 - bias - m), (fr + 2.0 ** m) * 2.0 ** (ef - bias - m))
    return np.where(is_special(c, t), 0.0, s * v)


def rand_codes(rng, shape, n):
    return rng.integers(0, 1 << min(n, 62), shape, dtype=np.uint64) | (
        (rng.integers(0, 2, shape, dtype=np.uint64) << np.uint64(n - 1)) if n > 62 else np.uint64(0))


def from_fields(rng, shape, t, ef):
    e, m, _ = FMT[t]
    sign = rng.integers(0, 2, shape, dtype=np.uint64) << np.uint64(e + m)
    frac = rand_codes(rng, shape, m) if m <= 62 else rng.integers(0, 1 << 52, shape, dtype=np.uint64)
    return sign | (np.asarray(ef, np.uint64) << np.uint64(m)) | frac


def element_codes(t, shape, dist, rng):
    e, m, bias = FMT[t]
    top = (1 << e) - 1
    if dist == "random" and t in ("f32", "f64"):
        v = rng.standard_normal(shape) * 2.0 ** rng.integers(-20, 21, shape)
        codes = v.astype(np.float32).view(np.uint32).astype(np.uint64) if t == "f32" else v.view(np.uint64)
    elif dist == "random":
        codes = rand_codes(rng, shape, nbits(t))
    elif dist == "tiny":
        codes = from_fields(rng, shape, t, rng.integers(0, 2, shape))
        codes = np.where(rng.random(shape) < 0.25, codes & np.uint64(1 << (e + m)), codes)
    elif dist == "extreme":
        hi = top if t in ("fp8", "bf8") else top - 1
        codes = from_fields(rng, shape, t, rng.choice([0, 1, 2, hi - 1, hi], size=shape))
    elif dist == "subnormal":
        mid = rng.integers(bias - 3, bias + 4, shape)
        codes = from_fields(rng, shape, t, np.where(rng.random(shape) < 0.4, 0, mid))
    else:  # special: normal-range codes, then a few NaN/Inf
        codes = from_fields(rng, shape, t, rng.integers(max(1, bias - 6), bias + 7, shape))
    codes = codes.astype(np.uint64)
    spec = is_special(codes, t)
    while spec.any():
        codes[spec] = rand_codes(rng, (int(spec.sum()),), nbits(t))
        spec = is_special(codes, t)
    if dist == "special":
        pick = rng.random(shape) < 0.03
        if t in ("fp8", "bf8"):
            sp = np.full(shape, 0x80, np.uint64)
        else:
            inf = np.uint64(top << m)
            sp = np.where(rng.random(shape) < 0.5, inf, inf | np.uint64(1)) | (
                rng.integers(0, 2, shape, dtype=np.uint64) << np.uint64(e + m))
        codes = np.where(pick, sp, codes)
    return codes.astype(NP[t])


def c_codes(ct, shape, dist, rng, dot):
    np_f = np.float32 if ct == "f32" else np.float64
    v = (rng.standard_normal(shape) * 2.0 ** rng.integers(-6, 7, shape)).astype(np_f)
    if dist == "cancel":
        with np.errstate(over="ignore", invalid="ignore"):
            v = np.where(rng.random(shape) < 0.8, -dot, v).astype(np_f)
    bits = v.view(NP[ct]).copy()
    w = nbits(ct)
    sign = 1 << (w - 1)
    if dist == "tiny":
        pool = np.asarray([0, sign, 1, sign | 1, 2, sign | 3], NP[ct])
        bits = pool[rng.integers(0, len(pool), shape)]
    if dist == "extreme":
        bits = element_codes(ct, shape, "extreme", rng)
    if dist == "subnormal":
        bits = np.where(rng.random(shape) < 0.5, element_codes(ct, shape, "subnormal", rng), bits)
    if dist == "special":
        e, m, _ = FMT[ct]
        inf = ((1 << e) - 1) << m
        pool = np.asarray([inf, inf | sign, inf | 1], NP[ct])
        bits = np.where(rng.random(shape) < 0.1, pool[rng.integers(0, 3, shape)], bits)
    return bits.astype(NP[ct])


def types_of(mfma):
    inv = {v: k for k, v in TORCH.items()}
    at, bt = inv[mfma.a_type], inv[mfma.b_type]
    if mfma.suffix.endswith("xf32"):
        at = bt = "f32"
    return at, bt, inv[mfma.c_type]


def to_torch(bits, t):
    return torch.from_numpy(bits.view({1: np.uint8, 2: np.int16, 4: np.int32, 8: np.int64}[bits.itemsize])
                            .copy()).view(TORCH[t])


def instance(mfma, dist, rng):
    at, bt, ct = types_of(mfma)
    M, N, K = mfma.m, mfma.n, mfma.k
    a = element_codes(at, (M, K), dist, rng)
    b = element_codes(bt, (K, N), dist, rng)
    dot = values(a, at) @ values(b, bt)
    c = c_codes(ct, (M, N), dist, rng, dot)
    d = mfma(to_torch(a, at), to_torch(b, bt), to_torch(c, ct))
    d = d.contiguous().view(TORCH_INT[d.element_size()]).numpy().view(NP[ct]).copy()
    return a, b, c, d


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--n", type=int, default=2, help="instances per instruction and distribution")
    p.add_argument("--seed", type=int, default=37)
    args = p.parse_args()
    rng = np.random.default_rng(args.seed)
    out = {}
    for arch, suffixes in arch_mfma_suffix.items():
        for suffix in dict.fromkeys(suffixes):
            mfma = MFMA(arch, suffix)
            for dist in DISTS:
                parts = [instance(mfma, dist, rng) for _ in range(args.n)]
                for name, arrs in zip("abcd", zip(*parts)):
                    out[f"{arch}|{suffix}|{dist}|{name}"] = np.stack(arrs)
            print(arch, suffix, flush=True)
    meta = {"mmasim": getattr(mmasim, "__version__", "2.1.1"), "torch": torch.__version__, "seed": args.seed,
            "n": args.n, "dists": DISTS}
    np.savez_compressed(args.out, meta=np.asarray(json.dumps(meta)), **out)


if __name__ == "__main__":
    main()
