"""wgmma at register level (sm_90a): shared-memory matrix descriptors of every swizzle mode, A from
registers or a descriptor, transposes, ``imm-scale``, ``scale-d``, N up to 256, every input type.

    python experiments/hardware/wgmma_regs.py --out OUTDIR [--only layout|numerics] [--seed S] [--dry-run]

One 128-thread block (a warpgroup) per tile. Each tile copies its shared-memory image (``IMG``
bytes) into dynamic shared memory, adds the buffer's shared-window address to the start-address
field of the tile's descriptors (given relative to the buffer), preloads D with C and runs one
``wgmma.mma_async`` with ``scale-d`` from the tile (a predicate), then writes D back.

``layout`` (which shared-memory byte feeds which element): random descriptors (start, leading and
stride byte offsets, base offset, each swizzle mode) over an image whose bytes encode their own
offset in the buffer, one "plane" of the offset per tile:
  * u8 (K-major): byte at offset x holds ``(x >> 8 p) & 255``;
  * f16 (K- and MN-major): the 2-byte element at offset 2 g holds the f16 integer ``(g >> 10 p) & 1023``.
The other operand is one-hot, so every D element is one element of the operand under test:
A from registers with ``A[m, k] = (k == m % K)`` gives ``D[m, n] = B[m % K, n]``; B one-hot
(``B[k, n] = (k == n % K)``, K-major, no swizzle, at ``ONEHOT``) gives ``D[m, n] = A[m, n % K]``.
Stored: the D registers as integers (exact; checked here), descriptors as used, planes.

``numerics``: random and adversarial operands (``inputs.py``) for one form per type, laid out at
canonical descriptors (start 1024-aligned, base offset 0) by the CUTLASS/CuTe canonical layouts
(``cute/atom/mma_traits_sm90_gmma.hpp``, ``make_gmma_desc``), with a small-integer sanity class
checked against exact arithmetic here. Stored: registers in and out, the image's used bytes.

Writes ``wgmma_regs_sm90[_SEED].npz``; keys ``<kernel>.<field>``.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import ml_dtypes
import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import inputs as I  # noqa: E402

IMG = 48 * 1024
ONEHOT = 46 * 1024
SWZ = {"none": (0, 1), "128B": (1, 8), "64B": (2, 4), "32B": (3, 2)}  # code, 16-byte units per row
BITS = {"f16": 16, "bf16": 16, "tf32": 32, "e4m3": 8, "e5m2": 8, "s8": 8, "u8": 8, "b1": 1}
KOF = {16: 16, 32: 8, 8: 32, 1: 256}


class Form:
    """One kernel: ``wgmma.mma_async`` ``spelling`` with A from registers (``a_regs``) or a
    descriptor, the immediates ``tnsp_a``, ``tnsp_b``, ``neg_a``, ``neg_b``."""

    def __init__(self, name, n, d, a, b, a_regs, tnsp_a=0, tnsp_b=0, neg_a=0, neg_b=0, sat=False,
                 swz=("none", "none")):
        self.name, self.n, self.d, self.a, self.b = name, n, d, a, b
        self.a_regs, self.tnsp_a, self.tnsp_b, self.neg_a, self.neg_b, self.sat = (
            a_regs, tnsp_a, tnsp_b, neg_a, neg_b, sat)
        self.swz = swz
        self.bits = BITS[a]
        self.k = KOF[self.bits]
        self.nd = n // 2 if d in ("f32", "s32") else n // 4
        self.na = 4 if a_regs else 0

    @property
    def spelling(self):
        sat = ".satfinite" if self.sat else ""
        tail = ".and.popc" if self.a == "b1" else ""
        return f"wgmma.mma_async.sync.aligned.m64n{self.n}k{self.k}{sat}.{self.d}.{self.a}.{self.b}{tail}"

    def immediates(self):
        if self.d == "s32":
            return ""
        imm = f", {-1 if self.neg_a else 1}, {-1 if self.neg_b else 1}"
        if self.a in ("f16", "bf16"):
            imm += ("" if self.a_regs else f", {self.tnsp_a}") + f", {self.tnsp_b}"
        return imm

    def source(self):
        acc = "f" if self.d == "f32" else "r"
        ctype = "float" if self.d == "f32" else "unsigned"
        cin = "__uint_as_float" if self.d == "f32" else ""
        cout = "__float_as_uint" if self.d == "f32" else ""
        nd, na = self.nd, self.na
        dl = ", ".join(f"%{i}" for i in range(nd))
        asrc = "{" + ", ".join(f"%{nd + i}" for i in range(na)) + "}" if na else f"%{nd}"
        bop = f"%{nd + max(na, 1)}"
        pop = f"%{nd + max(na, 1) + 1}"
        outs = ", ".join(f'"+{acc}"(d[{i}])' for i in range(nd))
        ins = ", ".join([f'"r"(a[{i}])' for i in range(na)] or ['"l"(da)']) + ', "l"(db), "r"(sc)'
        return f"""
extern "C" __global__ void __launch_bounds__(128) {self.name}(const unsigned char* img, const unsigned* ain,
        const unsigned* cin, const unsigned long long* desc, const int* scd, unsigned* dout, unsigned* info) {{
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
    if (t == 0) {{
        info[5 * tile] = base; info[5 * tile + 1] = (unsigned)da; info[5 * tile + 2] = (unsigned)(da >> 32);
        info[5 * tile + 3] = (unsigned)db; info[5 * tile + 4] = (unsigned)(db >> 32);
    }}
    unsigned a[{max(na, 1)}]; {ctype} d[{nd}];
    for (int i = 0; i < {na}; i++) a[i] = ain[(tile * 128 + t) * {max(na, 1)} + i];
    for (int i = 0; i < {nd}; i++) d[i] = {cin}(cin[(tile * 128 + t) * {nd} + i]);
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
    asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, {pop}, 0;\\n"
                 "{self.spelling} {{{dl}}}, {asrc}, {bop}, p{self.immediates()};\\n}}\\n"
                 : {outs} : {ins} : "memory");
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
    for (int i = 0; i < {nd}; i++) dout[(tile * 128 + t) * {nd} + i] = {cout}(d[i]);
}}
"""


# ---------------------------------------------------------------------------------------------
# fragments (PTX ISA "Register Fragments" for wgmma; warp w holds rows 16 w .. 16 w + 15)


def a_coords(bits):
    """(128, values) -> (row, k) of the A register fragment of m64nNkK (the mma.sync m16n8kK A
    fragment per warp)."""
    nval = 128 // bits
    out = np.zeros((128, nval, 2), np.int64)
    for t in range(128):
        w, lane = divmod(t, 32)
        g, q = lane >> 2, lane & 3
        for v in range(nval):
            if bits == 16:
                row, col = g + 8 * ((v >> 1) & 1), 2 * q + (v & 1) + 8 * (v >> 2)
            elif bits == 8:
                row, col = g + 8 * ((v >> 2) & 1), 4 * q + (v & 3) + 16 * (v >> 3)
            elif bits == 32:
                row, col = g + 8 * (v & 1), q + 4 * (v >> 1)
            else:  # b1: m16n8k256 A
                row, col = g + 8 * ((v >> 5) & 1), 32 * q + (v & 31) + 128 * (v >> 6)
            out[t, v] = (16 * w + row, col)
    return out


def d_coords(n):
    """(128, n // 2) -> (row, col) of the D fragment of m64nN (CuTe ``CLayout_64xN``)."""
    out = np.zeros((128, n // 2, 2), np.int64)
    for t in range(128):
        w, lane = divmod(t, 32)
        g, q = lane >> 2, lane & 3
        for i in range(n // 2):
            out[t, i] = (16 * w + g + 8 * ((i >> 1) & 1), 2 * q + (i & 1) + 8 * (i >> 2))
    return out


# ---------------------------------------------------------------------------------------------
# descriptors and the canonical layouts (CuTe make_gmma_desc), for placing operands


def encode(start, lbo, sbo, swz="none", base=0):
    return ((start >> 4) & 0x3FFF) | (((lbo >> 4) & 0x3FFF) << 16) | (((sbo >> 4) & 0x3FFF) << 32) | (
        (base & 7) << 49) | (SWZ[swz][0] << 62)


def canonical_offsets(rows, kbytes, swz, lbo, sbo, mn_major, bits):
    """Byte offsets (rows, kbytes // (bits/8)) of a canonical layout, before the swizzle; element
    (r, k) of an operand with ``rows`` M/N rows. K-major: 8 x 16-byte core matrices, rows at
    16 W bytes, 8-row groups at SBO, 16-byte K chunks at LBO (no swizzle) or 16; MN-major (16-bit
    only): K rows at 16 W, 16-byte MN chunks inside a 16 W-byte row, W-chunk groups at LBO, 8-K
    groups at SBO (no swizzle: MN chunks at SBO, 8-K groups at LBO)."""
    W = SWZ[swz][1]
    eb = max(bits // 8, 1)
    r = np.arange(rows)[:, None]
    kb = (np.arange(kbytes // eb) * eb)[None, :]
    if not mn_major:
        j, w = kb // 16, kb % 16
        kstep = lbo if swz == "none" else 16
        return (r % 8) * 16 * W + (r // 8) * sbo + j * kstep + w
    k = kb // eb
    rb = r * eb
    j, w = rb // 16, rb % 16
    if swz == "none":
        return (k % 8) * 16 + j * sbo + (k // 8) * lbo + w
    return (k % 8) * 16 * W + (j % W) * 16 + (j // W) * lbo + (k // 8) * sbo + w


def swizzle(addr, swz):
    W = SWZ[swz][1]
    return addr ^ (((addr >> 7) & (W - 1)) << 4)


def place(img, start, bits_mat, swz, lbo, sbo, mn_major, bits):
    """Write the (rows, K) element bit patterns ``bits_mat`` (K-major operand order: row = M or N
    index) into ``img`` at a canonical descriptor starting at ``start`` (1024-aligned)."""
    rows, K = bits_mat.shape
    eb = max(bits // 8, 1)
    if bits == 1:  # 8 elements a byte, element 0 in the least significant bit
        v = bits_mat.reshape(rows, K // 8, 8).astype(np.uint32)
        bytes_ = np.sum(v << np.arange(8, dtype=np.uint32), -1).astype(np.uint8)
        off = canonical_offsets(rows, K // 8, swz, lbo, sbo, mn_major, 8)
        img[swizzle(start + off, swz)] = bytes_
        return
    off = canonical_offsets(rows, K * eb, swz, lbo, sbo, mn_major, bits)
    for j in range(eb):
        img[swizzle(start + off + j, swz)] = ((bits_mat.astype(np.uint64) >> np.uint64(8 * j)) & np.uint64(255)).astype(np.uint8)


def canonical(rows, swz, mn_major, bits):
    """(LBO, SBO) of a dense canonical tile of ``rows`` M/N rows and 32 bytes of K."""
    W = SWZ[swz][1]
    if not mn_major:  # no swizzle: the two K chunks of 8 rows are 128 bytes apart
        return (128, 256) if swz == "none" else (16, 128 * W)
    if swz == "none":  # MN chunks of 8 K rows, 128 bytes each, then the second 8-K group
        return 128 * (rows * bits // 128), 128
    per_atom = 16 * W * 8  # bytes of one W-chunk x 8-K atom
    return per_atom * 2, per_atom  # next W chunks of MN after both 8-K groups


# ---------------------------------------------------------------------------------------------
# layout capture


def rand_desc(rng, rows, mn_major, swz, kgroups, base_none=False, span=64):
    """A random descriptor (relative start, lbo, sbo, swz, base offset) whose reads stay below
    ONEHOT - 2048 under any swizzle phase; ``base_none``: base offsets without swizzle too."""
    while True:
        start = int(rng.integers(0, 512)) * 16
        if rng.random() < 0.3:
            start = int(rng.integers(0, 8)) * 1024
        lbo = int(rng.integers(0, span)) * 16
        sbo = int(rng.integers(0, span)) * 16
        base = int(rng.integers(0, 8)) if ((swz != "none" or base_none) and rng.random() < 0.5) else 0
        groups = rows // 8 if not mn_major else rows // 8
        top = start + groups * max(lbo, sbo, 128 * SWZ[swz][1]) + kgroups * max(lbo, sbo) + 2048
        if top < ONEHOT - 2048:
            return start, lbo, sbo, swz, base


def plane_image(fmt, p):
    x = np.arange(IMG)
    if fmt == "u8":
        return ((x >> (8 * p)) & 255).astype(np.uint8)
    g = np.arange(IMG // 2)
    vals = ((g >> (10 * p)) & 1023).astype(np.float16)
    return vals.view(np.uint8)


def onehot_b(img, fmt, n):
    """B[k, n] = (k == n % K), K-major, no swizzle, LBO 128, SBO 256, at ONEHOT."""
    K = 32 if fmt == "u8" else 16
    one = 1 if fmt == "u8" else 0x3C00
    B = np.zeros((n, K), np.uint32)  # K-major operand order: row = n
    B[np.arange(n), np.arange(n) % K] = one
    place(img, ONEHOT, B, "none", 128, 256, False, 8 if fmt == "u8" else 16)
    return encode(ONEHOT, 128, 256)


def layout_forms():
    u8, f16 = ("s32", "u8", "u8"), ("f32", "f16", "f16")
    return [Form("lay_u8_b64", 64, *u8, True), Form("lay_u8_b256", 256, *u8, True),
            Form("lay_u8_a", 32, *u8, False),
            Form("lay_f16_b64_t0", 64, *f16, True), Form("lay_f16_b64_t1", 64, *f16, True, tnsp_b=1),
            Form("lay_f16_b256_t1", 256, *f16, True, tnsp_b=1),
            Form("lay_f16_a_t0", 16, *f16, False), Form("lay_f16_a_t1", 16, *f16, False, tnsp_a=1)]


def run_layout(gpu, rng, per_swizzle=8, base_none=False):
    out = {}
    for f in layout_forms():
        fmt = f.a
        on_a = not f.a_regs
        mn = f.tnsp_a if on_a else f.tnsp_b
        rows = 64 if on_a else f.n
        kgroups = 2 if mn else 1
        descs, planes, imgs = [], [], []
        for swz in SWZ:
            for _ in range(per_swizzle):
                start, lbo, sbo, s, base = rand_desc(rng, rows, mn, swz, kgroups, base_none)
                d = encode(start, lbo, sbo, s, base)
                for p in (0, 1):
                    img = plane_image(fmt, p)
                    other = onehot_b(img, fmt, f.n) if on_a else 0
                    descs.append((d, other) if on_a else (0, d))
                    planes.append(p)
                    imgs.append(img)
        T = len(imgs)
        a_regs = np.zeros((T, 128, max(f.na, 1)), np.uint32)
        if f.a_regs:
            ac = a_coords(f.bits)
            A = (ac[..., 1] == ac[..., 0] % f.k).astype(np.uint32) * (1 if fmt == "u8" else 0x3C00)
            a_regs[:] = I.pack_slots(A[None], f.bits, f.na)
        c_regs = np.zeros((T, 128, f.nd), np.uint32)
        d_regs, info = gpu.run(f, np.stack(imgs), a_regs, c_regs, np.array(descs, np.uint64), np.ones(T, np.int32))
        vals = d_regs.view(np.float32) if f.d == "f32" else d_regs.view(np.int32)
        ints = vals.astype(np.int64)
        assert np.all(ints == vals) and ints.min() >= 0 and ints.max() < (256 if fmt == "u8" else 1024), f.name
        out[f.name + ".spelling"] = np.array(f.spelling)
        out[f.name + ".d_ints"] = ints.astype(np.uint8 if fmt == "u8" else np.uint16)
        out[f.name + ".plane"] = np.array(planes, np.int8)
        out[f.name + ".info"] = info
        out[f.name + ".tnsp"] = np.array([f.tnsp_a, f.tnsp_b])
        print(f"{f.name:18s} {f.spelling:56s} tiles {T}", flush=True)
    return out


# ---------------------------------------------------------------------------------------------
# numerics capture


def numerics_forms():
    return [
        Form("num_f16_n64", 64, "f32", "f16", "f16", True, swz=("none", "128B")),
        Form("num_f16h_n24", 24, "f16", "f16", "f16", False, tnsp_a=1, tnsp_b=1, neg_a=1, swz=("64B", "32B")),
        Form("num_f16_n32", 32, "f32", "f16", "f16", False, swz=("none", "none")),
        Form("num_bf16_n40", 40, "f32", "bf16", "bf16", False, tnsp_b=1, neg_b=1, swz=("none", "128B")),
        Form("num_tf32_n24", 24, "f32", "tf32", "tf32", True, neg_a=1, neg_b=1, swz=("none", "128B")),
        Form("num_e4m3_n56", 56, "f32", "e4m3", "e4m3", True, swz=("none", "128B")),
        Form("num_e4e5h_n40", 40, "f16", "e4m3", "e5m2", False, swz=("64B", "none")),
        Form("num_e5e4_n8", 8, "f32", "e5m2", "e4m3", False, neg_a=1, swz=("128B", "32B")),
        Form("num_e5h_n88", 88, "f16", "e5m2", "e5m2", True, swz=("none", "64B")),
        Form("num_s8_n96", 96, "s32", "s8", "s8", True, swz=("none", "128B")),
        Form("num_u8s8sat_n48", 48, "s32", "u8", "s8", False, sat=True, swz=("none", "none")),
        Form("num_s8u8sat_n256", 256, "s32", "s8", "u8", True, sat=True, swz=("none", "64B")),
        Form("num_b1_n80", 80, "s32", "b1", "b1", True, swz=("none", "128B")),
    ]


def operands(f, rng, per_class):
    """(classes, A (T,64,K), B (T,K,N), C (T,64,N) bit patterns / ints)."""
    if f.d == "s32":
        classes = I.INT_CLASSES
        if f.a == "b1":
            parts = [I.int_operands(c, rng, "b1", per_class, 64, f.n, f.k) for c in classes]
            parts = [(a, b, c // 1024 if cl == "random" else c) for (a, b, c), cl in zip(parts, classes)]
        else:
            parts = []
            for c in classes:
                a, _, cc = I.int_operands(c, rng, f.a, per_class, 64, f.n, f.k)
                _, b, _ = I.int_operands(c, rng, f.b, per_class, 64, f.n, f.k)
                parts.append((a, b, cc))
        mask = {"s8": 255, "u8": 255, "b1": 1}
        A, B, C = (np.concatenate(x) for x in zip(*parts))
        return classes, (A & mask[f.a]).astype(np.uint32), (B & mask[f.b]).astype(np.uint32), C.view(np.uint32)
    classes = ("sanity",) + I.FLOAT_CLASSES
    fab = f.a if f.a == f.b else (f.a, f.b)
    parts = []
    for cl in classes:
        if cl == "sanity":
            a = I.from_float(rng.integers(-3, 4, (per_class, 64, f.k)).astype(np.float64), f.a)
            b = I.from_float(rng.integers(-3, 4, (per_class, f.k, f.n)).astype(np.float64), f.b)
            c = I.from_float(rng.integers(-8, 9, (per_class, 64, f.n)).astype(np.float64), f.d)
            parts.append((a, b, c))
        else:
            parts.append(I.float_operands(cl, rng, fab, f.d, per_class, 64, f.n, f.k))
    A, B, C = (np.concatenate(x).astype(np.uint32) for x in zip(*parts))
    return classes, A, B, C


NP = {"f16": np.float16, "bf16": ml_dtypes.bfloat16, "e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}


def sanity_mismatches(f, A, B, C, d_regs, s):
    """Mismatches of the sanity tiles ``s`` against exact arithmetic (float forms)."""
    def val(x, t):
        if t == "tf32":
            return x.astype(np.uint32).view(np.float32).astype(np.float64)
        return x.astype({8: np.uint8, 16: np.uint16}[BITS[t]]).view(NP[t]).astype(np.float64)
    sa = -1.0 if f.neg_a else 1.0
    sb = -1.0 if f.neg_b else 1.0
    cf = C[s].view(np.float32).astype(np.float64) if f.d == "f32" else C[s].astype(np.uint16).view(np.float16).astype(np.float64)
    exact = sa * sb * (val(A[s], f.a) @ val(B[s], f.b)) + cf
    dc = d_coords(f.n)
    want = exact[:, dc[..., 0], dc[..., 1]]
    got = d_regs[s].view(np.float32) if f.d == "f32" else d_regs[s].view(np.float16).reshape(len(s), 128, -1)
    return int(np.sum(got.astype(np.float64) != want))


def pack_d(f, vals):
    dc = d_coords(f.n)
    v = vals[:, dc[..., 0], dc[..., 1]]
    return I.pack_slots(v, 16 if f.d == "f16" else 32, f.nd)


def run_numerics(gpu, rng, per_class=1):
    out = {}
    for f in numerics_forms():
        pc = per_class if f.n <= 32 else 1
        classes, A, B, C = operands(f, rng, pc)
        T = A.shape[0]
        scale_d = (rng.random(T) < 0.8).astype(np.int32)
        imgs = np.zeros((T, IMG), np.uint8)
        descs = np.zeros((T, 2), np.uint64)
        sa, sb = f.swz
        la, sa_ = canonical(64, sa, f.tnsp_a, f.bits)
        lb, sb_ = canonical(f.n, sb, f.tnsp_b, f.bits)
        for t in range(T):
            if not f.a_regs:
                place(imgs[t], 0, A[t], sa, la, sa_, f.tnsp_a, f.bits)
                descs[t, 0] = encode(0, la, sa_, sa)
            place(imgs[t], 16384, B[t].T, sb, lb, sb_, f.tnsp_b, f.bits)
            descs[t, 1] = encode(16384, lb, sb_, sb)
        a_regs = np.zeros((T, 128, max(f.na, 1)), np.uint32)
        if f.a_regs:
            ac = a_coords(f.bits)
            a_regs = I.pack_slots(A[:, ac[..., 0], ac[..., 1]], f.bits, f.na)
        c_regs = pack_d(f, C)
        d_regs, info = gpu.run(f, imgs, a_regs, c_regs, descs, scale_d)
        used = int(np.max(np.nonzero(imgs.any(0))[0], initial=0)) + 1
        bad = None
        if f.d != "s32":
            s = np.nonzero((np.repeat(np.arange(len(classes)), pc) == 0) & (scale_d == 1))[0]
            bad = sanity_mismatches(f, A, B, C, d_regs, s)
        print(f"{f.name:18s} {f.spelling:60s} tiles {T:3d} image {used} B"
              + ("" if bad is None else f"  sanity mismatches {bad}"), flush=True)
        out.update({f.name + ".spelling": np.array(f.spelling), f.name + ".img": imgs[:, :-(-used // 16) * 16],
                    f.name + ".a_regs": a_regs, f.name + ".c_regs": c_regs, f.name + ".d_regs": d_regs,
                    f.name + ".scale_d": scale_d, f.name + ".info": info,
                    f.name + ".imm": np.array([f.tnsp_a, f.tnsp_b, f.neg_a, f.neg_b]),
                    f.name + ".class": np.repeat(np.arange(len(classes)), pc).astype(np.int8),
                    f.name + ".classes": np.array(classes)})
        if bad is not None:
            out[f.name + ".sanity_mismatches"] = np.array(bad)
    return out


# ---------------------------------------------------------------------------------------------
# random descriptors over a hashed image (held-out captures): every type through the layout rule


def rd_forms():
    return [Form("rd_bf16_n24", 24, "f32", "bf16", "bf16", False, tnsp_a=1),
            Form("rd_f16h_n72", 72, "f16", "f16", "f16", False, tnsp_a=1, tnsp_b=1, neg_b=1),
            Form("rd_tf32_n16", 16, "f32", "tf32", "tf32", False, neg_a=1),
            Form("rd_e4m3h_n104", 104, "f16", "e4m3", "e4m3", False),
            Form("rd_e5e4_n32", 32, "f32", "e5m2", "e4m3", True),
            Form("rd_s8u8_n48", 48, "s32", "s8", "u8", False),
            Form("rd_b1_n24", 24, "s32", "b1", "b1", False)]


# bit of each element cleared so that hashed bytes are finite values (the exponent's top bit)
FINITE = {"f16": 1 << 14, "bf16": 1 << 14, "tf32": 1 << 30, "e4m3": 1 << 6, "e5m2": 1 << 6}


def hashed_image(seed, fmt):
    """Byte x = the top byte of (x * 0x9E3779B1 + seed) mod 2**32, with bit FINITE of every
    ``fmt`` element cleared (little-endian elements at multiples of their size)."""
    x = np.arange(IMG, dtype=np.uint64)
    img = (((x * np.uint64(0x9E3779B1) + np.uint64(seed)) & np.uint64(0xFFFFFFFF)) >> np.uint64(24)).astype(np.uint8)
    if fmt in FINITE:
        eb, b = BITS[fmt] // 8, FINITE[fmt].bit_length() - 1
        img[b // 8::eb] &= np.uint8(255 ^ (1 << (b % 8)))
    return img


def run_random_descriptors(gpu, rng, per_swizzle=2):
    out = {}
    for f in rd_forms():
        descs, seeds = [], []
        for swz in SWZ:
            for _ in range(per_swizzle):
                a = rand_desc(rng, 64, f.tnsp_a, swz, 2, True, 32)
                b = rand_desc(rng, f.n, f.tnsp_b, SWZ_LIST[int(rng.integers(0, 4))], 2, True, 32)
                descs.append((encode(*a) if not f.a_regs else 0, encode(*b)))
                seeds.append(int(rng.integers(0, 2 ** 31)))
        T = len(descs)
        fa = f.a if f.a == f.b else f.a  # the image holds A's format; B of another 8-bit type reads the same bytes
        imgs = np.stack([hashed_image(sd, fa) for sd in seeds])
        a_regs = np.zeros((T, 128, max(f.na, 1)), np.uint32)
        if f.a_regs:
            ac = a_coords(f.bits)
            A, _, _ = I.float_operands("normal", rng, f.a, f.d, T, 64, 8, f.k)
            a_regs = I.pack_slots(A[:, ac[..., 0], ac[..., 1]], f.bits, f.na)
        C = (rng.integers(-100, 100, (T, 64, f.n)).astype(np.int32).view(np.uint32) if f.d == "s32"
             else I.float_operands("normal", rng, f.a, f.d, T, 64, f.n, f.k)[2])
        c_regs = pack_d(f, C)
        scale_d = (rng.random(T) < 0.8).astype(np.int32)
        d_regs, info = gpu.run(f, imgs, a_regs, c_regs, np.array(descs, np.uint64), scale_d)
        print(f"{f.name:18s} {f.spelling:60s} tiles {T:3d}", flush=True)
        out.update({f.name + ".spelling": np.array(f.spelling), f.name + ".hash_seed": np.array(seeds),
                    f.name + ".a_regs": a_regs, f.name + ".c_regs": c_regs, f.name + ".d_regs": d_regs,
                    f.name + ".scale_d": scale_d, f.name + ".info": info,
                    f.name + ".imm": np.array([f.tnsp_a, f.tnsp_b, f.neg_a, f.neg_b])})
    return out


SWZ_LIST = list(SWZ)


# ---------------------------------------------------------------------------------------------
# GPU


def source(forms):
    return "\n".join(["#include <cuda_fp16.h>"] + [f.source() for f in forms])


class Gpu:
    def __init__(self, build: Path, forms):
        import cupy as cp

        self.cp = cp
        src = build / "wgmma_regs.cu"
        src.write_text(source(forms))
        cubin = build / "wgmma_regs.cubin"
        t = time.time()
        subprocess.run(["nvcc", "-cubin", "-gencode", "arch=compute_90a,code=sm_90a", "-o", str(cubin), str(src)],
                       check=True)
        print(f"compiled {len(forms)} kernels in {time.time() - t:.1f}s", flush=True)
        self.mod = cp.RawModule(path=str(cubin))

    def run(self, f, imgs, a_regs, c_regs, descs, scale_d):
        cp = self.cp
        T = imgs.shape[0]
        fn = self.mod.get_function(f.name)
        fn.max_dynamic_shared_size_bytes = IMG
        dout = cp.zeros((T, 128, f.nd), cp.uint32)
        info = cp.zeros((T, 5), cp.uint32)
        args = [cp.asarray(x) for x in (imgs, a_regs, c_regs, descs.astype(np.uint64), scale_d.astype(np.int32))]
        fn((T,), (128,), (*args, dout, info), shared_mem=IMG)
        cp.cuda.runtime.deviceSynchronize()
        return cp.asnumpy(dout), cp.asnumpy(info)


class DryGpu:
    def run(self, f, imgs, a_regs, c_regs, descs, scale_d):
        return np.zeros((imgs.shape[0], 128, f.nd), np.uint32), np.zeros((imgs.shape[0], 5), np.uint32)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", choices=("layout", "numerics", "descriptors"))
    ap.add_argument("--seed", type=int, default=20261128)
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--source", help="write the CUDA source here and stop")
    args = ap.parse_args()
    forms = layout_forms() + numerics_forms() + rd_forms()
    if args.source:
        Path(args.source).write_text(source(forms))
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    gpu = DryGpu() if args.dry_run else Gpu(Path("/tmp"), forms)
    rng = np.random.default_rng(args.seed)
    t = time.time()
    data = {"seed": np.array(args.seed), "img_bytes": np.array(IMG), "onehot": np.array(ONEHOT)}
    dev = args.seed == 20261128  # the development capture: as the layout rule was designed on
    if args.only in (None, "layout"):
        data.update(run_layout(gpu, rng, base_none=not dev))
    if args.only in (None, "numerics"):
        data.update(run_numerics(gpu, rng))
    if args.only in (None, "descriptors") and not dev:
        data.update(run_random_descriptors(gpu, rng))
    name = "wgmma_regs_sm90.npz" if args.seed == 20261128 else f"wgmma_regs_sm90_{args.seed}.npz"
    np.savez_compressed(out / name, **data)
    print(f"done in {time.time() - t:.1f}s; {(out / name).stat().st_size / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
