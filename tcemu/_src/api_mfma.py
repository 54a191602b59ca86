"""Value-level AMD MFMA: ``tcemu.mma("v_mfma_...", a, b, c, arch="MI300X")``.

A multi-block MFMA (``_2b``/``_4b``/``_16b``, and CDNA1/2's multi-block shapes such as
``v_mfma_f32_32x32x1f32``) computes one independent ``M x N x K`` product per block: the blocks
are leading batch entries like any other batch (a is (..., M, K) with the per-block M and K).
The ISA's modifiers that act on values: ``cbsz``/``abid`` (block ``j`` reads the A of block
``(j >> cbsz << cbsz) + abid``: one A block broadcast to groups of ``2**cbsz`` blocks; the block
axis is then the last batch axis, of size ``blocks``) and, for f64 on CDNA3, ``neg`` (three flags
negating A, B and C; LLVM's ``neg:[a,b,c]``, which replaces ``blgp`` there). ``blgp`` itself
permutes the lanes that hold B, a register-level matter. MMA-Sim does not model these modifiers;
they are implemented from the CDNA3 ISA guide's description of the MFMA fields. The integer MFMAs
(``v_mfma_i32_..._i8``) take int8 a and b and int32 c and return int32: an exact sum plus C that
wraps modulo 2**32 (assumed from the ISA text, no peer model; :func:`~tcemu._src.numerics.mfma.int_bits`).

    >>> import jax.numpy as jnp, tcemu
    >>> a = jnp.ones((32, 8), jnp.float16); b = jnp.full((8, 32), 0.5, jnp.float16)
    >>> d = tcemu.mma("v_mfma_f32_32x32x8_f16", a, b, jnp.zeros((32, 32), jnp.float32), arch="MI300X")
    >>> float(d[0, 0])
    4.0
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from tcemu._src import formats as fm
from tcemu._src.isa.mfma import parse_mfma
from tcemu._src.numerics import mfma as mfma_numerics
from tcemu._src.numerics.presets import check_model

_JITS: dict = {}


def _operand(x, etype: str, name: str, spelling: str):
    x = jnp.asarray(x)
    want = np.dtype(fm.VALUE_DTYPES[etype])
    if x.dtype != want:
        raise TypeError(f"{spelling}: {name} must have dtype {want.name}"
                        f"{' (float32 registers, read as tf32)' if etype == 'tf32' else ''}, got {x.dtype}")
    if etype == "f64":
        return jax.lax.bitcast_convert_type(x, jnp.uint64)
    if etype in ("s8", "s32"):  # integer MFMAs: two's complement bits, as the registers hold them
        return jax.lax.bitcast_convert_type(x, jnp.uint8 if etype == "s8" else jnp.uint32).astype(jnp.uint32)
    return fm.to_bits(x, etype)


def _modifiers(ins, spelling, cbsz, abid, neg):
    """Check cbsz / abid / neg against the instruction (ISA: CBSZ up to log2(blocks), ABID < 2**CBSZ)."""
    top = int(np.log2(ins.blocks))
    for name, v, hi in (("cbsz", cbsz, top), ("abid", abid, (1 << cbsz) - 1 if isinstance(cbsz, int) else 0)):
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or not 0 <= v <= hi:
            raise ValueError(f"{spelling}: {name} must be an integer in 0..{hi} ({ins.blocks} block"
                             f"{'s' if ins.blocks > 1 else ''}), got {v!r}")
    if neg is not None:
        if ins.family != "f64" or ins.arch != "gfx942":
            raise ValueError(f"{spelling}: neg is only for the f64 MFMAs of gfx942 (CDNA3)")
        if not isinstance(neg, (tuple, list)) or len(neg) != 3 or any(x not in (0, 1, True, False) for x in neg):
            raise ValueError(f"{spelling}: neg must be three flags (negate A, B, C), got {neg!r}")
    return tuple(bool(x) for x in neg) if neg is not None else (False, False, False)


def mfma(spelling: str, a, b, c, *, arch, model=None, cbsz: int = 0, abid: int = 0, neg=None):
    """``d = a @ b + c`` of the AMD MFMA ``spelling`` on ``arch`` (called by :func:`tcemu.mma`)."""
    ins = parse_mfma(spelling, arch)
    check_model(model, f"{spelling!r}")
    flips = _modifiers(ins, spelling, cbsz, abid, neg)
    shapes = {"a": (ins.m, ins.k), "b": (ins.k, ins.n), "c": (ins.m, ins.n)}
    for name, x in zip(shapes, (a, b, c)):
        if jnp.ndim(x) < 2 or tuple(jnp.shape(x)[-2:]) != shapes[name]:
            raise ValueError(f"{spelling}: {name} must have shape (..., {shapes[name][0]}, {shapes[name][1]}), "
                             f"got {jnp.shape(x)}")
    if ins.family == "f64":
        from tcemu._src.numerics.fma64 import require_x64

        require_x64(f"{spelling!r}")
    A, B, C = (_operand(x, t, n, spelling) for x, t, n in ((a, ins.atype, "a"), (b, ins.btype, "b"), (c, ins.dtype, "c")))
    try:
        batch = np.broadcast_shapes(*(x.shape[:-2] for x in (A, B, C)))
    except ValueError:
        raise ValueError(f"{spelling}: the batch axes of a {A.shape}, b {B.shape} and c {C.shape} do not "
                         "broadcast") from None
    A, B, C = (jnp.broadcast_to(x, batch + x.shape[-2:]) for x in (A, B, C))
    if cbsz:
        if not batch or batch[-1] != ins.blocks:
            raise ValueError(f"{spelling}: with cbsz the last batch axis is the block axis, of size {ins.blocks}; "
                             f"got batch shape {batch}")
        src = (np.arange(ins.blocks) >> cbsz << cbsz) + abid
        A = A[..., src, :, :]
    key = (ins, model, flips)
    if key not in _JITS:
        _JITS[key] = jax.jit(lambda A, B, C: mfma_numerics.mfma_bits(ins, *_negate(ins, (A, B, C), flips), model))
    D = _JITS[key](A, B, C)
    if ins.dtype in ("f64", "s32"):
        return jax.lax.bitcast_convert_type(D, jnp.float64 if ins.dtype == "f64" else jnp.int32)
    return fm.from_bits(D, "f32")


def _negate(ins, xs, flips):
    sign = jnp.uint64(1 << 63) if ins.family == "f64" else None
    return [x ^ sign if f else x for x, f in zip(xs, flips)]
