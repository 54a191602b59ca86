"""PTX spellings -> validated instruction descriptions (the frozen dataclasses of
:mod:`tcemu._src.isa.instructions`, re-exported here with their tables).

Qualifiers after the opcode may come in any order, as ptxas accepts them (the PTX ISA itself
writes both ``wmma.load.a.sync.aligned.row.m16n16k16.f16`` and ``...m16n16k16.row.f16``);
types are read in the order PTX defines (d, a, b, c). ``.aligned`` may be omitted (implicit
before PTX ISA 6.3) and state-space qualifiers ``.global``, ``.shared``, ``.shared::cta``
parse. Anything else raises :class:`ValueError` naming the valid choices.

    >>> from tcemu._src.isa.parse import parse
    >>> parse("wmma.load.a.sync.aligned.row.m16n16k16.f16").etype
    'f16'
"""
from __future__ import annotations

from tcemu._src.isa.instructions import (
    BLACKWELL_KINDS, F8F6F4, FLOAT_TYPES, INT_TYPES, LAYOUTS, MMA_SYNC_FORMS,
    ROUNDINGS, SCALE_TYPES, SPACES, TCGEN05_KINDS, TYPES, MatrixMove, Mma, Tcgen05, Unsupported, WmmaLoad,
    WgmmaSync, WmmaStore)
from tcemu._src.isa.parse_mma import parse_mma_sync, parse_tcgen05, parse_wgmma, parse_wgmma_sync
from tcemu._src.isa.parse_wmma import parse_wmma_load, parse_wmma_mma, parse_wmma_store
from tcemu._src.isa.sparse import SparseMma, parse_mma_sp, parse_wgmma_sp
from tcemu._src.isa.qualifiers import Quals, check_sync, clean, split

# the instruction descriptions and tables are re-exported: importers take them from isa.parse
__all__ = ["BLACKWELL_KINDS", "F8F6F4", "FLOAT_TYPES", "INT_TYPES", "LAYOUTS", "MMA_SYNC_FORMS",
           "ROUNDINGS", "SCALE_TYPES", "SPACES", "SparseMma", "TCGEN05_KINDS", "TYPES", "MatrixMove", "Mma",
           "Tcgen05", "Unsupported", "WgmmaSync", "WmmaLoad", "WmmaStore", "parse", "parse_matrix_move", "parse_mma_sync",
           "parse_mma_sp", "parse_tcgen05", "parse_wgmma", "parse_wgmma_sp", "parse_wmma_load", "parse_wmma_mma", "parse_wmma_store"]


def parse(spelling: str):
    """Parse any supported PTX spelling into its instruction description."""
    s = clean(spelling)
    parsers = (("wmma.load", parse_wmma_load), ("wmma.store", parse_wmma_store),
               ("wmma.mma", parse_wmma_mma), ("wgmma.mma_async", parse_wgmma), ("wgmma", parse_wgmma_sync), ("tcgen05.mma", parse_tcgen05),
               ("mma", parse_mma_sync), ("ldmatrix", parse_matrix_move), ("stmatrix", parse_matrix_move))
    if s.startswith("mma.sp"):  # mma.sp and mma.sp::ordered_metadata
        return parse_mma_sp(s)
    if s.startswith("wgmma.mma_async.sp."):
        return parse_wgmma_sp(s)
    for prefix, fn in parsers:
        if s.startswith(prefix + "."):
            return fn(s)
    hint = ""
    if any(s == prefix for prefix, _ in parsers):
        hint = f" ({s} needs its qualifiers, e.g. .sync.aligned and a shape)"
    elif s != s.lower() and any(s.lower().startswith(prefix + ".") for prefix, _ in parsers):
        hint = f" (PTX is case-sensitive: did you mean {s.lower()!r}?)"
    raise ValueError(f"unsupported instruction {spelling!r}{hint}; supported: wmma.load, wmma.store, "
                     "wmma.mma, mma.sync, mma.sp, ldmatrix, stmatrix, wgmma.mma_async (with wgmma.fence, "
                     "commit_group, wait_group) and tcgen05.mma (value level)")


# ldmatrix / stmatrix (PTX ISA 9.7.14.5.15 / 9.7.14.5.16)


def parse_matrix_move(spelling: str) -> MatrixMove:
    op = "ld" if clean(spelling).startswith("ldmatrix") else "st"
    s, toks = split(spelling, "ldmatrix" if op == "ld" else "stmatrix")
    shapes = ("m8n8", "m16n16", "m8n16") if op == "ld" else ("m8n8", "m16n8")
    rest = ".".join(toks)
    fmt = None
    for f in ("b8x16.b6x16_p32", "b8x16.b4x16_p64"):
        if rest.endswith("." + f) and op == "ld":
            fmt, toks = f, rest[: -len(f) - 1].split(".")
    q = Quals(s, toks, {"sync": ("sync",), "aligned": ("aligned",), "shape": shapes,
                        "num": ("x1", "x2", "x4"), "trans": ("trans",), "space": SPACES,
                        "type": ("b16", "b8")}, True)
    check_sync(s, q)
    shape, num = q.one(s, "shape"), q.one(s, "num")
    etype = fmt or q.one(s, "type")
    trans = bool(q.found["trans"])
    if shape == "m8n8" and etype != "b16":
        raise ValueError(f"{spelling!r}: .m8n8 takes .b16 only")
    if shape == "m16n8" and etype != "b8":
        raise ValueError(f"{spelling!r}: .m16n8 is valid only with .b8")
    if shape in ("m16n8", "m16n16") and not trans:
        raise ValueError(f"{spelling!r}: .trans is mandatory for .{shape}")
    if shape == "m8n16" and (trans or fmt is None):
        raise ValueError(f"{spelling!r}: .m8n16 needs .b8x16.b6x16_p32 or .b8x16.b4x16_p64 and no .trans")
    if shape == "m16n16" and num == "x4":
        raise ValueError(f"{spelling!r}: .m16n16 takes only .x1 or .x2")
    if shape == "m16n16" and etype not in ("b8", "b8x16.b6x16_p32", "b8x16.b4x16_p64"):
        raise ValueError(f"{spelling!r}: .m16n16 takes .b8 or the .b8x16 formats")
    return MatrixMove(s, op, shape, int(num[1]), trans, etype, q.one(s, "space", required=False))
