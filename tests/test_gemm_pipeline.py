"""The GEMM pipeline's steps as data (tcemu/_src/gemm): the plan's chains cover K exactly once,
and the one statement of the reductions gives the same bits on the engine's float32 additions
(bit patterns, the GEMM) and on IEEE numpy float32 additions (values, identify's fast path)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings, strategies as st

import tcemu
from conftest import FULL
from tcemu._src.gemm.plan import chain_index, chain_layout, step_table
from tcemu._src.gemm.reduce import JAX, NUMPY, combine_chains

SCHEDULES = st.builds(
    lambda mult, residue, slices, align, pad, promo, red, part: tcemu.KSchedule(
        k_tile=mult * 16, residue=residue, slices=slices, slice_align=align, slice_pad=pad,
        promotion=promo * max(mult, 1) * 16, reduction=red, partials=part),
    st.integers(0, 4), st.sampled_from(["first", "last"]), st.integers(1, 9), st.sampled_from([0, 1, 8]),
    st.sampled_from(["end", "start"]), st.integers(0, 3), st.sampled_from(["sequential", "pairwise", "shuffle"]),
    st.sampled_from(["f32", "f16", "bf16"]))


@settings(max_examples=200, deadline=None)
@given(sched=SCHEDULES, K=st.integers(1, 700))
def test_chains_cover_k_once(sched, K):
    """Every element of K is read by exactly one lane of one chain; each chain runs at most g
    instructions (a promotion group), and the chains run every valid instruction of the plan."""
    plan = sched.plan(K, 16)
    g, G, lens = chain_layout(plan)
    idx = chain_index(plan)
    assert idx.shape == (plan.slices * G, g * 16)
    assert np.array_equal(np.sort(idx[idx >= 0]), np.arange(K))
    assert lens.max() <= g and lens.sum() == plan.valid.sum()
    if sched.promotion:
        assert g == sched.promotion // 16
    tbl, ok = step_table(plan)
    assert ok.sum() == plan.valid.sum() and (tbl[ok] >= 0).all()


def _values(draw_bits):
    """float32 values from raw bit patterns (subnormals, huge values, both zeros), finite."""
    x = np.asarray(draw_bits, np.uint32).view(np.float32)
    return np.where(np.isfinite(x), x, np.float32(1.5))


@settings(max_examples=30 if FULL else 12, deadline=None)  # each example compiles
@given(sched=SCHEDULES, K=st.integers(1, 400),
       bits=st.lists(st.integers(0, 2 ** 32 - 1), min_size=64 * 3, max_size=64 * 3))
def test_reduction_same_bits_on_both_arithmetics(sched, K, bits):
    """combine_chains on float32 bit patterns with the engine's additions equals the same code on
    numpy float32 values (IEEE round to nearest even), for every reduction, promotion and partials
    type; overflow to infinity included."""
    plan = sched.plan(K, 16)
    _, G, _ = chain_layout(plan)
    n = plan.slices * G
    vals = np.resize(_values(bits), (n, 1, 3))  # (chains, M, N)
    with np.errstate(all="ignore"):
        want = combine_chains(lambda c: vals[c], plan, np.zeros((1, 3), np.float32), NUMPY)
    words = jnp.asarray(vals.view(np.uint32))
    got = jax.jit(lambda w: combine_chains(lambda c: w[c], plan, jnp.zeros((1, 3), jnp.uint32), JAX))(words)
    got = np.asarray(got).view(np.float32)
    nan = np.isnan(want)  # inf - inf: the engine's NaN is canonical, numpy's is the CPU's
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32)), (got, want)
