"""Throughput of register-level wmma.load + wmma.store.d, vmapped over many warps.

    python benchmarks/bench_wmma_ldst.py [--warps 100000]

Each warp loads its A fragment (wmma.load.a .row m16n16k16 .f16, 8 registers) from its own 2 KiB of
memory at a per-warp address and stores a D fragment (wmma.store.d .col m16n16k16 .f32) back: two
warp-instructions per warp. Reports warp-instructions per second (best and median of the runs).
"""
from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

import tcemu
from common import device_name, table, timeit


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--warps", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    W = args.warps
    ld = tcemu.ptx("wmma.load.a.sync.aligned.row.m16n16k16.f16", arch="sm_90")
    st = tcemu.ptx("wmma.store.d.sync.aligned.col.m16n16k16.f32", arch="sm_90")
    rng = np.random.default_rng(0)
    regs = jnp.asarray(rng.integers(0, 2 ** 32, (W, 32, 16), dtype=np.uint32))
    mem = jnp.asarray(rng.integers(0, 256, (W, 2048), dtype=np.uint8))
    p = jnp.asarray(rng.integers(0, 2, W) * 1024, jnp.int32)

    def warp(r, m, p):
        r = ld(r, m, dst=range(8), p=p)
        return r, st(m, r, src=range(8, 16), p=1024 - p)

    f = jax.jit(jax.vmap(warp))
    best, med = timeit(f, regs, mem, p, repeats=args.repeats)
    rows = [["load.a + store.d", W, f"{best * 1e3:.1f}", f"{2 * W / best:,.0f}", f"{2 * W / med:,.0f}"]]
    print(f"device: {device_name()}")
    print(table(rows, ["instructions", "warps", "best ms", "warp-instr/s (best)", "warp-instr/s (median)"]))


if __name__ == "__main__":
    main()
