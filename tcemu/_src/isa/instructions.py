"""Validated PTX instruction descriptions (frozen dataclasses) and the tables that define them.

What :func:`tcemu._src.isa.parse.parse` returns: :class:`WmmaLoad` / :class:`WmmaStore`
(``wmma.load`` / ``wmma.store``), :class:`Mma` (``wmma.mma``, ``mma.sync``, ``wgmma.mma_async``
and a bound ``tcgen05.mma``), :class:`Tcgen05` (``tcgen05.mma`` before its types are known) and
:class:`MatrixMove` (``ldmatrix`` / ``stmatrix``); with them the qualifier sets, the ``mma.sync``
shapes and oldest architecture per family (PTX ISA 9.7.14.5.14) and the Blackwell ``.kind``
tables. :class:`Unsupported` marks what tcemu parses but does not emulate at the level asked for.
"""
from __future__ import annotations

import dataclasses

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


@dataclasses.dataclass(frozen=True)
class WgmmaSync:
    """``wgmma.fence`` / ``wgmma.commit_group`` / ``wgmma.wait_group``: ordering of asynchronous
    wgmma operations, no data (``op`` is "fence", "commit_group" or "wait_group")."""

    spelling: str
    op: str
    kind: str = "wgmma"


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
