"""PTX spellings -> validated instruction descriptions (frozen dataclasses).

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

import dataclasses
import difflib
import re

from tcemu._src.isa import wmma_spec as S


class Unsupported(NotImplementedError, ValueError):
    """An instruction tcemu parses but does not emulate at the level asked for; also a
    ValueError, so code that catches bad input catches it."""

LAYOUTS = ("row", "col")
SPACES = ("global", "shared", "shared::cta")
FLOAT_TYPES = ("f16", "bf16", "tf32", "f32", "f64", "e4m3", "e5m2")
INT_TYPES = ("s8", "u8", "s4", "u4", "b1", "s32")
TYPES = FLOAT_TYPES + INT_TYPES
F8F6F4 = ("e4m3", "e5m2", "e3m2", "e2m3", "e2m1")  # element types of the Blackwell .kind::f8f6f4
SCALE_TYPES = ("ue8m0", "ue4m3")
# Blackwell MMA kinds: (K of mma.sync m16n8kK, valid .scale_vec with their scale types). The
# block-scale block is K / scale_vec: 32 elements for 1X of k32 and 2X of k64, 16 for 4X.
BLACKWELL_KINDS = {
    "f8f6f4": (32, {}),
    "mxf8f6f4": (32, {1: ("ue8m0",)}),
    "mxf4": (64, {2: ("ue8m0",)}),
    "mxf4nvf4": (64, {2: ("ue8m0",), 4: ("ue8m0", "ue4m3")}),
}
ROUNDINGS = ("rn", "rz", "rm", "rp")
# fp6/fp4 of .kind::f8f6f4 sit in 8-bit containers (packed fp4 of .kind::mxf4* is 4 bits)
ELEMENT_BITS = {**S.ELEMENT_BITS, "e4m3": 8, "e5m2": 8, "e3m2": 8, "e2m3": 8, "e2m1": 8}


@dataclasses.dataclass(frozen=True)
class WmmaLoad:
    spelling: str
    matrix: str  # "a" | "b" | "c"
    layout: str
    shape: str
    etype: str
    space: str | None

    @property
    def nregs(self) -> int:
        return S.FRAGMENT_REGS[(self.shape, self.matrix, self.etype)]


@dataclasses.dataclass(frozen=True)
class WmmaStore:
    spelling: str
    layout: str
    shape: str
    etype: str
    space: str | None
    matrix: str = "d"

    @property
    def nregs(self) -> int:
        return S.FRAGMENT_REGS[(self.shape, "c", self.etype)]


@dataclasses.dataclass(frozen=True)
class Mma:
    """Any MMA: ``wmma.mma``, ``mma.sync`` or ``wgmma.mma_async`` (``kind`` says which)."""

    spelling: str
    kind: str  # "wmma" | "mma" | "wgmma"
    shape: str
    m: int
    n: int
    k: int
    dtype: str
    atype: str
    btype: str
    ctype: str
    alayout: str = "row"
    blayout: str = "col"
    satfinite: bool = False
    rnd: str | None = None  # f64 rounding (.rn default)
    op: str | None = None  # "xor" | "and" for b1
    ptx_kind: str | None = None  # Blackwell .kind::X (f8f6f4, mxf8f6f4, mxf4, mxf4nvf4, f16, tf32)
    stype: str | None = None  # block-scale factor type (ue8m0, ue4m3)
    scale_vec: int | None = None  # scale factors per row of A / column of B per instruction

    @property
    def scale_block(self) -> int | None:
        """Elements of K that share one scale factor (32 or 16), ``None`` without block scaling."""
        return None if self.scale_vec is None else self.k // self.scale_vec

    @property
    def family(self) -> str:
        """Numerics family of the inputs: f16, bf16, tf32, fp8, f64, int, b1, and the Blackwell
        kinds f8f6f4, mxf8f6f4 and mxf4 (``kind::mxf4`` and ``kind::mxf4nvf4``)."""
        if self.ptx_kind in ("f8f6f4", "mxf8f6f4"):
            return self.ptx_kind
        if self.ptx_kind in ("mxf4", "mxf4nvf4"):
            return "mxf4"
        if self.atype in ("e4m3", "e5m2"):
            return "fp8"
        if self.atype in ("s8", "u8", "s4", "u4"):
            return "int"
        return self.atype


def _close(tok, choices):
    if tok.lower() in choices:
        return f" (qualifiers are lower case: .{tok.lower()})"
    m = [c for c in difflib.get_close_matches(tok, choices, n=3) if c != tok]
    return f" (did you mean {', '.join('.' + c for c in m)}?)" if m else ""


def _clean(spelling) -> str:
    """The spelling without surrounding whitespace and a trailing ``;``; rejects non-strings,
    empty spellings and whitespace inside."""
    if not isinstance(spelling, str):
        raise TypeError(f"a PTX spelling must be a string, got {spelling!r} ({type(spelling).__name__})")
    s = spelling.strip().rstrip(";").rstrip()
    if not s:
        raise ValueError(f"empty PTX spelling {spelling!r}; expected e.g. "
                         "'wmma.load.a.sync.aligned.row.m16n16k16.f16'")
    ws = re.search(r"\s", s)
    if ws:
        raise ValueError(f"{spelling!r}: whitespace inside the spelling (after {s[:ws.start()]!r}); "
                         "write the instruction as one dotted word")
    return s


def _split(spelling: str, prefix: str):
    s = _clean(spelling)
    if not s.startswith(prefix + "."):
        raise ValueError(f"{spelling!r} does not start with {prefix!r}")
    return s, s[len(prefix) + 1:].split(".")


class _Quals:
    """Sorts qualifier tokens into categories, rejecting unknown and repeated ones."""

    def __init__(self, spelling, tokens, categories: dict[str, tuple[str, ...]], shapes_re=None):
        self.found: dict[str, list[str]] = {c: [] for c in categories}
        valid = [v for vs in categories.values() for v in vs]
        for tok in tokens:
            if not tok:
                raise ValueError(f"{spelling!r}: empty qualifier (two dots in a row, or a trailing dot?)")
            for cat, vals in categories.items():
                if tok in vals:
                    self.found[cat].append(tok)
                    break
            else:
                if shapes_re and re.fullmatch(r"m\d+n\d+k\d+", tok):
                    raise ValueError(f"{spelling!r}: shape .{tok} is not valid here; valid shapes: "
                                     f"{', '.join('.' + v for v in categories['shape'])}")
                shown = f".{tok}" if tok.isascii() and tok.isprintable() else repr("." + tok)
                raise ValueError(f"{spelling!r}: unknown qualifier {shown}{_close(tok, valid)}; valid "
                                 f"qualifiers: {', '.join('.' + v for v in valid)}")

    def one(self, spelling, cat, *, required=True, multi_ok=False):
        vals = self.found[cat]
        if len(vals) > 1 and not multi_ok:
            raise ValueError(f"{spelling!r}: more than one {cat} qualifier: {', '.join(vals)}")
        if not vals:
            if required:
                raise ValueError(f"{spelling!r}: missing the {cat} qualifier")
            return None
        return vals[0]


def _common(spelling, q):
    if not q.found["sync"]:
        raise ValueError(f"{spelling!r}: the mandatory .sync qualifier is missing")
    for cat in ("sync", "aligned"):
        if len(q.found[cat]) > 1:
            raise ValueError(f"{spelling!r}: .{cat} given twice")


def parse_wmma_load(spelling: str) -> WmmaLoad:
    s, toks = _split(spelling, "wmma.load")
    if not toks or toks[0] not in ("a", "b", "c"):
        raise ValueError(f"{spelling!r}: wmma.load needs the matrix qualifier .a, .b or .c first")
    matrix = toks[0]
    q = _Quals(s, toks[1:], {"sync": ("sync",), "aligned": ("aligned",), "layout": LAYOUTS,
                             "shape": tuple(S.SHAPES), "space": SPACES, "type": TYPES}, True)
    _common(s, q)
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
    s, toks = _split(spelling, "wmma.store")
    if not toks or toks[0] != "d":
        raise ValueError(f"{spelling!r}: wmma.store needs the matrix qualifier .d first")
    q = _Quals(s, toks[1:], {"sync": ("sync",), "aligned": ("aligned",), "layout": LAYOUTS,
                             "shape": tuple(S.SHAPES), "space": SPACES, "type": TYPES}, True)
    _common(s, q)
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
    s, toks = _split(spelling, "wmma.mma")
    op = None
    if len(toks) >= 2 and toks[0] in S.B1_OPS and toks[1] == "popc":
        op, toks = toks[0], toks[2:]
    q = _Quals(s, toks, {"sync": ("sync",), "aligned": ("aligned",), "layout": LAYOUTS,
                         "shape": tuple(S.SHAPES), "rnd": ROUNDINGS, "sat": ("satfinite",),
                         "type": TYPES}, True)
    _common(s, q)
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


# ---------------------------------------------------------------------------------------------
# mma.sync (PTX ISA 9.7.14.5.14): the shapes and type combinations per family.

MMA_SYNC_FORMS: dict[str, tuple[str, ...]] = {
    "f16": ("m8n8k4", "m16n8k8", "m16n8k16"),
    "bf16": ("m16n8k8", "m16n8k16"),
    "tf32": ("m16n8k4", "m16n8k8"),
    "f64": ("m8n8k4", "m16n8k4", "m16n8k8", "m16n8k16"),
    "fp8": ("m16n8k16", "m16n8k32"),
    "int8": ("m8n8k16", "m16n8k16", "m16n8k32"),
    "int4": ("m8n8k32", "m16n8k32", "m16n8k64"),
    "b1": ("m8n8k128", "m16n8k128", "m16n8k256"),
}
MMA_SYNC_MIN_SM = {"f16": 70, "bf16": 80, "tf32": 80, "f64": 80, "fp8": 89, "int8": 75, "int4": 75, "b1": 75}


def _mnk(shape):
    m = re.fullmatch(r"m(\d+)n(\d+)k(\d+)", shape)
    return tuple(int(x) for x in m.groups())


def parse_mma_sync(spelling: str) -> Mma:
    s, toks = _split(spelling, "mma")
    op = None
    if len(toks) >= 2 and toks[-1] == "popc" and toks[-2] in S.B1_OPS:
        op, toks = toks[-2], toks[:-2]
    shapes = tuple(sorted({sh for v in MMA_SYNC_FORMS.values() for sh in v}))
    q = _Quals(s, toks, {"sync": ("sync",), "aligned": ("aligned",), "layout": LAYOUTS,
                         "shape": shapes, "rnd": ROUNDINGS, "sat": ("satfinite",),
                         "kind": tuple("kind::" + k for k in BLACKWELL_KINDS), "block_scale": ("block_scale",),
                         "scale_vec": _SCALE_VECS, "type": TYPES + F8F6F4[2:] + SCALE_TYPES}, True)
    _common(s, q)
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
    m, n, k = _mnk(shape)
    return Mma(s, "mma", shape, m, n, k, d, a, b, c, lays[0], lays[1], sat,
               rnd or ("rn" if fam == "f64" else None), op)


_SCALE_VECS = ("scale_vec::1X", "scale_vec::2X", "scale_vec::4X")


def _blackwell_mma_sync(s: str, q: _Quals, shape: str, lays, kind: str, types) -> Mma:
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
        m, n, k = _mnk(shape)
        return Mma(s, "mma", shape, m, n, k, d, a, b, c, "row", "col", ptx_kind=kind)
    if not q.found["block_scale"]:
        raise ValueError(f"{s!r}: .kind::{kind} needs .block_scale")
    nvec = _scale_vec(s, kind, vecs, q.one(s, "scale_vec", required=False))
    if len(types) != 5:
        raise ValueError(f"{s!r}: .kind::{kind} needs five types .f32.atype.btype.f32.stype, got {types}")
    d, a, b, c, st = types
    if d != "f32" or c != "f32" or a not in elems or b not in elems or st not in vecs[nvec]:
        raise ValueError(f"{s!r}: .{'.'.join(types)} is not valid for .kind::{kind}.scale_vec::{nvec}X; valid: "
                         f".f32.atype.btype.f32.stype with atype, btype in {{{', '.join(elems)}}} and stype in "
                         f"{{{', '.join(vecs[nvec])}}}")
    m, n, k = _mnk(shape)
    return Mma(s, "mma", shape, m, n, k, d, a, b, c, "row", "col", ptx_kind=kind, stype=st, scale_vec=nvec)


def parse_wgmma(spelling: str) -> Mma:
    """Dense ``wgmma.mma_async.sync.aligned.m64nNkK.dtype.atype.btype`` (value level)."""
    s, toks = _split(spelling, "wgmma.mma_async")
    q = _Quals(s, [t for t in toks if not re.fullmatch(r"m64n\d+k\d+", t)],
               {"sync": ("sync",), "aligned": ("aligned",), "type": TYPES})
    _common(s, q)
    shapes = [t for t in toks if re.fullmatch(r"m64n\d+k\d+", t)]
    if len(shapes) != 1:
        raise ValueError(f"{spelling!r}: wgmma needs one .m64nNkK shape")
    m, n, k = _mnk(shapes[0])
    types = q.found["type"]
    if len(types) != 3:
        raise ValueError(f"{spelling!r}: wgmma needs .dtype.atype.btype")
    d, a, b = types
    want_k = {"f16": 16, "bf16": 16, "tf32": 8, "e4m3": 32, "e5m2": 32}
    if a not in want_k or (a in ("e4m3", "e5m2")) != (b in ("e4m3", "e5m2")) or (
            a not in ("e4m3", "e5m2") and a != b):
        raise ValueError(f"{spelling!r}: unsupported wgmma types .{d}.{a}.{b}; valid atype/btype: "
                         "f16, bf16, tf32, e4m3/e5m2 (any mix)")
    if k != want_k[a] or n % 8 or not 8 <= n <= 256:
        raise ValueError(f"{spelling!r}: .m64n{n}k{k} is not a wgmma shape for .{a} "
                         f"(N = 8..256 step 8, K = {want_k[a]})")
    if d not in ("f32", "f16") or (d == "f16" and a in ("bf16", "tf32")):
        raise ValueError(f"{spelling!r}: .{d} accumulators are not valid with .{a}")
    return Mma(s, "wgmma", shapes[0], m, n, k, d, a, b, d)


# tcgen05.mma (sm_100a) kinds: K, the element types, and the D types (value level).
TCGEN05_KINDS = {
    "tf32": (8, ("tf32",), ("f32",)),
    "f16": (16, ("f16", "bf16"), ("f32", "f16")),
    "f8f6f4": (32, F8F6F4, ("f32", "f16")),
    "mxf8f6f4": (32, F8F6F4, ("f32",)),
    "mxf4": (64, ("e2m1",), ("f32",)),
    "mxf4nvf4": (64, ("e2m1",), ("f32",)),
}


@dataclasses.dataclass(frozen=True)
class Tcgen05:
    """``tcgen05.mma.cta_group::1.kind::X[.block_scale.scale_vec::NX]`` without its operands: the
    element types, D type and M/N live in the instruction descriptor, so :meth:`bind` takes them
    from the arrays of a value-level call."""

    spelling: str
    ptx_kind: str
    stype_choices: tuple[str, ...] = ()
    scale_vec: int | None = None

    def bind(self, atype: str, btype: str, dtype: str, m: int, n: int, stype: str | None = None) -> Mma:
        """The :class:`Mma` of this instruction for the given types and M, N (validated)."""
        k, elems, dtypes = TCGEN05_KINDS[self.ptx_kind]
        what = f"{self.spelling!r}"
        if atype not in elems or btype not in elems:
            raise ValueError(f"{what}: A and B of .kind::{self.ptx_kind} must be {', '.join(elems)}; got {atype} and {btype}")
        if self.ptx_kind == "f16" and atype != btype:
            raise ValueError(f"{what}: .kind::f16 needs A and B of the same type, got {atype} and {btype}")
        if dtype not in dtypes or (dtype == "f16" and atype == "bf16"):
            raise ValueError(f"{what}: D (and C) of .kind::{self.ptx_kind} with {atype} inputs must be "
                             f"{' or '.join(t for t in dtypes if not (t == 'f16' and atype == 'bf16'))}, got {dtype}")
        valid_m = (128,) if self.scale_vec else (64, 128)
        if m not in valid_m or n % 8 or not 8 <= n <= 256:
            raise ValueError(f"{what}: M={m}, N={n} is not a cta_group::1 shape of .kind::{self.ptx_kind}; valid: "
                             f"M in {{{', '.join(map(str, valid_m))}}}, N = 8..256 step 8")
        if self.scale_vec and stype not in self.stype_choices:
            raise ValueError(f"{what}: scale factors must be {' or '.join(self.stype_choices)}, got {stype}")
        return Mma(self.spelling, "tcgen05", f"m{m}n{n}k{k}", m, n, k, dtype, atype, btype, dtype,
                   ptx_kind=self.ptx_kind, stype=stype if self.scale_vec else None, scale_vec=self.scale_vec)


def parse_tcgen05(spelling: str) -> Tcgen05:
    """``tcgen05.mma.cta_group::1.kind::X`` (value level; block-scaled kinds take
    ``.block_scale.scale_vec::NX``)."""
    s, toks = _split(spelling, "tcgen05.mma")
    q = _Quals(s, toks, {"cta_group": ("cta_group::1", "cta_group::2"),
                         "kind": tuple("kind::" + k for k in TCGEN05_KINDS), "block_scale": ("block_scale",),
                         "scale_vec": _SCALE_VECS + ("block16", "block32")})
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
    nvec = _scale_vec(s, kind, vecs, vec)
    return Tcgen05(s, kind, vecs[nvec], nvec)


def _scale_vec(s: str, kind: str, vecs: dict, vec: str | None) -> int:
    """The scale_vec of a block-scaled kind (its default where PTX has one), validated."""
    valid = ", ".join(f".scale_vec::{v}X" for v in vecs)
    if vec is None:
        if len(vecs) > 1:
            raise ValueError(f"{s!r}: .kind::{kind} needs a .scale_vec qualifier ({valid})")
        return next(iter(vecs))
    nvec = int(vec[len("scale_vec::"):-1])
    if nvec not in vecs:
        raise ValueError(f"{s!r}: .{vec} is not valid with .kind::{kind}; valid: {valid}")
    return nvec


def parse(spelling: str):
    """Parse any supported PTX spelling into its instruction description."""
    s = _clean(spelling)
    parsers = (("wmma.load", parse_wmma_load), ("wmma.store", parse_wmma_store),
               ("wmma.mma", parse_wmma_mma), ("wgmma.mma_async", parse_wgmma), ("tcgen05.mma", parse_tcgen05),
               ("mma", parse_mma_sync), ("ldmatrix", parse_matrix_move), ("stmatrix", parse_matrix_move))
    for prefix, fn in parsers:
        if s.startswith(prefix + "."):
            return fn(s)
    hint = ""
    if any(s == prefix for prefix, _ in parsers):
        hint = f" ({s} needs its qualifiers, e.g. .sync.aligned and a shape)"
    elif s != s.lower() and any(s.lower().startswith(prefix + ".") for prefix, _ in parsers):
        hint = f" (PTX is case-sensitive: did you mean {s.lower()!r}?)"
    raise ValueError(f"unsupported instruction {spelling!r}{hint}; supported: wmma.load, wmma.store, "
                     "wmma.mma, mma.sync, ldmatrix, stmatrix, wgmma.mma_async and tcgen05.mma (value level)")


# ---------------------------------------------------------------------------------------------
# ldmatrix / stmatrix (PTX ISA 9.7.14.5.15 / 9.7.14.5.16)


@dataclasses.dataclass(frozen=True)
class MatrixMove:
    """ldmatrix (``op="ld"``) or stmatrix (``op="st"``)."""

    spelling: str
    op: str
    shape: str  # m8n8 | m16n8 | m16n16 | m8n16
    num: int  # 1, 2 or 4 matrices
    trans: bool
    etype: str  # b16 | b8 | b8x16.b6x16_p32 | b8x16.b4x16_p64
    space: str | None

    @property
    def min_sm(self) -> int:
        if self.shape != "m8n8":
            return 100
        return 75 if self.op == "ld" else 90


def parse_matrix_move(spelling: str) -> MatrixMove:
    op = "ld" if _clean(spelling).startswith("ldmatrix") else "st"
    s, toks = _split(spelling, "ldmatrix" if op == "ld" else "stmatrix")
    shapes = ("m8n8", "m16n16", "m8n16") if op == "ld" else ("m8n8", "m16n8")
    rest = ".".join(toks)
    fmt = None
    for f in ("b8x16.b6x16_p32", "b8x16.b4x16_p64"):
        if rest.endswith("." + f) and op == "ld":
            fmt, toks = f, rest[: -len(f) - 1].split(".")
    q = _Quals(s, toks, {"sync": ("sync",), "aligned": ("aligned",), "shape": shapes,
                         "num": ("x1", "x2", "x4"), "trans": ("trans",), "space": SPACES,
                         "type": ("b16", "b8")}, True)
    _common(s, q)
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
