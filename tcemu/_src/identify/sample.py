"""The evidence ``identify`` weighs: the rows and columns it compares (:class:`Sample`), the
epilogue operands on them, and the fast chain evaluator (:class:`Chains`) that checks many K
schedules on the CPU kernel without a compile per candidate.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from tcemu._src import formats as fm
from tcemu._src.gemm import Epilogue, GemmConfig, KSchedule, matmul
from tcemu._src.gemm.api import serial_epilogue
from tcemu._src.gemm.epilogue import PLACES, SCALE_ORDERS, finish, finish_serial
from tcemu._src.gemm.execute import kernel_of
from tcemu._src.gemm.plan import chain_index, chain_layout
from tcemu._src.gemm.reduce import NUMPY, combine_chains, slice_partials

INPUT_TYPES = {np.dtype(np.float16): "f16", np.dtype(ml_dtypes.bfloat16): "bf16",
               np.dtype(ml_dtypes.float8_e4m3fn): "e4m3", np.dtype(ml_dtypes.float8_e5m2): "e5m2"}
OUTPUT_TYPES = {np.dtype(np.float32): "f32", np.dtype(np.float16): "f16", np.dtype(ml_dtypes.bfloat16): "bf16"}
BLOCK = 128  # block scales along K identify takes: DeepSeek-V3's and cuBLASLt's 1x128 / 128x128


def _chains_fn(kernel, afmt, bfmt, model, k: int, chain_k: int):
    """The CPU kernel's chains of ``chain_k`` elements, jitted once per size for every evaluator."""
    return jax.jit(lambda A, B, lens: kernel.chains(A, B, afmt, bfmt, model, k=k, chain_k=chain_k, lens=lens))


class Chains:
    """Emulated outputs of many schedules on a few rows, fast: the plan's chains run on the CPU
    kernel with operands laid out by numpy gathers (one compile per power-of-two size, not per
    schedule), their float32 results combined by the GEMM's own reduction code on numpy values
    (:data:`~tcemu._src.gemm.reduce.NUMPY`: IEEE float32 additions). Chain results are cached per
    plan, so reductions and partial types cost no kernel call. A filter only: what it accepts is
    confirmed through :func:`tcemu.matmul`."""

    def __init__(self, cfg: GemmConfig, kernel, a_bits, b_bits):
        ins = cfg.ins
        self.kernel, self.model = kernel, cfg.numerics
        self.afmt, self.bfmt, self.k = fm.FORMATS[ins.atype], fm.FORMATS[ins.btype], ins.k
        self.a, self.b = a_bits.astype(np.uint32), b_bits.astype(np.uint32)  # (R, K), (K, C)
        self.cache = {}

    def chains(self, plan, rows):
        """(S * G, R, C) float32 results of the plan's chains (slice s, promotion group j at s * G + j)."""
        key = (plan.index.tobytes(), plan.index.shape, plan.valid.tobytes(), plan.group, rows.tobytes())
        if key in self.cache:
            return self.cache[key]
        k = self.k
        _, _, n = chain_layout(plan)
        ck = k << int(np.ceil(np.log2(max(1, int(n.max())))))
        nc = 1 << int(np.ceil(np.log2(len(n))))
        steps = chain_index(plan)
        idx = np.full((nc, ck), -1, np.int64)
        width = min(steps.shape[1], ck)
        idx[:len(n), :width] = steps[:, :width]
        idx = idx.reshape(-1)
        live = idx >= 0
        A = np.where(live[None, :], self.a[rows][:, np.maximum(idx, 0)], 0)
        B = np.where(live[:, None], self.b[np.maximum(idx, 0)], 0)
        lens = np.zeros(nc, np.int32)
        lens[:len(n)] = n * k
        run = _chains_fn(self.kernel, self.afmt, self.bfmt, self.model, k, ck)
        out = np.asarray(run(A, B, lens))[:len(n)].view(np.float32)
        if len(self.cache) > 64:
            self.cache.clear()
        self.cache[key] = out
        return out

    def __call__(self, sched: KSchedule, K: int, rows, parts: bool = False):
        """float32 D (R, C) of ``sched`` on ``rows`` of A; ``parts``: each slice's partial (S, R, C)."""
        plan = sched.plan(K, self.k)
        ch = self.chains(plan, rows)
        with np.errstate(all="ignore"):  # overflows to inf are part of the emulation
            zero = np.zeros(ch.shape[1:], np.float32)
            if parts:
                return slice_partials(lambda c: ch[c], plan, zero, NUMPY)
            return combine_chains(lambda c: ch[c], plan, zero, NUMPY)


def _raw(x):
    """Bit patterns of a float16/bfloat16/fp8 array."""
    return x.view(np.uint16 if x.dtype.itemsize == 2 else np.uint8)


def _widened(x, etype: str):
    """``x`` in an instruction's input type ``etype`` (fp8 to f16 exactly; otherwise unchanged)."""
    want = np.dtype(fm.VALUE_DTYPES[etype])
    return x if x.dtype == want else x.astype(want)


def epilogue_operands(d, given: dict, K: int) -> dict:
    """The epilogue operands as float32 numpy arrays: ``c`` broadcast to ``d``'s shape, ``bias``
    (N,), ``scale_a`` () or (M, 1) or block scales along K (M, ceil(K / BLOCK)), ``scale_b`` ()
    or (1, N) or (ceil(K / BLOCK), N), scalars ``alpha`` and ``beta``."""
    if given["beta"] is not None and given["c"] is None:
        raise ValueError("identify: beta scales c; give c= with beta=")
    M, N = d.shape[-2:]
    kb = -(-K // BLOCK)
    shapes = {"c": [d.shape], "bias": [(N,)], "alpha": [()], "beta": [()], "scale_a": [(), (M, 1), (M, kb)],
              "scale_b": [(), (1, N), (kb, N)]}
    ops = {}
    for name, v in given.items():
        if v is None:
            continue
        v = np.asarray(v).astype(np.float32)
        if name == "c" and v.ndim <= d.ndim and all(x in (1, y) for x, y in zip(v.shape[::-1], d.shape[::-1])):
            v = np.broadcast_to(v, d.shape)
        if v.shape not in shapes[name]:
            raise ValueError(f"identify: {name} must have shape " + " or ".join(map(str, shapes[name]))
                             + (" (or broadcast to it)" if name == "c" else "") + f", got {v.shape}")
        ops[name] = v
    if block_scaled(ops) and not (ops.get("scale_a", np.zeros(())).shape == (M, kb)
                                  and ops.get("scale_b", np.zeros(())).shape == (kb, N)):
        raise ValueError(f"identify: block scales along K need both scale_a (M, {kb}) and scale_b ({kb}, N), "
                         f"one per {BLOCK} elements of K")
    return ops


def block_scaled(ops: dict) -> bool:
    """Whether the scales are block scales along K (several blocks of :data:`BLOCK`; with one
    block they compute as row-wise scales)."""
    a, b = ops.get("scale_a"), ops.get("scale_b")
    return (a is not None and a.ndim == 2 and a.shape[1] > 1) or (b is not None and b.ndim == 2 and b.shape[0] > 1)


def epilogues_to_try(epilogues, has_c: bool, has_bias: bool, two_scales: bool, block: bool = False):
    """The epilogues identify tries for each schedule (``block``: with block scales along K of
    :data:`BLOCK` elements)."""
    if epilogues is None:
        return [Epilogue(c=pc, bias=pb, scales=sc, scale_block=BLOCK if block else 0)
                for pc in (PLACES if has_c else PLACES[:1]) for pb in (PLACES if has_bias else PLACES[:1])
                for sc in (SCALE_ORDERS if two_scales else SCALE_ORDERS[:1])]
    epilogues = list(epilogues)
    if not epilogues or not all(isinstance(e, Epilogue) for e in epilogues):
        raise TypeError(f"identify: epilogues must be a non-empty list of tcemu.Epilogue, got {epilogues!r}")
    if any(bool(e.scale_block) != block or e.scale_block not in (0, BLOCK) for e in epilogues):
        raise ValueError(f"identify: epilogues with scale_block={BLOCK} go with block scales along K (scale_a (M, "
                         f"K / {BLOCK}), scale_b (K / {BLOCK}, N)), those with scale_block=0 with scalar or row-wise "
                         "scales")
    return epilogues


def _same(x, y):
    """Bitwise equality, per output."""
    x, y = np.ascontiguousarray(x), np.ascontiguousarray(y)
    return (x.view(np.uint8).reshape(x.shape + (-1,)) == y.view(np.uint8).reshape(y.shape + (-1,))).all(-1)


class Sample:
    """The rows and columns identify compares, spread over the output: ``A`` (R, K), ``D`` (R, C),
    B per batch index (``Bs``), the batch index of each row (``bi``) and the first rows every
    candidate is tried on (``probe``)."""

    def __init__(self, a, b, d, rows, cols, ops=None):
        K = a.shape[-1]
        out_shape = d.shape
        a2 = np.broadcast_to(a, out_shape[:-2] + a.shape[-2:]).reshape(-1, a.shape[-2], K)
        b2 = np.broadcast_to(b, out_shape[:-2] + b.shape[-2:]).reshape(-1, K, b.shape[-1])
        d2 = d.reshape(-1, out_shape[-2], out_shape[-1])
        self.ci = np.unique(np.linspace(0, out_shape[-1] - 1, min(cols, out_shape[-1])).round().astype(int))
        flat_rows = a2.shape[0] * a2.shape[1]
        ri = np.unique(np.linspace(0, flat_rows - 1, min(rows, flat_rows)).round().astype(int))
        self.bi, mi = ri // a2.shape[1], ri % a2.shape[1]
        self.A, self.D, self.K = a2[self.bi, mi], d2[self.bi, mi][:, self.ci], K
        self.Bs = {int(x): b2[x][:, self.ci] for x in np.unique(self.bi)}
        self.probe = np.arange(len(ri)) < min(8, len(ri))
        ops = dict(ops or {})
        if "c" in ops:
            ops["c"] = ops["c"].reshape(d2.shape)[self.bi, mi][:, self.ci]
        if "bias" in ops:
            ops["bias"] = ops["bias"][self.ci]
        if ops.get("scale_a") is not None and ops["scale_a"].ndim:
            ops["scale_a"] = ops["scale_a"][mi]
        if ops.get("scale_b") is not None and ops["scale_b"].ndim:
            ops["scale_b"] = ops["scale_b"][:, self.ci]
        self.ops, self.out = ops, OUTPUT_TYPES[d.dtype]

    def _rows(self, sel) -> dict:
        """The epilogue operands of the rows ``sel``."""
        return {k: (v[sel] if k == "c" or (k == "scale_a" and v.ndim) else v) for k, v in self.ops.items()}

    def _epilogue(self, acc, cfg, sel):
        """The rows ``sel`` of the float32 accumulators ``acc`` (serial split-K with operands: each
        slice's, (S, R, C)) through ``cfg``'s epilogue, in D's type."""
        if not self.ops:
            with np.errstate(over="ignore"):  # float32 -> float16 overflow: inf, as the GPU gives
                return acc.astype(self.D.dtype)
        if serial_epilogue(cfg, self.K, self.ops):
            return np.asarray(finish_serial(jnp.asarray(acc), self._rows(sel), self.out, cfg.k_schedule.partials,
                                            cfg.epilogue))
        return np.asarray(finish(jnp.asarray(acc), self._rows(sel), self.out, cfg.epilogue))

    def evaluators(self, base: GemmConfig):
        """Per batch index, the chain evaluator of ``base``'s instruction (None: off the kernel)."""
        kernel = kernel_of(base)
        if kernel is None:
            return None
        A = _raw(_widened(self.A, base.ins.atype))
        return {x: Chains(base, kernel, A, _raw(_widened(B, base.ins.btype))) for x, B in self.Bs.items()}

    def run(self, cfg, sel):
        """``cfg``'s outputs on the rows ``sel``, through :func:`tcemu.matmul`."""
        res = np.zeros((int(sel.sum()), len(self.ci)), self.D.dtype)
        for x, B in self.Bs.items():
            m = self.bi[sel] == x
            if m.any() and (serial_epilogue(cfg, self.K, self.ops) or cfg.epilogue.scale_block):
                ops = {k: jnp.asarray(v) for k, v in self._rows(np.flatnonzero(sel)[m]).items()}
                res[m] = np.asarray(matmul(jnp.asarray(self.A[sel][m]), jnp.asarray(B), config=cfg, out_type=self.out,
                                           **ops))
            elif m.any():
                acc = np.asarray(matmul(jnp.asarray(self.A[sel][m]), jnp.asarray(B), config=cfg))
                res[m] = self._epilogue(acc, cfg, np.flatnonzero(sel)[m])
        return res

    def evaluate(self, fast, cfg, sel):
        """Per output of the rows ``sel``: whether ``cfg`` reproduces it (the chain evaluators
        ``fast`` first where there are some; a full match is confirmed through ``matmul``)."""
        if fast is None or cfg.epilogue.scale_block:  # the chain evaluator does not scale blocks
            return _same(self.run(cfg, sel), self.D[sel])
        res = np.zeros(self.D.shape, self.D.dtype)
        for x, ev in fast.items():
            m = sel & (self.bi == x)
            if m.any():
                acc = ev(cfg.schedule, self.K, np.flatnonzero(m), parts=serial_epilogue(cfg, self.K, self.ops))
                res[m] = self._epilogue(acc, cfg, np.flatnonzero(m))
        ok = _same(res[sel], self.D[sel])
        if ok.all() and sel.all():
            ok = _same(self.run(cfg, sel), self.D[sel])
        return ok
