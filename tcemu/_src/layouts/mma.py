"""Fragment layouts of ``mma.sync``, as data (linear-layout bases, see ``fragment.py``).

Unlike wmma, these are specified by the PTX ISA, section 9.7.14.5.x "Matrix Fragments for
mma.m16n8k*" / "mma.m8n8k*": with ``groupID = laneid >> 2`` and
``threadID_in_group = laneid % 4``, e.g. for m16n8k16 .f16 A: ``row = groupID (+ 8 for a2, a3,
a6, a7)``, ``col = threadID_in_group * 2 + (i & 1) (+ 8 for i >= 4)``. Lane bits 0-1 are
threadID_in_group, bits 2-4 groupID; value bits are the element index ``i`` of the PTX figures.
The same operand layouts underlie ldmatrix (x4 of 8x8 b16 tiles) and the sm_75+ wmma fragments
measured on the H200 (e.g. wmma m16n16k16 .bf16 A equals mma m16n8k16 A on each 16x8 half).

Keys: (shape, matrix, element bits) for A and B; ("mMnN", "c", bits) for C/D.
"""
from __future__ import annotations

_ROWS = ((1, 0), (2, 0), (4, 0))  # groupID bits -> rows (A, C) ...
_COLS = ((0, 1), (0, 2), (0, 4))  # ... or columns (B)


def _a(t0, t1, values):
    return ((0, t0), (0, t1)) + _ROWS, values


def _b(t0, t1, values):
    return ((t0, 0), (t1, 0)) + _COLS, values


MMA = {
    # 16-bit A/B (f16, bf16)
    ("m16n8k16", "a", 16): _a(2, 4, ((0, 1), (8, 0), (0, 8))),
    ("m16n8k16", "b", 16): _b(2, 4, ((1, 0), (8, 0))),
    ("m16n8k8", "a", 16): _a(2, 4, ((0, 1), (8, 0))),
    ("m16n8k8", "b", 16): _b(2, 4, ((1, 0),)),
    # tf32
    ("m16n8k8", "a", 32): _a(1, 2, ((8, 0), (0, 4))),
    ("m16n8k8", "b", 32): _b(1, 2, ((4, 0),)),
    ("m16n8k4", "a", 32): _a(1, 2, ((8, 0),)),
    ("m16n8k4", "b", 32): _b(1, 2, ()),
    # 8-bit A/B (s8, u8, e4m3, e5m2)
    ("m16n8k32", "a", 8): _a(4, 8, ((0, 1), (0, 2), (8, 0), (0, 16))),
    ("m16n8k32", "b", 8): _b(4, 8, ((1, 0), (2, 0), (16, 0))),
    ("m16n8k16", "a", 8): _a(4, 8, ((0, 1), (0, 2), (8, 0))),
    ("m16n8k16", "b", 8): _b(4, 8, ((1, 0), (2, 0))),
    ("m8n8k16", "a", 8): _a(4, 8, ((0, 1), (0, 2))),
    ("m8n8k16", "b", 8): _b(4, 8, ((1, 0), (2, 0))),
    # 4-bit A/B (s4, u4)
    ("m8n8k32", "a", 4): _a(8, 16, ((0, 1), (0, 2), (0, 4))),
    ("m8n8k32", "b", 4): _b(8, 16, ((1, 0), (2, 0), (4, 0))),
    ("m16n8k32", "a", 4): _a(8, 16, ((0, 1), (0, 2), (0, 4), (8, 0))),
    ("m16n8k32", "b", 4): _b(8, 16, ((1, 0), (2, 0), (4, 0))),
    ("m16n8k64", "a", 4): _a(8, 16, ((0, 1), (0, 2), (0, 4), (8, 0), (0, 32))),
    ("m16n8k64", "b", 4): _b(8, 16, ((1, 0), (2, 0), (4, 0), (32, 0))),
    # 1-bit A/B (b1)
    ("m8n8k128", "a", 1): _a(32, 64, ((0, 1), (0, 2), (0, 4), (0, 8), (0, 16))),
    ("m8n8k128", "b", 1): _b(32, 64, ((1, 0), (2, 0), (4, 0), (8, 0), (16, 0))),
    ("m16n8k128", "a", 1): _a(32, 64, ((0, 1), (0, 2), (0, 4), (0, 8), (0, 16), (8, 0))),
    ("m16n8k128", "b", 1): _b(32, 64, ((1, 0), (2, 0), (4, 0), (8, 0), (16, 0))),
    ("m16n8k256", "a", 1): _a(32, 64, ((0, 1), (0, 2), (0, 4), (0, 8), (0, 16), (8, 0), (0, 128))),
    ("m16n8k256", "b", 1): _b(32, 64, ((1, 0), (2, 0), (4, 0), (8, 0), (16, 0), (128, 0))),
    # f64
    ("m8n8k4", "a", 64): _a(1, 2, ()),
    ("m8n8k4", "b", 64): _b(1, 2, ()),
    # f64 m16n8kK (sm_90): the tf32 layouts with 64-bit elements (CUTLASS cute/atom/mma_traits_sm90.hpp
    # SM90_16x8x{4,8,16}_F64F64F64F64_TN; measured on the H100, tests/data/mma_sync_f64_sm90.npz)
    ("m16n8k4", "a", 64): _a(1, 2, ((8, 0),)),
    ("m16n8k4", "b", 64): _b(1, 2, ()),
    ("m16n8k8", "a", 64): _a(1, 2, ((8, 0), (0, 4))),
    ("m16n8k8", "b", 64): _b(1, 2, ((4, 0),)),
    ("m16n8k16", "a", 64): _a(1, 2, ((8, 0), (0, 4), (0, 8))),
    ("m16n8k16", "b", 64): _b(1, 2, ((4, 0), (8, 0))),
    # C / D
    ("m16n8", "c", 32): _a(2, 4, ((0, 1), (8, 0))),
    ("m16n8", "c", 16): _a(2, 4, ((0, 1), (8, 0))),
    ("m8n8", "c", 32): _a(2, 4, ((0, 1),)),
    ("m8n8", "c", 64): _a(2, 4, ((0, 1),)),
    ("m16n8", "c", 64): _a(2, 4, ((0, 1), (8, 0))),
}

# mma.sync.m8n8k4 .f16 (Volta HMMA.884): the warp runs four independent 8x8x4 MMAs, one per quad
# pair (lanes 4o..4o+3 and 4o+16..4o+19). Stacked here as one matrix per operand: A (32 x 4) and
# C/D (32 x 8) hold computation o in rows 8o..8o+7, B (4 x 32) in columns 8o..8o+7. PTX ISA
# "Matrix Fragments for mma.m8n8k4 with .f16": with t = laneid % 4 and hi = laneid >= 16,
# A.row (t + 4hi, i), A.col (i + 4hi, t), B.row (t, i + 4hi), B.col (i, t + 4hi),
# C f16 (t + 4hi, i), C f32 ((l & 1) + (i & 2) + 4hi, (i & 4) + (l & 2) + (i & 1)).
QUAD_PAIR = {
    ("a", "row"): (((1, 0), (2, 0), (8, 0), (16, 0), (4, 0)), ((0, 1), (0, 2))),
    ("a", "col"): (((0, 1), (0, 2), (8, 0), (16, 0), (4, 0)), ((1, 0), (2, 0))),
    ("b", "row"): (((1, 0), (2, 0), (0, 8), (0, 16), (0, 4)), ((0, 1), (0, 2))),
    ("b", "col"): (((0, 1), (0, 2), (0, 8), (0, 16), (0, 4)), ((1, 0), (2, 0))),
    ("c", "f16"): (((1, 0), (2, 0), (8, 0), (16, 0), (4, 0)), ((0, 1), (0, 2), (0, 4))),
    ("c", "f32"): (((1, 0), (0, 2), (8, 0), (16, 0), (4, 0)), ((0, 1), (2, 0), (0, 4))),
}

# ldmatrix / stmatrix, in *stored* coordinates: row R = 8 * matrix + row of that matrix (whose
# address lane R supplies), column = element within the 16-byte row.
# m8n8 .b16 (PTX ISA Figure 107 and the ldmatrix figure; H200-verified, tests/data/ldstmatrix_sm90):
# lane l holds row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1 (low, high half); .trans stores the
# same registers transposed. Register i holds matrix i.
# m16n8 .trans .b8 (stmatrix, sm_100a): from CUTLASS cute/atom/copy_traits_sm100.hpp,
# Copy_Traits<SM100_U8x4_STSM_T>: byte j of lane l's register is element (l / 4 + 8 (j >> 1),
# 2 (l % 4) + (j & 1)) of the 16 x 8 matrix, stored transposed as 8 rows of 16 bytes.
# (Not measured here: the H200 is sm_90.)
MATRIX_MOVE = {
    ("m8n8", False): (((0, 2), (0, 4), (1, 0), (2, 0), (4, 0)), ((0, 1),)),
    ("m8n8", True): (((2, 0), (4, 0), (0, 1), (0, 2), (0, 4)), ((1, 0),)),
    ("m16n8", True): (((2, 0), (4, 0), (0, 1), (0, 2), (0, 4)), ((1, 0), (0, 8))),
}
