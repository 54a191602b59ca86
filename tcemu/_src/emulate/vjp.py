"""Gradient GEMMs as tcemu's own VJP computes them: a function that differentiates inside
(``jax.grad`` in a train step) holds JAX's transposes of its forward dot_generals; each is
recomputed from the forward GEMM's operand it reads, brought to ``tcemu.dot_general``'s (batch,
M, K) x (batch, K, N) form and quantised to the forward config's input format, as dA = G B^T
and dB = A^T G of :mod:`tcemu._src.gemm.autodiff` (``grad_lhs`` / ``grad_rhs``: None exactly in
float32), then laid out as JAX's transpose lays out its result.

    >>> import jax, jax.numpy as jnp, tcemu
    >>> f = lambda x, w: jax.grad(lambda w: (x @ w).sum())(w)
    >>> x, w = jnp.full((2, 16), 1 + 2.0**-10, jnp.float32), jnp.ones((16, 4), jnp.float32)
    >>> tcemu.emulate(f, tcemu.GemmConfig(arch="H100"))(x, w)[0].tolist()   # (bf16 x)^T @ ones
    [2.0, 2.0, 2.0, 2.0]
"""
from __future__ import annotations

import math

import jax.numpy as jnp

from tcemu._src.gemm.autodiff import _grad_matmul
from tcemu._src.gemm.config import GemmConfig
from tcemu._src.quant.blocks import block_quantize
from tcemu._src.quant.elements import quantize


def _free(ndim, contract, batch):
    return [i for i in range(ndim) if i not in contract and i not in batch]


def canonical(x, batch, free, contract, lhs: bool):
    """An operand in ``tcemu.dot_general``'s form: lhs (B, M, K), rhs (B, K, N); no B without
    batch dims."""
    size = lambda dims: math.prod(x.shape[i] for i in dims)  # noqa: E731
    order = [*batch, *free, *contract] if lhs else [*batch, *contract, *free]
    shape = (size(batch), size(free), size(contract)) if lhs else (size(batch), size(contract), size(free))
    y = jnp.transpose(x, order).reshape(shape)
    return y if batch else y[0]


def quantised(x, cfg: GemmConfig, side: str):
    """A canonical operand as the forward GEMM multiplied it (float32): rounded to its input format,
    or block-quantised along K and dequantised."""
    ins = cfg.ins
    fmt = ins.atype if side == "lhs" else ins.btype
    x = x.astype(jnp.float32)
    if ins.scale_vec is None:
        return quantize(x, fmt)
    blk = ins.scale_block
    if side == "lhs":
        return block_quantize(x, fmt, ins.stype, block=blk).dequantize(blk)
    return jnp.swapaxes(block_quantize(jnp.swapaxes(x, -1, -2), fmt, ins.stype, block=blk).dequantize(blk), -1, -2)


def output_axes(eqn, res_index: int, side: str, dims, lhs_ndim: int, rhs_ndim: int):
    """For each output axis of the gradient GEMM ``eqn`` (operand ``res_index`` the forward
    operand of ``side``, the other the cotangent of the forward output), the axis of the
    differentiated operand it is; None when ``eqn`` is not such a transpose."""
    (lc, rc), (lb, rb) = dims
    lf, rf = _free(lhs_ndim, lc, lb), _free(rhs_ndim, rc, rb)
    nb, nlf = len(lb), len(lf)

    def target(k, a):  # axis a of the gradient GEMM's operand k -> axis of the differentiated operand
        if k == res_index:
            mine, other, bmine, bother = (lc, rc, lb, rb) if side == "lhs" else (rc, lc, rb, lb)
            return other[mine.index(a)] if a in mine else bother[bmine.index(a)] if a in bmine else None
        if a < nb:
            return (rb if side == "lhs" else lb)[a]
        if a < nb + nlf:
            return lf[a - nb] if side == "rhs" else None
        return rf[a - nb - nlf] if side == "lhs" else None

    def paired(k, a):  # the forward free axis a contracted axis stands for, on both operands
        if k == res_index:
            free = lf if side == "lhs" else rf
            return ("free", free.index(a)) if a in free else None
        j = a - nb - (nlf if side == "rhs" else 0)
        return ("free", j) if a >= nb and 0 <= j < (len(rf) if side == "rhs" else nlf) else None

    (c0, c1), (b0, b1) = eqn.params["dimension_numbers"]
    if any(paired(0, a) is None or paired(0, a) != paired(1, b) for a, b in zip(c0, c1)):
        return None
    shapes = [v.aval.ndim for v in eqn.invars[:2]]
    axes = ([target(0, a) for a in b0] + [target(0, a) for a in _free(shapes[0], c0, b0)]
            + [target(1, a) for a in _free(shapes[1], c1, b1)])
    ndim = rhs_ndim if side == "lhs" else lhs_ndim
    return axes if sorted(a for a in axes if a is not None) == list(range(ndim)) and None not in axes else None


def gradient(eqn, g, res, res_index: int, side: str, cfg: GemmConfig, dims, lhs_shape, rhs_shape):
    """The gradient GEMM ``eqn`` (its cotangent ``g``, the forward operand ``res`` of ``side``)
    as tcemu's VJP of the forward ``dot_general(dims)`` with ``cfg`` computes it, or None when
    ``eqn`` is not a transpose of that GEMM."""
    axes = output_axes(eqn, res_index, side, dims, len(lhs_shape), len(rhs_shape))
    (lc, rc), (lb, rb) = dims
    lf, rf = _free(len(lhs_shape), lc, lb), _free(len(rhs_shape), rc, rb)
    out_shape = tuple(lhs_shape[i] for i in [*lb, *lf]) + tuple(rhs_shape[i] for i in rf)
    if axes is None or tuple(res.shape) != tuple(lhs_shape if side == "lhs" else rhs_shape) or g.shape != out_shape:
        return None
    size = lambda shape, d: math.prod(shape[i] for i in d)  # noqa: E731
    G = g.astype(jnp.float32).reshape(((size(lhs_shape, lb),) if lb else ()) + (size(lhs_shape, lf), size(rhs_shape, rf)))
    if side == "lhs":  # dB = A^T G, in B's (batch, contract, free) order
        a = quantised(canonical(res, lb, lf, lc, True), cfg, "lhs")
        if rb:
            d = _grad_matmul(jnp.swapaxes(a, -1, -2), G, cfg.grad_rhs)
        else:
            d = _grad_matmul(a.reshape(-1, a.shape[-1]).T, G.reshape(-1, G.shape[-1]), cfg.grad_rhs)
        order, shape = [*rb, *rc, *rf], rhs_shape
    else:  # dA = G B^T, in A's (batch, free, contract) order
        b = quantised(canonical(res, rb, rf, rc, False), cfg, "rhs")
        d = _grad_matmul(G, jnp.swapaxes(b, -1, -2), cfg.grad_lhs)
        order, shape = [*lb, *lf, *lc], lhs_shape
    d = d.reshape(tuple(shape[i] for i in order))
    return jnp.transpose(d, [order.index(a) for a in axes]).astype(eqn.outvars[0].aval.dtype)
