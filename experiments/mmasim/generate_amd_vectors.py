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

Three more distributions stress an exact adder (CDNA1's ``MMA_E_FDPA``; f16/bf16 only, asked for
with ``--dists``): ``exact_cancel`` (elements of the whole range; C is minus the largest product of
the first block, or of two, wherever that is a binary32 number: the rest is what is left),
``ties`` (the first block's k = 0 product is a power of two exactly half an ulp of C, above or
below it, C's ulp anywhere from 2**-149 to 2**104; the other products of the block are zero, cancel
in pairs, or are 2**-12 .. 2**-40 of it; later blocks are zero) and ``wide`` (elements of the whole
range and C any finite binary32: overflow to inf, underflow to subnormals and signed zeros).
``--arch`` and ``--types`` pick the instructions (``--arch CDNA1 --types f16 bf16``).
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
STRESS = ("exact_cancel", "ties", "wide")  # for exact adders (f16/bf16 inputs)
F32_MAX = float(np.finfo(np.float32).max)
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


def f32_exact(v):
    """Whether float64 values are binary32 numbers (finite)."""
    with np.errstate(over="ignore"):
        return np.isfinite(v) & (v.astype(np.float32).astype(np.float64) == v)


def f32_bits(v):
    return np.asarray(v, np.float64).astype(np.float32).view(np.uint32)


def exact_cancel(t, M, N, K, L, rng):
    """A, B of the whole range; C minus the first block's largest binary32 product (a quarter of
    the time minus the sum of the two largest, where that sum is a binary32 number)."""
    a, b = element_codes(t, (M, K), "random", rng), element_codes(t, (K, N), "random", rng)
    p = values(a, t)[:, None, :L] * values(b, t).T[None, :, :L]  # (M, N, L), exact in float64
    p = np.where(f32_exact(p), p, 0.0)
    order = np.argsort(-np.abs(p), axis=-1)
    first = np.take_along_axis(p, order[..., :1], -1)[..., 0]
    two = first + np.take_along_axis(p, order[..., 1:2], -1)[..., 0]
    target = np.where((rng.random((M, N)) < 0.25) & f32_exact(two), two, first)
    c = np.where(target != 0, f32_bits(-target), c_codes("f32", (M, N), "random", rng, None))
    return a, b, c.astype(np.uint32)


def _pow2(t, e, sign):
    """Codes of +-2**e in format t (e within its range, subnormals included)."""
    _, m, bias = FMT[t]
    e = np.asarray(e, np.int64)
    field = np.where(e >= 1 - bias, (e + bias) << m, 1 << np.maximum(e - (1 - bias - m), 0))
    return (field | (np.asarray(sign, np.int64) << (nbits(t) - 1))).astype(np.uint64)


def ties(t, M, N, K, L, rng):
    """The first block's k = 0 product exactly half an ulp of C; the rest of the block decides."""
    e, m, bias = FMT[t]
    lo, hi = 1 - bias - m, (1 << e) - 2 - bias  # exponents of elements (subnormal 2**lo .. 2**hi)
    x, y = rng.integers(lo, hi + 1, M), rng.integers(lo, hi + 1, N)
    tc = x[:, None] + y[None, :] + 1  # C's ulp exponent where -149 .. 104 (else C = 1: no tie)
    ok = (tc >= -149) & (tc <= 104)
    a = np.zeros((M, K), np.uint64)
    b = element_codes(t, (K, N), "random", rng).astype(np.uint64)
    a[:, 0], b[0] = _pow2(t, x, rng.integers(0, 2, M)), _pow2(t, y, rng.integers(0, 2, N))
    mode = rng.integers(0, 3, M)  # per row: the rest zero (an exact tie), tiny, or cancelling in pairs
    for k in range(1, L):
        d = rng.integers(12, 41, M)
        small = np.clip(x - d, lo, hi)
        frac = rng.integers(0, 1 << m, M).astype(np.uint64)
        tiny = _pow2(t, small, rng.integers(0, 2, M)) | np.where(small - lo >= m, frac, 0).astype(np.uint64)
        a[:, k] = np.where(mode == 0, 0, np.where((mode == 2) & (k % 2 == 0), a[:, k - 1], tiny))
        if k % 2 == 0:  # b[k] = -b[k - 1]: products k - 1 and k cancel in rows of mode 2
            b[k] = b[k - 1] ^ np.uint64(1 << (nbits(t) - 1))
    pa, pb = values(a, t)[:, 0], values(b, t)[0]
    p0 = pa[:, None] * pb[None, :]
    S = np.where(rng.random((M, N)) < 0.25, 1 << 23, rng.integers(1, 1 << 24, (M, N)))
    S = np.where((tc > -149) & (S < (1 << 23)), S + (1 << 23), S)  # ulp 2**tc: normal unless at 2**-149
    sign = np.where(rng.random((M, N)) < 0.5, 1.0, -1.0)
    cv = sign * S * np.exp2(np.clip(tc, -149, 104).astype(np.float64))
    # C a power of two and p0 of the other sign: C doubled, so that p0 is half the spacing below it
    cv = np.where((S == 1 << 23) & (p0 * cv < 0) & (tc < 104), 2 * cv, cv)
    # left out: the two ties MMA-Sim's float64 decides wrongly (experiments/mmasim/README.md):
    # just below 2**-126 and just below the overflow threshold, C the binade's end, p0 its sign
    artefact = ((np.abs(cv) == 2.0**-126) & (p0 * cv < 0)) | ((np.abs(cv) == F32_MAX) & (p0 * cv > 0))
    cv = np.where(ok & ~artefact, cv, np.where(ok, cv / 2, 1.0))
    return a.astype(NP[t]), b.astype(NP[t]), f32_bits(cv)


def wide(t, M, N, K, L, rng):
    """Elements of the whole range, C any finite binary32."""
    c = element_codes("f32", (M, N), "random", rng).astype(np.uint32)
    return element_codes(t, (M, K), "random", rng), element_codes(t, (K, N), "random", rng), c


def instance(mfma, dist, rng):
    at, bt, ct = types_of(mfma)
    M, N, K = mfma.m, mfma.n, mfma.k
    if dist in STRESS:
        assert at == bt and at in ("f16", "bf16") and ct == "f32", f"{dist} is for f16/bf16 MFMAs"
        L = min(K, 4 if at == "f16" else 2)
        a, b, c = {"exact_cancel": exact_cancel, "ties": ties, "wide": wide}[dist](at, M, N, K, L, rng)
        return run(mfma, a, b, c, at, bt, ct)
    a = element_codes(at, (M, K), dist, rng)
    b = element_codes(bt, (K, N), dist, rng)
    dot = values(a, at) @ values(b, bt)
    c = c_codes(ct, (M, N), dist, rng, dot)
    return run(mfma, a, b, c, at, bt, ct)


def run(mfma, a, b, c, at, bt, ct):
    d = mfma(to_torch(a, at), to_torch(b, bt), to_torch(c, ct))
    d = d.contiguous().view(TORCH_INT[d.element_size()]).numpy().view(NP[ct]).copy()
    return a, b, c, d


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--n", type=int, default=2, help="instances per instruction and distribution")
    p.add_argument("--seed", type=int, default=37)
    p.add_argument("--arch", nargs="*", help="MMA-Sim architectures (CDNA1, CDNA2, CDNA3); default all")
    p.add_argument("--types", nargs="*", help="input types (f16, bf16, ...); default all")
    p.add_argument("--dists", nargs="*", default=list(DISTS), choices=DISTS + STRESS)
    args = p.parse_args()
    rng = np.random.default_rng(args.seed)
    out = {}
    for arch, suffixes in arch_mfma_suffix.items():
        if args.arch and arch not in args.arch:
            continue
        for suffix in dict.fromkeys(suffixes):
            mfma = MFMA(arch, suffix)
            if args.types and types_of(mfma)[0] not in args.types:
                continue
            for dist in args.dists:
                parts = [instance(mfma, dist, rng) for _ in range(args.n)]
                for name, arrs in zip("abcd", zip(*parts)):
                    out[f"{arch}|{suffix}|{dist}|{name}"] = np.stack(arrs)
            print(arch, suffix, flush=True)
    meta = {"mmasim": getattr(mmasim, "__version__", "2.1.1"), "torch": torch.__version__, "seed": args.seed,
            "n": args.n, "dists": list(args.dists)}
    np.savez_compressed(args.out, meta=np.asarray(json.dumps(meta)), **out)


if __name__ == "__main__":
    main()
