"""The black box :func:`tcemu._src.probe.probe` measures: batches of single dot products
``c + sum a_k b_k`` (each a dict position -> (a, b) and a C) run through ``tcemu.mma``, or through a
user's ``mma`` function, as one chain of instructions along K per case, with the block scales of
block-scaled instructions set per scale block; only the dot product's value comes back.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from tcemu._src.isa.parse import Mma, parse
from tcemu._src.studies import DTYPES

_MIN_SUB = {"f16": -24, "bf16": -133, "tf32": -136, "e4m3": -9, "e5m2": -16, "e4m3fnuz": -10, "e5m2fnuz": -17}
_UNIT_SCALE = {"ue8m0": 127, "ue4m3": 0x38}  # 1.0
BATCH = 64  # cases per call


def probe_instruction(spelling: str, arch=None) -> Mma:
    """The parsed ``spelling`` if :func:`~tcemu._src.probe.probe` can measure it (a floating-point MMA with f32 C
    and D), else a ValueError naming it; an AMD MFMA is parsed for ``arch``."""
    if spelling.strip().startswith("v_mfma"):
        from tcemu._src.isa.mfma import parse_mfma

        ins = parse_mfma(spelling, arch)
        if ins.family in ("f32", "f64"):
            raise ValueError(f"probe measures block adders; {spelling!r} is a chain of FMAs")
        if ins.family == "int":
            raise ValueError(f"probe measures floating-point block adders; {spelling!r} is an integer MFMA (exact)")
        return ins
    ins = parse(spelling)
    if not isinstance(ins, Mma):
        raise ValueError(f"probe needs an MMA instruction, got {spelling!r}")
    if ins.dtype != "f32" or ins.ctype != "f32":
        raise ValueError(f"probe needs an instruction with f32 C and D, got {spelling!r}")
    return ins


class Box:
    """Batched single dot products through ``tcemu.mma`` (instructions chained along K)."""

    def __init__(self, spelling, arch, model, mma):
        self.ins = probe_instruction(spelling, arch)
        if mma is None:
            from tcemu._src.api import mma as emulated
            from tcemu._src.isa.targets import check_arch
            from tcemu._src.numerics.mma import resolve_model

            check_arch(self.ins, arch)
            resolve_model(self.ins, model, arch)  # the preset or model=, or an error naming model=

            def mma(sp, a, b, c, **scales):
                return emulated(sp, a, b, c, arch=arch, model=model, **scales)

        self.spelling, self.mma = spelling, mma
        self.fmts = (self.ins.atype, self.ins.btype)
        self.min_sub = max(_MIN_SUB.get(f, 0) for f in self.fmts)  # smallest subnormal in both formats

    def value(self, x):
        """Is x exactly representable in the input format? Returns the float (raises if not)."""
        for f in self.fmts:
            if f != "tf32" and float(np.asarray(x, dtype=DTYPES[f]).astype(np.float64)) != x:
                raise ValueError(f"{x} is not exact in {f}")
        return float(x)

    def pair(self, exp):
        """Two input values whose product is 2**exp."""
        lo, hi = exp // 2, exp - exp // 2
        return self.value(2.0 ** hi), self.value(2.0 ** lo)

    def scale_code(self, e: int) -> int:
        """The scale code of 2**e (ue8m0: -127..127; ue4m3: -9..8)."""
        if self.ins.stype == "ue8m0":
            return e + 127
        return int(np.asarray(2.0 ** e, np.float32).astype(DTYPES["e4m3"]).view(np.uint8))

    def run(self, cases, scales=None):
        """cases: list of (dict position -> (a, b), c). Returns float64 results. Block-scaled
        instructions take ``scales``: per case, a dict scale block -> (exponent of A's scale, of
        B's scale) for the row and column used (other blocks: 1.0). The cases run in batches of
        :data:`BATCH` (the last padded with zero cases), so that every call has the same shape and
        the emulator compiles one function per instruction and model."""
        scales = scales or [{}] * len(cases)
        out = []
        for i in range(0, len(cases), BATCH):
            part = cases[i:i + BATCH]
            pad = BATCH - len(part)
            out.append(self._run(part + [({0: (0.0, 0.0)}, 0.0)] * pad, scales[i:i + BATCH] + [{}] * pad)[:len(part)])
        return np.concatenate(out)

    def _run(self, cases, scales):
        """One batch of :meth:`run`."""
        K = self.ins.k
        n = max(max(p for p in pos) for pos, _ in cases) + 1
        steps = -(-n // K)
        B = len(cases)
        A = np.zeros((B, steps, self.ins.m, K), np.float64)
        Bm = np.zeros((B, steps, K, self.ins.n), np.float64)
        for i, (pos, _) in enumerate(cases):
            for p, (x, y) in pos.items():
                A[i, p // K, 0, p % K] = x
                Bm[i, p // K, p % K, 0] = y
        d = np.zeros((B, self.ins.m, self.ins.n), np.float32)
        d[:, 0, 0] = [c for _, c in cases]
        dta, dtb = DTYPES[self.fmts[0]], DTYPES[self.fmts[1]]
        S = self.ins.scale_vec
        if S:
            SA = np.full((B, steps, self.ins.m, S), _UNIT_SCALE[self.ins.stype], np.uint8)
            SB = np.full((B, steps, S, self.ins.n), _UNIT_SCALE[self.ins.stype], np.uint8)
            for i, sc in enumerate(scales):
                for blk, (ea, eb) in sc.items():
                    SA[i, blk // S, 0, blk % S] = self.scale_code(ea)
                    SB[i, blk // S, blk % S, 0] = self.scale_code(eb)
        d = jnp.asarray(d)
        for s in range(steps):
            a, b = A[:, s].astype(dta), Bm[:, s].astype(dtb)
            if S:  # fp6 as numpy (JAX holds none); scale codes as uint8
                d = self.mma(self.spelling, a, b, d, scale_a=SA[:, s], scale_b=SB[:, s])
            else:
                d = self.mma(self.spelling, jnp.asarray(a), jnp.asarray(b), d)
            shape, dtype = getattr(d, "shape", None), getattr(d, "dtype", None)
            if shape is None or tuple(shape) != (B, self.ins.m, self.ins.n) or dtype != np.float32:
                raise ValueError(f"the mma function returned {type(d).__name__} shape={shape} dtype={dtype} for "
                                 f"{self.spelling!r}; expected D as a float32 array of shape "
                                 f"{(B, self.ins.m, self.ins.n)} (batch, M, N), like tcemu.mma")
            d = jnp.asarray(d)
        return np.asarray(d[:, 0, 0], np.float64)
