"""Emulated GEMMs (tcemu.matmul, bit-exact) against native jnp.dot on the same data, same run.

    python benchmarks/bench_gemm.py [--sizes 512,1024] [--instruction ...] [--arch H100]

For each size S: an S x S x S fp16 -> fp32 product. Reports native ``jnp.dot`` (float32,
precision="highest") time, tcemu time, their ratio, and the peak temporary memory XLA reserves for
each (compiled memory analysis).
"""
from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

import tcemu
from common import device_name, table, timeit


def temp_bytes(fn, *args):
    m = jax.jit(fn).lower(*args).compile().memory_analysis()
    return None if m is None else m.temp_size_in_bytes


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="512,1024")
    # H100 GEMMs (cuBLAS, CUTLASS) run wgmma; m64n64k16 also vectorises best on CPUs
    ap.add_argument("--instruction", default="wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16")
    ap.add_argument("--arch", default="H100")
    ap.add_argument("--k-order", default="sequential")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (this machine's speed drifts)")
    args = ap.parse_args()
    cfg = tcemu.GemmConfig(arch=args.arch, instruction=args.instruction, k_order=args.k_order)
    rows = []
    for S in (int(s) for s in args.sizes.split(",")):
        rng = np.random.default_rng(S)
        a = jnp.asarray(rng.standard_normal((S, S)).astype(np.float16))
        b = jnp.asarray(rng.standard_normal((S, S)).astype(np.float16))
        native = jax.jit(lambda a, b: jnp.dot(a.astype(jnp.float32), b.astype(jnp.float32), precision="highest"))
        emu = jax.jit(lambda a, b: tcemu.matmul(a, b, config=cfg))
        t_nat = t_emu = float("inf")
        for _ in range(args.rounds):
            t_nat = min(t_nat, timeit(native, a, b, repeats=max(args.repeats, 5))[0])
            t_emu = min(t_emu, timeit(emu, a, b, repeats=args.repeats, warmup=1)[0])
        m_nat, m_emu = temp_bytes(native, a, b), temp_bytes(emu, a, b)
        mb = lambda x: "n/a" if x is None else f"{x / 2 ** 20:.0f} MiB"  # noqa: E731
        rows.append([f"{S}^3", f"{t_nat * 1e3:.2f}", f"{t_emu * 1e3:.1f}", f"{t_emu / t_nat:.1f}",
                     f"{S ** 3 / 2048 / t_emu:,.0f}", mb(m_nat), mb(m_emu)])
    print(f"device: {device_name()}  arch: {args.arch}  instruction: {args.instruction}  k_order: {args.k_order}")
    print(table(rows, ["size", "native ms", "tcemu ms", "ratio", "m16n8k16-eq/s", "native temp", "tcemu temp"]))


if __name__ == "__main__":
    main()
