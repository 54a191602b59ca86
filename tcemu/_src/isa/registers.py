"""Operand checks shared by the register-level instructions: the register file ``regs`` (a
``(32, nregs)`` ``uint32`` array, lane x register), the register indices that name a fragment's
registers in PTX order (``{x0, x1, ...}``), and :class:`Instruction`, the base of every
jit-compiled instruction that :func:`tcemu.ptx` returns.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from tcemu._src import memory as memmod
from tcemu._src.arch import Arch


def register_index(i):
    """``i`` as an int if it is a concrete integer (Python, NumPy or 0-d array), else None."""
    if memmod.is_integer_value(i):
        return int(i)
    if isinstance(i, (jax.Array, np.ndarray)) and i.ndim == 0 and np.issubdtype(i.dtype, np.integer):
        return memmod.concrete_int(i)
    return None


def register_indices(spelling, name, idx, n, nregs):
    """Validated register indices (a tuple of ints) of a fragment of ``n`` registers out of ``nregs``."""
    if isinstance(idx, (str, bytes)) or not hasattr(idx, "__iter__"):
        raise TypeError(f"{spelling}: {name}= must be a sequence of integer register indices, got {idx!r}")
    t = []
    for i in idx:
        v = register_index(i)
        if v is None:
            raise TypeError(f"{spelling}: {name}= must hold concrete integer register indices, "
                            f"got {i!r} ({type(i).__name__})")
        t.append(v)
    if len(t) != n:
        raise ValueError(f"{spelling}: {name}= needs {n} registers for this fragment, got {len(t)}")
    bad = [i for i in t if not 0 <= i < nregs]
    if bad:
        raise ValueError(f"{spelling}: {name}= registers {bad} out of range 0..{nregs - 1}")
    if len(set(t)) != len(t):
        raise ValueError(f"{spelling}: {name}= names a register twice: {tuple(t)}")
    return tuple(t)


def read_regs(regs, idx: tuple[int, ...]):
    """``regs[:, idx]``: a slice when the indices are consecutive (no gather)."""
    if idx == tuple(range(idx[0], idx[0] + len(idx))):
        return regs[:, idx[0]:idx[0] + len(idx)]
    return regs[:, list(idx)]


def write_regs(regs, idx: tuple[int, ...], values):
    """``regs`` with ``regs[:, idx] = values``: an update of a slice when the indices are
    consecutive (no scatter)."""
    if idx == tuple(range(idx[0], idx[0] + len(idx))):
        a, b = idx[0], idx[0] + len(idx)
        return jnp.concatenate([regs[:, :a], jnp.asarray(values, regs.dtype), regs[:, b:]], axis=1)
    return regs.at[:, list(idx)].set(values)


def check_regs(spelling, regs, lanes: int = 32):
    """``regs`` as a (lanes, nregs) uint32 JAX array (32: a warp, 64: an AMD wavefront, 128: a
    warpgroup), or a clear error naming it."""
    what = {32: "warps", 64: "wavefronts"}.get(lanes, "warpgroups")
    make = "tcemu.regfile" if lanes == 32 else f"tcemu.regfile(nregs, lanes={lanes})"
    if not isinstance(regs, (jax.Array, np.ndarray)):
        raise TypeError(f"{spelling}: regs must be a ({lanes}, nregs) uint32 array ({make}), "
                        f"got {type(regs).__name__}")
    if regs.dtype != np.uint32:
        raise TypeError(f"{spelling}: regs must be uint32 ({make}), got dtype {regs.dtype}")
    if regs.ndim != 2 or regs.shape[0] != lanes or regs.shape[1] < 1:
        raise ValueError(f"{spelling}: regs must have shape ({lanes}, nregs) (use jax.vmap for many {what}), "
                         f"got {tuple(regs.shape)}")
    return jnp.asarray(regs)


class Instruction:
    def __init__(self, ins, arch: Arch):
        self.ins = ins
        self.arch = arch
        self.spelling = ins.spelling

    def __repr__(self):
        return f"<tcemu {self.spelling} arch={self.arch}>"
