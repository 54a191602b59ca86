"""The public GEMM entry points: :func:`matmul`, :func:`dot_general` (a ``jax.lax.dot_general``
drop-in for Flax/Equinox layers) and :func:`einsum`, each checking its arguments and running the
pipeline (config -> quantise -> plan -> execute -> reduce -> epilogue, differentiable).

    >>> import functools, jax.numpy as jnp, tcemu
    >>> dot = functools.partial(tcemu.dot_general, config=tcemu.GemmConfig(arch="A100"))
    >>> dot(jnp.ones((2, 8)), jnp.ones((8, 3)), (((1,), (0,)), ((), ()))).tolist()[0]
    [8.0, 8.0, 8.0]
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from tcemu._src import formats as fm
from tcemu._src.checks import check_key, real_array
from tcemu._src.gemm.autodiff import emulated_matmul, emulated_parts
from tcemu._src.gemm.config import GemmConfig, as_config
from tcemu._src.gemm.epilogue import OUT_TYPES, finish, finish_serial
from tcemu._src.gemm.kscales import check_scales, matmul_kscaled

_OUT_DTYPES = {jnp.dtype(jnp.float32): "f32", jnp.dtype(jnp.float16): "f16", jnp.dtype(jnp.bfloat16): "bf16",
               jnp.dtype(jnp.float8_e4m3fn): "e4m3", jnp.dtype(jnp.float8_e5m2): "e5m2"}


def _out_type(v, where: str) -> str:
    """An output type name of ``OUT_TYPES`` from a name or a dtype."""
    if isinstance(v, str) and v in OUT_TYPES:
        return v
    try:
        name = _OUT_DTYPES.get(jnp.dtype(v))
    except TypeError:
        name = None
    if name is None:
        raise ValueError(f"{where}: out_type must be one of {', '.join(OUT_TYPES)} (or the JAX dtype), got {v!r}")
    return name


def _epilogue_operands(where: str, out_shape, *, alpha, beta, c, bias, scale_a, scale_b) -> dict:
    """The checked epilogue operands: scalars ``alpha``, ``beta``; arrays ``c``, ``bias``,
    ``scale_a``, ``scale_b`` that broadcast to the output's shape."""
    if beta is not None and c is None:
        raise ValueError(f"{where}: beta scales c; give c= with beta=")
    ops = {}
    for name, v in (("alpha", alpha), ("beta", beta)):
        if v is not None:
            v = real_array(v, where, name)
            if v.ndim:
                raise ValueError(f"{where}: {name} must be a scalar, got shape {v.shape}")
            ops[name] = v
    for name, v in (("c", c), ("bias", bias), ("scale_a", scale_a), ("scale_b", scale_b)):
        if v is None:
            continue
        v = real_array(v, where, name)
        try:
            ok = np.broadcast_shapes(v.shape, tuple(out_shape)) == tuple(out_shape)
        except ValueError:
            ok = False
        if not ok:
            raise ValueError(f"{where}: {name} of shape {v.shape} does not broadcast to the output's shape "
                             f"{tuple(out_shape)}" + (" (bias: (N,), one value per output column)" if name == "bias" else ""))
        ops[name] = v
    return ops


def matmul(a, b, *, c=None, bias=None, alpha=None, beta=None, scale_a=None, scale_b=None, out_type=None,
           config: GemmConfig | None = None, key=None, **kwargs):
    """``a @ b`` for (..., M, K) and (..., K, N) (or (K, N)) with a tensor core's exact numerics,
    and the kernel's epilogue: ``out_type(scale_a * scale_b * alpha * (a @ b) + beta * c + bias)``.

    ``config`` (a :class:`GemmConfig`) or its fields as keywords (``arch=``, ``instruction=``,
    ``k_order=``, ...). Inputs are rounded to the instruction's formats (straight-through
    gradient). The epilogue (:class:`tcemu.Epilogue`, ``config.epilogue``: in which order and
    precision) takes ``scale_a`` and ``scale_b`` (fp8 scales: scalars per tensor, or (..., M, 1)
    and (1, N) row-wise; with ``Epilogue(scale_block=128)`` block scales along K, (..., M, K / 128)
    and (..., K / 128, N), applied at each promotion: :mod:`~tcemu._src.gemm.kscales`), scalars
    ``alpha`` and ``beta``, ``c`` (broadcasting to (..., M, N)) and
    ``bias`` ((N,), added to every row as ``nn.Linear``'s); absent operands are skipped. The
    result has ``out_type`` ("f32", "f16", "bf16", "e4m3", "e5m2" or the dtype; default float32,
    where an f16-accumulating instruction's D is widened exactly).
    Differentiable: the backward GEMMs follow ``config.grad_lhs`` / ``config.grad_rhs``, the
    epilogue's roundings pass gradients straight through.
    ``key``: PRNG key for stochastic quantisation or rounding. With K = 0 the product is +0 (the
    accumulator's initial value), with M = 0 or N = 0 an empty array, as ``jnp.matmul`` gives.

    >>> import jax.numpy as jnp, tcemu
    >>> a = jnp.array([[1.0] + [2.0**-12] * 4], jnp.bfloat16)      # 1 + four products of 2**-25
    >>> b = jnp.array([[1.0] + [2.0**-13] * 4], jnp.bfloat16).T
    >>> [float(tcemu.matmul(a, b, arch=g)[0, 0]) for g in ("A100", "H100")]   # 24 and 25 fraction bits
    [1.0, 1.0000001192092896]
    >>> x = jnp.ones((2, 3)); w = jnp.ones((3, 4)); b = jnp.arange(4.0)
    >>> tcemu.matmul(x, w, bias=b, out_type="bf16", arch="H100").tolist()[0]   # x @ w + b
    [3.0, 4.0, 5.0, 6.0]
    """
    cfg = as_config(config, kwargs, "matmul")
    key = check_key(key, "matmul")
    a = real_array(a, "matmul", "a")
    b = real_array(b, "matmul", "b")
    if a.ndim < 2 or b.ndim < 2 or a.shape[-1] != b.shape[-2]:
        raise ValueError(f"matmul needs (..., M, K) @ (..., K, N), got {a.shape} and {b.shape}")
    batch = a.shape[:-2]
    if b.ndim > 2:
        try:
            batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        except ValueError:
            raise ValueError(f"matmul: the batch axes of a {a.shape} and b {b.shape} do not broadcast "
                             f"({a.shape[:-2]} vs {b.shape[:-2]})") from None
    if cfg.quantize == "stochastic" and key is None:
        raise ValueError("quantize='stochastic' needs key=jax.random.key(...)")
    out_shape = tuple(batch) + (a.shape[-2], b.shape[-1])
    out = "f32" if out_type is None else _out_type(out_type, "matmul")
    kscales = None
    if cfg.epilogue.scale_block:  # block scales along K: applied in the mainloop, not the epilogue
        kscales = check_scales("matmul", cfg, a.shape, b.shape, scale_a, scale_b)
        scale_a = scale_b = None
    ops = _epilogue_operands("matmul", out_shape, alpha=alpha, beta=beta, c=c, bias=bias, scale_a=scale_a,
                             scale_b=scale_b)
    if 0 in out_shape:
        return jnp.zeros(out_shape, fm.VALUE_DTYPES[out])
    if serial_epilogue(cfg, a.shape[-1], ops):
        if kscales is not None:
            raise ValueError("matmul: serial split-K (KSchedule(reduction='serial')) with epilogue operands runs the "
                             "epilogue slice by slice; block scales along K (Epilogue.scale_block) are not taken there")
        return finish_serial(emulated_parts(a, b, key, cfg), ops, out, cfg.k_schedule.partials, cfg.epilogue)
    if a.shape[-1] == 0:  # no products: D = +0, the chain's first C
        acc = jnp.zeros(out_shape, jnp.float32)
    elif kscales is not None:
        acc = matmul_kscaled(a, b, *kscales, key, cfg)
    else:
        acc = emulated_matmul(a, b, key, cfg)
    return acc if out == "f32" and not ops else finish(acc, ops, out, cfg.epilogue)


def serial_epilogue(cfg: GemmConfig, K: int, ops: dict) -> bool:
    """Whether the epilogue runs slice by slice: serial split-K with several slices at this K and
    epilogue operands (:func:`~tcemu._src.gemm.epilogue.apply_serial`)."""
    s = cfg.k_schedule
    return bool(ops) and K > 0 and s.reduction == "serial" and s.plan(K, cfg.ins.k).slices > 1


def _dimension_numbers(dimension_numbers, lhs, rhs):
    """Checked ((lhs_contracting, rhs_contracting), (lhs_batch, rhs_batch)) as tuples of ints,
    with the rules of :func:`jax.lax.dot_general`."""
    form = "((lhs_contracting, rhs_contracting), (lhs_batch, rhs_batch))"
    try:
        (lc, rc), (lb, rb) = dimension_numbers
        dims = [tuple(d) for d in (lc, rc, lb, rb)]
    except (TypeError, ValueError):
        raise TypeError(f"dot_general: dimension_numbers must be {form} (sequences of ints), "
                        f"got {dimension_numbers!r}") from None
    names = ("lhs_contracting", "rhs_contracting", "lhs_batch", "rhs_batch")
    for name, d, x in zip(names, dims, (lhs, rhs, lhs, rhs)):
        if any(not isinstance(i, (int, np.integer)) or isinstance(i, (bool, np.bool_)) for i in d):
            raise TypeError(f"dot_general: dimension_numbers {name} must be ints, got {d}")
        if any(not 0 <= i < x.ndim for i in d):
            raise ValueError(f"dot_general: dimension_numbers {name} {d} out of range for an operand of rank "
                             f"{x.ndim} (valid: 0..{x.ndim - 1}; negative dimensions are not accepted, as in "
                             "jax.lax.dot_general)")
    lc, rc, lb, rb = (tuple(int(i) for i in d) for d in dims)
    for side, c, bt in (("lhs", lc, lb), ("rhs", rc, rb)):
        if len(set(c + bt)) != len(c + bt):
            raise ValueError(f"dot_general: dimension_numbers {side} contracting {c} and batch {bt} dimensions "
                             "must be distinct")
    for what, ld, rd in (("contracting", lc, rc), ("batch", lb, rb)):
        if len(ld) != len(rd):
            raise ValueError(f"dot_general: dimension_numbers give {len(ld)} lhs and {len(rd)} rhs {what} dimensions")
        ls, rs = tuple(lhs.shape[i] for i in ld), tuple(rhs.shape[i] for i in rd)
        if ls != rs:
            raise ValueError(f"dot_general: dimension_numbers {what} dimensions {ld} of lhs {lhs.shape} and {rd} of "
                             f"rhs {rhs.shape} have sizes {ls} and {rs}")
    return lc, rc, lb, rb


def dot_general(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None, *,
                out_sharding=None, config: GemmConfig | None = None, key=None, c=None, bias=None, alpha=None,
                beta=None, scale_a=None, scale_b=None):
    """Drop-in for :func:`jax.lax.dot_general` computing with :func:`matmul`'s emulated numerics.

    Use ``functools.partial(tcemu.dot_general, config=tcemu.GemmConfig(...))`` as the
    ``dot_general`` of ``flax.nnx.Linear`` / ``flax.linen.Dense``. ``precision`` is ignored (the
    config decides); ``preferred_element_type`` sets the output dtype (default: the promoted
    input dtype, as in JAX), rounded by the epilogue. The epilogue operands are
    :func:`matmul`'s, broadcasting against the output in ``dot_general``'s layout (batch, lhs
    free, rhs free dimensions).

    >>> import jax.numpy as jnp, tcemu
    >>> x = jnp.ones((8, 2), jnp.bfloat16); y = jnp.ones((8, 3), jnp.bfloat16)
    >>> out = tcemu.dot_general(x, y, (((0,), (0,)), ((), ())), config=tcemu.GemmConfig(arch="H100"))
    >>> out.shape, out.dtype, float(out[0, 0])                  # x.T @ y
    ((2, 3), dtype(bfloat16), 8.0)
    """
    cfg = as_config(config, {}, "dot_general")
    if cfg.epilogue.scale_block:
        raise ValueError("dot_general: block scales along K (Epilogue.scale_block) are taken by tcemu.matmul, "
                         "with scale_a (..., M, K / block) and scale_b (..., K / block, N)")
    lhs = real_array(lhs, "dot_general", "lhs")
    rhs = real_array(rhs, "dot_general", "rhs")
    lc, rc, lb, rb = _dimension_numbers(dimension_numbers, lhs, rhs)
    try:
        dtype = jnp.dtype(preferred_element_type or jnp.result_type(lhs.dtype, rhs.dtype))
    except TypeError:
        raise TypeError(f"dot_general: preferred_element_type must be a dtype such as jnp.float32, "
                        f"got {preferred_element_type!r}") from None
    lf = [i for i in range(lhs.ndim) if i not in lc and i not in lb]
    rf = [i for i in range(rhs.ndim) if i not in rc and i not in rb]
    ls, rs = lhs.shape, rhs.shape
    size = lambda shape, idx: int(np.prod([shape[i] for i in idx], dtype=np.int64))  # noqa: E731
    L = jnp.transpose(lhs, lb + tuple(lf) + lc).reshape(size(ls, lb), size(ls, lf), size(ls, lc))
    R = jnp.transpose(rhs, rb + rc + tuple(rf)).reshape(size(rs, rb), size(rs, rc), size(rs, rf))
    shape = tuple(ls[i] for i in lb) + tuple(ls[i] for i in lf) + tuple(rs[i] for i in rf)
    ops = _epilogue_operands("dot_general", shape, alpha=alpha, beta=beta, c=c, bias=bias, scale_a=scale_a,
                             scale_b=scale_b)
    lhs2, rhs2 = (L if lb else L[0]), (R if rb else R[0])
    if dtype in _OUT_DTYPES and serial_epilogue(cfg, L.shape[-1], ops) and 0 not in shape:
        mshape = lhs2.shape[:-1] + rhs2.shape[-1:]  # the operands in matmul's layout
        mops = {k: v if not v.ndim else jnp.broadcast_to(v, shape).reshape(mshape) for k, v in ops.items()}
        out = matmul(lhs2, rhs2, config=cfg, key=key, out_type=_OUT_DTYPES[dtype], **mops).reshape(shape)
        return out if out_sharding is None else jax.lax.with_sharding_constraint(out, out_sharding)
    out = matmul(lhs2, rhs2, config=cfg, key=key).reshape(shape)
    if dtype in _OUT_DTYPES and 0 not in shape:
        out = finish(out, ops, _OUT_DTYPES[dtype], cfg.epilogue)
    elif ops:
        raise ValueError(f"dot_general: epilogue operands need an output type of {', '.join(OUT_TYPES)}, "
                         f"got preferred_element_type {dtype}")
    else:
        out = out.astype(dtype)
    if out_sharding is not None:
        out = jax.lax.with_sharding_constraint(out, out_sharding)
    return out


def einsum(subscripts, *operands, config: GemmConfig | None = None, key=None, c=None, bias=None, alpha=None,
           beta=None, scale_a=None, scale_b=None, **kwargs):
    """:func:`jax.numpy.einsum` whose contractions run through :func:`dot_general`. Subscripts
    that do not fit the operands raise a ValueError naming ``subscripts``. With two operands
    (one contraction) it takes :func:`matmul`'s epilogue operands, broadcasting against the
    output; the output type is ``preferred_element_type`` (default: the inputs' type).

    >>> import jax.numpy as jnp, tcemu
    >>> a = jnp.ones((2, 1, 16), jnp.float16); b = jnp.ones((2, 16, 3), jnp.float16)
    >>> out = tcemu.einsum("bij,bjk->bik", a, b, config=tcemu.GemmConfig(arch="A100"))
    >>> out.shape, out[1].tolist()
    ((2, 1, 3), [[16.0, 16.0, 16.0]])
    >>> tcemu.einsum("bij,bjk->bik", a, b, bias=jnp.arange(3.0), config=tcemu.GemmConfig(arch="A100"))[0].tolist()
    [[16.0, 17.0, 18.0]]
    """
    cfg = as_config(config, {}, "einsum")
    if cfg.epilogue.scale_block:
        raise ValueError("einsum: block scales along K (Epilogue.scale_block) are taken by tcemu.matmul, "
                         "with scale_a (..., M, K / block) and scale_b (..., K / block, N)")
    dg = functools.partial(dot_general, config=cfg, key=check_key(key, "einsum"))
    if not isinstance(subscripts, str):
        raise TypeError(f"einsum: subscripts must be a string such as 'ij,jk->ik', got {type(subscripts).__name__}")
    operands = [real_array(x, "einsum", f"operand {i}") for i, x in enumerate(operands)]
    try:  # jnp.einsum's own checks of the subscripts against the operands, before any contraction
        shape = jax.eval_shape(lambda *xs: jnp.einsum(subscripts, *xs, **kwargs), *operands)
    except (ValueError, TypeError, IndexError) as e:
        raise ValueError(f"einsum: subscripts {subscripts!r} do not fit operands of shapes "
                         f"{[x.shape for x in operands]}: {e}") from None
    given = dict(c=c, bias=bias, alpha=alpha, beta=beta, scale_a=scale_a, scale_b=scale_b)
    if all(v is None for v in given.values()):
        return jnp.einsum(subscripts, *operands, _dot_general=dg, **kwargs)
    if len(operands) != 2 or shape.dtype not in _OUT_DTYPES:
        raise ValueError(f"einsum: epilogue operands need two operands (one contraction) and an output type of "
                         f"{', '.join(OUT_TYPES)}; got {len(operands)} operands, output {shape.dtype}")
    ops = _epilogue_operands("einsum", shape.shape, **given)
    if cfg.k_schedule.reduction == "serial":
        raise ValueError("einsum: serial split-K (KSchedule(reduction='serial')) runs the epilogue slice by slice, "
                         "which needs the operands in a GEMM's layout: use tcemu.dot_general or tcemu.matmul with "
                         "c=, bias=, alpha=, beta=")
    acc = jnp.einsum(subscripts, *operands, _dot_general=dg, **(kwargs | {"preferred_element_type": jnp.float32}))
    return finish(acc, ops, _OUT_DTYPES[shape.dtype], cfg.epilogue)
