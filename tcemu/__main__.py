"""Command line (also the ``tcemu`` console script):

* ``python -m tcemu demo [--kmax 16384] [--outputs 512] [--out tcemu_demo]``: a register-level
  walk-through, then the error of emulated dot products against float64 as K grows, for fp16,
  bf16, tf32 and fp8 on several GPU presets (table, PNG and CSV).
* ``python -m tcemu layout SPELLING [--arch sm_90] [--matrix a] [--png out.png]``
* ``python -m tcemu probe [--arch H100] [--format f16] [--instruction SPELLING] [--model k=v,...]``:
  feature tests of a preset or of a custom model, compared with the preset (exit 1 on a difference).

A bad argument is reported argparse style, as one line on stderr ("tcemu probe: error: ...") with
exit status 2.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import os
import sys
import time

import numpy as np

import tcemu
from tcemu._src.arch import resolve
from tcemu._src.studies import (GPU_CONFIGS, config_label, curves_table, default_instruction, error_vs_k,
                                fp32_chain_error, write_csv)

KMAX = (32, 16384)  # demo lengths: powers of two from 16; fp8 MMAs have K = 32
OUTPUTS = (1, 4096)


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are one line on stderr ("tcemu probe: error: ..."), exit status 2."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {' '.join(str(message).split())}\n")


@contextlib.contextmanager
def _bad_argument(parser):
    """An error tcemu raises for a bad command-line argument -> ``parser.error`` (one line, exit 2)."""
    try:
        yield
    except (ValueError, TypeError, IndexError, NotImplementedError) as e:
        parser.error(str(e))


@contextlib.contextmanager
def _writing(parser, path):
    """An OSError while writing ``path`` -> ``parser.error`` (one line, exit 2)."""
    try:
        yield
    except OSError as e:
        parser.error(f"cannot write {path}: {e.strerror or e}")


def _unwritable(path: str) -> str | None:
    """Why ``path`` cannot be written as a new or replaced file, or None."""
    if os.path.isdir(path):
        return f"{path} is a directory"
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        return f"cannot write {path}: no such directory {parent}"
    if not os.access(path if os.path.exists(path) else parent, os.W_OK):
        return f"cannot write {path}: permission denied"
    return None


def _int_in(lo: int, hi: int):
    """An argparse type: an integer in lo..hi."""
    def parse(text):
        try:
            v = int(text)
        except ValueError:
            v = None
        if v is None or not lo <= v <= hi:
            raise argparse.ArgumentTypeError(f"must be an integer from {lo} to {hi}, got {text!r}")
        return v

    return parse


def _arch(text: str) -> str:
    """An argparse type: a GPU or sm_XX name that tcemu knows (returned as given)."""
    try:
        resolve(text)
    except (ValueError, TypeError) as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def _descriptor(text: str) -> int:
    """An argparse type: a 64-bit wgmma descriptor, hexadecimal (0x...) or decimal."""
    try:
        v = int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer (write a descriptor as 0x... or decimal)") from None
    try:
        tcemu.WgmmaDescriptor.decode(v)
    except (ValueError, TypeError) as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return v


def _png(text: str) -> str:
    """An argparse type: a writable path ending in .png."""
    if not text.lower().endswith(".png"):
        raise argparse.ArgumentTypeError(f"{text!r} does not end in .png")
    why = _unwritable(text)
    if why:
        raise argparse.ArgumentTypeError(why)
    return text


def _prefix(text: str) -> str:
    """An argparse type: a file prefix to which .csv and .png can be appended and written."""
    if not os.path.basename(text):
        raise argparse.ArgumentTypeError(f"{text!r} names no file; give a prefix such as dir/tcemu_demo")
    for ext in (".csv", ".png"):
        why = _unwritable(text + ext)
        if why:
            raise argparse.ArgumentTypeError(why)
    return text


def _model(text: str):
    """An argparse type: :func:`parse_model`, its errors as argparse errors."""
    try:
        return parse_model(text)
    except (ValueError, TypeError) as e:
        raise argparse.ArgumentTypeError(str(e)) from None


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
    ks = [k for k in (2 ** i for i in range(4, 15)) if k <= args.kmax]  # args.kmax in KMAX: fp8 gets K = 32
    print(f"2. relative error against float64 of {args.outputs} dot products of U[0,1) inputs as K grows "
          f"({ks[0]} ... {ks[-1]}),\n   each a chain of the MMA a GEMM uses on that GPU (D of one "
          "instruction is C of the next)")
    curves, base = _sweep(GPU_CONFIGS, ks, args.outputs)
    shown = [k for k in ks if k in (16, 64, 256, 1024, 4096)] + [ks[-1]]
    for line in curves_table(base + curves, sorted(set(shown))):
        print("   " + line)
    print("\n   fp16/bf16/tf32: products aligned to the largest exponent and truncated 23 (V100), 24 (A100) or "
          "25 (H100)\n   bits below it; fp8 on H100 (wgmma) keeps a 13-bit accumulator, so its error grows with K "
          "until the\n   partial sums are promoted to fp32 every 128 products (DeepSeek-V3).")
    with _writing(args.parser, args.out + ".csv"):
        write_csv(base + curves, args.out + ".csv")
    try:
        from tcemu._src.draw import plot_error_curves

        with _writing(args.parser, args.out + ".png"):
            plot_error_curves(curves, args.out + ".png", baselines=base,
                              title=f"Emulated tensor-core dot products vs float64 ({args.outputs} outputs, "
                                    "U[0,1) inputs)")
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
    from tcemu._src import draw

    smem = args.desc is not None or args.tnsp
    with _bad_argument(args.parser):
        f = tcemu.ptx(args.spelling, arch=args.arch)
        view, title, header = draw.smem_view(f, args.desc, args.matrix, args.tnsp) if smem else draw.fragment_view(
            f, args.matrix)
    print(header)
    if not args.png:
        print(draw.address_text(view) if smem else draw.fragment_text(view))
        return 0
    try:
        with _writing(args.parser, args.png):
            (draw.draw_smem if smem else draw.draw_fragment)(view, title=title, path=args.png)
    except ImportError as e:  # no matplotlib
        args.parser.error(str(e))
    print(f"wrote {args.png}")
    return 0


def parse_model(text: str):
    """``"fraction_bits=24,block_size=16,rounding=rne"`` -> :class:`tcemu.BlockFMA` (values are
    Python literals; bare words are strings; commas inside brackets belong to the value). Raises a
    ValueError or TypeError naming the item or field that is wrong."""
    import ast
    import re

    fields = [f.name for f in dataclasses.fields(tcemu.BlockFMA)]
    kw = {}
    for item in re.split(r",(?![^()\[\]]*[)\]])", text):
        if not item.strip():
            continue
        if "=" not in item:
            raise ValueError(f"item {item.strip()!r} is not name=value")
        k, v = (x.strip() for x in item.split("=", 1))
        if k not in fields:
            raise ValueError(f"unknown BlockFMA field {k!r}; valid: {', '.join(fields)}")
        if k in kw:
            raise ValueError(f"field {k!r} given twice")
        try:
            kw[k] = ast.literal_eval({"true": "True", "false": "False", "none": "None"}.get(v.lower(), v))
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            kw[k] = v
    if not kw:
        raise ValueError(f"{text!r} sets no field; give name=value items, e.g. fraction_bits=24,block_size=16")
    return tcemu.BlockFMA(**kw)


def probe(args):
    from tcemu._src.studies import mfma_formats as _amd_formats
    from tcemu._src.isa.targets import check_arch
    from tcemu._src.numerics.mma import resolve_model
    from tcemu._src.probe import expected, probe_instruction

    arch = resolve(args.arch)
    with _bad_argument(args.parser):
        presets = tcemu.numerics(arch)  # the formats whose GEMM instruction this architecture has numerics for
        if args.instruction is not None:
            ins = probe_instruction(args.instruction, arch)
            if args.format is not None and args.format != ins.atype:
                raise ValueError(f"--format {args.format} disagrees with --instruction, which takes {ins.atype} "
                                 "inputs (give one of them, or the same format)")
            fmts = [ins.atype]
        elif args.format is not None:
            fmts = [args.format]
        else:
            cands = ("f16", "bf16", "tf32", "e4m3fnuz", "e5m2fnuz") if arch.amd else ("f16", "bf16", "tf32", "e4m3")
            fmts = [f for f in cands if (not arch.amd or f in _amd_formats(arch))
                    and presets.for_instruction(probe_instruction(default_instruction(arch, f), arch))]
        for fmt in fmts:  # the preset compared with: on this architecture, for this instruction
            ins = probe_instruction(args.instruction or default_instruction(arch, fmt), arch)
            check_arch(ins, arch)
            resolve_model(ins, None, arch)
    model = args.model
    what = "your model" if model is not None else "the preset"
    print(f"tcemu probe: feature tests (Fasi et al. 2021; Khattak & Mikaitis 2025) on {what} for {args.arch}\n")
    mismatches = 0
    for fmt in fmts:
        with _bad_argument(args.parser):
            r = tcemu.probe(arch, fmt, instruction=args.instruction, model=model)
        preset = resolve_model(probe_instruction(r.instruction, arch), None, arch)
        want = expected(preset, r.instruction, arch)
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


def _shapes(text: str) -> list:
    """An argparse type: comma-separated MxNxK shapes of positive integers."""
    out = []
    for part in text.split(","):
        dims = part.strip().lower().split("x")
        if len(dims) != 3 or not all(d.isdigit() and int(d) > 0 for d in dims):
            raise argparse.ArgumentTypeError(f"shapes are MxNxK with positive integers, comma-separated "
                                             f"(e.g. 1000x3000x777,16x4096x4096); got {part!r}")
        out.append(tuple(int(d) for d in dims))
    return out


def _gzpath(text: str) -> str:
    """An argparse type: a writable path ending in .json.gz."""
    if not text.endswith(".json.gz"):
        raise argparse.ArgumentTypeError(f"{text!r} does not end in .json.gz")
    why = _unwritable(text)
    if why:
        raise argparse.ArgumentTypeError(why)
    return text


def record(args) -> int:
    """Record cuBLAS's choices on this GPU (``tcemu.record``)."""
    from tcemu._src.record import record as run

    try:
        path = run(args.out, shapes=args.shapes, quick=args.quick)
    except RuntimeError as e:  # no torch, no GPU: one line, as a bad argument
        args.parser.exit(2, f"tcemu record: error: {e}\n")
    print(f"wrote {path}: load it with tcemu.library_config(..., records={str(path)!r})")
    return 0


def main(argv=None):
    ap = _Parser(prog="tcemu", description="Bit-exact NVIDIA tensor-core emulation",
                 epilog="A bad argument: one line on stderr, exit status 2.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("demo", help="register-level walk-through and accumulation error per GPU")
    d.add_argument("--kmax", type=_int_in(*KMAX), default=16384,
                   help=f"longest dot product, {KMAX[0]} to {KMAX[1]} (default 16384): K = 16, 32, 64, ... up "
                        "to it (fp8 MMAs start at K = 32)")
    d.add_argument("--outputs", type=_int_in(*OUTPUTS), default=512,
                   help=f"dot products per configuration, {OUTPUTS[0]} to {OUTPUTS[1]} (default 512)")
    d.add_argument("--out", type=_prefix, default="tcemu_demo",
                   help="prefix of the files written: OUT.csv and (with matplotlib) OUT.png (default tcemu_demo)")
    lay = sub.add_parser("layout", help="print which lane/register holds each element of a fragment")
    lay.add_argument("spelling", help="a wmma.load/store, ldmatrix/stmatrix or mma.sync/wmma.mma spelling")
    lay.add_argument("--arch", type=_arch, default="sm_90", help="GPU name or sm_XX (default sm_90)")
    lay.add_argument("--matrix", choices="abcd", help="operand of an MMA spelling (default a; with --desc b); MMAs only")
    lay.add_argument("--desc", type=_descriptor,
                     help="wgmma: a 64-bit shared-memory matrix descriptor (0x... or decimal): print the byte "
                          "address feeding each element of --matrix a or b (default b)")
    lay.add_argument("--tnsp", action="store_true", help="wgmma with --desc: the f16/bf16 operand is MN-major")
    lay.add_argument("--png", type=_png, help="draw the layout into this .png file (needs matplotlib)")
    pr = sub.add_parser("probe", help="feature tests of an MMA: alignment bits, block size, rounding, ...")
    pr.add_argument("--arch", type=_arch, default="H100", help="GPU name or sm_XX whose preset is probed / compared")
    pr.add_argument("--format", choices=["f16", "bf16", "tf32", "e4m3", "e5m2"],
                    help="input format, probed on the MMA GEMMs use on --arch (default: every format the preset "
                         "covers); with --instruction it must be that instruction's A format (an error otherwise)")
    pr.add_argument("--instruction", help="MMA spelling to probe (f32 C and D; default: what GEMMs use); "
                                          "its A format is the one probed")
    pr.add_argument("--model", type=_model,
                    help='a BlockFMA to probe instead of the preset, e.g. "fraction_bits=24,block_size=16"')
    rec = sub.add_parser("record", help="record the cuBLAS kernels PyTorch runs on this GPU, for library_config")
    rec.add_argument("out", type=_gzpath, help="the record file to write (.json.gz)")
    rec.add_argument("--shapes", type=_shapes,
                     help="MxNxK shapes, comma-separated (default: the grid shipped for the H100, about a minute)")
    rec.add_argument("--quick", action="store_true", help="a few shapes of the grid (a check that recording works)")
    args = ap.parse_args(argv)
    args.parser = sub.choices[args.cmd]
    try:
        return {"demo": demo, "layout": layout, "probe": probe, "record": record}[args.cmd](args)
    except BrokenPipeError:  # the reader went away (``| head``): stop quietly, as Python's docs advise
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
