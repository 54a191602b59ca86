"""Dot-product cases for the MATLAB tensor-core toolbox cross-check, with MMA-Sim 2.1.1's results.

Each case is one output element of an AMD MFMA: a row of A and a column of B (K elements, bit
patterns), a binary32 C and MMA-Sim's binary32 D. Two sources:

* ``vec:<dist>``: elements picked from tcemu's MMA-Sim vectors (tests/data/mmasim_amd_vectors.npz;
  up to ``--per-instance`` random (m, n) positions of each of the two instances per distribution);
* ``own:<dist>:K<k>``: this script's inputs (``--seed``), K = 1 and 2 times the instruction's K
  (so 2 to 8 of the model's blocks), distributions ``random``, ``cancel``, ``extreme`` and
  ``align`` (products over ~40 binades, C 30 binades either side of the largest product: the
  truncation and flooring boundaries of the two-stage adders); MMA-Sim runs them here.

Writes ``<work>/cases.npz`` and, for the Octave driver (run_toolbox.m), ``<work>/index.txt`` and
one ``<group>.in`` per group (float64 values of A rows, B columns and C; xf32 elements truncated to
tf32, as MMA-Sim and tcemu read them and as the toolbox's CPFloat set-up would round them).
Run with MMA-Sim's environment (numpy, torch, mmasim==2.1.1)::

    python experiments/matlab_toolbox/make_cases.py --work /tmp/mtc-work --seed 2027
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
from mmasim.amd import MFMA
from mmasim.arithmetic import fdpa, ftz_mul_add

# (exponent bits, fraction bits, bias, has inf/NaN codes)
FMT = {"f16": (5, 10, 15, True), "bf16": (8, 7, 127, True), "xf32": (8, 23, 127, True),
       "fp8": (4, 3, 8, False), "bf8": (5, 2, 16, False)}
NP = {"f16": np.uint16, "bf16": np.uint16, "xf32": np.uint32, "fp8": np.uint8, "bf8": np.uint8}
TORCH = {"f16": torch.float16, "bf16": torch.bfloat16, "xf32": torch.float32,
         "fp8": torch.float8_e4m3fnuz, "bf8": torch.float8_e5m2fnuz}
TOOLBOX_FMT = {"f16": "fp16", "bf16": "bf16", "xf32": "xf32", "fp8": "fp8-e4m3", "bf8": "fp8-e5m2"}
MODEL = {"CDNA1": "MI100MC", "CDNA2": "MI250MC", "CDNA3": "MI300XMC"}
# Minimal reproductions of the disagreements (README.md explains each): name, generation, MMA-Sim
# suffix, element type, nonzero (k, a_k, b_k) of a K-long row and column, C. (A CDNA3 f16/bf16
# block of 8 whose products are all zero stops the toolbox under Octave, so the one-block forms
# f32_32x32x8_* carry the CDNA3 reproductions that need zeros.)
REPROS = [
    ("negative_product_overflow", "CDNA3", "f32_32x32x8_bf16", "bf16", [(0, 2.0 ** 127, -2.0)], 0.0),
    ("negative_product_overflow", "CDNA2", "f32_16x16x8bf16", "bf16", [(0, 2.0 ** 127, -2.0)], 0.0),
    ("inf_not_carried_to_next_block", "CDNA3", "f32_16x16x16_bf16", "bf16",
     [(0, 1.5 * 2.0 ** 127, 1.0), (1, 1.5 * 2.0 ** 127, 1.0), (8, 1.0, 1.0)], 0.0),
    ("wide_accumulator_between_blocks", "CDNA1", "f32_16x16x8bf16", "bf16",
     [(0, 2.0 ** 127, 4.0), (2, 2.0 ** 127, -4.0), (3, 1.0, 1.0)], 0.0),
    ("bf16_pairs_not_quads", "CDNA2", "f32_16x16x8bf16", "bf16", [(0, 2.0 ** -12, 2.0 ** -12), (2, 2.0 ** -12, 2.0 ** -12)], 1.0),
    ("all_products_zero_octave_error", "CDNA3", "f32_32x32x8_f16", "f16", [(0, 1.0, 0.0), (1, 0.0, 1.0)], 1.0),
    ("product_sum_31_bits_below_c", "CDNA3", "f32_32x32x8_f16", "f16",
     [(0, 2.0 ** -4, 2.0 ** -4), (1, 2.0 ** -12, 2.0 ** -13), (2, 2.0 ** -16, 2.0 ** -16)], -1.0),
    ("product_sum_31_bits_below_c", "CDNA3", "f32_16x16x32_bf8_bf8", "bf8",
     [(0, 2.0 ** -4, 2.0 ** -4), (2, 2.0 ** -12, 2.0 ** -13), (4, 2.0 ** -16, 2.0 ** -16)], -1.0),
]
VEC_DISTS = ("random", "cancel", "extreme", "special", "tiny", "subnormal")
OWN_DISTS = ("random", "cancel", "extreme", "align")


def elem_type(suffix: str) -> str | None:
    """The (common) A/B type of an MMA-Sim suffix the toolbox models, else None (f32/f64 FMA
    chains, and fp8 x bf8: the toolbox takes one input format for A and B)."""
    if suffix.endswith(("fp8_fp8", "bf8_bf8")):
        return suffix[-3:]
    for t in ("xf32", "bf16_1k", "bf16", "f16"):
        if suffix.endswith(t):
            return t.split("_")[0]
    return None


def forms(z):
    out = []
    for key in z.files:
        if key == "meta" or not key.endswith("|random|a"):
            continue
        gen, suffix = key.split("|")[:2]
        if elem_type(suffix):
            out.append((gen, suffix))
    return sorted(set(out))


def decode(codes, t):
    """float64 values of element codes (inf/NaN where the format has them; xf32 truncated to tf32)."""
    e, m, bias, ieee = FMT[t]
    c = codes.astype(np.uint64)
    if t == "xf32":
        c = c & np.uint64(0xFFFFE000)
        return c.astype(np.uint32).view(np.float32).astype(np.float64)
    s = np.where((c >> np.uint64(e + m)) & np.uint64(1), -1.0, 1.0)
    ef = ((c >> np.uint64(m)) & np.uint64((1 << e) - 1)).astype(np.int64)
    fr = (c & np.uint64((1 << m) - 1)).astype(np.float64)
    v = np.where(ef == 0, fr * 2.0 ** (1 - bias - m), (fr + 2.0 ** m) * np.ldexp(1.0, ef - bias - m))
    v = s * v
    if ieee:
        top = ef == (1 << e) - 1
        v = np.where(top & (fr == 0), s * np.inf, np.where(top, np.nan, v))
    else:
        v = np.where(c == np.uint64(0x80), np.nan, v)
    return v


def encode_fields(rng, shape, t, ef):
    e, m, _, _ = FMT[t]
    sign = rng.integers(0, 2, shape, dtype=np.uint64) << np.uint64(e + m)
    frac = rng.integers(0, 1 << m, shape, dtype=np.uint64)
    return (sign | (np.asarray(ef, np.uint64) << np.uint64(m)) | frac).astype(NP[t])


def own_elements(rng, t, shape, dist):
    e, m, bias, ieee = FMT[t]
    top = (1 << e) - 1 - (1 if ieee else 0)  # largest finite exponent field
    if dist in ("random", "cancel"):
        ef = rng.integers(max(1, bias - 8), min(top, bias + 8) + 1, shape)
    elif dist == "extreme":
        ef = rng.choice([0, 1, 2, top - 1, top], size=shape)
    else:  # align: exponents over about 40 binades (the whole range for the 8-bit formats)
        lo, hi = max(0, bias - 20), min(top, bias + 20)
        ef = rng.integers(lo, hi + 1, shape)
    codes = encode_fields(rng, shape, t, ef)
    if t == "xf32":  # random low 13 bits (MMA-Sim and tcemu truncate them)
        codes = codes | rng.integers(0, 1 << 13, shape, dtype=np.uint64).astype(np.uint32)
    if not ieee:
        codes = np.where(codes == 0x80, np.uint8(0), codes).astype(NP[t])
    return codes


def own_c(rng, n, dist, dot):
    v = rng.standard_normal(n) * 2.0 ** rng.integers(-6, 7, n)
    if dist == "cancel":
        v = np.where(rng.random(n) < 0.8, -dot, v)
    elif dist == "extreme":
        v = rng.choice([-1, 1], n) * 2.0 ** rng.choice([-149, -140, -127, -126, -125, 100, 126, 127], n) * (
            1 + rng.random(n))
    elif dist == "align":  # C 30 binades either side of the largest |product|
        big = np.maximum(np.abs(dot), 2.0 ** -100)
        v = rng.choice([-1, 1], n) * (1 + rng.random(n)) * 2.0 ** (np.floor(np.log2(big)) + rng.integers(-30, 31, n))
        v = np.where(rng.random(n) < 0.15, 0.0, v)
    with np.errstate(over="ignore"):
        return v.astype(np.float32).view(np.uint32)


def _torch(x, t):
    return torch.from_numpy(x.view({1: np.uint8, 2: np.int16, 4: np.int32}[x.itemsize]).copy()).view(TORCH[t])


def _bits(d):
    return d.contiguous().view(torch.int32).numpy().view(np.uint32).copy()


def mmasim_dpa(gen, suffix, t, a, b, c):
    return _bits(MFMA(gen, suffix).dpa(_torch(a, t), _torch(b, t), torch.from_numpy(c.view(np.float32).copy())))


def _tr_fdpa_31(a, b, c, F, F2, rho):
    """MMA-Sim's tr_fdpa with the toolbox's rule for a C above the products: the product sum
    floored 31 (F2), not 32 (F2 + 1), bits below C's exponent (the rest is MMA-Sim's code)."""
    s_a, e_a = fdpa.frexp_and_normalize(a)
    s_b, e_b = fdpa.frexp_and_normalize(b)
    s, e = s_a * s_b, e_a + e_b
    overflow = ((s.abs() >= 2.0) + e) >= 128
    s[overflow] *= float("inf")
    e[s == 0.0] = -999
    s_dot, e_dot = fdpa.truncated_fused_sum(s, e, F)
    s_c, e_c = fdpa.frexp_and_normalize(c)
    e_max = torch.max(e_dot, e_c)
    s_dot = torch.floor(s_dot * fdpa.pow2(e_dot - e_max + F2)) * 2.0 ** -F2
    s_c = torch.floor(s_c * fdpa.pow2(e_c - e_max + F)) * 2.0**-F
    sum, e_max = fdpa.frexp_and_normalize((s_dot + s_c) * fdpa.pow2(e_max), e_subnormal=-126)
    sum = torch.floor(sum * 2.0**F2) * 2.0**-F2
    return fdpa.ldexp_and_normalize(sum, e_max, rho)


def _gtr_fdpa_31(a, b, c, F, F2, rho):
    """MMA-Sim's gtr_fdpa with the same change as _tr_fdpa_31."""
    s_a, e_a = fdpa.frexp_and_normalize(a)
    s_b, e_b = fdpa.frexp_and_normalize(b)
    s, e = s_a * s_b, e_a + e_b
    e[s == 0.0] = -999
    s_even, e_even = fdpa.truncated_fused_sum(s[..., ::2], e[..., ::2], F)
    s_odd, e_odd = fdpa.truncated_fused_sum(s[..., 1::2], e[..., 1::2], F)
    e_dot = torch.max(e_even, e_odd)
    s_dot = torch.floor(s_even * fdpa.pow2(e_even - e_dot + F)) * 2.0**-F
    s_dot += torch.floor(s_odd * fdpa.pow2(e_odd - e_dot + F)) * 2.0**-F
    s_c, e_c = fdpa.frexp_and_normalize(c)
    e_max = torch.max(e_dot, e_c)
    s_dot = torch.floor(s_dot * fdpa.pow2(e_dot - e_max + F2)) * 2.0 ** -F2
    s_c = torch.floor(s_c * fdpa.pow2(e_c - e_max + F)) * 2.0**-F
    s_c[e_c < e_max - F - 1] = 0.0
    s_dot, e_max = fdpa.frexp_and_normalize((s_dot + s_c) * fdpa.pow2(e_max), e_subnormal=-126)
    s_dot = torch.floor(s_dot * 2.0**F2) * 2.0**-F2
    return fdpa.ldexp_and_normalize(s_dot, e_max, rho)


def variants(gen, suffix, t, a, b, c):
    """Per case: MMA-Sim with one toolbox rule adopted (0 where it does not apply), and whether
    MMA-Sim meets a binary32 overflow (a product of magnitude >= 2**128, or an Inf/NaN block
    result) with finite inputs. ``rule`` names the adopted rule."""
    op = MFMA(gen, suffix).arithmetic_op
    A, B, C = _torch(a, t), _torch(b, t), torch.from_numpy(c.view(np.float32).copy())
    if isinstance(op, ftz_mul_add.MMA_FTZ_MUL_ADD) and op.P == 2:
        pad = (-A.shape[-1]) % 4  # the toolbox pads K with zeros to its block of 4
        A4, B4 = (torch.nn.functional.pad(x.view(torch.int16), (0, pad)).view(x.dtype) for x in (A, B))
        var, rule = ftz_mul_add.MMA_FTZ_MUL_ADD(4).dpa(A4, B4, C), "bf16_pairs_not_quads"
    elif isinstance(op, (fdpa.MMA_TR_FDPA, fdpa.MMA_GTR_FDPA)):
        f = _gtr_fdpa_31 if isinstance(op, fdpa.MMA_GTR_FDPA) else _tr_fdpa_31
        x, y = (fdpa.truncate_fp32_to_tf32(v) if t == "xf32" else v for v in (A, B))
        L, var = min(x.shape[-1], op.L_max), C
        for i in range(0, x.shape[-1], L):
            var = f(x[..., i:i + L], y[..., i:i + L], var, op.F, op.F2, op.rho)
        rule = "product_sum_31_bits_below_c"
    else:
        var, rule = torch.zeros_like(C), ""
    L = {fdpa.MMA_E_FDPA: "L_max", ftz_mul_add.MMA_FTZ_MUL_ADD: "P"}.get(type(op), "L_max")
    L = min(A.shape[-1], getattr(op, L))
    d, bad = C, torch.zeros(C.shape, dtype=torch.bool)
    for i in range(0, A.shape[-1], L):
        d = op.dpa(A[..., i:i + L], B[..., i:i + L], d)
        bad |= ~torch.isfinite(d)
    with np.errstate(over="ignore", invalid="ignore"):
        va, vb = decode(a, t), decode(b, t)
        finite = np.isfinite(va).all(1) & np.isfinite(vb).all(1) & np.isfinite(c.view(np.float32))
        big = (np.abs(va * vb) >= 2.0 ** 128).any(1)
    return _bits(var), finite & (big | bad.numpy()), rule


def vector_cases(z, gen, suffix, dist, rng, per_instance):
    A, B, C, D = (z[f"{gen}|{suffix}|{dist}|{p}"] for p in "abcd")
    rows = []
    for i in range(A.shape[0]):
        M, N = C.shape[1:]
        pos = rng.choice(M * N, size=min(per_instance, M * N), replace=False)
        for p in pos:
            m, n = divmod(int(p), N)
            rows.append((A[i, m, :], B[i, :, n], C[i, m, n], D[i, m, n]))
    a, b, c, d = (np.stack(x) for x in zip(*rows))
    return a, b, c, d


def own_cases(gen, suffix, t, k, dist, n, rng):
    a = own_elements(rng, t, (n, k), dist)
    b = own_elements(rng, t, (n, k), dist)
    if dist == "cancel":  # half the cases: product pairs that cancel exactly
        half = rng.random(n) < 0.5
        a[half, 1], b[half, 1] = a[half, 0] ^ NP[t](1 << (FMT[t][0] + FMT[t][1])), b[half, 0]
    with np.errstate(over="ignore", invalid="ignore"):
        prods = decode(a, t) * decode(b, t)
        dot = prods.sum(1) if dist != "align" else np.abs(prods).max(1)
    c = own_c(rng, n, dist, dot)
    return a, b, c, mmasim_dpa(gen, suffix, t, a, b, c)


def chain_suffix(z, gen, t, suffix_list):
    """The instruction of this generation and type with the largest K (ties: the first)."""
    best = None
    for s in suffix_list:
        if elem_type(s) != t:
            continue
        k = z[f"{gen}|{s}|random|a"].shape[-1]
        if best is None or k > best[1]:
            best = (s, k)
    return best


def repro_case(gen, suffix, t, terms, c, k):
    a, b = np.zeros(k), np.zeros(k)
    for i, x, y in terms:
        a[i], b[i] = x, y
    av, bv = a, b
    to_codes = lambda v: torch.tensor(v, dtype=torch.float64).to(TORCH[t]).view(  # noqa: E731
        {1: torch.uint8, 2: torch.int16, 4: torch.int32}[NP[t]().itemsize]).numpy().view(NP[t])
    a, b = to_codes(a)[None], to_codes(b)[None]
    assert all(np.array_equal(decode(x, t)[0], v) for x, v in ((a, av), (b, bv))), "a value not of the format"
    cc = np.asarray([c], np.float32).view(np.uint32)
    return a, b, cc, mmasim_dpa(gen, suffix, t, a, b, cc)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vectors", default=str(Path(__file__).resolve().parents[2] / "tests/data/mmasim_amd_vectors.npz"))
    p.add_argument("--work", required=True)
    p.add_argument("--seed", type=int, default=2027)
    p.add_argument("--per-instance", type=int, default=8)
    p.add_argument("--own", type=int, default=24, help="own cases per (family, distribution, K)")
    args = p.parse_args()
    z = np.load(args.vectors)
    rng = np.random.default_rng(args.seed)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    groups, out = [], {}

    def add(gen, suffix, t, source, a, b, c, d):
        g = f"g{len(groups):03d}"
        groups.append(dict(group=g, gen=gen, suffix=suffix, type=t, source=source, model=MODEL[gen],
                           fmt=TOOLBOX_FMT[t], n=int(a.shape[0]), k=int(a.shape[1])))
        var, ovf, rule = variants(gen, suffix, t, a, b, c)
        groups[-1]["variant"] = rule
        for name, x in zip(("a", "b", "c", "d", "d_variant", "overflow"), (a, b, c, d, var, ovf)):
            out[f"{g}|{name}"] = x
        vals = [decode(a, t), decode(b, t), c.view(np.float32).astype(np.float64)]
        with open(work / f"{g}.in", "wb") as f:
            for v in vals:
                f.write(np.asfortranarray(v).tobytes(order="F"))

    fs = forms(z)
    for gen, suffix in fs:
        t = elem_type(suffix)
        for dist in VEC_DISTS:
            add(gen, suffix, t, f"vec:{dist}", *vector_cases(z, gen, suffix, dist, rng, args.per_instance))
    families = sorted({(gen, elem_type(s), "_1k" in s) for gen, s in fs})
    for gen, t, onek in families:
        sl = [s for g, s in fs if g == gen and elem_type(s) == t and ("_1k" in s) == onek]
        suffix, k = chain_suffix(z, gen, t, sl)
        for mult in (1, 2):
            for dist in OWN_DISTS:
                add(gen, suffix, t, f"own:{dist}:K{k * mult}", *own_cases(gen, suffix, t, k * mult, dist, args.own, rng))
        print(gen, t, "1k" if onek else "", suffix, flush=True)
    for name, gen, suffix, t, terms, c in REPROS:
        k = z[f"{gen}|{suffix}|random|a"].shape[-1]
        add(gen, suffix, t, f"repro:{name}", *repro_case(gen, suffix, t, terms, c, k))
    with open(work / "index.txt", "w") as f:
        for g in groups:
            f.write(f"{g['group']} {g['model']} {g['fmt']} {g['n']} {g['k']}\n")
    meta = dict(seed=args.seed, per_instance=args.per_instance, own=args.own, groups=groups)
    np.savez_compressed(work / "cases.npz", meta=np.asarray(json.dumps(meta)), **out)
    print(len(groups), "groups,", sum(g["n"] for g in groups), "cases")


if __name__ == "__main__":
    main()
