"""``wgmma.mma_async`` (sm_90a) layouts as data: a warpgroup's register fragments and the
shared-memory layouts its matrix descriptors describe.

Register fragments (PTX ISA 9.7.15.5.1): warp ``w`` of the warpgroup (lanes ``32 w .. 32 w + 31``)
holds rows ``16 w .. 16 w + 15`` of A and D. Within a warp, A is the ``mma.sync`` m16n8kK A fragment
of its element size, and D repeats the m16n8 C fragment along N: value ``i`` of a lane with
``g = lane / 4``, ``q = lane % 4`` is row ``g + 8 ((i / 2) % 2)``, column ``2 q + i % 2 + 8 (i / 4)``
(CuTe ``CLayout_64xN``).

Shared-memory layouts (measured on the H100: 256 random descriptors, every swizzle mode, K- and
MN-major, ``tests/data/wgmma_regs_sm90.npz``; the canonical forms are CuTe's ``make_gmma_desc``).
An operand of R rows (M for A, N for B) and K elements is stored in 16-byte chunks; ``W`` is the
number of 16-byte units of a swizzled row (1 none, 2 for 32B, 4 for 64B, 8 for 128B). Element
``(r, k)`` at byte ``b`` of its K-major row (``b = k * bits / 8``) or of its MN-major column:

* K-major: ``(r % 8) 16 W + (r / 8) SBO + (b / 16 W) LBO + b % 16 W``: LBO steps from one
  16 W-byte atom of K to the next, so a dense wgmma (32 bytes of K) reads it only without swizzle;
  a sparse one (64 bytes of B's K) with no swizzle or a 32B swizzle (measured on an H200,
  ``tests/data/wgmma_sp_sm90.npz``);
* MN-major (16-bit types, ``tnsp`` = 1), with ``j`` the 16-byte chunk of row ``r``'s bytes along
  MN: without swizzle ``(k % 8) 16 + j SBO + (k / 8) LBO``; swizzled
  ``(k % 8) 16 W + (j % W) 16 + (j / W) LBO + (k / 8) SBO``.

The byte address is ``start + offset``, then swizzled: bits 4.. of the 16-byte unit are XORed with
``((address >> 7) - base_offset) mod W`` (measured: the base offset is subtracted from the row
phase, so a start address that is not aligned to the 8-row pattern takes
``base_offset = (start >> 7) % 8``, as the PTX ISA prescribes).
"""
from __future__ import annotations

import numpy as np

from tcemu._src.layouts.mma import MMA

SWIZZLES = ("none", "128B", "64B", "32B")  # by the descriptor's 2-bit code (bits 62-63)
UNITS = {"none": 1, "32B": 2, "64B": 4, "128B": 8}  # 16-byte units per swizzled row
WARP_ROWS = ((16, 0), (32, 0))  # lane bits 5 and 6: the warp, 16 rows each
# descriptor fields: (name, first bit, width, unit); addresses and offsets are stored >> 4
DESCRIPTOR_FIELDS = (("start", 0, 14, 16), ("lbo", 16, 14, 16), ("sbo", 32, 14, 16), ("base_offset", 49, 3, 1),
                     ("swizzle", 62, 2, 1))
A_SHAPE = {16: "m16n8k16", 8: "m16n8k32", 32: "m16n8k8", 1: "m16n8k256"}  # per-warp A fragment by bits


def a_fragment_bases(bits: int):
    """(lane bases, value bases) of the A register fragment of ``m64nNkK`` for ``bits``-bit A."""
    lb, vb = MMA[(A_SHAPE[bits], "a", bits)]
    return lb + WARP_ROWS, vb


def d_fragment_bases(n: int):
    """(lane bases, value bases) of the D fragment of ``m64nN`` (N/2 values a lane; the value bases
    span the next power of two)."""
    lb, vb = MMA[("m16n8", "c", 32)]
    blocks = max(int(np.ceil(np.log2(n // 8))), 0) if n > 8 else 0
    return lb + WARP_ROWS, vb + tuple((0, 8 << i) for i in range(blocks))


def smem_offsets(rows: int, k: int, bits: int, mn_major: bool, swizzle: str, lbo: int, sbo: int):
    """int64 (rows, k) byte offsets, before the swizzle, of the first byte holding element (r, k)
    of a ``bits``-bit operand (sub-byte elements: their byte; see the module docstring)."""
    W = UNITS[swizzle]
    r = np.arange(rows, dtype=np.int64)[:, None]
    kk = np.arange(k, dtype=np.int64)[None, :]
    if not mn_major:
        b = kk * bits // 8
        return (r % 8) * 16 * W + (r // 8) * sbo + (b // (16 * W)) * lbo + b % (16 * W)
    rb = r * bits // 8
    j, w = rb // 16, rb % 16
    if swizzle == "none":
        return (kk % 8) * 16 + j * sbo + (kk // 8) * lbo + w
    return (kk % 8) * 16 * W + (j % W) * 16 + (j // W) * lbo + (kk // 8) * sbo + w


def swizzle_address(addr, swizzle: str, base_offset: int):
    """Byte addresses after the swizzle of the 16-byte unit (numpy int64)."""
    W = UNITS[swizzle]
    if W == 1:
        return addr
    return addr ^ ((((addr >> 7) - base_offset) & (W - 1)) << 4)
