"""The GEMM's epilogue: what happens to the accumulator D after the mainloop and the reduction.
Today: D widened exactly to float32 (f16 accumulators), and the NVFP4 per-tensor scales applied
to the float32 result as NVIDIA's recipe does (``D * (1 / s_a * 1 / s_b)``, the reciprocals
correctly rounded).

    >>> import jax.numpy as jnp
    >>> from tcemu._src.gemm.epilogue import tensor_scaled
    >>> float(tensor_scaled(jnp.float32(12.0), jnp.float32(2.0), jnp.float32(3.0))[()])
    2.0
"""
from __future__ import annotations

from tcemu._src.numerics import rounding
from tcemu._src.quant.elements import widen


def to_float32(d_bits, fmt):
    """D bits of the accumulator format ``fmt`` -> float32 values."""
    return widen(d_bits, fmt)


def tensor_scaled(out, scale_a, scale_b):
    """``out`` times the reciprocals of two per-tensor encode scales (NVFP4)."""
    return out * (rounding.divide(1, scale_a) * rounding.divide(1, scale_b))
