"""Register-level ``wgmma.mma_async`` and ``wgmma.mma_async.sp`` vmapped over warpgroups, against
native ``jnp.matmul`` on the same operands in the same run, for every input family at N = 8, 64 and
256 (sparse: every family but b1; native multiplies the decompressed A).

    python benchmarks/bench_wgmma_regs.py [--warpgroups 256] [--only e4m3]

Each warpgroup has its own registers (A in 4 of them, D/C after) and its own shared memory holding B
(K-major, 128-byte swizzle); every other family reads A through a descriptor too (``a from``
"desc": the rows marked so). The native side is ``jnp.matmul(a, b)`` in float32 ``highest``
(int32 for s8, b1: AND then a sum) plus C on the same values; "value ms" is ``tcemu.mma`` of the
same spelling on the same operands (the numerics alone). Reported: ms per call, warpgroup
instructions per second, and the slowdown of register level against native.
"""
from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

import tcemu
from tcemu._src.isa.fragments import matrix_to_fragment
from common import device_name, table, timeit

FAMILIES = [  # (A/B types and D type, A from a descriptor?)
    ("f32.f16.f16", False), ("f16.f16.f16", True), ("f32.bf16.bf16", False), ("f32.tf32.tf32", True),
    ("f32.e4m3.e4m3", False), ("f16.e5m2.e4m3", True), ("s32.s8.s8", False), ("s32.b1.b1.and.popc", True)]
K = {"f16": 16, "bf16": 16, "tf32": 8, "e4m3": 32, "e5m2": 32, "s8": 32, "b1": 256}
DT = {"f16": np.float16, "bf16": ml_dtypes.bfloat16, "tf32": np.float32, "e4m3": ml_dtypes.float8_e4m3fn,
      "e5m2": ml_dtypes.float8_e5m2, "s8": np.int8, "b1": np.uint8}


SPARSE = [("f32.f16.f16", False), ("f32.bf16.bf16", True), ("f32.tf32.tf32", True), ("f16.e4m3.e5m2", False),
          ("s32.s8.s8", True)]  # wgmma.mma_async.sp: K twice the dense one
PAIRS = np.array([(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)])


def operands(rng, fam, n, W, sparse=False):
    """(d, a, b, K, A (W, 64, K of A), B (W, K, N), C, metadata or None); sparse: A compressed."""
    d, a, b = fam.split(".")[:3]
    k = K[a] * (2 if sparse else 1)
    ka = k // 2 if sparse else k
    if a in ("s8", "b1"):
        hi = 2 if a == "b1" else 128
        A = rng.integers(-hi if a == "s8" else 0, hi, (W, 64, ka)).astype(DT[a])
        B = rng.integers(-hi if a == "s8" else 0, hi, (W, k, n)).astype(DT[b])
        C = rng.integers(-1000, 1000, (W, 64, n)).astype(np.int32)
    else:
        A = rng.standard_normal((W, 64, ka)).astype(np.float32).astype(DT[a])
        B = rng.standard_normal((W, k, n)).astype(np.float32).astype(DT[b])
        C = rng.standard_normal((W, 64, n)).astype(np.float16 if d == "f16" else np.float32)
    meta = None
    if sparse:
        meta = (rng.integers(0, 2, (W, 64, ka)) if a == "tf32" else
                PAIRS[rng.integers(0, 6, (W, 64, ka // 2))].reshape(W, 64, ka)).astype(np.int8)
    return d, a, b, k, A, B, C, meta


def bench(rng, fam, a_desc, n, W, repeats, sparse):
    d, at, bt, k, A, B, C, meta = operands(rng, fam, n, W, sparse)
    sp = f"wgmma.mma_async{'.sp' if sparse else ''}.sync.aligned.m64n{n}k{k}.{fam}"
    wg = tcemu.ptx(sp, arch="H100")
    bdesc = tcemu.WgmmaDescriptor(8192, 16, 1024, "128B")
    adesc = tcemu.WgmmaDescriptor(0, 16, 1024, "128B")
    put = jax.vmap(lambda m, x, y: adesc.put(bdesc.put(m, y, bt, operand="b", sparse=sparse), x, at, operand="a"))
    smem = put(jnp.zeros((W, 8192 + 32 * n * 64 // 8 + 1024), jnp.uint8), jnp.asarray(A), jnp.asarray(B))
    cbits = jnp.asarray(C.view({2: np.uint16, 4: np.uint32}[C.itemsize]).astype(np.uint32))
    e = (np.zeros((W, 128), np.uint32) if meta is None
         else np.stack([tcemu.sparse_metadata(sp, m) for m in meta]))
    regs = jax.vmap(lambda c, m: jnp.concatenate([jnp.zeros((128, 4), jnp.uint32), m[:, None],
                                                  matrix_to_fragment(c, wg.fd)], 1))(cbits, jnp.asarray(e))
    if not a_desc:
        abits = np.asarray(A).view({1: np.uint8, 2: np.uint16, 4: np.uint32}[np.asarray(A).itemsize])
        afr = jax.vmap(lambda x: matrix_to_fragment(x, wg.fa))(jnp.asarray(abits.astype(np.uint32)))
        regs = regs.at[:, :, :4].set(afr)
    src = dict(a_desc=adesc.encode()) if a_desc else dict(a=range(4))
    src |= dict(sp_meta=4) if sparse else {}
    emu = jax.jit(jax.vmap(lambda r, m: wg(r, m, d=range(5, 5 + wg.fd.nregs), b_desc=bdesc.encode(), **src)))
    nt = jnp.int32 if at in ("s8", "b1") else jnp.float32
    native = jax.jit(lambda a, b, c: jnp.matmul(a.astype(nt), b.astype(nt), precision="highest") + c.astype(nt))
    md = {} if meta is None else {"metadata": jnp.asarray(meta)}
    value = jax.jit(lambda a, b, c, sp=sp: tcemu.mma(sp, a, b, c, arch="H100", **md))
    ops = [jnp.asarray(x) for x in (A, B, C)]
    dense = ops if meta is None else [_decompressed(A, meta, k, at), ops[1], ops[2]]  # native: the dense A
    e_best, e_med = timeit(emu, regs, smem, repeats=repeats)
    v_best, _ = timeit(value, *ops, repeats=repeats)
    n_best, _ = timeit(native, *dense, repeats=repeats)
    return [f"{'sp.' if sparse else ''}m64n{n}k{k}.{fam}", "desc" if a_desc else "regs", W, f"{e_best * 1e3:.2f}",
            f"{W / e_best:,.0f}", f"{W / e_med:,.0f}", f"{v_best * 1e3:.2f}", f"{n_best * 1e3:.3f}",
            f"{e_best / n_best:.1f}"]


def _decompressed(A, meta, k, at):
    """The dense (W, 64, K) A of a compressed A and its metadata."""
    W, _, ka = A.shape
    g = 2 if at == "tf32" else 4
    cols = (np.arange(ka) // (g // 2)) * g + meta
    out = np.zeros((W, 64, k), A.dtype)
    np.put_along_axis(out, cols.astype(np.int64), A, axis=-1)
    return jnp.asarray(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--warpgroups", type=int, default=256)
    ap.add_argument("--sizes", default="8,64,256", help="N values, comma-separated")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--only", default="", help="substring filter on the families (sp. for the sparse ones)")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    W = args.warpgroups
    rows = []
    for sparse, fams in ((False, FAMILIES), (True, SPARSE)):
        for fam, a_desc in fams:
            if args.only not in ("sp." if sparse else "") + fam:
                continue
            for n in (int(x) for x in args.sizes.split(",")):
                rows.append(bench(rng, fam, a_desc, n, W, args.repeats, sparse))
    print(f"device: {device_name()}  warpgroups per call: {W}")
    print(table(rows, ["wgmma", "a from", "warpgroups", "regs ms", "wgmma/s", "(median)", "value ms", "native ms",
                       "regs/native"]))


if __name__ == "__main__":
    main()
