"""Tune the Pallas GEMM kernel (tcemu/_src/gemm_kernel.py) on a GPU: time its sequential K loop
for output tiles and warp counts, against the XLA path, on one GEMM.

    python experiments/hardware/kernel_tiles.py --size 4096 --variants 64x64/4,32x64/4,32x32/4
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
import tcemu  # noqa: E402
from tcemu._src import gemm, gemm_kernel  # noqa: E402
from tcemu._src.arch import resolve  # noqa: E402
from tcemu._src.numerics import mma as mma_numerics  # noqa: E402


def best_ms(fn, *args, repeats=3):
    jax.block_until_ready(fn(*args))
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        ts.append(time.perf_counter() - t)
    return min(ts) * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--instruction", default="wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16")
    ap.add_argument("--arch", default="H100")
    ap.add_argument("--variants", default="64x64/4,32x64/4,32x32/4,64x32/4,32x64/2,64x64/8")
    ap.add_argument("--xla", action="store_true", help="also time the XLA path")
    args = ap.parse_args()
    cfg = tcemu.GemmConfig(arch=args.arch, instruction=args.instruction)
    ins = cfg.ins
    model = mma_numerics.resolve_model(ins, None, resolve(args.arch))
    S = args.size
    rng = np.random.default_rng(0)
    A = gemm._bits(gemm.quantize(jnp.asarray(rng.standard_normal((S, S)), jnp.float32), ins.atype), ins.atype)
    B = gemm._bits(gemm.quantize(jnp.asarray(rng.standard_normal((S, S)), jnp.float32), ins.btype), ins.btype)
    ref = None
    print(f"{jax.devices()[0].device_kind}  {args.instruction}  {args.arch}  {S}^3")
    if args.xla:
        os.environ["TCEMU_GEMM_KERNEL"] = "off"
        f = jax.jit(lambda a, b: gemm.gemm_bits(a, b, cfg)[0])
        t = time.perf_counter()
        ref = np.asarray(f(A, B))
        print(f"xla path: {best_ms(f, A, B):8.1f} ms  (first call {time.perf_counter() - t:.1f} s)")
    os.environ["TCEMU_GEMM_KERNEL"] = "triton" if jax.default_backend() == "gpu" else "interpret"
    for v in args.variants.split(","):
        t_, w = v.split("/")
        os.environ["TCEMU_GEMM_TILE"], os.environ["TCEMU_GEMM_WARPS"] = t_, w
        f = jax.jit(lambda a, b: gemm_kernel.sequential(a, b, ins, model))
        t = time.perf_counter()
        out = np.asarray(f(A, B))
        first = time.perf_counter() - t
        same = "" if ref is None else f"  same bits as xla: {np.array_equal(out, ref)}"
        print(f"tile {t_:>7} warps {w}: {best_ms(f, A, B):8.1f} ms  (first call {first:.1f} s){same}", flush=True)


if __name__ == "__main__":
    main()
