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

import jax
import jax.numpy as jnp

from tcemu._src import formats as fm
from tcemu._src.numerics import engine, fma64, fp32, integer
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
    bit patterns of ``ins.atype``/``ins.btype`` (uint32; f64 uint64), C and D float32 (f64, int32) bits."""
    if ins.family == "int":
        return int_bits(ins, a, b, c, model)
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


# Integer MFMAs (v_mfma_i32_*_i8): wrap modulo 2**32, assumed from the ISA text, no peer model. No
# CDNA1/2/3 ISA guide text describes saturation for them and the VOP3P-MAI encoding has no clamp bit
# (LLVM VOP3PInstructions.td, VOPProfileMAI: HasClamp = 0, HasIntClamp = 0; the assembler takes only
# cbsz/abid/blgp), unlike RDNA's integer WMMA, which LLVM gives a clamp operand (WMMAUIClamp); AMD's
# gem5 model (vop3p_mai.cc) accumulates in plain int32_t. MMA-Sim 2.1.1 has no integer MFMA.
def int_bits(ins, a, b, c, model=None):
    """``D = A @ B + C`` of an integer MFMA on bit patterns: A, B the low 8 bits of uint32 fields
    (two's complement int8), C uint32 (int32 bits); D uint32. Exact products and sum over K (at most
    32 * 2**14 in magnitude), then the int32 addition of C, which wraps (the same with x64 on or off).

    >>> import jax.numpy as jnp
    >>> from tcemu._src.isa.mfma import parse_mfma
    >>> ins = parse_mfma("v_mfma_i32_4x4x4_16b_i8", "MI300X")
    >>> a = jnp.full((4, 4), 0x80, jnp.uint32)                      # int8 -128
    >>> c = jnp.full((4, 4), 2**31 - 1, jnp.uint32)                   # int32 max
    >>> hex(int(int_bits(ins, a, a.T, c)[0, 0]))                     # 2**31 - 1 + 4 * 2**14, wrapped
    '0x8000ffff'
    """
    if model is not None:
        raise ValueError(f"{ins.spelling!r}: integer MFMAs are exact (int32, wrapping); model= does not apply")
    a, b = (((jnp.asarray(x).astype(jnp.uint32) & 0xFF) ^ 0x80).astype(jnp.int32) - 0x80 for x in (a, b))
    c = jax.lax.bitcast_convert_type(jnp.asarray(c).astype(jnp.uint32), jnp.int32)
    return jax.lax.bitcast_convert_type(integer.int_mma(a, b, c), jnp.uint32)
