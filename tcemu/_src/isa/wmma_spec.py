"""PTX ISA facts for the wmma instructions (PTX ISA section 9.7.14.4), as plain data.

The hardware capture harness reads these tables too. ``ELEMENT_BITS`` (register bits of each
element type) is :data:`tcemu._src.formats.ELEMENT_BITS`.

* ``SHAPES``: (M, N, K) of each ``.shape``.
* ``LOAD_TYPES``: the element types each matrix (a, b, c) may have per shape.
* ``FRAGMENT_REGS``: 32-bit registers per thread of each fragment (section 9.7.14.4.1).
  A ``.f64`` element takes two consecutive registers, low word first.
* ``default_stride``: the "Default value for stride" table of section 9.7.14.4.2.
* ``MMA_FORMS``: every ``wmma.mma`` type signature (d, a, b, c) per shape.
"""
from __future__ import annotations

from tcemu._src.formats import ELEMENT_BITS  # noqa: F401 (the harness reads it here)

SHAPES: dict[str, tuple[int, int, int]] = {
    "m16n16k16": (16, 16, 16),
    "m32n8k16": (32, 8, 16),
    "m8n32k16": (8, 32, 16),
    "m16n16k8": (16, 16, 8),
    "m8n8k4": (8, 8, 4),
    "m8n8k32": (8, 8, 32),
    "m8n8k128": (8, 8, 128),
}


_HALF = ("m16n16k16", "m32n8k16", "m8n32k16")

LOAD_TYPES: dict[str, dict[str, tuple[str, ...]]] = {
    **{s: {"a": ("f16", "bf16", "s8", "u8"), "b": ("f16", "bf16", "s8", "u8"),
           "c": ("f16", "f32", "s32")} for s in _HALF},
    "m16n16k8": {"a": ("tf32",), "b": ("tf32",), "c": ("f32",)},
    "m8n8k4": {"a": ("f64",), "b": ("f64",), "c": ("f64",)},
    "m8n8k32": {"a": ("s4", "u4"), "b": ("s4", "u4"), "c": ("s32",)},
    "m8n8k128": {"a": ("b1",), "b": ("b1",), "c": ("s32",)},
}

# Sub-byte and single-bit multiplicands: A must be .row and B must be .col.
FIXED_LAYOUT: dict[tuple[str, str], str] = {
    (s, m): lay for s in ("m8n8k32", "m8n8k128") for m, lay in (("a", "row"), ("b", "col"))
}

FRAGMENT_REGS: dict[tuple[str, str, str], int] = {}
for _s, _a, _b in (("m16n16k16", 8, 8), ("m32n8k16", 8, 8), ("m8n32k16", 8, 8)):
    FRAGMENT_REGS[(_s, "a", "f16")] = _a
    FRAGMENT_REGS[(_s, "b", "f16")] = _b
    FRAGMENT_REGS[(_s, "c", "f16")] = 4
    FRAGMENT_REGS[(_s, "c", "f32")] = 8
    FRAGMENT_REGS[(_s, "c", "s32")] = 8
for _s, _bf_a, _bf_b, _i_a, _i_b in (("m16n16k16", 4, 4, 2, 2), ("m32n8k16", 8, 2, 4, 1),
                                     ("m8n32k16", 2, 8, 1, 4)):
    FRAGMENT_REGS[(_s, "a", "bf16")] = _bf_a
    FRAGMENT_REGS[(_s, "b", "bf16")] = _bf_b
    for _t in ("s8", "u8"):
        FRAGMENT_REGS[(_s, "a", _t)] = _i_a
        FRAGMENT_REGS[(_s, "b", _t)] = _i_b
FRAGMENT_REGS.update({
    ("m16n16k8", "a", "tf32"): 4, ("m16n16k8", "b", "tf32"): 4, ("m16n16k8", "c", "f32"): 8,
    ("m8n8k4", "a", "f64"): 2, ("m8n8k4", "b", "f64"): 2, ("m8n8k4", "c", "f64"): 4,
    ("m8n8k32", "a", "s4"): 1, ("m8n8k32", "a", "u4"): 1,
    ("m8n8k32", "b", "s4"): 1, ("m8n8k32", "b", "u4"): 1, ("m8n8k32", "c", "s32"): 2,
    ("m8n8k128", "a", "b1"): 1, ("m8n8k128", "b", "b1"): 1, ("m8n8k128", "c", "s32"): 2,
})

# Oldest architecture (sm_XX as an int) that has the element type in wmma (Target ISA Notes).
MIN_SM_FOR_TYPE: dict[str, int] = {
    "f16": 70, "f32": 70, "s8": 72, "u8": 72, "s32": 72, "s4": 75, "u4": 75, "b1": 75,
    "bf16": 80, "tf32": 80, "f64": 80,
}
# the shapes of sub-byte / single-bit wmma (s32 C of them too) and of tf32 / f64 wmma
MIN_SM_FOR_SHAPE: dict[str, int] = {"m8n8k32": 75, "m8n8k128": 75, "m16n16k8": 80, "m8n8k4": 80}


def matrix_dims(shape: str, matrix: str) -> tuple[int, int]:
    """(rows, cols) of matrix ``a`` (M x K), ``b`` (K x N) or ``c``/``d`` (M x N)."""
    m, n, k = SHAPES[shape]
    return {"a": (m, k), "b": (k, n), "c": (m, n), "d": (m, n)}[matrix]


def default_stride(shape: str, matrix: str, layout: str) -> int:
    """Leading-dimension size in elements: columns for .row, rows for .col."""
    rows, cols = matrix_dims(shape, matrix)
    return cols if layout == "row" else rows


def fragment_bytes(shape: str, matrix: str, etype: str) -> int:
    """Per-thread fragment size in bytes; rows/columns must start at a multiple of it."""
    return 4 * FRAGMENT_REGS[(shape, "c" if matrix == "d" else matrix, etype)]


# wmma.mma type signatures: (dtype, atype, btype, ctype) per family.
MMA_F16_SHAPES = _HALF
MMA_F16_DC = (("f16", "f16"), ("f16", "f32"), ("f32", "f16"), ("f32", "f32"))
MMA_INT_TYPES = ("s8", "u8")
MMA_SUBBYTE_TYPES = ("s4", "u4")
F64_ROUNDINGS = ("rn", "rz", "rm", "rp")
B1_OPS = ("xor", "and")


def load_forms() -> list[tuple[str, str, str, str]]:
    """Every (matrix, layout, shape, type) that ``wmma.load`` accepts.

    >>> len(load_forms()), load_forms()[0]
    (88, ('a', 'row', 'm16n16k16', 'f16'))
    """
    return [(mat, lay, shape, et) for shape, mats in LOAD_TYPES.items() for mat, types in mats.items()
            for et in types for lay in ("row", "col") if FIXED_LAYOUT.get((shape, mat), lay) == lay]


def store_forms() -> list[tuple[str, str, str]]:
    """Every (layout, shape, type) that ``wmma.store.d`` accepts (the types of C)."""
    return [(lay, shape, et) for shape, mats in LOAD_TYPES.items() for et in mats["c"] for lay in ("row", "col")]

