"""AMD MFMA (matrix fused multiply-add) instructions of CDNA1-3, spelled as LLVM and the AMD ISA
guides spell them: ``v_mfma_<D>_<M>x<N>x<K>[_<B>b]_<A>[_<B>]`` on CDNA3 (gfx942, e.g.
``v_mfma_f32_32x32x8_f16``, ``v_mfma_f32_16x16x32_fp8_bf8``, ``v_mfma_f64_4x4x4_4b_f64``) and
``v_mfma_<D>_<M>x<N>x<K><A>[_1k]`` on CDNA1/CDNA2 (gfx908/gfx90a, e.g. ``v_mfma_f32_32x32x8f16``,
``v_mfma_f32_16x16x16bf16_1k``). ``M x N x K`` is one block; multi-block instructions compute
``blocks`` independent products (the block count is implied by the shape on CDNA1/2 and spelled
``_2b``/``_4b``/``_16b`` on CDNA3). The table is the set MMA-Sim 2.1.1 models
(``mmasim/amd/isa_mfma.py``), checked against the CDNA1/2/3 ISA guides' MFMA lists.

    >>> from tcemu._src.isa.mfma import parse_mfma
    >>> i = parse_mfma("v_mfma_f32_32x32x4_2b_f16", "MI300X")
    >>> (i.m, i.n, i.k, i.blocks, i.atype, i.dtype)
    (32, 32, 4, 2, 'f16', 'f32')
    >>> parse_mfma("v_mfma_f32_32x32x8f16", "MI250X").spelling     # gfx90a spells it without '_'
    'v_mfma_f32_32x32x8f16'
"""
from __future__ import annotations

import dataclasses
import difflib

from tcemu._src.arch import AMD, resolve

# element types in the spellings -> tcemu formats (xf32: float32 registers read as tf32)
ETYPES = {"f32": "f32", "xf32": "tf32", "f16": "f16", "bf16": "bf16", "f64": "f64", "fp8": "e4m3fnuz",
          "bf8": "e5m2fnuz", "i8": "s8"}
FAMILY = {"f32": "f32", "tf32": "tf32", "f16": "f16", "bf16": "bf16", "f64": "f64", "e4m3fnuz": "fp8",
          "e5m2fnuz": "fp8", "s8": "int"}
_I8_12 = ((32, 32, 4, 2), (16, 16, 4, 4), (4, 4, 4, 16), (32, 32, 8, 1), (16, 16, 16, 1))  # i8 -> i32: CDNA1/2
_I8_3 = ((32, 32, 4, 2), (16, 16, 4, 4), (4, 4, 4, 16), (32, 32, 16, 1), (16, 16, 32, 1))  # i8 -> i32: CDNA3

# (M, N, K, blocks) per input type: CDNA1 (gfx908) and the CDNA2 (gfx90a) additions
_CDNA1 = {"f32": ((32, 32, 2, 1), (32, 32, 1, 2), (16, 16, 4, 1), (16, 16, 1, 4), (4, 4, 1, 16)),
          "f16": ((32, 32, 8, 1), (32, 32, 4, 2), (16, 16, 16, 1), (16, 16, 4, 4), (4, 4, 4, 16)),
          "bf16": ((32, 32, 4, 1), (32, 32, 2, 2), (16, 16, 8, 1), (16, 16, 2, 4), (4, 4, 2, 16)),
          "i8": _I8_12}
_CDNA2 = {"f64": ((16, 16, 4, 1), (4, 4, 4, 4)),
          "bf16_1k": ((32, 32, 8, 1), (32, 32, 4, 2), (16, 16, 16, 1), (16, 16, 4, 4), (4, 4, 4, 16))}
_CDNA3 = {"f64": ((16, 16, 4, 1), (4, 4, 4, 4)),
          "f32": ((32, 32, 2, 1), (32, 32, 1, 2), (16, 16, 4, 1), (16, 16, 1, 4), (4, 4, 1, 16)),
          "xf32": ((16, 16, 8, 1), (32, 32, 4, 1)),
          "f16": ((32, 32, 8, 1), (32, 32, 4, 2), (16, 16, 16, 1), (16, 16, 4, 4), (4, 4, 4, 16)),
          "bf16": ((32, 32, 8, 1), (32, 32, 4, 2), (16, 16, 16, 1), (16, 16, 4, 4), (4, 4, 4, 16)),
          **{f"{x}_{y}": ((16, 16, 32, 1), (32, 32, 16, 1)) for x in ("fp8", "bf8") for y in ("fp8", "bf8")},
          "i8": _I8_3}


@dataclasses.dataclass(frozen=True)
class Mfma:
    """One MFMA: per-block ``m x n x k``, ``blocks`` blocks, A/B element formats (tcemu names),
    D = C type, and the target it was parsed for (``onek``: CDNA2's ``_1k`` bf16 forms)."""

    spelling: str
    arch: str  # gfx908, gfx90a, gfx942
    m: int
    n: int
    k: int
    blocks: int
    atype: str
    btype: str
    dtype: str
    onek: bool = False
    kind: str = "mfma"

    @property
    def ctype(self) -> str:
        return self.dtype

    @property
    def family(self) -> str:
        return FAMILY[self.atype]

    @property
    def generation(self) -> str:
        return AMD[self.arch]

    # what the GEMM pipeline reads of an NVIDIA Mma: MFMAs have no block scales
    scale_vec = None
    scale_block = 0
    stype = None


_DTYPE = {"f64": "f64", "i8": "i32"}  # the C/D type of an input type key (else f32)


def _spell(arch: str, t: str, m: int, n: int, k: int, blocks: int) -> str:
    d = _DTYPE.get(t, "f32")
    if arch == "gfx942":
        nb = f"_{blocks}b" if blocks > 1 else ""
        return f"v_mfma_{d}_{m}x{n}x{k}{nb}_{t}"
    if t == "bf16_1k":
        return f"v_mfma_{d}_{m}x{n}x{k}bf16_1k"
    return f"v_mfma_{d}_{m}x{n}x{k}{t}"


def _table() -> dict[str, dict[str, tuple]]:
    out = {}
    for arch, tables in (("gfx908", (_CDNA1,)), ("gfx90a", (_CDNA1, _CDNA2)), ("gfx942", (_CDNA3,))):
        out[arch] = {_spell(arch, t, *s): (t, *s) for tab in tables for t, shapes in tab.items() for s in shapes}
    return out


TABLE = _table()  # arch -> canonical spelling -> (type key, M, N, K, blocks)


def _meaning(arch: str, spelling: str):
    """What a spelling of ``arch`` computes: (types, M, N, K, blocks); CDNA3's bf16 MFMAs are
    CDNA2's ``_1k`` ones."""
    t, *shape = TABLE[arch][spelling]
    return ("bf16_1k" if arch == "gfx942" and t == "bf16" else t, *shape)


def _canonical(spelling: str, arch: str) -> str | None:
    """The arch's own spelling of an MFMA spelled for another target (CDNA1/2 and CDNA3 spell the
    same MFMA differently; ``..._bf16_1k`` is read as ``...bf16_1k``)."""
    s = spelling.replace("_bf16_1k", "bf16_1k")
    for other in TABLE:
        if s in TABLE[other]:
            want = _meaning(other, s)
            return next((x for x in TABLE[arch] if _meaning(arch, x) == want), None)
    return None


def parse_mfma(spelling: str, arch) -> Mfma:
    """Parse an MFMA spelling for ``arch`` (a gfx target or an AMD GPU name); a spelling the target
    lacks raises a ValueError listing the target's spellings."""
    if not isinstance(spelling, str):
        raise TypeError(f"spelling must be a string such as 'v_mfma_f32_32x32x8_f16', got {type(spelling).__name__}")
    a = resolve(arch)
    if not a.amd:
        raise ValueError(f"{spelling!r} is an AMD MFMA: arch must be an AMD target ({', '.join(AMD)}) or GPU "
                         f"(MI100, MI210, MI250, MI250X, MI300A, MI300X, MI325X), got {a}")
    s = spelling.strip()
    canon = s if s in TABLE[a.name] else _canonical(s, a.name)
    if canon is None:
        close = difflib.get_close_matches(s, TABLE[a.name], n=3)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise ValueError(f"{spelling!r} is not an MFMA of {a} ({AMD[a.name]}){hint}; valid: "
                         f"{', '.join(TABLE[a.name])}")
    t, m, n, k, blocks = TABLE[a.name][canon]
    at, _, bt = t.removesuffix("_1k").partition("_")
    dtype = {"f64": "f64", "i32": "s32"}.get(_DTYPE.get(t), "f32")
    return Mfma(canon, a.name, m, n, k, blocks, ETYPES[at], ETYPES[bt or at], dtype, onek=t == "bf16_1k")
