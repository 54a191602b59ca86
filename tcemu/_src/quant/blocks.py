"""Block-scaled quantisation for the MX and NVFP4 GEMMs of Blackwell tensor cores.

Two recipes, by scale type:

* **MX** (ue8m0 scales; OCP Microscaling Formats (MX) v1.0, section 6.3, with the FLOOR scale
  of PyTorch torchao's ``to_mx``): per block of ``block`` elements along K, the shared scale is
  ``X = 2**(floor(log2(amax)) - emax)`` with ``emax`` the exponent of the element format's
  largest normal (e4m3 8, e5m2 15, e3m2 4, e2m3 2, e2m1 2), clamped to 2**-127 .. 2**127
  (a zero block takes 2**-127, one holding an infinity 2**127); the elements are ``x / X``
  rounded to nearest even and saturated to the largest finite element.
* **NVFP4** (ue4m3 scales, e2m1 elements, blocks of 16; NVIDIA, "Pretraining Large Language
  Models with NVFP4", arXiv 2509.25149, the Transformer Engine recipe): a float32 per-tensor
  encode scale ``s = 6 * 448 / amax(x)`` (1 when ``amax`` is 0 or infinite; the float32
  maximum when the quotient overflows, as Transformer Engine clamps it), block scales
  ``e4m3(amax(block) / 6 * s)`` (each operation rounded to float32, then RNE, saturating),
  elements ``e2m1(x * (s / scale))`` (``s / scale`` clamped to the float32 maximum as well;
  saturating); the GEMM's result is multiplied by ``1 / s`` of each operand.

A block holding NaN gets the NaN scale (ue8m0 0xFF, ue4m3 0x7F); its NaN elements become +0,
the others are quantised with the scale of the block's other values (amax ignores NaN).

Everything is exact integer arithmetic on float32 bit patterns: amax as the largest magnitude
pattern, the power-of-two scaling as exponent arithmetic rounded once to the element format,
NVFP4's products and divisions correctly rounded (:mod:`~tcemu._src.numerics.fp32`,
``rounding.divide``). XLA's float32 arithmetic is not exact everywhere (on CPUs it flushes
subnormals to zero; on GPUs its division is not correctly rounded), so the bits are the same with
x64 on or off and on every backend, subnormal inputs included.

    >>> import jax.numpy as jnp, tcemu
    >>> q = tcemu.block_quantize(jnp.array([[3.0, -0.7, 0.1, 100.0]]), "e2m1", "ue8m0", block=4)
    >>> q.elements.tolist(), q.scales.tolist()        # X = 2**(6 - 2): elements x / 16
    ([[0.0, -0.0, 0.0, 6.0]], [[16.0]])
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from tcemu._src import formats as fm
from tcemu._src.checks import is_integer_value, real_array
from tcemu._src.numerics import engine, fp32, rounding
from tcemu._src.numerics.rounding import round_pack32
from tcemu._src.quant.elements import as_float32, code_values, f32_bits

# exponent of the largest normal of each element format (OCP MX v1.0, table 2 / emax_elem)
EMAX = {"e4m3": 8, "e5m2": 15, "e3m2": 4, "e2m3": 2, "e2m1": 2}
_U = jnp.uint32
_MAG, _INF, _NAN, _ONE, _F32_MAX = 0x7FFFFFFF, 0x7F800000, 0x7FC00000, 0x3F800000, 0x7F7FFFFF


class BlockQuantized(NamedTuple):
    """``x ~= elements * scales (repeated over each block) / tensor_scale``: float32 values
    (elements exactly representable in the element format, scales in the scale format), the
    codes the instruction reads, and the per-tensor float32 encode scale (1.0 for MX).

    >>> import jax.numpy as jnp, tcemu
    >>> q = tcemu.block_quantize(jnp.array([[1.0, 2.0, 3.0, 5.0]], jnp.float32), "e2m1", "ue8m0", block=4)
    >>> q.elements.tolist(), q.scales.tolist(), q.tensor_scale.tolist()    # 5 rounds to 4 (even)
    ([[1.0, 2.0, 3.0, 4.0]], [[1.0]], 1.0)
    >>> q.element_codes.tolist(), q.scale_codes.tolist()                   # e2m1 and ue8m0 codes
    ([[2, 4, 5, 6]], [[127]])
    """

    elements: jnp.ndarray  # (..., K) float32
    scales: jnp.ndarray  # (..., K / block) float32
    element_codes: jnp.ndarray  # (..., K) uint32
    scale_codes: jnp.ndarray  # (..., K / block) uint32
    tensor_scale: jnp.ndarray  # () float32

    def dequantize(self, block: int):
        """The values the GEMM multiplies, as float32: ``elements * scales`` (each product rounded
        to nearest even, subnormals kept) divided by the tensor scale (correctly rounded).
        ``block`` must be the quantisation's: ``scales`` of shape (..., K / block).

        >>> import jax.numpy as jnp, tcemu
        >>> q = tcemu.block_quantize(jnp.array([[2.0**-130, 2.0**-128]], jnp.float32), "e4m3", "ue8m0", block=2)
        >>> q.dequantize(2).tolist() == [[2.0**-130, 2.0**-128]]       # subnormals kept
        True
        """
        e = real_array(self.elements, "dequantize", "elements")
        s = real_array(self.scales, "dequantize", "scales")
        t = real_array(self.tensor_scale, "dequantize", "tensor_scale")
        if not is_integer_value(block) or block < 1:
            raise ValueError(f"dequantize: block must be a positive integer, got {block!r}")
        if e.ndim < 1:
            raise ValueError(f"dequantize: elements must have a block axis (..., K), got shape {e.shape}")
        K = e.shape[-1]
        if K % block:
            fit = s.ndim and s.shape[-1] and not K % s.shape[-1]
            raise ValueError(f"dequantize: block {block} does not divide the elements' last axis (shape {e.shape})"
                             + (f"; these scales fit block={K // s.shape[-1]}" if fit else ""))
        want = e.shape[:-1] + (K // block,)
        if s.shape != want:
            raise ValueError(f"dequantize: scales of shape {s.shape} do not match elements of shape {e.shape} "
                             f"in blocks of {block}: expected scales of shape {want}")
        if t.ndim:
            raise ValueError(f"dequantize: tensor_scale must be a scalar, got shape {t.shape}")
        return _dequantize(e, s, t, int(block))


@functools.partial(jax.jit, static_argnums=3)
def _dequantize(elements, scales, tensor_scale, block: int):
    prod = fp32.mul(fp32.bits(as_float32(elements)), fp32.bits(jnp.repeat(as_float32(scales), block, axis=-1)))
    return rounding.divide(fp32.values(prod), as_float32(tensor_scale))


def _pow2_bits(e):
    """float32 bits of 2.0**e for int32 e in -149..127, exactly."""
    normal = jnp.clip(e + 127, 1, 254).astype(_U) << 23
    sub = _U(1) << jnp.clip(e + 149, 0, 22).astype(_U)
    return jnp.where(e >= -126, normal, sub)


def _floor_log2(bits):
    """floor(log2(a)) of positive finite float32 values ``a`` from their bits (subnormals included)."""
    d = fm.decode(bits, fm.F32)
    lead = 31 - jax.lax.clz(d.sig.astype(_U)).astype(jnp.int32)  # leading bit of the significand
    return d.exp + lead - 23


def _round_scaled(bits, e, fmt: fm.FloatFormat):
    """Codes of ``fmt`` for the float32 values of ``bits`` times 2**-e (int32 ``e``): the exact
    scaled value rounded once to nearest even (cvt's rounding, the exponent shifted by ``e``),
    saturated to the largest finite element (infinities too); NaN gives +0."""
    d = fm.decode(bits, fm.F32)
    q = round_pack32(d.sign, d.sig.astype(_U), d.exp - 23 - e, fmt, "rne", overflow="saturate")
    top = _U(((fmt.emax + fmt.bias) << fmt.fraction_bits) | fmt.max_fraction)
    sign = _U(fmt.sign_bit)
    mag = jnp.where(d.is_inf, top, q & ~sign)
    return jnp.where(d.is_nan, _U(0), (q & sign) | mag)


def _encode_scale(t):
    """NVFP4's per-tensor encode scale (float32 bits) for the bits ``t`` of amax: ``6 * 448 / t``
    correctly rounded, at most the float32 maximum; 1 for a zero or infinite amax."""
    q = jnp.minimum(fp32.bits(rounding.divide(6 * 448, fp32.values(t))), _U(_F32_MAX))
    return jnp.where((t == 0) | (t == _INF), _U(_ONE), q)


def block_quantize(x, etype: str, stype: str, *, block: int) -> BlockQuantized:
    """Quantise ``x`` (..., K) in blocks of ``block`` along its last axis (K a multiple of
    ``block``) to ``etype`` elements (e4m3, e5m2, e3m2, e2m3, e2m1) with ``stype`` scales: "ue8m0"
    (MX) or "ue4m3" (NVFP4, e2m1 elements); see the module docstring. ``x`` may be empty.

    >>> import jax.numpy as jnp, tcemu
    >>> q = tcemu.block_quantize(jnp.array([[0.1, 0.2, 0.3, 0.5]], jnp.float32), "e2m1", "ue8m0", block=4)
    >>> q.scales.tolist(), q.elements.tolist()        # X = 2**(floor(log2(0.5)) - 2): x / X rounded
    ([[0.125]], [[1.0, 1.5, 2.0, 4.0]])
    >>> q.dequantize(4).tolist()
    [[0.125, 0.1875, 0.25, 0.5]]
    """
    if not isinstance(etype, str) or etype not in EMAX:
        raise ValueError(f"block_quantize: etype must be one of {', '.join(EMAX)}, got {etype!r}")
    if not isinstance(stype, str) or stype not in fm.SCALE_TYPES:
        raise ValueError(f"block_quantize: stype must be one of {', '.join(fm.SCALE_TYPES)}, got {stype!r}")
    if stype == "ue4m3" and etype != "e2m1":
        raise ValueError(f"block_quantize: ue4m3 scales follow the NVFP4 recipe, whose elements are e2m1 (got {etype})")
    x = real_array(x, "block_quantize", "x")
    if not is_integer_value(block) or block < 1 or x.ndim < 1 or x.shape[-1] % block:
        raise ValueError(f"block_quantize: block must be a positive integer dividing the last axis "
                         f"({x.shape[-1] if x.ndim else 'a scalar has none'}), got {block!r}")
    return _block_quantize(x, etype, stype, int(block))


@functools.partial(jax.jit, static_argnums=(1, 2, 3))  # eagerly: one compilation per shape, not one per operation
def _block_quantize(x, etype: str, stype: str, block: int) -> BlockQuantized:
    """:func:`block_quantize` on checked arguments."""
    *lead, K = x.shape
    xb = fp32.bits(as_float32(x)).reshape(*lead, K // block, block)
    nan = (xb & _U(_MAG)) > _U(_INF)
    # non-negative floats order as their bit patterns: amax in integers, NaN left out
    amax = jnp.max(jnp.where(nan, _U(0), xb & _U(_MAG)), axis=-1, initial=_U(0))
    bad = jnp.any(nan, axis=-1)
    fmt = fm.FORMATS[etype]
    if stype == "ue8m0":
        e = jnp.where(amax == 0, -127, _floor_log2(amax) - EMAX[etype])
        e = jnp.where(amax == _INF, 127, jnp.clip(e, -127, 127))
        codes = jnp.where(bad, _U(0xFF), (e + 127).astype(_U))
        scale_bits = _pow2_bits(e)
        element_codes = _round_scaled(xb, e[..., None], fmt)
        tensor = _U(_ONE)
    else:  # NVFP4
        tensor = _encode_scale(jnp.max(amax, initial=_U(0)))
        s_dec = fp32.mul(fp32.bits(rounding.divide(fp32.values(amax), 6)), tensor)
        s_codes = engine.convert(jnp.minimum(s_dec, fp32.bits(448.0)), fm.F32, fm.E4M3)  # RNE, at most 448
        codes = jnp.where(bad, _U(0x7F), s_codes)
        scale_bits = f32_bits(s_codes, fm.E4M3)
        r = jnp.minimum(fp32.bits(rounding.divide(fp32.values(tensor), fp32.values(scale_bits))), _U(_F32_MAX))
        y = jnp.where((s_codes == 0)[..., None], _U(0), fp32.mul(xb, r[..., None]))
        element_codes = _round_scaled(y, 0, fmt)
    element_codes = element_codes.reshape(x.shape)
    scales = fp32.values(jnp.where(bad, _U(_NAN), scale_bits))
    return BlockQuantized(code_values(element_codes, etype), scales, element_codes, codes, fp32.values(tensor))
