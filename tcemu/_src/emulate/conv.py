"""``conv_general_dilated`` as the implicit GEMM of cuDNN / CUTLASS, run by ``tcemu.dot_general``.

The input is padded (``padding``, with ``lhs_dilation`` as interior padding) and cut into one
strided slice per kernel tap (``window_strides``, ``rhs_dilation``): the patches, pure data
movement, so every value (inf, NaN, -0) reaches the GEMM unchanged. One GEMM per group then
multiplies the (batch x output pixels, K) patches by the (K, output channels) kernel, **K running
over (kernel taps, input channels) with the input channel fastest**: for a 2-D R x S kernel over
C channels, K index ``(r * S + s) * C + c`` (the NHWC implicit-GEMM order). Feature groups
split the input channels, batch groups the input batch (group-major, as JAX does); the output
channels are group-major.

    >>> import jax, jax.numpy as jnp, tcemu
    >>> from tcemu._src.emulate.conv import emulated_conv
    >>> x = jnp.arange(2 * 3 * 5 * 5, dtype=jnp.float32).reshape(2, 3, 5, 5) % 7
    >>> w = jnp.arange(4 * 3 * 3 * 3, dtype=jnp.float32).reshape(4, 3, 3, 3) % 5
    >>> params = dict(window_strides=(2, 1), padding=((1, 1), (0, 2)), lhs_dilation=(1, 1), rhs_dilation=(1, 2),
    ...               dimension_numbers=jax.lax.conv_dimension_numbers(x.shape, w.shape, ("NCHW", "OIHW", "NCHW")),
    ...               feature_group_count=1, batch_group_count=1)
    >>> ref = jax.lax.conv_general_dilated(x, w, **params)
    >>> out = emulated_conv(x, w, params, ref.shape, ref.dtype, tcemu.GemmConfig(arch="H100"))
    >>> bool((out == ref).all())
    True
"""
from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np

from tcemu._src.gemm import GemmConfig, dot_general


def patches(x, kernel, out_spatial, params):
    """(N, out spatial..., taps, C) patches of ``x`` (N, spatial..., C), taps in row-major order
    of the kernel positions."""
    strides, padding = params["window_strides"], params["padding"]
    lhs_dil, rhs_dil = params["lhs_dilation"], params["rhs_dilation"]
    pad = [(0, 0, 0)] + [(lo, hi, d - 1) for (lo, hi), d in zip(padding, lhs_dil)] + [(0, 0, 0)]
    xp = jax.lax.pad(x, jnp.zeros((), x.dtype), pad)
    taps = []
    for pos in itertools.product(*map(range, kernel)):
        start = [0] + [p * d for p, d in zip(pos, rhs_dil)] + [0]
        limit = ([xp.shape[0]] + [s + ((o - 1) * st + 1 if o else 0) for s, o, st in zip(start[1:-1], out_spatial, strides)]
                 + [xp.shape[-1]])
        taps.append(jax.lax.slice(xp, start, limit, [1] + list(strides) + [1]))
    return jnp.stack(taps, axis=-2)


def emulated_conv(lhs, rhs, params: dict, out_shape, out_dtype, config: GemmConfig, out_sharding=None):
    """``jax.lax.conv_general_dilated(lhs, rhs, **params)`` (the primitive's parameters, padding
    explicit) with the implicit GEMM emulated by ``tcemu.dot_general(config=config)``."""
    lhs_spec, rhs_spec, out_spec = params["dimension_numbers"]
    fg, bg = params["feature_group_count"], params["batch_group_count"]
    groups = fg * bg
    x = jnp.transpose(lhs, (lhs_spec[0],) + tuple(lhs_spec[2:]) + (lhs_spec[1],))  # N, spatial..., C
    w = jnp.transpose(rhs, tuple(rhs_spec[2:]) + (rhs_spec[1], rhs_spec[0]))  # spatial..., I, O
    kernel, (I, O) = w.shape[:-2], w.shape[-2:]
    out_spatial = [out_shape[d] for d in out_spec[2:]]
    p = patches(x, kernel, out_spatial, params)  # N, out..., P, C
    N, C, P, pix = x.shape[0], x.shape[-1], math.prod(kernel), math.prod(out_spatial)
    if bg > 1:  # the input batch split group-major
        a = p.reshape(bg, (N // bg) * pix, P * C)
    else:
        a = p.reshape(N * pix, P, fg, C // fg).transpose(2, 0, 1, 3).reshape(fg, N * pix, P * (C // fg))
    b = w.reshape(P, I, groups, O // groups).transpose(2, 0, 1, 3).reshape(groups, P * I, O // groups)
    if groups == 1:
        y = dot_general(a[0], b[0], (((1,), (0,)), ((), ())), preferred_element_type=out_dtype, config=config)[None]
    else:
        y = dot_general(a, b, (((2,), (1,)), ((0,), (0,))), preferred_element_type=out_dtype, config=config)
    y = y.transpose(1, 0, 2).reshape((N // bg,) + tuple(out_spatial) + (O,))  # batch, out..., channels
    order = (out_spec[0],) + tuple(out_spec[2:]) + (out_spec[1],)  # where each axis of y goes
    y = jnp.transpose(y, tuple(np.argsort(order)))
    if out_sharding is not None:
        y = jax.lax.with_sharding_constraint(y, out_sharding)
    return y
