"""Numerics of one AMD MFMA on bit patterns (value and register level call this).

``ins`` is a parsed MFMA (:class:`tcemu._src.isa.mfma.Mfma`, read by its fields: the numerics do
not import the ISA). f32 and f64 MFMAs are chains of correctly rounded FMAs over k ([MS25]
``MMA_FMA``: ``d = fma(a_k, b_k, d)`` for k = 0 .. K-1, from C); every other type runs the
:class:`~tcemu._src.numerics.model.BlockFMA` of the preset (or ``model``), CDNA3's with the two-stage
adder of :mod:`~tcemu._src.numerics.two_stage`.

    >>> import jax.numpy as jnp
    >>> from tcemu._src import formats as fm
    >>> from tcemu._src.isa.mfma import parse_mfma
    >>> from tcemu._src.numerics import mfma
    >>> ins = parse_mfma("v_mfma_f32_4x4x1_16b_f32", "MI300X")
    >>> a = fm.to_bits(jnp.full((4, 1), 1 + 2.0**-12, jnp.float32), "f32")
    >>> c = fm.to_bits(jnp.full((4, 4), -1.0, jnp.float32), "f32")
    >>> d = mfma.mfma_bits(ins, a, a.T, c)
    >>> float(fm.from_bits(d, "f32")[0, 0]) == 2.0**-11 + 2.0**-24     # one rounding (an FMA)
    True
"""
from __future__ import annotations

import jax.numpy as jnp

from tcemu._src import formats as fm
from tcemu._src.numerics import engine, fma64, fp32
from tcemu._src.numerics.model import BlockFMA
from tcemu._src.numerics.presets import ArchNumerics, numerics


def mfma_model(ins, model=None) -> BlockFMA:
    """The :class:`BlockFMA` of a floating-point MFMA other than f32/f64: ``model`` if it is one,
    else that of the ``ArchNumerics`` given or of the preset of ``ins.arch``."""
    if isinstance(model, BlockFMA):
        return model
    nums = model if isinstance(model, ArchNumerics) else numerics(ins.arch)
    m = nums.for_instruction(ins)
    if m is None:
        raise ValueError(f"{ins.spelling!r}: no {ins.family} MFMA numerics for {nums.arch} ({nums.notes}); "
                         "pass model=tcemu.BlockFMA(...) to use your own")
    return m


def mfma_bits(ins, a, b, c, model=None):
    """``D = A @ B + C`` of one MFMA block (batched over leading axes): A (..., M, K), B (..., K, N)
    bit patterns of ``ins.atype``/``ins.btype`` (uint32; f64 uint64), C and D float32 (f64) bits."""
    if ins.family == "f64":
        return fma64.fma_chain_bits(a, b, c, "rn")
    if ins.family == "f32":
        if model is not None:
            raise ValueError(f"{ins.spelling!r}: f32 MFMAs are FMA chains; model= does not apply")
        a, b, d = (jnp.asarray(x).astype(jnp.uint32) for x in (a, b, c))
        for k in range(a.shape[-1]):
            d = fp32.fma(a[..., :, k:k + 1], b[..., k:k + 1, :], d)
        return d
    m = mfma_model(ins, model)
    return engine.fused_dot(a, fm.FORMATS[ins.atype], b, fm.FORMATS[ins.btype], c, fm.F32, m, acc="f32")
