"""The emulated GEMM on bit patterns: the plan of the config's K schedule, run on a compiled
kernel where one computes the numerics (chosen here, in one place:
:func:`~tcemu._src.numerics.backends.kernel_for`), else in pure JAX; batches of GEMMs partitioned
over devices as their inputs are sharded.

    >>> import jax.numpy as jnp, tcemu
    >>> from tcemu._src.gemm.execute import gemm_bits
    >>> cfg = tcemu.GemmConfig(arch="H100", instruction="m16n8k16.f32.f16.f16.f32")
    >>> one = jnp.full((16, 32), 0x3C00, jnp.uint32)           # f16 1.0 bit patterns
    >>> d, fmt = gemm_bits(one, one.T, cfg)
    >>> hex(int(d[0, 0])), fmt.name                               # 32.0 in float32
    ('0x42000000', 'f32')
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from tcemu._src import formats as fm
from tcemu._src import sharding
from tcemu._src.gemm import kernel as on_kernel
from tcemu._src.gemm import xla
from tcemu._src.gemm.config import GemmConfig
from tcemu._src.gemm.plan import chain_blocks, check_block_aligned
from tcemu._src.numerics.backends import kernel_for


def kernel_of(cfg: GemmConfig):
    """The compiled kernel that runs this config's GEMMs (f32 accumulation, a deterministic model
    it covers), or None: the pure-JAX path."""
    return _kernel(cfg.ins, cfg.numerics)


def _kernel(ins, model):
    if ins.dtype != "f32" or model.stochastic:
        return None
    return kernel_for(model, fm.FORMATS[ins.atype], fm.FORMATS[ins.btype], ins.k, "f32", gemm=True)


def gemm_bits(a_bits, b_bits, cfg: GemmConfig, key=None, scales=None):
    """Emulated (M, K) @ (K, N) on bit patterns of the instruction's input types, following
    ``cfg.k_schedule``; block-scaled instructions take ``scales`` = (A's (M, K / block), B's
    (K / block, N)) scale codes, and a config with block scales along K
    (``cfg.epilogue.scale_block``) the float32 bits of its scales in the same shapes.

    Returns (D bits (M, N), format of D): the accumulator format when one chain of instructions
    makes D, float32 when partial results are added (slices, promotion).
    """
    ins, model = cfg.ins, cfg.numerics
    plan = cfg.k_schedule.plan(a_bits.shape[1], ins.k)
    kscales = None
    if cfg.epilogue.scale_block:
        kscales = _k_scales(plan, a_bits.shape[1], scales, cfg)
        scales = None
    elif scales is not None:
        check_block_aligned(plan, ins.scale_block, repr(ins.spelling))
    kernel = _kernel(ins, model)
    if kernel is not None:
        out = on_kernel.run(kernel, a_bits, b_bits, ins, model, plan, scales, kscales)
        if out is not None:
            return out
    return xla.run(a_bits, b_bits, ins, model, plan, cfg.arch, key, scales, kscales)


def _k_scales(plan, K: int, scales, cfg: GemmConfig):
    """(order, each chain's block, A's scale bits (M, blocks + 1), B's (blocks + 1, N)): the last
    block's scales are 1.0, for chains that read no element."""
    if plan.group == 0:
        raise ValueError("block scales along K (Epilogue.scale_block) need a K schedule with promotion: "
                         "k_order='promotion' or schedule=KSchedule(promotion=...)")
    blocks = chain_blocks(plan, K, cfg.epilogue.scale_block, "Epilogue.scale_block")
    one = jnp.uint32(0x3F800000)
    sa = jnp.concatenate([scales[0], jnp.full((scales[0].shape[0], 1), one)], axis=1)
    sb = jnp.concatenate([scales[1], jnp.full((1, scales[1].shape[1]), one)], axis=0)
    return cfg.epilogue.scales, blocks, sa, sb


def out_format(cfg: GemmConfig, K: int) -> fm.FloatFormat:
    """The format :func:`gemm_bits` returns D in, for this K."""
    return fm.F32 if cfg.k_schedule.plan(K, cfg.ins.k).reduces else fm.FORMATS[cfg.ins.dtype]


def _local_batch(a, b, cfg, keys, scales):
    """(B, M, K) @ (B, K, N) on one device: one :func:`gemm_bits` per batch element."""
    if a.shape[0] == 1:
        key = None if keys is None else keys[0]
        sc = None if scales is None else (scales[0][0], scales[1][0])
        return gemm_bits(a[0], b[0], cfg, key, sc)[0][None]
    xs = (a, b, keys) + (() if scales is None else tuple(scales))
    return jax.lax.map(lambda x: gemm_bits(x[0], x[1], cfg, x[2], None if scales is None else x[3:])[0], xs)


def batched_gemm_bits(a_bits, b_bits, cfg: GemmConfig, keys=None, scales=None):
    """:func:`gemm_bits` over a batch: ``a_bits`` (B, M, K), ``b_bits`` (B, K, N), ``keys`` one PRNG
    key per GEMM or None, ``scales`` (A's (B, M, K / block), B's (B, K / block, N)). Returns (D
    bits (B, M, N), format of D).

    With several devices the GEMMs are partitioned as their inputs are sharded (over B, M and N;
    K is gathered): a GEMM's bits depend on its K schedule only, so every device computes its
    outputs exactly as one device would. Stochastic rounding (``keys``) draws its bits per
    instruction tile and stays on one device."""
    fmt = out_format(cfg, a_bits.shape[-1])
    if keys is not None or jax.device_count() == 1:
        return _local_batch(a_bits, b_bits, cfg, keys, scales), fmt
    return _partitioned(cfg, scales is not None)(a_bits, b_bits, *(scales or ())), fmt


def _mesh_axes(shapes):
    """Mesh axes of (B, M, N) from the operands' shardings; a mesh axis that shards K (which each
    device needs whole) is moved to M, or else N, so that the devices still split the work."""
    sa, sb = (tuple(x.sharding.spec) + (None,) * 3 for x in shapes[:2])
    bat = sa[0] if sa[0] is not None else sb[0]
    m = sa[1] if sa[1] != bat else None
    n = sb[2] if sb[2] not in (bat, m) else None
    k = sa[2] if sa[2] is not None else sb[1]
    if k is not None and k not in (bat, m, n):
        if m is None:
            m = k
        elif n is None:
            n = k
    return bat, m, n


@functools.lru_cache(maxsize=64)
def _partitioned(cfg: GemmConfig, scaled: bool):
    """The batched GEMM as a custom-partitioned op (:func:`sharding.partitioned`): outputs sharded
    over (B, M, N) as the operands' B, M (A) and N (B) axes are; K and the scale blocks replicated.
    A vmap of it is one batch of batches."""
    from jax.sharding import NamedSharding, PartitionSpec as P

    def local(a, b, *s):
        return _local_batch(a, b, cfg, None, s or None)

    def shardings(mesh, arg_shapes):
        bat, m, n = _mesh_axes(arg_shapes)
        args = [NamedSharding(mesh, P(bat, m, None)), NamedSharding(mesh, P(bat, None, n))]
        if scaled:
            args += [NamedSharding(mesh, P(bat, m, None)), NamedSharding(mesh, P(bat, None, n))]
        return NamedSharding(mesh, P(bat, m, n)), tuple(args)

    rule = "b m k, b k n" + (", b m s, b s n" if scaled else "") + " -> b m n"
    return sharding.partitioned(local, rule, ("k",) + (("s",) if scaled else ()), shardings)
