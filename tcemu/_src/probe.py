"""Feature detection: find a tensor core's accumulation parameters by treating an MMA as a black box.

The tests follow Fasi, Higham, Mikaitis & Pranesh (PeerJ CS 2021) and the "generalized numerical
feature tests" of Khattak & Mikaitis (arXiv 2512.07004): single dot products ``c + sum a_k b_k``
whose inputs are chosen so that each feature changes the result. Everything is measured through
``tcemu.mma`` (chained instructions for long dot products), so the probe runs unchanged on an
architecture preset or on a user's :class:`tcemu.BlockFMA`, and recovers the parameters of either.

    >>> import tcemu
    >>> r = tcemu.probe("V100")
    >>> (r.fraction_bits, r.block_size, r.rounding)
    (23, 4, 'rz')

What is measured (X is a power of two, 2**16, or 2.25 = 1.5 * 1.5 when a carry bit is needed):

* ``fraction_bits`` (F): X - X + 2**-j * X in one block gives 2**-j * X exactly when the tiny
  product survives the alignment to X's exponent (j <= F), and 0 when it is truncated.
* ``accumulator_bits``: 2.25 + 2**-k is exact after a block's rounding when 2**-k is at least an
  ulp of the accumulator: float32 gives 23, Hopper/Ada fp8 13.
* ``block_size`` / ``block_order``: X at k = 0, a small s at k = 1 (kept by the alignment but lost
  when X + s is rounded into the accumulator) and -X at k = p give s when p shares the fused block
  of k = 0 and 0 otherwise; the set of such p is the first block.
* ``rounding``: 2.25 plus 1.25, 1.5 and 1.75 accumulator ulps, both signs, identifies RZ, RNE, RNA,
  RU, RD (quarter ulps need F >= accumulator bits + 1, halves F >= accumulator bits).
* ``normalized_products``: 1.5 * 1.5 - 1.5 * 1.5 + 2**-F keeps the tiny term only when products
  are aligned on their unnormalised exponent.
* ``addend``: C = -X with products X and s: s survives only when C joins the first block.
* ``subnormal_inputs`` / ``subnormal_outputs``.
* ``block_sum``, ``addend_alignment``, ``sum_fraction_bits``, ``split_even_odd``,
  ``product_overflow``: the AMD adders (CDNA2's pairwise sum, CDNA3's two-stage adder and its
  fp8 even/odd split), :mod:`~tcemu._src.probe_amd`.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from tcemu._src.arch import resolve
from tcemu._src.isa.parse import parse
from tcemu._src.probe_amd import amd_expected, amd_features
from tcemu._src.probe_box import Box, probe_instruction
from tcemu._src.studies import DTYPES, check_choice, check_int, default_instruction

__all__ = ["ROUNDINGS", "ProbeResult", "expected", "probe", "probe_instruction"]
_FP6_FP4 = ("e3m2", "e2m3", "e2m1")
_MAX_EXP = 40  # largest j / k tried
ROUNDINGS = ("rz", "rne", "rna", "ru", "rd", "undetermined")


@dataclasses.dataclass(frozen=True)
class ProbeResult:
    """What :func:`probe` measured of ``instruction`` (see the module docstring for how):
    ``fraction_bits`` kept in alignment (``None``: no truncation seen up to 2**-40),
    ``accumulator_bits``, ``block_size`` (products fused with k = 0; ``None``: undetermined) and
    ``block_order`` (those positions when they are not 0..L-1), ``rounding`` of block results,
    ``normalized_products``, where C enters (``addend``: "first" block or "last"; ``None``: not
    measurable), whether subnormal inputs and outputs are kept, and the adder's ``block_sum``
    ("fused", "pairwise" or "exact"), ``addend_alignment`` ("fused": C truncated toward zero with the
    products; "floor"), ``sum_fraction_bits`` (F2 of "floor"), ``split_even_odd`` and
    ``product_overflow`` ("none" or "inf"), as :class:`tcemu.BlockFMA` names them (``None``: not
    measured or not measurable; see :mod:`~tcemu._src.probe_amd`).

    >>> import tcemu
    >>> r = tcemu.probe("V100")
    >>> r.fraction_bits, r.accumulator_bits, r.block_size, r.rounding, r.addend
    (23, 23, 4, 'rz', None)
    >>> r.rows()[1]                                         # (field, description, value)
    (None, 'extra alignment bits (F - 23)', 0)
    """

    instruction: str
    fraction_bits: int | None  # None: no truncation seen up to 2**-40
    accumulator_bits: int | None
    block_size: int | None  # products in the block of k = 0 (None: undetermined)
    block_order: tuple[int, ...] | None  # positions sharing k = 0's block, when not 0..L-1
    rounding: str  # rz, rne, rna, ru, rd, or "undetermined"
    normalized_products: bool | None
    addend: str | None  # "first" or "last"
    subnormal_inputs: bool
    subnormal_outputs: bool
    block_sum: str | None = None  # "fused", "pairwise" or "exact"
    addend_alignment: str | None = None  # "fused" or "floor"
    sum_fraction_bits: int | None = None
    split_even_odd: bool | None = None
    product_overflow: str | None = None  # "none" or "inf"

    def __post_init__(self):
        if not isinstance(self.instruction, str):
            raise TypeError(f"ProbeResult.instruction must be a PTX spelling (str), got {self.instruction!r}")
        for name, lo in (("fraction_bits", 0), ("accumulator_bits", 0), ("block_size", 1), ("sum_fraction_bits", 1)):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, check_int(f"ProbeResult.{name}", getattr(self, name), lo))
        order = self.block_order
        if order is not None:
            if isinstance(order, (str, bytes)) or not hasattr(order, "__iter__"):
                raise TypeError(f"ProbeResult.block_order must be a sequence of positions or None, got {order!r}")
            order = tuple(check_int(f"ProbeResult.block_order[{i}]", k, 0) for i, k in enumerate(order))
            object.__setattr__(self, "block_order", order)
        check_choice("ProbeResult.rounding", self.rounding, ROUNDINGS)
        for name, choices in (("addend", ("first", "last")), ("block_sum", ("fused", "pairwise", "exact")),
                              ("addend_alignment", ("fused", "floor")), ("product_overflow", ("none", "inf"))):
            if getattr(self, name) is not None:
                check_choice(f"ProbeResult.{name}", getattr(self, name), choices)
        for name in ("normalized_products", "subnormal_inputs", "subnormal_outputs", "split_even_odd"):
            v, opt = getattr(self, name), name in ("normalized_products", "split_even_odd")
            if not (isinstance(v, (bool, np.bool_)) or (v is None and opt)):
                raise TypeError(f"ProbeResult.{name} must be a bool{' or None' if opt else ''}"
                                f", got {v!r} ({type(v).__name__})")
            if v is not None:
                object.__setattr__(self, name, bool(v))

    def rows(self):
        """(field or None for a derived row, description, value as shown) for a report."""
        F = self.fraction_bits
        return [("fraction_bits", "fraction bits kept in alignment (F)", F),
                (None, "extra alignment bits (F - 23)", None if F is None else F - 23),
                ("accumulator_bits", "accumulator fraction bits", self.accumulator_bits),
                ("block_size", "fused block size", self.block_size),
                ("block_order", "block order",
                 "consecutive" if self.block_order is None else f"k in {list(self.block_order)} first"),
                ("rounding", "rounding of block results", self.rounding),
                ("normalized_products", "products normalised before alignment", self.normalized_products),
                ("addend", "C enters", "not measurable" if self.addend is None else "with the first block"
                 if self.addend == "first" else "after the products"),
                ("subnormal_inputs", "subnormal inputs kept", self.subnormal_inputs),
                ("subnormal_outputs", "subnormal outputs kept", self.subnormal_outputs),
                ("block_sum", "block summed (fused or pairwise)", self.block_sum),
                ("addend_alignment", "C aligned (fused: truncated, or floor)", self.addend_alignment),
                ("sum_fraction_bits", "fraction bits of floor's sum (F2)", self.sum_fraction_bits),
                ("split_even_odd", "even and odd k summed apart", self.split_even_odd),
                ("product_overflow", "product of 2**128 (none: exact, or inf)", self.product_overflow)]


def probe(arch="H100", fmt: str | None = None, *, instruction=None, model=None, mma=None) -> ProbeResult:
    """Measure the accumulation features of ``instruction`` (default: the format's usual MMA on
    ``arch``; ``fmt`` defaults to f16) under the ``arch`` preset or a user ``model``
    (:class:`tcemu.BlockFMA`).

    ``mma``: any function ``mma(spelling, a, b, c) -> d`` with the value-level signature of
    :func:`tcemu.mma` (typed, batched arrays) to probe instead of the emulator, for example one
    that runs the instruction on a GPU (``experiments/hardware/probe_hw.py``); it must return D as
    a float32 array of shape (batch, M, N). Block-scaled instructions also pass ``scale_a=`` and
    ``scale_b=`` (uint8 codes).

    Block-scaled fp4 (``kind::mxf4``, ``kind::mxf4nvf4``) are measured through their scale factors:
    a group at scale 2**e0 cancelled by C and a product 1/4 in the next scale block at 2**(e0 - j)
    survive while j <= F - 2 (``fraction_bits`` F of the grouped alignment, 35 in [MS25]); X in
    the first scale block, a small s in the second and -X in a later one tell the fused block in
    units of scale blocks; quarter and half ulps of C = 2**6 brought by scaled products tell the
    rounding. fp6/fp4 elements without such scales cannot form the products the feature tests
    need (a ValueError says so); ``kind::mxf8f6f4`` with fp8 elements runs the usual tests with
    unit scales.

    >>> import tcemu
    >>> r = tcemu.probe("H100", "bf16")
    >>> r.instruction
    'mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32'
    >>> r.fraction_bits, r.block_size, r.rounding, r.subnormal_inputs
    (25, 16, 'rz', True)
    >>> r.fraction_bits == tcemu.numerics("H100").bf16.fraction_bits    # the preset, recovered
    True
    """
    box, sp = _probe_box(arch, fmt, instruction, model, mma)
    if box.ins.family == "mxf4" and box.ins.scale_vec >= 2:
        return _probe_grouped(box, sp)
    if set(box.fmts) & set(_FP6_FP4):
        raise ValueError(f"{sp!r}: probe's feature tests need products spanning 2**40, which fp6/fp4 inputs "
                         "cannot form without block scales; block-scaled fp4 (kind::mxf4, kind::mxf4nvf4) is "
                         "probed through its scale factors")
    e1 = 14 if any(f.startswith("e4m3") for f in box.fmts) else 16  # X = 2**e1, a product of two normal numbers
    F, q = _fraction_bits(box, e1)
    Fe = F if F is not None else _MAX_EXP
    # the carry form: W = 1.5 * 1.5 * 2**S (significand 2.25, unnormalised exponent S)
    S = e1 - 2
    c15 = box.value(1.5 * 2.0 ** (S // 2))
    normalized, acc_bits, subnormal_inputs, subnormal_outputs = _accumulator(box, S, c15, Fe, q)
    addend = _addend(box, e1, Fe, acc_bits)
    L, order = _block(box, S, c15, F, Fe - (1 if normalized else 0), acc_bits)
    rounding = _rounding(box, S, c15, Fe - (1 if normalized else 0), acc_bits)
    j = min(_MAX_EXP, e1 - 2 * box.min_sub - 2)  # the widest gap 2**-j below X = 2**e1 the inputs form
    amd = amd_features(box, e1, j, F, addend, rounding, list(order) if order else list(range(L or 2)))
    pairwise_block = amd.pop("pairwise_block")
    if amd["block_sum"] in ("pairwise", "exact"):  # the block test above sees no fused block
        L, order = pairwise_block, None
    return ProbeResult(sp, F, acc_bits, L, order, rounding, normalized, addend, subnormal_inputs, subnormal_outputs,
                       **amd)


def _probe_box(arch, fmt, instruction, model, mma) -> tuple[Box, str]:
    """The arguments of :func:`probe` checked, and the box it measures with its instruction."""
    from tcemu._src.numerics.presets import check_model

    arch = resolve(arch)
    if fmt is not None:
        check_choice("fmt", fmt, tuple(DTYPES))
    check_model(model, "probe")
    if mma is not None:
        if not callable(mma):
            raise TypeError(f"mma must be a function mma(spelling, a, b, c) -> d or None, got {mma!r}")
        if model is not None:
            raise ValueError("probe takes model= (probe the emulator with that model) or mma= (probe your "
                             "function), not both")
    if instruction is not None and not isinstance(instruction, str):
        raise TypeError(f"instruction must be an MMA spelling (str) or None, got {instruction!r}")
    sp = default_instruction(arch, fmt or "f16") if instruction is None else instruction
    box = Box(sp, arch, model, mma)
    if fmt is not None and box.ins.atype != fmt:
        raise ValueError(f"fmt={fmt!r} disagrees with the instruction: {sp!r} takes {box.ins.atype} inputs")
    return box, sp


def _fraction_bits(box: Box, e1: int):
    """F: X, -X and a tiny product 2**-j X in one block (X = 2**e1). The block is unknown, so the
    smallest j_max over placements of the tiny term (a placement in another block truncates
    nothing). Returns (F or None, the placement that set it)."""
    X = box.pair(e1)
    js = [j for j in range(1, _MAX_EXP + 1) if e1 - j >= 2 * box.min_sub + 2]
    places = (2, 3, 4)
    cases = [({0: X, 1: (-X[0], X[1]), q: box.pair(e1 - j)}, 0.0) for q in places for j in js]
    res = box.run(cases).reshape(len(places), len(js))
    kept = res == np.array([2.0 ** (e1 - j) for j in js])[None]
    j_max = [max([j for j, k in zip(js, row) if k], default=0) for row in kept]
    F = min(j_max)
    return (None if F == js[-1] else F), places[int(np.argmin(j_max))]


def _accumulator(box: Box, S: int, c15: float, Fe: int, q: int):
    """One batch: normalisation (1.5*1.5 - 1.5*1.5 + 2**-F at positions 0, 1 and ``q``), the
    accumulator's fraction bits (W + 2**-k W after one block) and subnormal inputs and outputs.
    Returns (normalized, accumulator bits or None, subnormal_inputs, subnormal_outputs)."""
    W = 2.25 * 2.0 ** S
    norm_case = ({0: (c15, c15), 1: (-c15, c15), q: box.pair(S - Fe)}, 0.0)
    ks = list(range(1, min(Fe, _MAX_EXP) + 1))
    acc_cases = [({0: (c15, c15), 1: box.pair(S - k)}, 0.0) for k in ks]
    sub_in = ({0: (box.value(2.0 ** box.min_sub), box.value(1.0))}, 0.0)
    sub_out = ({0: (0.0, 0.0)}, float(np.float32(2.0 ** -130)))  # subnormal in f32 and e8m13
    r = box.run([norm_case] + acc_cases + [sub_in, sub_out])
    acc_ok = [k for k, v in zip(ks, r[1:1 + len(ks)]) if v == W + 2.0 ** (S - k)]
    acc_bits = max(acc_ok) + 1 if acc_ok and max(acc_ok) < min(Fe, _MAX_EXP) else None
    return bool(r[0] == 0.0), acc_bits, bool(r[-2] == 2.0 ** box.min_sub), bool(r[-1] == 2.0 ** -130)


def _addend(box: Box, e1: int, Fe: int, acc_bits: int | None) -> str | None:
    """C = -X with products X and s = 2**-(acc+1) * X: s is kept only if C joins the first block
    (alignment keeps it when acc + 1 <= F; rounding X + s into the accumulator loses it)."""
    if acc_bits is None or acc_bits + 1 > Fe:
        return None
    X = box.pair(e1)
    t = box.run([({0: X, 1: box.pair(e1 - acc_bits - 1)}, -float(np.float32(X[0] * X[1])))])[0]
    return "first" if t == 2.0 ** (e1 - acc_bits - 1) else "last" if t == 0.0 else None


def _block(box: Box, S: int, c15: float, F: int | None, Fn: int, acc_bits: int | None):
    """Block size and order: X (carry form 2.25 * 2**S) at 0, s at 1, -X at p give s when p shares
    the fused block of k = 0 (``Fn``: F less one when products are normalised). Returns
    (L, order), None where undetermined or consecutive."""
    if acc_bits is None:
        return None, None
    jb = min(Fn, acc_bits + 1)  # s = 2**-jb: kept by alignment, lost in X + s rounding
    if jb < acc_bits:
        return None, None
    K_total = 4 * box.ins.k
    cases = [({0: (c15, c15), 1: box.pair(S - jb), p: (-c15, c15)}, 0.0) for p in range(2, K_total)]
    same = box.run(cases) == 2.0 ** (S - jb)
    first = [0, 1] + [p for p, v in zip(range(2, K_total), same) if v]
    if first == [0, 1] and F is None:
        return None, None  # blocks of at most 2, or a correctly rounded FMA chain: not told apart here
    if first == list(range(len(first))):
        return len(first), None
    return len(first), tuple(first)


def _rounding(box: Box, S: int, c15: float, Fn: int, acc_bits: int | None) -> str:
    """Rounding of block results: 2.25 plus 1.25, 1.5 and 1.75 accumulator ulps (or 1.5 alone when
    ``Fn``, F less one when products are normalised, leaves no room for quarters), both signs;
    RNE and RNA apart by a tie at an even ulp."""
    if acc_bits is None or Fn < acc_bits:
        return "undetermined"
    W = 2.25 * 2.0 ** S
    ulp = 2.0 ** (S + 1 - acc_bits)
    quarters = Fn >= acc_bits + 1
    fracs = (1.25, 1.5, 1.75) if quarters else (1.5,)
    cases = []
    for sign in (1.0, -1.0):
        for f in fracs:
            parts = {0: (sign * c15, c15)}
            rem, pos = f * ulp, 1
            while rem > 0:  # f * ulp as a sum of powers of two, each a product
                e = int(np.floor(np.log2(rem)))
                x, y = box.pair(e)
                parts[pos] = (sign * x, y)
                rem -= 2.0 ** e
                pos += 1
            cases.append((parts, 0.0))
    ulps = np.round((np.abs(box.run(cases)) - W) / ulp).astype(int).reshape(2, len(fracs))
    table = {  # (positive, negative) ulps above 2.25 in magnitude for 1.25, 1.5, 1.75 (or 1.5)
        "rz": ((1, 1, 1), (1, 1, 1)), "rne": ((1, 2, 2), (1, 2, 2)), "rna": ((1, 2, 2), (1, 2, 2)),
        "ru": ((2, 2, 2), (1, 1, 1)), "rd": ((1, 1, 1), (2, 2, 2))}
    sel = slice(None) if quarters else slice(1, 2)
    rounding = next((name for name, (pos, neg) in table.items()
                     if tuple(ulps[0]) == pos[sel] and tuple(ulps[1]) == neg[sel]), "undetermined")
    if rounding in ("rne", "rna"):  # a tie at an even accumulator ulp: 2.25 + 0.5 ulp
        t = box.run([({0: (c15, c15), 1: box.pair(S - acc_bits)}, 0.0)])[0]
        rounding = "rne" if t == W else "rna" if t == W + ulp else "undetermined"
    return rounding


def _probe_grouped(box: Box, sp: str) -> ProbeResult:
    """The scale-factor tests of block-scaled fp4 (see :func:`probe`)."""
    ins, blk = box.ins, box.ins.scale_block
    ue8 = ins.stype == "ue8m0"
    lo, hi = (-60, 60) if ue8 else (-9, 8)  # exponents a single scale factor reaches
    one, quarter = (1.0, 1.0), (0.5, 0.5)
    # F: 1 * 2**e0 in block 0, C = -2**e0, 1/4 * 2**(e0 - j) in block 1
    e0 = 2 * hi
    js = [j for j in range(1, _MAX_EXP + 1) if e0 - j >= 2 * lo]
    cases = [({0: one, blk: quarter}, -(2.0 ** e0)) for _ in js]
    scales = [{0: (hi, hi), 1: ((e0 - j) // 2, e0 - j - (e0 - j) // 2)} for j in js]
    kept = box.run(cases, scales) == np.array([2.0 ** (e0 - j - 2) for j in js])
    j_max = max([j for j, k in zip(js, kept) if k], default=0)
    F = None if j_max == js[-1] else j_max + 2
    # accumulator: 2**6 + 2**(6 - k) exact after rounding for k up to its fraction bits
    ks = list(range(1, 25))
    acc = box.run([({0: one}, 2.0 ** 6) for _ in ks], [{0: ((6 - k) // 2, 6 - k - (6 - k) // 2)} for k in ks])
    ok = [k for k, v in zip(ks, acc) if v == 2.0 ** 6 + 2.0 ** (6 - k)]
    acc_bits = max(ok) if ok and max(ok) < ks[-1] else None
    # rounding: 2**6 +- 0.25, 0.5, 0.75 ulps (products 0.5, 1, 1.5 at scale 2**(5 - acc - 1))
    rounding = "undetermined"
    if acc_bits is not None and F is not None and F >= acc_bits + 3:
        e = 6 - acc_bits - 1
        sc = {0: (e // 2, e - e // 2)}
        cases = [({0: (sign * x, 1.0)}, sign * 2.0 ** 6) for sign in (1.0, -1.0) for x in (0.5, 1.0, 1.5)]
        got = box.run(cases, [sc] * len(cases))
        ulps = tuple(np.round((np.abs(got) - 2.0 ** 6) / 2.0 ** (6 - acc_bits)).astype(int))
        table = {"rz": (0, 0, 0, 0, 0, 0), "rne": (0, 0, 1, 0, 0, 1), "rna": (0, 1, 1, 0, 1, 1),
                 "ru": (1, 1, 1, 0, 0, 0), "rd": (0, 0, 0, 1, 1, 1)}
        rounding = next((name for name, t in table.items() if t == ulps), "undetermined")
    # fused block, in scale blocks: 2**e0 in block 0, s = 2**(e0 - 25) in block 1 (kept by the
    # alignment, lost when rounded into the binary32 accumulator), -2**e0 in block p
    L = None
    nblk = ins.k // blk
    if F is not None and F >= 27 and acc_bits is not None and acc_bits < 25 and nblk > 2:
        e1 = e0 - 27
        cases = [({0: one, blk: quarter, p * blk: (-1.0, 1.0)}, 0.0) for p in range(2, nblk)]
        scales = [{0: (hi, hi), 1: (e1 // 2, e1 - e1 // 2), p: (hi, hi)} for p in range(2, nblk)]
        same = box.run(cases, scales) == 2.0 ** (e1 - 2)
        fused = [p for p, v in zip(range(2, nblk), same) if v]
        L = blk * (max(fused) + 1) if fused == list(range(2, 2 + len(fused))) and fused else None
    r = box.run([({0: (0.5, 1.0)}, 0.0), ({0: (0.0, 0.0)}, float(np.float32(2.0 ** -130)))])
    return ProbeResult(sp, F, acc_bits, L, None, rounding, None, None, bool(r[0] == 0.5), bool(r[1] == 2.0 ** -130))


def expected(model, instruction: str, arch=None) -> dict:
    """What :func:`probe` should find for a :class:`tcemu.BlockFMA` on an instruction (an AMD MFMA
    is parsed for ``arch``)."""
    ins = probe_instruction(instruction, arch) if instruction.startswith("v_mfma") else parse(instruction)
    if model.scale_group is not None:  # through the scales: what _probe_grouped can tell
        blk, L = ins.scale_block, min(model.block_size, ins.k)
        F = model.fraction_bits
        return {"fraction_bits": F, "accumulator_bits": model.accumulator_fraction_bits,
                "block_size": L if ins.k // blk > 2 and L >= 3 * blk and F >= 27 else None, "block_order": None,
                "rounding": model.rounding if F >= model.accumulator_fraction_bits + 3 else "undetermined",
                "normalized_products": None, "addend": None,
                "subnormal_inputs": model.subnormal_inputs, "subnormal_outputs": model.subnormal_outputs,
                **dict.fromkeys(("block_sum", "addend_alignment", "sum_fraction_bits", "split_even_odd",
                                 "product_overflow"))}
    L = min(model.block_size, ins.k) if model.block_order is None else model.block_size
    order = None
    if model.block_order is not None:
        blk = [k for k in model.block_order if k < ins.k][:model.block_size]
        order = tuple(sorted(blk)) if sorted(blk) != list(range(len(blk))) else None
    want = {"fraction_bits": model.fraction_bits, "accumulator_bits": model.accumulator_fraction_bits,
            "block_size": L, "block_order": order, "rounding": model.rounding,
            "normalized_products": model.normalize_products, "addend": model.addend,
            "subnormal_inputs": model.subnormal_inputs, "subnormal_outputs": model.subnormal_outputs,
            **amd_expected(model, ins)}
    if model.block_sum == "pairwise":  # no truncation; the block sum is rounded before C joins it
        want.update(fraction_bits=None, addend="last")
    if model.block_sum == "exact":  # no truncation; C joins the block's exact sum
        want.update(fraction_bits=None, addend="first")
    return want
