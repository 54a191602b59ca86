"""Parsers of the MMAs beside ``wmma.mma`` that also yield a :class:`~tcemu._src.isa.instructions.Mma`:
``mma.sync`` (PTX ISA 9.7.14.5.14: its shapes per family, and sm_120's ``.kind::f8f6f4`` and
block-scaled ``.kind::mxf8f6f4`` / ``mxf4`` / ``mxf4nvf4``), ``wgmma.mma_async`` (dense, value
level) and ``tcgen05.mma`` (sm_100a, value level: its types and M, N are bound later from the
operands by :meth:`~tcemu._src.isa.instructions.Tcgen05.bind`).
"""
from __future__ import annotations

import re

from tcemu._src.isa import wmma_spec as S
from tcemu._src.isa.instructions import (BLACKWELL_KINDS, F8F6F4, LAYOUTS, MMA_SYNC_FORMS, ROUNDINGS, SCALE_TYPES,
                                         TCGEN05_KINDS, TYPES, Mma, Tcgen05, Unsupported, WgmmaSync)
from tcemu._src.isa.qualifiers import SCALE_VECS, Quals, check_sync, mnk, parse_scale_vec, split


def parse_mma_sync(spelling: str) -> Mma:
    s, toks = split(spelling, "mma")
    op = None
    if len(toks) >= 2 and toks[-1] == "popc" and toks[-2] in S.B1_OPS:
        op, toks = toks[-2], toks[:-2]
    shapes = tuple(sorted({sh for v in MMA_SYNC_FORMS.values() for sh in v}))
    q = Quals(s, toks, {"sync": ("sync",), "aligned": ("aligned",), "layout": LAYOUTS,
                        "shape": shapes, "rnd": ROUNDINGS, "sat": ("satfinite",),
                        "kind": tuple("kind::" + k for k in BLACKWELL_KINDS), "block_scale": ("block_scale",),
                        "scale_vec": SCALE_VECS, "type": TYPES + F8F6F4[2:] + SCALE_TYPES}, True)
    check_sync(s, q)
    shape = q.one(s, "shape")
    lays = q.found["layout"]
    if len(lays) != 2:
        raise ValueError(f"{spelling!r}: mma.sync needs .alayout.blayout (e.g. .row.col)")
    types = q.found["type"]
    kind = q.one(s, "kind", required=False)
    if kind is not None:
        return _blackwell_mma_sync(s, q, shape, lays, kind[len("kind::"):], types)
    if q.found["block_scale"] or q.found["scale_vec"]:
        raise ValueError(f"{spelling!r}: .block_scale and .scale_vec need a block-scaled .kind "
                         "(.kind::mxf8f6f4, .kind::mxf4, .kind::mxf4nvf4)")
    if len(types) != 4:
        raise ValueError(f"{spelling!r}: mma.sync needs four types .dtype.atype.btype.ctype, got {types}")
    d, a, b, c = types
    if {a, b} & set(F8F6F4[2:] + SCALE_TYPES):
        raise ValueError(f"{spelling!r}: .e3m2/.e2m3/.e2m1 operands need .kind::f8f6f4 (or a block-scaled "
                         "kind), e.g. mma.sync.aligned.m16n8k32.row.col.kind::f8f6f4.f32.e2m1.e2m1.f32")
    if a in ("e4m3", "e5m2") and b in ("e4m3", "e5m2"):
        fam = "fp8"
        ok = d in ("f16", "f32") and c == d
    elif {a, b} <= {"s8", "u8"}:
        fam, ok = "int8", d == c == "s32"
    elif {a, b} <= {"s4", "u4"}:
        fam, ok = "int4", d == c == "s32"
    elif a == b == "b1":
        fam, ok = "b1", d == c == "s32"
    elif a == b == "f16":
        fam, ok = "f16", d in ("f16", "f32") and c in ("f16", "f32")
    elif a == b and a in ("bf16", "tf32", "f64"):
        fam = a
        ok = d == c == ("f64" if a == "f64" else "f32")
    else:
        fam, ok = None, False
    if not ok:
        raise ValueError(f"{spelling!r}: .{'.'.join(types)} is not a valid mma.sync type combination")
    if shape not in MMA_SYNC_FORMS[fam]:
        raise ValueError(f"{spelling!r}: .{shape} is not valid for {fam} mma.sync; valid: "
                         f"{', '.join('.' + v for v in MMA_SYNC_FORMS[fam])}")
    if fam != "f16" or shape != "m8n8k4":
        if tuple(lays) != ("row", "col"):
            raise ValueError(f"{spelling!r}: only .m8n8k4 .f16 mma.sync takes layouts other than .row.col")
    sat = bool(q.found["sat"])
    if sat and fam not in ("int8", "int4"):
        raise ValueError(f"{spelling!r}: .satfinite is only valid for integer mma.sync here")
    rnd = q.one(s, "rnd", required=False)
    if rnd and fam != "f64":
        raise ValueError(f"{spelling!r}: rounding qualifiers are only valid for .f64 mma.sync")
    if (fam == "b1") != (op is not None):
        raise ValueError(f"{spelling!r}: single-bit mma.sync needs a trailing .xor.popc or .and.popc")
    m, n, k = mnk(shape)
    return Mma(s, "mma", shape, m, n, k, d, a, b, c, lays[0], lays[1], sat,
               rnd or ("rn" if fam == "f64" else None), op)


def _blackwell_mma_sync(s: str, q: Quals, shape: str, lays, kind: str, types) -> Mma:
    """``mma.sync`` with ``.kind::f8f6f4`` or a block-scaled kind (sm_120a, PTX ISA 8.7+)."""
    k_want, vecs = BLACKWELL_KINDS[kind]
    want = f"m16n8k{k_want}"
    if shape != want:
        raise ValueError(f"{s!r}: .kind::{kind} mma.sync has shape .{want}, not .{shape}")
    if tuple(lays) != ("row", "col"):
        raise ValueError(f"{s!r}: .kind::{kind} mma.sync must be .row.col")
    if q.found["sat"] or q.found["rnd"]:
        raise ValueError(f"{s!r}: .kind::{kind} mma.sync takes no .satfinite or rounding qualifier")
    elems = F8F6F4 if kind in ("f8f6f4", "mxf8f6f4") else ("e2m1",)
    if not vecs:
        if q.found["block_scale"] or q.found["scale_vec"]:
            raise ValueError(f"{s!r}: .kind::f8f6f4 is not block-scaled (use .kind::mxf8f6f4 for block scaling)")
        if len(types) != 4:
            raise ValueError(f"{s!r}: .kind::f8f6f4 needs four types .dtype.atype.btype.ctype, got {types}")
        d, a, b, c = types
        if d not in ("f32", "f16") or c != d or a not in elems or b not in elems:
            raise ValueError(f"{s!r}: .{'.'.join(types)} is not valid for .kind::f8f6f4; valid: .dtype.atype.btype.ctype "
                             f"with dtype = ctype in {{f32, f16}} and atype, btype in {{{', '.join(elems)}}}")
        m, n, k = mnk(shape)
        return Mma(s, "mma", shape, m, n, k, d, a, b, c, "row", "col", ptx_kind=kind)
    if not q.found["block_scale"]:
        raise ValueError(f"{s!r}: .kind::{kind} needs .block_scale")
    nvec = parse_scale_vec(s, kind, vecs, q.one(s, "scale_vec", required=False))
    if len(types) != 5:
        raise ValueError(f"{s!r}: .kind::{kind} needs five types .f32.atype.btype.f32.stype, got {types}")
    d, a, b, c, st = types
    if d != "f32" or c != "f32" or a not in elems or b not in elems or st not in vecs[nvec]:
        raise ValueError(f"{s!r}: .{'.'.join(types)} is not valid for .kind::{kind}.scale_vec::{nvec}X; valid: "
                         f".f32.atype.btype.f32.stype with atype, btype in {{{', '.join(elems)}}} and stype in "
                         f"{{{', '.join(vecs[nvec])}}}")
    m, n, k = mnk(shape)
    return Mma(s, "mma", shape, m, n, k, d, a, b, c, "row", "col", ptx_kind=kind, stype=st, scale_vec=nvec)


# wgmma.mma_async N: 8..256 step 8 for floating-point inputs; 8, 16, 24 and multiples of 16 for
# integer and single-bit inputs (PTX ISA 9.7.15.5.2; ptxas 13.0 rejects m64n40k32.s32.s8.s8)
WGMMA_K = {"f16": 16, "bf16": 16, "tf32": 8, "e4m3": 32, "e5m2": 32, "s8": 32, "u8": 32, "b1": 256}
WGMMA_INT_N = (8, 16, 24) + tuple(range(32, 257, 16))


def parse_wgmma(spelling: str) -> Mma:
    """Dense ``wgmma.mma_async.sync.aligned.m64nNkK[.satfinite].dtype.atype.btype[.and.popc]``."""
    s, toks = split(spelling, "wgmma.mma_async")
    if toks[:1] == ["sp"]:
        raise ValueError(f"{spelling!r}: a sparse wgmma: parse it with tcemu._src.isa.sparse.parse_wgmma_sp")
    op = None
    if len(toks) >= 2 and toks[-2:] == ["and", "popc"]:
        op, toks = "and", toks[:-2]
    q = Quals(s, [t for t in toks if not re.fullmatch(r"m64n\d+k\d+", t)],
              {"sync": ("sync",), "aligned": ("aligned",), "sat": ("satfinite",), "type": TYPES})
    check_sync(s, q)
    shapes = [t for t in toks if re.fullmatch(r"m64n\d+k\d+", t)]
    if len(shapes) != 1:
        raise ValueError(f"{spelling!r}: wgmma needs one .m64nNkK shape")
    m, n, k = mnk(shapes[0])
    types = q.found["type"]
    if len(types) != 3:
        raise ValueError(f"{spelling!r}: wgmma needs .dtype.atype.btype")
    d, a, b = types
    fp8, ints = ("e4m3", "e5m2"), ("s8", "u8")
    if a not in WGMMA_K or not ((a in fp8 and b in fp8) or (a in ints and b in ints) or (a == b and a not in fp8 + ints)):
        raise ValueError(f"{spelling!r}: unsupported wgmma types .{d}.{a}.{b}; valid atype/btype: f16, bf16, "
                         "tf32, e4m3/e5m2 (any mix), s8/u8 (any mix), b1")
    integer = a in ints or a == "b1"
    valid_n = WGMMA_INT_N if integer else tuple(range(8, 257, 8))
    if k != WGMMA_K[a] or n not in valid_n:
        raise ValueError(f"{spelling!r}: .m64n{n}k{k} is not a wgmma shape for .{a} (K = {WGMMA_K[a]}, N = "
                         + ("8, 16, 24 or a multiple of 16 up to 256)" if integer else "8..256 step 8)"))
    want_d = ("s32",) if integer else ("f32",) if a in ("bf16", "tf32") else ("f32", "f16")
    if d not in want_d:
        raise ValueError(f"{spelling!r}: .{d} accumulators are not valid with .{a}; valid: {', '.join(want_d)}")
    if (a == "b1") != (op is not None):
        raise ValueError(f"{spelling!r}: .b1 wgmma needs .and.popc after the types, and only .b1 takes it")
    sat = bool(q.found["sat"])
    if sat and a not in ints:
        raise ValueError(f"{spelling!r}: .satfinite is valid only with .s8/.u8 inputs")
    return Mma(s, "wgmma", shapes[0], m, n, k, d, a, b, d, satfinite=sat, op=op)


WGMMA_SYNC = ("fence", "commit_group", "wait_group")


def parse_wgmma_sync(spelling: str) -> WgmmaSync:
    """``wgmma.fence.sync.aligned``, ``wgmma.commit_group.sync.aligned``,
    ``wgmma.wait_group.sync.aligned`` (ordering only)."""
    s, toks = split(spelling, "wgmma")
    if not toks or toks[0] not in WGMMA_SYNC:
        raise ValueError(f"{spelling!r}: unsupported wgmma instruction; valid: wgmma.mma_async, "
                         + ", ".join(f"wgmma.{o}" for o in WGMMA_SYNC))
    q = Quals(s, toks[1:], {"sync": ("sync",), "aligned": ("aligned",)})
    if not q.found["sync"] or not q.found["aligned"]:
        raise ValueError(f"{spelling!r}: wgmma.{toks[0]} needs .sync.aligned")
    return WgmmaSync(s, toks[0])


def parse_tcgen05(spelling: str) -> Tcgen05:
    """``tcgen05.mma.cta_group::1.kind::X`` (value level; block-scaled kinds take
    ``.block_scale.scale_vec::NX``)."""
    s, toks = split(spelling, "tcgen05.mma")
    q = Quals(s, toks, {"cta_group": ("cta_group::1", "cta_group::2"),
                        "kind": tuple("kind::" + k for k in TCGEN05_KINDS), "block_scale": ("block_scale",),
                        "scale_vec": SCALE_VECS + ("block16", "block32")})
    if q.one(s, "cta_group") != "cta_group::1":
        raise Unsupported(f"{spelling!r}: only .cta_group::1 is emulated (a pair of CTAs computes the same "
                          "numbers on twice the M)")
    kind = q.one(s, "kind")[len("kind::"):]
    if kind in ("tf32", "f16", "f8f6f4"):
        if q.found["block_scale"] or q.found["scale_vec"]:
            raise ValueError(f"{spelling!r}: .kind::{kind} is not block-scaled")
        return Tcgen05(s, kind)
    if not q.found["block_scale"]:
        raise ValueError(f"{spelling!r}: .kind::{kind} needs .block_scale")
    vecs = BLACKWELL_KINDS[kind][1]
    k = TCGEN05_KINDS[kind][0]
    vec = q.one(s, "scale_vec", required=False)
    if vec in ("block16", "block32"):  # PTX ISA 8.8 aliases: the number of elements per scale factor
        vec = f"scale_vec::{k // int(vec[5:])}X"
    nvec = parse_scale_vec(s, kind, vecs, vec)
    return Tcgen05(s, kind, vecs[nvec], nvec)
