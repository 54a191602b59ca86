"""Binary64 fused multiply-add chains (DMMA: ``wmma.mma``/``mma.sync`` ``.f64``) in integer arithmetic.

Each output is ``d = fma(a[K-1], b[K-1], ... fma(a[0], b[0], c))``: one correctly rounded FMA per
k, in the instruction's rounding mode (``.rn``, ``.rz``, ``.rm``, ``.rp``). The exact product and
the addend are placed in a 192-bit window (three uint64 words) with a sticky bit for whatever
falls below it, added, normalised and rounded once.

**Requires** ``jax.config.update("jax_enable_x64", True)``: the words are uint64.

    >>> import jax, jax.numpy as jnp
    >>> jax.config.update("jax_enable_x64", True)
    >>> from tcemu._src.numerics.fma64 import fma_chain
    >>> a = jnp.array([[1.0 + 2.0 ** -52]]); b = jnp.array([[1.0 - 2.0 ** -53]])
    >>> float(fma_chain(a, b, jnp.array([[-1.0]]), "rn")[0, 0]) == 2.0 ** -52 - 2.0 ** -53 - 2.0 ** -105
    True
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from tcemu._src.numerics.words import Words

_U = jnp.uint64
MASK32 = 0xFFFFFFFF
ROUNDINGS = ("rn", "rz", "rm", "rp")


def require_x64(what: str = "f64 MMAs"):
    if not jax.config.jax_enable_x64:
        raise ValueError(f"{what} need 64-bit integers: call jax.config.update('jax_enable_x64', True) "
                         "first (the fp16/bf16/tf32/fp8/integer paths do not need it)")


W = Words(_U)


def _clz64(x):
    return jax.lax.clz(x).astype(jnp.int32)


def _decode(bits):
    u = bits.astype(_U)
    frac = u & _U((1 << 52) - 1)
    e = ((u >> _U(52)) & _U(0x7FF)).astype(jnp.int32)
    sign = (u >> _U(63)).astype(jnp.int32)
    normal = e != 0
    sig = jnp.where(normal, frac | _U(1 << 52), frac)
    exp = jnp.where(normal, e - 1023, -1022)
    nan = (e == 0x7FF) & (frac != 0)
    inf = (e == 0x7FF) & (frac == 0)
    return sign, exp, sig, nan, inf


def _product(ma, mb):
    """The exact 106-bit product of two 53-bit significands as (high, low) words."""
    al, ah = ma & _U(MASK32), ma >> _U(32)
    bl, bh = mb & _U(MASK32), mb >> _U(32)
    ll, mid, hh = al * bl, al * bh + ah * bl, ah * bh
    p0 = ll + (mid << _U(32))
    return hh + (mid >> _U(32)) + (p0 < ll).astype(_U), p0


def _round(R, L, sign, sticky, mode):
    """The 192-bit magnitude ``R`` (units of 2**L, with a sticky tail below) rounded once to
    binary64 in ``mode``, overflow included: (bits, R is nonzero)."""
    r2, r1, r0 = R
    nz = (r2 | r1 | r0) != 0
    pos = jnp.where(r2 != 0, 191 - _clz64(r2), jnp.where(r1 != 0, 127 - _clz64(r1), 63 - _clz64(r0)))
    x = jnp.maximum(L + pos, -1022)
    sh = x - 52 - L  # bit index (in R) of the result's least significant bit
    n = W.shift(R, -sh)[0][2]
    rbit_w, below = W.shift(R, -(sh - 1))  # round bit at bit 0; below: any lower bit set
    rbit = (rbit_w[2] & _U(1)) != 0
    st = below | sticky
    neg = sign != 0
    inexact = rbit | st
    inc = {"rn": rbit & (st | ((n & _U(1)) != 0)), "rz": jnp.zeros_like(rbit),
           "rm": inexact & neg, "rp": inexact & ~neg}[mode]
    n = n + inc.astype(_U)
    carry = (n >> _U(53)) != 0
    n = jnp.where(carry, n >> _U(1), n)
    x = x + carry.astype(jnp.int32)
    normal = (n >> _U(52)) != 0
    biased = jnp.where(normal, x + 1023, 0).astype(_U)
    sbit = neg.astype(_U) << _U(63)
    out = sbit | (biased << _U(52)) | (n & _U((1 << 52) - 1))
    inf_bits = sbit | _U(0x7FF << 52)
    max_bits = sbit | _U(0x7FEFFFFFFFFFFFFF)
    to_inf = {"rn": jnp.ones_like(neg), "rz": jnp.zeros_like(neg), "rm": neg, "rp": ~neg}[mode]
    return jnp.where(nz & (x > 1023), jnp.where(to_inf, inf_bits, max_bits), out), nz


def _fma(a, b, c, mode, nan_order="bca", default_nan=0xFFF8000000000000):
    """One correctly rounded fma on uint64 bit patterns (broadcasting)."""
    sa, ea, ma, na, ia = _decode(a)
    sb, eb, mb, nb, ib = _decode(b)
    sc, ec, mc, nc, ic = _decode(c)
    p1, p0 = _product(ma, mb)
    sp = sa ^ sb
    ep = ea + eb - 104  # exponent of the product's bit 0
    ecl = ec - 52
    pz = (ma == 0) | (mb == 0)
    cz = mc == 0
    # top (exclusive bit position + exponent) of each operand, used to place a 192-bit window
    top_p = jnp.where(pz, -(1 << 20), ep + 128 - jnp.where(p1 != 0, _clz64(p1), 64 + _clz64(p0)))
    top_c = jnp.where(cz, -(1 << 20), ecl + 64 - _clz64(mc))
    top = jnp.maximum(top_p, top_c)
    low = jnp.where(pz, ecl, jnp.where(cz, ep, jnp.minimum(ep, ecl)))
    L = jnp.maximum(low, top - 190)
    zero = jnp.zeros_like(p0)
    P, stp = W.shift((zero, p1, p0), ep - L)
    C, stc = W.shift((zero, zero, mc), ecl - L)
    P = tuple(jnp.where(pz, _U(0), x) for x in P)
    C = tuple(jnp.where(cz, _U(0), x) for x in C)
    stp = stp & ~pz
    stc = stc & ~cz
    same = sp == sc
    R, p_ge, sticky = W.signed_sum(P, stp, C, stc, same)
    sign = jnp.where(same, sp, jnp.where(p_ge, sp, sc))
    out, nz = _round(R, L, sign, sticky, mode)
    # exact zero: IEEE signs (x + -x is +0, or -0 when rounding down; -0 + -0 is -0)
    zsign = jnp.where(sticky, sign, jnp.where(same, sp, 1 if mode == "rm" else 0))
    out = jnp.where(nz | sticky, out, zsign.astype(_U) << _U(63))
    # special values
    p_nan = na | nb | (ia & (mb == 0)) | (ib & (ma == 0))
    p_inf = (ia | ib) & ~p_nan
    nan = p_nan | nc | (p_inf & ic & (sp != sc))
    out = jnp.where(p_inf | ic, jnp.where(p_inf, sp, sc).astype(_U) << _U(63) | _U(0x7FF << 52), out)
    # NaN operands propagate quieted, first in ``nan_order``; invalid operations give the default NaN
    res = jnp.where(nan, _U(default_nan), out)
    ops = {"a": (a, na), "b": (b, nb), "c": (c, nc)}
    for name in reversed(nan_order):
        bits, is_nan = ops[name]
        res = jnp.where(is_nan, bits.astype(_U) | _U(1 << 51), res)
    return res


def fma_chain_bits(a_bits, b_bits, c_bits, rnd: str = "rn", **nan_rule):
    """uint64 bit patterns: a (..., M, K), b (..., K, N), c (..., M, N) -> d (..., M, N)."""
    require_x64()
    if rnd not in ROUNDINGS:
        raise ValueError(f"f64 rounding must be one of {ROUNDINGS}, got {rnd!r}")
    a_bits, b_bits = jnp.asarray(a_bits, _U), jnp.asarray(b_bits, _U)
    d = jnp.broadcast_to(jnp.asarray(c_bits, _U), jnp.broadcast_shapes(a_bits.shape[:-1] + (1,),
                                                                      b_bits.shape[:-2] + (1, b_bits.shape[-1]),
                                                                      jnp.shape(c_bits)))
    # one FMA per k in a scan (an unrolled chain compiles in time linear in K)
    step = lambda d, ab: (_fma(ab[0], ab[1], d, rnd, **nan_rule), None)  # noqa: E731
    xs = (jnp.moveaxis(a_bits, -1, 0)[..., None], jnp.moveaxis(b_bits, -2, 0)[..., None, :])
    return jax.lax.scan(step, d, xs)[0]


def fma_chain(a, b, c, rnd: str = "rn"):
    """Float64 arrays: ``d = fma(a[:, K-1], b[K-1], ... fma(a[:, 0], b[0], c))`` per output."""
    require_x64()
    cast = lambda x: jax.lax.bitcast_convert_type(jnp.asarray(x, jnp.float64), _U)  # noqa: E731
    d = fma_chain_bits(cast(a), cast(b), cast(c), rnd)
    return jax.lax.bitcast_convert_type(d, jnp.float64)
