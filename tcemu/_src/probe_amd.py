"""Feature tests of the AMD matrix-core adders, for :func:`tcemu.probe` (fields of
:class:`tcemu.BlockFMA`, found from outputs alone):

* ``block_sum``: "pairwise" (CDNA2: products rounded to binary32, a block summed as a tree of
  binary32 additions, then added to the accumulator), "exact" (CDNA1: a block and C summed
  exactly, rounded once) or "fused"; ``block_size`` of a pairwise or exact sum.
* ``addend_alignment``: C truncated toward zero with the products ("fused") or rounded toward
  -inf at the block's alignment exponent ("floor", CDNA3's two-stage adder).
* ``sum_fraction_bits`` (F2 of "floor"): the stage-two sum is floored to F2 fraction bits before
  its rounding into binary32.
* ``split_even_odd``: products of even and odd k summed apart (CDNA3 fp8), seen through the floor
  that aligns the two sums.
* ``product_overflow``: a product of 2**128 is infinite ("inf") or kept exact ("none").

Every test is one batch of single dot products (:class:`~tcemu._src.probe_box.Box`); X = 2**e1 is a
product of two inputs, u = 2**(e1 - F) the last unit the alignment keeps (F: ``fraction_bits``).

    >>> import tcemu
    >>> r = tcemu.probe("MI300X", "e4m3fnuz")
    >>> r.addend_alignment, r.sum_fraction_bits, r.split_even_odd, r.block_sum
    ('floor', 31, True, 'fused')
"""
from __future__ import annotations

import math

import numpy as np

from tcemu._src.probe_box import Box

__all__ = ["amd_expected", "amd_features"]
_F2_JS = tuple(range(25, 37))  # sum_fraction_bits seen: 25 .. 35
_T = 2.0 ** 24  # C's scale in the sum_fraction_bits test (products 2**0 .. 2**-12: exact in every format)
# sum_fraction_bits per rounding into binary32: (C, a product h or 0, D when t = 2**(24 - j) survives
# the floor to F2 fraction bits, D when it does not); see _sum_fraction_bits
_F2_TESTS = {"rne": (_T, 1.0, _T + 2, _T), "ru": (_T, 0.0, _T + 2, _T),
             "rna": (-_T, -1.0, -_T, -_T - 2), "rz": (-_T - 2, 0.0, -_T, -_T - 2)}


def _neg(pair):
    return (-pair[0], pair[1])


def amd_features(box: Box, e1: int, j: int, F: int | None, addend: str | None, rounding: str,
                 first: list[int]) -> dict:
    """The AMD fields of :class:`~tcemu._src.probe.ProbeResult`, and ``block_size`` of a pairwise
    sum (else None). ``j``: the largest gap 2**-j below X the inputs form (at least 30, more than
    any F); ``F``, ``addend``, ``rounding``: as measured; ``first``: the positions of k = 0's block."""
    s = 2.0 ** (e1 - j)
    # block_sum: s at k = 0, X at 2, -X at 3, C = 0. Pairwise: (s + 0) + (X + -X) = s, the exact
    # pair sum 0 is formed before the accumulator sees X. Fused: s shares a block (and its
    # alignment) with X, or is the accumulator when X joins it: truncated (j > F) or rounded away
    # (2**-j < half an ulp of X): 0. (A fused block of two products, summed apart from the
    # accumulator, "separate", would look pairwise.)
    X, sp = box.pair(e1), box.pair(e1 - j)
    pairwise = box.run([({0: sp, 2: X, 3: _neg(X)}, 0.0)])[0] == s
    out = {"block_sum": "pairwise" if pairwise else "fused", "addend_alignment": None, "sum_fraction_bits": None,
           "split_even_odd": None, "product_overflow": _product_overflow(box), "pairwise_block": None}
    if pairwise:
        # exact or pairwise: X at k = 0, s at k = 1 (one block), C = -X. Exact: X + s - X = s.
        # Pairwise: X + s rounds to X in binary32 before C joins: 0.
        if box.run([({0: X, 1: sp}, -(2.0 ** e1))])[0] == s:
            out["block_sum"] = "exact"
        out["pairwise_block"] = _pairwise_block(box, e1, j)
        return out
    if F is None or len(first) < 2:
        return out
    m = min(max(0, F - 24), 3)
    # C added after the blocks is not aligned with them; the model's split needs "floor"
    out["addend_alignment"] = "fused" if addend == "last" else _alignment(box, e1, F, m, first[:2])
    out["split_even_odd"] = False if out["addend_alignment"] == "fused" else None
    if out["addend_alignment"] == "floor":
        even, odd = [p for p in first if p % 2 == 0], [p for p in first if p % 2]
        if len(even) > min(m, 1) and odd:
            out["split_even_odd"] = _split(box, e1, F, m, even[:2], odd[0])
        out["sum_fraction_bits"] = _sum_fraction_bits(box, rounding)
    return out


def _pairwise_block(box: Box, e1: int, j: int) -> int | None:
    """C = s = 2**(e1 - j), X at k = 0, -X at k = p: a pairwise block sums X and -X to 0 before C
    joins (s), while C + X rounds s away when -X comes in a later block (0). The block is k = 0
    and every such p."""
    X, s = box.pair(e1), 2.0 ** (e1 - j)
    ps = list(range(1, 2 * box.ins.k))
    same = box.run([({0: X, p: _neg(X)}, s) for p in ps]) == s
    first = [0] + [p for p, v in zip(ps, same) if v]
    return len(first) if first == list(range(len(first))) else None


def _cancelled(box: Box, e1: int, m: int, pos: list[int]) -> dict:
    """X at pos[0] and -(1 - 2**-m) X (m <= 3 significant bits) at pos[1]: S = X / 2**m, whose last
    unit u = 2**(e1 - F) kept by the alignment (m = F - 24) is 24 bits below its leading bit, so
    that S - u is exact in binary32 (for F <= 27)."""
    hi, lo = e1 - e1 // 2, e1 // 2
    parts = {pos[0]: box.pair(e1)}
    if m:
        parts[pos[1]] = (-box.value((2 ** m - 1) * 2.0 ** (hi - m)), box.value(2.0 ** lo))
    return parts


def _alignment(box: Box, e1: int, F: int, m: int, pos: list[int]) -> str | None:
    """S (see :func:`_cancelled`) and C = -+2**(e1 - F - 1), half a unit below the alignment's last
    kept bit (still within F + 1 binades of e1, where the fp8 adder keeps C). Truncation toward
    zero drops C either way: S, S. Rounding toward -inf takes -u for the negative C and 0 for
    the positive one: S - u, S."""
    parts = _cancelled(box, e1, m, pos)
    c = 2.0 ** (e1 - F - 1)
    neg, pos_ = box.run([(parts, -c), (parts, c)])
    S = 2.0 ** (e1 - m)
    return "fused" if neg == S == pos_ else "floor" if neg < S == pos_ else None


def _split(box: Box, e1: int, F: int, m: int, even: list[int], odd: int) -> bool | None:
    """S at even k (see :func:`_cancelled`), -t = -2**(e1 - F - 1) at an odd k, C = 0. One sum of
    all products truncates -t toward zero (S); an odd sum alone keeps -t exactly, and aligning it
    to the even sum's exponent by rounding toward -inf gives -u (S - u)."""
    parts = _cancelled(box, e1, m, even)
    parts[odd] = _neg(box.pair(e1 - F - 1))
    r = box.run([(parts, 0.0)])[0]
    S = 2.0 ** (e1 - m)
    return False if r == S else True if r < S else None


def _sum_fraction_bits(box: Box, rounding: str) -> int | None:
    """C near 2**24 (ulp 2), products h and t = 2**(24 - j) (j = 25 .. 36) chosen so that the final
    rounding of C + h + t depends on whether t survives the floor to F2 fraction bits (j <= F2):
    RNE: 2**24 + 1 + t is above the tie (up) or the tie (even, down); RU: 2**24 + t up or exact;
    RNA: -(2**24 + 1 - t) below the tie or, floored to -(2**24 + 1), the tie (away); RZ:
    -(2**24 + 2 - t) toward zero or, floored, -(2**24 + 2). RD after the floor is RD, and F2 <= 24
    leaves the rounding test no quarter ulps (rounding "undetermined"): None."""
    if rounding not in _F2_TESTS:
        return None
    c, h, kept, dropped = _F2_TESTS[rounding]
    r = box.run([({0: (h, 1.0), 1: box.pair(24 - jj)}, c) for jj in _F2_JS])
    up = [jj for jj, v in zip(_F2_JS, r) if v == kept]
    if not up or not set(r) <= {kept, dropped} or up != list(range(_F2_JS[0], up[-1] + 1)) or up[-1] == _F2_JS[-1]:
        return None
    return up[-1]


def _product_overflow(box: Box) -> str | None:
    """Products 2**128 and -2**128 (inputs 2**64: bf16 and tf32 only): kept exact they cancel (0);
    infinite they give NaN."""
    try:
        with np.errstate(over="ignore"):  # 2**64 overflows f16 and fp8: not exact, a ValueError
            big = box.pair(128)
    except ValueError:
        return None
    r = box.run([({0: big, 1: _neg(big)}, 0.0)])[0]
    return "inf" if math.isnan(r) else "none" if r == 0.0 else None


def amd_expected(model, ins) -> dict:
    """What :func:`amd_features` finds for ``model`` on ``ins``, in ProbeResult's fields
    (:func:`tcemu._src.probe.expected` adds them)."""
    wide = all(t in ("bf16", "tf32") for t in (ins.atype, ins.btype))  # inputs reach 2**64
    if model.block_sum == "exact":  # 2**128 - 2**128 is 0
        return {"block_sum": "exact", "addend_alignment": None, "sum_fraction_bits": None,
                "split_even_odd": None, "product_overflow": "none" if wide else None}
    if model.block_sum == "pairwise":  # products rounded to binary32: 2**128 is infinite
        return {"block_sum": "pairwise", "addend_alignment": None, "sum_fraction_bits": None,
                "split_even_odd": None, "product_overflow": "inf" if wide else None}
    floor = model.addend_alignment == "floor"
    return {"block_sum": "fused",
            "addend_alignment": model.addend_alignment if model.addend == "first" else "fused",
            "sum_fraction_bits": model.sum_fraction_bits if floor and model.rounding in _F2_TESTS
            and _F2_JS[0] <= model.sum_fraction_bits < _F2_JS[-1] else None,
            "split_even_odd": model.split_even_odd, "product_overflow": model.product_overflow if wide else None}
