"""A K schedule made concrete for one GEMM (:class:`~tcemu._src.gemm.schedule.Plan`), as the
execution steps read it: the K axis laid out instruction by instruction, the chains of
instructions (a slice's promotion groups), and where block scales may be read per block.

    >>> import numpy as np
    >>> from tcemu._src.gemm.plan import chain_layout
    >>> from tcemu._src.gemm.schedule import KSchedule
    >>> g, G, lens = chain_layout(KSchedule(promotion=32).plan(K=80, k=16))
    >>> g, G, lens.tolist()          # 2 instructions per group, 3 groups, the last one short
    (2, 3, [2, 2, 1])
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from tcemu._src.isa.parse import Unsupported


def lay_k(x, plan, axis: int, unit: int = 1):
    """``x`` with its K axis laid out as the plan's instructions read it (zeros where they pad);
    ``unit``: elements of K per entry of ``x`` (scale blocks), which every run must keep whole."""
    pieces = []
    for a, b in plan.runs():
        if a < 0:
            shape = list(x.shape)
            shape[axis] = b // unit
            pieces.append(jnp.zeros(shape, x.dtype))
        else:
            pieces.append(jax.lax.slice_in_dim(x, a // unit, b // unit, axis=axis))
    return pieces[0] if len(pieces) == 1 else jnp.concatenate(pieces, axis=axis)


def chain_layout(plan):
    """The plan's chains: ``g`` instructions per chain (a promotion group, or a whole slice),
    ``G`` chains per slice (the last one padded to ``g``), and ``lens`` (S * G,): how many of its
    instructions each chain runs (slice s, group j at s * G + j)."""
    S, T = plan.slices, plan.steps
    g = plan.group or T
    G = -(-T // g)
    runs = plan.valid.sum(axis=1)[:, None] - g * np.arange(G)[None, :]
    return g, G, np.clip(runs, 0, g).reshape(S * G)


def step_table(plan):
    """(S, G, g) flat instruction indices per slice and chain (-1: padding) and whether each
    runs."""
    S, T = plan.slices, plan.steps
    g, G, _ = chain_layout(plan)
    flat = np.arange(S * T, dtype=np.int32).reshape(S, T)
    tbl = np.full((S, G * g), -1, np.int32)
    tbl[:, :T] = flat
    ok = (tbl >= 0) & np.concatenate([plan.valid, np.zeros((S, G * g - T), bool)], axis=1)
    return tbl.reshape(S, G, g), ok.reshape(S, G, g)


def chain_index(plan):
    """(S * G, g * k) the K element each lane of each chain reads (-1: a zero)."""
    S, T, k = plan.slices, plan.steps, plan.index.shape[2]
    g, G, _ = chain_layout(plan)
    return np.pad(plan.index, ((0, 0), (0, G * g - T), (0, 0)), constant_values=-1).reshape(S * G, g * k)


def check_block_aligned(plan, blk: int, where: str):
    """Block-scaled GEMMs: every run of the K layout starts a scale block in the source and in
    the laid-out K (so each instruction reads whole blocks)."""
    pos = 0
    for a, b in plan.runs():
        length = b if a < 0 else b - a
        if pos % blk or (a >= 0 and a % blk):
            raise Unsupported(f"{where}: this K schedule cuts K across scale blocks of {blk}; block-scaled "
                              "GEMMs take schedules whose k-tiles and slices start at multiples of the block")
        pos += length


def scale_unit(plan, k: int, block: int, group: int | None) -> int:
    """Elements of the laid-out K per scale entry a kernel reads: ``block`` where the
    instructions (``k``), the plan's runs and zero fills and the grouped model's groups
    (``group``) keep scale blocks whole, else 1."""
    group = group or block
    whole = (k % block == 0 and (block % group == 0 or group % block == 0)
             and all(b % block == 0 and (a < 0 or a % block == 0) for a, b in plan.runs()))
    return block if whole else 1


def chain_blocks(plan, K: int, block: int, where: str) -> np.ndarray:
    """(S * G,) the scale block (of ``block`` elements of K) each chain of the plan reads, for
    block scales along K; a chain with no element gets the index ``ceil(K / block)``, a block of
    unit scales. Raises unless every chain stays inside one block."""
    idx = chain_index(plan)
    n_blocks = -(-K // block)
    out = np.full(idx.shape[0], n_blocks, np.int32)
    for c, row in enumerate(idx):
        b = row[row >= 0] // block
        if b.size and b.min() != b.max():
            raise ValueError(f"{where}: chain {c} of this K schedule reads K elements {int(row[row >= 0].min())}.."
                             f"{int(row[row >= 0].max())}, across block scales of {block}; block scales along K need "
                             "promotion groups inside the blocks (promotion dividing the block, k-tiles and slices "
                             "starting at multiples of it)")
        if b.size:
            out[c] = b[0]
    return out


def slice_ranges(plan, k: int):
    """(start, stop) of the K elements of each of the plan's slices, and the one-slice schedule
    that runs every slice's own K range with the same instructions: slice s of the plan is that
    schedule's GEMM over ``K[start:stop]``. Raises unless each slice is one such contiguous range
    (a slice padded at its start, ``slice_pad="start"``, is not)."""
    sched = plan.schedule
    one = sched.replace(slices=1, slice_align=0, slice_pad="end", reduction="sequential", partials="f32",
                        reduce_threads=1, reduce_lanes=0)
    out, start = [], 0
    for s in range(plan.slices):
        idx = plan.index[s][plan.valid[s]]
        live = idx[idx >= 0]
        lo, hi = (int(live.min()), int(live.max()) + 1) if live.size else (start, start)
        sub = one.plan(hi - lo, k)
        want = np.where(sub.index[0][sub.valid[0]] >= 0, sub.index[0][sub.valid[0]] + lo, -1)
        if lo != start or want.shape != idx.shape or (want != idx).any():
            raise ValueError(f"KSchedule {sched.describe()!r}: slice {s} is not one contiguous run of K with its own "
                             "k-tiles (K padded at the start of the slices), which serial split-K's epilogue needs")
        out.append((lo, hi))
        start = hi
    return out, one
