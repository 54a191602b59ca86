"""Register layouts of AMD's MFMA instructions on CDNA1 (gfx908, MI100), CDNA2 (gfx90a, MI200) and
CDNA3 (gfx942, MI300), as data: which lane and VGPR of a wavefront holds which element.

A wavefront's register file is ``(64, nregs)`` uint32 (lane x VGPR). Each operand is a
:class:`~tcemu._src.layouts.fragment.Fragment` with 6 lane bases over a *stacked* matrix: the
blocks of a multi-block instruction (``_2b``, ``_4b``, ``_16b``) stacked along M for A
(``B*M x K``) and C/D (``B*M x N``) and along N for B (``K x B*N``). The rules are those of AMD's
Matrix Instruction Calculator (``InstCalcGfx9``), checked against it element by element
(``tests/test_mfma_layouts.py``):

- A (B): lane ``i + M*b + M*B*(k // E)`` (``j`` for B), element ``k % E`` of the lane, ``E`` =
  ``K*M*B/64`` elements per lane packed from bit 0 (f16/bf16 two per VGPR, i8/fp8/bf8 four, f32
  and xf32 one, f64 one per VGPR pair, low word first).
- C/D, 32-bit: rows in groups of 4 VGPRs, ``64/N`` row groups across the lanes; 64-bit: one VGPR
  pair per row group. Blocks follow the rows (the 4x4 forms put 16 blocks side by side in lanes).
- CBSZ/ABID (A of multi-block forms): block ``b`` reads A of block ``(b >> CBSZ << CBSZ) + ABID``.
- BLGP (B, lane forms): the B operand of lane ``l`` is read from another lane (:func:`blgp_lane`);
  on CDNA3 the f64 forms read BLGP as negate bits (A, B, C), which changes no layout.

Spellings are the CDNA3 (gfx942) LLVM ones, ``v_mfma_<CD>_<M>x<N>x<K>[_<B>b]_<AB>``; the CDNA1/2
spellings (``v_mfma_f32_32x32x1f32``, ``..._bf16_1k``) are accepted as well. Instructions only
on CDNA1/2 get a name in the same pattern (``v_mfma_f32_32x32x2_2b_bf16`` for ``..._32x32x2bf16``).
Not covered: the sparse ``v_smfmac`` forms of CDNA3.

>>> ins = mfma("v_mfma_f32_32x32x8_f16", "gfx942")
>>> ins.shape("a"), ins.nregs("a"), ins.nregs("d")
((1, 32, 8), 2, 16)
>>> [int(x) for x in locate(ins, "a", 0, 3, 5)]        # A[3][5]: lane 35, v0 bits 16..31
[35, 0, 16]
"""
from __future__ import annotations

import dataclasses
import functools
import re

import jax
import jax.numpy as jnp
import numpy as np

from tcemu._src.layouts.fragment import Fragment

ARCHS = ("gfx908", "gfx90a", "gfx942")
ARCH_ALIASES = {
    **dict.fromkeys(("cdna", "cdna1", "gfx908", "arcturus", "mi100"), "gfx908"),
    **dict.fromkeys(("cdna2", "gfx90a", "aldebaran", "mi200", "mi210", "mi250", "mi250x"), "gfx90a"),
    **dict.fromkeys(("cdna3", "gfx940", "gfx941", "gfx942", "aqua_vanjaram", "mi300", "mi300a",
                     "mi300x", "mi325x"), "gfx942"),
}
_FP8 = " ".join(f"f32_{s}_{a}_{b}" for s in ("16x16x32", "32x32x16") for a in ("fp8", "bf8")
                for b in ("fp8", "bf8"))
# v_mfma_ + <CD>_<M>x<N>x<K>[_<B>b]_<AB>, by the architectures that have them
_C123 = ("f32_32x32x1_2b_f32 f32_16x16x1_4b_f32 f32_4x4x1_16b_f32 f32_32x32x2_f32 f32_16x16x4_f32 "
         "f32_32x32x4_2b_f16 f32_16x16x4_4b_f16 f32_4x4x4_16b_f16 f32_32x32x8_f16 f32_16x16x16_f16 "
         "i32_32x32x4_2b_i8 i32_16x16x4_4b_i8 i32_4x4x4_16b_i8")
_C12 = ("i32_32x32x8_i8 i32_16x16x16_i8 f32_32x32x2_2b_bf16 f32_16x16x2_4b_bf16 f32_4x4x2_16b_bf16 "
        "f32_32x32x4_bf16 f32_16x16x8_bf16")
_C23_BF16_1K = "f32_32x32x4_2b_bf16 f32_16x16x4_4b_bf16 f32_4x4x4_16b_bf16 f32_32x32x8_bf16 f32_16x16x16_bf16"
_C23 = _C23_BF16_1K + " f64_16x16x4_f64 f64_4x4x4_4b_f64"
_C3 = "f32_16x16x8_xf32 f32_32x32x4_xf32 i32_32x32x16_i8 i32_16x16x32_i8 " + _FP8
SPELLINGS = {
    arch: tuple("v_mfma_" + s for s in " ".join(groups).split())
    for arch, groups in (("gfx908", (_C123, _C12)), ("gfx90a", (_C123, _C12, _C23)),
                         ("gfx942", (_C123, _C23, _C3)))
}
_NAME = re.compile(r"v_mfma_(f32|i32|f64)_(\d+)x(\d+)x(\d+)(?:_(\d+)b)?_(xf32|f32|f16|bf16|i8|f64|"
                   r"(?:fp8|bf8)_(?:fp8|bf8))$")
_BITS = {"f32": 32, "xf32": 32, "i32": 32, "f16": 16, "bf16": 16, "i8": 8, "fp8": 8, "bf8": 8, "f64": 64}


def _cdna12_spelling(canonical: str) -> str:
    """LLVM's gfx908/gfx90a spelling: no ``_<B>b``, the type glued to K, ``_1k`` for CDNA2's bf16."""
    cd, m, n, k, _, ab = _NAME.match(canonical).groups()
    tail = "_1k" if canonical[len("v_mfma_"):] in _C23_BF16_1K.split() else ""
    return f"v_mfma_{cd}_{m}x{n}x{k}{ab}{tail}"


_CDNA12_NAMES = {_cdna12_spelling(s): s for s in SPELLINGS["gfx90a"] + SPELLINGS["gfx908"]}


@dataclasses.dataclass(frozen=True)
class Mfma:
    """One MFMA instruction on one architecture: its shape and operand layouts."""

    spelling: str
    arch: str
    cd: str
    ab: tuple[str, str]
    m: int
    n: int
    k: int
    blocks: int

    @property
    def cbsz_abid(self) -> bool:
        """Whether CBSZ/ABID (A broadcast between blocks) apply: the multi-block non-f64 forms."""
        return self.blocks > 1 and self.cd != "f64"

    @property
    def blgp(self) -> str:
        """What BLGP does: "lanes" (B lane-group pattern), "negate" (CDNA3 f64) or "" (not taken)."""
        if self.cd == "f64":
            return "negate" if self.arch == "gfx942" else ""
        if self.arch != "gfx942" or self.blocks > 1 or self.ab[0] == "f32":
            return "lanes"
        return ""

    def bits(self, matrix: str) -> int:
        """Element bits of ``matrix`` ("a", "b", "c" or "d")."""
        _check_matrix(matrix)
        return _BITS[{"a": self.ab[0], "b": self.ab[1]}.get(matrix, self.cd)]

    def shape(self, matrix: str) -> tuple[int, int, int]:
        """(blocks, rows, cols): A (B, M, K), B (B, K, N), C/D (B, M, N)."""
        _check_matrix(matrix)
        rows, cols = {"a": (self.m, self.k), "b": (self.k, self.n)}.get(matrix, (self.m, self.n))
        return self.blocks, rows, cols

    def nregs(self, matrix: str) -> int:
        """VGPRs per lane holding ``matrix``."""
        return self.fragment(matrix).nregs

    def fragment(self, matrix: str) -> Fragment:
        """The stacked-matrix :class:`Fragment` of ``matrix`` (see the module docstring)."""
        return _fragment(self, "c" if matrix == "d" else matrix)


def _log2(x: int) -> int:
    return x.bit_length() - 1


@functools.lru_cache(maxsize=None)
def _fragment(ins: Mfma, matrix: str) -> Fragment:
    _check_matrix(matrix)
    bits, (B, _, _) = ins.bits(matrix), ins.shape(matrix)
    M, N = ins.m, ins.n
    if matrix in "ab":
        outer = M if matrix == "a" else N  # lanes walk i (A) or j (B) first, then blocks, then k
        per = ins.k * outer * B // 64  # E: elements of k a lane holds
        groups = 64 // (outer * B)
        lane = ([1 << t for t in range(_log2(outer))] + [outer << t for t in range(_log2(B))],
                [per << t for t in range(_log2(groups))])
        value = [1 << t for t in range(_log2(per))]
        if matrix == "a":  # (outer, k) offsets; B holds the transpose
            lb = [(o, 0) for o in lane[0]] + [(0, g) for g in lane[1]]
            vb = [(0, v) for v in value]
        else:
            lb = [(0, o) for o in lane[0]] + [(g, 0) for g in lane[1]]
            vb = [(v, 0) for v in value]
        nvals, rows, cols = per, (M * B if matrix == "a" else ins.k), (ins.k if matrix == "a" else N * B)
    else:
        height = 4 if bits == 32 else 1  # rows a VGPR group holds in turn
        bpr = max(1, 64 * height // (M * N))  # blocks side by side in the lanes
        quads = 64 // (N * bpr)  # row groups across the lanes
        lb = ([(0, 1 << t) for t in range(_log2(N))] + [(M << t, 0) for t in range(_log2(bpr))]
              + [(height << t, 0) for t in range(_log2(quads))])
        vb = ([(1 << t, 0) for t in range(_log2(height))]
              + [(height * quads << t, 0) for t in range(_log2(M // (height * quads)))]
              + [(M * bpr << t, 0) for t in range(_log2(B // bpr))])
        nvals, rows, cols = 1 << len(vb), M * B, N
    nregs = nvals * 2 if bits == 64 else nvals * bits // 32
    src = f"AMD Matrix Instruction Calculator rules ({ins.arch} {ins.spelling})"
    return Fragment(rows, cols, bits, nregs, tuple(lb), tuple(vb), src)


def _check_matrix(matrix):
    if matrix not in ("a", "b", "c", "d"):
        raise ValueError(f"matrix must be 'a', 'b', 'c' or 'd', not {matrix!r}")


def arch_name(arch: str) -> str:
    """The gfx name of an AMD CDNA architecture name (MI300X, CDNA3, gfx942, ...).

    >>> arch_name("MI300X"), arch_name("MI250X"), arch_name("cdna1")
    ('gfx942', 'gfx90a', 'gfx908')
    """
    key = str(arch).lower()
    if key not in ARCH_ALIASES:
        raise ValueError(f"unknown AMD architecture {arch!r}: valid are {sorted(set(ARCH_ALIASES))}")
    return ARCH_ALIASES[key]


@functools.lru_cache(maxsize=None)
def mfma(spelling: str, arch: str) -> Mfma:
    """The MFMA ``spelling`` (CDNA3 or CDNA1/2 LLVM spelling) on ``arch`` (gfx name or alias).

    >>> ins = mfma("v_mfma_f32_4x4x4f16", "MI100")
    >>> ins.spelling, ins.blocks, ins.shape("b"), ins.cbsz_abid, ins.blgp
    ('v_mfma_f32_4x4x4_16b_f16', 16, (16, 4, 4), True, 'lanes')
    """
    gfx = arch_name(arch)
    name = _CDNA12_NAMES.get(spelling, spelling)
    if name not in SPELLINGS[gfx]:
        raise ValueError(f"{spelling!r} is not an MFMA of {gfx}: valid are {', '.join(SPELLINGS[gfx])}")
    cd, m, n, k, blocks, ab = _NAME.match(name).groups()
    pair = tuple(ab.split("_")) if "_" in ab else (ab, ab)
    return Mfma(name, gfx, cd, pair, int(m), int(n), int(k), int(blocks or 1))


def blgp_lane(lane, blgp: int):
    """The lane whose B operand lane ``lane`` reads under BLGP (0: itself; 1, 2: broadcast lanes
    0-31 / 32-63; 3: rotate by 16; 4-7: broadcast lane group ``blgp - 4`` of 16).

    >>> blgp_lane(np.array([0, 17, 40, 63]), 3).tolist(), blgp_lane(np.array([0, 17, 40, 63]), 6).tolist()
    ([16, 33, 56, 15], [32, 33, 40, 47])
    """
    lane = np.asarray(lane)
    if blgp == 0:
        return lane
    if blgp in (1, 2):
        return lane % 32 + 32 * (blgp - 1)
    if blgp == 3:
        return (lane + 16) % 64
    if 4 <= blgp <= 7:
        return lane % 16 + 16 * (blgp - 4)
    raise ValueError(f"blgp must be 0..7, not {blgp!r}")


@functools.lru_cache(maxsize=None)
def _table(ins: Mfma, matrix: str) -> np.ndarray:
    """int32 (B, rows, cols, 3): (lane, first VGPR, low bit) of every element, no modifiers."""
    frag = ins.fragment(matrix)
    if frag.copies != 1:
        raise AssertionError(f"{ins.spelling} {matrix}: an MFMA operand holds every element once")
    B, rows, cols = ins.shape(matrix)
    r, c = frag.coords[..., 0], frag.coords[..., 1]
    if matrix == "b":  # stacked K x B*N -> (block, k, j)
        blk, r, c = c // cols, r, c % cols
    else:  # stacked B*M x cols -> (block, i, col)
        blk, r = r // rows, r % rows
    lane, v = np.indices(r.shape)
    if frag.bits == 64:
        reg, bit = 2 * v, 0 * v
    else:
        reg, bit = np.divmod(v, frag.per_reg)
        bit = bit * frag.bits
    out = np.full((B, rows, cols, 3), -1, np.int32)
    out[blk, r, c] = np.stack([lane, reg, bit], -1)
    return out


def locate(ins: Mfma, matrix: str, block, row, col, *, cbsz: int = 0, abid: int = 0, blgp: int = 0):
    """(lane, first VGPR, low bit) holding element (``block``, ``row``, ``col``) of ``matrix`` --
    A[i][k], B[k][j], C/D[i][j] -- as the instruction reads it under CBSZ/ABID (A) and BLGP (B).
    Vectorised over numpy arrays; a 64-bit element also takes the next VGPR (high word).

    >>> ins = mfma("v_mfma_f32_16x16x4_4b_f16", "gfx942")
    >>> [int(x) for x in locate(ins, "a", 3, 2, 1)], [int(x) for x in locate(ins, "a", 3, 2, 1, cbsz=2, abid=1)]
    ([50, 0, 16], [18, 0, 16])
    >>> [int(x) for x in locate(ins, "d", 1, 5, 7)]                # D[5][7] of block 1: lane 23, v5
    [23, 5, 0]
    """
    _check_modifiers(ins, matrix, cbsz, abid, blgp)
    block = np.asarray(block)
    if matrix == "a" and cbsz:
        block = (block >> cbsz << cbsz) + abid
    lane, reg, bit = np.moveaxis(_table(ins, matrix)[block, row, col], -1, 0)
    if matrix == "b" and ins.blgp == "lanes":
        lane = blgp_lane(lane, blgp)
    return lane, reg, bit


def element(ins: Mfma, matrix: str, lane, reg, bit=0):
    """(block, row, col) of the element of ``matrix`` that ``lane``'s VGPR ``reg`` holds from bit
    ``bit`` (no modifiers); the inverse of :func:`locate`. Vectorised over numpy arrays.

    >>> ins = mfma("v_mfma_f32_32x32x8_f16", "gfx942")
    >>> [int(x) for x in element(ins, "a", 35, 1, 16)], [int(x) for x in element(ins, "c", 40, 6)]
    ([0, 3, 7], [0, 14, 8])
    """
    frag = ins.fragment(matrix)
    lane, reg, bit = np.asarray(lane), np.asarray(reg), np.asarray(bit)
    if np.any((lane < 0) | (lane >= 64) | (reg < 0) | (reg >= frag.nregs)):
        raise IndexError(f"lane must be 0..63 and reg 0..{frag.nregs - 1} for {ins.spelling} {matrix}")
    v = reg // 2 if frag.bits == 64 else reg * frag.per_reg + bit // frag.bits
    r, c = np.moveaxis(frag.coords[lane, v], -1, 0)
    _, rows, cols = ins.shape(matrix)
    if matrix == "b":
        return c // cols, r, c % cols
    return r // rows, r % rows, c


def _check_modifiers(ins, matrix, cbsz, abid, blgp):
    _check_matrix(matrix)
    if cbsz or abid:
        if not ins.cbsz_abid:
            raise ValueError(f"{ins.spelling} on {ins.arch} takes no CBSZ/ABID")
        if not (0 <= cbsz <= _log2(ins.blocks) and 0 <= abid < 1 << cbsz):
            raise ValueError(f"cbsz must be 0..{_log2(ins.blocks)} and abid 0..2**cbsz - 1, not {cbsz}, {abid}")
    if blgp and not ins.blgp:
        raise ValueError(f"{ins.spelling} on {ins.arch} takes no BLGP")
    if not 0 <= blgp <= 7:
        raise ValueError(f"blgp must be 0..7, not {blgp!r}")


def unpack(ins: Mfma, matrix: str, words, *, cbsz: int = 0, abid: int = 0, blgp: int = 0):
    """(64, nregs) uint32 VGPRs of ``matrix`` -> the element bits the instruction reads: uint32
    (B, rows, cols), or (B, rows, cols, 2) (low, high word) for f64. Pure JAX, jit-able; CBSZ/ABID
    (A) and BLGP (B) select the lanes read.

    >>> ins = mfma("v_mfma_f32_4x4x1_16b_f32", "gfx90a")
    >>> words = jnp.arange(64, dtype=jnp.uint32)[:, None]        # lane l holds l
    >>> unpack(ins, "b", words)[5, 0].tolist(), unpack(ins, "b", words, blgp=4)[5, 0].tolist()
    ([20, 21, 22, 23], [4, 5, 6, 7])
    """
    frag = ins.fragment(matrix)
    words = jnp.asarray(words)
    if words.shape != (64, frag.nregs) or words.dtype != jnp.uint32:
        raise ValueError(f"{ins.spelling} {matrix}: words must be uint32 (64, {frag.nregs}), "
                         f"not {words.dtype} {words.shape}")
    lane, reg, bit = locate(ins, matrix, *np.indices(ins.shape(matrix)), cbsz=cbsz, abid=abid, blgp=blgp)
    index = lane * frag.nregs + reg
    if frag.bits == 64:  # (low, high) words
        index, bit = np.stack([index, index + 1], -1), np.zeros(index.shape + (2,), np.int64)
    return _extract(words, jnp.asarray(index, jnp.int32), jnp.asarray(bit, jnp.uint32), bits=min(frag.bits, 32))


@functools.partial(jax.jit, static_argnames="bits")
def _extract(words, index, shift, bits):
    """Bits ``[shift, shift + bits)`` of the flat VGPR ``index`` (compiled once per shape)."""
    val = words.reshape(-1)[index] >> shift
    return val & jnp.uint32((1 << bits) - 1) if bits < 32 else val


@functools.partial(jax.jit, static_argnames="bits")
def _insert(x, slots, bits):
    """VGPRs from the element bits ``x`` and each field's flat element index ``slots``."""
    v = x.reshape(-1)[slots]
    if bits < 32:
        v = v & jnp.uint32((1 << bits) - 1)
    shifts = jnp.arange(v.shape[-1], dtype=jnp.uint32) * jnp.uint32(bits % 32)
    return jnp.sum(v << shifts, axis=-1, dtype=jnp.uint32)  # disjoint bit fields: sum == or


@functools.lru_cache(maxsize=None)
def _slots(ins: Mfma, matrix: str) -> np.ndarray:
    """int32 (64, nregs, slots): flat index into the element bits (words for f64) per bit field."""
    frag = ins.fragment(matrix)
    lane, reg, bit = np.moveaxis(_table(ins, matrix), -1, 0)
    flat = np.arange(lane.size).reshape(lane.shape)
    if frag.bits == 64:
        out = np.full((64, frag.nregs, 1), -1, np.int32)
        out[lane, reg, 0], out[lane, reg + 1, 0] = 2 * flat, 2 * flat + 1
    else:
        out = np.full((64, frag.nregs, frag.per_reg), -1, np.int32)
        out[lane, reg, bit // frag.bits] = flat
    assert out.min() >= 0, "every bit field holds an element"
    return out


def pack(ins: Mfma, matrix: str, x):
    """Element bits of ``matrix`` -- uint32 (B, rows, cols), or (B, rows, cols, 2) for f64 -- ->
    (64, nregs) uint32 VGPRs (the layout C is read and D written in). Pure JAX, jit-able.

    >>> ins = mfma("v_mfma_f32_32x32x8_f16", "gfx942")
    >>> a = jnp.arange(32 * 8, dtype=jnp.uint32).reshape(1, 32, 8)
    >>> words = pack(ins, "a", a)
    >>> hex(int(words[35, 1])), bool((unpack(ins, "a", words) == a).all())   # A[3][7], A[3][6]
    ('0x1f001e', True)
    """
    frag = ins.fragment(matrix)
    x = jnp.asarray(x)
    shape = ins.shape(matrix) + ((2,) if frag.bits == 64 else ())
    if x.shape != shape or x.dtype != jnp.uint32:
        raise ValueError(f"{ins.spelling} {matrix}: x must be uint32 {shape}, not {x.dtype} {x.shape}")
    return _insert(x, jnp.asarray(_slots(ins, matrix)), bits=min(frag.bits, 32))
