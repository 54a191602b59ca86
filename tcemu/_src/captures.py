"""Real-library GEMM captures (``tests/data/library_gemm_*.npz``): reading one, and regenerating
the inputs of any crop from the case's seed.

A capture holds, per case ``<key>``, the output bits at a crop (``<key>.d``, rows ``<key>.rows``
flat over batch * M, columns ``<key>.cols``) and ``meta``, a JSON header and case list. The inputs
are not stored: every element is a pure integer function of (seed, operand, flat index), built as
the bit pattern of its format, so any crop of A (rows) or B (columns) is regenerated exactly, with
numpy or cupy, without the rest. The capture scripts (``experiments/hardware``) and the tests both
use this module; it depends on numpy and ``formats`` only.

    >>> import numpy as np
    >>> a = operand_bits(7, "a", "bf16", np.arange(4))        # the first 4 elements of A
    >>> a.dtype, len(a)
    (dtype('uint16'), 4)

Values: random sign, exponent uniform over 8 binades around 1 (2^-5 .. 2^2 times 1.f), random
fraction bits; no zeros, no specials.

The layer captures (``experiments/hardware/layer_gemm.py``) add epilogue operands, each with its
own stream of bits (``_TAG``; A's and B's are unchanged): a bias row (N,) (``bias_values``), a full
C (batch, M, N) (``c_rows``), the row-wise fp8 scales (``scale_values``) and the fp8 block scales
along K (``block_scales``: cuBLASLt's 1x128 and 128x128 blocks, DeepSeek-V3's recipe), all of the
case's seed.
"""
from __future__ import annotations

import json
import re

import numpy as np

from tcemu._src.formats import FORMATS, VALUE_DTYPES
from tcemu._src.library import gpu_named

INPUT_TYPES = ("f16", "bf16", "e4m3", "e5m2")
OUTPUT_TYPES = ("f16", "bf16", "f32")
NUMPY = {t: np.dtype(VALUE_DTYPES[t]) for t in INPUT_TYPES + ("f32",)}  # the numpy dtype of each type
OUT_STORAGE = {t: np.dtype(f"uint{8 * NUMPY[t].itemsize}") for t in OUTPUT_TYPES}  # output bits
# pi's hexadecimal digits, 64 bits an operand (A and B first, as the library captures were made)
_TAG = {"a": 0x243F6A8885A308D3, "b": 0x13198A2E03707344, "bias": 0xA4093822299F31D0,
        "c": 0x082EFA98EC4E6C89, "scale_a": 0x452821E638D01377, "scale_b": 0xBE5466CF34E90C6C}


def _mix(x, xp):
    """splitmix64's finaliser on uint64 (wrapping)."""
    x = x ^ (x >> xp.uint64(30))
    x = x * xp.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> xp.uint64(27))
    x = x * xp.uint64(0x94D049BB133111EB)
    return x ^ (x >> xp.uint64(31))


def operand_bits(seed: int, which: str, fmt: str, flat, xp=np):
    """Bit patterns (uint8/16/32) of elements ``flat`` (flat indices into the row-major operand)
    of operand ``which`` (a key of ``_TAG``: "a", "b", "bias", "c", ...) in format ``fmt`` (one of
    ``INPUT_TYPES``, or "f32" for the scales)."""
    f = FORMATS[fmt]
    fb = f.fraction_bits
    x = xp.asarray(flat).astype(xp.uint64) + xp.uint64((seed * 0x9E3779B97F4A7C15 + _TAG[which]) % 2**64)
    h = _mix(_mix(x, xp), xp)
    sign = h >> xp.uint64(63)
    expo = (h >> xp.uint64(56)) & xp.uint64(7)  # 0..7 -> 2^-5 .. 2^2
    frac = h & xp.uint64((1 << fb) - 1)
    bits = (sign << xp.uint64(f.exponent_bits + fb)) | ((expo + xp.uint64(f.bias - 5)) << xp.uint64(fb)) | frac
    return bits.astype(np.dtype(f"uint{f.storage_bits}"))


def a_rows(case: dict, rows, xp=np):
    """Rows ``rows`` (flat over batch * M) of A (batch, M, K) as bits, shape (len(rows), K)."""
    K = case["K"]
    idx = xp.asarray(rows, dtype=xp.int64)[:, None] * K + xp.arange(K, dtype=xp.int64)[None]
    return operand_bits(case["seed"], "a", case["a"], idx, xp)


def b_cols(case: dict, batch: int, cols, xp=np):
    """Columns ``cols`` of B[batch] (K, N) as bits, shape (K, len(cols))."""
    K, N = case["K"], case["N"]
    k = xp.arange(K, dtype=xp.int64)[:, None]
    idx = (batch * K + k) * N + xp.asarray(cols, dtype=xp.int64)[None]
    return operand_bits(case["seed"], "b", case["b"], idx, xp)


def c_rows(case: dict, rows, cols, xp=np):
    """Rows ``rows`` (flat over batch * M) and columns ``cols`` of C (batch, M, N) as bits, in the
    format ``case["c"]``, shape (len(rows), len(cols))."""
    idx = xp.asarray(rows, dtype=xp.int64)[:, None] * case["N"] + xp.asarray(cols, dtype=xp.int64)[None]
    return operand_bits(case["seed"], "c", case["c"], idx, xp)


def bias_values(case: dict, cols=None):
    """The bias row (N,) (elements ``cols``, all by default) as values of the format ``case["bias"]``."""
    idx = np.arange(case["N"]) if cols is None else np.asarray(cols, dtype=np.int64)
    return operand_bits(case["seed"], "bias", case["bias"], idx).view(NUMPY[case["bias"]])


def scale_values(case: dict, which: str, idx=None):
    """Row-wise fp8 scales as float32: ``scale_a`` (M,) or ``scale_b`` (N,) (elements ``idx``, all by
    default); positive, exponent over 2^-5 .. 2^2, all 23 fraction bits random."""
    idx = np.arange(case["M" if which == "scale_a" else "N"]) if idx is None else np.asarray(idx, dtype=np.int64)
    return (operand_bits(case["seed"], which, "f32", idx) & np.uint32(0x7FFFFFFF)).view(np.float32)


BLOCK_K = 128  # K elements per block scale
BLOCK_RECIPES = ("1x128", "128x128")


def block_scales(case: dict, which: str):
    """The fp8 block scales of ``case[which]`` ("1x128" or "128x128") as stored: rows of A (columns
    of B) by blocks of 128 elements of K, float32 (M or ceil(M / 128), ceil(K / 128)) for
    ``scale_a``, (N or ceil(N / 128), ceil(K / 128)) for ``scale_b``; positive, exponent over
    2^-5 .. 2^2, all 23 fraction bits random."""
    size = case["M" if which == "scale_a" else "N"]
    rows = size if case[which] == "1x128" else -(-size // BLOCK_K)
    kb = -(-case["K"] // BLOCK_K)
    bits = operand_bits(case["seed"], which, "f32", np.arange(rows * kb)) & np.uint32(0x7FFFFFFF)
    return bits.view(np.float32).reshape(rows, kb)


def expand_block_scales(case: dict, which: str):
    """:func:`block_scales` one per row and K block as ``tcemu.matmul`` takes them: ``scale_a``
    (M, ceil(K / 128)), ``scale_b`` (ceil(K / 128), N)."""
    s = block_scales(case, which)
    size = case["M" if which == "scale_a" else "N"]
    if case[which] == "128x128":
        s = np.repeat(s, BLOCK_K, axis=0)[:size]
    return s if which == "scale_a" else np.ascontiguousarray(s.T)


def shape_of(case: dict, which: str) -> tuple:
    """Operand shapes: A (batch, M, K), B (batch, K, N), C (batch, M, N) (batch 1 when unbatched),
    bias (N,)."""
    bt, M, N, K = case["batch"] or 1, case["M"], case["N"], case["K"]
    return {"a": (bt, M, K), "b": (bt, K, N), "c": (bt, M, N), "bias": (N,)}[which]


def full(case: dict, which: str, xp=np):
    """The whole operand as bits (``shape_of``), in the format ``case[which]``."""
    shape = shape_of(case, which)
    n = int(np.prod(shape))
    return operand_bits(case["seed"], which, case[which], xp.arange(n, dtype=xp.int64), xp).reshape(shape)


def load(path):
    """(the open npz, its ``meta``: {"header": ..., "cases": [...]})."""
    z = np.load(path)
    return z, json.loads(str(z["meta"]))


def captured(path, key):
    """A captured case: (case, GPU name, "H100"/"H200" or None (a dry run's stand-in: no GPU),
    rows, columns, output crop)."""
    z, meta = load(path)
    case = next(c for c in meta["cases"] if c.get("key") == key)
    gpu = meta["header"]["versions"]["gpu"]
    rows, cols = z[f"{key}.rows"], z[f"{key}.cols"]
    return case, gpu, gpu_named(gpu), rows, cols, z[f"{key}.d"].view(NUMPY[case["out"]])


def crop_operands(case, rows, cols):
    """A's rows (R, K), each row's batch index, and per batch index B's columns (K, C), in their
    numpy dtypes."""
    a = a_rows(case, rows).view(NUMPY[case["a"]])
    bt = np.asarray(rows) // case["M"]
    bs = {int(x): b_cols(case, int(x), cols).view(NUMPY[case["b"]]) for x in np.unique(bt)}
    return a, bt, bs


def evaluate(case, rows, cols, gemm):
    """The output crop (``rows`` x ``cols``) of a case in its output dtype, with ``gemm(a, b)``
    (a (r, K), b (K, C) -> (r, C)) run once per batch index on the regenerated operands."""
    a, bt, bs = crop_operands(case, rows, cols)
    out = np.zeros((len(rows), len(cols)), NUMPY[case["out"]])
    for x, b in bs.items():
        sel = bt == x
        out[sel] = np.asarray(gemm(a[sel], b)).astype(out.dtype)
    return out


def hlo_slices(case) -> int | None:
    """The split-K slice count S of a captured ``jnp.dot`` from XLA's optimised HLO (the split dot
    gains a leading axis: ``f32[S, M, N]``, after the batch axis if any); None when not split."""
    hlo = " ".join(case.get("hlo", []))
    m = re.search(r"f32\[" + (r"\d+," if case["batch"] else "") + r"(\d+),\d+,\d+\]\{[\d,]+\} dot\(", hlo)
    return int(m.group(1)) if m else None
