"""CDNA1's f16/bf16 MFMA adder (``BlockFMA(block_sum="exact")``; [MS25] ``MMA_E_FDPA``): a block of
``block_size`` products (4 for f16, 2 for bf16) and the binary32 accumulator summed exactly and
rounded once into binary32, to nearest even; subnormal inputs, C and results are kept, an exact
zero is +0 and a nonzero sum that rounds to zero is a zero of its sign; infinite operands give
the infinities (and NaNs: ``inf * 0``, ``inf - inf``) of IEEE arithmetic, NaN as 0x7FFFFFFF.

The exact sum is a long (Kulisch) accumulator of int32 limbs of ``w`` bits, as wide as every
product and C can reach (bf16: products from 2**-266 to 2**256, 19 limbs; f16: 11). Every term
(a product of two significands, or C's, at most 24 bits) lands in two adjacent limbs as two
pieces below ``2**w``, each limb a signed sum of at most ``L + 1`` pieces, so ``w = 31 -
bitlen(L + 1)`` keeps it in an int32. One carry pass makes every limb but the top one a digit in
``[0, 2**w)`` and leaves the sign in the top one; a negative sum is negated digit by digit (the
``+1`` of the two's complement lands on the lowest nonzero digit). The leading nonzero digit and
the one below it (at least ``w + 1 >= 27`` significant bits, kept to at most 46) and a sticky
bit for every bit below go to :func:`~tcemu._src.numerics.rounding.round_pack`. Nothing is lost
before that one rounding, so the result is the correctly rounded exact sum whatever the exponents
and the cancellation. Blocks run in a ``lax.scan`` (XLA would otherwise fuse each into the next).

    >>> import jax.numpy as jnp
    >>> from tcemu._src import formats as fm
    >>> from tcemu._src.numerics import exact_sum, presets
    >>> a = fm.to_bits(jnp.array([[2.0**100, 2.0**-70]], jnp.bfloat16), "bf16")
    >>> b = fm.to_bits(jnp.array([[2.0**20], [2.0**-70]], jnp.bfloat16), "bf16")
    >>> c = fm.to_bits(jnp.full((1, 1), -2.0**120, jnp.float32), "f32")
    >>> d = exact_sum.exact_dot(a, fm.BF16, b, fm.BF16, c, presets.numerics("MI100").bf16)
    >>> float(fm.from_bits(d, "f32")[0, 0]) == 2.0**-140   # C cancels 2**120 exactly: a subnormal is left
    True
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from tcemu._src import formats as fm
from tcemu._src.numerics.model import BlockFMA
from tcemu._src.numerics.rounding import round_pack

_I, _U = jnp.int32, jnp.uint32
_TERM_BITS = 24  # widest significand of a term (C's; products of f16 x f16 have 22)


class _Terms(NamedTuple):
    """Terms split into limb pieces, ``p0 * 2**(base + w*j) + p1 * 2**(base + w*(j+1))`` (signed
    int32, a last axis of terms); ``j`` lies in the static range ``lo..hi``."""

    j: jnp.ndarray
    p0: jnp.ndarray
    p1: jnp.ndarray
    lo: int
    hi: int


def limb_bits(L: int) -> int:
    """Bits per limb for blocks of ``L`` products: ``L + 1`` pieces below ``2**w`` (and a carry)
    sum within an int32.

    >>> limb_bits(4), limb_bits(2)
    (28, 29)
    """
    return 31 - (L + 1).bit_length()


def _layout(afmt: fm.FloatFormat, bfmt: fm.FloatFormat, L: int):
    """(w, base, number of limbs, products' lowest and highest bit-0 exponent): limb 0 starts
    at ``2**base``, the lowest bit any product or C can have, and the top limb holds the sign of
    any sum of ``L`` products and C."""
    w = limb_bits(L)
    assert w >= 26, "block_size <= 30: two limbs hold 27 bits from the leading one"
    pmin = afmt.emin - afmt.fraction_bits + bfmt.emin - bfmt.fraction_bits
    pmax = afmt.emax - afmt.fraction_bits + bfmt.emax - bfmt.fraction_bits
    cmin = fm.F32.emin - fm.F32.fraction_bits
    base = min(pmin, cmin)
    top = max(pmax + afmt.fraction_bits + bfmt.fraction_bits + 2, fm.F32.emax + 1) + (L + 1).bit_length() + 1
    return w, base, -(-(top - base) // w), pmin, pmax


def _split(v, e, neg, base: int, w: int, emin: int, emax: int) -> _Terms:
    """Pieces of the terms ``(-1)**neg * v * 2**e`` (``0 <= v < 2**24``, ``emin <= e <= emax``)."""
    o = e - base
    j = o // w
    r = o - j * w
    p0 = (v & ((1 << (w - r)) - 1)) << r
    p1 = v >> (w - r)
    return _Terms(j, jnp.where(neg, -p0, p0), jnp.where(neg, -p1, p1), (emin - base) // w, (emax - base) // w)


def _limbs(terms, nl: int, shape):
    """Every limb: the signed sum of the pieces that land in it (int32, unnormalised)."""
    out = []
    for k in range(nl):
        acc = jnp.zeros(shape, _I)
        for t in terms:
            for i in range(t.j.shape[-1]):  # the terms one by one (sums over an axis made XLA decode them per limb)
                if t.lo <= k <= t.hi:
                    acc = acc + jnp.where(t.j[..., i] == k, t.p0[..., i], 0)
                if t.lo <= k - 1 <= t.hi:
                    acc = acc + jnp.where(t.j[..., i] == k - 1, t.p1[..., i], 0)
        out.append(acc)
    return out


def _digits(limbs, w: int):
    """Carry pass and sign: (negative, the digits of |sum| in ``[0, 2**w)``, and for each whether
    every digit below it is zero)."""
    R = 1 << w
    n = list(limbs)
    for k in range(len(n) - 1):
        n[k + 1] = n[k + 1] + (n[k] >> w)  # arithmetic shift: floor(n / 2**w)
        n[k] = n[k] & (R - 1)
    neg = n[-1] < 0  # the top limb keeps the sign
    zero_below, z = [], jnp.ones(n[0].shape, bool)
    for x in n:
        zero_below.append(z)
        z = z & (x == 0)
    # -S digit by digit: R - 1 - n_k above the lowest nonzero digit, R - n_k at it, 0 below
    mag = [jnp.where(neg, jnp.where(zb, (-x) & (R - 1), (R - 1) - x), x) for x, zb in zip(n[:-1], zero_below)]
    mag.append(jnp.where(neg, jnp.where(zero_below[-1], -n[-1], -1 - n[-1]), n[-1]))
    return neg, mag, zero_below


def _round(neg, mag, zero_below, base: int, w: int):
    """The binary32 bits nearest (RNE) to ``(-1)**neg * sum(mag[k] * 2**(base + w*k))``."""
    h = jnp.zeros(mag[0].shape, _I)
    for k, x in enumerate(mag):
        h = jnp.where(x != 0, k, h)  # the leading nonzero digit (0 for a zero sum)
    top = low = jnp.zeros_like(h)
    below = jnp.zeros(h.shape, bool)  # a nonzero digit below the two taken
    for k, x in enumerate(mag):
        top = jnp.where(h == k, x, top)
        low = jnp.where(h == k + 1, x, low)
        below = jnp.where(h == k + 1, ~zero_below[k], below)
    # top * 2**w + low: top's l bits and w more; at most 46 kept, the s below go to the sticky bit,
    # which lands at least two bits below the round bit (l + w - s >= 27)
    lead = 32 - jax.lax.clz(top)
    s = jnp.maximum(lead + w - 46, 0)
    hi = (top << (w - 16 - s)) | (low >> (16 + s))
    sticky = below | ((low & ((1 << s) - 1)) != 0)
    lo = ((low >> s) & 0xFFFF) | sticky.astype(_I)
    q = base + w * (h - 1) + s
    return round_pack(neg.astype(_I), hi.astype(_U), lo.astype(_U), q, fm.F32, "rne")


def _specials(a: fm.Decoded, b: fm.Decoded, c: fm.Decoded, bits):
    """NaN/inf where an operand is one: IEEE's sums of the products' infinities and C's."""
    zero_a, zero_b = a.sig == 0, b.sig == 0
    nan = a.is_nan | b.is_nan | (a.is_inf & zero_b) | (zero_a & b.is_inf)
    inf = (a.is_inf | b.is_inf) & ~nan
    neg = (a.sign ^ b.sign) != 0
    pos_inf = jnp.any(inf & ~neg, axis=-1) | (c.is_inf & (c.sign == 0))
    neg_inf = jnp.any(inf & neg, axis=-1) | (c.is_inf & (c.sign != 0))
    is_nan = jnp.any(nan, axis=-1) | c.is_nan | (pos_inf & neg_inf)
    bits = jnp.where(pos_inf | neg_inf, fm.F32.inf_bits(neg_inf), bits)
    return jnp.where(is_nan, _U(fm.F32.canonical_nan), bits)


def _block(a: fm.Decoded, b: fm.Decoded, afmt, bfmt, c_bits, L: int):
    """One block: a (..., M, 1, L), b (..., 1, N, L) decoded; C and D float32 bits (..., M, N)."""
    w, base, nl, pmin, pmax = _layout(afmt, bfmt, L)
    c = fm.decode(c_bits, fm.F32)
    special = a.is_nan | a.is_inf | b.is_nan | b.is_inf
    v = jnp.where(special, 0, a.sig * b.sig)
    e = a.exp + b.exp - (afmt.fraction_bits + bfmt.fraction_bits)
    cmin = fm.F32.emin - fm.F32.fraction_bits
    cv = jnp.where(c.is_nan | c.is_inf, 0, c.sig)
    terms = (_split(v, e, (a.sign ^ b.sign) != 0, base, w, pmin, pmax),
             _split(cv[..., None], c.exp[..., None] - fm.F32.fraction_bits, c.sign[..., None] != 0, base, w, cmin,
                    fm.F32.emax - fm.F32.fraction_bits))
    shape = jnp.broadcast_shapes(v.shape[:-1], cv.shape)
    bits = _round(*_digits(_limbs(terms, nl, shape), w), base, w)
    return _specials(a, b, c, bits)


def exact_dot(a_bits, afmt: fm.FloatFormat, b_bits, bfmt: fm.FloatFormat, c_bits, model: BlockFMA):
    """``d = c + a @ b`` (binary32 C and D bit patterns) in blocks of ``min(block_size, K)``
    products along K, each block and the accumulator summed exactly and rounded once (RNE)."""
    if afmt.fraction_bits + bfmt.fraction_bits + 2 > _TERM_BITS:
        raise ValueError(f"block_sum='exact' takes products of at most {_TERM_BITS} bits; {afmt.name} x {bfmt.name} "
                         f"has {afmt.fraction_bits + bfmt.fraction_bits + 2}")
    a_bits, b_bits = jnp.asarray(a_bits).astype(_U), jnp.asarray(b_bits).astype(_U)
    d = jnp.asarray(c_bits).astype(_U)
    batch = jnp.broadcast_shapes(a_bits.shape[:-2], b_bits.shape[:-2], d.shape[:-2])
    d = jnp.broadcast_to(d, batch + (a_bits.shape[-2], b_bits.shape[-1]))  # the loop's carry keeps its shape
    K = a_bits.shape[-1]
    L = min(model.block_size, K)
    n, tail = divmod(K, L)

    def block(d, ab):  # ab: a (..., M, L'), b (..., L', N) bits
        a = fm.decode(ab[0][..., :, None, :], afmt)  # (..., M, 1, L')
        b = fm.decode(jnp.swapaxes(ab[1], -1, -2)[..., None, :, :], bfmt)  # (..., 1, N, L')
        return _block(a, b, afmt, bfmt, d, ab[0].shape[-1]), None

    if n == 1:
        d = block(d, (a_bits[..., :L], b_bits[..., :L, :]))[0]
    else:  # a loop, so that XLA does not fuse every block into the next (and compiles one)
        sa = jnp.moveaxis(a_bits[..., :n * L].reshape(a_bits.shape[:-1] + (n, L)), -2, 0)
        sb = jnp.moveaxis(b_bits[..., :n * L, :].reshape(b_bits.shape[:-2] + (n, L, b_bits.shape[-1])), -3, 0)
        d = jax.lax.scan(block, d, (sa, sb))[0]
    if tail:
        d = block(d, (a_bits[..., n * L:], b_bits[..., n * L:, :]))[0]
    return d
