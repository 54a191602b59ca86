"""How a GEMM's partial results combine: promotion groups added into float32 from +0 (with block
scales along K: each group by one FFMA with its scales), and the split-K slices' partials reduced
as the schedule says (in order, pairwise, XLA's shuffle tree, or a Triton reduction over threads
and warps).

Stated once, over an :class:`Arith` (float32 addition, rounding to a partials type, a loop): the
GEMM runs it on bit patterns with the engine's additions in JAX (:data:`JAX`), ``identify``'s
fast path on numpy float32 values (:data:`NUMPY`, IEEE additions: the same bits).

    >>> import numpy as np
    >>> from tcemu._src.gemm.reduce import NUMPY, reduce_parts
    >>> from tcemu._src.gemm.schedule import KSchedule
    >>> parts = np.float32([1e8, 1, -1e8, 1])
    >>> float(reduce_parts(parts, KSchedule(slices=4), NUMPY))   # ((1e8 + 1) - 1e8) + 1
    1.0
    >>> float(reduce_parts(parts, KSchedule(slices=4, reduction="pairwise"), NUMPY))  # (1e8 + 1) + (-1e8 + 1)
    0.0
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from tcemu._src import formats as fm
from tcemu._src.gemm.schedule import SHUFFLE_LANES, KSchedule
from tcemu._src.numerics import engine, fp32


@dataclasses.dataclass(frozen=True)
class Arith:
    """The arithmetic a reduction runs on: ``add`` (float32, round to nearest even), ``narrow``
    (``(x, "f16" | "bf16")``: rounded to that type, RNE, and widened back exactly), ``loop``
    (``(lo, hi, body(i, t) -> t, init)``, as ``jax.lax.fori_loop``), ``map`` (``(f, n)``: the
    stacked ``f(0), ..., f(n - 1)``) and the array module ``xp``."""

    add: Callable
    narrow: Callable
    loop: Callable
    map: Callable
    xp: Any


def _jax_narrow(x, etype: str):
    low = fm.FORMATS[etype]
    return engine.convert(engine.convert(x, fm.F32, low, "rne"), low, fm.F32)


def _numpy_loop(lo, hi, body, init):
    for i in range(lo, hi):
        init = body(i, init)
    return init


_NUMPY_TYPES = {"f16": np.float16, "bf16": ml_dtypes.bfloat16}

# float32 bit patterns (uint32), the engine's additions
JAX = Arith(lambda x, y: engine.add(x, y, fm.F32, "rne"), _jax_narrow, jax.lax.fori_loop,
            lambda f, n: jax.lax.map(f, jnp.arange(n)), jnp)
# numpy float32 values, IEEE additions
NUMPY = Arith(np.add, lambda x, etype: x.astype(_NUMPY_TYPES[etype]).astype(np.float32), _numpy_loop,
              lambda f, n: np.stack([f(i) for i in range(n)]), np)


def combine_chains(chain, plan, zero, ar: Arith, to_f32=lambda x: x, scaled=None):
    """D from the accumulators ``chain(c)`` of the plan's chains (c = slice * G + group, G chains
    per slice; ``to_f32`` widens an accumulator to float32): each slice's promotion groups added
    into float32 from +0 (``scaled``: see :func:`promote`), then the slices' stored partials
    reduced as the schedule says. A sequential reduction holds one partial at a time."""
    sched, S = plan.schedule, plan.slices
    if S == 1:
        return _slice_fn(chain, plan, zero, ar, to_f32, scaled, widen=False)(0)
    raw = _slice_fn(chain, plan, zero, ar, to_f32, scaled)
    if sched.reduction in ("sequential", "serial"):  # one partial alive at a time
        step = ((lambda t, x: ar.add(t, store_partial(x, sched, ar))) if sched.reduction == "sequential"
                else (lambda t, x: _serial_step(t, x, sched, ar)))
        return ar.loop(1, S, lambda s, t: step(t, raw(s)), store_partial(raw(0), sched, ar))
    return reduce_parts(ar.map(lambda s: store_partial(raw(s), sched, ar), S), sched, ar)


def _slice_fn(chain, plan, zero, ar: Arith, to_f32, scaled, widen=True):
    """s -> slice s's partial as it leaves the slice: its chain, or its promotion groups added into
    float32 from +0; in float32 (``widen``) or, one chain, in the accumulator's format."""
    G = -(-plan.steps // (plan.group or plan.steps))

    def one_slice(s):
        if not plan.group:
            return to_f32(chain(s * G)) if widen else chain(s * G)
        step = None if scaled is None else (lambda j, x, total: scaled(s * G + j, x, total))
        return promote(lambda j: to_f32(chain(s * G + j)), G, zero, ar, step)
    return one_slice


def slice_partials(chain, plan, zero, ar: Arith, to_f32=lambda x: x):
    """(S, ...) the float32 partial of each slice of the plan as it leaves the slice (the chains as
    :func:`combine_chains` takes them), for serial split-K's epilogue."""
    return ar.map(_slice_fn(chain, plan, zero, ar, to_f32, None), plan.slices)


def _serial_step(total, part, sched: KSchedule, ar: Arith):
    """Serial split-K: the part added onto the running total, which is stored again."""
    return store_partial(ar.add(total, part), sched, ar)


def promote(chain, groups: int, zero, ar: Arith, scaled=None):
    """Promotion: the float32 results ``chain(j)`` of ``groups`` chains added in order onto +0;
    with ``scaled(j, x, t)`` (block scales along K, :func:`block_scaled`) each result ``x`` enters
    the total ``t`` as that function says."""
    if scaled is None:
        return ar.loop(0, groups, lambda j, t: ar.add(t, chain(j)), zero)
    return ar.loop(0, groups, lambda j, t: scaled(j, chain(j), t), zero)


def block_scaled(order: str, blocks, scale_a, scale_b):
    """The promotion step of block scales along K, ``(c, x, t) -> t'`` for chain ``c`` with the
    float32 result ``x`` (bits) and total ``t``: one FFMA, ``fma(x, sa * sb, t)`` (``order``
    "product"), ``fma(x * sa, sb, t)`` ("sequential") or ``fma(x * sb, sa, t)`` ("sequential_ba"),
    each step rounded to nearest even.
    ``blocks`` (chains,): the scale block of each chain (:func:`~tcemu._src.gemm.plan.chain_blocks`);
    ``scale_a(b)``, ``scale_b(b)``: the float32 scale bits of block ``b`` broadcasting against ``x``."""
    blocks = jnp.asarray(blocks)

    def step(c, x, t):
        b = blocks[c]
        sa, sb = scale_a(b), scale_b(b)
        if order == "product":
            return fp32.fma(x, fp32.mul(sa, sb), t)
        if order == "sequential_ba":
            return fp32.fma(fp32.mul(x, sb), sa, t)
        return fp32.fma(fp32.mul(x, sa), sb, t)
    return step


def store_partial(x, sched: KSchedule, ar: Arith):
    """A slice's float32 partial as the schedule stores it between slices (f16/bf16: RNE and back)."""
    return x if sched.partials == "f32" else ar.narrow(x, sched.partials)


def fold(parts, ar: Arith):
    """Left fold of the leading axis: ((p0 + p1) + p2) + ..."""
    return ar.loop(1, parts.shape[0], lambda i, t: ar.add(t, parts[i]), parts[0])


def reduce_raw(parts, sched: KSchedule, ar: Arith):
    """The slices' float32 partials (S, ...) as they leave the slices, stored and combined as the
    schedule says ("serial": the running total stored after each slice)."""
    if sched.reduction == "serial":
        return ar.loop(1, parts.shape[0], lambda i, t: _serial_step(t, parts[i], sched, ar),
                       store_partial(parts[0], sched, ar))
    return reduce_parts(store_partial(parts, sched, ar), sched, ar)


def reduce_parts(parts, sched: KSchedule, ar: Arith):
    """The slices' stored partials (S, ...) combined as ``sched.reduction`` says."""
    if sched.reduction == "sequential":
        return fold(parts, ar)

    if sched.reduction == "shuffle":
        return _shuffle(parts, ar)
    T = sched.reduce_threads
    if T == 1:
        return _pairwise(parts, ar)
    xp, S, L = ar.xp, parts.shape[0], sched.reduce_lanes or T
    P = max(T, 1 << (S - 1).bit_length())  # Triton's power-of-two block, padded with +0
    x = xp.concatenate([parts, xp.zeros((P - S,) + parts.shape[1:], parts.dtype)])
    x = _pairwise(x.reshape((P // T, T) + parts.shape[1:]), ar)  # thread t: partials t, t + T, ...
    x = _butterfly(x.reshape((T // L, L) + parts.shape[1:]), 1, ar)  # the lanes of each warp
    return _butterfly(x, 0, ar)  # then the warps


def _butterfly(x, axis: int, ar: Arith):
    """``x`` summed over a power-of-two ``axis``: element i adds element i + h, h = n/2, ..., 1."""
    lead = (slice(None),) * axis
    while x.shape[axis] > 1:
        h = x.shape[axis] // 2
        x = ar.add(x[lead + (slice(0, h),)], x[lead + (slice(h, 2 * h),)])
    return ar.xp.squeeze(x, axis)


def _shuffle(parts, ar: Arith):
    """XLA's reduction emitter: lane j of 32 adds partials j, j + 32, ... in order onto +0, then
    lane j adds lane j + h for h = 16, 8, 4, 2, 1."""
    xp, S, W = ar.xp, parts.shape[0], SHUFFLE_LANES
    rounds = -(-S // W)
    padded = xp.concatenate([parts, xp.zeros((rounds * W - S,) + parts.shape[1:], parts.dtype)])
    lanes = fold(xp.concatenate([xp.zeros((1, W) + parts.shape[1:], parts.dtype),
                                 padded.reshape((rounds, W) + parts.shape[1:])]), ar)
    return _butterfly(lanes, 0, ar)


def _pairwise(parts, ar: Arith):
    """Pairwise (tree) sum over the leading axis: adjacent pairs, then pairs of pairs; an odd
    element waits for the next level."""
    while parts.shape[0] > 1:
        n = parts.shape[0]
        s = ar.add(parts[0:n - 1:2], parts[1:n:2])
        parts = ar.xp.concatenate([s, parts[n - 1:]]) if n % 2 else s
    return parts[0]
