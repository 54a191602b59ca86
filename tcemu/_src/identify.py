"""Find the GEMM configuration (instruction numerics and K schedule) that reproduces a GPU's
output bit for bit.

    >>> import numpy as np, ml_dtypes, tcemu
    >>> rng = np.random.default_rng(0)
    >>> a = rng.standard_normal((32, 300)).astype(np.float16)
    >>> b = rng.standard_normal((300, 16)).astype(np.float16)
    >>> truth = tcemu.GemmConfig(arch="H100", instruction="m16n8k16.f32.f16.f16.f32",
    ...                          schedule=tcemu.KSchedule(k_tile=64, residue="first"))
    >>> d = np.asarray(tcemu.matmul(a, b, config=truth))        # what "the GPU" returned
    >>> tcemu.identify(a, b, d, arch="H100").schedule.describe()
    'k-tile 64, residue first'
"""
from __future__ import annotations

import time

import jax.numpy as jnp
import ml_dtypes
import numpy as np

from tcemu._src.arch import resolve
from tcemu._src.gemm import GemmConfig, matmul
from tcemu._src.schedule import KSchedule

INPUT_TYPES = {np.dtype(np.float16): "f16", np.dtype(ml_dtypes.bfloat16): "bf16",
               np.dtype(ml_dtypes.float8_e4m3fn): "e4m3", np.dtype(ml_dtypes.float8_e5m2): "e5m2"}
OUTPUT_TYPES = {np.dtype(np.float32): "f32", np.dtype(np.float16): "f16", np.dtype(ml_dtypes.bfloat16): "bf16"}
SLICE_COUNTS = (2, 4, 3, 8, 5, 6, 7, 16) + tuple(range(9, 16)) + (32, 20, 24, 28, 48, 64, 128)


class NoMatch(ValueError):
    """No candidate reproduces the output; ``closest`` lists (match fraction, GemmConfig)."""

    def __init__(self, message, closest):
        super().__init__(message)
        self.closest = closest


def instructions(arch: str, a: str, b: str) -> list[str]:
    """The instructions whose numerics a kernel on ``arch`` may use for inputs ``a`` x ``b``
    (the forms whose numerics differ: k16 and k8 HMMA, and for fp8 wgmma and mma.sync)."""
    if a in ("f16", "bf16"):
        forms = [f"m16n8k16.f32.{a}.{b}.f32", f"m16n8k8.f32.{a}.{b}.f32"]
    else:
        forms = [f"wgmma.mma_async.sync.aligned.m64n8k32.f32.{a}.{b}", f"m16n8k32.f32.{a}.{b}.f32"]
    out = []
    for f in forms:
        try:
            GemmConfig(arch=arch, instruction=f)
        except ValueError:
            continue
        out.append(f)
    return out


def schedules(K: int, k: int, a: str, out: str):
    """Candidate K schedules for instructions of depth ``k``, in stages, most common first:
    stage 0 one chain (residue last, or first with k-tiles of 64, 128, 32, 256 or k), with fp8
    promotion every 128 as well; stage 1, for every slice count S (2, 4, 3, 8, ...), the common
    split-K forms (slices aligned to 64-element k-tiles added in order, as cuBLAS does; aligned
    to 128 and added pairwise, as XLA's Triton split-K does); stage 2, per S, the rest: other
    alignments, residue first, equal slices, partials in the output type. Yields (stage,
    KSchedule); the search tries stage by stage, every instruction within a stage."""
    tiles = [t for t in (64, 128, 32, 256) if t % k == 0]
    chains = [KSchedule()] + [KSchedule(k_tile=t, residue="first") for t in tiles + [k]]
    promo = [0, 128] if a in ("e4m3", "e5m2") else [0]
    for p in promo:
        for s in chains:
            if p % (s.k_tile or k) == 0:
                yield 0, s.replace(promotion=p)
    partials = ["f32"] + ([out] if out in ("f16", "bf16") else [])
    common = tiles[0] if tiles else k
    for i, S in enumerate(SLICE_COUNTS):
        if S * k > K + k * S // 2 and S > 2:
            break
        for p in promo:  # first pass: the common forms for every S (cuBLAS/CUTLASS, XLA Triton)
            yield 1 + i / 1000, KSchedule(k_tile=common, slices=S, promotion=p)
            if not p:
                yield 1 + i / 1000, KSchedule(k_tile=tiles[1] if len(tiles) > 1 else common, slices=S,
                                              reduction="pairwise")
        for p in promo:
            for part in partials:
                for red in ("sequential", "pairwise"):
                    for t in ([k] if k < 32 else []) + tiles[:2]:
                        for res in ("first", "last"):
                            yield 2 + i / 1000, KSchedule(k_tile=t, residue=res, slices=S, promotion=p,
                                                          partials=part, reduction=red)
                for pad in ("start", "end"):
                    for red in ("sequential", "pairwise"):
                        yield 2 + i / 1000, KSchedule(slices=S, slice_align=1, slice_pad=pad, reduction=red,
                                                      promotion=p, partials=part)


def _signature(s: KSchedule, K: int, k: int):
    plan = s.plan(K, k)
    return plan.index.tobytes(), plan.index.shape, plan.valid.tobytes(), plan.group, \
        s.reduction if plan.slices > 2 else "", s.partials if plan.slices > 1 else ""


def identify(a, b, d, *, arch: str, rows: int = 32, cols: int = 64, instruction: str | None = None,
             candidates=None, max_seconds: float = 600.0) -> GemmConfig:
    """A :class:`GemmConfig` with which ``tcemu.matmul(a, b, config=cfg).astype(d.dtype)``
    equals ``d`` bit for bit.

    ``a`` (..., M, K) and ``b`` (..., K, N) in the input type (float16, bfloat16,
    float8_e4m3fn, float8_e5m2; numpy or JAX), ``d`` (..., M, N) the GPU's output (float32,
    float16 or bfloat16). The search uses up to ``rows`` rows and ``cols`` columns (spread over
    the matrix); candidates are tried most common first (:func:`schedules`) for each instruction
    of :func:`instructions` (or ``instruction``), or the given ``candidates`` (KSchedules). Raises
    :class:`NoMatch` (a ValueError) listing the closest candidates when none matches.
    """
    a, b, d = np.asarray(a), np.asarray(b), np.asarray(d)
    for name, x, table in (("a", a, INPUT_TYPES), ("b", b, INPUT_TYPES), ("d", d, OUTPUT_TYPES)):
        if x.dtype not in table:
            raise TypeError(f"identify: {name} must have dtype {', '.join(t.name for t in table)}, got {x.dtype}")
    at, bt, ot = INPUT_TYPES[a.dtype], INPUT_TYPES[b.dtype], OUTPUT_TYPES[d.dtype]
    if a.ndim < 2 or b.ndim < 2 or a.shape[-1] != b.shape[-2]:
        raise ValueError(f"identify: needs a (..., M, K) and b (..., K, N), got {a.shape} and {b.shape}")
    out_shape = np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-1])
    if d.shape != out_shape:
        raise ValueError(f"identify: d must have shape {out_shape} (a @ b), got {d.shape}")
    resolve(arch)
    K = a.shape[-1]
    if K == 0:
        raise ValueError("identify: K = 0 leaves nothing to identify")
    for name, v in (("rows", rows), ("cols", cols)):
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
            raise ValueError(f"identify: {name} must be a positive integer, got {v!r}")
    # the rows and columns used: spread over the output
    a2 = np.broadcast_to(a, out_shape[:-2] + a.shape[-2:]).reshape(-1, a.shape[-2], K)
    b2 = np.broadcast_to(b, out_shape[:-2] + b.shape[-2:]).reshape(-1, K, b.shape[-1])
    d2 = d.reshape(-1, out_shape[-2], out_shape[-1])
    ci = np.unique(np.linspace(0, out_shape[-1] - 1, min(cols, out_shape[-1])).round().astype(int))
    flat_rows = a2.shape[0] * a2.shape[1]
    ri = np.unique(np.linspace(0, flat_rows - 1, min(rows, flat_rows)).round().astype(int))
    bi, mi = ri // a2.shape[1], ri % a2.shape[1]
    A = a2[bi, mi]  # (R, K)
    D = d2[bi, mi][:, ci]
    batches = np.unique(bi)
    Bs = {int(x): b2[x][:, ci] for x in batches}
    probe = np.arange(len(ri)) < min(8, len(ri))

    def run(cfg, sel):
        res = np.zeros((int(sel.sum()), len(ci)), d.dtype)
        for x, B in Bs.items():
            m = bi[sel] == x
            if m.any():
                res[m] = np.asarray(matmul(jnp.asarray(A[sel][m]), jnp.asarray(B), config=cfg)).astype(d.dtype)
        return res

    def same(x, y):  # bitwise, per output
        x, y = np.ascontiguousarray(x), np.ascontiguousarray(y)
        return (x.view(np.uint8).reshape(x.shape + (-1,)) == y.view(np.uint8).reshape(y.shape + (-1,))).all(-1)

    ins_list = [instruction] if instruction is not None else instructions(arch, at, bt)
    if not ins_list:
        raise ValueError(f"identify: no {at} x {bt} instruction on {arch}")
    ks = {ins: GemmConfig(arch=arch, instruction=ins).ins.k for ins in ins_list}
    if candidates is not None:
        todo = [(ins, sc) for sc in candidates for ins in ins_list]
    else:  # stage by stage, every instruction within a stage
        staged = [(st, i, ins, sc) for i, ins in enumerate(ins_list) for st, sc in schedules(K, ks[ins], at, ot)]
        todo = [(ins, sc) for st, i, ins, sc in sorted(staged, key=lambda x: (x[0], x[1]))]
    t0, tried, scores = time.time(), set(), []
    for ins, sc in todo:
        k = ks[ins]
        try:
            sc.check(k)
        except ValueError:
            continue
        sig = (ins, _signature(sc, K, k))
        if sig in tried:
            continue
        tried.add(sig)
        cfg = GemmConfig(arch=arch, instruction=ins, schedule=sc)
        ok = same(run(cfg, probe), D[probe])
        if ok.all():
            ok = same(run(cfg, np.ones_like(probe)), D)
        scores.append((float(ok.mean()), cfg))
        if ok.all():
            return cfg
        if time.time() - t0 > max_seconds:
            break
    scores.sort(key=lambda x: -x[0])
    lines = "; ".join(f"{f:.1%}: {c.instruction}, {c.schedule.describe()}" for f, c in scores[:5])
    raise NoMatch(f"identify: none of {len(scores)} candidate configurations reproduces d "
                  f"({at} x {bt} -> {ot}, K = {K}, {arch}); closest: {lines}", scores[:5])
