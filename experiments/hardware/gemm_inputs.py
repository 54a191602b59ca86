"""The case grid of the real-library capture (``library_gemm.py``): shapes, types, flags, seeds.

The operands of a case are a pure function of its seed; ``tcemu._src.captures`` (shared with the
tests) regenerates any crop of them (``a_rows``, ``b_cols``, ``full``) and reads a capture back.
"""
from __future__ import annotations

import hashlib

import numpy as np


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
# shapes chosen after the cuBLAS record rules (tcemu._src.library_records) were frozen, none of them
# on the shipped record grid (tcemu._src.record.default_cases) or in an earlier capture: the
# held-out check of library_config's records (experiments/hardware/README.md)
FRESH_SHAPES = [
    (None, 40, 4096, 4096), (None, 112, 1536, 5120), (None, 704, 896, 4992), (None, 1200, 2400, 800),
    (None, 96, 7168, 2048), (None, 272, 272, 9216), (None, 2560, 2560, 1088), (None, 80, 80, 20480),
    (None, 555, 777, 999), (None, 1234, 567, 890), (None, 64, 1000, 3333), (6, 320, 320, 3008),
]
# chosen after the records' rules for the layers (split-K off, epilogues) were frozen on the
# captures above and the fresh ones: the held-out check of this session's final rules
FRESH2_SHAPES = [
    (None, 48, 5120, 3584), (None, 176, 704, 7040), (None, 640, 1792, 2816), (None, 1536, 3584, 576),
    (None, 208, 208, 14336), (None, 3072, 768, 1216), (None, 24, 1024, 10240), (None, 777, 333, 2222),
    (None, 100, 4000, 1001), (None, 2000, 1500, 755), (5, 256, 384, 2240),
]
# drawn at random (numpy default_rng(20261128): M log-uniform in 16..4096, N in 64..8192, K in
# 256..16384, half multiples of 64, a quarter of 16) after stop 48's jnp.dot rule for shapes the
# table lacks and the off-grid cuBLAS records were frozen: their held-out check
FRESH3_SHAPES = [
    (None, 2448, 1600, 1482), (None, 480, 382, 6144), (None, 192, 916, 13312), (None, 2816, 2872, 7616),
    (None, 1344, 64, 2944), (None, 3968, 633, 1792), (None, 59, 80, 11088), (None, 64, 1104, 4544),
    (None, 64, 659, 490), (None, 64, 160, 3840), (7, 832, 7040, 448), (7, 2452, 6272, 1792),
]
# stop 51 (development): where cuBLAS's random-shape records name CUTLASS 2 split-K and the 16-byte
# slices differ from 64-element ones: K a multiple of 16 or 32 only (which decides between the
# rules the fresh3 misses left), and of 64
SLICES_SHAPES = [
    (None, 16, 358, 5424), (None, 37, 2923, 1776), (None, 13, 4629, 15888), (None, 154, 202, 800),
    (None, 192, 151, 8160), (None, 464, 81, 1632), (None, 16, 211, 5760), (None, 16, 465, 8064),
    (None, 10, 1399, 4224), (None, 9, 4118, 3712), (None, 16, 2262, 1600),
]
# drawn after stop 51's CUTLASS 2 slice alignment was frozen (7943db5): 12 as fresh3 (numpy
# default_rng(20261213): M log-uniform in 16..4096, N in 64..8192, K in 256..16384, half multiples
# of 64, a quarter of 16; the last two batched 7), then 6 in the rule's region (default_rng(20261214):
# N not a multiple of 8, K a multiple of 64)
FRESH4_SHAPES = [
    (None, 1285, 64, 8960), (None, 22, 128, 9408), (None, 169, 7632, 576), (None, 58, 3072, 3968),
    (None, 623, 2704, 320), (None, 47, 196, 9072), (None, 320, 3520, 14784), (None, 171, 4224, 4928),
    (None, 32, 5296, 448), (None, 24, 6848, 640), (7, 696, 576, 1216), (7, 1146, 576, 5696),
    (None, 410, 5167, 1664), (None, 46, 1001, 1536), (None, 916, 239, 320), (None, 598, 127, 704),
    (None, 28, 3614, 960), (None, 180, 5839, 9024),
]


def draw_shapes(seed: int, count: int, batched: int = 2) -> list[tuple]:
    """``count`` (batch, M, N, K) shapes drawn as ``fresh3``'s were (numpy ``default_rng(seed)``):
    M log-uniform in 16..4096, N in 64..8192, K in 256..16384; N and K multiples of 64 half the
    time, of 16 a quarter, any integer the rest; the last ``batched`` with a batch of 7."""
    rng = np.random.default_rng(seed)

    def logu(lo, hi):
        return int(round(float(np.exp(rng.uniform(np.log(lo), np.log(hi))))))

    def align(v):
        u = rng.random()
        return max(64, v // 64 * 64) if u < 0.5 else max(16, v // 16 * 16) if u < 0.75 else v

    return [(7 if i >= count - batched else None, logu(16, 4096), align(logu(64, 8192)), align(logu(256, 16384)))
            for i in range(count)]


# drawn after stop 52's refit of the decision trees was frozen: draw_shapes(20261230, 14)
FRESH5_SHAPES = draw_shapes(20261230, 14)
# drawn after stop 54's refit and the H100's use of the H200's trees were frozen (a09cc84)
FRESH6_SHAPES = draw_shapes(20261231, 14)
# drawn at stop 55, captured after its freeze
FRESH7_SHAPES = draw_shapes(20261232, 14)
# drawn at stop 56, captured after its freeze
FRESH8_SHAPES = draw_shapes(20261233, 14)
# drawn at stop 57, captured after its freeze
FRESH9_SHAPES = draw_shapes(20261234, 14)
# drawn at stop 58, captured after its freeze
FRESH10_SHAPES = draw_shapes(20261235, 14)
# drawn at stop 59: captured with a zero cuBLAS workspace beside fresh10, opened only after the
# workspace rule was frozen
FRESH11_SHAPES = draw_shapes(20261236, 14)
GRIDS = {"table": SHAPES, "held-out": HELD_OUT_SHAPES, "fresh": FRESH_SHAPES, "fresh2": FRESH2_SHAPES,
         "fresh3": FRESH3_SHAPES, "slices": SLICES_SHAPES,
         "fresh4": FRESH4_SHAPES, "fresh5": FRESH5_SHAPES, "fresh6": FRESH6_SHAPES,
         "fresh7": FRESH7_SHAPES, "fresh8": FRESH8_SHAPES, "fresh9": FRESH9_SHAPES,
         "fresh10": FRESH10_SHAPES, "fresh11": FRESH11_SHAPES}
UNSUFFIXED = ("table", "dev")  # the development grids of library_gemm.py and layer_gemm.py


def grid_suffix(grid: str) -> str:
    """The capture file's suffix for a grid: none for the development grid, ``_heldout`` for
    held-out, ``_<grid>`` for the others."""
    return "" if grid in UNSUFFIXED else "_" + grid.replace("-", "")


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
