"""ldmatrix / stmatrix as pure functions over a warp's registers, each lane supplying a row address.

Contracts (public)::

    ldmatrix: f(regs, mem, *, dst, addrs) -> regs
    stmatrix: f(mem, regs, *, src, addrs) -> mem

``addrs`` is a (32,) integer array of byte addresses: lanes 8i..8i+7 give the rows of matrix i
(only the first 8 * num lanes are read). Rows are 16 bytes and must be 16-byte aligned; they need
not be contiguous. ``mem`` stands for shared memory. Concrete addresses are checked; traced ones
cannot be: bytes outside ``mem`` then read as zero / are dropped. stmatrix is ldmatrix inverted:
both are driven by the same layout table (``tcemu/_src/layouts/mma.py``, ``MATRIX_MOVE``).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from tcemu._src import memory as memmod
from tcemu._src.arch import Arch
from tcemu._src.isa.fragments import pack_values, unpack_values
from tcemu._src.isa.instructions import MatrixMove, Unsupported
from tcemu._src.isa.registers import Instruction, check_regs, read_regs, register_indices, write_regs
from tcemu._src.layouts.fragment import Fragment
from tcemu._src.layouts.mma import MATRIX_MOVE


def matrix_move_fragment(ins: MatrixMove) -> Fragment:
    key = (ins.shape, ins.trans)
    if key not in MATRIX_MOVE:
        raise Unsupported(
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

    def _rows_cols(self, addrs):
        """Per (lane, value): the row address of its element (traced) and its column (static)."""
        f = self.fragment
        return jnp.asarray(addrs)[jnp.asarray(f.coords[..., 0])], f.coords[..., 1]

    def _ld(self, regs, mem, addrs, regidx):
        rows, cols = self._rows_cols(addrs)
        vals = memmod.read(mem, rows, 0, cols, 0, self.bits)
        return write_regs(regs, regidx, pack_values(vals, self.fragment))

    def _st(self, mem, regs, addrs, regidx):
        rows, cols = self._rows_cols(addrs)
        vals = unpack_values(read_regs(regs, regidx), self.fragment)
        return memmod.write(mem, rows, 0, cols, 0, vals, self.bits)

    def _check(self, regs, mem, idx, addrs):
        """Checked (regs, mem, register indices, addrs); concrete addrs come back as int32 with the
        lanes that are not read set to 0."""
        sp = self.spelling
        regs = check_regs(sp, regs)
        mem = memmod.check_mem(mem, sp)
        idx = register_indices(sp, self._name, idx, self.nregs, regs.shape[1])
        if not isinstance(addrs, (jax.Array, np.ndarray)):
            try:
                addrs = np.asarray(addrs)
            except (TypeError, ValueError, OverflowError):
                raise TypeError(f"{sp}: addrs must be a (32,) integer array of byte addresses, "
                                f"got {type(addrs).__name__}") from None
        if not np.issubdtype(addrs.dtype, np.integer):
            raise TypeError(f"{sp}: addrs must be a (32,) integer array of byte addresses (one per lane), "
                            f"got dtype {addrs.dtype}")
        if addrs.shape != (32,):
            raise ValueError(f"{sp}: addrs must be a (32,) array of byte addresses (one per lane), "
                             f"got shape {tuple(addrs.shape)}")
        try:
            a = np.asarray(addrs).astype(object)[: 8 * self.nregs]
        except (jax.errors.ConcretizationTypeError, jax.errors.TracerArrayConversionError):
            return regs, mem, idx, addrs
        bad = [lane for lane, x in enumerate(a) if x % 16]
        if bad:
            raise ValueError(f"{sp}: row addresses (addrs) must be 16-byte aligned; lane {bad[0]} gives {a[bad[0]]}")
        bad = [lane for lane, x in enumerate(a) if not 0 <= x <= mem.shape[0] - 16]
        if bad:
            raise IndexError(f"{sp}: addrs[{bad[0]}]={a[bad[0]]}: its 16-byte row is outside the memory of "
                             f"{mem.shape[0]} bytes")
        used = np.zeros(32, np.int32)
        used[: 8 * self.nregs] = a
        return regs, mem, idx, used


class LdMatrix(MatrixMove_):
    """``f(regs, mem, *, dst, addrs) -> regs``."""

    def __call__(self, regs, mem, *, dst, addrs):
        regs, mem, dst, addrs = self._check(regs, mem, dst, addrs)
        return self._impl(regs, mem, addrs, regidx=dst)


class StMatrix(MatrixMove_):
    """``f(mem, regs, *, src, addrs) -> mem``."""

    def __call__(self, mem, regs, *, src, addrs):
        regs, mem, src, addrs = self._check(regs, mem, src, addrs)
        return self._impl(mem, regs, addrs, regidx=src)
