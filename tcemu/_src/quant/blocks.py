"""Block-scaled quantisation for the MX and NVFP4 GEMMs of Blackwell tensor cores.

Two recipes, by scale type:

* **MX** (ue8m0 scales; OCP Microscaling Formats (MX) v1.0, section 6.3, with the FLOOR scale
  of PyTorch torchao's ``to_mx``): per block of ``block`` elements along K, the shared scale is
  ``X = 2**(floor(log2(amax)) - emax)`` with ``emax`` the exponent of the element format's
  largest normal (e4m3 8, e5m2 15, e3m2 4, e2m3 2, e2m1 2), clamped to 2**-127 .. 2**127
  (a zero block takes 2**-127); the elements are ``x / X`` rounded to nearest even and
  saturated to the largest finite element. A block holding NaN gets the NaN scale 0xFF.
* **NVFP4** (ue4m3 scales, e2m1 elements, blocks of 16; NVIDIA, "Pretraining Large Language
  Models with NVFP4", arXiv 2509.25149, the Transformer Engine recipe): a float32 per-tensor
  encode scale ``s = 6 * 448 / amax(x)`` (1 when ``amax`` is 0 or not finite), block scales
  ``e4m3(amax(block) / 6 * s)`` (RNE, saturating), elements ``e2m1(x * (s / scale))``
  (saturating); the GEMM's result is multiplied by ``1 / s`` of each operand.

All in float32 with power-of-two scalings, RNE conversions and NVFP4's divisions correctly rounded
in integers (``rounding.divide``; XLA's float32 division on GPUs is not), so the bits are the same
with x64 on or off and on every backend.

    >>> import jax.numpy as jnp, tcemu
    >>> q = tcemu.block_quantize(jnp.array([[3.0, -0.7, 0.1, 100.0]]), "e2m1", "ue8m0", block=4)
    >>> q.elements.tolist(), q.scales.tolist()        # X = 2**(6 - 2): elements x / 16
    ([[0.0, -0.0, 0.0, 6.0]], [[16.0]])
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from tcemu._src import formats as fm
from tcemu._src.checks import is_integer_value, real_array
from tcemu._src.numerics import rounding
from tcemu._src.quant.elements import code_values, quantize_codes

# exponent of the largest normal of each element format (OCP MX v1.0, table 2 / emax_elem)
EMAX = {"e4m3": 8, "e5m2": 15, "e3m2": 4, "e2m3": 2, "e2m1": 2}
_MAXVAL = {"e4m3": 448.0, "e5m2": 57344.0, "e3m2": 28.0, "e2m3": 7.5, "e2m1": 6.0}


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
        """The values the GEMM multiplies, as float32 (with the tensor scale divided out)."""
        return rounding.divide(self.elements * jnp.repeat(self.scales, block, axis=-1), self.tensor_scale)


def _pow2(e):
    """2.0**e (float32) for int32 e in -149..127, exactly."""
    e = jnp.asarray(e, jnp.int32)
    normal = jax.lax.bitcast_convert_type(jnp.clip(e + 127, 1, 254).astype(jnp.uint32) << 23, jnp.float32)
    sub = jax.lax.bitcast_convert_type(jnp.uint32(1) << jnp.clip(e + 149, 0, 22).astype(jnp.uint32), jnp.float32)
    return jnp.where(e >= -126, normal, sub)


def _scale_by_pow2(x, e):
    """x * 2**e for int32 e in -254..254, in two exact steps (one rounding only for subnormal results)."""
    h = e // 2
    return x * _pow2(h) * _pow2(e - h)


def _floor_log2(a):
    """floor(log2(a)) of positive finite float32 values, from their bits (subnormals included)."""
    d = fm.decode(jax.lax.bitcast_convert_type(a, jnp.uint32), fm.F32)
    lead = 31 - jax.lax.clz(d.sig.astype(jnp.uint32)).astype(jnp.int32)  # leading bit of the significand
    return d.exp + lead - 23


def block_quantize(x, etype: str, stype: str, *, block: int) -> BlockQuantized:
    """Quantise ``x`` (..., K) in blocks of ``block`` along its last axis (K a multiple of
    ``block``) to ``etype`` elements (e4m3, e5m2, e3m2, e2m3, e2m1) with ``stype`` scales: "ue8m0"
    (MX) or "ue4m3" (NVFP4, e2m1 elements); see the module docstring.

    >>> import jax.numpy as jnp, tcemu
    >>> q = tcemu.block_quantize(jnp.array([[0.1, 0.2, 0.3, 0.5]], jnp.float32), "e2m1", "ue8m0", block=4)
    >>> q.scales.tolist(), q.elements.tolist()        # X = 2**(floor(log2(0.5)) - 2): x / X rounded
    ([[0.125]], [[1.0, 1.5, 2.0, 4.0]])
    >>> q.dequantize(4).tolist()
    [[0.125, 0.1875, 0.25, 0.5]]
    """
    if not isinstance(etype, str) or etype not in EMAX:
        raise ValueError(f"block_quantize: etype must be one of {', '.join(EMAX)}, got {etype!r}")
    if stype not in fm.SCALE_TYPES:
        raise ValueError(f"block_quantize: stype must be one of {', '.join(fm.SCALE_TYPES)}, got {stype!r}")
    if stype == "ue4m3" and etype != "e2m1":
        raise ValueError(f"block_quantize: ue4m3 scales follow the NVFP4 recipe, whose elements are e2m1 (got {etype})")
    x = real_array(x, "block_quantize", "x").astype(jnp.float32)
    if not is_integer_value(block) or block < 1 or x.ndim < 1 or x.shape[-1] % block:
        raise ValueError(f"block_quantize: block must be a positive integer dividing the last axis "
                         f"({x.shape[-1] if x.ndim else 'a scalar has none'}), got {block!r}")
    *lead, K = x.shape
    xb = x.reshape(*lead, K // block, block)
    amax = jnp.max(jnp.abs(xb), axis=-1)
    bad = jnp.any(jnp.isnan(xb), axis=-1)
    top = jnp.float32(_MAXVAL[etype])
    if stype == "ue8m0":
        finite = jnp.isfinite(amax) & (amax > 0)
        e = jnp.where(finite, _floor_log2(jnp.where(finite, amax, 1.0)) - EMAX[etype], -127)
        e = jnp.where(jnp.isinf(amax), 127, jnp.clip(e, -127, 127))
        codes = jnp.where(bad, 0xFF, e + 127).astype(jnp.uint32)
        scales = jnp.where(bad, jnp.nan, _scale_by_pow2(jnp.float32(1), e))
        y = _scale_by_pow2(xb, -e[..., None])
        tensor = jnp.float32(1)
    else:  # NVFP4
        t = jnp.max(jnp.abs(jnp.where(jnp.isnan(x), 0, x)))
        tensor = jnp.where(jnp.isfinite(t) & (t > 0), rounding.divide(6 * 448, t), jnp.float32(1))
        s_codes = quantize_codes(jnp.minimum(rounding.divide(amax, 6) * tensor, 448), "e4m3")  # RNE, saturating
        s = code_values(s_codes, "e4m3")
        codes = jnp.where(bad, 0x7F, s_codes).astype(jnp.uint32)
        scales = jnp.where(bad, jnp.nan, s)
        y = jnp.where(s[..., None] > 0, xb * rounding.divide(tensor, jnp.where(s > 0, s, 1))[..., None], 0)
    y = jnp.clip(jnp.where(jnp.isnan(y), 0, y), -top, top)
    element_codes = quantize_codes(y, etype).reshape(x.shape)
    return BlockQuantized(code_values(element_codes, etype), scales, element_codes, codes, tensor)
