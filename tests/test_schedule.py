"""K schedules as data (tcemu.KSchedule): the instruction ranges against a plain-Python reading of
the definition, and matmul against a value-level composition of single instructions with numpy
float32 additions for the reductions."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import tcemu


def reference_ranges(K, k, k_tile, residue, slices, align, pad="end"):
    """Per slice, the K range of each instruction, straight from the KSchedule docstring."""
    kt = k_tile or k
    if slices == 0:
        bounds = [(a, min(K, a + kt)) for a in range(0, K, kt)]
    else:
        al = align or kt
        n = min(slices, -(-K // al))
        size = -(-K // n)
        size = -(-size // al) * al
        lead = n * size - K if pad == "start" else 0
        bounds = [(max(-lead, min(K, i * size - lead)), min(K, (i + 1) * size - lead)) for i in range(n)]
    out = []
    for a, b in bounds:
        tiles, pos = [], a
        full, part = divmod(b - a, kt)
        widths = ([part] if part and residue == "first" else []) + [kt] * full + \
                 ([part] if part and residue == "last" else [])
        for w in widths:
            for j in range(0, w, k):
                lo, hi = max(0, pos + j), min(pos + j + k, pos + w)
                if hi > lo:  # (first, last + 1, lane of the first element)
                    tiles.append((lo, hi, lo - (pos + j)))
            pos += w
        out.append(tiles)
    return out


@settings(max_examples=300, deadline=None)
@given(K=st.integers(1, 3000), k=st.sampled_from([8, 16, 32]), tile_mult=st.integers(0, 8),
       residue=st.sampled_from(["first", "last"]), slices=st.integers(0, 40), align=st.sampled_from([0, 1, 8, 64]),
       pad=st.sampled_from(["end", "start"]))
def test_plan_matches_definition(K, k, tile_mult, residue, slices, align, pad):
    s = tcemu.KSchedule(k_tile=tile_mult * k, residue=residue, slices=slices, slice_align=align, slice_pad=pad)
    plan = s.plan(K, k)
    got = [[(int(a), int(b)) for a, b in sl] for sl in plan.instruction_ranges()]
    want = [[(lo, hi) for lo, hi, _ in sl] for sl in reference_ranges(K, k, tile_mult * k, residue, slices, align, pad)]
    assert [x for x in got if x] == [x for x in want if x]
    idx = plan.index[plan.index >= 0]
    assert np.array_equal(np.sort(idx), np.arange(K))  # every element read exactly once


def _ins(form):
    return f"mma.sync.aligned.{form.split('.')[0]}.row.col.{'.'.join(form.split('.')[1:])}"


@functools.lru_cache(maxsize=None)
def _mma(spelling, arch):
    return jax.jit(lambda a, b, c: tcemu.mma(spelling, a, b, c, arch=arch))


def reference_parts(a, b, cfg):
    """Each slice's float32 partial: chains of value-level ``tcemu.mma`` over the reference ranges
    (zeros padding partial instructions), promotion groups added with numpy float32 (IEEE RNE)."""
    s, ins = cfg.k_schedule, cfg.ins
    M, K = a.shape
    N = b.shape[1]
    pad_m, pad_n = -M % ins.m, -N % ins.n
    A = np.pad(a, ((0, pad_m), (0, 0)))
    B = np.pad(b, ((0, 0), (0, pad_n)))
    spelling = _ins(cfg.instruction)
    parts = []
    for ranges in reference_ranges(K, ins.k, s.k_tile, s.residue, s.slices, s.slice_align, s.slice_pad):
        total = np.zeros((A.shape[0], B.shape[1]), np.float32)
        d = jnp.zeros_like(total)
        for t, (lo, hi, off) in enumerate(ranges):
            at = np.zeros((A.shape[0], ins.k), a.dtype)
            bt = np.zeros((ins.k, B.shape[1]), b.dtype)
            at[:, off:off + hi - lo], bt[off:off + hi - lo] = A[:, lo:hi], B[lo:hi]
            tiles_a = at.reshape(-1, ins.m, ins.k)[:, None]
            tiles_b = bt.reshape(ins.k, -1, ins.n).transpose(1, 0, 2)[None]
            dt = d.reshape(-1, ins.m, B.shape[1] // ins.n, ins.n).transpose(0, 2, 1, 3)
            dt = _mma(spelling, cfg.arch)(tiles_a, tiles_b, dt)
            d = dt.transpose(0, 2, 1, 3).reshape(d.shape)
            if s.promotion and (t + 1) % (s.promotion // ins.k) == 0:
                total, d = total + np.asarray(d, np.float32), jnp.zeros_like(d)
        if s.promotion:
            if len(ranges) % (s.promotion // ins.k):
                total = total + np.asarray(d, np.float32)
            parts.append(total)
        else:
            parts.append(np.asarray(d, np.float32))
    return [p[:M, :N] for p in parts]


def reference_matmul(a, b, cfg):
    """:func:`reference_parts` added with numpy float32 (IEEE RNE) in the schedule's order."""
    s = cfg.k_schedule
    parts = reference_parts(a, b, cfg)
    store = lambda p: p.astype({"f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16}[s.partials]) \
        .astype(np.float32)  # noqa: E731
    if s.reduction == "serial":  # the running total stored after every slice
        total = store(parts[0])
        for p in parts[1:]:
            total = store(total + p)
        parts = [total]
    parts = [store(p) for p in parts]

    def pairwise(parts):
        while len(parts) > 1:
            nxt = [parts[i] + parts[i + 1] for i in range(0, len(parts) - 1, 2)]
            parts = nxt + ([parts[-1]] if len(parts) % 2 else [])
        return parts

    if s.reduction == "pairwise" and s.reduce_threads > 1:  # round-robin to threads, lanes, then warps
        T, L = s.reduce_threads, s.reduce_lanes or s.reduce_threads
        P = 1
        while P < max(T, len(parts)):
            P *= 2
        parts = parts + [np.zeros_like(parts[0])] * (P - len(parts))
        threads = [pairwise(parts[t::T])[0] for t in range(T)]
        warps = []
        for w in range(T // L):
            lanes = threads[w * L:(w + 1) * L]
            while len(lanes) > 1:
                lanes = [lanes[i] + lanes[i + len(lanes) // 2] for i in range(len(lanes) // 2)]
            warps.append(lanes[0])
        while len(warps) > 1:
            warps = [warps[i] + warps[i + len(warps) // 2] for i in range(len(warps) // 2)]
        parts = warps
    elif s.reduction == "pairwise":
        parts = pairwise(parts)
    if s.reduction == "shuffle" and len(parts) > 1:  # 32 lanes from +0, then a shuffle-down tree
        lanes = [np.zeros_like(parts[0]) for _ in range(32)]
        for i, p in enumerate(parts):
            lanes[i % 32] = lanes[i % 32] + p
        h = 16
        while h:
            lanes = [lanes[j] + lanes[j + h] for j in range(h)]
            h //= 2
        parts = lanes
    out = parts[0]
    for p in parts[1:]:
        out = out + p
    return out


SCHEDULES = [
    tcemu.KSchedule(),
    tcemu.KSchedule(k_tile=64, residue="first"),
    tcemu.KSchedule(k_tile=32, residue="first", slices=3),
    tcemu.KSchedule(k_tile=64, residue="last", slices=5, partials="bf16"),
    tcemu.KSchedule(slices=4, slice_align=1, reduction="pairwise"),
    tcemu.KSchedule(slices=8, slice_align=1, slice_pad="start"),
    tcemu.KSchedule(slices=3, slice_align=8, residue="first", k_tile=32, partials="f16"),
    tcemu.KSchedule(k_tile=128, residue="first", slices=2, promotion=128),
    tcemu.KSchedule(slices=0, reduction="pairwise"),
    tcemu.KSchedule(k_tile=32, slices=5, slice_align=8, reduction="shuffle"),
    tcemu.KSchedule(slices=40, slice_align=1, reduction="shuffle"),
    tcemu.KSchedule(slices=12, slice_align=8, reduction="pairwise", reduce_threads=8, reduce_lanes=2),
    tcemu.KSchedule(slices=9, slice_align=1, reduction="pairwise", reduce_threads=2, reduce_lanes=1),
    tcemu.KSchedule(k_tile=32, residue="first", slices=4, slice_align=8, reduction="serial", partials="bf16"),
    tcemu.KSchedule(k_tile=64, slices=3, reduction="serial", partials="f16"),
    tcemu.KSchedule(k_tile=128, slices=2, promotion=128, reduction="serial", partials="bf16"),
]


@pytest.mark.parametrize("sched", SCHEDULES, ids=lambda s: s.describe().replace(" ", "_"))
@pytest.mark.parametrize("form,dt", [("m16n8k16.f32.f16.f16.f32", np.float16),
                                     ("m16n8k8.f32.bf16.bf16.f32", ml_dtypes.bfloat16),
                                     ("m16n8k32.f32.e4m3.e4m3.f32", ml_dtypes.float8_e4m3fn)])
def test_matmul_follows_schedule(sched, form, dt):
    k = int(form.split(".")[0].split("k")[1])
    if sched.k_tile % k or sched.promotion % max(k, sched.k_tile or k):
        pytest.skip("schedule does not fit this instruction")
    if (sched.reduction == "shuffle" or sched.reduce_threads > 1) and k != 16:
        pytest.skip("reduction trees do not depend on the instruction: f16 only (CI time)")
    rng = np.random.default_rng(abs(hash((sched, form))) % 2**32)
    M, N, K = 17, 8, 150
    a = (rng.standard_normal((M, K)) * 2.0 ** rng.integers(-6, 6, (M, K))).astype(dt)
    b = (rng.standard_normal((K, N)) * 2.0 ** rng.integers(-6, 6, (K, N))).astype(dt)
    cfg = tcemu.GemmConfig(arch="H100", instruction=form, schedule=sched)
    got = np.asarray(tcemu.matmul(a, b, config=cfg))
    want = reference_matmul(a, b, cfg)
    assert got.view(np.uint32).tolist() == want.view(np.uint32).tolist()


def test_k_orders_are_schedules():
    rng = np.random.default_rng(5)
    a = rng.standard_normal((16, 120)).astype(np.float16)
    b = rng.standard_normal((120, 8)).astype(np.float16)
    base = tcemu.GemmConfig(arch="H100", instruction="m16n8k16.f32.f16.f16.f32")
    for order, sched in (("sequential", tcemu.KSchedule()), ("split_k", tcemu.KSchedule(slices=3)),
                         ("promotion", tcemu.KSchedule(promotion=64)),
                         ("pairwise", tcemu.KSchedule(slices=0, reduction="pairwise"))):
        cfg = base.replace(k_order=order, split_k=3, promotion_interval=64)
        assert cfg.k_schedule == sched
        want = reference_matmul(a, b, cfg)
        assert np.asarray(tcemu.matmul(a, b, config=cfg)).view(np.uint32).tolist() == want.view(np.uint32).tolist()


@pytest.mark.parametrize("changes,err,msg", [
    (dict(residue="middle"), ValueError, "residue must be one of 'last', 'first'"),
    (dict(k_tile=-1), ValueError, "k_tile must be >= 0"), (dict(k_tile=1.5), TypeError, "k_tile"),
    (dict(slices=-2), ValueError, "slices"), (dict(reduction="tree"), ValueError, "'sequential', 'pairwise'"),
    (dict(partials="f64"), ValueError, "partials must be one of 'f32', 'f16', 'bf16'"),
    (dict(reduction="pairwise", reduce_threads=6), ValueError, "must be powers of two"),
    (dict(reduction="pairwise", reduce_threads=4, reduce_lanes=8), ValueError, "the lanes dividing the threads"),
    (dict(reduce_threads=4), ValueError, "reduce_threads=4 needs reduction='pairwise'"),
    (dict(promotion=100, k_tile=64), ValueError, "promotion=100 must be a multiple of k_tile=64"),
])
def test_schedule_validation(changes, err, msg):
    with pytest.raises(err, match=msg):
        tcemu.KSchedule(**changes)


def test_schedule_must_fit_instruction():
    with pytest.raises(ValueError, match="k_tile=40 must be a multiple of the instruction's k=16"):
        tcemu.GemmConfig(instruction="m16n8k16.f32.f16.f16.f32", schedule=tcemu.KSchedule(k_tile=40))
    with pytest.raises(TypeError, match="schedule must be a tcemu.KSchedule"):
        tcemu.GemmConfig(schedule={"k_tile": 64})
    with pytest.raises(TypeError, match="KSchedule has no field tile"):
        tcemu.KSchedule().replace(tile=3)


@pytest.mark.parametrize("a,b,K,same", [
    (tcemu.KSchedule(), tcemu.KSchedule(k_tile=64, residue="first"), 1024, True),   # no residue: the same instructions
    (tcemu.KSchedule(), tcemu.KSchedule(k_tile=64, residue="first"), 1000, False),
    (tcemu.KSchedule(k_tile=16, residue="first", slices=2), tcemu.KSchedule(k_tile=64, slices=2), 4096, True),
    (tcemu.KSchedule(k_tile=64, slices=3), tcemu.KSchedule(k_tile=64, slices=3, partials="f16"), 4096, False),
    (tcemu.KSchedule(k_tile=64, slices=3), tcemu.KSchedule(k_tile=64, slices=3, reduction="pairwise"), 4096, False),
    (tcemu.KSchedule(k_tile=64, slices=4), tcemu.KSchedule(k_tile=64, slices=4, promotion=128), 4096, False),
])
def test_equivalent_schedules(a, b, K, same):
    assert a.equivalent(b, K, 16) is same and b.equivalent(a, K, 16) is same


@pytest.mark.parametrize("K, k", [(-5, 16), (100.7, 16), (100, 0), ("64", 16), (True, 16)])
def test_plan_rejects_bad_sizes(K, k):
    with pytest.raises(ValueError, match="KSchedule.plan: (K|k) must be an integer"):
        tcemu.KSchedule().plan(K, k)


SERIAL = [tcemu.KSchedule(k_tile=32, residue="first", slices=4, slice_align=8, reduction="serial", partials="bf16"),
          tcemu.KSchedule(k_tile=64, slices=3, reduction="serial", partials="f16"),
          tcemu.KSchedule(k_tile=128, slices=2, promotion=128, reduction="serial", partials="bf16")]
NP_OUT = {"f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16}


@pytest.mark.parametrize("sched", SERIAL, ids=lambda s: s.describe().replace(" ", "_"))
@pytest.mark.parametrize("ops", ["alpha_beta_c", "alpha_bias"])
def test_serial_split_k_runs_the_epilogue_per_slice(sched, ops):
    """CUTLASS's serial split-K: slice 0 stores round(alpha * p0 + beta * c + bias), slice s
    round(alpha * p_s + D) (numpy float32 steps on the reference partials), in matmul and
    dot_general."""
    rng = np.random.default_rng(abs(hash((sched, ops))) % 2**32)
    M, N, K, dt = 17, 8, 300, np.float16
    a = (rng.standard_normal((M, K)) * 2.0 ** rng.integers(-6, 6, (M, K))).astype(dt)
    b = (rng.standard_normal((K, N)) * 2.0 ** rng.integers(-6, 6, (K, N))).astype(dt)
    cfg = tcemu.GemmConfig(arch="H100", instruction="m16n8k16.f32.f16.f16.f32", schedule=sched)
    given = {"alpha_beta_c": dict(alpha=np.float32(-1.7), beta=np.float32(0.3), c=rng.standard_normal((M, N)) * 64),
             "alpha_bias": dict(alpha=np.float32(2.5), bias=rng.standard_normal(N) * 64)}[ops]
    given = {k: np.float32(v) if np.ndim(v) == 0 else np.asarray(v, np.float32) for k, v in given.items()}
    f32, pt = np.float32, NP_OUT[sched.partials]
    alpha = given.get("alpha", f32(1))
    parts = reference_parts(a, b, cfg)
    t = f32(parts[0] * alpha)
    if "c" in given:
        t = f32(t + f32(given.get("beta", f32(1)) * given["c"]))
    if "bias" in given:
        t = f32(t + given["bias"])
    t = t.astype(pt)
    for p in parts[1:]:
        t = f32(f32(p * alpha) + t.astype(f32)).astype(pt)
    got = np.asarray(tcemu.matmul(a, b, config=cfg, out_type=sched.partials, **given))
    assert got.view(np.uint16).tolist() == t.view(np.uint16).tolist()
    dg = tcemu.dot_general(jnp.asarray(a), jnp.asarray(b), (((1,), (0,)), ((), ())), config=cfg,
                           preferred_element_type=NP_OUT[sched.partials], **given)
    assert np.asarray(dg).view(np.uint16).tolist() == t.view(np.uint16).tolist()
    plain = tcemu.matmul(a, b, config=cfg, out_type=sched.partials)  # no operands: the reduction's own rounding
    assert np.asarray(plain).view(np.uint16).tolist() == reference_matmul(a, b, cfg).astype(pt).view(np.uint16).tolist()


def test_serial_split_k_epilogue_gradients_and_errors():
    sched = tcemu.KSchedule(k_tile=32, residue="first", slices=3, slice_align=8, reduction="serial", partials="bf16")
    cfg = tcemu.GemmConfig(arch="H100", instruction="m16n8k8.f32.bf16.bf16.f32", schedule=sched)
    rng = np.random.default_rng(3)
    a, b = jnp.asarray(rng.standard_normal((8, 100)), jnp.float32), jnp.asarray(rng.standard_normal((100, 6)), jnp.float32)
    bias = jnp.asarray(rng.standard_normal(6), jnp.float32)
    grads = jax.grad(lambda x, y, z: tcemu.matmul(x, y, bias=z, alpha=2.0, out_type="bf16", config=cfg)
                     .astype(jnp.float32).sum(), argnums=(0, 1, 2))(a, b, bias)
    plain = jax.grad(lambda x, y: tcemu.matmul(x, y, config=cfg).sum(), argnums=(0, 1))(a, b)
    assert np.array_equal(grads[0], 2 * plain[0]) and np.array_equal(grads[1], 2 * plain[1])
    assert np.array_equal(grads[2], np.full(6, 8.0, np.float32))
    with pytest.raises(ValueError, match="einsum: serial split-K"):
        tcemu.einsum("mk,kn->mn", a, b, bias=bias, config=cfg)
    with pytest.raises(ValueError, match="K padded at the start"):
        tcemu.matmul(a, b, bias=bias, config=cfg.replace(schedule=sched.replace(k_tile=0, residue="last",
                                                                                slice_pad="start", slice_align=1)))
