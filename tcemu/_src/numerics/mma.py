"""Numerics of one MMA instruction on matrices of bit patterns, for every input family.

``mma_bits(ins, a, b, c, model)`` is what both the register-level instructions and the value
level :func:`tcemu.mma` call, so the two agree bit for bit by construction.

Operand encodings: floating point as uint32 bit patterns of their PTX type (tf32: the float32
pattern), float64 as uint64 patterns (x64 required), integers as int32 values (s8/s4 sign
extended, b1 as 0/1); the result in the same encoding for ``.dtype``. ``ins`` is a parsed MMA
(:class:`tcemu._src.isa.instructions.Mma`), read by its fields: the numerics do not import the ISA.
"""
from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp

from tcemu._src import formats as fm
from tcemu._src import sharding
from tcemu._src.numerics import engine, fma64, grouped, integer
from tcemu._src.numerics.backends import kernel_for
from tcemu._src.numerics.model import BlockFMA
from tcemu._src.numerics.presets import ArchNumerics, numerics

def resolve_model(ins, model, arch) -> BlockFMA:
    """The :class:`BlockFMA` for a floating-point instruction: ``model`` if it is one, else the
    ``ArchNumerics`` given (or the preset of ``arch``)."""
    if isinstance(model, BlockFMA):
        m = model
    else:
        nums = model if isinstance(model, ArchNumerics) else numerics(arch)
        m = nums.for_instruction(ins)
        if m is None:
            raise ValueError(f"{ins.spelling!r}: no {ins.family} {ins.kind} numerics for {nums.arch}; "
                             "pass model=tcemu.BlockFMA(...) to use your own")
    if (m.scale_group is not None) != (ins.family == "mxf4"):
        raise ValueError(f"{ins.spelling!r}: BlockFMA.scale_group is for the block-scaled fp4 kinds "
                         "(.kind::mxf4, .kind::mxf4nvf4), which need it; got scale_group="
                         f"{m.scale_group}")
    if ins.family == "mxf4":
        grouped.check_grouped(m, repr(ins.spelling), k=ins.k, block=ins.scale_block)
    return m


def _float_plan(ins, m: BlockFMA):
    """(accumulator, C format, widen C to f32?, narrow D to f16?) of a floating-point MMA."""
    if ins.ctype == ins.dtype and not (ins.dtype == "f16" and m.f16_accumulation == "f32"):
        return ins.dtype, fm.FORMATS[ins.ctype], False, False
    # .f32.f16: C widened to f32 exactly; .f16.f32: f32 accumulation, then cvt.rn.f16.f32
    return "f32", fm.F32, ins.ctype == "f16", ins.dtype == "f16"


def mma_bits(ins, a, b, c, model, *, arch="sm_90", key=None, scale_a=None, scale_b=None,
             over_devices: bool = False):
    """``D = A @ B + C`` of instruction ``ins`` on encoded operands (see module docstring);
    block-scaled kinds take ``scale_a`` (..., M, K / block) and ``scale_b`` (..., K / block, N)
    scale-factor codes. ``over_devices``: the compiled kernel's call is partitioned over the
    leading axes (:func:`tcemu._src.sharding.over_batch`), for callers that are not partitioned
    themselves (the GEMM is)."""
    fam = ins.family
    if fam == "int":
        return integer.int_mma(a, b, c, satfinite=ins.satfinite)
    if fam == "b1":
        return integer.b1_mma(a, b, c, op=ins.op)
    if fam == "f64":
        return fma64.fma_chain_bits(a, b, c, ins.rnd)
    m = resolve_model(ins, model, arch)
    if ins.scale_vec is not None:
        return _scaled(ins, m, a, b, c, scale_a, scale_b, key, over_devices)
    kernel = _kernel(ins, m)
    if kernel is not None:
        return _native(kernel, ins, m, a, b, c, over_devices=over_devices)
    prep = engine.prepare(a, fm.FORMATS[ins.atype], b, fm.FORMATS[ins.btype], m)
    return _float_prepared(ins, m, prep, c, key)


def _kernel(ins, m: BlockFMA):
    """The compiled kernel that computes this instruction's numerics (float32 accumulation, a
    model it covers; :func:`~tcemu._src.numerics.backends.kernel_for`), or None."""
    if ins.family in ("int", "b1", "f64") or m.scale_group is not None or m.addend_rounding == "stochastic":
        return None
    return kernel_for(m.replace(addend="first"), fm.FORMATS[ins.atype], fm.FORMATS[ins.btype], ins.k,
                      _float_plan(ins, m)[0])


def _native(kernel, ins, m: BlockFMA, a, b, c, a_exp=None, b_exp=None, scale_block=0, over_devices=False):
    """:func:`_float_prepared` on the compiled ``kernel``: one chain of K from C (``addend="last"``:
    from +0, then one addition of C), over every leading batch axis in one call (``over_devices``:
    each device on its shard of them); ``a_exp`` / ``b_exp`` exponents per element, or per block
    of ``scale_block`` elements."""
    def call(a, b, c, a_exp, b_exp):
        return kernel.chains(a, b, fm.FORMATS[ins.atype], fm.FORMATS[ins.btype], m.replace(addend="first"),
                             k=ins.k, chain_k=ins.k, lens=[ins.k], a_exp=a_exp, b_exp=b_exp, c=c,
                             scale_block=scale_block)[..., 0, :, :]

    def dot(c, cfmt, acc):  # acc is "f32" here (_kernel)
        last = m.addend == "last"
        args = (a, b, None if last else c, a_exp, b_exp)
        d = sharding.over_batch(call, *args) if over_devices else call(*args)
        if last:
            d = engine._add(d, fm.F32, c, cfmt, m, out=engine.accumulator_format(m, acc), mode=m.addend_rounding)
        return d

    return _with_c_and_d(ins, m, c, dot)


def _scaled(ins, m: BlockFMA, a, b, c, scale_a, scale_b, key, over_devices=False):
    """Block-scaled kinds: scale exponents added to the products (mxf8f6f4, ue8m0 scales) or
    grouped products (mxf4, mxf4nvf4); a NaN scale makes the outputs it touches NaN."""
    sa, sb = fm.decode_scale(scale_a, ins.stype), fm.decode_scale(scale_b, ins.stype)
    blk = ins.scale_block
    if m.scale_group is not None:
        d = grouped.grouped_dot(jnp.asarray(a).astype(jnp.uint32), jnp.asarray(b).astype(jnp.uint32), c, sa, sb,
                                blk, m)
    else:  # ue8m0: a power of two per block, added to the exponents of its elements
        kernel = _kernel(ins, m)
        if kernel is not None:
            d = _native(kernel, ins, m, a, b, c, sa.exp, sb.exp, scale_block=blk, over_devices=over_devices)
        else:
            a_exp, b_exp = jnp.repeat(sa.exp, blk, axis=-1), jnp.repeat(sb.exp, blk, axis=-2)
            prep = engine.prepare(a, fm.FORMATS[ins.atype], b, fm.FORMATS[ins.btype], m, a_exp=a_exp, b_exp=b_exp)
            d = _float_prepared(ins, m, prep, c, key, min_scale_exp=-254)
    nan = jnp.any(sa.is_nan, axis=-1)[..., :, None] | jnp.any(sb.is_nan, axis=-2)[..., None, :]
    return jnp.where(nan, jnp.uint32(fm.F32.canonical_nan), d)


def _with_c_and_d(ins, m: BlockFMA, c, dot):
    """``dot(c, C format, accumulator)`` with C widened first (``.f32.f16``) and D narrowed after
    (``.f16.f32``), as :func:`_float_plan` says."""
    acc, cfmt, widen, narrow = _float_plan(ins, m)
    c = jnp.asarray(c).astype(jnp.uint32)
    if widen:
        c = engine.convert(c, fm.F16, fm.F32)
    d = dot(c, cfmt, acc)
    return engine.convert(d, fm.F32, fm.F16, "rne") if narrow else d


def _float_prepared(ins, m: BlockFMA, prep, c, key, min_scale_exp: int = 0):
    return _with_c_and_d(ins, m, c, lambda c, cfmt, acc: engine.fused_dot_prepared(
        prep, fm.FORMATS[ins.atype], fm.FORMATS[ins.btype], c, cfmt, m, acc=acc, key=key, min_scale_exp=min_scale_exp))


@functools.cache
def chunk_terms() -> int:
    """Products per chunk of a batched call: small enough for the CPU caches, large for GPUs
    (override with the environment variable ``TCEMU_CHUNK_TERMS``, read once per process at first
    use: ``chunk_terms.cache_clear()`` reads it again)."""
    env = os.environ.get("TCEMU_CHUNK_TERMS")
    if not env:
        return 1 << 23 if jax.default_backend() == "cpu" else 1 << 29
    if not env.strip().isdecimal() or int(env) < 1:
        raise ValueError(f"TCEMU_CHUNK_TERMS={env!r}; valid: a positive integer (products per chunk), or unset")
    return int(env)


def mma_bits_batched(ins, a, b, c, model, *, arch="sm_90", key=None, scale_a=None, scale_b=None,
                     over_devices: bool = False):
    """:func:`mma_bits` over leading batch axes (already broadcast), in chunks of tiles run by a
    ``lax.scan``: the operands are decoded once outside the loop (the loop boundary keeps XLA
    from decoding them again for every product), intermediates stay cache-sized and memory stays
    bounded."""
    batch = a.shape[:-2]
    T = 1
    for s in batch:
        T *= s
    per = max(1, chunk_terms() // (ins.m * ins.n * ins.k))
    m = None if ins.family in ("int", "b1", "f64") else resolve_model(ins, model, arch)
    if T <= per or (m is not None and m.scale_group is None and _kernel(ins, m) is not None):  # the kernel takes any batch
        return mma_bits(ins, a, b, c, model, arch=arch, key=key, scale_a=scale_a, scale_b=scale_b,
                        over_devices=over_devices)
    n = -(-T // per)

    def chunks(x):
        x = x.reshape((T,) + x.shape[len(batch):])
        x = jnp.concatenate([x, jnp.zeros((n * per - T,) + x.shape[1:], x.dtype)]) if n * per > T else x
        return x.reshape((n, per) + x.shape[1:])

    keys = None if key is None else jax.random.split(key, n)
    fa, fb = fm.FORMATS.get(ins.atype), fm.FORMATS.get(ins.btype)
    if ins.scale_vec is not None:
        def body(_, x):
            return None, mma_bits(ins, x[0], x[1], x[2], model, arch=arch, key=x[3], scale_a=x[4], scale_b=x[5])

        _, out = jax.lax.scan(body, None, (chunks(a), chunks(b), chunks(c), keys, chunks(scale_a), chunks(scale_b)))
    elif m is None or engine._use_float(fa, fb, m):
        # integer MMAs, and fp16/fp8 on the float32 path: the loop decodes the operand bits
        # itself (measured faster than reading four decoded arrays)
        def body(_, x):
            return None, mma_bits(ins, x[0], x[1], x[2], model, arch=arch, key=x[3])

        _, out = jax.lax.scan(body, None, (chunks(a), chunks(b), chunks(c), keys))
    else:
        # bf16/tf32 (integer alignment): decode once, outside the loop
        prep = jax.tree_util.tree_map(chunks, engine.prepare(a, fa, b, fb, m))

        def body(_, x):
            p, cc, k = x
            return None, _float_prepared(ins, m, p, cc, k)

        _, out = jax.lax.scan(body, None, (prep, chunks(c), keys))
    return out.reshape((n * per,) + out.shape[2:])[:T].reshape(batch + out.shape[2:])


def mma_bits_vmappable(ins, model, arch):
    """``(a, b, c) -> mma_bits(ins, a, b, c, ...)`` for one instruction whose ``jax.vmap`` (the
    register-level instructions vmapped over warps) runs :func:`mma_bits_batched` on the whole
    batch: chunked, not one vmapped copy of every intermediate (9x faster for f16 accumulators on
    the CPU, m64n64k16 over 256 warpgroups)."""

    @jax.custom_batching.custom_vmap
    def run(a, b, c):
        return mma_bits(ins, a, b, c, model, arch=arch, over_devices=True)

    @run.def_vmap
    def _batched(axis_size, in_batched, a, b, c):
        a, b, c = (x if bt else jnp.broadcast_to(x, (axis_size,) + x.shape) for x, bt in zip((a, b, c), in_batched))
        return mma_bits_batched(ins, a, b, c, model, arch=arch, over_devices=True), True

    return run
