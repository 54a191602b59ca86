"""Reads a capture of ``mma_sp.py``: what the index-coded tiles say about the metadata, and how
the numerics tiles compare with exact arithmetic and with tcemu.

    python experiments/hardware/mma_sp_analysis.py tests/data/mma_sp_sm90.npz [--numerics]

``--numerics``: every tile through tcemu.ptx, and the f16/bf16/tf32 forms through the dense MMA
of K on the decompressed A, mismatching words counted per input class.

Index-coded tiles (``map*`` classes): D's bits give, for every compressed element (row r,
column j), the dense column it landed on; from those the 2-bit index each chunk used, and then,
over the random metadata of every lane, which (lane, bit) of the metadata registers that index
was read from (a fit with no layout assumed: every lane and bit pair is a candidate). Printed
against ``tcemu._src.layouts.sparse.metadata_table``.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import ml_dtypes
import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1]))
import mma_sp as S  # noqa: E402
from tcemu._src.layouts import sparse as L  # noqa: E402

VALUE = {"f16": np.float16, "bf16": ml_dtypes.bfloat16, "e4m3": ml_dtypes.float8_e4m3fn,
         "e5m2": ml_dtypes.float8_e5m2}


def unplace(regs, fr):
    """(T, 32, nregs) registers -> (T, rows, cols) element patterns (first holder)."""
    T = regs.shape[0]
    out = np.zeros((T, fr.rows, fr.cols), np.uint64)
    rc = fr.coords
    per = 32 // fr.bits
    for lane in range(32):
        for v in range(fr.nvalues):
            r, c = rc[lane, v]
            w = regs[:, lane, v // per].astype(np.uint64)
            out[:, r, c] = (w >> np.uint64((v % per) * fr.bits)) & np.uint64((1 << fr.bits) - 1)
    return out


def values(bits, t):
    """Element patterns -> float64 values of type ``t``."""
    if t in ("tf32", "f32"):
        return bits.astype(np.uint32).view(np.float32).astype(np.float64)
    if t in VALUE:
        return bits.astype({16: np.uint16, 8: np.uint8}[S.BITS[t]]).view(VALUE[t]).astype(np.float64)
    w = S.BITS[t]
    v = bits.astype(np.int64)
    return np.where((v >= 1 << (w - 1)) & t.startswith("s"), v - (1 << w), v).astype(np.float64)


def form_of(sp):
    return next(f for f in S.forms() if f[0] == sp)


def operands(z, sp):
    """Logical A (T, 16, K/2), B (T, K, 8), C (T, 16, 8) patterns, metadata (T, 32), D (T, 16, 8)."""
    _, at, bt, ct, k = form_of(sp)
    na, nb, nc, nd = (int(x) for x in z[sp + ".nregs"])
    fa, fb, fc = S.fragments(at, bt, ct, k)
    r = z[sp + ".regs_in"]
    A = unplace(r[:, :, :na], fa)
    B = unplace(r[:, :, na:na + nb], fb)
    C = unplace(r[:, :, na + nb:na + nb + nc], fc)
    D = unplace(z[sp + ".regs_out"], fc)
    return A, B, C, r[:, :, -1], D


def decode_maps(z, sp):
    """Per metadata configuration: (class name, selector, e (32,), kpos (16, K/2) int, ok)."""
    _, at, bt, ct, k = form_of(sp)
    A, B, C, E, D = operands(z, sp)
    cls, classes, plane, sel = z[sp + ".class"], z[sp + ".classes"], z[sp + ".plane"], z[sp + ".sel"]
    dv = values(D, ct).astype(np.int64)
    P, kc = k // 8, k // 2
    nb = int(np.log2(kc))
    out = []
    tiles = np.nonzero(plane[:, 0] > -2)[0]
    i = 0
    while i < len(tiles):
        t0 = tiles[i]
        group = [t for t in tiles[i:] if np.array_equal(E[t], E[t0]) and sel[t] == sel[t0] and cls[t] == cls[t0]]
        group = group[:(nb + 1) * ((P + 3) // 4)]
        hits = np.zeros((nb + 1, 16, k), np.int64)  # count of ones landing on each dense column
        for t in group:
            b, q = plane[t]
            for n in range(8):
                for w in range(min(4, P - 4 * q)):
                    v = dv[t, :, n] % 16 if bt == "s4" else dv[t, :, n]
                    hits[b + 1, :, P * n + 4 * q + w] += (v >> w) & 1
        ok = bool(np.all(hits[0].sum(1) == kc))
        kpos = np.full((16, kc), -1, np.int64)
        for r in range(16):
            for kk in np.nonzero(hits[0, r])[0]:
                j = sum(int(hits[b + 1, r, kk]) << b for b in range(nb))
                if 0 <= j < kc:
                    kpos[r, j] = kk
        ok = ok and bool(np.all(kpos >= 0))
        out.append((str(classes[cls[t0]]), int(sel[t0]), E[t0], kpos, ok))
        i += len(group)
    return out


def unit_indices(kpos, bits):
    """Observed 2-bit unit indices (16, R/2) from dense positions, or None where inconsistent."""
    kc = kpos.shape[1]
    if bits in (16, 8):
        return kpos - 4 * (np.arange(kc) // 2)
    if bits == 4:
        u = kpos[:, ::2] // 2
        return u - 4 * (np.arange(kc // 2) // 2)
    off = kpos - 2 * np.arange(kc)  # tf32: 0 or 1
    return np.stack([2 * off, 2 * off + 1], -1).reshape(16, 2 * kc)


def fit(configs, rbits, bits):
    """For every row and 2-bit field: the (lane, shift) candidates consistent with every config."""
    good = [c for c in configs if c[4] and c[0] == "map"]
    obs = np.stack([unit_indices(c[3], bits) for c in good])  # (n, 16, R/2)
    E = np.stack([c[2] for c in good]).astype(np.int64)  # (n, 32)
    fields = (E[:, :, None] >> (2 * np.arange(16))[None, None, :]) & 3  # (n, lane, shift/2)
    cands = {}
    for r in range(16):
        for u in range(rbits // 2):
            m = np.all(fields == obs[:, r, u][:, None, None], axis=0)
            cands[(r, u)] = [(int(lane), 2 * int(s)) for lane, s in zip(*np.nonzero(m))]
    return cands


def hypothesis_positions(E, sel, at, k):
    """Dense columns (T, 16, K/2) of the compressed elements under metadata_table (R, selector)."""
    rbits = L.row_bits(k, S.BITS[at])
    out = []
    for t in range(E.shape[0]):
        tab = L.metadata_table(rbits, int(sel[t]), L.unit_bits(S.BITS[at]))
        bit = (E[t][tab[..., 0]].astype(np.int64) >> tab[..., 1]) & 1  # (16, R)
        idx = bit[:, 0::2] | (bit[:, 1::2] << 1)
        out.append(L.dense_positions(idx[None], S.BITS[at])[0])
    return np.stack(out)


def exact(z, sp):
    """D in float64 from the logical operands: sum of the kept products (positions under the
    hypothesis) plus C, exactly (meaningful for the small-integer tiles)."""
    _, at, bt, ct, k = form_of(sp)
    A, B, C, E, _ = operands(z, sp)
    pos = hypothesis_positions(E, z[sp + ".sel"], at, k)
    Bv = values(B, bt)
    Bg = np.take_along_axis(Bv[:, None, :, :], pos[..., None], axis=2)  # (T, 16, K/2, 8)
    return np.einsum("trj,trjn->trn", values(A, at), Bg) + values(C, ct)


def report_maps(z):
    for sp, at, bt, ct, k in S.forms():
        if sp + ".plane" not in z.files or not np.any(z[sp + ".plane"][:, 0] > -2):
            continue
        rbits = L.row_bits(k, S.BITS[at])
        configs = decode_maps(z, sp)
        bad = sum(not c[4] for c in configs if c[0] == "map")
        print(f"{sp}: {len(configs)} metadata configurations, {bad} sorted ones not decodable")
        for f in L.SELECTORS[rbits]:
            cf = [c for c in configs if c[1] == f]
            cands = fit(cf, rbits, S.BITS[at])
            tab = L.metadata_table(rbits, f, L.unit_bits(S.BITS[at]))
            agree = sum(cands[(r, u)] == [tuple(tab[r, 2 * u])] for r in range(16) for u in range(rbits // 2))
            amb = sum(len(v) != 1 for v in cands.values())
            print(f"   selector {f}: fields matching metadata_table uniquely {agree}/{16 * rbits // 2}, "
                  f"ambiguous or none {amb}")
        for name in ("map_unordered", "map_invalid"):
            cs = [c for c in configs if c[0] == name]
            if cs:
                same = [c for c in cs if c[4] and np.array_equal(
                    c[3], hypothesis_positions(c[2][None], np.array([c[1]]), at, k)[0])]
                print(f"   {name}: {sum(c[4] for c in cs)}/{len(cs)} decodable, {len(same)} as "
                      "element 2c -> first index, 2c + 1 -> second")


def report_sanity(z):
    """Small-integer tiles against exact arithmetic (positions under metadata_table)."""
    for sp, at, bt, ct, k in S.forms():
        cls, classes = z[sp + ".class"], list(z[sp + ".classes"])
        t = cls == classes.index("sanity")
        if not t.any():  # the committed development file keeps the index-coded tiles only
            continue
        _, _, _, _, D = operands(z, sp)
        want = exact(z, sp)[t]
        got = values(D, ct)[t]
        if ct == "s32":
            want = (want.astype(np.int64) + 2 ** 31) % 2 ** 32 - 2 ** 31
        bad = int(np.sum(got != want))
        print(f"{sp:80s} sanity tiles {int(t.sum()):3d}: {bad} of {got.size} outputs differ from exact")


class MockGpu:
    """Stands in for the GPU in a dry run: exact arithmetic under tcemu's layout hypothesis."""

    def __init__(self):
        self.name_to_form = {S.kname(f[0]): f for f in S.forms()}

    def run(self, name, nblocks, args, outs):
        sp, at, bt, ct, k = self.name_to_form[name]
        na, nb, nc, nd = S.nregs(at, bt, ct, k)
        regs = args[0].reshape(nblocks, 32, -1)
        z = {sp + ".regs_in": regs, sp + ".sel": args[1], sp + ".regs_out": np.zeros((nblocks, 32, nd), np.uint32),
             sp + ".nregs": np.array([na, nb, nc, nd])}
        d = exact(z, sp)
        if ct == "s32":
            bits = d.astype(np.int64) & 0xFFFFFFFF
        else:
            bits = np.asarray(d, {"f32": np.float32, "f16": np.float16}[ct]).view(
                {"f32": np.uint32, "f16": np.uint16}[ct])
        _, _, fc = S.fragments(at, bt, ct, k)
        return [S.place(bits.astype(np.uint64), fc, nd).ravel()]


def _emulate(z, sp, dense_k=False):
    """tcemu's D registers for every tile of ``sp``: ``tcemu.ptx`` (the kept products as the dense
    MMA of K/2), or with ``dense_k`` the dense MMA of K on the decompressed A (sm_90 preset)."""
    import jax
    import jax.numpy as jnp

    import tcemu
    from tcemu._src.isa import sparse as SP
    from tcemu._src.isa.fragments import fragment_to_matrix, matrix_to_fragment
    from tcemu._src.isa.instructions import Mma
    from tcemu._src.isa.mma_regs import _from_numeric, _to_numeric
    from tcemu._src.isa.parse import parse
    from tcemu._src.numerics import mma as mn

    ins = parse(sp)
    na, nb, nc, nd = (int(x) for x in z[sp + ".nregs"])
    regs, sel = z[sp + ".regs_in"], z[sp + ".sel"]
    f = tcemu.ptx(sp, arch="sm_90")
    fa, fb, fc, fd = SP.sparse_fragments(ins)
    dense = Mma(sp, "mma.sp", ins.shape, 16, 8, ins.k, ins.dtype, ins.atype, ins.btype, ins.ctype, satfinite=ins.satfinite)

    def decompressed(r, s):
        A = _to_numeric(fragment_to_matrix(r[:, :na], fa), ins.atype)
        B, C = (_to_numeric(fragment_to_matrix(r[:, lo:hi], fr), t) for lo, hi, fr, t in
                ((na, na + nb, fb, ins.btype), (na + nb, na + nb + nc, fc, ins.ctype)))
        pos = SP.register_positions(ins, r[:, na + nb + nc], s)
        Ad = jnp.zeros((16, ins.k), A.dtype).at[jnp.arange(16)[:, None], pos].set(A)
        model = None if ins.family == "int" else mn.resolve_model(dense, None, "sm_90")
        return matrix_to_fragment(_from_numeric(mn.mma_bits(dense, Ad, B, C, model, arch="sm_90"), ins.dtype), fd)

    out = np.zeros((len(sel), 32, nd), np.uint32)
    for s in sorted(set(sel.tolist())):
        one = (lambda r: decompressed(r, s)) if dense_k else (lambda r: f(
            r, a=range(na), b=range(na, na + nb), c=range(na + nb, na + nb + nc), e=na + nb + nc, f=s, d=range(nd))[:, :nd])
        out[sel == s] = np.asarray(jax.jit(jax.vmap(one))(jnp.asarray(regs[sel == s])))
    return out


def report_numerics(z):
    """Mismatching D words per input class: tcemu.ptx, and (f16/bf16/tf32 ::ordered_metadata) the
    dense MMA of K on the decompressed A."""
    for sp, at, bt, ct, k in S.forms():
        cls, classes, hw = z[sp + ".class"], list(z[sp + ".classes"]), z[sp + ".regs_out"]
        per = lambda bad: {c: int(bad[cls == i].sum()) for i, c in enumerate(classes) if bad[cls == i].any()}  # noqa: E731
        bad = _emulate(z, sp) != hw
        line = f"{sp}: {hw.size} words, tcemu differs on {int(bad.sum())} {per(bad)}"
        if "ordered" in sp and at in ("f16", "bf16", "tf32"):
            bad = _emulate(z, sp, dense_k=True) != hw
            line += f"; dense K on the decompressed A differs on {int(bad.sum())} {per(bad)}"
        print(line, flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("npz")
    ap.add_argument("--numerics", action="store_true", help="also compare every tile with tcemu (a minute)")
    args = ap.parse_args()
    z = np.load(args.npz)
    report_maps(z)
    report_sanity(z)
    if args.numerics:
        report_numerics(z)


if __name__ == "__main__":
    main()
