"""The differentiable GEMM: inputs quantised to the instruction's formats with a straight-through
gradient, the forward GEMM emulated, the two backward GEMMs exact in float32 or emulated with
their own configs (``GemmConfig.grad_lhs`` / ``grad_rhs``), through ``jax.custom_vjp``.

    >>> import jax, jax.numpy as jnp, tcemu
    >>> g = jax.grad(lambda b: tcemu.matmul(jnp.ones((2, 3)), b).sum())(jnp.ones((3, 4)))
    >>> g.tolist()[0]
    [2.0, 2.0, 2.0, 2.0]
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from tcemu._src.gemm.config import GemmConfig
from tcemu._src.gemm.epilogue import tensor_scaled, to_float32
from tcemu._src.gemm.execute import batched_gemm_bits
from tcemu._src.quant.blocks import block_quantize
from tcemu._src.quant.elements import quantize, to_codes


@jax.custom_jvp
def _ste(x, q):
    """Straight-through estimator: the value of ``q`` exactly (also inf, NaN and -0, which
    ``x - stop_gradient(x) + stop_gradient(q)`` turns into NaN or +0), the gradient of ``x``."""
    return q


@_ste.defjvp
def _ste_jvp(primals, tangents):
    return primals[1], tangents[0]


def _codes_gemm(A, B, cfg: GemmConfig, key, scales=None):
    """float32 result of codes A (..., M, K) @ B (K, N) or (..., K, N); ``scales`` the block scale
    codes (A's (..., M, K / block), B's (..., K / block, N) or (K / block, N))."""
    if B.ndim == 2:  # one weight matrix: every batch row folds into M
        lead = A.shape[:-1]
        sc = None if scales is None else (scales[0].reshape(1, -1, scales[0].shape[-1]), scales[1][None])
        D, fmt = batched_gemm_bits(A.reshape(1, -1, A.shape[-1]), B[None], cfg, None if key is None else key[None], sc)
        return to_float32(D[0], fmt).reshape(lead + (B.shape[1],))
    batch = np.broadcast_shapes(A.shape[:-2], B.shape[:-2])
    flat = [jnp.broadcast_to(x, batch + x.shape[-2:]).reshape((-1,) + x.shape[-2:]) for x in (A, B, *(scales or ()))]
    keys = None if key is None else jax.random.split(key, flat[0].shape[0])
    D, fmt = batched_gemm_bits(flat[0], flat[1], cfg, keys, None if scales is None else tuple(flat[2:]))
    return to_float32(D, fmt).reshape(batch + D.shape[-2:])


def _emulated(a, b, cfg: GemmConfig, key):
    """Forward: a (..., M, K) @ b (K, N) or (..., K, N), inputs already quantised (float32)."""
    ins = cfg.ins
    return _codes_gemm(to_codes(a, ins.atype), to_codes(b, ins.btype), cfg, key)


def _emulated_block(a, b, cfg: GemmConfig):
    """Forward of a block-scaled GEMM on float32 inputs: quantised by the MX / NVFP4 recipe of
    the instruction's scale type (:mod:`~tcemu._src.quant.blocks`), the emulated GEMM on the
    codes, the NVFP4 tensor scales in the epilogue. Returns (result, dequantised a, dequantised b)."""
    ins = cfg.ins
    blk = ins.scale_block
    if a.shape[-1] % blk:
        raise ValueError(f"{ins.spelling!r}: block-scaled GEMMs need K a multiple of the scale block {blk}, "
                         f"got K={a.shape[-1]}")
    qa = block_quantize(a, ins.atype, ins.stype, block=blk)
    qb = block_quantize(jnp.swapaxes(b, -1, -2), ins.btype, ins.stype, block=blk)
    t = lambda x: jnp.swapaxes(x, -1, -2)  # noqa: E731
    out = _codes_gemm(qa.element_codes, t(qb.element_codes), cfg, None, (qa.scale_codes, t(qb.scale_codes)))
    return tensor_scaled(out, qa.tensor_scale, qb.tensor_scale), qa.dequantize(blk), t(qb.dequantize(blk))


def _grad_matmul(x, y, cfg):
    """One backward GEMM: exact float32 (cfg None) or emulated with its own config."""
    if cfg is None:
        return jnp.matmul(x, y, precision=jax.lax.Precision.HIGHEST, preferred_element_type=jnp.float32)
    ins = cfg.ins
    if ins.scale_vec is not None:
        return _emulated_block(x, y, cfg)[0]
    return _emulated(quantize(x, ins.atype), quantize(y, ins.btype), cfg, None)


def _unbroadcast(g, shape):
    """Sum a gradient over the axes broadcasting added (matmul batch axes)."""
    while g.ndim > len(shape):
        g = g.sum(0)
    for i, (gs, s) in enumerate(zip(g.shape, shape)):
        if s == 1 and gs != 1:
            g = g.sum(i, keepdims=True)
    return g


def _backward(cfg, a, b, g):
    """(dA, dB) of ``a @ b`` for the output cotangent ``g``."""
    g = g.astype(jnp.float32)
    da = _grad_matmul(g, jnp.swapaxes(b, -1, -2), cfg.grad_lhs)
    if b.ndim == 2:
        db = _grad_matmul(a.reshape(-1, a.shape[-1]).T, g.reshape(-1, g.shape[-1]), cfg.grad_rhs)
    else:
        db = _unbroadcast(_grad_matmul(jnp.swapaxes(a, -1, -2), g, cfg.grad_rhs), b.shape)
    return _unbroadcast(da, a.shape), db


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _mm(a, b, cfg, key):
    return _emulated(a, b, cfg, key)


def _mm_fwd(a, b, cfg, key):
    return _emulated(a, b, cfg, key), (a, b)


def _mm_bwd(cfg, res, g):
    return _backward(cfg, *res, g) + (None,)


_mm.defvjp(_mm_fwd, _mm_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _mm_block(a, b, cfg):
    return _emulated_block(a, b, cfg)[0]


def _mm_block_fwd(a, b, cfg):
    out, da, db = _emulated_block(a, b, cfg)
    return out, (da, db)


def _mm_block_bwd(cfg, res, g):  # straight through the quantisation: the dequantised operands
    return _backward(cfg, *res, g)


_mm_block.defvjp(_mm_block_fwd, _mm_block_bwd)


@functools.partial(jax.jit, static_argnames=("cfg",))
def emulated_matmul(a, b, key, cfg: GemmConfig):
    """``a @ b`` on checked operands, compiled once per config and shapes: called eagerly, a GEMM
    is one XLA program, not one dispatch (and one compile per new shape) per operation."""
    ins = cfg.ins
    if ins.scale_vec is not None:
        return _mm_block(a.astype(jnp.float32), b.astype(jnp.float32), cfg)
    ka = kb = None
    if cfg.quantize == "stochastic":
        key, ka, kb = jax.random.split(key, 3)
    af, bf = a.astype(jnp.float32), b.astype(jnp.float32)
    qa = _ste(af, quantize(af, ins.atype, cfg.quantize, ka))
    qb = _ste(bf, quantize(bf, ins.btype, cfg.quantize, kb))
    return _mm(qa, qb, cfg, key)
