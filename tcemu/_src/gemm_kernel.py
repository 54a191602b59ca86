"""The sequential K loop of an emulated GEMM as one Pallas (Triton) kernel, for GPUs.

XLA runs a GEMM's K loop (:func:`tcemu._src.gemm.gemm_bits`) as one fused loop per k-step that
reads every product's operands from memory and writes the accumulator back; this kernel keeps a
``BM x BN`` tile of the accumulator in registers for the whole K loop and reuses each loaded
column of A and row of B across the tile. The arithmetic is the engine's own
(:func:`~tcemu._src.numerics.engine.fused_blocks`, the same alignment, summation and rounding
functions), traced with deferred special values (outputs that a NaN/inf operand or a signed zero
could change come out NaN; the caller recomputes those GEMMs exactly), so the bits are those of
the XLA path. ``TCEMU_GEMM_KERNEL`` selects: ``auto`` (default: on GPUs), ``off``, or
``interpret`` (the kernel run by Pallas's interpreter, on any backend: how CPU tests check it),
``triton`` (always lowered for Triton, e.g. to check the lowering without a GPU).
"""
from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp

from tcemu._src import formats as fm
from tcemu._src.isa.parse import Mma
from tcemu._src.numerics import engine
from tcemu._src.numerics import mma as mma_numerics
from tcemu._src.numerics.model import BlockFMA

MODES = ("auto", "off", "interpret", "triton")


def mode() -> str:
    """The kernel mode: "triton", "interpret" or "off" (``TCEMU_GEMM_KERNEL``, see the module)."""
    env = os.environ.get("TCEMU_GEMM_KERNEL", "auto")
    if env not in MODES:
        raise ValueError(f"TCEMU_GEMM_KERNEL={env!r}; valid: {', '.join(MODES)}")
    if env == "auto":
        return "triton" if jax.default_backend() == "gpu" else "off"
    return env


def tile() -> tuple[int, int]:
    """Output tile (BM, BN) of one kernel program (``TCEMU_GEMM_TILE=64x64``; powers of two)."""
    bm, bn = (int(x) for x in os.environ.get("TCEMU_GEMM_TILE", "64x64").split("x"))
    if bm & (bm - 1) or bn & (bn - 1) or min(bm, bn) < 16:
        raise ValueError(f"TCEMU_GEMM_TILE={bm}x{bn}: both sides must be powers of two >= 16")
    return bm, bn


def supports(ins: Mma, model: BlockFMA) -> bool:
    """Whether the kernel computes this instruction's sequential GEMM: deterministic rounding
    (stochastic rounding draws its bits per instruction call in the XLA path)."""
    return mode() != "off" and not model.stochastic and ins.family in ("f16", "bf16", "tf32", "fp8")


def sequential(a_bits, b_bits, ins: Mma, model: BlockFMA):
    """D bits (Mp, Np) of the sequential K loop from +0 over padded operand bits a (Mp, Kp),
    b (Kp, Np) (Mp, Np, Kp multiples of the instruction's m, n, k), in the accumulator format;
    NaN where :func:`engine.deferred_specials` defers."""
    m_, n_, k = ins.m, ins.n, ins.k
    (Mp, Kp), Np = a_bits.shape, b_bits.shape[1]
    Kt = Kp // k
    bm, bn = tile()
    Mq, Nq = -(-Mp // bm) * bm, -(-Np // bn) * bn
    a_bits = jnp.pad(a_bits, ((0, Mq - Mp), (0, 0)))
    b_bits = jnp.pad(b_bits, ((0, 0), (0, Nq - Np)))
    afmt, bfmt = fm.FORMATS[ins.atype], fm.FORMATS[ins.btype]
    # decoded once, per instruction (block order, tf32 conversion), then back to (M, K) / (K, N)
    p = engine.prepare(a_bits.reshape(Mq, Kt, k).transpose(1, 0, 2), afmt, b_bits.reshape(Kt, k, Nq), bfmt, model)
    use_float = p.fa is not None
    xa, xb = (p.fa, p.fb) if use_float else (p.sa, p.sb)
    xa, ea = (x.transpose(1, 0, 2).reshape(Mq, Kp) for x in (xa, p.ea))
    xb, eb = (x.reshape(Kp, Nq) for x in (xb, p.eb))
    kern = functools.partial(_kernel, ins=ins, model=model, bm=bm, bn=bn, Kt=Kt, use_float=use_float)
    kwargs = {"interpret": True} if mode() == "interpret" else {"compiler_params": _triton_params()}
    from jax.experimental import pallas as pl

    d = pl.pallas_call(kern, out_shape=jax.ShapeDtypeStruct((Mq, Nq), jnp.uint32), grid=(Mq // bm, Nq // bn),
                       **kwargs)(xa, ea, xb, eb, ea, eb)
    return d[:Mp, :Np]


def _triton_params():
    from jax.experimental.pallas import triton as pltriton

    return pltriton.CompilerParams(num_warps=int(os.environ.get("TCEMU_GEMM_WARPS", "4")), num_stages=1)


def _kernel(xa_ref, ea_ref, xb_ref, eb_ref, ea2_ref, eb2_ref, o_ref, *, ins: Mma, model: BlockFMA, bm: int, bn: int, Kt: int,
            use_float: bool):
    """One (bm, bn) output tile: the K loop of instructions, each a chain of fused blocks whose
    products are formed from one column of A and one row of B at a time, in two passes (the
    largest exponent, then the aligned sum) that read the operands separately, since the
    products of a block do not fit in registers. ``ea2_ref``/``eb2_ref`` are ``ea_ref``/``eb_ref``
    passed again (see ``aligned``)."""
    from jax.experimental import pallas as pl

    afmt, bfmt = fm.FORMATS[ins.atype], fm.FORMATS[ins.btype]
    F, L, k = model.fraction_bits, model.block_size, ins.k
    rs = max(afmt.fraction_bits + bfmt.fraction_bits - F, 0)
    normalize = F + rs + 1 if model.normalize_products else None
    starts = range(0, k, L)
    rows = pl.ds(pl.program_id(0) * bm, bm)
    cols = pl.ds(pl.program_id(1) * bn, bn)

    def instruction(kt, d):
        def block_terms(blk):
            kgs = [pl.ds(kt * k + kk, 1) for kk in range(starts[blk], min(starts[blk] + L, k))]

            def exponent(kg):  # of one (bm, bn) product, for the maximum
                texp = ea_ref[rows, kg] + eb_ref[kg, cols]
                if normalize is None:
                    return texp
                return engine._int_align(xa_ref[rows, kg] * xb_ref[kg, cols], texp, rs, model.sticky, normalize)[0]

            def aligned(E, kg):  # one (bm, bn) product truncated below 2**(E - F)
                prod = xa_ref[rows, kg] * xb_ref[kg, cols]
                if use_float:
                    return engine._float_align(prod, None, F)[1](E)
                # exponents read again through other references and subtracted one at a time, so
                # that Triton does not keep the first pass's loads and sums alive in registers
                return engine._int_align(prod, eb2_ref[kg, cols], rs, model.sticky, None, clamp=True)[1](
                    E - ea2_ref[rows, kg])

            E_terms = functools.reduce(jnp.maximum, [
                engine.term_exponents(exponent(kg), model, afmt.emin + bfmt.emin) for kg in kgs])
            g = engine.group_size(F)

            def sums(E):
                return [functools.reduce(jnp.add, [aligned(E, kg) for kg in kgs[s:s + g]])
                        for s in range(0, len(kgs), g)]

            return E_terms, sums, None, len(kgs)

        def fused(c, cfmt, acc):
            return engine.fused_blocks(len(starts), block_terms, c, cfmt, model, acc=acc)

        with engine.deferred_specials():
            return mma_numerics.float_mma(ins, model, d, fused)

    o_ref[rows, cols] = jax.lax.fori_loop(0, Kt, instruction, jnp.zeros((bm, bn), jnp.uint32))
