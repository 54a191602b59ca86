"""wmma.load / wmma.store.d / wmma.mma as pure, jit-compiled functions over a warp's registers.

A warp's registers are a ``uint32`` array ``regs`` of shape ``(32, nregs)`` (lane x register);
memory is a 1-D ``uint8`` array. Contracts (public)::

    load:  f(regs, mem, *, dst, p, stride=None) -> regs
    store: f(mem, regs, *, src, p, stride=None) -> mem
    mma:   f(regs, *, d, a, b, c) -> regs

``dst``/``src``/``a``/``b``/``c``/``d`` are register indices in fragment order (PTX ``{x0, ...}``);
a ``.f64`` element takes two consecutive registers, low word first. ``p`` (byte address) and
``stride`` (elements) may be traced. Concrete values are checked against the PTX alignment rules
("Matrix Storage for WMMA") and against the size of ``mem``; traced values cannot be checked:
misaligned addresses are then used as given, and out-of-range bytes read as zero / are dropped.
The MMAs live in :mod:`tcemu._src.isa.mma_regs` and the fragments in :mod:`tcemu._src.isa.fragments`;
both are re-exported here.
"""
from __future__ import annotations

import jax

from tcemu._src import memory as memmod
from tcemu._src.formats import ELEMENT_BITS
from tcemu._src.isa import wmma_spec as S
from tcemu._src.isa.fragments import (
    fragment_to_matrix, matrix_to_fragment, mma_sync_fragments, pack_values, unpack_values, wmma_fragment,
    wmma_mma_fragments)
from tcemu._src.isa.instructions import WmmaLoad, WmmaStore
from tcemu._src.isa.mma_regs import MmaBlockScaleRegs, MmaRegs
from tcemu._src.isa.registers import Instruction, check_regs, read_regs, register_indices, write_regs
from tcemu._src.isa.targets import check_arch

# the fragments and the register-level MMAs are re-exported: importers take them from isa.wmma
__all__ = ["Instruction", "MmaBlockScaleRegs", "MmaRegs", "WmmaLoad_", "WmmaStore_", "check_regs",
           "fragment_to_matrix", "matrix_to_fragment", "mma_sync_fragments", "pack_values", "register_indices",
           "unpack_values", "wmma_fragment", "wmma_mma_fragments"]


class _WmmaMemoryOp(Instruction):
    """Shared part of wmma.load and wmma.store: fragment, addresses, PTX alignment rules."""

    def __init__(self, ins, arch):
        super().__init__(ins, arch)
        check_arch(ins, arch)
        self.fragment = wmma_fragment(arch, ins.shape, ins.matrix, ins.etype, ins.layout)
        self.bits = ELEMENT_BITS[ins.etype]
        self.default_stride = S.default_stride(ins.shape, ins.matrix, ins.layout)
        # PTX: rows (.row) / columns (.col) start at a multiple of the fragment size. For f16
        # m32n8k16 B.row and m8n32k16 A.col the (4x replicated) fragment is 32 bytes but the default
        # stride is 16 bytes, so the rule is read as: a multiple of min(fragment, default row).
        self.alignment = min(S.fragment_bytes(ins.shape, ins.matrix, ins.etype),
                             self.default_stride * self.bits // 8)
        self.nregs = self.fragment.nregs

    def _check_address(self, mem, p, stride):
        """Types, stride >= default, alignment (Matrix Storage for WMMA) and the memory's bounds.
        Returns (p, stride), concrete ints where known."""
        sp = self.spelling
        fb = self.alignment
        p = memmod.scalar_int(p, "p", sp)
        stride = self.default_stride if stride is None else memmod.scalar_int(stride, "stride", sp)
        if isinstance(p, int) and p < 0:
            raise IndexError(f"{sp}: p={p} is a negative address")
        if isinstance(p, int) and p % fb:
            raise ValueError(f"{sp}: p={p} must be a multiple of {fb} bytes (row alignment of this fragment)")
        rows, cols = self.fragment.rows, self.fragment.cols
        if isinstance(stride, int):
            if stride < self.default_stride:
                raise ValueError(f"{sp}: stride={stride} is below the default {self.default_stride} "
                                 "(the minimum; smaller is undefined in PTX)")
            if (stride * self.bits) % (8 * fb):
                raise ValueError(f"{sp}: stride={stride} elements ({stride * self.bits / 8:g} bytes) must be a "
                                 f"multiple of {fb} bytes (row alignment of this fragment)")
            memmod.check_range(mem, p, memmod.extent_bytes(rows, cols, self.bits, self.ins.layout, stride), sp)
        else:  # traced stride: at least the first row (column) is read
            first = (1, cols) if self.ins.layout == "row" else (rows, 1)
            memmod.check_range(mem, p, memmod.extent_bytes(*first, self.bits, self.ins.layout, 0), sp)
        return p, stride

    def _lead_inner(self):
        r, c = self.fragment.coords[..., 0], self.fragment.coords[..., 1]
        return memmod.lead_inner(r, c, self.ins.layout)


class WmmaLoad_(_WmmaMemoryOp):
    """``f(regs, mem, *, dst, p, stride=None) -> regs``."""

    def __init__(self, ins: WmmaLoad, arch):
        super().__init__(ins, arch)
        self._impl = jax.jit(self._load, static_argnames=("dst",))

    def _load(self, regs, mem, p, stride, dst):
        vals = memmod.read(mem, p, *self._lead_inner(), stride, self.bits)
        return write_regs(regs, dst, pack_values(vals, self.fragment))

    def __call__(self, regs, mem, *, dst, p, stride=None):
        regs = check_regs(self.spelling, regs)
        mem = memmod.check_mem(mem, self.spelling)
        dst = register_indices(self.spelling, "dst", dst, self.nregs, regs.shape[1])
        p, stride = self._check_address(mem, p, stride)
        return self._impl(regs, mem, p, stride, dst=dst)


class WmmaStore_(_WmmaMemoryOp):
    """``f(mem, regs, *, src, p, stride=None) -> mem``."""

    def __init__(self, ins: WmmaStore, arch):
        super().__init__(ins, arch)
        self._impl = jax.jit(self._store, static_argnames=("src",))

    def _store(self, mem, regs, p, stride, src):
        vals = unpack_values(read_regs(regs, src), self.fragment)
        return memmod.write(mem, p, *self._lead_inner(), stride, vals, self.bits)

    def __call__(self, mem, regs, *, src, p, stride=None):
        regs = check_regs(self.spelling, regs)
        mem = memmod.check_mem(mem, self.spelling)
        src = register_indices(self.spelling, "src", src, self.nregs, regs.shape[1])
        p, stride = self._check_address(mem, p, stride)
        return self._impl(mem, regs, p, stride, src=src)
