"""Unsigned integers of three words (uint32 or uint64) in JAX: the wide windows in which the
correctly rounded fused multiply-adds (binary32 :func:`~tcemu._src.numerics.fp32.fma`, binary64
:mod:`~tcemu._src.numerics.fma64`) add an exact product and an addend. A value is a tuple
``(w2, w1, w0)``, most significant word first.

    >>> import jax.numpy as jnp
    >>> W = Words(jnp.uint32)
    >>> x = (jnp.uint32(0), jnp.uint32(1), jnp.uint32(0xFFFFFFFF))   # 2**33 - 1
    >>> [hex(int(w)) for w in W.add(x, (jnp.uint32(0), jnp.uint32(0), jnp.uint32(1)))]
    ['0x0', '0x2', '0x0']
    >>> [hex(int(w)) for w in W.shift(x, -1)[0]], bool(W.shift(x, -1)[1])   # right by one: a bit lost
    (['0x0', '0x0', '0xffffffff'], True)
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from tcemu._src.numerics.rounding import word_shifts


class Words:
    """Three-word arithmetic on words of type ``word`` (``jnp.uint32`` or ``jnp.uint64``)."""

    def __init__(self, word):
        self.U, self.bits = word, jnp.iinfo(word).bits
        self.shl, self.shr = word_shifts(word)

    def shift(self, w, s):
        """``w`` shifted left by ``s`` (``s < 0``: right): (words, sticky), sticky being whether a
        set bit fell below bit 0."""
        U, n = self.U, self.bits

        def word(i, k):  # source word i moved by k into a destination word
            return jnp.where(k >= 0, self.shl(w[2 - i], k), self.shr(w[2 - i], -k))

        out = []
        for j in range(3):  # destination word (0: least significant)
            acc = jnp.zeros_like(w[2])
            for i in range(3):  # source word
                k = s + n * (i - j)
                acc = acc | jnp.where((k > -n) & (k < n), word(i, k), U(0))
            out.append(acc)
        sticky = jnp.zeros(jnp.shape(w[2]), bool)
        for i in range(3):
            lost = -(s + n * i)  # low bits of source word i that fall below bit 0
            mask = jnp.where(lost >= n, U(2 ** n - 1), jnp.where(lost <= 0, U(0), self.shl(U(1), lost) - U(1)))
            sticky = sticky | ((w[2 - i] & mask) != 0)
        return (out[2], out[1], out[0]), sticky

    def add(self, x, y):
        """``x + y`` (modulo the three words)."""
        U = self.U
        s0 = x[2] + y[2]
        c0 = (s0 < x[2]).astype(U)
        s1 = x[1] + y[1]
        c1 = (s1 < x[1]).astype(U)
        s1b = s1 + c0
        c1 = c1 + (s1b < s1).astype(U)
        return x[0] + y[0] + c1, s1b, s0

    def sub(self, x, y):
        """``x - y`` for ``x >= y``."""
        U = self.U
        d0 = x[2] - y[2]
        b0 = (x[2] < y[2]).astype(U)
        d1 = x[1] - y[1]
        b1 = (x[1] < y[1]).astype(U)
        d1b = d1 - b0
        b1 = b1 + (d1 < b0).astype(U)
        return x[0] - y[0] - b1, d1b, d0

    def ge(self, x, y):
        """``x >= y``."""
        return (x[0] > y[0]) | ((x[0] == y[0]) & ((x[1] > y[1]) | ((x[1] == y[1]) & (x[2] >= y[2]))))

    def top(self, w):
        """Index of the most significant set bit plus one (0 for zero), int32."""
        n = self.bits
        clz = [jax.lax.clz(x).astype(jnp.int32) for x in w]
        return jnp.where(w[0] != 0, 3 * n - clz[0], jnp.where(w[1] != 0, 2 * n - clz[1], n - clz[2]))

    def signed_sum(self, x, x_sticky, y, y_sticky, same):
        """``x + y`` where ``same``, else ``|x - y|``, of magnitudes of which at most the smaller
        has a sticky tail: (magnitude, whether x >= y, sticky)."""
        ones = (jnp.zeros_like(x[2]), jnp.zeros_like(x[2]), jnp.ones_like(x[2]))
        x_ge = self.ge(x, y)
        big = tuple(jnp.where(x_ge, a, b) for a, b in zip(x, y))
        small = tuple(jnp.where(x_ge, b, a) for a, b in zip(x, y))
        sticky = x_sticky | y_sticky
        diff = self.sub(big, small)
        # big - (small + eps) = (big - small - 1) + (1 - eps): the sticky tail borrows one unit
        diff = tuple(jnp.where(sticky, a, b) for a, b in zip(self.sub(diff, ones), diff))
        return tuple(jnp.where(same, a, b) for a, b in zip(self.add(big, small), diff)), x_ge, sticky
