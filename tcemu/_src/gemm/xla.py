"""Execution in pure JAX (any backend, every model): the operands cut into tiles of the
instruction's (m, n, k), each chain of instructions a ``lax.scan`` over its k-tiles calling the
instruction's numerics (:func:`~tcemu._src.numerics.mma.mma_bits`), rows of tiles in blocks by
``lax.map`` (memory O(M N), never O(M N K)), then the plan's reduction
(:mod:`~tcemu._src.gemm.reduce`). This is the reference the kernels are tested against."""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from tcemu._src import formats as fm
from tcemu._src.gemm.plan import lay_k, step_table
from tcemu._src.gemm.reduce import JAX, block_scaled, promote, reduce_raw
from tcemu._src.numerics import engine
from tcemu._src.numerics import mma as mma_numerics
from tcemu._src.quant.elements import f32_bits

# models with at most this many blocks per instruction run without per-instruction special-value
# branches first (engine.deferred_specials)
DEFER_MAX_BLOCKS = 4


def _tiles(x, r, c):
    """(R, C) -> (R/r, C/c, r, c)."""
    R, C = x.shape
    return x.reshape(R // r, r, C // c, c).transpose(0, 2, 1, 3)


@dataclasses.dataclass(frozen=True)
class _Tiled:
    """The operands in tiles along the plan's K layout, rows of tiles in blocks of ``mc``: ``A``
    (blocks, mc, Kt, m, k), ``B`` (Kt, Nt, k, n), scale codes likewise (one per block of each
    instruction) or None; block scales along K ``KA`` (blocks, mc, m, K blocks + 1), ``KB``
    (K blocks + 1, Nt, n) or None."""

    A: jax.Array
    B: jax.Array
    SA: jax.Array | None
    SB: jax.Array | None
    mc: int
    Mt: int
    Nt: int
    KA: jax.Array | None = None
    KB: jax.Array | None = None


def _tile(a_bits, b_bits, ins, plan, scales, kscales=None) -> _Tiled:
    m, n, k = ins.m, ins.n, ins.k
    M, N = a_bits.shape[0], b_bits.shape[1]
    Mp, Np = -(-M // m) * m, -(-N // n) * n
    A = _tiles(lay_k(jnp.pad(a_bits, ((0, Mp - M), (0, 0))), plan, 1), m, k)  # (Mt, S*T, m, k)
    B = _tiles(lay_k(jnp.pad(b_bits, ((0, 0), (0, Np - N))), plan, 0), k, n)  # (S*T, Nt, k, n)
    Mt, Nt = Mp // m, Np // n
    SA = SB = None
    if scales is not None:  # laid out like the elements, one code per block of each instruction
        blk = ins.scale_block
        sa, sb = jnp.repeat(scales[0], blk, axis=1), jnp.repeat(scales[1], blk, axis=0)
        SA = _tiles(lay_k(jnp.pad(sa, ((0, Mp - M), (0, 0))), plan, 1), m, k)[..., ::blk]  # (Mt, Kt, m, S)
        SB = _tiles(lay_k(jnp.pad(sb, ((0, 0), (0, Np - N))), plan, 0), k, n)[:, :, ::blk, :]  # (Kt, Nt, S, n)
    # rows of tiles per block: about chunk_terms() products per step; with many slices, their
    # partials are alive at once
    mc = max(1, mma_numerics.chunk_terms() // max(1, Nt * m * n * k))
    if plan.slices > 4:
        mc = max(1, mc // plan.slices)
    mc = min(mc, Mt)
    nblocks = -(-Mt // mc)

    def blocks(x):
        return None if x is None else jnp.pad(x, ((0, nblocks * mc - Mt),) + ((0, 0),) * (x.ndim - 1)).reshape(
            (nblocks, mc) + x.shape[1:])
    KA = KB = None
    if kscales is not None:
        ka, kb = kscales[2], kscales[3]
        KA = jnp.pad(ka, ((0, Mp - M), (0, 0))).reshape(Mt, m, ka.shape[1])
        KB = jnp.pad(kb, ((0, 0), (0, Np - N))).reshape(kb.shape[0], Nt, n)
    return _Tiled(blocks(A), B, blocks(SA), SB, mc, Mt, Nt, blocks(KA), KB)


def _block(t: _Tiled, ins, model, plan, arch, key, blk, Ar, SAr, KAr=None, order=None, chain_blk=None, unroll=1):
    """D (mc, Nt, m, n) of one block of rows of tiles: the plan's chains, promotion (``KAr``: the
    block's scales along K, ``order`` and ``chain_blk`` as :func:`~tcemu._src.gemm.reduce.block_scaled`
    takes them) and reduction."""
    tbl, ok = step_table(plan)
    masked = not ok.all()
    acc = fm.FORMATS[ins.dtype]
    zero = jnp.zeros((t.mc, t.Nt, ins.m, ins.n), jnp.uint32)

    def step(d, x):
        kt, run = x
        kt = jnp.maximum(kt, 0)
        a = jax.lax.dynamic_index_in_dim(Ar, kt, axis=1, keepdims=False)[:, None]  # (mc, 1, m, k)
        b = jax.lax.dynamic_index_in_dim(t.B, kt, axis=0, keepdims=False)[None]  # (1, Nt, k, n)
        kk = None if key is None else jax.random.fold_in(jax.random.fold_in(key, blk), kt)
        sc = {}
        if SAr is not None:
            sc = dict(scale_a=jax.lax.dynamic_index_in_dim(SAr, kt, axis=1, keepdims=False)[:, None],
                      scale_b=jax.lax.dynamic_index_in_dim(t.SB, kt, axis=0, keepdims=False)[None])
        out = mma_numerics.mma_bits(ins, a, b, d, model, arch=arch, key=kk, **sc)
        return (jnp.where(run, out, d) if masked else out), None

    def chain(kts, runs):  # instructions kts from +0
        return jax.lax.scan(step, zero, (kts, runs), unroll=unroll)[0]

    scaled = None
    if KAr is not None:
        scaled = block_scaled(order, chain_blk, lambda i: jax.lax.dynamic_index_in_dim(KAr, i, 2, False)[:, None, :, None],
                              lambda i: jax.lax.dynamic_index_in_dim(t.KB, i, 0, False)[None, :, None, :])

    def one_slice(kts, runs, s):  # (G, g): chains, promoted into float32 from +0 when G groups
        if not plan.group:
            return chain(kts[0], runs[0])
        G = kts.shape[0]
        step = None if scaled is None else (lambda j, x, total: scaled(s * G + j, x, total))
        return promote(lambda j: f32_bits(chain(kts[j], runs[j]), acc), G, zero, JAX, step)

    tj, oj = jnp.asarray(tbl), jnp.asarray(ok)
    if plan.slices == 1:
        return one_slice(tj[0], oj[0], 0)
    parts = jax.vmap(one_slice)(tj, oj, jnp.arange(plan.slices))
    return reduce_raw(parts if plan.group else f32_bits(parts, acc), plan.schedule, JAX)


def run(a_bits, b_bits, ins, model, plan, arch, key, scales, kscales=None):
    """(D bits (M, N), format of D) of the plan in pure JAX; ``kscales``: block scales along K
    (``execute._k_scales``)."""
    if model.stochastic and key is None:
        raise ValueError("this model rounds stochastically: pass key=jax.random.key(...)")
    t = _tile(a_bits, b_bits, ins, plan, scales, kscales)
    order, chain_blk = (kscales[0], kscales[1]) if kscales is not None else (None, None)
    out_fmt = fm.F32 if plan.reduces else fm.FORMATS[ins.dtype]
    # Without the branches XLA fuses all blocks of an instruction into one loop; beyond a few
    # blocks per instruction (models with tiny blocks) that fusion takes minutes to compile.
    # The AMD adders (two-stage, pairwise, exact) have no such branch: one path, compiled once.
    defer = (-(-ins.k // model.block_size) <= DEFER_MAX_BLOCKS and model.addend_alignment == "fused"
             and model.block_sum not in ("pairwise", "exact"))

    def exact_or_fast(blk, Ar, SAr, KAr):
        """The block without per-instruction special-value branches (engine.deferred_specials);
        computed again exactly only if that gives a NaN (a NaN/inf operand, an overflow, or an
        exact zero after a -0 accumulator): same bits, a third less time on GPUs."""
        args = (t, ins, model, plan, arch, key, blk, Ar, SAr, KAr, order, chain_blk)
        exact = lambda: _block(*args)  # noqa: E731
        if not defer:
            return exact()
        with engine.deferred_specials():
            fast = _block(*args, unroll=4 if engine.unroll_terms() else 1)
        return jax.lax.cond(jnp.any(fm.decode(fast, out_fmt).is_nan), exact, lambda: fast)

    nblocks = t.A.shape[0]
    xs = (jnp.arange(nblocks), t.A, t.SA, t.KA)
    out = jax.lax.map(lambda x: exact_or_fast(*x), xs)  # (nblocks, mc, Nt, m, n)
    M, N = a_bits.shape[0], b_bits.shape[1]
    out = out.reshape(nblocks * t.mc, t.Nt, ins.m, ins.n)[:t.Mt].transpose(0, 2, 1, 3)
    return out.reshape(t.Mt * ins.m, t.Nt * ins.n)[:M, :N], out_fmt
