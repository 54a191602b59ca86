"""fp8 block scales along K, as DeepSeek-V3 trains and cuBLASLt's block-scaled Hopper kernels
compute (``torch._scaled_mm`` / ``torch.nn.functional.scaled_mm`` with 1x128 and 128x128
scales): A's scales one per row and block of K elements, B's one per column and block; each
promotion group (the tensor core's accumulator over part of one block, from +0) enters the
float32 accumulator by one FFMA with its two scales (:func:`~tcemu._src.gemm.reduce.block_scaled`).
A 128x128 scale is a 1x128 one repeated over its 128 rows (columns).

Measured on the H100 (``tests/data/layer_gemm_h100_torch_*_scaled_block*.npz``): with both
operands 1x128 cuBLASLt computes ``fma(p * scale_a, scale_b, acc)`` (``scales="sequential"``),
with a 128x128 operand ``fma(p, scale_a * scale_b, acc)`` (``"product"``), promotion every 128.

    >>> import jax.numpy as jnp, tcemu
    >>> cfg = tcemu.GemmConfig(arch="H100", instruction="wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3",
    ...                        k_order="promotion", promotion_interval=128, epilogue=tcemu.Epilogue(scale_block=128))
    >>> a = jnp.ones((2, 256)); b = jnp.ones((256, 3))
    >>> sa = jnp.array([[1.0, 2.0], [0.5, 0.25]]); sb = jnp.ones((2, 3))
    >>> tcemu.matmul(a, b, scale_a=sa, scale_b=sb, config=cfg)[:, 0].tolist()   # 128 * (1 + 2), 128 * (0.5 + 0.25)
    [384.0, 96.0]
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from tcemu._src.checks import real_array
from tcemu._src.gemm.autodiff import _codes_gemm
from tcemu._src.gemm.config import GemmConfig
from tcemu._src.gemm.epilogue import ste_out
from tcemu._src.numerics import fp32
from tcemu._src.quant.elements import as_float32, quantize, to_codes


def check_scales(where: str, cfg: GemmConfig, a_shape, b_shape, scale_a, scale_b):
    """``scale_a`` and ``scale_b`` checked against a GEMM of (..., M, K) @ (..., K, N) with block
    scales of ``cfg.epilogue.scale_block`` elements of K: float32 arrays broadcasting to (..., M,
    ceil(K / block)) and (..., ceil(K / block), N)."""
    blk = cfg.epilogue.scale_block
    (M, K), N = a_shape[-2:], b_shape[-1]
    batch = tuple(np.broadcast_shapes(a_shape[:-2], b_shape[:-2]))
    kb = -(-K // blk)
    want = {"scale_a": (M, kb), "scale_b": (kb, N)}
    out = []
    for name, v in (("scale_a", scale_a), ("scale_b", scale_b)):
        if v is None:
            raise ValueError(f"{where}: Epilogue(scale_block={blk}) takes block scales along K: scale_a (..., M, "
                             f"K / {blk}) = (..., {M}, {kb}) and scale_b (..., K / {blk}, N) = (..., {kb}, {N}); "
                             f"{name} is missing")
        v = real_array(v, where, name)
        try:
            ok = v.ndim >= 2 and np.broadcast_shapes(v.shape[-2:], want[name]) == want[name]
            ok = ok and tuple(np.broadcast_shapes(v.shape[:-2], batch)) == batch
        except ValueError:
            ok = False
        if not ok:
            raise ValueError(f"{where}: {name} of shape {v.shape} does not broadcast to {batch + want[name]} "
                             f"(batch {batch}), one scale per {'row of A' if name == 'scale_a' else 'column of B'} "
                             f"and block of {blk} elements of K (K = {K}; a 128x128 scale repeated over its rows)")
        out.append(v)
    return tuple(out)


@functools.partial(jax.jit, static_argnames=("cfg",))
def matmul_kscaled(a, b, scale_a, scale_b, key, cfg: GemmConfig):
    """float32 accumulator of ``a @ b`` with block scales along K (checked operands, ``cfg`` with
    ``epilogue.scale_block``): the inputs rounded to the instruction's formats, the emulated
    GEMM with its scaled promotions; differentiable as the float32 product of the scaled,
    rounded inputs (straight through the roundings)."""
    ins, blk = cfg.ins, cfg.epilogue.scale_block
    ka = kb = None
    if cfg.quantize == "stochastic":
        key, ka, kb = jax.random.split(key, 3)
    af, bf = as_float32(a), as_float32(b)
    qa, qb = quantize(af, ins.atype, cfg.quantize, ka), quantize(bf, ins.btype, cfg.quantize, kb)
    sa, sb = as_float32(scale_a), as_float32(scale_b)
    kb_ = -(-a.shape[-1] // blk)
    sa, sb = (jnp.broadcast_to(s, s.shape[:-2] + w) for s, w in ((sa, (a.shape[-2], kb_)), (sb, (kb_, b.shape[-1]))))
    A, B, SA, SB = to_codes(qa, ins.atype), to_codes(qb, ins.btype), fp32.bits(sa), fp32.bits(sb)
    if B.ndim == 2 and SB.ndim > 2:  # per-batch scales of one weight matrix: a batch of GEMMs
        B = jnp.broadcast_to(B, SB.shape[:-2] + B.shape)
    if B.ndim == 2:  # every batch row folds into M: one scale row per row
        SA = jnp.broadcast_to(SA, A.shape[:-1] + SA.shape[-1:])
    exact = _codes_gemm(A, B, cfg, key, (SA, SB))
    K = a.shape[-1]
    ea, eb = jnp.repeat(sa, blk, axis=-1)[..., :K], jnp.repeat(sb, blk, axis=-2)[..., :K, :]
    surrogate = jnp.matmul(ste_out(af, qa) * ea, ste_out(bf, qb) * eb, precision=jax.lax.Precision.HIGHEST,
                           preferred_element_type=jnp.float32)
    return ste_out(surrogate, exact)
