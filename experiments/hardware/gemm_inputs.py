"""Counter-based GEMM operands and the case grid of the real-library capture (``library_gemm.py``).

Every element is a pure integer function of (seed, operand, flat index), built directly as the bit
pattern of the input format, so any crop of A (rows) or B (columns) is regenerated exactly on any
machine, with numpy or cupy, without generating the rest:

    >>> import numpy as np
    >>> a = operand_bits(7, "a", "bf16", np.arange(4))        # the first 4 elements of A
    >>> a.dtype, len(a)
    (dtype('uint16'), 4)

Values: random sign, exponent uniform over 8 binades around 1 (2^-5 .. 2^2 times 1.f), random
fraction bits; no zeros, no specials.
"""
from __future__ import annotations

import hashlib

import ml_dtypes
import numpy as np

# (exponent bias, fraction bits, storage)
FORMATS = {"f16": (15, 10, np.uint16), "bf16": (127, 7, np.uint16), "e4m3": (7, 3, np.uint8),
           "e5m2": (15, 2, np.uint8)}
OUT_STORAGE = {"f16": np.uint16, "bf16": np.uint16, "f32": np.uint32}
NUMPY = {"f16": np.float16, "bf16": ml_dtypes.bfloat16, "e4m3": ml_dtypes.float8_e4m3fn,
         "e5m2": ml_dtypes.float8_e5m2, "f32": np.float32}
_TAG = {"a": 0x243F6A8885A308D3, "b": 0x13198A2E03707344}


def _mix(x, xp):
    """splitmix64's finaliser on uint64 (wrapping)."""
    x = x ^ (x >> xp.uint64(30))
    x = x * xp.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> xp.uint64(27))
    x = x * xp.uint64(0x94D049BB133111EB)
    return x ^ (x >> xp.uint64(31))


def operand_bits(seed: int, which: str, fmt: str, flat, xp=np):
    """Bit patterns (uint8/uint16) of elements ``flat`` (flat indices into the row-major operand)
    of operand ``which`` ("a" or "b") in format ``fmt``."""
    bias, fb, store = FORMATS[fmt]
    x = xp.asarray(flat).astype(xp.uint64) + xp.uint64((seed * 0x9E3779B97F4A7C15 + _TAG[which]) % 2**64)
    h = _mix(_mix(x, xp), xp)
    sign = h >> xp.uint64(63)
    expo = (h >> xp.uint64(56)) & xp.uint64(7)  # 0..7 -> 2^-5 .. 2^2
    frac = h & xp.uint64((1 << fb) - 1)
    ebits = {15: 5, 127: 8, 7: 4}[bias]
    bits = (sign << xp.uint64(ebits + fb)) | ((expo + xp.uint64(bias - 5)) << xp.uint64(fb)) | frac
    return bits.astype(store)


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


def full(case: dict, which: str, xp=np):
    """The whole operand as bits: A (batch, M, K) or B (batch, K, N) (batch 1 when unbatched)."""
    bt = case["batch"] or 1
    shape = (bt, case["M"], case["K"]) if which == "a" else (bt, case["K"], case["N"])
    n = int(np.prod(shape))
    return operand_bits(case["seed"], which, case[which], xp.arange(n, dtype=xp.int64), xp).reshape(shape)


def seed_of(batch, M, N, K, a, b) -> int:
    """Inputs depend on the shape and input types only (shared across libraries and flags)."""
    return int.from_bytes(hashlib.sha256(f"{batch},{M},{N},{K},{a},{b}".encode()).digest()[:4], "little")


def crop(case: dict, nrows: int = 64, ncols: int = 32):
    """Output positions kept: rows spread over batch * M (every CTA row of tiles touched), columns
    spread over N."""
    bt = case["batch"] or 1
    R, N = bt * case["M"], case["N"]
    rows = np.unique(np.linspace(0, R - 1, min(R, nrows)).round().astype(np.int64))
    cols = np.unique(np.linspace(0, N - 1, min(N, ncols)).round().astype(np.int64))
    return rows, cols


# (batch, M, N, K): powers of two, primes and non-multiples of 16/64/128, skinny, deep, batched
SHAPES = [
    (None, 1024, 1024, 1024), (None, 4096, 4096, 4096), (None, 2048, 2048, 8192), (None, 4096, 4096, 256),
    (None, 512, 512, 500), (None, 512, 512, 777), (None, 512, 512, 1000), (None, 512, 512, 1040),
    (None, 512, 512, 1072), (None, 512, 512, 4097), (None, 333, 555, 1000), (None, 1000, 3000, 777),
    (None, 127, 257, 509), (None, 1000, 1000, 1000), (None, 777, 1024, 4096), (None, 336, 560, 1008),
    (None, 1008, 3008, 784), (None, 16, 4096, 4096), (None, 4096, 16, 4096), (None, 64, 8192, 1024),
    (None, 32, 1024, 16384), (None, 64, 64, 16384), (None, 256, 256, 16384), (None, 1024, 1024, 16384),
    (None, 128, 128, 32768), (None, 8192, 8192, 64),
    (8, 256, 256, 1000), (4, 512, 512, 4096), (16, 128, 128, 16384), (2, 1024, 1024, 2000),
]


# a second grid, never used to build the table: shapes of the same kinds for checking
# ``library_config`` and ``identify`` on shapes the table has not seen
HELD_OUT_SHAPES = [
    (None, 768, 768, 768), (None, 2048, 2048, 2048), (None, 3072, 1024, 4096), (None, 1536, 1536, 640),
    (None, 384, 384, 600), (None, 640, 640, 999), (None, 250, 750, 1500), (None, 2000, 1000, 333),
    (None, 100, 300, 700), (None, 96, 96, 8192), (None, 48, 2048, 8192), (None, 512, 512, 24576),
    (None, 200, 200, 20000), (None, 8, 8192, 2048), (None, 8192, 32, 2048), (None, 2048, 4096, 128),
    (None, 1024, 1024, 3000), (None, 160, 160, 12288), (4, 384, 384, 1536), (3, 640, 640, 2500),
]
GRIDS = {"table": SHAPES, "held-out": HELD_OUT_SHAPES}


def cases(grid: str = "table"):
    """The capture grid (``GRIDS``): dicts with lib, batch, M, N, K, a, b, out, flags, seed."""
    out = []

    def add(lib, shape, a, b, o, **flags):
        bt, M, N, K = shape
        out.append(dict(lib=lib, batch=bt, M=M, N=N, K=K, a=a, b=b, out=o, flags=flags,
                        seed=seed_of(bt, M, N, K, a, b)))

    for s in GRIDS[grid]:
        lib = "torch.bmm" if s[0] else "torch.mm"
        for t in ("f16", "bf16"):
            for rpr in (False, True):
                add(lib, s, t, t, t, reduced_precision_reduction=rpr)
        for t in ("f16", "bf16"):
            for o in (t, "f32"):
                add("jnp.dot", s, t, t, o)
        if s[0] is None and all(v % 16 == 0 for v in s[1:]):
            for a, b, outs in (("e4m3", "e4m3", ("f32", "bf16", "f16")), ("e5m2", "e4m3", ("bf16",))):
                for o in outs:
                    for fast in (False, True):
                        add("torch._scaled_mm", s, a, b, o, use_fast_accum=fast)
            add("jnp.dot", s, "e4m3", "e4m3", "f32")
    return out
