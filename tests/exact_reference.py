"""An independent, exact-rational reference of the fused block-FMA model (Python Fractions).

Written from the published description (Fasi et al. 2021; Khattak & Mikaitis 2025; MMA-Sim 2025),
not from tcemu's integer implementation, to test the engine against exact arithmetic.
"""
from __future__ import annotations

import math
from fractions import Fraction as Fr

import ml_dtypes
import numpy as np

FMT = {  # exponent bits, fraction bits, has inf
    "f16": (5, 10, True), "bf16": (8, 7, True), "tf32": (8, 10, True), "f32": (8, 23, True),
    "e4m3": (4, 3, False), "e5m2": (5, 2, True), "e3m2": (3, 2, False), "e2m3": (2, 3, False), "e2m1": (2, 1, False),
}
NO_NAN = ("e3m2", "e2m3", "e2m1")  # OCP MX fp6/fp4: every code is a finite number


def emin(fmt):
    return 2 - (1 << (FMT[fmt][0] - 1))


def value(bits: int, fmt: str):
    """Exact value of a bit pattern (Fraction), or a float for inf/nan."""
    eb, fb, has_inf = FMT[fmt]
    if fmt == "tf32":
        bits >>= 13
    frac = bits & ((1 << fb) - 1)
    e = (bits >> fb) & ((1 << eb) - 1)
    s = -1 if (bits >> (eb + fb)) & 1 else 1
    top = (1 << eb) - 1
    if has_inf and e == top:
        return math.nan if frac else s * math.inf
    if not has_inf and e == top and frac == (1 << fb) - 1 and fmt not in NO_NAN:
        return math.nan
    bias = (1 << (eb - 1)) - 1
    if e == 0:
        return s * Fr(frac, 1 << fb) * Fr(2) ** (1 - bias)
    return s * (1 + Fr(frac, 1 << fb)) * Fr(2) ** (e - bias)


def decompose(x: Fr, e_min: int):
    """x = s * 2**e with 1 <= |s| < 2, or e = e_min and |s| < 1 (subnormal range)."""
    if x == 0:
        return Fr(0), e_min
    e = math.floor(math.log2(abs(x)))
    while Fr(2) ** e > abs(x):
        e -= 1
    while Fr(2) ** (e + 1) <= abs(x):
        e += 1
    e = max(e, e_min)
    return x / Fr(2) ** e, e


def trunc(q: Fr) -> int:
    return math.trunc(q)


def round_to(x: Fr, p: int, e_min: int, e_max: int, mode: str, overflow: str = "inf"):
    """Round x to a binary format with p fraction bits and exponents [e_min, e_max]."""
    if x == 0:
        return Fr(0)
    s, e = decompose(x, e_min)
    q = abs(s) * 2 ** p
    n = math.floor(q)
    r = q - n
    neg = x < 0
    up = {"rz": False, "rne": r > Fr(1, 2) or (r == Fr(1, 2) and n % 2 == 1), "rna": r >= Fr(1, 2),
          "ru": r > 0 and not neg, "rd": r > 0 and neg}[mode]
    n += up
    res = Fr(n) * Fr(2) ** (e - p)
    if res >= Fr(2) ** (e_max + 1):
        to_inf = overflow == "inf" or mode in ("rne", "rna") or (mode == "ru" and not neg) or (mode == "rd" and neg)
        if to_inf:
            return -math.inf if neg else math.inf
        res = (2 - Fr(1, 2 ** p)) * Fr(2) ** e_max
    return -res if neg else res


def block(products, c: Fr, F: int, zero_exp=-126, normalize=False):
    """Sum of (value, exponent) products and c, each truncated F bits below the largest exponent."""
    terms = list(products) + [c]
    exps = []
    for (v, e) in terms:
        if v == 0:
            exps.append(zero_exp)
        else:
            exps.append(e + (1 if normalize and abs(v) >= 2 * Fr(2) ** e else 0))
    exps = [x for x in exps if x is not None]
    E = max(exps)
    return sum(trunc(v * Fr(2) ** (F - E)) for v, _ in terms) * Fr(2) ** (E - F)


def fused_dot(a_bits, afmt, b_bits, bfmt, c_bits, cfmt, F, L, mode="rz", acc="f32", out_frac=23,
              zero_exp=-126, normalize=False):
    """One output element: lists of bit patterns of a row of A and a column of B, and c."""
    a = [value(x, afmt) for x in a_bits]
    b = [value(x, bfmt) for x in b_bits]
    c = value(c_bits, cfmt)
    if any(isinstance(x, float) for x in a + b + [c]):
        return None  # special values are tested against hardware, not here
    accp, acce = (10, (-14, 15)) if acc == "f16" else (out_frac, (-126, 127))
    d = c
    d_emin = emin(cfmt)
    for k0 in range(0, len(a), L):
        prods = []
        for x, y in zip(a[k0:k0 + L], b[k0:k0 + L]):
            sx, ex = decompose(x, emin(afmt))
            sy, ey = decompose(y, emin(bfmt))
            prods.append((x * y, ex + ey))
        sc, ec = decompose(d, d_emin)
        d = round_to(block(prods, (d, ec), F, zero_exp, normalize), accp, acce[0], acce[1], mode)
        if isinstance(d, float):
            return d
        d_emin = acce[0]
    return d


def scale_value(code: int, stype: str):
    """(value, exponent) of a block-scale factor: ue8m0 2**(code - 127); ue4m3 the e4m3 value of
    the low 7 bits (the sign bit is ignored), exponent as :func:`decompose` gives; NaN as None."""
    if stype == "ue8m0":
        return (None, None) if code == 0xFF else (Fr(2) ** (code - 127), code - 127)
    v = value(code & 0x7F, "e4m3")
    if isinstance(v, float):
        return None, None
    return v, decompose(v, emin("e4m3"))[1]


def scaled_dot(a_bits, afmt, b_bits, bfmt, sa, sb, c_bits, F, L, block, zero_exp, group=None, mode="rz"):
    """One binary32 output of a block-scaled MMA (from [MS25]'s description): ``sa``/``sb`` the
    scale codes (a list per K block, ue8m0 or ue4m3 pairs ``(code, stype)``). ``group=None``:
    every product ``a b sa sb`` is a term with exponent e(a) + e(b) + e(sa) + e(sb);
    ``group=G``: each G products are summed exactly and multiplied by the scales, the group's
    exponent is e(sa) + e(sb) (that of its scales only), zero when every product or a scale is 0."""
    a = [value(x, afmt) for x in a_bits]
    b = [value(x, bfmt) for x in b_bits]
    scales = [(scale_value(*x), scale_value(*y)) for x, y in zip(sa, sb)]
    c = value(c_bits, "f32")
    if any(isinstance(x, float) for x in a + b + [c]) or any(v is None for s in scales for v, _ in s):
        return None  # NaN/inf and NaN scales are tested against MMA-Sim, not here
    d = c
    for k0 in range(0, len(a), L):
        terms = []
        step = group or 1
        for g0 in range(k0, min(k0 + L, len(a)), step):
            (va, ea), (vb, eb) = scales[g0 // block]
            prods = [x * y for x, y in zip(a[g0:g0 + step], b[g0:g0 + step])]
            v = sum(prods) * va * vb
            if group is None:
                ex = decompose(a[g0], emin(afmt))[1] + decompose(b[g0], emin(bfmt))[1]
                terms.append((v, ex + ea + eb if v != 0 else zero_exp))
            else:
                terms.append((v, zero_exp if all(p == 0 for p in prods) or va * vb == 0 else ea + eb))
        ec = decompose(d, -126)[1]
        terms.append((d, ec if d != 0 else zero_exp))
        E = max(e for _, e in terms if e is not None)
        exact = sum(trunc(v * Fr(2) ** (F - E)) for v, _ in terms) * Fr(2) ** (E - F)
        d = round_to(exact, 23, -126, 127, mode)
        if isinstance(d, float):
            return d
    return d


def to_bits(x, fmt):
    """Bits of an exact value (Fraction or inf) in f32/f16."""
    dt = {"f32": np.float32, "f16": np.float16}[fmt]
    if isinstance(x, float):
        return int(np.array([x], dt).view({np.float32: np.uint32, np.float16: np.uint16}[dt])[0])
    f = float(x)
    assert Fr(f) == x
    return int(np.array([f], dt).view(np.uint32 if fmt == "f32" else np.uint16)[0])


def random_bits(rng, fmt, n, spread=False):
    eb, fb, has_inf = FMT[fmt]
    if not spread:
        dt = {"f16": np.float16, "bf16": ml_dtypes.bfloat16, "e4m3": ml_dtypes.float8_e4m3fn,
              "e5m2": ml_dtypes.float8_e5m2, "f32": np.float32}
        if fmt == "tf32":
            return [int(x) & ~0x1FFF for x in rng.standard_normal(n).astype(np.float32).view(np.uint32)]
        v = rng.standard_normal(n).astype(dt[fmt])
        return [int(x) for x in v.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[v.dtype.itemsize])]
    top = (1 << eb) - 2 if has_inf else (1 << eb) - 1
    out = []
    for _ in range(n):
        e = int(rng.integers(0, top + 1))
        f = int(rng.integers(0, 1 << fb))
        if not has_inf and e == top and f == (1 << fb) - 1:
            f -= 1
        bits = (int(rng.integers(0, 2)) << (eb + fb)) | (e << fb) | f
        out.append(bits << 13 if fmt == "tf32" else bits)
    return out
