"""Sparse ``wgmma.mma_async.sp`` at register level (sm_90a): the metadata register, the sparsity
selector, the compressed A (registers or descriptor) and the dense B (descriptor).

    python experiments/hardware/wgmma_sp.py --out OUTDIR [--seed S] [--only tf32any] [--dry-run]

One 128-thread block (a warpgroup) per tile, as ``wgmma_regs.py``: the tile's shared-memory image
is copied in, the descriptors (relative to the buffer) are moved to its address, D is preloaded with
C and one ``wgmma.mma_async.sp`` runs with ``scale-d`` from the tile and the selector (an immediate)
picked by a switch; every lane reads its own metadata register.

``map`` tiles (index-coded): B is the identity (N = K, K-major, no swizzle), so ``D[m, n]`` is the
sum of the compressed ``A[m, j]`` whose metadata puts them in dense column ``n``; ``A[m, j] =
2**(j % 8)`` on the columns of plane ``j // 8`` (16-bit and tf32: ``2**j``, one plane). Every
lane's metadata register is random: sorted index pairs (16 tiles per selector; tf32 20, its valid
chunks being 0b0100 and 0b1110), unsorted distinct pairs (3), any pattern (2). D then names, for
every row and compressed column, the dense column(s) it reached, whatever lane and bit its index
came from. A from registers and from descriptors (K-major and, 16-bit, MN-major), B K- and MN-major.

numerics tiles: random and adversarial operands (``inputs.py``) on a form per type, metadata per row
(half the tiles the same pattern on every row so that B's kept rows carry the class structure),
``hiddenB`` (inf/NaN in the B rows no metadata selects), ``blocks`` (products 1, 2**-24 in the
first half of the kept K and 2**-24 in the second: one block or two?), ``sanity`` (small
integers, checked here against exact arithmetic). Held-out captures (a seed other than the
development one) add forms over random descriptors and hashed images.

``--only tf32any``: tf32 with raw float32 operands and any index pairs in every lane (which halves
of B an undefined metadata chunk reads), ``wgmma_sp_tf32any_sm90_SEED.npz``.

Writes ``wgmma_sp_sm90[_SEED].npz``; keys ``<kernel>.<field>``: ``e`` (T, 128) metadata registers,
``sel``, ``a_regs``/``c_regs``/``d_regs`` (T, 128, n), ``img`` (unique images) with ``img_index``,
``desc`` (T, 2) descriptors relative to the buffer, ``info`` (buffer address, descriptors used).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1]))
import inputs as I  # noqa: E402
import mma_sp as S  # noqa: E402
import wgmma_regs as W  # noqa: E402
from tcemu._src.layouts import sparse as L  # noqa: E402
from tcemu._src.layouts import wgmma as LW  # noqa: E402

DEV_SEED = 20261130
IMG = W.IMG
B_AT = 16384  # B's start (relative) in the canonical tiles
SK = {16: 32, 32: 16, 8: 64}  # sparse K by element bits


class SpForm(W.Form):
    """One ``wgmma.mma_async.sp`` kernel (the dense ``W.Form`` with the sparse K and operands)."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.k = SK[self.bits]
        self.rbits = L.row_bits(self.k, self.bits)
        self.sels = L.SELECTORS[self.rbits]

    @property
    def spelling(self):
        sat = ".satfinite" if self.sat else ""
        return f"wgmma.mma_async.sp.sync.aligned.m64n{self.n}k{self.k}{sat}.{self.d}.{self.a}.{self.b}"

    def source(self):
        acc = "f" if self.d == "f32" else "r"
        ctype = "float" if self.d == "f32" else "unsigned"
        cin = "__uint_as_float" if self.d == "f32" else ""
        cout = "__float_as_uint" if self.d == "f32" else ""
        nd, na = self.nd, self.na
        dl = ", ".join(f"%{i}" for i in range(nd))
        asrc = "{" + ", ".join(f"%{nd + i}" for i in range(na)) + "}" if na else f"%{nd}"
        nx = nd + max(na, 1)
        outs = ", ".join(f'"+{acc}"(d[{i}])' for i in range(nd))
        ins = ", ".join([f'"r"(a[{i}])' for i in range(na)] or ['"l"(da)']) + ', "l"(db), "r"(e), "r"(sc)'
        cases = "\n".join(
            f'    case {s}: asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{nx + 2}, 0;\\n"\n'
            f'        "{self.spelling} {{{dl}}}, {asrc}, %{nx}, %{nx + 1}, {s}, p{self.immediates()};\\n}}\\n"'
            f' : {outs} : {ins} : "memory"); break;' for s in self.sels)
        return f"""
extern "C" __global__ void __launch_bounds__(128) {self.name}(const unsigned char* img, const unsigned* ain,
        const unsigned* cin, const unsigned* ein, const unsigned long long* desc, const int* scd, const int* sel,
        unsigned* dout, unsigned* info) {{
    extern __shared__ __align__(1024) unsigned char sm[];
    int t = threadIdx.x;
    const long long tile = blockIdx.x;
    const uint4* src = (const uint4*)(img + tile * {IMG});
    for (int i = t; i < {IMG // 16}; i += 128) ((uint4*)sm)[i] = src[i];
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();
    unsigned base = (unsigned)__cvta_generic_to_shared(sm);
    unsigned long long da = desc[2 * tile] + (base >> 4), db = desc[2 * tile + 1] + (base >> 4);
    int sc = scd[tile];
    unsigned e = ein[tile * 128 + t];
    if (t == 0) {{
        info[5 * tile] = base; info[5 * tile + 1] = (unsigned)da; info[5 * tile + 2] = (unsigned)(da >> 32);
        info[5 * tile + 3] = (unsigned)db; info[5 * tile + 4] = (unsigned)(db >> 32);
    }}
    unsigned a[{max(na, 1)}]; {ctype} d[{nd}];
    for (int i = 0; i < {na}; i++) a[i] = ain[(tile * 128 + t) * {max(na, 1)} + i];
    for (int i = 0; i < {nd}; i++) d[i] = {cin}(cin[(tile * 128 + t) * {nd} + i]);
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
    switch (sel[tile]) {{
{cases}
    }}
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
    for (int i = 0; i < {nd}; i++) dout[(tile * 128 + t) * {nd} + i] = {cout}(d[i]);
}}
"""


# ---------------------------------------------------------------------------------------------
# metadata


def meta_regs(rng, idx_rows, rbits, sel, ub, tf32=False):
    """(T, 128) metadata registers holding ``idx_rows`` (T, 64, R/2): warp w's lanes carry rows
    16 w .. 16 w + 15 as ``mma.sp`` does (``L.metadata_table``); the lanes the selector does not
    read hold other random metadata."""
    return np.concatenate([S.meta_regs(rng, idx_rows[:, 16 * w:16 * w + 16], rbits, sel, "sorted", ub, tf32)
                           for w in range(4)], axis=1)


def random_meta(rng, T, mode, tf32=False):
    """(T, 128) registers of random index pairs in every nibble."""
    idx = S.pairs(rng, (T, 128, 8), mode, tf32)
    e = np.zeros((T, 128), np.uint64)
    for i in range(8):
        e |= (idx[..., i, 0].astype(np.uint64) | (idx[..., i, 1].astype(np.uint64) << 2)) << np.uint64(4 * i)
    return e.astype(np.uint32)


# ---------------------------------------------------------------------------------------------
# placing operands


def put_a(img, f, A, swz="none"):
    """A (64, K/2) at the canonical descriptor at 0: the descriptor."""
    la, sa = W.canonical(64, swz, f.tnsp_a, f.bits)
    W.place(img, 0, A, swz, la, sa, f.tnsp_a, f.bits)
    return W.encode(0, la, sa, swz)


def put_b(img, f, B, swz="none"):
    """B (K, N) at the canonical descriptor at B_AT (K is twice the dense wgmma's: two 32-byte
    K tiles, as the canonical layouts continue)."""
    lb, sb = b_canonical(f, swz)
    place_b(img, B_AT, B.T, swz, lb, sb, f.tnsp_b, f.bits, f.k)
    return W.encode(B_AT, lb, sb, swz)


def b_canonical(f, swz):
    """(LBO, SBO) of B with ``f.k`` K elements (64 bytes of K a row)."""
    Wn = W.SWZ[swz][1]
    kbytes = f.k * f.bits // 8
    if not f.tnsp_b:
        if swz == "none":  # core matrices: 8 rows x 16 bytes; K chunks at LBO, 8-row groups at SBO
            return 128, 128 * (kbytes // 16)
        if kbytes <= 16 * Wn:  # a swizzled row of 16 W bytes holds all of K
            return 16, 128 * Wn
        return 128 * Wn * (f.n // 8), 128 * Wn  # K atoms of 16 W bytes at LBO, after the N/8 row groups
    if swz == "none":  # MN chunks of 8 K rows at SBO = 128, 8-K groups at LBO
        return 128 * (f.n * f.bits // 128), 128
    per_atom = 16 * Wn * 8
    return per_atom * (f.k // 8), per_atom


def place_b(img, start, rows_k, swz, lbo, sbo, mn, bits, k):
    off = LW.smem_offsets(rows_k.shape[0], k, bits, bool(mn), swz, lbo, sbo)
    addr = LW.swizzle_address(start + off, swz, 0)
    eb = bits // 8
    for j in range(eb):
        img[addr + j] = ((rows_k.astype(np.uint64) >> np.uint64(8 * j)) & np.uint64(255)).astype(np.uint8)


def a_regs_of(f, A):
    """(T, 128, 4) A registers of the compressed A (T, 64, K/2)."""
    ac = W.a_coords(f.bits)
    return I.pack_slots(A[:, ac[..., 0], ac[..., 1]], f.bits, 4)


# ---------------------------------------------------------------------------------------------
# index-coded tiles


def map_forms():
    f16, u8 = ("f32", "f16", "f16"), ("s32", "u8", "u8")
    return [SpForm("map_f16", 32, *f16, True), SpForm("map_f16_desc", 32, *f16, False),
            SpForm("map_f16_t", 32, *f16, False, tnsp_a=1, tnsp_b=1),
            SpForm("map_bf16", 32, "f32", "bf16", "bf16", True),
            SpForm("map_tf32", 16, "f32", "tf32", "tf32", True), SpForm("map_tf32_desc", 16, "f32", "tf32", "tf32", False),
            SpForm("map_e4m3", 64, "f32", "e4m3", "e4m3", True),
            SpForm("map_u8", 64, *u8, True), SpForm("map_u8_desc", 64, *u8, False)]


def map_tiles(f, rng):
    """(imgs, descs, a_regs, e, sel, plane, mode) of the index-coded tiles of form ``f``."""
    kc = f.k // 2
    tf32 = f.a == "tf32"
    planes = range(1) if f.bits >= 16 else range(kc // 8)
    configs = (("sorted", 20 if tf32 else 16), ("unsorted", 3), ("any", 2))
    eye = np.eye(f.k, dtype=np.float64)
    Bbits = I.from_float(eye, f.b) if f.b in I.FORMATS else eye.astype(np.uint32)
    imgs, descs, aregs, es, sels, pls, modes = [], [], [], [], [], [], []
    for p in planes:
        j = np.arange(kc)
        val = np.where(j // 8 == p, 2.0 ** (j % 8), 0.0) if f.bits == 8 else 2.0 ** j
        A = np.broadcast_to(val, (1, 64, kc))
        Abits = I.from_float(A, f.a) if f.a in I.FORMATS else A.astype(np.uint32)
        img = np.zeros(IMG, np.uint8)
        da = 0 if f.a_regs else put_a(img, f, Abits[0])
        db = put_b(img, f, Bbits)
        ar = a_regs_of(f, Abits) if f.a_regs else np.zeros((1, 128, 1), np.uint32)
        for mi, (mode, count) in enumerate(configs):
            for s in f.sels:
                e = random_meta(rng, count, mode, tf32)
                for t in range(count):
                    imgs.append(img), descs.append((da, db)), aregs.append(ar[0]), es.append(e[t])
                    sels.append(s), pls.append(p), modes.append(mi)
    return (np.stack(imgs), np.array(descs, np.uint64), np.stack(aregs), np.stack(es), np.array(sels, np.int32),
            np.array(pls, np.int8), np.array(modes, np.int8))


# ---------------------------------------------------------------------------------------------
# layout tiles: random descriptors over offset-coded images (wgmma_regs.plane_image)

PATTERNS = (0x44444444, 0xEEEEEEEE)  # every chunk (0, 1) / (2, 3), 8- and 16-bit units alike


def layout_forms():
    u8, f16 = ("s32", "u8", "u8"), ("f32", "f16", "f16")
    return [SpForm("lay_u8_b32", 32, *u8, True), SpForm("lay_f16_b32_t0", 32, *f16, True),
            SpForm("lay_f16_b32_t1", 32, *f16, True, tnsp_b=1),
            SpForm("lay_u8_a", 32, *u8, False), SpForm("lay_f16_a_t0", 16, *f16, False),
            SpForm("lay_f16_a_t1", 16, *f16, False, tnsp_a=1)]


def kept_rows(f, pattern):
    """Dense K row of compressed column j when every chunk holds the index pair ``pattern``."""
    j = np.arange(f.k // 2)
    return 4 * (j // 2) + np.asarray(pattern)[j % 2]


def layout_tiles(f, rng, per_swizzle):
    """(imgs, descs, a_regs, e, plane, pattern) of a layout form: B under test (A one-hot from
    registers: ``D[m, n] = B[kept(m % K/2), n]``) or A under test (B one-hot at ONEHOT:
    ``D[m, n] = A[m, n % K/2]``)."""
    fmt, kc = f.a, f.k // 2
    on_a = not f.a_regs
    mn = f.tnsp_a if on_a else f.tnsp_b
    rows = 64 if on_a else f.n
    one = 1 if fmt == "u8" else 0x3C00
    imgs, descs, ar, es, planes, pats = [], [], [], [], [], []
    for swz in W.SWZ:
        for _ in range(per_swizzle):
            start, lbo, sbo, s, base = W.rand_desc(rng, rows, mn, swz, 2 if on_a else 4, True)
            d = W.encode(start, lbo, sbo, s, base)
            for p in (0, 1):
                for pi, pat in enumerate(((0, 1), (2, 3)) if not on_a else ((0, 1),)):
                    img = W.plane_image(fmt, p)
                    if on_a:
                        B = np.zeros((f.n, f.k), np.uint32)  # K-major operand order: row n
                        B[np.arange(f.n), kept_rows(f, pat)[np.arange(f.n) % kc]] = one
                        place_b(img, W.ONEHOT, B, "none", 128, 128 * (f.k * f.bits // 128), False, f.bits, f.k)
                        descs.append((d, W.encode(W.ONEHOT, 128, 128 * (f.k * f.bits // 128))))
                        ar.append(np.zeros((128, 1), np.uint32))
                    else:
                        descs.append((0, d))
                        ac = W.a_coords(f.bits)
                        A = (ac[..., 1] == ac[..., 0] % kc).astype(np.uint32) * one
                        ar.append(I.pack_slots(A[None], f.bits, 4)[0])
                    imgs.append(img), planes.append(p), pats.append(pi)
                    es.append(np.full(128, PATTERNS[pi], np.uint32))
    return (np.stack(imgs), np.array(descs, np.uint64), np.stack(ar), np.stack(es), np.array(planes, np.int8),
            np.array(pats, np.int8))


# ---------------------------------------------------------------------------------------------
# numerics tiles


def numerics_forms():
    return [
        SpForm("num_f16_n32", 32, "f32", "f16", "f16", True, swz=("none", "128B")),
        SpForm("num_f16h_n24", 24, "f16", "f16", "f16", False, tnsp_a=1, tnsp_b=1, neg_a=1, swz=("64B", "32B")),
        SpForm("num_bf16_n24", 24, "f32", "bf16", "bf16", False, tnsp_b=1, neg_b=1, swz=("none", "128B")),
        SpForm("num_tf32_n24", 24, "f32", "tf32", "tf32", True, neg_a=1, neg_b=1, swz=("none", "128B")),
        SpForm("num_tf32_n16", 16, "f32", "tf32", "tf32", False, swz=("128B", "none")),
        SpForm("num_e4m3_n40", 40, "f32", "e4m3", "e4m3", True, swz=("none", "128B")),
        SpForm("num_e4e5h_n40", 40, "f16", "e4m3", "e5m2", False, swz=("64B", "none")),
        SpForm("num_e5e4_n8", 8, "f32", "e5m2", "e4m3", False, neg_a=1, swz=("128B", "32B")),
        SpForm("num_s8_n48", 48, "s32", "s8", "s8", True, swz=("none", "128B")),
        SpForm("num_u8s8sat_n48", 48, "s32", "u8", "s8", False, sat=True, swz=("none", "none")),
        SpForm("num_s8u8sat_n256", 256, "s32", "s8", "u8", True, sat=True, swz=("none", "64B")),
    ]


def logical(f, cl, rng, T):
    """Class ``cl`` operands (bit patterns): A (T, 64, K/2), kept B rows Bg (T, K/2, N), full B
    (T, K, N), C (T, 64, N); the mma_sp classes on a warpgroup's shapes."""
    kc, n = f.k // 2, f.n
    if f.d == "s32":
        cls = "small" if cl == "sanity" else cl
        A, _, C = I.int_operands(cls, rng, f.a, T, 64, n, kc)
        Bg = I.int_operands(cls, rng, f.b, T, 64, n, kc)[1]
        Bf = I.int_operands(cls, rng, f.b, T, 64, n, f.k)[1]
        return A & 255, Bg & 255, Bf & 255, C.astype(np.int64) & 0xFFFFFFFF
    if cl == "sanity":
        g = lambda s, t, lo=-3, hi=4: I.from_float(rng.integers(lo, hi, s).astype(np.float64), t)  # noqa: E731
        return g((T, 64, kc), f.a), g((T, kc, n), f.b), g((T, f.k, n), f.b), g((T, 64, n), f.d, -8, 9)
    if cl == "blocks":
        A = np.zeros((T, 64, kc))
        A[..., 0], A[..., 1], A[..., kc // 2] = 1.0, 2.0 ** -12, 2.0 ** -12
        Bg = rng.standard_normal((T, kc, n))
        Bg[:, 0], Bg[:, 1], Bg[:, kc // 2] = 1.0, 2.0 ** -12, 2.0 ** -12
        if f.bits == 8:  # 2**-12 is below e4m3: products 1 and 2**-14 via 2**-7 * 2**-7 (e5m2 too)
            A[..., 1], A[..., kc // 2] = 2.0 ** -7, 2.0 ** -7
            Bg[:, 1], Bg[:, kc // 2] = 2.0 ** -7, 2.0 ** -7
        return (I.from_float(A, f.a), I.from_float(Bg, f.b), I.from_float(rng.standard_normal((T, f.k, n)), f.b),
                I.from_float(np.zeros((T, 64, n)), f.d))
    if cl == "hiddenB":
        A, Bg, C = I.float_operands("normal", rng, (f.a, f.b), f.d, T, 64, n, kc)
        return A, Bg, I.specials(rng, f.b, (T, f.k, n)), C
    A, Bg, C = I.float_operands(cl, rng, (f.a, f.b), f.d, T, 64, n, kc)
    Bf = I.float_operands(cl, rng, (f.a, f.b), f.d, T, 64, n, f.k)[1]
    return A, Bg, Bf, C


def numerics_tiles(f, rng, per_class):
    """(imgs, descs, a_regs, c_regs, e, sel, class index, classes, sanity tiles) of form ``f``."""
    tf32 = f.a == "tf32"
    classes = (("sanity",) + I.INT_CLASSES if f.d == "s32"
               else ("sanity",) + I.FLOAT_CLASSES + ("hiddenB", "blocks"))
    imgs, descs, ar, cr, es, sels, cls, san = [], [], [], [], [], [], [], []
    for ci, cl in enumerate(classes):
        T = per_class
        A, Bg, B, C = logical(f, cl, rng, T)
        for t in range(T):
            uniform = cl in ("hiddenB", "blocks") or t % 2 == 0
            shape = (1, 1 if uniform else 64, f.rbits // 4)
            p = S.pairs(rng, shape, "sorted", tf32) if cl != "blocks" else np.zeros(shape + (2,), int) + [0, 1]
            p = np.broadcast_to(p, (1, 64, f.rbits // 4, 2)).reshape(1, 64, f.rbits // 2)
            pos = L.dense_positions(p, f.bits)[0]
            Bt = B[t].copy()
            if uniform:
                Bt[pos[0]] = Bg[t]
            s = int(rng.choice(f.sels))
            img = np.zeros(IMG, np.uint8)
            da = 0 if f.a_regs else put_a(img, f, A[t], f.swz[0])
            db = put_b(img, f, Bt, f.swz[1])
            imgs.append(img), descs.append((da, db)), sels.append(s), cls.append(ci)
            ar.append(a_regs_of(f, A[t:t + 1])[0] if f.a_regs else np.zeros((128, 1), np.uint32))
            cr.append(W.pack_d(f, C[t:t + 1])[0])
            es.append(meta_regs(rng, p, f.rbits, s, L.unit_bits(f.bits), tf32)[0])
            if cl == "sanity" and f.d != "s32":
                san.append((len(sels) - 1, A[t], Bt, C[t], pos))
    return (np.stack(imgs), np.array(descs, np.uint64), np.stack(ar), np.stack(cr), np.stack(es),
            np.array(sels, np.int32), np.array(cls, np.int8), classes, san)


# ---------------------------------------------------------------------------------------------
# random descriptors over hashed images (held-out)


def rd_forms():
    return [SpForm("rd_f16h_n72", 72, "f16", "f16", "f16", False, tnsp_a=1, tnsp_b=1, neg_b=1),
            SpForm("rd_bf16_n16", 16, "f32", "bf16", "bf16", False, tnsp_a=1),
            SpForm("rd_tf32_n32", 32, "f32", "tf32", "tf32", False, neg_a=1),
            SpForm("rd_e4m3h_n104", 104, "f16", "e4m3", "e4m3", False),
            SpForm("rd_e5e4_n32", 32, "f32", "e5m2", "e4m3", True),
            SpForm("rd_s8u8_n48", 48, "s32", "s8", "u8", False)]


def rd_tiles(f, rng, per_swizzle=2):
    tf32 = f.a == "tf32"
    imgs, descs, ar, cr, es, sels, seeds = [], [], [], [], [], [], []
    for swz in W.SWZ:
        for _ in range(per_swizzle):
            a = W.rand_desc(rng, 64, f.tnsp_a, swz, 2, True, 32)
            b = W.rand_desc(rng, f.n, f.tnsp_b, W.SWZ_LIST[int(rng.integers(0, 4))], 4, True, 32)
            descs.append((W.encode(*a) if not f.a_regs else 0, W.encode(*b)))
            seeds.append(int(rng.integers(0, 2 ** 31)))
            imgs.append(W.hashed_image(seeds[-1], f.a))
            if f.a_regs:
                A = I.float_operands("normal", rng, f.a, f.d, 1, 64, 8, f.k // 2)[0]
                ar.append(a_regs_of(f, A)[0])
            else:
                ar.append(np.zeros((128, 1), np.uint32))
            C = (rng.integers(-100, 100, (1, 64, f.n)).astype(np.int32).view(np.uint32) if f.d == "s32"
                 else I.float_operands("normal", rng, f.a, f.d, 1, 64, f.n, 8)[2])
            cr.append(W.pack_d(f, C)[0])
            s = int(rng.choice(f.sels))
            es.append(random_meta(rng, 1, "sorted", tf32)[0]), sels.append(s)
    return (np.stack(imgs), np.array(descs, np.uint64), np.stack(ar), np.stack(cr), np.stack(es),
            np.array(sels, np.int32), np.array(seeds))


# ---------------------------------------------------------------------------------------------
# tf32 with any metadata (--only tf32any): which halves of B an undefined chunk reads


def tf32any_forms():
    return [SpForm("any_tf32_n16", 16, "f32", "tf32", "tf32", True),
            SpForm("any_tf32d_n24", 24, "f32", "tf32", "tf32", False, neg_b=1, swz=("128B", "32B"))]


def tf32any_tiles(f, rng, T=12):
    """Raw float32 A, B, C (every mantissa bit set at random) and any index pairs in every lane."""
    imgs, descs, ar, cr, sels = [], [], [], [], []
    for _ in range(T):
        A = rng.standard_normal((1, 64, f.k // 2)).astype(np.float32).view(np.uint32)
        B = rng.standard_normal((f.k, f.n)).astype(np.float32).view(np.uint32)
        C = rng.standard_normal((1, 64, f.n)).astype(np.float32).view(np.uint32)
        img = np.zeros(IMG, np.uint8)
        da = 0 if f.a_regs else put_a(img, f, A[0], f.swz[0])
        db = put_b(img, f, B, f.swz[1])
        imgs.append(img), descs.append((da, db)), sels.append(int(rng.choice(f.sels)))
        ar.append(a_regs_of(f, A)[0] if f.a_regs else np.zeros((128, 1), np.uint32))
        cr.append(W.pack_d(f, C)[0])
    return (np.stack(imgs), np.array(descs, np.uint64), np.stack(ar), np.stack(cr), random_meta(rng, T, "any"),
            np.array(sels, np.int32))


# ---------------------------------------------------------------------------------------------
# GPU and the capture


class Gpu(W.Gpu):
    def run(self, f, imgs, a_regs, c_regs, e, descs, scale_d, sel):
        cp = self.cp
        T = imgs.shape[0]
        fn = self.mod.get_function(f.name)
        fn.max_dynamic_shared_size_bytes = IMG
        dout = cp.zeros((T, 128, f.nd), cp.uint32)
        info = cp.zeros((T, 5), cp.uint32)
        args = [cp.asarray(np.ascontiguousarray(x)) for x in
                (imgs, a_regs, c_regs, e.astype(np.uint32), descs.astype(np.uint64), scale_d.astype(np.int32),
                 sel.astype(np.int32))]
        fn((T,), (128,), (*args, dout, info), shared_mem=IMG)
        cp.cuda.runtime.deviceSynchronize()
        return cp.asnumpy(dout), cp.asnumpy(info)


class DryGpu:
    def run(self, f, imgs, a_regs, c_regs, e, descs, scale_d, sel):
        return np.zeros((imgs.shape[0], 128, f.nd), np.uint32), np.zeros((imgs.shape[0], 5), np.uint32)


def store(out, f, imgs, descs, a_regs, c_regs, e, sel, scale_d, d_regs, info, **extra):
    """Stored: the unique images (``img``, ``img_index``), or only ``hash_seed`` (hashed images)."""
    if "hash_seed" not in extra:
        used = int(np.max(np.nonzero(imgs.any(0))[0], initial=0)) + 1
        uimg, index = np.unique(imgs[:, :-(-used // 16) * 16], axis=0, return_inverse=True)
        out.update({f.name + ".img": uimg, f.name + ".img_index": index.astype(np.int32).ravel()})
    out.update({f.name + ".spelling": np.array(f.spelling), f.name + ".desc": descs,
                f.name + ".a_regs": a_regs, f.name + ".c_regs": c_regs, f.name + ".e": e, f.name + ".sel": sel,
                f.name + ".scale_d": scale_d, f.name + ".d_regs": d_regs, f.name + ".info": info,
                f.name + ".imm": np.array([f.tnsp_a, f.tnsp_b, f.neg_a, f.neg_b])})
    out.update({f"{f.name}.{k}": v for k, v in extra.items()})


def sanity_mismatches(f, san, d_regs):
    """Mismatches of the ``sanity`` tiles (index, A, B, C, positions) against exact arithmetic."""
    def v(x, t):
        if t == "tf32":
            return x.astype(np.uint32).view(np.float32).astype(np.float64)
        return x.astype({8: np.uint8, 16: np.uint16}[W.BITS[t]]).view(W.NP[t]).astype(np.float64)
    bad = 0
    sa, sb = (-1.0 if f.neg_a else 1.0), (-1.0 if f.neg_b else 1.0)
    dc = W.d_coords(f.n)
    for t, A, B, C, pos in san:
        cf = (C.astype(np.uint32).view(np.float32) if f.d == "f32" else C.astype(np.uint16).view(np.float16))
        exact = sa * sb * np.einsum("mj,mjn->mn", v(A, f.a), v(B[pos], f.b)) + cf.astype(np.float64)
        got = d_regs[t].view(np.float32) if f.d == "f32" else d_regs[t].view(np.float16)
        bad += int(np.sum(got.astype(np.float64) != exact[dc[..., 0], dc[..., 1]]))
    return bad


def capture(gpu, rng, dev, per_class=2, per_swizzle=4):
    out = {}
    for f in layout_forms():
        imgs, descs, ar, e, plane, pat = layout_tiles(f, rng, per_swizzle)
        T = len(plane)
        c = np.zeros((T, 128, f.nd), np.uint32)
        d, info = gpu.run(f, imgs, ar, c, e, descs, np.ones(T, np.int32), np.zeros(T, np.int32))
        vals = d.view(np.float32) if f.d == "f32" else d.view(np.int32)
        ints = vals.astype(np.int64)
        assert np.all(ints == vals) and ints.min() >= 0 and ints.max() < (256 if f.a == "u8" else 1024), f.name
        out.update({f.name + ".spelling": np.array(f.spelling), f.name + ".desc": descs, f.name + ".info": info,
                    f.name + ".d_ints": ints.astype(np.uint8 if f.a == "u8" else np.uint16),
                    f.name + ".plane": plane, f.name + ".pattern": pat,
                    f.name + ".tnsp": np.array([f.tnsp_a, f.tnsp_b])})
        print(f"{f.name:16s} {f.spelling:58s} tiles {T:4d}", flush=True)
    for f in map_forms():
        imgs, descs, ar, e, sel, plane, mode = map_tiles(f, rng)
        T = len(sel)
        c = np.zeros((T, 128, f.nd), np.uint32)
        d, info = gpu.run(f, imgs, ar, c, e, descs, np.ones(T, np.int32), sel)
        store(out, f, imgs, descs, ar, c[:, :, :0], e, sel, np.ones(T, np.int8), d, info, plane=plane, mode=mode)
        print(f"{f.name:16s} {f.spelling:58s} tiles {T:4d}", flush=True)
    for f in numerics_forms():
        imgs, descs, ar, cr, e, sel, cls, classes, san = numerics_tiles(f, rng, per_class if f.n <= 32 else 1)
        T = len(sel)
        scale_d = np.where(cls == 0, 1, rng.random(T) < 0.8).astype(np.int32)
        d, info = gpu.run(f, imgs, ar, cr, e, descs, scale_d, sel)
        extra = {"class": cls, "classes": np.array(classes)}
        bad = sanity_mismatches(f, san, d) if san else None
        if bad is not None:
            extra["sanity_mismatches"] = np.array(bad)
        store(out, f, imgs, descs, ar, cr, e, sel, scale_d.astype(np.int8), d, info, **extra)
        print(f"{f.name:16s} {f.spelling:58s} tiles {T:4d}" + ("" if bad is None else f"  sanity mismatches {bad}"),
              flush=True)
    if not dev:
        for f in rd_forms():
            imgs, descs, ar, cr, e, sel, seeds = rd_tiles(f, rng)
            T = len(sel)
            scale_d = (rng.random(T) < 0.8).astype(np.int32)
            d, info = gpu.run(f, imgs, ar, cr, e, descs, scale_d, sel)
            store(out, f, imgs, descs, ar, cr, e, sel, scale_d.astype(np.int8), d, info, hash_seed=seeds)
            print(f"{f.name:16s} {f.spelling:58s} tiles {T:4d}", flush=True)
    return out


def capture_tf32any(gpu, rng):
    out = {}
    for f in tf32any_forms():
        imgs, descs, ar, cr, e, sel = tf32any_tiles(f, rng)
        T = len(sel)
        scale_d = np.ones(T, np.int32)
        d, info = gpu.run(f, imgs, ar, cr, e, descs, scale_d, sel)
        store(out, f, imgs, descs, ar, cr, e, sel, scale_d.astype(np.int8), d, info)
        print(f"{f.name:16s} {f.spelling:58s} tiles {T:4d}", flush=True)
    return out


def all_forms():
    return layout_forms() + map_forms() + numerics_forms() + rd_forms() + tf32any_forms()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=DEV_SEED)
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--only", choices=("tf32any",), help="only tf32 with any metadata and random B")
    ap.add_argument("--source", help="write the CUDA source here and stop")
    args = ap.parse_args()
    if args.source:
        Path(args.source).write_text(W.source(all_forms()))
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    gpu = DryGpu() if args.dry_run else Gpu(Path("/tmp"), all_forms())
    t = time.time()
    dev = args.seed == DEV_SEED
    data = {"seed": np.array(args.seed), "img_bytes": np.array(IMG), "b_at": np.array(B_AT)}
    if args.only == "tf32any":
        data.update(capture_tf32any(gpu, np.random.default_rng(args.seed)))
        name = f"wgmma_sp_tf32any_sm90_{args.seed}.npz"
    else:
        data.update(capture(gpu, np.random.default_rng(args.seed), dev))
        name = "wgmma_sp_sm90.npz" if dev else f"wgmma_sp_sm90_{args.seed}.npz"
    np.savez_compressed(out / name, **data)
    print(f"done in {time.time() - t:.1f}s; {(out / name).stat().st_size / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
