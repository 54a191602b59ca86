"""identify's arguments checked: the operands and their types, ``max_seconds``, ``candidates``."""
from __future__ import annotations

import numpy as np

from tcemu._src.arch import resolve
from tcemu._src.gemm import KSchedule
from tcemu._src.identify.sample import INPUT_TYPES, OUTPUT_TYPES


def check_operands(a, b, d, arch, rows, cols):
    """identify's arguments checked; the input and output type names."""
    resolve(arch)
    for name, x, table in (("a", a, INPUT_TYPES), ("b", b, INPUT_TYPES), ("d", d, OUTPUT_TYPES)):
        if x.dtype not in table:
            raise TypeError(f"identify: {name} must have dtype {', '.join(t.name for t in table)}, got {x.dtype}")
    if a.ndim < 2 or b.ndim < 2 or a.shape[-1] != b.shape[-2]:
        raise ValueError(f"identify: needs a (..., M, K) and b (..., K, N), got {a.shape} and {b.shape}")
    try:
        batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    except ValueError:
        raise ValueError(f"identify: the batch axes of a {a.shape} and b {b.shape} do not broadcast "
                         f"({a.shape[:-2]} vs {b.shape[:-2]}): give one batch size, or 1 / none for one side") from None
    out_shape = batch + (a.shape[-2], b.shape[-1])
    if d.shape != out_shape:
        raise ValueError(f"identify: d must have shape {out_shape} (a @ b), got {d.shape}")
    if a.shape[-1] == 0:
        raise ValueError("identify: K = 0 leaves nothing to identify")
    if 0 in out_shape:
        raise ValueError(f"identify: d of shape {out_shape} is empty: nothing to identify")
    for name, v in (("rows", rows), ("cols", cols)):
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
            raise ValueError(f"identify: {name} must be a positive integer, got {v!r}")
    return INPUT_TYPES[a.dtype], INPUT_TYPES[b.dtype], OUTPUT_TYPES[d.dtype]


def check_seconds(v) -> float:
    """``max_seconds`` checked: a number >= 0."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise TypeError(f"identify: max_seconds must be a number of seconds (int or float), got {v!r}")
    if not v >= 0:
        raise ValueError(f"identify: max_seconds must be >= 0, got {v!r}")
    return float(v)


def check_candidates(candidates):
    """``candidates`` checked: None or a non-empty list of KSchedules."""
    if candidates is None:
        return None
    what = "identify: candidates must be None or a non-empty list of tcemu.KSchedule"
    if isinstance(candidates, (str, bytes, KSchedule)) or not hasattr(candidates, "__iter__"):
        raise TypeError(f"{what}, got {candidates!r}")
    out = list(candidates)
    bad = [c for c in out if not isinstance(c, KSchedule)]
    if bad:
        raise TypeError(f"{what}, got {bad[0]!r} ({type(bad[0]).__name__}) in it")
    if not out:
        raise ValueError(f"{what}, got an empty one")
    return out
