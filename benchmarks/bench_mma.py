"""Bit-exact emulated MMAs per second, against native ``jnp.dot`` on the same data in the same run.

    python benchmarks/bench_mma.py [--tiles 8192] [--arch H100]

For each instruction, ``tiles`` independent MMAs (random normal operands) are computed by
``tcemu.mma`` (value level, jit-compiled, bit-exact) and by a batched native
``jnp.matmul(a.astype(f32), b.astype(f32), precision="highest") + c`` (block-scaled kinds: random
ue8m0 scales near 1, which the native side leaves out). Reported: time per call,
emulated MMAs/s, the same in m16n8k16-equivalents (M*N*K / 2048), and the slowdown vs native.
AMD MFMAs run on MI300X (CDNA3), MI250X (CDNA2) and MI100 (CDNA1).
"""
from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

import tcemu
from tcemu._src.isa.mfma import parse_mfma
from tcemu._src.isa.parse import parse
from common import device_name, table, timeit

# (spelling, A/B dtype, C dtype, arch: None for --arch); block-scaled kinds get random ue8m0 scales
F4 = ml_dtypes.float4_e2m1fn
INSTRUCTIONS = [
    ("wmma.mma.sync.aligned.row.col.m16n16k16.f32.f32", jnp.float16, jnp.float32, None),
    ("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32", jnp.float16, jnp.float32, None),
    ("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32", jnp.bfloat16, jnp.float32, None),
    ("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32", jnp.float32, jnp.float32, None),
    ("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32", ml_dtypes.float8_e4m3fn, jnp.float32, None),
    ("wmma.mma.sync.aligned.row.col.m16n16k16.s32.s8.s8.s32", jnp.int8, jnp.int32, None),
    ("mma.sync.aligned.m16n8k32.row.col.kind::f8f6f4.f32.e2m1.e2m1.f32", F4, jnp.float32, "RTX5090"),
    ("mma.sync.aligned.m16n8k32.row.col.kind::mxf8f6f4.block_scale.scale_vec::1X.f32.e4m3.e4m3.f32.ue8m0",
     ml_dtypes.float8_e4m3fn, jnp.float32, "RTX5090"),
    # AMD MFMAs (MMA-Sim's models): CDNA3's two-stage adder, CDNA2's pairwise adds, an FMA chain
    ("v_mfma_f32_32x32x8_f16", jnp.float16, jnp.float32, "MI300X"),
    ("v_mfma_f32_16x16x16_bf16", jnp.bfloat16, jnp.float32, "MI300X"),
    ("v_mfma_f32_16x16x8_xf32", jnp.float32, jnp.float32, "MI300X"),
    ("v_mfma_f32_16x16x32_fp8_bf8", ml_dtypes.float8_e4m3fnuz, jnp.float32, "MI300X"),
    ("v_mfma_f32_32x32x8f16", jnp.float16, jnp.float32, "MI250X"),
    ("v_mfma_f32_16x16x4f32", jnp.float32, jnp.float32, "MI250X"),
    ("v_mfma_f32_32x32x8f16", jnp.float16, jnp.float32, "MI100"),  # CDNA1's exact sums (integer limbs)
    ("v_mfma_f32_32x32x4bf16", jnp.bfloat16, jnp.float32, "MI100"),
    ("v_mfma_i32_16x16x32_i8", jnp.int8, jnp.int32, "MI300X"),
    # f64: FMA chains in integer arithmetic (x64 on; native in float64)
    ("mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64", np.float64, np.float64, None),
    ("mma.sync.aligned.m16n8k16.row.col.f64.f64.f64.f64", np.float64, np.float64, None),
    ("v_mfma_f64_16x16x4f64", np.float64, np.float64, "MI300X"),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiles", type=int, default=8192)
    ap.add_argument("--arch", default="H100")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", default="", help="substring filter on the spellings")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    rows = []
    for sp, adt, cdt, arch in INSTRUCTIONS:
        if args.only not in sp:
            continue
        with jax.enable_x64(adt == np.float64):
            rows.append(_row(args, rng, sp, adt, cdt, arch))
    print(f"device: {device_name()}  arch preset: {args.arch} (kind:: forms: RTX5090; v_mfma: MI300X, MI250X, MI100)  "
          f"tiles per call: {args.tiles}")
    print(table(rows, ["instruction", "tiles", "emu ms", "MMAs/s", "m16n8k16-eq/s", "(median)", "native ms",
                       "emu/native"]))


def _row(args, rng, sp, adt, cdt, arch):
    """One table row: ``sp`` emulated and native on the same random operands."""
    arch = arch or args.arch
    ins = parse_mfma(sp, arch) if sp.startswith("v_mfma") else parse(sp)
    T, M, N, K = args.tiles, ins.m, ins.n, ins.k
    bdt = ml_dtypes.float8_e5m2fnuz if sp.endswith("fp8_bf8") else adt
    if np.dtype(adt).kind == "i":
        a = jnp.asarray(rng.integers(-128, 128, (T, M, K)), adt)
        b = jnp.asarray(rng.integers(-128, 128, (T, K, N)), adt)
        c = jnp.asarray(rng.integers(-1000, 1000, (T, M, N)), cdt)
    else:
        a = jnp.asarray(rng.standard_normal((T, M, K)).astype(adt))
        b = jnp.asarray(rng.standard_normal((T, K, N)).astype(bdt))
        c = jnp.asarray(rng.standard_normal((T, M, N)).astype(cdt))
    scales = {}
    if ins.scale_vec:  # ue8m0 codes around 2**0
        scales = dict(scale_a=jnp.asarray(rng.integers(120, 135, (T, M, ins.scale_vec)), jnp.uint8),
                      scale_b=jnp.asarray(rng.integers(120, 135, (T, ins.scale_vec, N)), jnp.uint8))
    emu = jax.jit(lambda a, b, c, sp=sp, arch=arch, s=scales: tcemu.mma(sp, a, b, c, arch=arch, **s))
    nat_t = jnp.int32 if np.dtype(adt).kind == "i" else jnp.float64 if adt == np.float64 else jnp.float32
    native = jax.jit(lambda a, b, c: jnp.matmul(a.astype(nat_t), b.astype(nat_t), precision="highest") + c)
    # interleaved rounds: this machine's speed drifts, so both sides see the same conditions
    e_ts, n_ts = [], []
    for _ in range(args.rounds):
        e_ts.append(timeit(emu, a, b, c, repeats=args.repeats))
        n_ts.append(timeit(native, a, b, c, repeats=args.repeats))
    e_best, e_med = min(t[0] for t in e_ts), sorted(t[1] for t in e_ts)[len(e_ts) // 2]
    n_best = min(t[0] for t in n_ts)
    eq = M * N * K / 2048
    return [sp.replace(".sync.aligned", ""), T, f"{e_best * 1e3:.2f}", f"{T / e_best:,.0f}",
            f"{T * eq / e_best:,.0f}", f"{T * eq / e_med:,.0f}", f"{n_best * 1e3:.3f}", f"{e_best / n_best:.1f}"]


if __name__ == "__main__":
    main()
