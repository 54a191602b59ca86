"""The public entry points: ``ptx`` (register level), ``mma`` (value level), ``regfile``."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from tcemu._src import formats as fm
from tcemu._src.arch import resolve
from tcemu._src.numerics.mma import check_key
from tcemu._src.isa import parse as P
from tcemu._src.isa import wmma as W
from tcemu._src.numerics import mma as mma_numerics
from tcemu._src.numerics.presets import check_model


def regfile(nregs: int):
    """A warp's register file: zeros of shape ``(32, nregs)``, ``uint32``."""
    from tcemu._src.memory import is_integer_value

    if not is_integer_value(nregs):
        raise TypeError(f"regfile: nregs must be an integer, got {nregs!r} ({type(nregs).__name__})")
    if nregs < 1:
        raise ValueError(f"regfile: nregs must be >= 1, got {nregs}")
    return jnp.zeros((32, int(nregs)), jnp.uint32)


def ptx(spelling: str, arch="sm_90", *, model=None):
    """The instruction ``spelling`` as a pure, jit-compiled function over a warp's registers.

    ``arch``: "sm_70" ... "sm_100" or a GPU name ("V100", "A100", "H100", ...). ``model``
    (floating-point MMAs only): a :class:`tcemu.BlockFMA` or :class:`tcemu.ArchNumerics` replacing
    the architecture's numerics preset.

    >>> import tcemu
    >>> ld_a = tcemu.ptx("wmma.load.a.sync.aligned.row.m16n16k16.f16", arch="sm_90")
    >>> ld_a.fragment.copies      # the H200 keeps every A element twice
    2
    """
    a = resolve(arch)
    ins = P.parse(spelling)
    _check_model(ins, model)
    if isinstance(ins, P.WmmaLoad):
        return W.WmmaLoad_(ins, a)
    if isinstance(ins, P.WmmaStore):
        return W.WmmaStore_(ins, a)
    if isinstance(ins, P.MatrixMove):
        from tcemu._src.isa import matrix_move as MM

        return (MM.LdMatrix if ins.op == "ld" else MM.StMatrix)(ins, a)
    if ins.kind == "wmma":
        return W.MmaRegs(ins, a, W.wmma_mma_fragments(a, ins), model)
    if ins.kind == "mma":
        return W.MmaRegs(ins, a, W.mma_sync_fragments(ins), model)
    raise P.Unsupported(f"{spelling!r}: the register-level {ins.kind} instruction is not "
                        "available yet; use tcemu.mma for its value-level numerics")


def _check_model(ins, model):
    """``model`` must be a BlockFMA, an ArchNumerics or None, and only for floating-point MMAs."""
    check_model(model, repr(ins.spelling))
    if model is not None and not (isinstance(ins, P.Mma) and ins.family not in ("int", "b1", "f64")):
        raise ValueError(f"{ins.spelling!r}: model= applies to floating-point MMAs (f16, bf16, tf32, e4m3/e5m2) "
                         "only; this instruction's numerics are fixed (exact integers, f64 FMAs, or no arithmetic)")


# value range of the narrow integer types; the register path reads their low bits
_INT_RANGE = {"s4": (-8, 7), "u4": (0, 15), "b1": (0, 1)}


def _operand(x, etype, name, spelling):
    """Typed array -> engine encoding, checking the dtype (and the range of s4/u4/b1 values)."""
    x = jnp.asarray(x)
    want = {"f16": [jnp.float16], "bf16": [jnp.bfloat16], "tf32": [jnp.float32], "f32": [jnp.float32],
            "f64": [jnp.float64], "e4m3": [fm.VALUE_DTYPES["e4m3"]], "e5m2": [fm.VALUE_DTYPES["e5m2"]],
            "s8": [jnp.int8], "u8": [jnp.uint8], "s4": [jnp.int8, jnp.int32], "u4": [jnp.uint8, jnp.int32],
            "b1": [jnp.uint8, jnp.bool_, jnp.int32], "s32": [jnp.int32]}[etype]
    if not any(x.dtype == np.dtype(w) for w in want):
        raise TypeError(f"{spelling}: {name} must have dtype {' or '.join(np.dtype(w).name for w in want)} "
                        f"for .{etype}, got {x.dtype}")
    if etype == "f64":
        return jax.lax.bitcast_convert_type(x, jnp.uint64)
    if etype in _INT_RANGE:
        lo, hi = _INT_RANGE[etype]
        if not isinstance(x, jax.core.Tracer):
            v = np.asarray(x).astype(np.int64)
            if v.size and (v.min() < lo or v.max() > hi):
                raise ValueError(f"{spelling}: {name} holds .{etype} values outside {lo}..{hi} "
                                 f"(min {v.min()}, max {v.max()})")
        x = x.astype(jnp.int32)
        w = 4 if etype != "b1" else 1
        return (x << (32 - w)) >> (32 - w) if etype == "s4" else x & ((1 << w) - 1)
    if etype in ("s8", "u8", "s32"):
        return x.astype(jnp.int32)
    return fm.to_bits(x, etype)


def mma(spelling: str, a, b, c, *, arch="sm_90", model=None, key=None):
    """Value-level MMA: ``d = a @ b + c`` with the exact numerics of ``spelling`` on ``arch``.

    ``a`` (..., M, K), ``b`` (..., K, N), ``c`` (..., M, N) are typed arrays (float16, bfloat16,
    float32 for tf32, float64, ml_dtypes float8_e4m3fn/float8_e5m2, int8/uint8, ...), batched
    over broadcastable leading axes. Returns ``d`` typed as ``.dtype``. ``model`` replaces the
    preset of a floating-point MMA (a :class:`tcemu.BlockFMA` or :class:`tcemu.ArchNumerics`);
    ``key`` (``jax.random.key(...)``) feeds stochastic rounding. ``.s4``/``.u4``/``.b1`` values
    must lie in -8..7, 0..15 and 0..1: concrete arrays outside raise a ValueError, traced ones
    (under ``jit``) are wrapped to their low 4 bits (sign-extended for ``.s4``) or 1 bit, as the
    register path reads them.

    >>> import jax.numpy as jnp, tcemu
    >>> a = jnp.ones((16, 16), jnp.float16); b = jnp.ones((16, 16), jnp.float16)
    >>> d = tcemu.mma("wmma.mma.sync.aligned.row.col.m16n16k16.f32.f32", a, b,
    ...               jnp.zeros((16, 16), jnp.float32), arch="A100")
    >>> float(d[0, 0])
    16.0
    """
    ins = P.parse(spelling)
    if not isinstance(ins, P.Mma):
        raise ValueError(f"{spelling!r} is not an MMA instruction")
    arch_ = resolve(arch)
    mma_numerics.check_arch(ins, arch_)
    _check_model(ins, model)
    key = check_key(key, f"{spelling!r}")
    shapes = {"a": (ins.m, ins.k), "b": (ins.k, ins.n), "c": (ins.m, ins.n)}
    for name, x in (("a", a), ("b", b), ("c", c)):
        if jnp.ndim(x) < 2 or tuple(jnp.shape(x)[-2:]) != shapes[name]:
            raise ValueError(f"{spelling}: {name} must have shape (..., {shapes[name][0]}, {shapes[name][1]}), "
                             f"got {jnp.shape(x)}")
    try:
        batch = np.broadcast_shapes(*(jnp.shape(x)[:-2] for x in (a, b, c)))
    except ValueError:
        raise ValueError(f"{spelling}: the batch axes of a {jnp.shape(a)}, b {jnp.shape(b)} and c {jnp.shape(c)} "
                         "do not broadcast") from None
    if ins.family == "f64":
        from tcemu._src.numerics.fma64 import require_x64

        require_x64(f"{spelling!r}")
    A = _operand(a, ins.atype, "a", spelling)
    B = _operand(b, ins.btype, "b", spelling)
    C = _operand(c, ins.ctype, "c", spelling)
    A = jnp.broadcast_to(A, batch + A.shape[-2:])
    B = jnp.broadcast_to(B, batch + B.shape[-2:])
    C = jnp.broadcast_to(C, batch + C.shape[-2:])
    D = _mma_jit(ins, arch_, model)(A, B, C, key)
    if ins.dtype == "f64":
        return jax.lax.bitcast_convert_type(D, jnp.float64)
    if ins.dtype == "s32":
        return D.astype(jnp.int32)
    return fm.from_bits(D, ins.dtype)


_JITS: dict = {}


def _mma_jit(ins, arch, model):
    key = (ins, arch, model)
    if key not in _JITS:
        _JITS[key] = jax.jit(lambda A, B, C, k: mma_numerics.mma_bits_batched(ins, A, B, C, model, arch=arch, key=k))
    return _JITS[key]
