"""Fragments: which lane and register of a warp holds which element of an MMA operand, and the
moves between a warp's registers and whole matrices.

A fragment (:class:`~tcemu._src.layouts.fragment.Fragment`) of a ``wmma`` operand is the measured
(sm_75+) or published (sm_70) layout of :mod:`tcemu._src.layouts.wmma`; an ``mma.sync`` operand's
is the one the PTX ISA specifies (:mod:`tcemu._src.layouts.mma`). Registers are ``(32, nregs)``
``uint32`` (lane x register), element bits packed from the least significant end; a 64-bit element
takes two registers, low word first.
"""
from __future__ import annotations

import functools

import jax.numpy as jnp
import numpy as np

from tcemu._src.arch import Arch
from tcemu._src.formats import ELEMENT_BITS
from tcemu._src.isa import wmma_spec as S
from tcemu._src.isa.instructions import Mma, Unsupported
from tcemu._src.layouts import wmma as wmma_layouts
from tcemu._src.layouts.fragment import Fragment

_U32 = jnp.uint32


def wmma_fragment(arch: Arch, shape: str, matrix: str, etype: str, layout: str) -> Fragment:
    """The measured (sm_75+) or published (sm_70) fragment of one wmma operand."""
    mat = "c" if matrix == "d" else matrix
    rows, cols = S.matrix_dims(shape, mat)
    nregs = S.FRAGMENT_REGS[(shape, mat, etype)]
    if arch.sm < 75:
        key = (shape, mat, etype, layout)
        if key not in wmma_layouts.SM70:
            raise ValueError(f"no Volta (sm_70) wmma layout for {shape} {mat} .{etype}")
        lb, vb = wmma_layouts.SM70[key]
        src = "sm_70 (published: PTX m8n8k4 + Raihan et al. 2019, checked against ptxas 12.4)"
    else:
        lb, vb = wmma_layouts.SM75[(shape, mat, etype)]
        src = "sm_75+ (measured on H200)"
    return Fragment(rows, cols, ELEMENT_BITS[etype], nregs, lb, vb, src)


def _first_holders(frag: Fragment):
    """For every element (row, col): the first (lane, value) holding it."""
    flat = (frag.coords[..., 0] * frag.cols + frag.coords[..., 1]).ravel()
    _, first = np.unique(flat, return_index=True)
    lane, v = np.divmod(first, frag.nvalues)
    return lane.reshape(frag.rows, frag.cols), v.reshape(frag.rows, frag.cols)


@functools.lru_cache(maxsize=None)
def _transpose_plan(frag: Fragment):
    """When every lane and value basis of ``frag`` is a distinct power of two in the row or the
    column (no copies), moving between registers and the matrix is a transpose: the (lanes,
    values) array, values padded to the span of their bases, seen as one axis of length 2 per
    index bit, permuted to the row bits then the column bits. Returns (permutation, padded rows,
    padded columns), or None for the other fragments."""
    bases = list(frag.value_bases) + list(frag.lane_bases)  # index bit i of lane * V + value
    rows, cols = [], []
    for i, (r, c) in enumerate(bases):
        if (r == 0) == (c == 0) or (r | c) & ((r | c) - 1):
            return None
        (rows if r else cols).append((r or c, i))
    for axis in (rows, cols):
        if sorted(v for v, _ in axis) != [1 << j for j in range(len(axis))]:
            return None
    n = len(bases)
    order = [i for _, i in sorted(rows, reverse=True)] + [i for _, i in sorted(cols, reverse=True)]
    return tuple(n - 1 - i for i in order), 1 << len(rows), 1 << len(cols)


def fragment_to_matrix(words, frag: Fragment):
    """(lanes, nregs) uint32 fragment registers -> (rows, cols) element bits (uint32, or (lo, hi))."""
    plan = _transpose_plan(frag) if frag.bits <= 32 else None
    if plan is not None:
        perm, R, C = plan
        vals = unpack_values(words, frag)
        span = 1 << len(frag.value_bases)
        if span > frag.nvalues:
            vals = jnp.pad(vals, ((0, 0), (0, span - frag.nvalues)))
        return vals.reshape((2,) * len(perm)).transpose(perm).reshape(R, C)[:frag.rows, :frag.cols]
    lane, v = _first_holders(frag)
    if frag.bits == 64:
        return words[lane, 2 * v], words[lane, 2 * v + 1]
    reg, slot = np.divmod(v, frag.per_reg)
    val = words[lane, reg] >> (slot * frag.bits).astype(np.uint32)
    return val & _U32((1 << frag.bits) - 1) if frag.bits < 32 else val


def matrix_to_fragment(vals, frag: Fragment):
    """(rows, cols) element bits (uint32, or (lo, hi) for 64-bit) -> (lanes, nregs) registers."""
    plan = _transpose_plan(frag) if frag.bits <= 32 else None
    if plan is not None:
        perm, R, C = plan
        x = jnp.pad(jnp.asarray(vals), ((0, R - frag.rows), (0, C - frag.cols)))
        x = x.reshape((2,) * len(perm)).transpose(np.argsort(perm)).reshape(frag.lanes, -1)
        return pack_values(x[:, :frag.nvalues], frag)
    r, c = frag.coords[..., 0], frag.coords[..., 1]
    if frag.bits == 64:
        return pack_values((vals[0][r, c], vals[1][r, c]), frag)
    return pack_values(vals[r, c], frag)


def pack_values(vals, frag: Fragment):
    """(lanes, nvalues) element bits (or a (lo, hi) pair for 64-bit) -> (lanes, nregs) registers."""
    if frag.bits == 64:
        return jnp.stack(vals, -1).reshape(frag.lanes, frag.nregs)
    per = frag.per_reg
    v = vals.reshape(frag.lanes, frag.nregs, per).astype(_U32)
    if frag.bits < 32:
        v = v & _U32((1 << frag.bits) - 1)
    shifts = jnp.asarray(np.arange(per, dtype=np.uint32) * frag.bits)
    return jnp.sum(v << shifts, axis=-1, dtype=_U32)  # disjoint bit fields: sum == or


def unpack_values(words, frag: Fragment):
    """(lanes, nregs) registers -> (lanes, nvalues) element bits (or a (lo, hi) pair for 64-bit)."""
    if frag.bits == 64:
        w = words.reshape(frag.lanes, frag.nvalues, 2)
        return w[..., 0], w[..., 1]
    shifts = jnp.asarray(np.arange(frag.per_reg, dtype=np.uint32) * frag.bits)
    v = words[:, :, None] >> shifts
    return (v & _U32((1 << frag.bits) - 1) if frag.bits < 32 else v).reshape(frag.lanes, frag.nvalues)


@functools.lru_cache(maxsize=None)
def mma_sync_fragments(ins: Mma):
    """PTX-specified mma.sync fragments (A, B, C, D) of ``ins``."""
    from tcemu._src.layouts.mma import MMA, QUAD_PAIR

    bits = ELEMENT_BITS
    if ins.shape == "m8n8k4" and ins.atype == "f16":
        mk = lambda key, rows, cols, b, nregs: Fragment(rows, cols, b, nregs, *QUAD_PAIR[key],  # noqa: E731
                                                        "PTX ISA mma.m8n8k4 .f16 (4 quad-pair MMAs)")
        return (mk(("a", ins.alayout), 32, 4, 16, 2), mk(("b", ins.blayout), 4, 32, 16, 2),
                mk(("c", ins.ctype), 32, 8, bits[ins.ctype], 4 if ins.ctype == "f16" else 8),
                mk(("c", ins.dtype), 32, 8, bits[ins.dtype], 4 if ins.dtype == "f16" else 8))
    cshape = f"m{ins.m}n{ins.n}"
    if ins.family == "mxf4":  # packed e2m1: two per byte, the s4 layout of m16n8k64
        bits = {**bits, "e2m1": 4}
    out = []
    for mat, et, key in (("a", ins.atype, (ins.shape, "a", bits[ins.atype])),
                         ("b", ins.btype, (ins.shape, "b", bits[ins.btype])),
                         ("c", ins.ctype, (cshape, "c", bits[ins.ctype])),
                         ("c", ins.dtype, (cshape, "c", bits[ins.dtype]))):
        if key not in MMA:
            raise Unsupported(f"{ins.spelling!r}: no register-level layout for {key} yet "
                                      "(mma.sync .m8n8k4 .f16 and f64 .m16n8kK are value level only)")
        lb, vb = MMA[key]
        rows, cols = {"a": (ins.m, ins.k), "b": (ins.k, ins.n), "c": (ins.m, ins.n)}[mat]
        nvals = 1 << len(vb)
        nregs = nvals * bits[et] // 32 if bits[et] <= 32 else 2 * nvals
        out.append(Fragment(rows, cols, bits[et], nregs, lb, vb, "PTX ISA mma.sync fragments"))
    return tuple(out)


@functools.lru_cache(maxsize=None)
def wmma_mma_fragments(arch: Arch, ins: Mma):
    return (wmma_fragment(arch, ins.shape, "a", ins.atype, ins.alayout),
            wmma_fragment(arch, ins.shape, "b", ins.btype, ins.blayout),
            wmma_fragment(arch, ins.shape, "c", ins.ctype, "row"),
            wmma_fragment(arch, ins.shape, "c", ins.dtype, "row"))
