"""Emulated GEMMs (tcemu.matmul, bit-exact) against native jnp.dot on the same data, same run.

    python benchmarks/bench_gemm.py [--sizes 512,1024] [--families all|NAME,...] [--rounds 3]
    python benchmarks/bench_gemm.py --instruction SPELLING [--arch H100] [--k-order sequential]

For each family (an arch and an instruction: every float family and instruction shape, see
``FAMILIES``) and each size S: an S x S x S product of random normal float32 inputs (quantised by
the instruction's element type, or its MX / NVFP4 recipe). Reports native ``jnp.dot`` (float32,
``precision="highest"``) time, tcemu time, their ratio, and the peak temporary memory XLA reserves
for each (compiled memory analysis). Rounds are interleaved (the CPU's speed drifts).
"""
from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

import tcemu
from common import device_name, table, timeit

_F8F6F4 = "mma.sync.aligned.m16n8k32.row.col.kind::f8f6f4.f32.{0}.{0}.f32"
_FP4 = "mma.sync.aligned.m16n8k64.row.col.kind::{}.block_scale.scale_vec::{}.f32.e2m1.e2m1.f32.{}"
FAMILIES = {
    "wgmma-f16": ("H100", "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16"),
    "wmma-f16": ("H100", "wmma.mma.sync.aligned.row.col.m16n16k16.f32.f32"),
    "mma.sync-f16": ("H100", "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"),
    "mma.sync-bf16": ("H100", "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"),
    "wgmma-bf16": ("H100", "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16"),
    "mma.sync-tf32": ("H100", "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32"),
    "wgmma-tf32": ("H100", "wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32"),
    "wgmma-e4m3": ("H100", "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3"),
    "wgmma-e5m2xe4m3": ("H100", "wgmma.mma_async.sync.aligned.m64n128k32.f32.e5m2.e4m3"),
    "mma.sync-e4m3": ("sm_89", "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32"),
    "V100-wmma-f16": ("V100", "wmma.mma.sync.aligned.row.col.m16n16k16.f32.f32"),
    "A100-mma.sync-bf16": ("A100", "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"),
    "f8f6f4-e2m1": ("RTX5090", _F8F6F4.format("e2m1")),
    "f8f6f4-e3m2": ("RTX5090", _F8F6F4.format("e3m2")),
    "f8f6f4-e4m3": ("RTX5090", _F8F6F4.format("e4m3")),
    "MXFP8": ("RTX5090", "mma.sync.aligned.m16n8k32.row.col.kind::mxf8f6f4.block_scale.scale_vec::1X.f32.e4m3.e4m3.f32.ue8m0"),
    "MXFP4": ("RTX5090", _FP4.format("mxf4", "2X", "ue8m0")),
    "NVFP4": ("RTX5090", _FP4.format("mxf4nvf4", "4X", "ue4m3")),
}


def temp_bytes(fn, *args):
    m = jax.jit(fn).lower(*args).compile().memory_analysis()
    return None if m is None else m.temp_size_in_bytes


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="512,1024")
    ap.add_argument("--families", default="all", help=f"comma-separated, from: {', '.join(FAMILIES)}")
    ap.add_argument("--instruction", help="one instruction instead of the families (with --arch)")
    ap.add_argument("--arch", default="H100")
    ap.add_argument("--k-order", default="sequential")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (this machine's speed drifts)")
    args = ap.parse_args()
    if args.instruction:
        fams = {args.instruction: (args.arch, args.instruction)}
    elif args.families == "all":
        fams = FAMILIES
    else:
        unknown = [f for f in args.families.split(",") if f not in FAMILIES]
        if unknown:
            ap.error(f"unknown families {unknown}; valid: {', '.join(FAMILIES)}")
        fams = {f: FAMILIES[f] for f in args.families.split(",")}
    rows = []
    native = jax.jit(lambda a, b: jnp.dot(a, b, precision="highest"))
    for S in (int(s) for s in args.sizes.split(",")):
        rng = np.random.default_rng(S)
        a = jnp.asarray(rng.standard_normal((S, S)).astype(np.float32))
        b = jnp.asarray(rng.standard_normal((S, S)).astype(np.float32))
        emus = {name: jax.jit(lambda a, b, cfg=tcemu.GemmConfig(arch=arch, instruction=ins, k_order=args.k_order):
                              tcemu.matmul(a, b, config=cfg)) for name, (arch, ins) in fams.items()}
        t_nat = float("inf")
        t_emu = dict.fromkeys(emus, float("inf"))
        for _ in range(args.rounds):
            for name, emu in emus.items():
                t_nat = min(t_nat, timeit(native, a, b, repeats=max(args.repeats, 5))[0])
                t_emu[name] = min(t_emu[name], timeit(emu, a, b, repeats=args.repeats, warmup=1)[0])
        mb = lambda x: "n/a" if x is None else f"{x / 2 ** 20:.0f} MiB"  # noqa: E731
        for name, emu in emus.items():
            rows.append([name, fams[name][0], f"{S}^3", f"{t_nat * 1e3:.2f}", f"{t_emu[name] * 1e3:.1f}",
                         f"{t_emu[name] / t_nat:.1f}", mb(temp_bytes(native, a, b)), mb(temp_bytes(emu, a, b))])
    print(f"device: {device_name()}  k_order: {args.k_order}")
    print(table(rows, ["family", "arch", "size", "native ms", "tcemu ms", "ratio", "native temp", "tcemu temp"]))
    worst = max(rows, key=lambda r: float(r[5]))
    print(f"slowest: {worst[0]} at {worst[2]}, ratio {worst[5]}")


if __name__ == "__main__":
    main()
