"""Hardware capture driver: runs every kernel of ``kernels.py`` on the GPU and writes npz files.

Usage (on a machine with an NVIDIA GPU, nvcc and CuPy)::

    python experiments/hardware/capture.py --out OUTDIR [--only layouts,wmma,mma_sync,ldst]

Writes, into OUTDIR:

* ``wmma_layouts_sm90.npz``: per wmma.load / wmma.store.d config, the fragment table decoded from
  one-hot experiments, plus random loads/stores at a nonzero aligned ``p`` with an explicit stride.
* ``wmma_mma_*.npz``: operands (as bit patterns of the logical matrices) and D for every wmma.mma
  form, on random and adversarial input classes (see ``inputs.py``).
* ``mma_sync.npz``: register-level mma.sync captures (registers in, registers out).
* ``ldstmatrix.npz``: ldmatrix / stmatrix m8n8 placements with per-lane row addresses.
* ``meta.json``: device, driver, compiler, commit.

``--dry-run`` replaces the GPU by a stub that returns zeros, to check the plumbing anywhere.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1]))

import inputs as I  # noqa: E402
import kernels as Kn  # noqa: E402
from tcemu._src.isa import wmma_spec as S  # noqa: E402

SEED = 20261121


# ---------------------------------------------------------------------------------------------
# GPU access


class Gpu:
    def __init__(self, build_dir: Path):
        import cupy as cp

        self.cp = cp
        src = build_dir / "capture.cu"
        src.write_text(Kn.source())
        cubin = build_dir / "capture.cubin"
        cmd = ["nvcc", "-cubin", "-gencode", "arch=compute_90a,code=sm_90a", "-o", str(cubin), str(src)]
        t = time.time()
        subprocess.run(cmd, check=True)
        print(f"compiled {src} in {time.time() - t:.1f}s", flush=True)
        self.mod = cp.RawModule(path=str(cubin))

    def run(self, name, nwarps, args, outs):
        """Launch ``name`` with one 32-thread block per warp. ``args``: numpy arrays or scalars;
        ``outs``: indices into ``args`` to copy back. Returns the copied-back arrays."""
        cp = self.cp
        dev = [cp.asarray(a) if isinstance(a, np.ndarray) else a for a in args]
        self.mod.get_function(name)((nwarps,), (32,), tuple(dev))
        cp.cuda.runtime.deviceSynchronize()
        return [cp.asnumpy(dev[i]) for i in outs]


class DryGpu:
    def run(self, name, nwarps, args, outs):
        return [np.zeros_like(args[i]) for i in outs]


# ---------------------------------------------------------------------------------------------
# Memory images of matrices (element i of a row at bit i*bits, little-endian)


def element_offsets(rows, cols, layout, stride):
    """Element index (in units of the element size) of each (r, c), for .row / .col storage."""
    r, c = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
    return r * stride + c if layout == "row" else c * stride + r


def put_matrix(buf: np.ndarray, p: int, mat_bits: np.ndarray, bits: int, layout: str, stride: int):
    """Write the (rows, cols) array of ``bits``-wide patterns into byte buffer ``buf`` at byte ``p``."""
    rows, cols = mat_bits.shape
    off = element_offsets(rows, cols, layout, stride)
    if bits >= 8:
        nb = bits // 8
        v = mat_bits.astype(np.uint64)
        for j in range(nb):
            buf[p + off * nb + j] = ((v >> np.uint64(8 * j)) & np.uint64(0xFF)).astype(np.uint8)
    else:
        bitbuf = np.unpackbits(buf, bitorder="little")
        v = mat_bits.astype(np.uint64)
        for j in range(bits):
            bitbuf[p * 8 + off * bits + j] = ((v >> np.uint64(j)) & np.uint64(1)).astype(np.uint8)
        buf[:] = np.packbits(bitbuf, bitorder="little")


def get_matrix(buf, p, rows, cols, bits, layout, stride):
    off = element_offsets(rows, cols, layout, stride)
    v = np.zeros((rows, cols), np.uint64)
    if bits >= 8:
        nb = bits // 8
        for j in range(nb):
            v |= buf[p + off * nb + j].astype(np.uint64) << np.uint64(8 * j)
    else:
        bitbuf = np.unpackbits(buf, bitorder="little")
        for j in range(bits):
            v |= bitbuf[p * 8 + off * bits + j].astype(np.uint64) << np.uint64(j)
    return v


def region_bytes(rows, cols, bits, layout, stride, p):
    lead = rows if layout == "row" else cols
    return p + (lead * stride * bits + 7) // 8


def padded_region_bytes(rows, cols, bits, layout, stride, p):
    """:func:`region_bytes` rounded up to a multiple of 16 bytes."""
    return (region_bytes(rows, cols, bits, layout, stride, p) + 15) // 16 * 16


NRAND = 4  # random loads / stores per config


def random_geometry(rows, cols, bits, layout, dstride, fb):
    """The random runs' explicit stride (two fragments' worth of elements above the default
    ``dstride``), their offset ``p`` (5 fragments of ``fb`` bytes) and their padded region size."""
    stride = dstride + 2 * fb * 8 // bits
    p = 5 * fb
    return stride, p, padded_region_bytes(rows, cols, bits, layout, stride, p)


# ---------------------------------------------------------------------------------------------
# wmma.load / wmma.store layouts


def onehot_pattern(bits):
    """Pattern stored in the one-hot element: all ones, except f64 (distinct low/high words)."""
    return 0x0000FFFF_FFFFFFFF if bits == 64 else (1 << bits) - 1


def unit_bits(bits):
    return min(bits, 32)


def decode_regs(regs: np.ndarray, bits: int, problems: list, label: str):
    """regs: (n_experiments, 32, nregs) after one-hot loads of element e = experiment index.
    Returns table (32, nregs, slots) of e*2+word for f64, else e; -1 where nothing landed."""
    n, _, nregs = regs.shape
    u = unit_bits(bits)
    slots = 32 // u
    table = np.full((32, nregs, slots), -1, np.int32)
    umask = np.uint32((1 << u) - 1) if u < 32 else np.uint32(0xFFFFFFFF)
    explained = np.zeros_like(regs)
    for s in range(slots):
        vals = (regs >> np.uint32(s * u)) & umask
        if bits == 64:
            words = {0: 0xFFFFFFFF, 1: 0x0000FFFF}
        else:
            words = {0: int(umask)}
        for w, pat in words.items():
            e, lane, reg = np.nonzero(vals == np.uint32(pat))
            for ee, ll, rr in zip(e, lane, reg):
                if table[ll, rr, s] != -1:
                    problems.append(f"{label}: slot {(ll, rr, s)} hit by {table[ll, rr, s]} and {ee}")
                table[ll, rr, s] = ee * 2 + w if bits == 64 else ee
                explained[ee, ll, rr] |= np.uint32(pat) << np.uint32(s * u) if u < 32 else np.uint32(pat)
    if np.any(explained != regs):
        problems.append(f"{label}: {int(np.count_nonzero(explained != regs))} register words not explained")
    return table


def capture_layouts(gpu, rng):
    out, problems = {}, []
    for mat, lay, shape, et in S.load_forms():
        bits = S.ELEMENT_BITS[et]
        rows, cols = S.matrix_dims(shape, mat)
        nregs = S.FRAGMENT_REGS[(shape, mat, et)]
        fb = S.fragment_bytes(shape, mat, et)
        key = f"ld.{mat}.{lay}.{shape}.{et}"
        dstride = S.default_stride(shape, mat, lay)
        # one-hot, default stride (no stride operand), p = 3 fragments
        p = 3 * fb
        size = padded_region_bytes(rows, cols, bits, lay, dstride, p)
        n = rows * cols
        mem = np.zeros((n, size), np.uint8)
        pat = onehot_pattern(bits)
        for e in range(n):
            m = np.zeros((rows, cols), np.uint64)
            m[e // cols, e % cols] = pat
            put_matrix(mem[e], p, m, bits, lay, dstride)
        regs = np.zeros((n, 32, nregs), np.uint32)
        (regs,) = gpu.run(Kn.load_name(mat, lay, shape, et, False), n,
                          [mem.ravel(), np.uint64(size), np.uint32(p), np.uint32(0), regs], [4])
        table = decode_regs(regs.reshape(n, 32, nregs), bits, problems, key)
        units = n * (2 if bits == 64 else 1)
        counts = np.bincount(table[table >= 0].ravel(), minlength=units)
        if counts.min() == 0:
            problems.append(f"{key}: {int(np.sum(counts == 0))} elements never loaded")
        print(f"  {key:32s} regs {nregs} copies/element {counts.min()}..{counts.max()}", flush=True)
        out[key + ".table"] = table
        # random contents, explicit stride larger than the default, p = 5 fragments
        stride, p, size = random_geometry(rows, cols, bits, lay, dstride, fb)
        mem = rng.integers(0, 256, (NRAND, size), dtype=np.uint8)
        regs = np.zeros((NRAND, 32, nregs), np.uint32)
        (regs,) = gpu.run(Kn.load_name(mat, lay, shape, et, True), NRAND,
                          [mem.ravel(), np.uint64(size), np.uint32(p), np.uint32(stride), regs], [4])
        out[key + ".rand_mem"] = mem
        out[key + ".rand_regs"] = regs.reshape(NRAND, 32, nregs)
        out[key + ".rand_p_stride"] = np.array([p, stride], np.int64)
    for lay, shape, et in S.store_forms():
        bits = S.ELEMENT_BITS[et]
        rows, cols = S.matrix_dims(shape, "d")
        nregs = S.FRAGMENT_REGS[(shape, "c", et)]
        fb = S.fragment_bytes(shape, "d", et)
        key = f"st.{lay}.{shape}.{et}"
        dstride = S.default_stride(shape, "d", lay)
        u = unit_bits(bits)
        slots = 32 // u
        n = 32 * nregs * slots
        p = 3 * fb
        size = padded_region_bytes(rows, cols, bits, lay, dstride, p)
        regs = np.zeros((n, 32, nregs), np.uint32)
        umask = (1 << u) - 1
        idx = 0
        for lane in range(32):
            for r in range(nregs):
                for s in range(slots):
                    regs[idx, lane, r] = np.uint32(umask << (s * u))
                    idx += 1
        mem = np.zeros((n, size), np.uint8)
        (mem,) = gpu.run(Kn.store_name(lay, shape, et, False), n,
                         [mem.ravel(), np.uint64(size), np.uint32(p), np.uint32(0), regs.ravel()], [0])
        mem = mem.reshape(n, size)
        table = np.full((32, nregs, slots), -1, np.int32)
        idx = 0
        for lane in range(32):
            for r in range(nregs):
                for s in range(slots):
                    words = get_matrix(mem[idx], p, rows, cols, bits, lay, dstride)
                    if bits == 64:
                        lo = (words & np.uint64(0xFFFFFFFF)) != 0
                        hi = (words >> np.uint64(32)) != 0
                        hits = [(e, 0) for e in np.flatnonzero(lo)] + [(e, 1) for e in np.flatnonzero(hi)]
                    else:
                        hits = [(e, 0) for e in np.flatnonzero(words)]
                    total = int(np.count_nonzero(mem[idx]))
                    if len(hits) > 1:
                        problems.append(f"{key}: slot {(lane, r, s)} stored to {hits}")
                    if hits:
                        e, w = hits[0]
                        table[lane, r, s] = e * 2 + w if bits == 64 else e
                    elif total:
                        problems.append(f"{key}: slot {(lane, r, s)} wrote outside the matrix")
                    idx += 1
        counts = np.bincount(table[table >= 0].ravel(), minlength=rows * cols * (2 if bits == 64 else 1))
        if counts.min() != 1 or counts.max() != 1:
            problems.append(f"{key}: stored element counts {counts.min()}..{counts.max()}")
        out[key + ".table"] = table
        stride, p, size = random_geometry(rows, cols, bits, lay, dstride, fb)
        mem0 = rng.integers(0, 256, (NRAND, size), dtype=np.uint8)
        regs = rng.integers(0, 2 ** 32, (NRAND, 32, nregs), dtype=np.uint32)
        (mem1,) = gpu.run(Kn.store_name(lay, shape, et, True), NRAND,
                          [mem0.ravel().copy(), np.uint64(size), np.uint32(p), np.uint32(stride), regs.ravel()], [0])
        out[key + ".rand_mem_before"] = mem0
        out[key + ".rand_regs"] = regs
        out[key + ".rand_mem_after"] = mem1.reshape(NRAND, size)
        out[key + ".rand_p_stride"] = np.array([p, stride], np.int64)
    # nvcuda::wmma C++ API cross-check against the inline-PTX loads of the same config
    for name, bytes_per, nel in (("api_ld_a_row_m16n16k16_f16", 512, 16), ("api_ld_b_col_m16n16k16_f16", 512, 16),
                                 ("api_ld_c_row_m16n16k16_f32", 1024, 8)):
        mem = rng.integers(0, 256, (2, bytes_per), dtype=np.uint8)
        res = np.zeros((2, 32, nel), np.uint32)
        (res,) = gpu.run(name, 2, [mem.ravel(), res], [1])
        out[name + ".mem"] = mem
        out[name + ".elems"] = res.reshape(2, 32, nel)
    return out, problems


# ---------------------------------------------------------------------------------------------
# wmma.mma


def is_main(f: Kn.WmmaMma) -> bool:
    main_shape = {"f16": "m16n16k16", "bf16": "m16n16k16", "s8": "m16n16k16", "u8": "m16n16k16"}
    return (f.alayout, f.blayout) == ("row", "col") and main_shape.get(f.atype, f.shape) == f.shape


def wmma_family(f: Kn.WmmaMma) -> str:
    return {"f16": "f16", "bf16": "bf16tf32", "tf32": "bf16tf32", "f64": "f64"}.get(f.atype, "int")


def mma_operands(f, rng, per_class, float_classes=None):
    """Logical operands for one wmma.mma form: dict of A, B, C bits (T, rows, cols) + class ids."""
    M, N, K = S.SHAPES[f.shape]
    if f.atype in ("s8", "u8", "s4", "u4", "b1"):
        classes = I.INT_CLASSES
        parts = [I.int_operands(c, rng, f.atype, per_class, M, N, K) for c in classes]
    else:
        classes = float_classes or I.FLOAT_CLASSES + (("tf32raw",) if f.atype == "tf32" else ())
        parts = []
        for c in classes:
            if c == "tf32raw":  # full fp32 patterns in tf32 operands: what does the load keep?
                sa, sb, sc = (per_class, M, K), (per_class, K, N), (per_class, M, N)
                parts.append((I.from_float(rng.standard_normal(sa), "f32"),
                              I.from_float(rng.standard_normal(sb), "f32"),
                              I.from_float(rng.standard_normal(sc), "f32")))
            else:
                parts.append(I.float_operands(c, rng, f.atype, f.ctype, per_class, M, N, K))
    a = np.concatenate([p[0] for p in parts])
    b = np.concatenate([p[1] for p in parts])
    c = np.concatenate([p[2] for p in parts])
    cls = np.repeat(np.arange(len(classes)), per_class).astype(np.int8)
    return a, b, c, cls, classes


def to_bits_unsigned(x, bits):
    """int32 values -> two's complement patterns of ``bits`` bits (uint64)."""
    return (x.astype(np.int64) & ((1 << bits) - 1)).astype(np.uint64)


def capture_wmma_mma(gpu, rng, main_per_class=32, other_per_class=2, spellings=None, float_classes=None):
    """Every wmma.mma form (or those in ``spellings``) on the input classes of ``inputs.py``."""
    out = {}
    for f in Kn.wmma_mma_forms():
        if spellings is not None and f.spelling not in spellings:
            continue
        M, N, K = S.SHAPES[f.shape]
        per = main_per_class if is_main(f) else other_per_class
        a, b, c, cls, classes = mma_operands(f, rng, per, float_classes)
        T = a.shape[0]
        bits = S.ELEMENT_BITS
        ab, bb, cb, db = bits[f.atype], bits[f.btype], bits[f.ctype], bits[f.dtype]
        a_bytes, b_bytes, c_bytes = M * K * ab // 8, K * N * bb // 8, M * N * cb // 8
        tile = np.zeros((T, a_bytes + b_bytes + c_bytes), np.uint8)
        for t in range(T):
            pa = a[t] if a.dtype.kind == "u" else to_bits_unsigned(a[t], ab)
            pb = b[t] if b.dtype.kind == "u" else to_bits_unsigned(b[t], bb)
            pc = c[t] if c.dtype.kind == "u" else to_bits_unsigned(c[t], cb)
            put_matrix(tile[t], 0, pa, ab, f.alayout, S.default_stride(f.shape, "a", f.alayout))
            put_matrix(tile[t], a_bytes, pb, bb, f.blayout, S.default_stride(f.shape, "b", f.blayout))
            put_matrix(tile[t], a_bytes + b_bytes, pc, cb, "row", N)
        dmem = np.zeros((T, M * N * db // 8), np.uint8)
        nd = S.FRAGMENT_REGS[(f.shape, "c", f.dtype)]
        dregs = np.zeros((T, 32, nd), np.uint32)
        dmem, dregs = gpu.run(f.name, T, [tile.ravel(), dmem.ravel(), dregs.ravel()], [1, 2])
        dmem = dmem.reshape(T, -1)
        d = np.stack([get_matrix(dmem[t], 0, M, N, db, "row", N) for t in range(T)])
        key = f.spelling
        out[key + ".a"] = a
        out[key + ".b"] = b
        out[key + ".c"] = c
        out[key + ".d"] = d.astype(np.uint64 if db == 64 else np.uint32 if db == 32 else np.uint16)
        out[key + ".class"] = cls
        out[key + ".dregs"] = dregs.reshape(T, 32, nd)[:8]
        out[key + ".classes"] = np.array(classes)
    return out


# ---------------------------------------------------------------------------------------------
# mma.sync (register level)

_MS_MAIN = ("m16n8k16.row.col.f32.f16.f16.f32", "m16n8k16.row.col.f32.bf16.bf16.f32",
            "m16n8k8.row.col.f32.tf32.tf32.f32", "m16n8k32.row.col.f32.e4m3.e4m3.f32",
            "m16n8k32.row.col.f32.e5m2.e5m2.f32", "m16n8k32.row.col.f32.e4m3.e5m2.f32",
            "m16n8k32.row.col.f32.e5m2.e4m3.f32", "m16n8k32.row.col.f16.e4m3.e4m3.f16",
            "m16n8k32.row.col.f16.e5m2.e5m2.f16", "m16n8k16.row.col.f16.f16.f16.f16")


def _ms_types(sp: str):
    q = sp.replace("mma.sync.aligned.", "").split(".")
    tys = [t for t in q if t in ("f16", "f32", "bf16", "tf32", "e4m3", "e5m2", "f64", "s8", "u8", "s4", "u4", "b1", "s32")]
    d, a, b, c = tys[:4]
    return d, a, b, c


def capture_mma_sync(gpu, rng, main_per_class=24, other_per_class=4, forms=None):
    out = {}
    bits = S.ELEMENT_BITS | {"e4m3": 8, "e5m2": 8}
    for f in forms or Kn.mma_sync_forms():
        dt, at, bt, ct = _ms_types(f.spelling)
        short = f.spelling.replace("mma.sync.aligned.", "")
        per = main_per_class if short in _MS_MAIN else other_per_class
        na_el = f.na * 32 // bits[at] if bits[at] <= 32 else f.na // 2
        nb_el = f.nb * 32 // bits[bt] if bits[bt] <= 32 else f.nb // 2
        nc_el = f.nc * 32 // bits[ct] if bits[ct] <= 32 else f.nc // 2
        if at in ("s8", "u8", "s4", "u4", "b1"):
            classes = I.INT_CLASSES
            parts = []
            for cl in classes:
                a_, b_, c_ = I.int_operands(cl, rng, at, per, 32, 1, na_el)
                b2 = I.int_operands(cl, rng, bt, per, 32, 1, nb_el)[0]
                parts.append((to_bits_unsigned(a_, bits[at]), to_bits_unsigned(b2, bits[bt]),
                              to_bits_unsigned(rng.choice(c_.ravel(), (per, 32, nc_el)), 32)))
        else:
            classes = I.FLOAT_CLASSES + (("tf32raw",) if at == "tf32" else ())
            parts = []
            for cl in classes:
                if cl == "tf32raw":
                    gen = lambda n: I.from_float(rng.standard_normal((per, 32, n)), "f32")  # noqa: E731
                    parts.append((gen(na_el), gen(nb_el), gen(nc_el)))
                    continue
                # value distributions of each class, laid out per register slot
                a_, _, c_ = I.float_operands(cl, rng, (at, bt), ct, per, 32, nc_el, na_el)
                _, b_, _ = I.float_operands(cl, rng, (at, bt), ct, per, 1, 32, nb_el)
                parts.append((a_.reshape(per, 32, na_el), b_.transpose(0, 2, 1).reshape(per, 32, nb_el),
                              c_.reshape(per, 32, nc_el)))
        a = np.concatenate([p[0] for p in parts])
        b = np.concatenate([p[1] for p in parts])
        c = np.concatenate([p[2] for p in parts])
        regs_in = np.concatenate([I.pack_slots(a, bits[at], f.na), I.pack_slots(b, bits[bt], f.nb),
                                  I.pack_slots(c, bits[ct], f.nc)], axis=2)
        out |= _run_mma_sync(gpu, f, short, regs_in, classes, per)
    return out


def _run_mma_sync(gpu, f, short, regs_in, classes, per_class):
    """Run mma.sync form ``f`` on ``regs_in`` (T, 32, na+nb+nc): the capture's arrays of ``short``."""
    T = regs_in.shape[0]
    regs_out = np.zeros((T, 32, f.nd), np.uint32)
    (regs_out,) = gpu.run(f.name, T, [regs_in.ravel(), regs_out.ravel()], [1])
    return {short + ".regs_in": regs_in, short + ".regs_out": regs_out.reshape(T, 32, f.nd),
            short + ".class": np.repeat(np.arange(len(classes)), per_class).astype(np.int8),
            short + ".classes": np.array(classes), short + ".nregs": np.array([f.na, f.nb, f.nc, f.nd])}


def capture_mma_sync_logical(gpu, rng, shorts, classes, per_class):
    """mma.sync on logical matrices (A (T, M, K), B, C) placed in the registers by tcemu's PTX
    fragment tables (checked on this hardware by ``capture_mma_sync``), so that structure along K
    (pairs of cancelling products) survives. Same keys as ``capture_mma_sync``, plus ``.a/.b/.c``."""
    from tcemu._src.isa.parse import parse
    from tcemu._src.isa.wmma import mma_sync_fragments

    out = {}
    bits = S.ELEMENT_BITS | {"e4m3": 8, "e5m2": 8}
    forms = {f.spelling.replace("mma.sync.aligned.", ""): f for f in Kn.mma_sync_forms()}
    for short in shorts:
        f = forms[short]
        dt, at, bt, ct = _ms_types(f.spelling)
        ins = parse(f.spelling)
        if ins.shape == "m8n8k4":  # four independent 8x8x4 MMAs, one per quad pair: A 32x4, B 4x32, C 32x8
            parts = []
            for cl in classes:
                q = [I.float_operands(cl, rng, (at, bt), ct, per_class, 8, 8, 4) for _ in range(4)]
                parts.append((np.concatenate([x[0] for x in q], 1), np.concatenate([x[1] for x in q], 2),
                              np.concatenate([x[2] for x in q], 1)))
        else:
            parts = [I.float_operands(cl, rng, (at, bt), ct, per_class, ins.m, ins.n, ins.k) for cl in classes]
        a, b, c = (np.concatenate([p[i] for p in parts]) for i in range(3))
        regs = []
        for mat, frag, n, et in zip((a, b, c), mma_sync_fragments(ins)[:3], (f.na, f.nb, f.nc), (at, bt, ct)):
            rc = frag.coords  # (32 lanes, values, (row, col))
            regs.append(I.pack_slots(mat[:, rc[..., 0], rc[..., 1]], bits[et], n))
        out |= _run_mma_sync(gpu, f, short, np.concatenate(regs, axis=2), classes, per_class)
        for k, v in zip("abc", (a, b, c)):
            out[f"{short}.{k}"] = v
    return out


# Forms of the signed-zero capture: every accumulator type of wmma, mma.sync and wgmma on sm_90.
SZ_WMMA = tuple(f"wmma.mma.sync.aligned.row.col.m16n16k16.{d}.{c}" for d in ("f16", "f32") for c in ("f16", "f32")) + (
    "wmma.mma.sync.aligned.row.col.m16n16k16.f32.bf16.bf16.f32", "wmma.mma.sync.aligned.row.col.m16n16k8.f32.tf32.tf32.f32")
SZ_MMA_SYNC = tuple(f"{s}.row.col.{d}.f16.f16.{d}" for s in ("m16n8k16", "m16n8k8", "m8n8k4") for d in ("f32", "f16")) + (
    "m16n8k16.row.col.f32.bf16.bf16.f32", "m16n8k8.row.col.f32.tf32.tf32.f32", "m16n8k4.row.col.f32.tf32.tf32.f32",
    "m16n8k32.row.col.f32.e4m3.e4m3.f32", "m16n8k32.row.col.f16.e4m3.e4m3.f16", "m16n8k32.row.col.f32.e5m2.e5m2.f32",
    "m16n8k32.row.col.f16.e5m2.e4m3.f16")


def capture_signed_zeros(gpu, rng, per_class=12, wgmma_gpu=None, classes=I.ZERO_CLASSES):
    """Results at or near zero (inputs.ZERO_CLASSES, or UNDERFLOW_CLASSES) for the sign of zero, on
    every accumulator type: wmma.mma (value/register level keys as ``capture_wmma_mma``), mma.sync
    (logical operands placed by the PTX fragments) and wgmma (keys as ``wgmma.run``)."""
    out = capture_wmma_mma(gpu, rng, per_class, per_class, spellings=SZ_WMMA, float_classes=classes)
    out |= capture_mma_sync_logical(gpu, rng, SZ_MMA_SYNC, classes, per_class)
    if wgmma_gpu is not None:
        import wgmma

        out |= wgmma.run(wgmma_gpu, rng, per_class, float_classes=classes)
    return out


# ---------------------------------------------------------------------------------------------
# ldmatrix / stmatrix


def capture_ldst(gpu, rng, n=16):
    out = {}
    words = Kn.SMEM_BYTES // 4
    for x, trans in Kn.LDSM_FORMS:
        offs = np.stack([rng.permutation(Kn.SMEM_BYTES // 16)[:32] * 16 for _ in range(n)]).astype(np.uint32)
        # every 16-bit slot of shared memory holds a distinct id
        ids = np.stack([rng.permutation(Kn.SMEM_BYTES // 2).astype(np.uint16) for _ in range(n)])
        smem = ids.view(np.uint32).reshape(n, words)
        regs = np.zeros((n, 32, x), np.uint32)
        (regs,) = gpu.run(Kn.ldsm_name("ldsm", x, trans), n, [smem.ravel(), offs.ravel(), regs.ravel()], [2])
        key = f"ldmatrix.sync.aligned.m8n8.x{x}{trans}.shared.b16"
        out[key + ".smem"] = smem
        out[key + ".offs"] = offs
        out[key + ".regs"] = regs.reshape(n, 32, x)
        before = rng.integers(0, 2 ** 32, (n, words), dtype=np.uint32)
        regs = rng.integers(0, 2 ** 32, (n, 32, x), dtype=np.uint32)
        (after,) = gpu.run(Kn.ldsm_name("stsm", x, trans), n, [before.ravel().copy(), offs.ravel(), regs.ravel()], [0])
        key = f"stmatrix.sync.aligned.m8n8.x{x}{trans}.shared.b16"
        out[key + ".smem_before"] = before
        out[key + ".offs"] = offs
        out[key + ".regs"] = regs
        out[key + ".smem_after"] = after.reshape(n, words)
    return out


# ---------------------------------------------------------------------------------------------


def meta(dry):
    info = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "seed": SEED, "dry_run": dry}
    for name, cmd in (("nvidia_smi", ["nvidia-smi", "--query-gpu=name,driver_version,compute_cap",
                                      "--format=csv,noheader"]), ("nvcc", ["nvcc", "--version"]),
                      ("commit", ["git", "rev-parse", "HEAD"])):
        try:
            info[name] = subprocess.run(cmd, capture_output=True, text=True, cwd=HERE).stdout.strip()
        except OSError as e:
            info[name] = f"unavailable: {e}"
    return info


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default="layouts,wmma,mma_sync,ldst",
                    help="comma-separated parts: layouts, wmma, mma_sync, ldst, signed_zeros, underflow, f64_m16n8 "
                         "(the last three not in the default)")
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args()
    outdir = Path(args.out)
    outdir.mkdir(parents=True, exist_ok=True)
    gpu = DryGpu() if args.dry_run else Gpu(Path(os.environ.get("TMPDIR", "/tmp")))
    rng = np.random.default_rng(SEED)
    parts = set(args.only.split(","))
    info = meta(args.dry_run)
    t0 = time.time()
    if "layouts" in parts:
        data, problems = capture_layouts(gpu, rng)
        info["layout_problems"] = problems[:200]
        print(f"layouts: {len(problems)} problems", *problems[:20], sep="\n  ", flush=True)
        np.savez_compressed(outdir / "wmma_layouts_sm90.npz", **data)
    if "wmma" in parts:
        data = capture_wmma_mma(gpu, rng)
        fams = {}
        for k, v in data.items():
            sp = k.rsplit(".", 1)[0]
            f = next(f for f in Kn.wmma_mma_forms() if f.spelling == sp)
            fams.setdefault(wmma_family(f), {})[k] = v
        for fam, d in fams.items():
            np.savez_compressed(outdir / f"wmma_mma_{fam}_sm90.npz", **d)
        print(f"wmma.mma: {len(data) // 7} forms", flush=True)
    if "mma_sync" in parts:
        np.savez_compressed(outdir / "mma_sync_sm90.npz", **capture_mma_sync(gpu, rng))
        print("mma.sync done", flush=True)
    if "f64_m16n8" in parts:  # sm_90's f64 m16n8kK; its own generator
        data = capture_mma_sync(gpu, np.random.default_rng(SEED + 7), other_per_class=3, forms=Kn.mma_sync_f64_forms())
        np.savez_compressed(outdir / "mma_sync_f64_sm90.npz", **data)
        print(f"mma.sync f64 m16n8kK: {len(data) // 5} forms", flush=True)
    if "ldst" in parts:
        np.savez_compressed(outdir / "ldstmatrix_sm90.npz", **capture_ldst(gpu, rng))
        print("ldmatrix/stmatrix done", flush=True)
    if "signed_zeros" in parts:  # its own generator: the other captures' inputs stay as they were
        import wgmma

        wg = wgmma.DryGpu() if args.dry_run else wgmma.Gpu(Path(os.environ.get("TMPDIR", "/tmp")))
        data = capture_signed_zeros(gpu, np.random.default_rng(SEED + 3), wgmma_gpu=wg)
        np.savez_compressed(outdir / "signed_zeros_sm90.npz", **data)
        print(f"signed zeros: {len(data)} arrays", flush=True)
    if "underflow" in parts:  # nonzero sums that round to zero; its own generator too
        import wgmma

        wg = wgmma.DryGpu() if args.dry_run else wgmma.Gpu(Path(os.environ.get("TMPDIR", "/tmp")))
        data = capture_signed_zeros(gpu, np.random.default_rng(SEED + 5), wgmma_gpu=wg, classes=I.UNDERFLOW_CLASSES)
        np.savez_compressed(outdir / "underflow_sm90.npz", **data)
        print(f"underflow: {len(data)} arrays", flush=True)
    info["seconds"] = round(time.time() - t0, 1)
    (outdir / "meta.json").write_text(json.dumps(info, indent=1))
    for p in sorted(outdir.iterdir()):
        print(f"{p.name:40s} {p.stat().st_size / 1e6:8.2f} MB")


if __name__ == "__main__":
    main()
