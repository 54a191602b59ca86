"""Sparse mma.sp capture (sm_90a): registers in -> registers out, one warp per tile.

    python experiments/hardware/mma_sp.py --out OUTDIR [--seed N] [--name mma_sp_sm90] [--dry-run]
    python experiments/hardware/mma_sp.py --write-cubin PATH     # compile here, carry it to the GPU
    python experiments/hardware/mma_sp.py --out OUTDIR --cubin PATH
    python experiments/hardware/mma_sp.py --out OUTDIR --only tf32any --seed S   # tf32, any metadata

Every ``mma.sp`` / ``mma.sp::ordered_metadata`` form of sm_80/sm_89/sm_90 (f16 with f16 and f32
C/D, bf16, tf32, the four e4m3/e5m2 pairs, s8/u8 and s4/u4 with and without .satfinite and one
mixed pair each) runs as one kernel whose lanes read ``[A (na), B (nb), C (nc), e]`` registers;
the sparsity selector ``f`` (an immediate) is picked per tile by a switch. Two kinds of tiles:

* ``map``, ``map_unordered``, ``map_invalid`` (one form per element type and shape, both
  variants): index-coded. Every lane's metadata register is random (sorted index pairs;
  unsorted but distinct pairs; any pattern, equal indices included), the compressed A holds 1
  on the compressed columns whose bit ``b`` is set (one tile per bit ``b``, and one with every
  column), B holds ``2**w`` at dense row ``k = P n + 4 q + w`` of column ``n`` (``P = K / 8``
  rows per column, window ``q`` of 4 rows), C = 0. D is then a small integer whose bits say
  which dense rows the ones landed on, so each compressed element's dense column is read back
  exactly (``experiments/hardware/mma_sp_analysis.py``) whatever lane or bit its index came
  from.
* numerics (``sanity``, ``inputs.FLOAT_CLASSES`` / ``INT_CLASSES``, ``hiddenB``, ``tf32raw``):
  logical A (16 x K/2), B (K x 8), C placed by tcemu's fragment tables
  (``tcemu/_src/layouts/sparse.py``), per-row metadata (half the tiles every row the same pattern,
  so B can be built from the kept rows and the class structure, e.g. cancelling pairs, survives;
  the rest random per row), the lanes the selector does not read filled with other random
  metadata. ``hiddenB`` puts inf/NaN/huge values in the B rows no metadata selects; ``blocks``
  (metadata 0, 1 in every group) has the kept products 1 and 2**-24 in the first half of K and
  2**-24 in the second: summed in one block they give 1 + 2**-23, in two blocks of K/2 (with
  binary32 truncation between) 1. ``sanity``: small integers, checked offline against exact
  arithmetic.

Writes ``<name>.npz``: per spelling ``.regs_in`` (T, 32, na+nb+nc+1) u32, ``.sel`` (T,) the
selector, ``.regs_out`` (T, 32, nd), ``.class`` / ``.classes``, ``.nregs`` (na, nb, nc, nd),
``.plane`` (T, 2): the index-coded tiles' (bit b or -1 for all, window q), -2 elsewhere.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1]))
import capture as Cap  # noqa: E402
import inputs as I  # noqa: E402
from tcemu._src.layouts import sparse as L  # noqa: E402
from tcemu._src.layouts.fragment import Fragment  # noqa: E402
from tcemu._src.layouts.mma import MMA  # noqa: E402

VARIANTS = ("sp", "sp::ordered_metadata")
BITS = {"f16": 16, "bf16": 16, "tf32": 32, "e4m3": 8, "e5m2": 8, "s8": 8, "u8": 8, "s4": 4, "u4": 4,
        "f32": 32, "s32": 32}
ONE = {"f16": 0x3C00, "bf16": 0x3F80, "tf32": 0x3F800000, "e4m3": 0x38, "e5m2": 0x3C}


def forms():
    """(spelling, atype, btype, ctype, K) of every captured form."""
    out = []
    for v in VARIANTS:
        p = f"mma.{v}.sync.aligned"
        for k in (16, 32):
            for d in ("f16", "f32"):
                out.append((f"{p}.m16n8k{k}.row.col.{d}.f16.f16.{d}", "f16", "f16", d, k))
            out.append((f"{p}.m16n8k{k}.row.col.f32.bf16.bf16.f32", "bf16", "bf16", "f32", k))
        for k in (8, 16):
            out.append((f"{p}.m16n8k{k}.row.col.f32.tf32.tf32.f32", "tf32", "tf32", "f32", k))
        for a in ("e4m3", "e5m2"):
            for b in ("e4m3", "e5m2"):
                out.append((f"{p}.m16n8k64.row.col.f32.{a}.{b}.f32", a, b, "f32", 64))
        for ks, ts, mixed in (((32, 64), ("s8", "u8"), ("s8", "u8")), ((64, 128), ("s4", "u4"), ("u4", "s4"))):
            for k in ks:
                for t in ts:
                    for sat in ("", ".satfinite"):
                        out.append((f"{p}.m16n8k{k}.row.col{sat}.s32.{t}.{t}.s32", t, t, "s32", k))
                out.append((f"{p}.m16n8k{k}.row.col.s32.{mixed[0]}.{mixed[1]}.s32", mixed[0], mixed[1], "s32", k))
    return out


# index-coded tiles on one form per element type and shape (either variant)
MAP_FORMS = {"f16": "f32", "bf16": "f32", "tf32": "f32", "e4m3": "f32", "u8": "s32", "u4": "s32"}


def nregs(at, bt, ct, k):
    na = 16 * (k // 2) * BITS[at] // 1024
    nb = k * 8 * BITS[bt] // 1024
    nc = 2 if ct == "f16" else 4
    return na, nb, nc, nc


def kname(sp):
    return "sp_" + sp.replace("mma.", "").replace("::", "_").replace(".", "_")


def kernel(sp, at, bt, ct, k):
    na, nb, nc, nd = nregs(at, bt, ct, k)
    fl = ct == "f32"
    rbits = L.row_bits(k, BITS[at])
    n = na + nb + nc + 1
    dl = ", ".join(f"%{i}" for i in range(nd))
    al = ", ".join(f"%{nd + i}" for i in range(na))
    bl = ", ".join(f"%{nd + na + i}" for i in range(nb))
    cl = ", ".join(f"%{nd + na + nb + i}" for i in range(nc))
    ei = nd + na + nb + nc
    outs = ", ".join(f'"={"f" if fl else "r"}"(d[{i}])' for i in range(nd))
    ins = ", ".join([f'"r"(s[{i}])' for i in range(na + nb)]
                    + [f'"{"f" if fl else "r"}"(c[{i}])' for i in range(nc)] + [f'"r"(s[{n - 1}])'])
    cases = "\n".join(f'    case {f}: asm volatile("{sp} {{{dl}}}, {{{al}}}, {{{bl}}}, {{{cl}}}, %{ei}, {f};" '
                      f': {outs} : {ins}); break;' for f in L.SELECTORS[rbits])
    ctyp = "float" if fl else "unsigned"
    conv = "__uint_as_float" if fl else ""
    back = "__float_as_uint" if fl else ""
    return f"""
extern "C" __global__ void {kname(sp)}(const unsigned* in, const int* sel, unsigned* out) {{
    const unsigned long long t = blockIdx.x; const int l = threadIdx.x;
    const unsigned* s = in + (t * 32 + l) * {n};
    {ctyp} c[{nc}], d[{nd}];
    for (int i = 0; i < {nc}; i++) c[i] = {conv}(s[{na + nb} + i]);
    for (int i = 0; i < {nd}; i++) d[i] = c[i < {nc} ? i : 0];
    switch (sel[t]) {{
{cases}
    }}
    for (int i = 0; i < {nd}; i++) out[(t * 32 + l) * {nd} + i] = {back}(d[i]);
}}
"""


def source():
    return "\n".join(kernel(*f) for f in forms())


def frag(key, layout, rows, cols, bits, nregs_):
    lb, vb = layout
    return Fragment(rows, cols, bits, nregs_, lb, vb, str(key))


def fragments(at, bt, ct, k):
    na, nb, nc, _ = nregs(at, bt, ct, k)
    fa = frag("a", MMA[L.a_key(k, BITS[at])], 16, k // 2, BITS[at], na)
    fb = frag("b", L.b_layout(k, BITS[bt]), k, 8, BITS[bt], nb)
    fc = frag("c", MMA[("m16n8", "c", BITS[ct] if ct != "s32" else 32)], 16, 8, BITS[ct], nc)
    return fa, fb, fc


def place(mat, fr, nreg):
    """(T, rows, cols) element patterns -> (T, 32, nreg) registers of fragment ``fr``."""
    rc = fr.coords
    return I.pack_slots(mat[:, rc[..., 0], rc[..., 1]], fr.bits, nreg)


# 2-bit index pairs of a chunk: sorted, unsorted (distinct), any
SORTED = [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]
UNSORTED = [(1, 0), (2, 0), (3, 0), (2, 1), (3, 1), (3, 2)]
ANY = [(i, j) for i in range(4) for j in range(4)]
TF32_VALID = [(0, 1), (2, 3)]  # nibbles 0b0100 and 0b1110


def pairs(rng, shape, mode, tf32=False):
    """(..., chunks, 2) index pairs: 'sorted', 'unsorted' or 'any'."""
    table = {"sorted": TF32_VALID if tf32 else SORTED, "unsorted": UNSORTED, "any": ANY}[mode]
    return np.asarray(table)[rng.integers(0, len(table), shape)]


def meta_regs(rng, idx_rows, rbits, f, mode, ub, tf32=False):
    """Metadata registers (T, 32) u32 holding ``idx_rows`` (T, 16, R/2) of the selected lanes
    (metadata_table), every other lane random ``mode`` metadata."""
    T = idx_rows.shape[0]
    garbage = pairs(rng, (T, 32, 8), mode, tf32)
    regs = np.zeros((T, 32), np.uint64)
    for i in range(8):
        regs |= (garbage[:, :, i, 0].astype(np.uint64) | (garbage[:, :, i, 1].astype(np.uint64) << 2)) << (4 * i)
    tab = L.metadata_table(rbits, f, ub)
    bitstr = np.zeros((T, 16, rbits), np.uint64)
    for u in range(rbits // 2):
        v = idx_rows[:, :, u].astype(np.uint64)
        bitstr[:, :, 2 * u] = v & 1
        bitstr[:, :, 2 * u + 1] = v >> 1
    lanes = np.unique(tab[..., 0])
    regs[:, lanes] = 0
    for r in range(16):
        for p in range(rbits):
            lane, bit = tab[r, p]
            regs[:, lane] |= bitstr[:, r, p] << np.uint64(bit)
    return regs.astype(np.uint32)


def map_tiles(rng, at, bt, ct, k):
    """Index-coded tiles: (regs_in, sel, class names, class index, plane). 16 configurations of
    sorted index pairs per selector (20 for tf32, whose metadata has one bit a chunk): enough to
    pin every field to one lane and bit."""
    configs = (("sorted", 20 if at == "tf32" else 16), ("unsorted", 3), ("any", 1))
    na, nb, nc, _ = nregs(at, bt, ct, k)
    fa, fb, fc = fragments(at, bt, ct, k)
    kc, P = k // 2, k // 8
    rbits = L.row_bits(k, BITS[at])
    planes = [-1] + list(range(int(np.log2(kc))))
    windows = range((P + 3) // 4)
    one = ONE.get(at, 1)
    regs, sels, cls, pl = [], [], [], []
    names = ("map", "map_unordered", "map_invalid")
    for ci, (mode, count) in enumerate(configs):
        for f in L.SELECTORS[rbits]:
            for _ in range(count):
                idx = pairs(rng, (1, 32, 8), mode, at == "tf32")
                e = np.zeros((1, 32), np.uint64)
                for i in range(8):
                    e |= (idx[:, :, i, 0].astype(np.uint64) | (idx[:, :, i, 1].astype(np.uint64) << 2)) << (4 * i)
                e = e.astype(np.uint32)
                for b in planes:
                    cols = np.arange(kc)
                    on = np.ones(kc, bool) if b < 0 else ((cols >> b) & 1).astype(bool)
                    A = np.where(on, one, 0)[None, None, :].repeat(16, 1).astype(np.uint64)
                    for q in windows:
                        B = np.zeros((1, k, 8), np.uint64)
                        for n in range(8):
                            for w in range(min(4, P - 4 * q)):
                                B[0, P * n + 4 * q + w, n] = I.from_float(np.float64(2 ** w), bt) if bt in ONE else 2 ** w
                        if bt == "s4":  # 8 does not fit: -8 is 8 modulo 16 (decode reads D mod 16)
                            B = np.where(B == 8, 0xF8, B)
                        r = np.concatenate([place(A, fa, na), place(B, fb, nb), np.zeros((1, 32, nc), np.uint32),
                                            e[:, :, None]], axis=2)
                        regs.append(r), sels.append(f), cls.append(ci), pl.append((b, q))
    return np.concatenate(regs), np.array(sels, np.int32), names, np.array(cls, np.int8), np.array(pl, np.int16)


def _logical(cl, rng, at, bt, ct, T, k):
    """Class ``cl`` operands: A (T, 16, K/2), the kept B rows Bg (T, K/2, 8), a full B (T, K, 8), C."""
    kc = k // 2
    if at in ("s8", "u8", "s4", "u4"):
        cls = "small" if cl == "sanity" else cl
        A, _, C = I.int_operands(cls, rng, at, T, 16, 8, kc)
        Bg = I.int_operands(cls, rng, bt, T, 16, 8, kc)[1]
        Bf = I.int_operands(cls, rng, bt, T, 16, 8, k)[1]
        bits = BITS[at], BITS[bt]
        return (A & ((1 << bits[0]) - 1), Bg & ((1 << bits[1]) - 1), Bf & ((1 << bits[1]) - 1),
                C.astype(np.int64) & 0xFFFFFFFF)
    if cl == "sanity":
        A = I.from_float(rng.integers(-3, 4, (T, 16, kc)).astype(np.float64), at)
        Bg = I.from_float(rng.integers(-3, 4, (T, kc, 8)).astype(np.float64), bt)
        Bf = I.from_float(rng.integers(-3, 4, (T, k, 8)).astype(np.float64), bt)
        C = I.from_float(rng.integers(-8, 9, (T, 16, 8)).astype(np.float64), ct)
        return A, Bg, Bf, C
    if cl == "tf32raw":
        g = lambda *s: I.from_float(rng.standard_normal(s), "f32")  # noqa: E731
        return g(T, 16, kc), g(T, kc, 8), g(T, k, 8), g(T, 16, 8)
    if cl == "blocks":  # products 1, 2**-24 (in K's first half) and 2**-24 (second half): one block or two?
        A = np.zeros((T, 16, kc))
        A[:, :, 0], A[:, :, 1], A[:, :, kc // 2] = 1.0, 2.0 ** -12, 2.0 ** -12
        Bg = rng.standard_normal((T, kc, 8))
        Bg[:, 0], Bg[:, 1], Bg[:, kc // 2] = 1.0, 2.0 ** -12, 2.0 ** -12
        return (I.from_float(A, at), I.from_float(Bg, bt), I.from_float(rng.standard_normal((T, k, 8)), bt),
                I.from_float(np.zeros((T, 16, 8)), ct))
    if cl == "hiddenB":  # ordinary kept products; inf, NaN, max in the rows nobody selects
        A, Bg, C = I.float_operands("normal", rng, (at, bt), ct, T, 16, 8, kc)
        return A, Bg, I.specials(rng, bt, (T, k, 8)), C
    A, Bg, C = I.float_operands(cl, rng, (at, bt), ct, T, 16, 8, kc)
    Bf = I.float_operands(cl, rng, (at, bt), ct, T, 16, 8, k)[1]
    return A, Bg, Bf, C


def numeric_tiles(rng, at, bt, ct, k, per_class, unsorted):
    """Numerics tiles of one form: (regs_in, sel, classes, class index); ``unsorted``: half the
    tiles take unsorted (distinct) index pairs (for ``mma.sp``)."""
    na, nb, nc, _ = nregs(at, bt, ct, k)
    fa, fb, fc = fragments(at, bt, ct, k)
    rbits = L.row_bits(k, BITS[at])
    tf32 = at == "tf32"
    if at in ("s8", "u8", "s4", "u4"):
        classes = ("sanity",) + I.INT_CLASSES
    else:
        classes = ("sanity",) + I.FLOAT_CLASSES + ("hiddenB", "blocks") + (("tf32raw",) if tf32 else ())
    regs, sels, cls = [], [], []
    T = per_class
    for ci, cl in enumerate(classes):
        A, Bg, B, C = _logical(cl, rng, at, bt, ct, T, k)
        uniform = np.arange(T) < (T if cl in ("hiddenB", "blocks") else (T + 1) // 2)
        mode = np.where((np.arange(T) % 2 == 1) & unsorted & (not tf32), "unsorted", "sorted")
        sel = rng.choice(L.SELECTORS[rbits], T)
        for t in range(T):
            shape = (1, 1 if uniform[t] else 16, rbits // 4)
            p = pairs(rng, shape, str(mode[t]), tf32) if cl != "blocks" else np.zeros(shape + (2,), int) + [0, 1]
            p = np.broadcast_to(p, (1, 16, rbits // 4, 2)).reshape(1, 16, rbits // 2)
            pos = L.dense_positions(p, BITS[at])[0]  # (16, K/2)
            Bt = B[t:t + 1].copy()
            if uniform[t]:
                Bt[0, pos[0]] = Bg[t]
            e = meta_regs(rng, p, rbits, int(sel[t]), "sorted", L.unit_bits(BITS[at]), tf32)
            r = np.concatenate([place(A[t:t + 1], fa, na), place(Bt, fb, nb), place(C[t:t + 1], fc, nc),
                                e[:, :, None]], axis=2)
            regs.append(r), sels.append(sel[t]), cls.append(ci)
    return np.concatenate(regs), np.array(sels, np.int32), classes, np.array(cls, np.int8)


def tf32any_tiles(rng, at, bt, ct, k, T=16):
    """Raw float32 A, B, C (every mantissa bit random) and any index pairs in every lane."""
    na, nb, nc, _ = nregs(at, bt, ct, k)
    fa, fb, fc = fragments(at, bt, ct, k)
    g = lambda *s: rng.standard_normal(s).astype(np.float32).view(np.uint32).astype(np.uint64)  # noqa: E731
    idx = pairs(rng, (T, 32, 8), "any")
    e = np.zeros((T, 32), np.uint64)
    for i in range(8):
        e |= (idx[:, :, i, 0].astype(np.uint64) | (idx[:, :, i, 1].astype(np.uint64) << 2)) << np.uint64(4 * i)
    regs = np.concatenate([place(g(T, 16, k // 2), fa, na), place(g(T, k, 8), fb, nb), place(g(T, 16, 8), fc, nc),
                           e.astype(np.uint32)[:, :, None]], axis=2)
    return regs, rng.choice(L.SELECTORS[L.row_bits(k, 32)], T).astype(np.int32)


def capture_tf32any(gpu, rng):
    """``--only tf32any``: the tf32 forms with undefined metadata on random operands."""
    out = {}
    for sp, at, bt, ct, k in forms():
        if at != "tf32":
            continue
        na, nb, nc, nd = nregs(at, bt, ct, k)
        regs, sel = tf32any_tiles(rng, at, bt, ct, k)
        T = len(sel)
        (d,) = gpu.run(kname(sp), T, [regs.ravel(), sel, np.zeros(T * 32 * nd, np.uint32)], [2])
        out |= {sp + ".regs_in": regs, sp + ".sel": sel, sp + ".regs_out": d.reshape(T, 32, nd),
                sp + ".nregs": np.array([na, nb, nc, nd])}
        print(f"{sp:70s} tiles {T:5d}", flush=True)
    return out


def capture(gpu, rng, per_class_ordered=4, per_class_sp=2, maps=True):
    out = {}
    for sp, at, bt, ct, k in forms():
        na, nb, nc, nd = nregs(at, bt, ct, k)
        ordered = "ordered" in sp
        regs, sel, classes, cls = numeric_tiles(rng, at, bt, ct, k, per_class_ordered if ordered else per_class_sp,
                                                not ordered)
        plane = np.full((len(sel), 2), -2, np.int16)
        if maps and MAP_FORMS.get(at) == ct and at == bt and ".satfinite" not in sp:
            mr, ms, mnames, mc, mp = map_tiles(rng, at, bt, ct, k)
            regs, sel, plane = np.concatenate([regs, mr]), np.concatenate([sel, ms]), np.concatenate([plane, mp])
            cls = np.concatenate([cls, mc + len(classes)])
            classes = tuple(classes) + mnames
        T = len(sel)
        d = np.zeros((T, 32, nd), np.uint32)
        (d,) = gpu.run(kname(sp), T, [regs.ravel(), sel, d.ravel()], [2])
        out |= {sp + ".regs_in": regs, sp + ".sel": sel, sp + ".regs_out": d.reshape(T, 32, nd),
                sp + ".class": cls, sp + ".classes": np.array(classes), sp + ".nregs": np.array([na, nb, nc, nd]),
                sp + ".plane": plane}
        print(f"{sp:70s} tiles {T:5d}", flush=True)
    return out


class Gpu(Cap.Gpu):
    """capture.py's GPU (one 32-thread block a tile), on kernels loaded from a cubin."""

    def __init__(self, cubin: Path):
        import cupy as cp

        self.cp = cp
        self.mod = cp.RawModule(path=str(cubin))


def write_cubin(path: Path):
    src = path.with_suffix(".cu")
    src.write_text(source())
    cmd = ["nvcc", "-cubin", "-gencode", "arch=compute_90a,code=sm_90a", "-o", str(path), str(src)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    errs = [ln for ln in (r.stdout + r.stderr).splitlines() if "Advisory" not in ln and ln.strip()]
    if r.returncode:
        raise SystemExit("\n".join(errs))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--seed", type=int, default=20261201)
    ap.add_argument("--name", default="mma_sp_sm90")
    ap.add_argument("--cubin", help="a cubin built by --write-cubin (else nvcc builds one here)")
    ap.add_argument("--write-cubin", help="only compile the kernels to this cubin")
    ap.add_argument("--no-maps", action="store_true", help="numerics tiles only")
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--only", choices=("tf32any",), help="only tf32 with any metadata on random operands")
    args = ap.parse_args()
    if args.write_cubin:
        write_cubin(Path(args.write_cubin))
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.dry_run:
        gpu = Cap.DryGpu()
    else:
        cubin = Path(args.cubin) if args.cubin else Path("/tmp/mma_sp.cubin")
        if not args.cubin:
            write_cubin(cubin)
        gpu = Gpu(cubin)
    t = time.time()
    if args.only == "tf32any":
        data = capture_tf32any(gpu, np.random.default_rng(args.seed))
        args.name = f"mma_sp_tf32any_sm90_{args.seed}"
    else:
        data = capture(gpu, np.random.default_rng(args.seed), maps=not args.no_maps)
    data["seed"] = np.array(args.seed)
    f = out / f"{args.name}.npz"
    np.savez_compressed(f, **data)
    print(f"done in {time.time() - t:.1f}s; {f.stat().st_size / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
