"""Emulated GEMMs (tcemu.matmul, bit-exact) against two native GEMMs of the same data, same run.

    python benchmarks/bench_gemm.py [--sizes 512,1024] [--families all|NAME,...] [--rounds 3]
    python benchmarks/bench_gemm.py --instruction SPELLING [--arch H100] [--k-order sequential]

For each family (an arch and an instruction: every float family and instruction shape, and
``wgmma-e4m3-block128``, fp8 with DeepSeek-V3-style block scales along K; ``serial4-f16-bias``,
CUTLASS 2's serial split-K with a bias, whose epilogue runs per slice; see ``FAMILIES``) and
each size S: an S x S x S product of random normal float32 inputs (quantised by the instruction's
element type, or its MX / NVFP4 recipe). Two baselines, timed in the same interleaved rounds:

* native f32: ``jnp.dot(a, b, precision="highest")`` on the float32 inputs. On an H100/H200 this
  runs on the CUDA cores (full float32), not on the tensor cores.
* native <type>: the GEMM the device runs for the family's input type, on inputs already cast
  (the cast is not timed): ``jnp.dot(a.astype(t), b.astype(t), preferred_element_type=float32)``
  for f16, bf16, e4m3 and e5m2 (e5m2 x e4m3 as a mixed pair); for tf32 families the float32 dot at
  ``precision="default"`` (tf32 tensor cores on NVIDIA GPUs; on a CPU a plain float32 dot).
  MX and NVFP4 families: the e4m3 dot without the block scales. fp4 / fp6 element types (e2m1,
  e3m2, e2m3), which XLA cannot multiply, use e4m3 instead and are marked ``e4m3*``; other types
  get "n/a". The block128 family (random 1x128 scales in [0.5, 2) for A and B; sizes that are not
  multiples of 128 are skipped): the e4m3 dot without its scales. On a GPU with tensor cores for
  the type (H100/H200: f16, bf16, tf32, fp8) this is a tensor-core GEMM; on a CPU it is whatever
  XLA's CPU backend does with the type (upcasts or library kernels), not a tensor-core GEMM.

Columns: the two baselines' and tcemu's times, tcemu's time over each ("x f32", "x type"), and the
peak temporary memory XLA reserves (compiled memory analysis) for native f32 and tcemu. The last
line names the slowest case against native f32. Rounds are interleaved (the CPU's speed drifts).
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
_E4M3 = "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3"
BLOCK = 128  # scale block along K of the block-scaled family
FAMILIES = {
    "wgmma-f16": ("H100", "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16"),
    "wmma-f16": ("H100", "wmma.mma.sync.aligned.row.col.m16n16k16.f32.f32"),
    "mma.sync-f16": ("H100", "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"),
    "mma.sync-bf16": ("H100", "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"),
    "wgmma-bf16": ("H100", "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16"),
    "mma.sync-tf32": ("H100", "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32"),
    "wgmma-tf32": ("H100", "wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32"),
    "wgmma-e4m3": ("H100", _E4M3),
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
    # fp8 with block scales along K (1x128 for A and B): cuBLASLt's block-scaled Hopper GEMM
    "wgmma-e4m3-block128": ("H100", _E4M3),
    # CUTLASS 2's serial split-K (cuBLASLt INPLACE, 4 slices) with a bias and f16 output:
    # F.linear at shapes off a multiple of 8; the epilogue runs once per slice
    "serial4-f16-bias": ("H100", "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32"),
}
BLOCK_SCALED = {"wgmma-e4m3-block128"}
SERIAL = {"serial4-f16-bias": tcemu.KSchedule(k_tile=32, residue="first", slices=4, slice_align=8,
                                              reduction="serial", partials="f16")}
_DTYPES = {"f16": jnp.float16, "bf16": jnp.bfloat16, "e4m3": jnp.float8_e4m3fn, "e5m2": jnp.float8_e5m2}
_SUB_BYTE = ("e2m1", "e3m2", "e2m3")  # no XLA GEMM: e4m3 stands in


def config(name, arch, ins, k_order):
    if name in BLOCK_SCALED:  # promotion every block: each block's partial sum enters with its scales
        return tcemu.GemmConfig(arch=arch, instruction=ins, k_order="promotion", promotion_interval=BLOCK,
                                epilogue=tcemu.Epilogue(scale_block=BLOCK))
    if name in SERIAL:
        return tcemu.GemmConfig(arch=arch, instruction=ins, schedule=SERIAL[name])
    return tcemu.GemmConfig(arch=arch, instruction=ins, k_order=k_order)


def native_type(cfg):
    """(label, function of float32 (a, b) giving the operands the typed dot takes, the typed dot),
    or (label "n/a", None, None) for element types with no native float GEMM (integers)."""
    at, bt = cfg.ins.atype, cfg.ins.btype
    if at == "tf32":
        return "tf32", lambda a, b: (a, b), jax.jit(lambda a, b: jnp.dot(a, b, precision="default"))
    label = "x".join(dict.fromkeys((at, bt)))
    sub = [t if t in _DTYPES else "e4m3" if t in _SUB_BYTE else None for t in (at, bt)]
    if None in sub:
        return "n/a", None, None
    if sub != [at, bt]:  # fp4 / fp6: e4m3, marked with *
        label = "x".join(dict.fromkeys(sub)) + "*"
    da, db = _DTYPES[sub[0]], _DTYPES[sub[1]]
    return label, (lambda a, b: (a.astype(da), b.astype(db))), \
        jax.jit(lambda a, b: jnp.dot(a, b, preferred_element_type=jnp.float32))


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
    cfgs = {name: config(name, arch, ins, args.k_order) for name, (arch, ins) in fams.items()}
    rows = []
    native = jax.jit(lambda a, b: jnp.dot(a, b, precision="highest"))
    for S in (int(s) for s in args.sizes.split(",")):
        rng = np.random.default_rng(S)
        a = jnp.asarray(rng.standard_normal((S, S)).astype(np.float32))
        b = jnp.asarray(rng.standard_normal((S, S)).astype(np.float32))
        kb = -(-S // BLOCK)
        sa = jnp.asarray(rng.uniform(0.5, 2.0, (S, kb)).astype(np.float32))  # 1x128 scales, as amax / 448 gives
        sb = jnp.asarray(rng.uniform(0.5, 2.0, (kb, S)).astype(np.float32))
        emus, typed = {}, {}
        for name, cfg in cfgs.items():
            if name in BLOCK_SCALED:
                if S % BLOCK:
                    print(f"{name}: skipped at {S}^3 (K must be a multiple of {BLOCK})")
                    continue
                emus[name] = (jax.jit(lambda a, b, sa, sb, cfg=cfg: tcemu.matmul(a, b, scale_a=sa, scale_b=sb,
                                                                                  config=cfg)), (a, b, sa, sb))
            elif name in SERIAL:  # bias and output type: the epilogue per slice
                emus[name] = (jax.jit(lambda a, b, bias, cfg=cfg: tcemu.matmul(a, b, bias=bias, out_type="f16",
                                                                               config=cfg)), (a, b, a[0]))
            else:
                emus[name] = (jax.jit(lambda a, b, cfg=cfg: tcemu.matmul(a, b, config=cfg)), (a, b))
            label, cast, dot = native_type(cfg)
            typed[name] = (label, dot, None if cast is None else jax.block_until_ready(cast(a, b)))
        t_nat = float("inf")
        t_emu = dict.fromkeys(emus, float("inf"))
        t_typ = dict.fromkeys(emus, float("inf"))
        for _ in range(args.rounds):
            for name, (emu, eargs) in emus.items():
                t_nat = min(t_nat, timeit(native, a, b, repeats=max(args.repeats, 5))[0])
                _, dot, targs = typed[name]
                if dot is not None:
                    t_typ[name] = min(t_typ[name], timeit(dot, *targs, repeats=max(args.repeats, 5))[0])
                t_emu[name] = min(t_emu[name], timeit(emu, *eargs, repeats=args.repeats, warmup=1)[0])
        mb = lambda x: "n/a" if x is None else f"{x / 2 ** 20:.0f} MiB"  # noqa: E731
        for name, (emu, eargs) in emus.items():
            typ = typed[name][1] is not None
            rows.append([name, fams[name][0], f"{S}^3", typed[name][0], f"{t_nat * 1e3:.2f}",
                         f"{t_typ[name] * 1e3:.2f}" if typ else "n/a", f"{t_emu[name] * 1e3:.1f}",
                         f"{t_emu[name] / t_nat:.1f}", f"{t_emu[name] / t_typ[name]:.1f}" if typ else "n/a",
                         mb(temp_bytes(native, a, b)), mb(temp_bytes(emu, *eargs))])
    print(f"device: {device_name()}  k_order: {args.k_order} (block128: promotion every {BLOCK})")
    if not rows:
        print("nothing to time")
        return
    print(table(rows, ["family", "arch", "size", "type", "native f32 ms", "native type ms", "tcemu ms",
                       "x f32", "x type", "native temp", "tcemu temp"]))
    print("type: the native typed GEMM's input type; * = e4m3 standing in for an fp4/fp6 type XLA cannot "
          "multiply; MX, NVFP4 and block128 rows: the typed dot without the block scales")
    worst = max(rows, key=lambda r: float(r[7]))
    print(f"slowest: {worst[0]} at {worst[2]}, x f32 {worst[7]}, x {worst[3]} {worst[8]}")


if __name__ == "__main__":
    main()
