"""Batched kernels over several devices: a compiled kernel's custom call is opaque to XLA's
partitioner, which would gather every operand onto each device and run the whole batch there.
:func:`over_batch` runs such a call as a custom-partitioned op instead, each device on its shard of
the batch, also under ``jax.vmap`` (:func:`fold_vmap`).

>>> import jax.numpy as jnp
>>> over_batch(lambda a, b: a @ b, jnp.ones((4, 2, 3)), jnp.ones((3, 5))).shape
(4, 2, 5)
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp


def fold_vmap(f):
    """``f``, whose operands all have one leading batch axis, as a ``custom_vmap`` whose vmap folds
    the mapped axis into that batch axis (operands not mapped are broadcast): one call of ``f``
    on the larger batch, however many vmaps wrap it."""
    @jax.custom_batching.custom_vmap
    def g(*xs):
        return f(*xs)

    @g.def_vmap
    def _(axis_size, in_batched, *xs):
        xs = [x if bt else jnp.broadcast_to(x, (axis_size,) + x.shape) for x, bt in zip(xs, in_batched)]
        out = g(*(x.reshape((-1,) + x.shape[2:]) for x in xs))
        return out.reshape((axis_size, -1) + out.shape[1:]), True

    return g


def over_batch(fn, *xs):
    """``fn(*xs)`` for operands ``xs`` (None: absent) whose leading axes (all but the last two)
    broadcast together and index independent problems, ``fn`` returning (leading axes..., ...).
    With one device, ``fn(*xs)``; with several, one custom-partitioned call on the operands
    broadcast and flattened to one batch axis: each device runs ``fn`` on the shard of the batch
    its operands hold (under ``jax.vmap`` too, the mapped axis joining the batch)."""
    if jax.device_count() == 1:
        return fn(*xs)
    idx = [i for i, x in enumerate(xs) if x is not None]
    arrs = [jnp.asarray(xs[i]) for i in idx]
    batch = jnp.broadcast_shapes(*(x.shape[:-2] for x in arrs))
    flat = [jnp.broadcast_to(x, batch + x.shape[-2:]).reshape((math.prod(batch),) + x.shape[-2:]) for x in arrs]

    def local(*ys):
        full = list(xs)
        for i, y in zip(idx, ys):
            full[i] = y
        return fn(*full)

    out = _partitioned(local, tuple(x.ndim for x in flat), jax.eval_shape(local, *flat).ndim)(*flat)
    return out.reshape(batch + out.shape[1:])


def partitioned(local, rule: str, replicated, shardings):
    """``local`` as a custom-partitioned op (under ``jax.vmap`` too, :func:`fold_vmap`): its
    Shardy ``rule`` with the factors ``replicated`` kept whole on every device, and
    ``shardings(mesh, arg_shapes)`` giving the (result, operands) shardings each device's call of
    ``local`` takes. ``local`` is jitted here: custom_partitioning takes no constants."""
    from jax.experimental.custom_partitioning import custom_partitioning

    body = jax.jit(local)

    def infer(mesh, arg_shapes, result_shape):
        return shardings(mesh, arg_shapes)[0]

    def partition(mesh, arg_shapes, result_shape):
        out, args = shardings(mesh, arg_shapes)
        return mesh, body, out, args

    f = custom_partitioning(body)
    f.def_partition(partition=partition, infer_sharding_from_operands=infer, sharding_rule=rule,
                    need_replication_factors=tuple(replicated))
    return fold_vmap(f)


def _partitioned(local, ranks, out_rank):
    """``local`` (operands of ``ranks``, a result of ``out_rank``, all with a leading batch axis) as
    a custom-partitioned op: the batch axis sharded as the first operand that shards it is, every
    other axis replicated."""
    from jax.sharding import NamedSharding, PartitionSpec as P

    def shardings(mesh, arg_shapes):
        specs = (tuple(s.sharding.spec) for s in arg_shapes)
        ax = next((spec[0] for spec in specs if spec and spec[0] is not None), None)
        return NamedSharding(mesh, P(ax)), tuple(NamedSharding(mesh, P(ax)) for _ in arg_shapes)

    names = lambda tag, n: " ".join(f"{tag}{j}" for j in range(n))  # noqa: E731
    rule = ", ".join(f"b {names(f'x{i}_', r - 1)}" for i, r in enumerate(ranks)) + f" -> b {names('y', out_rank - 1)}"
    others = [f"x{i}_{j}" for i, r in enumerate(ranks) for j in range(r - 1)] + [f"y{j}" for j in range(out_rank - 1)]
    return partitioned(local, rule, others, shardings)
