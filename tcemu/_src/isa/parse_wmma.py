"""Parsers of the wmma family: ``wmma.load``, ``wmma.store`` and ``wmma.mma``,
each checking its shape, layouts and element types against the tables of
:mod:`tcemu._src.isa.wmma_spec` (which types each matrix of each shape takes, the fixed layouts of
sub-byte and single-bit fragments, the shapes of every ``wmma.mma`` type combination).
"""
from __future__ import annotations

from tcemu._src.isa import wmma_spec as S
from tcemu._src.isa.instructions import LAYOUTS, ROUNDINGS, SPACES, TYPES, Mma, WmmaLoad, WmmaStore
from tcemu._src.isa.qualifiers import Quals, check_sync, split


def _memory_quals(s, toks) -> Quals:
    """The qualifiers of ``wmma.load`` / ``wmma.store`` after the matrix, checked for ``.sync``."""
    q = Quals(s, toks, {"sync": ("sync",), "aligned": ("aligned",), "layout": LAYOUTS,
                        "shape": tuple(S.SHAPES), "space": SPACES, "type": TYPES}, True)
    check_sync(s, q)
    return q


def parse_wmma_load(spelling: str) -> WmmaLoad:
    s, toks = split(spelling, "wmma.load")
    if not toks or toks[0] not in ("a", "b", "c"):
        raise ValueError(f"{spelling!r}: wmma.load needs the matrix qualifier .a, .b or .c first")
    matrix = toks[0]
    q = _memory_quals(s, toks[1:])
    layout, shape, etype = q.one(s, "layout"), q.one(s, "shape"), q.one(s, "type")
    space = q.one(s, "space", required=False)
    valid = S.LOAD_TYPES[shape][matrix]
    if etype not in valid:
        raise ValueError(f"{spelling!r}: .{etype} is not a valid type for matrix {matrix} of .{shape}; "
                         f"valid: {', '.join('.' + t for t in valid)}")
    fixed = S.FIXED_LAYOUT.get((shape, matrix))
    if fixed and layout != fixed:
        raise ValueError(f"{spelling!r}: sub-byte and single-bit {matrix.upper()} must be .{fixed} "
                         f"(PTX: A is .row and B is .col for .{shape})")
    return WmmaLoad(s, matrix, layout, shape, etype, space)


def parse_wmma_store(spelling: str) -> WmmaStore:
    s, toks = split(spelling, "wmma.store")
    if not toks or toks[0] != "d":
        raise ValueError(f"{spelling!r}: wmma.store needs the matrix qualifier .d first")
    q = _memory_quals(s, toks[1:])
    layout, shape, etype = q.one(s, "layout"), q.one(s, "shape"), q.one(s, "type")
    valid = S.LOAD_TYPES[shape]["c"]
    if etype not in valid:
        raise ValueError(f"{spelling!r}: .{etype} is not a valid D type for .{shape}; "
                         f"valid: {', '.join('.' + t for t in valid)}")
    return WmmaStore(s, layout, shape, etype, q.one(s, "space", required=False))


def _types_error(spelling, types, forms):
    raise ValueError(f"{spelling!r}: type qualifiers {'.'.join([''] + list(types))} are not a valid "
                     f"combination; valid (dtype.atype.btype.ctype): {'; '.join(forms)}")


def parse_wmma_mma(spelling: str) -> Mma:
    s, toks = split(spelling, "wmma.mma")
    op = None
    if len(toks) >= 2 and toks[0] in S.B1_OPS and toks[1] == "popc":
        op, toks = toks[0], toks[2:]
    q = Quals(s, toks, {"sync": ("sync",), "aligned": ("aligned",), "layout": LAYOUTS,
                        "shape": tuple(S.SHAPES), "rnd": ROUNDINGS, "sat": ("satfinite",),
                        "type": TYPES}, True)
    check_sync(s, q)
    lays = q.found["layout"]
    if len(lays) != 2:
        raise ValueError(f"{spelling!r}: wmma.mma needs two layout qualifiers (.alayout.blayout), got {len(lays)}")
    shape = q.one(s, "shape")
    types = q.found["type"]
    sat = bool(q.found["sat"])
    rnd = q.one(s, "rnd", required=False)
    forms = ["f16 shapes: .dtype.ctype in {f16,f32}", ".f32.bf16.bf16.f32", ".f32.tf32.tf32.f32 (m16n16k8)",
             ".f64.f64.f64.f64 (m8n8k4)", ".s32.{s8|u8}.{same}.s32", ".s32.{s4|u4}.{same}.s32 (m8n8k32)",
             ".s32.b1.b1.s32 with .xor.popc/.and.popc (m8n8k128)"]
    if len(types) == 2 and all(t in ("f16", "f32") for t in types):
        d, c = types
        a = b = "f16"
    elif len(types) == 4:
        d, a, b, c = types
    else:
        _types_error(s, types, forms)
    valid_shapes = None
    if a == b == "f16" and d in ("f16", "f32") and c in ("f16", "f32"):
        valid_shapes = S.MMA_F16_SHAPES
    elif (d, a, b, c) == ("f32", "bf16", "bf16", "f32"):
        valid_shapes = S.MMA_F16_SHAPES
    elif (d, a, b, c) == ("f32", "tf32", "tf32", "f32"):
        valid_shapes = ("m16n16k8",)
    elif (d, a, b, c) == ("f64",) * 4:
        valid_shapes = ("m8n8k4",)
    elif d == c == "s32" and a == b and a in S.MMA_INT_TYPES:
        valid_shapes = S.MMA_F16_SHAPES
    elif d == c == "s32" and a == b and a in S.MMA_SUBBYTE_TYPES:
        valid_shapes = ("m8n8k32",)
    elif (d, a, b, c) == ("s32", "b1", "b1", "s32"):
        valid_shapes = ("m8n8k128",)
    else:
        _types_error(s, types, forms)
    if shape not in valid_shapes:
        raise ValueError(f"{spelling!r}: .{shape} is not valid for these types; valid: "
                         f"{', '.join('.' + v for v in valid_shapes)}")
    if sat and a not in S.MMA_INT_TYPES + S.MMA_SUBBYTE_TYPES:
        raise ValueError(f"{spelling!r}: .satfinite is only valid for integer wmma.mma "
                         "(floating-point .satfinite was removed in PTX ISA 6.5)")
    if rnd and a != "f64":
        raise ValueError(f"{spelling!r}: .{rnd} is only valid for .f64 wmma.mma")
    if (a == "b1") != (op is not None):
        raise ValueError(f"{spelling!r}: single-bit wmma.mma needs .xor.popc or .and.popc "
                         "right after wmma.mma, and only single-bit takes it")
    if a in S.MMA_SUBBYTE_TYPES + ("b1",) and tuple(lays) != ("row", "col"):
        raise ValueError(f"{spelling!r}: sub-byte and single-bit wmma.mma must be .row.col")
    m, n, k = S.SHAPES[shape]
    return Mma(s, "wmma", shape, m, n, k, d, a, b, c, lays[0], lays[1], sat, rnd or ("rn" if a == "f64" else None), op)
