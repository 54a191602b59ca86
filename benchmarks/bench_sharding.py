"""Emulation sharded over every local device against one device, same data, same run.

    python benchmarks/bench_sharding.py [--size 8192] [--batch 16384] [--warps 262144,524288,1048576]

Three workloads, each timed on one device and on a mesh of all local devices (``NamedSharding``),
with the bits of the two compared:

* ``matmul``: an S x S x S fp16 -> fp32 ``tcemu.matmul`` (H100 ``wgmma`` numerics), A's rows
  sharded; the result comes back sharded by rows.
* ``train step``: ``jax.value_and_grad`` of a two-layer MLP whose layers call
  ``tcemu.dot_general`` (bf16 ``mma.sync`` numerics, forward and backward GEMMs), the batch
  sharded, the weights replicated (data parallelism). The gradients are compared; the loss is a
  native float32 ``jnp.mean``, whose summation order XLA chooses per partitioning.
* ``vmap warps``: a register-level program (``wmma.load.a``, ``wmma.load.b``, ``wmma.mma``,
  ``wmma.store.d``) vmapped over warps, the warp axis sharded; one row per warp count (one
  device's time per warp is not constant in the count, so one count alone misstates the
  throughput ratio).
"""
from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import tcemu
from common import device_name, table, timeit


def _same(x, y) -> bool:
    return all(np.array_equal(np.atleast_1d(np.asarray(a)).view(np.uint8), np.atleast_1d(np.asarray(b)).view(np.uint8))
               for a, b in zip(jax.tree.leaves(x), jax.tree.leaves(y)))


def _compare(name, fn, args, specs, mesh, repeats, compare=lambda out: out):
    one = jax.devices()[0]
    single = [jax.device_put(a, one) for a in args]
    sharded = [jax.device_put(a, NamedSharding(mesh, s)) for a, s in zip(args, specs)]
    t1 = timeit(fn, *single, repeats=repeats, warmup=1)[0]
    tn = timeit(fn, *sharded, repeats=repeats, warmup=1)[0]
    same = _same(compare(fn(*single)), compare(fn(*sharded)))
    return [name, f"{t1 * 1e3:.1f}", f"{tn * 1e3:.1f}", f"{t1 / tn:.2f}", "yes" if same else "NO"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=int, default=8192)
    ap.add_argument("--batch", type=int, default=16384)
    ap.add_argument("--width", type=int, default=4096)
    ap.add_argument("--warps", default="262144,524288,1048576", help="comma-separated warp counts")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    mesh = Mesh(np.array(jax.devices()), ("d",))
    rng = np.random.default_rng(0)
    rows = []

    S = args.size
    cfg = tcemu.GemmConfig(arch="H100", instruction="wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16")
    a = rng.standard_normal((S, S)).astype(np.float16)
    b = rng.standard_normal((S, S)).astype(np.float16)
    mm = jax.jit(lambda a, b: tcemu.matmul(a, b, config=cfg))
    rows.append(_compare(f"matmul {S}^3 f16", mm, (a, b), (P("d", None), P()), mesh, args.repeats))

    B, Wd = args.batch, args.width
    base = tcemu.GemmConfig(arch="H100", instruction="mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32")
    dcfg = base.replace(grad_lhs=base, grad_rhs=base)  # the backward GEMMs emulated too
    dn = (((1,), (0,)), ((), ()))

    def loss(params, x, y):
        h = jax.nn.relu(tcemu.dot_general(x, params[0], dn, config=dcfg))
        out = tcemu.dot_general(h, params[1], dn, config=dcfg)
        return jnp.mean((out - y) ** 2)

    step = jax.jit(jax.value_and_grad(loss))
    params = (rng.standard_normal((Wd, Wd)).astype(np.float32) / 64, rng.standard_normal((Wd, 256)).astype(np.float32) / 64)
    x = rng.standard_normal((B, Wd)).astype(np.float32)
    y = rng.standard_normal((B, 256)).astype(np.float32)
    rows.append(_compare(f"train step {B}x{Wd} bf16", lambda p0, p1, x, y: step((p0, p1), x, y),
                         (*params, x, y), (P(), P(), P("d", None), P("d", None)), mesh, args.repeats,
                         compare=lambda out: out[1]))

    ld_a = tcemu.ptx("wmma.load.a.sync.aligned.row.m16n16k16.f16", arch="sm_90")
    ld_b = tcemu.ptx("wmma.load.b.sync.aligned.col.m16n16k16.f16", arch="sm_90")
    mma = tcemu.ptx("wmma.mma.sync.aligned.row.col.m16n16k16.f32.f32", arch="sm_90")
    st = tcemu.ptx("wmma.store.d.sync.aligned.row.m16n16k16.f32", arch="sm_90")

    def warp(mem):
        r = ld_a(tcemu.regfile(32), mem, dst=range(0, 8), p=0)
        r = ld_b(r, mem, dst=range(8, 16), p=512)
        r = mma(r, d=range(16, 24), a=range(0, 8), b=range(8, 16), c=range(24, 32))
        return st(mem, r, src=range(16, 24), p=1024)

    for W in map(int, args.warps.split(",")):
        vals = rng.standard_normal((W, 512)).astype(np.float16)
        mem = np.zeros((W, 2048), np.uint8)
        mem[:, :1024] = vals.view(np.uint8)
        rows.append(_compare(f"vmap warps {W} wmma", jax.jit(jax.vmap(warp)), (mem,), (P("d", None),), mesh,
                             args.repeats))

    print(f"device: {device_name()}")
    print(table(rows, ["workload", "1 device ms", f"{len(jax.devices())} devices ms", "speed-up", "same bits"]))


if __name__ == "__main__":
    main()
