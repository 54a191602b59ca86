"""Digests of emulated outputs over many configurations, to show that a change keeps the bits:
run it with the old and the new code on the path and diff the two outputs.

    PYTHONPATH=/path/to/old python benchmarks/bits_digest.py > old.txt
    PYTHONPATH=/path/to/new python benchmarks/bits_digest.py > new.txt
    diff old.txt new.txt && echo same bits

One line per case: sha256 (16 hex digits) of ``tcemu.matmul`` for 15 instruction families x 8 K
schedules (sequential, split-K, promotion, pairwise, residue first, shuffle reduction, a Triton
reduction over threads and lanes, bf16 partials with the padding at the start) on M x 1024 x 72
inputs whose exponents spread over +-0, 6 and 20 binades (an inf in A, a NaN in B), a batched GEMM
and its gradient through emulated backward GEMMs, and batched ``tcemu.mma`` of four instructions.
A case that raises prints the exception's type (block-scaled GEMMs refuse schedules that cut
scale blocks). Uses only the public API, so it runs on any version of tcemu.
"""
from __future__ import annotations

import argparse
import hashlib

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

import tcemu

F8 = "mma.sync.aligned.m16n8k32.row.col.kind::f8f6f4.f32.{0}.{1}.f32"
FP4 = "mma.sync.aligned.m16n8k64.row.col.kind::{}.block_scale.scale_vec::{}.f32.e2m1.e2m1.f32.{}"
FAMILIES = [
    ("H100", "m16n8k16.f32.f16.f16.f32"), ("H100", "m16n8k16.f32.bf16.bf16.f32"), ("H100", "m16n8k8.f32.tf32.tf32.f32"),
    ("V100", "wmma.mma.sync.aligned.row.col.m16n16k16.f32.f32"), ("A100", "m16n8k16.f32.bf16.bf16.f32"),
    ("A100", "m16n8k8.f32.tf32.tf32.f32"), ("H100", "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3"),
    ("H100", "wgmma.mma_async.sync.aligned.m64n64k32.f32.e5m2.e4m3"), ("sm_89", "m16n8k32.f32.e4m3.e5m2.f32"),
    ("H100", "mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16"),
    ("RTX5090", F8.format("e2m1", "e3m2")), ("RTX5090", F8.format("e4m3", "e2m3")),
    ("RTX5090", "mma.sync.aligned.m16n8k32.row.col.kind::mxf8f6f4.block_scale.scale_vec::1X.f32.e4m3.e4m3.f32.ue8m0"),
    ("RTX5090", FP4.format("mxf4", "2X", "ue8m0")), ("RTX5090", FP4.format("mxf4nvf4", "4X", "ue4m3")),
]
K = tcemu.KSchedule
SCHEDULES = [dict(), dict(k_order="split_k", split_k=3), dict(k_order="promotion", promotion_interval=128),
             dict(k_order="pairwise"), dict(schedule=K(k_tile=64, residue="first")),
             dict(schedule=K(k_tile=64, slices=5, slice_align=8, reduction="shuffle")),
             dict(schedule=K(k_tile=32, slices=6, slice_align=16, reduction="pairwise", reduce_threads=4,
                             reduce_lanes=2)),
             dict(schedule=K(k_tile=64, slices=3, partials="bf16", slice_pad="start", slice_align=1))]
MMAS = [("H100", "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32", (16, 8, 16), jnp.float16),
        ("A100", "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32", (16, 8, 8), jnp.float32),
        ("H100", "wmma.mma.sync.aligned.row.col.m16n16k16.f32.f32", (16, 16, 16), jnp.float16),
        ("sm_89", "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32", (16, 8, 32), ml_dtypes.float8_e4m3fn)]


def digest(x) -> str:
    return hashlib.sha256(np.asarray(x).tobytes()).hexdigest()[:16]


def lines(M: int, spreads):
    rng = np.random.default_rng(0)
    Kd, N = 1024, 72
    for spread in spreads:
        a = (rng.standard_normal((M, Kd)) * 2.0 ** rng.integers(-spread, spread + 1, (M, Kd))).astype(np.float32)
        b = (rng.standard_normal((Kd, N)) * 2.0 ** rng.integers(-spread, spread + 1, (Kd, N))).astype(np.float32)
        a[3, 5], b[7, 2] = np.inf, np.nan
        for arch, ins in FAMILIES:
            for s in SCHEDULES:
                try:
                    out = digest(tcemu.matmul(a, b, config=tcemu.GemmConfig(arch=arch, instruction=ins, **s)))
                except Exception as e:  # noqa: BLE001 - the refusal is part of what is compared
                    out = f"error {type(e).__name__}"
                yield f"{spread} {arch} {ins} {s} {out}"
        cfg = tcemu.GemmConfig(arch="H100", instruction="m16n8k16.f32.bf16.bf16.f32", k_order="split_k")
        ab = jnp.asarray(a[:64].reshape(2, 32, Kd))
        yield f"{spread} batched {digest(tcemu.matmul(ab, b, config=cfg))}"
        both = cfg.replace(grad_lhs=cfg, grad_rhs=cfg)
        yield f"{spread} grad {digest(jax.grad(lambda w: (tcemu.matmul(ab, w, config=both) ** 2).sum())(b))}"
    for arch, ins, (m, n, k), dt in MMAS:
        aa = jnp.asarray(rng.standard_normal((64, m, k)) * 4, dt)
        bb = jnp.asarray(rng.standard_normal((64, k, n)) * 4, dt)
        cc = jnp.asarray(rng.standard_normal((64, m, n)), jnp.float32)
        yield f"mma {arch} {ins} {digest(tcemu.mma(ins, aa, bb, cc, arch=arch))}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=96, help="M of the GEMMs")
    ap.add_argument("--spreads", default="0,6,20", help="exponent spreads in binades, comma-separated")
    args = ap.parse_args()
    out = list(lines(args.rows, [int(x) for x in args.spreads.split(",")]))
    print("\n".join(out))
    print("TOTAL", digest("\n".join(out).encode()))


if __name__ == "__main__":
    main()
