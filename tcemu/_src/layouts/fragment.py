"""Fragment layouts: which lane and register of a warp holds which element of a matrix.

A :class:`Fragment` is a *linear layout* over GF(2), the representation Triton uses for its
``LinearLayout``: every bit of the lane index (0..31 for a warp, 0..63 for an AMD wavefront, 0..127 for a Hopper
warpgroup, whose lane ``32 w + l`` is lane ``l`` of warp ``w``) and of the value index contributes a fixed
(row, col) offset, combined with XOR (for the tensor-core layouts the offsets are disjoint powers
of two, so XOR is plain addition). A zero offset means the element is replicated along that bit.

The value index ``v`` numbers the elements a lane holds in register order: element ``v`` of an
``e``-bit type (``e <= 32``) is bits ``[(v % per) * e, (v % per + 1) * e)`` of fragment register
``v // per`` with ``per = 32 // e`` (element 0 in the least significant bits); a 64-bit element
``v`` occupies registers ``2v`` (low word) and ``2v + 1`` (high word). A lane may hold fewer values
than the value bases span (wgmma ``m64n24``: 12 of 16): the first ``nvalues`` are its elements.

Example: the mma.sync m16n8k16 f16 A fragment (PTX ISA 9.7.14.5.8)::

    >>> from tcemu._src.layouts.fragment import Fragment
    >>> frag = Fragment(16, 16, 16, 4, lane_bases=((0, 2), (0, 4), (1, 0), (2, 0), (4, 0)),
    ...                 value_bases=((0, 1), (8, 0), (0, 8)))
    >>> frag.coords[5, 1].tolist()       # lane 5, value 1: row 1, column 3
    [1, 3]
"""
from __future__ import annotations

import dataclasses
import functools

import numpy as np

Basis = tuple[tuple[int, int], ...]


@dataclasses.dataclass(frozen=True)
class Fragment:
    """The (lane, value) -> (row, col) map of one instruction operand of a ``rows x cols`` matrix
    of ``bits``-bit elements held in ``nregs`` 32-bit registers per lane, over a warp (5 lane
    bases) or a warpgroup (7)."""

    rows: int
    cols: int
    bits: int
    nregs: int
    lane_bases: Basis
    value_bases: Basis
    source: str = ""

    def __post_init__(self):
        if len(self.lane_bases) not in (5, 6, 7):
            raise ValueError("a fragment needs 5 lane bases (a warp), 6 (a wavefront) or 7 (a warpgroup)")
        if not self.nvalues <= 1 << len(self.value_bases) < 2 * self.nvalues:
            raise ValueError(f"{len(self.value_bases)} value bases for {self.nvalues} values")

    @property
    def lanes(self) -> int:
        """32 (a warp), 64 (a wavefront) or 128 (a warpgroup)."""
        return 1 << len(self.lane_bases)

    @property
    def per_reg(self) -> int:
        """Elements per 32-bit register (0 for 64-bit elements)."""
        return 32 // self.bits if self.bits <= 32 else 0

    @property
    def nvalues(self) -> int:
        return self.nregs * 32 // self.bits if self.bits <= 32 else self.nregs // 2

    @functools.cached_property
    def coords(self) -> np.ndarray:
        """int32 (lanes, nvalues, 2): the (row, col) of every (lane, value)."""
        out = np.zeros((self.lanes, self.nvalues, 2), np.int32)
        lanes = np.arange(self.lanes)[:, None]
        vals = np.arange(self.nvalues)[None, :]
        for i, (r, c) in enumerate(self.lane_bases):
            bit = (lanes >> i) & 1
            out[..., 0] ^= bit * r
            out[..., 1] ^= bit * c
        for i, (r, c) in enumerate(self.value_bases):
            bit = (vals >> i) & 1
            out[..., 0] ^= bit * r
            out[..., 1] ^= bit * c
        if out[..., 0].max() >= self.rows or out[..., 1].max() >= self.cols:
            raise ValueError("layout maps outside the matrix")
        return out

    @functools.cached_property
    def copies(self) -> int:
        """How many (lane, value) slots hold each element (replication factor)."""
        n = np.bincount((self.coords[..., 0] * self.cols + self.coords[..., 1]).ravel(),
                        minlength=self.rows * self.cols)
        if n.min() != n.max():
            raise ValueError("elements are replicated unevenly")
        return int(n[0])

    def slot_table(self) -> np.ndarray:
        """int32 (lanes, nregs, slots): row-major element index held by every register slot, in the
        format of the hardware capture (64-bit elements: ``2 * index + word``; -1: unused)."""
        flat = self.coords[..., 0] * self.cols + self.coords[..., 1]
        if self.bits == 64:
            return np.stack([2 * flat, 2 * flat + 1], -1).reshape(self.lanes, self.nregs, 1)
        return flat.reshape(self.lanes, self.nregs, self.per_reg)
