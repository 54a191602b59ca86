"""Timing helpers shared by the benchmarks: best and median of repeated, synchronised runs."""
from __future__ import annotations

import statistics
import time

import jax


def timeit(fn, *args, repeats: int = 7, warmup: int = 2):
    """(best, median) seconds of ``fn(*args)`` (compiled and synchronised before timing)."""
    for _ in range(warmup):
        jax.block_until_ready(fn(*args))
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        ts.append(time.perf_counter() - t)
    return min(ts), statistics.median(ts)


def table(rows, headers):
    """Render rows (lists) as a fixed-width text table."""
    cols = [headers] + [[str(c) for c in r] for r in rows]
    w = [max(len(r[i]) for r in cols) for i in range(len(headers))]
    line = "  ".join(h.ljust(w[i]) for i, h in enumerate(headers))
    out = [line, "  ".join("-" * x for x in w)]
    out += ["  ".join(c.rjust(w[i]) for i, c in enumerate(r)) for r in cols[1:]]
    return "\n".join(out)


def device_name() -> str:
    d = jax.devices()[0]
    return f"{d.platform}:{getattr(d, 'device_kind', '')} x{len(jax.devices())}"
