"""The differentiable GEMM: inputs quantised to the instruction's formats with a straight-through
gradient, the forward GEMM emulated, the two backward GEMMs exact in float32 or emulated with
their own configs (``GemmConfig.grad_lhs`` / ``grad_rhs``), through ``jax.custom_jvp`` and a linear
tangent primitive whose transpose is the backward GEMMs. Forward mode (``jax.jvp``,
``jax.jacfwd``) gives the straight-through tangent ``da @ b + a @ db`` exactly in float32 on the
quantised operands; it needs both backward GEMMs exact (``grad_lhs = grad_rhs = None``).

    >>> import jax, jax.numpy as jnp, tcemu
    >>> g = jax.grad(lambda b: tcemu.matmul(jnp.ones((2, 3)), b).sum())(jnp.ones((3, 4)))
    >>> g.tolist()[0]
    [2.0, 2.0, 2.0, 2.0]
    >>> _, t = jax.jvp(lambda b: tcemu.matmul(jnp.ones((2, 3)), b), (jnp.ones((3, 4)),), (jnp.ones((3, 4)),))
    >>> t.tolist()[0]
    [3.0, 3.0, 3.0, 3.0]
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.core import ShapedArray
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from tcemu._src.gemm.config import GemmConfig
from tcemu._src.gemm.epilogue import tensor_scaled, to_float32
from tcemu._src.gemm.execute import batched_gemm_bits
from tcemu._src.gemm.plan import slice_ranges
from tcemu._src.quant.blocks import block_quantize
from tcemu._src.quant.elements import as_float32, quantize, to_codes


@jax.custom_jvp
def _ste(x, q):
    """Straight-through estimator: the value of ``q`` exactly (also inf, NaN and -0, which
    ``x - stop_gradient(x) + stop_gradient(q)`` turns into NaN or +0), the gradient of ``x``."""
    return q


@_ste.defjvp
def _ste_jvp(primals, tangents):  # the primal through _ste again: straight through at every order
    return _ste(*primals), tangents[0]


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


def _backward(cfg, a, b, g, need=(True, True)):
    """(dA, dB) of ``a @ b`` for the output cotangent ``g`` (None where ``need`` is False)."""
    g = g.astype(jnp.float32)
    da = db = None
    if need[0]:
        da = _unbroadcast(_grad_matmul(g, jnp.swapaxes(b, -1, -2), cfg.grad_lhs), a.shape)
    if need[1] and b.ndim == 2:
        db = _grad_matmul(a.reshape(-1, a.shape[-1]).T, g.reshape(-1, g.shape[-1]), cfg.grad_rhs)
    elif need[1]:
        db = _unbroadcast(_grad_matmul(jnp.swapaxes(a, -1, -2), g, cfg.grad_rhs), b.shape)
    return da, db


# The tangent of the emulated GEMM, straight through: da @ b + a @ db, linear in (da, db). A
# primitive, so that reverse mode transposes it into the backward GEMMs of ``cfg`` (exact float32,
# or emulated with grad_lhs / grad_rhs) while forward mode (jvp, jacfwd) evaluates it exactly in
# float32, which is the transpose of the backward only when both backward GEMMs are exact.
_tangent_p = Primitive("tcemu_gemm_tangent")


def _exact_tangent(a, b, da, db):
    return _grad_matmul(da, b, None) + _grad_matmul(a, db, None)


def _forward_mode(cfg: GemmConfig):
    """Forward-mode tangent of ``cfg``'s GEMM: exact float32, or a ValueError where the backward
    GEMMs are emulated (no linear tangent has them as its transpose)."""
    if cfg.grad_lhs is not None or cfg.grad_rhs is not None:
        raise ValueError("forward-mode differentiation (jax.jvp, jax.jacfwd, jax.linearize) of tcemu.matmul needs "
                         "GemmConfig.grad_lhs = grad_rhs = None (exact float32 backward GEMMs, whose transpose is the "
                         "exact tangent da @ b + a @ db); this config emulates its backward GEMMs, which reverse mode "
                         "(jax.grad, jax.vjp, jax.jacrev) runs")
    return _exact_tangent


def _tangent_abstract(a, b, da, db, *, cfg):
    lead = a.shape[:-1] if b.ndim == 2 else np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + a.shape[-2:-1]
    return ShapedArray(lead + b.shape[-1:], jnp.float32)


def _tangent_transpose(g, a, b, da, db, *, cfg):
    need = (ad.is_undefined_primal(da), ad.is_undefined_primal(db))
    if type(g) is ad.Zero:
        return None, None, None, None
    return (None, None) + _backward(cfg, a, b, g, need)


def _tangent_batch(args, dims, *, cfg):
    return jax.vmap(_forward_mode(cfg), in_axes=dims)(*args), 0


def _tangent_jvp(primals, tangents, *, cfg):
    a, b, da, db = primals
    ta, tb, tda, tdb = (ad.instantiate_zeros(t) for t in tangents)
    out = _tangent_p.bind(a, b, da, db, cfg=cfg)
    return out, _tangent_p.bind(a, b, tda, tdb, cfg=cfg) + _tangent_p.bind(da, db, ta, tb, cfg=cfg)


_tangent_p.def_impl(lambda *args, cfg: _forward_mode(cfg)(*args))
_tangent_p.def_abstract_eval(_tangent_abstract)
ad.primitive_jvps[_tangent_p] = _tangent_jvp
ad.primitive_transposes[_tangent_p] = _tangent_transpose
batching.primitive_batchers[_tangent_p] = _tangent_batch
mlir.register_lowering(_tangent_p, lambda ctx, *args, cfg: mlir.lower_fun(_forward_mode(cfg), False)(ctx, *args))


@functools.partial(jax.custom_jvp, nondiff_argnums=(2,))
def _mm(a, b, cfg, key):
    return _emulated(a, b, cfg, key)


@_mm.defjvp
def _mm_jvp(cfg, primals, tangents):
    a, b, key = primals
    return _mm(a, b, cfg, key), _tangent_p.bind(a, b, tangents[0], tangents[1], cfg=cfg)


@functools.partial(jax.custom_jvp, nondiff_argnums=(2,))
def _mm_block(a, b, cfg):
    return _emulated_block(a, b, cfg)[0]


@_mm_block.defjvp
def _mm_block_jvp(cfg, primals, tangents):  # straight through the quantisation: the dequantised operands
    a, b = primals
    _, qa, qb = _emulated_block(a, b, cfg)
    return _mm_block(a, b, cfg), _tangent_p.bind(_ste(a, qa), _ste(b, qb), *tangents, cfg=cfg)


@functools.partial(jax.jit, static_argnames=("cfg",))
def emulated_matmul(a, b, key, cfg: GemmConfig):
    """``a @ b`` on checked operands, compiled once per config and shapes: called eagerly, a GEMM
    is one XLA program, not one dispatch (and one compile per new shape) per operation."""
    ins = cfg.ins
    if ins.scale_vec is not None:
        return _mm_block(as_float32(a), as_float32(b), cfg)
    qa, qb, key = _quantized(a, b, key, cfg)
    return _mm(qa, qb, cfg, key)


def _quantized(a, b, key, cfg: GemmConfig):
    """(a, b rounded to the instruction's input formats with a straight-through gradient, the
    key left for the GEMM)."""
    ins = cfg.ins
    ka = kb = None
    if cfg.quantize == "stochastic":
        key, ka, kb = jax.random.split(key, 3)
    af, bf = as_float32(a), as_float32(b)  # float64 (x64) narrowed without XLA's CPU flush
    qa = _ste(af, quantize(af, ins.atype, cfg.quantize, ka))
    qb = _ste(bf, quantize(bf, ins.btype, cfg.quantize, kb))
    return qa, qb, key


@functools.partial(jax.jit, static_argnames=("cfg",))
def emulated_parts(a, b, key, cfg: GemmConfig):
    """The float32 partials of ``a @ b``'s split-K slices as they leave the slices (S, ..., M, N),
    for serial split-K's epilogue (:func:`~tcemu._src.gemm.epilogue.finish_serial`): the operands
    quantised once, each slice's K range run by the one-slice schedule that has the slice's own
    instructions (:func:`~tcemu._src.gemm.plan.slice_ranges`; a stochastic rounding key split per
    slice). Differentiable as :func:`emulated_matmul`."""
    ins = cfg.ins
    if ins.scale_vec is not None:
        raise ValueError(f"{ins.spelling!r}: serial split-K with epilogue operands takes instructions without "
                         "block scales of their own (each slice would quantise its own blocks and tensor scale)")
    ranges, one = slice_ranges(cfg.k_schedule.plan(a.shape[-1], ins.k), ins.k)
    qa, qb, key = _quantized(a, b, key, cfg)
    keys = [None] * len(ranges) if key is None else list(jax.random.split(key, len(ranges)))
    shape = jax.eval_shape(lambda: jnp.matmul(qa, qb)).shape
    one_cfg = cfg.replace(schedule=one)
    return jnp.stack([_mm(qa[..., lo:hi], qb[..., lo:hi, :], one_cfg, kk) if hi > lo else jnp.zeros(shape, jnp.float32)
                      for (lo, hi), kk in zip(ranges, keys)])
