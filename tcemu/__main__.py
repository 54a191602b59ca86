"""Command line (also the ``tcemu`` console script):

* ``python -m tcemu demo [--kmax 16384] [--outputs 512] [--out tcemu_demo]``: a register-level
  walk-through, then the error of emulated dot products against float64 as K grows, for fp16,
  bf16, tf32 and fp8 on several GPU presets (table, PNG and CSV).
* ``python -m tcemu layout SPELLING [--arch sm_90] [--matrix a] [--png out.png]``
* ``python -m tcemu probe [--arch H100] [--format f16] [--instruction SPELLING] [--model k=v,...]``:
  feature tests of a preset or of a custom model, compared with the preset (exit 1 on a difference).
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import tcemu
from tcemu._src.studies import (GPU_CONFIGS, config_label, curves_table, default_instruction, error_vs_k,
                                fp32_chain_error, write_csv)


def demo(args):
    t0 = time.perf_counter()
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
    # 2. accumulation error as K grows, per format and GPU
    ks = [k for k in (2 ** i for i in range(4, 15)) if k <= args.kmax]
    print(f"2. relative error against float64 of {args.outputs} dot products of U[0,1) inputs as K grows "
          f"({ks[0]} ... {ks[-1]}),\n   each a chain of the MMA a GEMM uses on that GPU (D of one "
          "instruction is C of the next)")
    curves, base = _sweep(GPU_CONFIGS, ks, args.outputs)
    for line in curves_table(base + curves, [k for k in ks if k in (16, 64, 256, 1024, 4096, 16384)] or ks):
        print("   " + line)
    print("\n   fp16/bf16/tf32: products aligned to the largest exponent and truncated 23 (V100), 24 (A100) or "
          "25 (H100)\n   bits below it; fp8 on H100 (wgmma) keeps a 13-bit accumulator, so its error grows with K "
          "until the\n   partial sums are promoted to fp32 every 128 products (DeepSeek-V3).")
    write_csv(base + curves, args.out + ".csv")
    try:
        from tcemu._src.draw import plot_error_curves

        plot_error_curves(curves, args.out + ".png", baselines=base,
                          title=f"Emulated tensor-core dot products vs float64 ({args.outputs} outputs, U[0,1) inputs)")
        wrote = f"{args.out}.png and {args.out}.csv"
    except ImportError:
        wrote = f'{args.out}.csv (for the plot: pip install "tcemu[plot]")'
    print(f"\n   wrote {wrote} ({time.perf_counter() - t0:.0f} s)")
    return 0


def _sweep(configs, ks, outputs):
    """Error curves of ``configs`` and the fp32-chain baselines, with a progress bar on stderr."""
    curves, base = [], []
    fmts = dict.fromkeys(f for f, _, _ in configs)
    jobs = [(f"fp32 FMA chain ({f})", base, functools.partial(fp32_chain_error, f)) for f in fmts] + [
        (config_label(*c), curves, functools.partial(error_vs_k, c[0], c[1], promotion_interval=c[2])) for c in configs]
    for i, (label, into, run) in enumerate(jobs):
        _progress(i, len(jobs), label)
        into.append(run(ks, outputs=outputs))
    if sys.stderr.isatty():
        sys.stderr.write("\r" + " " * 80 + "\r")
    return curves, base


def _progress(i, n, what):
    if not sys.stderr.isatty():
        return
    w = 30
    fill = w * i // n
    sys.stderr.write(f"\r   [{'#' * fill}{'.' * (w - fill)}] {i}/{n} {what:32s}")
    sys.stderr.flush()


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


def parse_model(text: str):
    """``"fraction_bits=24,block_size=16,rounding=rne"`` -> :class:`tcemu.BlockFMA` (values are
    Python literals; bare words are strings; commas inside brackets belong to the value)."""
    import ast
    import re

    fields = {f.name for f in dataclasses.fields(tcemu.BlockFMA)}
    kw = {}
    for item in re.split(r",(?![^()\[\]]*[)\]])", text):
        if not item.strip():
            continue
        if "=" not in item:
            raise ValueError(f"--model item {item!r} is not name=value")
        k, v = (x.strip() for x in item.split("=", 1))
        if k not in fields:
            raise ValueError(f"--model: unknown field {k!r}; valid: {sorted(fields)}")
        try:
            kw[k] = ast.literal_eval({"true": "True", "false": "False", "none": "None"}.get(v.lower(), v))
        except (ValueError, SyntaxError):
            kw[k] = v
    return tcemu.BlockFMA(**kw)


def probe(args):
    from tcemu._src.arch import resolve
    from tcemu._src.isa.parse import parse
    from tcemu._src.numerics.mma import resolve_model
    from tcemu._src.probe import expected

    arch = resolve(args.arch)
    presets = tcemu.numerics(args.arch)  # the formats whose GEMM instruction this architecture has numerics for
    fmts = [args.format] if args.format else [
        f for f in ("f16", "bf16", "tf32", "e4m3") if presets.for_instruction(parse(default_instruction(arch, f)))]
    if args.instruction:
        fmts = [parse(args.instruction).atype]
    model = parse_model(args.model) if args.model else None
    what = "your model" if model is not None else "the preset"
    print(f"tcemu probe: feature tests (Fasi et al. 2021; Khattak & Mikaitis 2025) on {what} for {args.arch}\n")
    mismatches = 0
    for fmt in fmts:
        r = tcemu.probe(args.arch, fmt, instruction=args.instruction, model=model)
        preset = resolve_model(parse(r.instruction), None, arch)
        want = expected(preset, r.instruction)
        print(f"{fmt} inputs: {r.instruction}")
        for key, name, val in r.rows():
            note = ""
            if key is not None:
                got, exp = getattr(r, key), want[key]
                measurable = not (got is None and key in ("addend", "block_order"))
                if measurable and got != exp:
                    note = f"   <-- differs from the {args.arch} preset ({exp})"
                    mismatches += 1
            print(f"   {name:40s} {'-' if val is None else val!s:>14s}{note}")
        print()
    if model is not None:
        print(f"{mismatches} feature(s) of your model differ from the {args.arch} preset" if mismatches else
              f"your model has every measured feature of the {args.arch} preset")
    else:
        print("every measured feature equals the preset" if not mismatches else f"{mismatches} mismatch(es)")
    return 1 if mismatches else 0


def main(argv=None):
    ap = argparse.ArgumentParser(prog="tcemu", description="Bit-exact NVIDIA tensor-core emulation")
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("demo", help="register-level walk-through and accumulation error per GPU")
    d.add_argument("--kmax", type=int, default=16384, help="longest dot product (K = 16, 32, ... up to this)")
    d.add_argument("--outputs", type=int, default=512, help="dot products per configuration")
    d.add_argument("--out", default="tcemu_demo", help="prefix of the PNG and CSV written")
    lay = sub.add_parser("layout", help="print which lane/register holds each element of a fragment")
    lay.add_argument("spelling")
    lay.add_argument("--arch", default="sm_90")
    lay.add_argument("--matrix", default="a", choices="abcd", help="operand of an MMA spelling")
    lay.add_argument("--png", help="draw the layout into this PNG file (needs matplotlib)")
    pr = sub.add_parser("probe", help="feature tests of an MMA: alignment bits, block size, rounding, ...")
    pr.add_argument("--arch", default="H100", help="GPU name or sm_XX whose preset is probed / compared")
    pr.add_argument("--format", choices=["f16", "bf16", "tf32", "e4m3", "e5m2"], help="input format (default: all)")
    pr.add_argument("--instruction", help="MMA spelling to probe (f32 C/D; default: what GEMMs use)")
    pr.add_argument("--model", help='a BlockFMA to probe instead of the preset, e.g. "fraction_bits=24,block_size=16"')
    args = ap.parse_args(argv)
    try:
        return {"demo": demo, "layout": layout, "probe": probe}[args.cmd](args)
    except (ValueError, NotImplementedError) as e:  # bad spellings, models, architectures
        ap.exit(2, f"tcemu {args.cmd}: error: {e}\n")


if __name__ == "__main__":
    sys.exit(main())
