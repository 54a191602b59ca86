"""CDNA2's f16/bf16 MFMA adder (``BlockFMA(block_sum="pairwise")``; [MS25] ``MMA_FTZ_MUL_ADD``):
every product rounded to binary32, a block of 2 or 4 products summed as a tree of binary32 additions
(pairs, then the two pair sums), and the block sum added to the accumulator, every addition
rounded to nearest even. With ``subnormal_inputs=False`` inputs and C below the smallest normal
(and zeros of either sign) become +0; with ``subnormal_outputs=False`` every product and sum
below 2**-126 becomes a zero of its sign. Integer arithmetic throughout
(:mod:`~tcemu._src.numerics.fp32`).

    >>> import jax.numpy as jnp
    >>> from tcemu._src import formats as fm
    >>> from tcemu._src.numerics import pairwise, presets
    >>> a = fm.to_bits(jnp.array([[2.0**-70, 2.0**-70, 1.0, 0.0]], jnp.bfloat16), "bf16")
    >>> b = fm.to_bits(jnp.array([[2.0**-60], [-2.0**-60], [1.0], [1.0]], jnp.bfloat16), "bf16")
    >>> c = fm.to_bits(jnp.zeros((1, 1), jnp.float32), "f32")
    >>> m = presets.numerics("MI250X").bf16
    >>> float(fm.from_bits(pairwise.pairwise_dot(a, fm.BF16, b, fm.BF16, c, m), "f32")[0, 0])
    1.0
"""
from __future__ import annotations

import jax.numpy as jnp

from tcemu._src import formats as fm
from tcemu._src.numerics import cvt, fp32
from tcemu._src.numerics.model import BlockFMA

_U = jnp.uint32


def _flush(bits, fmt: fm.FloatFormat, keep_sign: bool):
    """Values below ``fmt``'s smallest normal (exponent field 0) -> +0, or a zero of their sign."""
    efield = (bits >> (fmt.fraction_bits + fmt.shift)) & ((1 << fmt.exponent_bits) - 1)
    zero = (bits & _U(fmt.sign_bit)) if keep_sign else _U(0)
    return jnp.where(efield == 0, zero, bits)


def pairwise_dot(a_bits, afmt: fm.FloatFormat, b_bits, bfmt: fm.FloatFormat, c_bits, model: BlockFMA):
    """``d = c + a @ b`` (binary32 C and D bit patterns) in blocks of ``model.block_size`` (2 or 4)."""
    a, b, d = (jnp.asarray(x).astype(_U) for x in (a_bits, b_bits, c_bits))
    if not model.subnormal_inputs:
        a, b, d = _flush(a, afmt, False), _flush(b, bfmt, False), _flush(d, fm.F32, False)
    out = (lambda x: _flush(x, fm.F32, True)) if not model.subnormal_outputs else (lambda x: x)  # noqa: E731
    a32 = cvt.convert(a, afmt, fm.F32)[..., :, None, :]  # (..., M, 1, K): exact widening
    b32 = jnp.swapaxes(cvt.convert(b, bfmt, fm.F32), -1, -2)[..., None, :, :]  # (..., 1, N, K)
    P = model.block_size
    K = a.shape[-1]
    if K % P:
        raise ValueError(f"block_sum='pairwise': block_size={P} must divide K={K}")
    prod = out(fp32.mul(a32, b32))  # (..., M, N, K), every product at once
    s = out(fp32.add(prod[..., 0::P], prod[..., 1::P]))  # every block's first pair
    if P == 4:
        s = out(fp32.add(s, out(fp32.add(prod[..., 2::P], prod[..., 3::P]))))
    for j in range(K // P):  # the accumulator: one block after the other
        d = out(fp32.add(d, s[..., j]))
    return d
