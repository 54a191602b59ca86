"""Configuration of the fused block multiply-add engine.

Tensor cores compute ``d = c + sum_k a_k * b_k`` in blocks of ``block_size`` products: within a
block every product is exact, the products and the addend are aligned to the largest exponent and
truncated to ``fraction_bits`` bits below it, summed exactly, normalised once and rounded into the
accumulator; the rounded value is the addend of the next block (Fasi et al., PeerJ CS 2021;
Khattak & Mikaitis, arXiv 2512.07004; Xie et al. "MMA-Sim", arXiv 2511.10909).

Example: a correctly rounded fp32 FMA chain (one product per block, three guard bits and a sticky
bit, round to nearest even)::

    >>> import tcemu
    >>> fma = tcemu.BlockFMA(fraction_bits=26, block_size=1, rounding="rne", sticky=True)
"""
from __future__ import annotations

import dataclasses

import jax
import numpy as np

from tcemu._src.numerics.rounding import ROUNDING_MODES

MAX_FRACTION_BITS = 28
MAX_GROUPED_FRACTION_BITS = 35  # with scale_group: the wide (two-word) sum of group_sums
# bound of |zero_exponent| and |min_exponent|: past every term (products of float32-range values
# lie within 2**-298 .. 2**256)
MAX_EXPONENT = 512
BLOCK_SUMS = ("fused", "separate", "pairwise", "exact")
MAX_EXACT_BLOCK = 16  # block_sum="exact": products per block (its limbs must keep 26 bits)


@jax.tree_util.register_static  # a static argument of jit / vmap, hashed into the cache key
@dataclasses.dataclass(frozen=True)
class BlockFMA:
    """A fused block-FMA (multi-term adder) model. All fields are static (hashable, jit-safe).

    Attributes:
      fraction_bits: bits kept below the alignment exponent (the largest term exponent) when the
        products and the addend are aligned; shifted-out bits are truncated toward zero.
        NVIDIA: 23 (Volta), 24 (Turing/Ampere/Ada), 25 (Hopper/Blackwell), 13 (Ada/Hopper fp8).
      block_size: products fused per block; an instruction's K is split into consecutive blocks
        and each block's rounded result is the addend of the next.
      rounding: rounding of each block's sum into a binary32 accumulator: "rz", "rne", "rna",
        "ru", "rd" or "stochastic" (needs a PRNG key).
      f16_rounding: the same for a binary16 accumulator (f16 ``.ctype``/``.dtype``).
      accumulator_fraction_bits: fraction bits of the binary32-range accumulator; 13 models the
        E8M13 accumulator of fp8 MMAs on Ada and Hopper (low 10 bits of the float32 are zero).
      sticky: OR the shifted-out bits of each term into its least significant bit (an adder with
        a sticky bit; with ``fraction_bits >= 26`` and ``block_size=1`` this is an exact FMA).
      normalize_products: align on the exponent of each product normalised to [1, 2) (dropping
        its extra bit) instead of the raw sum of the input exponents.
      zero_exponent: exponent a zero product or addend counts with when looking for the largest
        exponent (MMA-Sim uses -126); ``None`` ignores zero terms.
      min_exponent: lower bound of the alignment exponent, or ``None``. Both in -512..512.
      subnormal_inputs / subnormal_outputs: ``False`` flushes them to zero.
      overflow: "inf" (NVIDIA: infinity even when rounding toward zero) or "ieee".
      tf32_conversion: how float32 operands of tf32 instructions lose their low 13 bits:
        "truncate" (what the tensor core does with a raw float32 register) or "rna"
        (``cvt.rna.tf32.f32`` applied first).
      block_order: order in which an instruction's K products enter the blocks, as a pattern of
        length P applied to every P consecutive k (restricted to k < K when K < P; ``None``:
        natural order). The sm_90/sm_100 lowering of fp8 ``mma.sync`` to two f16 HMMAs uses
        k % 4 in {0, 1} first.
      addend: "first" (C enters the first block) or "last" (the blocks start from +0 and C is
        added afterwards by one separate addition rounded with ``addend_rounding``).
      f16_accumulation: for binary16 C/D, "native" rounds every block into binary16
        (``f16_rounding``); "f32" widens C exactly, accumulates in binary32 and converts the
        result once with cvt.rn.f16.f32 (what emulated instructions compiled to FFMA do).
      block_sum: "fused" (each block is summed together with the running accumulator, as in a
        tensor core) or "separate" (each block is summed and rounded alone, then added to the
        accumulator by one addition rounded with ``addend_rounding``: compiled CUDA-core code
        such as sm_90's ``mma.m8n8k4`` with .f16 C/D, ``(C + fma(a1, b1, a0*b0)) + fma(a3, b3, a2*b2)``)
        or "pairwise" (AMD CDNA2 f16/bf16, [MS25] ``MMA_FTZ_MUL_ADD``: each product rounded to
        binary32, a block of 2 or 4 summed as a tree of RNE binary32 additions and added to the
        accumulator by one more; ``subnormal_inputs=False`` flushes inputs and C to +0,
        ``subnormal_outputs=False`` products and sums to a zero of their sign;
        :mod:`~tcemu._src.numerics.pairwise`) or "exact" (AMD CDNA1 f16/bf16, [MS25]
        ``MMA_E_FDPA``: a block of up to 16 products and the binary32 accumulator summed exactly
        and rounded once, RNE, subnormals kept, an exact zero +0;
        :mod:`~tcemu._src.numerics.exact_sum`).
      exact_zero: sign of a zero result: "+0" (NVIDIA tensor cores return +0 even when every
        addend is -0, [H200] ``tests/data/signed_zeros_sm90.npz``, and when a negative sum rounds
        to zero, [H100] ``tests/data/underflow_sm90.npz``; [MS25] adds +0.0 to every result) or
        "ieee" (IEEE 754: -0 when every addend is -0, for any exact zero under "rd", and for a
        negative sum that rounds to zero; CUDA-core FFMA/FADD).
      scale_group: ``None`` (every product is a term of the block), or G: block-scaled MMAs of
        packed fp4 (``kind::mxf4``/``mxf4nvf4``) sum each G consecutive products exactly, multiply
        the group sum by its block scales and align it by the scales' exponent alone (not its own
        magnitude); a group whose products are all zero, or whose scale is zero, counts with
        ``zero_exponent``. Blackwell: G=16 with 35 fraction bits ([MS25] ``MMA_GST_FDPA``).
        ``fraction_bits`` may then be up to 35.
      addend_alignment: "fused" (C is one more term of the block, aligned and truncated toward
        zero with the products) or "floor" (AMD CDNA3, [MS25] ``MMA_TR_FDPA``/``MMA_GTR_FDPA``, a
        two-stage adder): the block's products alone are aligned to their largest exponent (zero
        products do not count) and truncated toward zero ``fraction_bits`` below it and summed;
        that sum and C (a zero C counts with exponent -126) are then aligned to the larger of
        their exponents by rounding toward -inf, the sum ``sum_fraction_bits + 1`` bits below it
        and C ``fraction_bits`` bits below it, added exactly, normalised, rounded toward -inf to
        ``sum_fraction_bits`` fraction bits and then rounded into binary32 with ``rounding``. An
        exact zero is +0; a nonzero sum that rounds to zero keeps its sign.
      sum_fraction_bits: the ``F2`` of "floor" (1..31; MMA-Sim: 31).
      split_even_odd: with "floor": products of even and odd k are summed apart (each aligned
        to its own largest exponent), then both sums are aligned by rounding toward -inf
        ``fraction_bits`` below the larger, and a C more than ``fraction_bits + 1`` binades below
        the alignment exponent counts as +0 ([MS25] ``MMA_GTR_FDPA``, CDNA3 fp8/bf8).
      product_overflow: "none" or "inf": a product whose normalised exponent is 128 or more is
        an infinity before it is summed (with "floor"; [MS25] ``MMA_TR_FDPA``).

    >>> import jax.numpy as jnp, tcemu
    >>> v100 = tcemu.BlockFMA(fraction_bits=23, block_size=4, rounding="rz")
    >>> v100 == tcemu.numerics("V100").f16
    True
    >>> a = jnp.array([[1.0] + [2.0**-12] * 4], jnp.bfloat16)
    >>> b = jnp.array([[1.0] + [2.0**-13] * 4], jnp.bfloat16).T
    >>> float(tcemu.matmul(a, b, arch="H100", model=v100)[0, 0])   # the 2**-25 products are truncated
    1.0
    """

    fraction_bits: int = 25
    block_size: int = 16
    rounding: str = "rz"
    f16_rounding: str = "rne"
    accumulator_fraction_bits: int = 23
    sticky: bool = False
    normalize_products: bool = False
    zero_exponent: int | None = -126
    min_exponent: int | None = None
    subnormal_inputs: bool = True
    subnormal_outputs: bool = True
    overflow: str = "inf"
    tf32_conversion: str = "truncate"
    block_order: tuple[int, ...] | None = None
    addend: str = "first"
    addend_rounding: str = "rne"
    f16_accumulation: str = "native"
    block_sum: str = "fused"
    exact_zero: str = "+0"
    scale_group: int | None = None
    addend_alignment: str = "fused"
    sum_fraction_bits: int = 31
    split_even_odd: bool = False
    product_overflow: str = "none"

    def __post_init__(self):
        if self.scale_group is not None:
            int_field(self, "scale_group", 1, None, "or None")
        int_field(self, "fraction_bits", 1,
                  MAX_FRACTION_BITS if self.scale_group is None else MAX_GROUPED_FRACTION_BITS,
                  "" if self.scale_group is None else "with scale_group")
        int_field(self, "block_size", 1, None)
        int_field(self, "accumulator_fraction_bits", 1, 23)
        for name in ("rounding", "f16_rounding", "addend_rounding"):
            choice_field(self, name, ROUNDING_MODES)
        for name, choices in (("overflow", ("inf", "ieee")), ("tf32_conversion", ("truncate", "rna")),
                              ("addend", ("first", "last")), ("f16_accumulation", ("native", "f32")),
                              ("block_sum", BLOCK_SUMS), ("exact_zero", ("+0", "ieee")),
                              ("addend_alignment", ("fused", "floor")), ("product_overflow", ("none", "inf"))):
            choice_field(self, name, choices)
        for name in ("sticky", "normalize_products", "subnormal_inputs", "subnormal_outputs", "split_even_odd"):
            v = getattr(self, name)
            if not isinstance(v, (bool, np.bool_)):
                raise TypeError(f"BlockFMA.{name} must be True or False, got {v!r}")
            object.__setattr__(self, name, bool(v))
        for name in ("zero_exponent", "min_exponent"):
            if getattr(self, name) is not None:
                int_field(self, name, -MAX_EXPONENT, MAX_EXPONENT, "or None")
        order = self.block_order
        if order is not None:
            if isinstance(order, (str, bytes)) or not isinstance(order, (tuple, list, np.ndarray)) or any(
                    not _is_int(k) for k in order):
                raise TypeError(f"BlockFMA.block_order must be None or a tuple of ints, got {order!r}")
            order = tuple(int(k) for k in order)
            if not order or sorted(order) != list(range(len(order))):
                raise ValueError(f"BlockFMA.block_order must be a permutation of range(P) (P >= 1), got {order}")
            object.__setattr__(self, "block_order", order)
        int_field(self, "sum_fraction_bits", 1, 31)
        _check_floor(self)

    @property
    def stochastic(self) -> bool:
        return "stochastic" in (self.rounding, self.f16_rounding, self.addend_rounding)

    def replace(self, **changes) -> "BlockFMA":
        return replace_fields(self, changes)


# the fields "floor" (the two-stage adder) does not read, with the values it requires
_FLOOR_DEFAULTS = (("sticky", False), ("normalize_products", False), ("zero_exponent", None), ("min_exponent", None),
                   ("subnormal_inputs", True), ("subnormal_outputs", True), ("accumulator_fraction_bits", 23),
                   ("block_order", None), ("addend", "first"), ("f16_accumulation", "native"), ("block_sum", "fused"),
                   ("exact_zero", "+0"), ("scale_group", None))


_PAIRWISE = (("rounding", "rne"), ("sticky", False), ("normalize_products", False), ("accumulator_fraction_bits", 23),
             ("block_order", None), ("addend", "first"), ("exact_zero", "ieee"), ("scale_group", None),
             ("addend_alignment", "fused"))

_EXACT = (("rounding", "rne"), ("sticky", False), ("normalize_products", False), ("accumulator_fraction_bits", 23),
          ("subnormal_inputs", True), ("subnormal_outputs", True), ("block_order", None), ("addend", "first"),
          ("exact_zero", "+0"), ("scale_group", None), ("addend_alignment", "fused"))


def _check_floor(m: BlockFMA) -> None:
    """The two-stage adder ("floor"), the pairwise and the exact sums run with the defaults of the
    fields they do not read."""
    if m.block_sum == "exact":
        bad = [f"{n}={d!r}" for n, d in _EXACT if getattr(m, n) != d]
        if bad or m.block_size > MAX_EXACT_BLOCK:
            raise ValueError(f"BlockFMA with block_sum='exact' needs block_size 1..{MAX_EXACT_BLOCK} and "
                             f"{', '.join(bad) or 'the fields it has'}; got block_size={m.block_size}")
    if m.block_sum == "pairwise":
        bad = [f"{n}={d!r}" for n, d in _PAIRWISE if getattr(m, n) != d]
        if bad or m.block_size not in (2, 4):
            raise ValueError(f"BlockFMA with block_sum='pairwise' needs block_size 2 or 4 and "
                             f"{', '.join(bad) or 'the fields it has'}; got block_size={m.block_size}")
    if m.addend_alignment != "floor":
        for name, v in (("split_even_odd", m.split_even_odd), ("product_overflow", m.product_overflow)):
            if v not in (False, "none"):
                raise ValueError(f"BlockFMA.{name}={v!r} needs addend_alignment='floor'")
        return
    bad = [f"{n}={d!r}" for n, d in _FLOOR_DEFAULTS if getattr(m, n) != d]
    if bad:
        raise ValueError(f"BlockFMA with addend_alignment='floor' needs {', '.join(bad)}")
    if m.stochastic:
        raise ValueError("BlockFMA with addend_alignment='floor' takes no stochastic rounding")
    if m.fraction_bits > 26:
        raise ValueError(f"BlockFMA.fraction_bits must be in 1..26 with addend_alignment='floor', got {m.fraction_bits}")


def replace_fields(obj, changes: dict):
    """``dataclasses.replace`` that names the valid fields when given an unknown one."""
    fields = [f.name for f in dataclasses.fields(obj)]
    unknown = sorted(set(changes) - set(fields))
    if unknown:
        raise TypeError(f"{type(obj).__name__} has no field {', '.join(unknown)}; fields: {', '.join(fields)}")
    return dataclasses.replace(obj, **changes)


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def int_field(obj, name: str, lo: int, hi: int | None, extra: str = ""):
    """Check that ``obj.name`` is an integer (bools rejected) in ``lo..hi`` and store it as int."""
    v = getattr(obj, name)
    what = f"in {lo}..{hi}" if hi is not None else f">= {lo}"
    what = f"{what} (an integer{' ' + extra if extra else ''})"
    cls = type(obj).__name__
    if not _is_int(v):
        raise TypeError(f"{cls}.{name} must be {what}, got {v!r} ({type(v).__name__})")
    if v < lo or (hi is not None and v > hi):
        raise ValueError(f"{cls}.{name} must be {what}, got {v}")
    object.__setattr__(obj, name, int(v))


def choice_field(obj, name: str, choices):
    """Check that ``obj.name`` is one of the strings ``choices``."""
    v = getattr(obj, name)
    if not isinstance(v, str) or v not in choices:
        err = ValueError if isinstance(v, str) else TypeError
        raise err(f"{type(obj).__name__}.{name} must be one of {', '.join(map(repr, choices))}, got {v!r}")
