"""Execution on a compiled kernel (:class:`~tcemu._src.numerics.backends.Kernel`): every chain of
the plan (slices, promotion groups) in one call, or one chain at a time when their results would
be large; then the plan's reduction (:mod:`~tcemu._src.gemm.reduce`). Same bits as
:mod:`~tcemu._src.gemm.xla`, which states the numerics through the JAX engine."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from tcemu._src import formats as fm
from tcemu._src.gemm.plan import chain_layout, lay_k, scale_unit
from tcemu._src.gemm.reduce import JAX, block_scaled, combine_chains
from tcemu._src.quant.elements import f32_bits

# all chains of a GEMM at once up to this many bytes of chain results; beyond, one at a time
CHAIN_BYTES = 1 << 28


def _grouped(x, plan, k: int, axis: int, unit: int = 1):
    """The laid-out K of ``x`` (S * T * k / unit entries) split into every slice's chains of g
    instructions, the last chain of each slice padded: (S * G * g * k / unit) entries."""
    S, T = plan.slices, plan.steps
    g, G, _ = chain_layout(plan)
    shape = x.shape[:axis] + (S, T * k // unit) + x.shape[axis + 1:]
    pad = [(0, 0)] * (x.ndim + 1)
    pad[axis + 1] = (0, (G * g - T) * k // unit)
    return jnp.pad(x.reshape(shape), pad).reshape(x.shape[:axis] + (S * G * g * k // unit,) + x.shape[axis + 1:])


def _scales(kernel, scales, ins, model, plan):
    """Block scales laid out like the elements' K, chain by chain: (A's exponents, B's, A's
    decoded scales, B's, NaN mask of the outputs, entries of K per exponent)."""
    blk, k = ins.scale_block, ins.k
    unit = scale_unit(plan, k, blk, model.scale_group) if kernel.scale_per_block else 1
    sa = fm.decode_scale(lay_k(jnp.repeat(scales[0], blk // unit, axis=1), plan, 1, unit), ins.stype)
    sb = fm.decode_scale(lay_k(jnp.repeat(scales[1], blk // unit, axis=0), plan, 0, unit), ins.stype)
    nan = jnp.any(sa.is_nan, axis=1)[:, None] | jnp.any(sb.is_nan, axis=0)[None, :]
    a_exp, b_exp = _grouped(sa.exp, plan, k, 1, unit), _grouped(sb.exp, plan, k, 0, unit)
    if model.scale_group is not None:  # grouped fp4: one scale per group of sg elements
        sg = model.scale_group

        def per(x, ax):  # one entry per group: repeated from blocks, or every (sg / unit)-th
            if unit >= sg:
                return jnp.repeat(x, unit // sg, axis=ax)
            return jax.lax.slice_in_dim(x, 0, None, sg // unit, axis=ax)
        sa = fm.Scale(*(per(_grouped(x, plan, k, 1, unit), 1) for x in sa))
        sb = fm.Scale(*(per(_grouped(x, plan, k, 0, unit), 0) for x in sb))
    return a_exp, b_exp, sa, sb, nan, unit


def run(kernel, a_bits, b_bits, ins, model, plan, scales, kscales=None):
    """(D bits (M, N), format of D) of the plan on ``kernel``, or None where the kernel cannot
    hold this GEMM (K * M or K * N beyond its offsets; many pairwise-reduced slices whose
    chains it would hold at once). ``kscales``: block scales along K (``execute._k_scales``),
    applied as the chains are promoted."""
    afmt, bfmt, k = fm.FORMATS[ins.atype], fm.FORMATS[ins.btype], ins.k
    A = _grouped(lay_k(jnp.asarray(a_bits), plan, 1), plan, k, 1)
    B = _grouped(lay_k(jnp.asarray(b_bits), plan, 0), plan, k, 0)
    a_exp = b_exp = sa = sb = nan = None
    unit = 1  # elements of the laid-out K per scale entry
    if scales is not None:
        a_exp, b_exp, sa, sb, nan, unit = _scales(kernel, scales, ins, model, plan)
    g, G, lens = chain_layout(plan)
    S = plan.slices
    ck = g * k

    def chains(c0, n, lens):  # chains c0 .. c0 + n - 1
        def cut(x, ax, w=1):
            return jax.lax.dynamic_slice_in_dim(x, c0 * ck // w, n * ck // w, axis=ax)
        if model.scale_group is not None:
            sg = model.scale_group
            return kernel.grouped_chains(cut(A, 1), cut(B, 0), fm.Scale(*(cut(x, 1, sg) for x in sa)),
                                         fm.Scale(*(cut(x, 0, sg) for x in sb)), model, k=k, chain_k=ck,
                                         lens=lens * k)
        return kernel.chains(cut(A, 1), cut(B, 0), afmt, bfmt, model, k=k, chain_k=ck, lens=lens * k,
                             a_exp=None if a_exp is None else cut(a_exp, 1, unit),
                             b_exp=None if b_exp is None else cut(b_exp, 0, unit), scale_block=unit if unit > 1 else 0)

    acc = fm.FORMATS[ins.dtype]
    M, N = a_bits.shape[0], b_bits.shape[1]
    if not kernel.fits(A.shape[1], M, N):
        return None
    zero = jnp.zeros((M, N), jnp.uint32)
    to_f32 = lambda x: f32_bits(x, acc)  # noqa: E731
    scaled = None
    if kscales is not None:
        order, blocks, ka, kb = kscales
        scaled = block_scaled(order, blocks, lambda i: jax.lax.dynamic_index_in_dim(ka, i, axis=1),
                              lambda i: jax.lax.dynamic_index_in_dim(kb, i, axis=0))
    if S * G * M * N * 4 > CHAIN_BYTES and plan.reduces:  # one chain at a time, memory O(M N)
        if S > 1 and plan.schedule.reduction not in ("sequential", "serial"):
            return None
        lens_j = jnp.asarray(lens)
        out = combine_chains(lambda c: chains(c, 1, lens_j[c][None])[0], plan, zero, JAX, to_f32, scaled)
    else:
        ch = chains(0, S * G, lens)
        out = combine_chains(lambda c: ch[c], plan, zero, JAX, to_f32, scaled)
    if nan is not None:
        out = jnp.where(nan, jnp.uint32(fm.F32.canonical_nan), out)
    return out, fm.F32 if plan.reduces else acc
