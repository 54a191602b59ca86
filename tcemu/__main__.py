"""Command line: ``python -m tcemu demo`` and
``python -m tcemu layout SPELLING [--arch sm_90] [--matrix a] [--png out.png]``."""
from __future__ import annotations

import argparse
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import tcemu


def _chain(spelling, a, b, arch):
    """A (M, K) @ B (K, N), M, N, K multiples of the instruction's shape, as a chain of one
    instruction along K per output tile (D of step k is C of step k+1)."""
    ins = tcemu._src.isa.parse.parse(spelling)
    (M, K), N = a.shape, b.shape[1]
    m, n, k = ins.m, ins.n, ins.k
    a_t = a.reshape(M // m, m, K // k, k).transpose(2, 0, 1, 3)[:, :, None]  # (steps, Mt, 1, m, k)
    b_t = b.reshape(K // k, k, N // n, n).transpose(0, 2, 1, 3)[:, None]  # (steps, 1, Nt, k, n)

    def step(c, ab):
        return tcemu.mma(spelling, ab[0], ab[1], c, arch=arch), None

    d, _ = jax.lax.scan(step, jnp.zeros((M // m, N // n, m, n), jnp.float32), (a_t, b_t))
    return d.transpose(0, 2, 1, 3).reshape(M, N)


def demo(args):
    print("tcemu demo: one warp through the register file, then accumulation error per GPU\n")
    rng = np.random.default_rng(0)
    # 1. register level on an H100/H200 (sm_90)
    a = rng.standard_normal((16, 16)).astype(np.float16)
    b = rng.standard_normal((16, 16)).astype(np.float16)
    c = rng.standard_normal((16, 16)).astype(np.float32)
    mem = tcemu.memory(4096)
    mem = tcemu.put_matrix(mem, a, p=0)
    mem = tcemu.put_matrix(mem, b, p=512, layout="col")
    mem = tcemu.put_matrix(mem, c, p=1024)
    ld_a = tcemu.ptx("wmma.load.a.sync.aligned.row.m16n16k16.f16", arch="sm_90")
    ld_b = tcemu.ptx("wmma.load.b.sync.aligned.col.m16n16k16.f16", arch="sm_90")
    ld_c = tcemu.ptx("wmma.load.c.sync.aligned.row.m16n16k16.f32", arch="sm_90")
    mma = tcemu.ptx("wmma.mma.sync.aligned.row.col.m16n16k16.f32.f32", arch="sm_90")
    st_d = tcemu.ptx("wmma.store.d.sync.aligned.row.m16n16k16.f32", arch="sm_90")
    regs = tcemu.regfile(32)
    regs = ld_a(regs, mem, dst=range(0, 8), p=0)
    regs = ld_b(regs, mem, dst=range(8, 16), p=512)
    regs = ld_c(regs, mem, dst=range(16, 24), p=1024)
    regs = mma(regs, d=range(24, 32), a=range(0, 8), b=range(8, 16), c=range(16, 24))
    mem = st_d(mem, regs, src=range(24, 32), p=2048)
    d = np.asarray(tcemu.get_matrix(mem, (16, 16), "f32", p=2048))
    exact = a.astype(np.float64) @ b.astype(np.float64) + c
    print("1. wmma on sm_90: load.a/.b/.c -> mma -> store.d for one warp")
    print(f"   A fragment: {ld_a.nregs} registers/lane, each element held {ld_a.fragment.copies}x "
          f"(lane 0 holds A{ld_a.fragment.coords[0, :4].tolist()}...)")
    print(f"   lane 0 registers x0..x3 after load.a: {[hex(int(x)) for x in regs[0, :4]]}")
    print(f"   D vs float64: max |error| = {np.abs(d - exact).max():.3e}, "
          f"bits equal to value-level tcemu.mma: "
          f"{np.array_equal(d, np.asarray(tcemu.mma(mma.spelling, a, b, c, arch='sm_90')))}\n")
    # 2. accumulation error per GPU for a long dot product
    K = args.k
    print(f"2. ({args.m} x {K}) @ ({K} x {args.m}) fp16 -> fp32 as a chain of m16n16k16 wmma.mma "
          "(each instruction's D is the next C)")
    x = rng.random((args.m, K)).astype(np.float16)  # all positive: errors accumulate
    y = rng.random((K, args.m)).astype(np.float16)
    ref = x.astype(np.float64) @ y.astype(np.float64)
    rows = []
    for arch in ("V100", "T4", "A100", "L40S", "H100", "B200"):
        t = time.perf_counter()
        got = np.asarray(_chain("wmma.mma.sync.aligned.row.col.m16n16k16.f32.f32", x, y, arch))
        rel = np.abs(got - ref) / np.abs(ref)
        m = tcemu.numerics(arch).f16
        rows.append((arch, m.fraction_bits, m.block_size, rel.max(), rel.mean(), time.perf_counter() - t))
    f32 = np.abs(x.astype(np.float32) @ y.astype(np.float32) - ref) / np.abs(ref)
    print(f"   {'GPU':6s} {'bits':>4s} {'block':>5s} {'max rel err':>12s} {'mean rel err':>12s}")
    for arch, fb, bs, mx, mn, dt in rows:
        print(f"   {arch:6s} {fb:4d} {bs:5d} {mx:12.3e} {mn:12.3e}   ({dt:.1f} s)")
    print(f"   {'fp32 (numpy)':17s} {f32.max():12.3e} {f32.mean():12.3e}")
    print("\n   bits: fraction bits kept when aligning products (truncated); block: products fused per step")
    return 0


def layout(args):
    f = tcemu.ptx(args.spelling, arch=args.arch)
    frag = getattr(f, "fragment", None)
    if frag is None:
        frag = dict(zip("abcd", (f.fa, f.fb, f.fc, f.fd)))[args.matrix]
    title = f"{args.spelling}" + (f" [{args.matrix}]" if not hasattr(f, "fragment") else "") + f" on {f.arch}"
    print(f"{title}: {frag.rows} x {frag.cols}, {frag.nregs} registers/lane, "
          f"{frag.copies} cop{'y' if frag.copies == 1 else 'ies'} of each element ({frag.source})")
    if args.png:
        from tcemu._src.draw import draw_fragment

        draw_fragment(frag, title=title, path=args.png)
        print(f"wrote {args.png}")
        return 0
    from tcemu._src.draw import holders

    cells = holders(frag)
    per = frag.per_reg
    text = {k: f"T{v[0][0]}:x{v[0][1]}" + (f".{v[0][2]}" if per > 1 else "") for k, v in cells.items()}
    width = max(len(t) for t in text.values()) + 1
    print(" " * 4 + "".join(f"{c:>{width}d}" for c in range(frag.cols)))
    for r in range(frag.rows):
        print(f"{r:3d} " + "".join(f"{text[(r, c)]:>{width}s}" for c in range(frag.cols)))
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(prog="tcemu", description="Bit-exact NVIDIA tensor-core emulation")
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("demo", help="register-level walk-through and accumulation error per GPU")
    d.add_argument("--k", type=int, default=4096, help="length of the dot products (multiple of 16)")
    d.add_argument("--m", type=int, default=32, help="rows/columns of the product")
    lay = sub.add_parser("layout", help="print which lane/register holds each element of a fragment")
    lay.add_argument("spelling")
    lay.add_argument("--arch", default="sm_90")
    lay.add_argument("--matrix", default="a", choices="abcd", help="operand of an MMA spelling")
    lay.add_argument("--png", help="draw the layout into this PNG file (needs matplotlib)")
    args = ap.parse_args(argv)
    return {"demo": demo, "layout": layout}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
