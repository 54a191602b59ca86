"""Fragment and metadata layouts of the sparse ``mma.sp`` (PTX ISA 9.7.14.6), as data.

Operands: the compressed A (16 x K/2) sits in the registers exactly as a dense ``mma.sync``
m16n8k(K/2) A (PTX ISA 9.7.14.6.2: ``row = groupID (+ 8)``, ``col = threadID_in_group * w ...``);
B is the dense m16n8kK B where ``mma.sync`` has that shape, and otherwise the same pattern with one
more value bit along K (f16/bf16 m16n8k32, tf32 m16n8k16, 8-bit m16n8k64, 4-bit m16n8k128).

Metadata (operand ``e``, one 32-bit register a lane): every row of A has ``R`` bits, one 4-bit
nibble per chunk of 4 *units* of K (a unit is one 16-bit or 8-bit element, half a tf32 element,
or a pair of 4-bit elements), holding two 2-bit unit indices, the first in bits 1:0. ``R`` is 16
(f16/bf16 m16n8k16, tf32 m16n8k8: one lane of each quad, selector 0..3), 32 (f16/bf16 m16n8k32,
tf32 m16n8k16, 8-bit m16n8k32, 4-bit m16n8k64: a lane pair, selector 0..1) or 64 (8-bit
m16n8k64, fp8, 4-bit m16n8k128: all four lanes, selector 0). Which lane and bit hold bit ``p``
of row ``r``'s string (:func:`metadata_table`: it differs between 16-bit and 8-bit units) was
measured on an H100
(``tests/data/mma_sp_sm90.npz``, ``experiments/hardware/mma_sp.py``).

    >>> t = metadata_table(32, 1, 8)             # s8 m16n8k32, selector 1
    >>> t[0, 0].tolist(), t[8, 31].tolist()     # (lane, bit): rows 0 and 8 from lanes 2 and 3
    ([2, 0], [3, 31])
    >>> t = metadata_table(32, 1, 16)            # f16 m16n8k32, selector 1
    >>> t[0, 16].tolist(), t[8, 0].tolist()     # K 16.. of row 0 from lane 3; row 8 in the high half
    ([3, 0], [2, 16])
"""
from __future__ import annotations

import functools

import numpy as np

from tcemu._src.layouts.mma import MMA, _b

# B of the sparse shapes that dense mma.sync lacks: (shape, "b", bits) -> (lane bases, value bases)
SPARSE_B = {
    ("m16n8k32", "b", 16): _b(2, 4, ((1, 0), (8, 0), (16, 0))),
    ("m16n8k16", "b", 32): _b(1, 2, ((4, 0), (8, 0))),
    ("m16n8k64", "b", 8): _b(4, 8, ((1, 0), (2, 0), (16, 0), (32, 0))),
    ("m16n8k128", "b", 4): _b(8, 16, ((1, 0), (2, 0), (4, 0), (32, 0), (64, 0))),
}

# Metadata bits per row of A (R) -> the valid sparsity selectors (PTX ISA 9.7.14.6.1).
SELECTORS = {16: (0, 1, 2, 3), 32: (0, 1), 64: (0,)}


def a_key(k: int, bits: int):
    """The dense ``mma.sync`` A layout key of the compressed A of a sparse m16n8kK."""
    return (f"m16n8k{k // 2}", "a", bits)


def b_key(k: int, bits: int):
    return (f"m16n8k{k}", "b", bits)


def b_layout(k: int, bits: int):
    key = b_key(k, bits)
    return SPARSE_B.get(key) or MMA[key]


def row_bits(k: int, bits: int) -> int:
    """R: metadata bits per row of A for a sparse m16n8kK of ``bits``-bit elements."""
    units = {16: k, 32: 2 * k, 8: k, 4: k // 2}[bits]
    return units


@functools.lru_cache(maxsize=None)
def metadata_table(rbits: int, selector: int, unit_bits: int = 8) -> np.ndarray:
    """int32 (16, R, 2): the (lane, bit) of the metadata registers that holds bit ``p`` of row
    ``r``'s metadata string, for sparsity selector ``selector`` and K units of ``unit_bits``
    (16: f16, bf16, tf32; 8: 8- and 4-bit types). Row ``g + 8h`` (``g`` the groupID) reads lanes
    of its own quad, measured on an H100:

    * 16-bit units: bits ``16i .. 16i + 15`` of the string (units, i.e. K, ``16i ..``) are bits
      ``16h ..`` of lane ``4g + s + i``, ``s`` = the selector (R = 16) or twice it (R = 32): one
      lane holds 16 units of rows g and g + 8, low half first;
    * 8-bit units: bits ``32i .. 32i + 31`` are the whole register of lane ``4g + 2s + 2i + h``
      (R = 32: s = the selector; R = 64: s = 0): rows g and g + 8 alternate lanes."""
    if selector not in SELECTORS[rbits]:
        raise ValueError(f"selector {selector} is not valid with {rbits} metadata bits a row")
    out = np.zeros((16, rbits, 2), np.int32)
    for r in range(16):
        g, h = r % 8, r // 8
        for p in range(rbits):
            if unit_bits == 16:
                base = selector if rbits == 16 else 2 * selector
                out[r, p] = (4 * g + base + p // 16, 16 * h + p % 16)
            else:
                out[r, p] = (4 * g + 2 * selector + 2 * (p // 32) + h, p % 32)
    return out


def unit_bits(bits: int) -> int:
    """Bits of one K unit of the metadata: 16 for 16- and 32-bit elements, 8 for 8- and 4-bit."""
    return 16 if bits >= 16 else 8


def dense_positions(idx: np.ndarray, bits: int, xp=np):
    """The dense column of every compressed element, from the unit indices ``idx`` (..., 16,
    R / 2) (the 2-bit fields of each row's metadata string in order: chunk c's two indices are
    entries 2c and 2c + 1). Returns (..., 16, K / 2) int32.

    16- and 8-bit elements: element j is unit ``2 (j // 2) + j % 2`` and lands at
    ``4 (j // 2) + idx``; 4-bit: the pair of elements j = 2v, 2v + 1 is unit v; tf32: element j
    is the two units of chunk j and lands at ``2 j + idx[2j] // 2`` (the valid nibbles 0b0100 and
    0b1110 name its first or second position)."""
    idx = idx.astype(xp.int32)
    nu = idx.shape[-1]
    v = xp.arange(nu, dtype=xp.int32)
    units = 4 * (v // 2) + idx  # dense unit of compressed unit v
    if bits in (16, 8):
        return units
    if bits == 4:
        return xp.stack([2 * units, 2 * units + 1], axis=-1).reshape(idx.shape[:-1] + (2 * nu,))
    return v[::2] + idx[..., ::2] // 2  # tf32: v[::2] = 2j


def tf32_halves(idx, xp=np):
    """tf32: the 16-bit halves of B that element j of the compressed A multiplies, from the unit
    indices ``idx`` (..., 16, R / 2): (..., 16, K / 2, 2) indices (low, high) into B's halves
    (half ``2 k + h`` is the low (h = 0) or high half of row k). Chunk j's indices name two of the
    four halves of rows 2j and 2j + 1: the first gives the low half of the B value, the second its
    high half (measured, H100 and H200: the valid chunks 0b0100 and 0b1110 read row 2j or 2j + 1
    whole; any other chunk assembles a value from two halves)."""
    idx = idx.astype(xp.int32)
    j4 = 4 * xp.arange(idx.shape[-1] // 2, dtype=xp.int32)
    return xp.stack([j4 + idx[..., 0::2], j4 + idx[..., 1::2]], axis=-1)
