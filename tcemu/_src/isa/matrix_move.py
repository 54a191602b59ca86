"""ldmatrix / stmatrix as pure functions over a warp's registers, each lane supplying a row address.

Contracts (public)::

    ldmatrix: f(regs, mem, *, dst, addrs) -> regs
    stmatrix: f(mem, regs, *, src, addrs) -> mem

``addrs`` is a (32,) integer array of byte addresses: lanes 8i..8i+7 give the rows of matrix i
(only the first 8 * num lanes are read). Rows are 16 bytes and must be 16-byte aligned; they need
not be contiguous. ``mem`` stands for shared memory. stmatrix is ldmatrix inverted: both are
driven by the same layout table (``tcemu/_src/layouts/mma.py``, ``MATRIX_MOVE``).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from tcemu._src import memory as memmod
from tcemu._src.arch import Arch
from tcemu._src.isa.parse import MatrixMove
from tcemu._src.isa.wmma import (Instruction, check_mem, check_regs, pack_values, register_indices,
                                 unpack_values)
from tcemu._src.layouts.fragment import Fragment
from tcemu._src.layouts.mma import MATRIX_MOVE


def matrix_move_fragment(ins: MatrixMove) -> Fragment:
    key = (ins.shape, ins.trans)
    if key not in MATRIX_MOVE:
        raise NotImplementedError(
            f"{ins.spelling!r}: the register layout of ldmatrix .{ins.shape} .{ins.etype} (sm_100a) is given "
            "only by a figure of the PTX ISA that tcemu has not pinned down; m8n8 .b16 (ld/st) and "
            "stmatrix .m16n8 .trans .b8 are available")
    lb, vb = MATRIX_MOVE[key]
    bits = 16 if ins.etype == "b16" else 8
    rows, cols = 8 * ins.num, 128 // bits
    vb = vb + tuple((8 << i, 0) for i in range(ins.num.bit_length() - 1))  # register i: matrix i
    return Fragment(rows, cols, bits, ins.num, lb, vb, "PTX ISA ldmatrix/stmatrix")


class MatrixMove_(Instruction):
    def __init__(self, ins: MatrixMove, arch: Arch):
        super().__init__(ins, arch)
        if arch.sm < ins.min_sm:
            raise ValueError(f"{ins.spelling!r} requires sm_{ins.min_sm} or newer "
                             f"({'sm_100a' if ins.min_sm == 100 else ''}), not {arch}")
        self.fragment = matrix_move_fragment(ins)
        self.nregs = ins.num
        self.bits = self.fragment.bits
        name = "dst" if ins.op == "ld" else "src"
        self._name = name
        self._impl = jax.jit(self._ld if ins.op == "ld" else self._st, static_argnames=("regidx",))

    def _addresses(self, addrs):
        f = self.fragment
        rows = jnp.asarray(addrs, jnp.int32)[jnp.asarray(f.coords[..., 0])]
        return rows + jnp.asarray(f.coords[..., 1] * (self.bits // 8), jnp.int32)

    def _ld(self, regs, mem, addrs, regidx):
        vals = memmod.read(mem, self._addresses(addrs), 0, self.bits)
        return regs.at[:, list(regidx)].set(pack_values(vals, self.fragment))

    def _st(self, mem, regs, addrs, regidx):
        vals = unpack_values(regs[:, list(regidx)], self.fragment)
        return memmod.write(mem, self._addresses(addrs), 0, vals, self.bits)

    def _check(self, regs, mem, idx, addrs):
        sp = self.spelling
        check_regs(sp, regs)
        mem = check_mem(sp, mem)
        idx = register_indices(sp, self._name, idx, self.nregs, jnp.shape(regs))
        if jnp.shape(addrs) != (32,):
            raise ValueError(f"{sp}: addrs must be a (32,) array of byte addresses (one per lane), "
                             f"got shape {jnp.shape(addrs)}")
        try:
            a = np.asarray(addrs)[: 8 * self.nregs].astype(np.int64)
        except (jax.errors.ConcretizationTypeError, jax.errors.TracerArrayConversionError):
            return mem, idx
        bad = np.flatnonzero(a % 16)
        if bad.size:
            raise ValueError(f"{sp}: row addresses must be 16-byte aligned; lane {int(bad[0])} gives {int(a[bad[0]])}")
        if a.min() < 0 or a.max() + 16 > mem.shape[0]:
            raise IndexError(f"{sp}: a row address is outside the memory of {mem.shape[0]} bytes")
        return mem, idx


class LdMatrix(MatrixMove_):
    """``f(regs, mem, *, dst, addrs) -> regs``."""

    def __call__(self, regs, mem, *, dst, addrs):
        mem, dst = self._check(regs, mem, dst, addrs)
        return self._impl(regs, mem, jnp.asarray(addrs), regidx=dst)


class StMatrix(MatrixMove_):
    """``f(mem, regs, *, src, addrs) -> mem``."""

    def __call__(self, mem, regs, *, src, addrs):
        mem, src = self._check(regs, mem, src, addrs)
        return self._impl(mem, regs, jnp.asarray(addrs), regidx=src)
