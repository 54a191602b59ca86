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

from tcemu._src.numerics.rounding import ROUNDING_MODES

MAX_FRACTION_BITS = 28


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
      min_exponent: lower bound of the alignment exponent, or ``None``.
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

    def __post_init__(self):
        if not 1 <= self.fraction_bits <= MAX_FRACTION_BITS:
            raise ValueError(f"fraction_bits must be in 1..{MAX_FRACTION_BITS}, got {self.fraction_bits}")
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        for name in ("rounding", "f16_rounding"):
            if getattr(self, name) not in ROUNDING_MODES:
                raise ValueError(f"{name} must be one of {ROUNDING_MODES}, got {getattr(self, name)!r}")
        if not 1 <= self.accumulator_fraction_bits <= 23:
            raise ValueError("accumulator_fraction_bits must be in 1..23")
        if self.overflow not in ("inf", "ieee"):
            raise ValueError(f"overflow must be 'inf' or 'ieee', got {self.overflow!r}")
        if self.block_order is not None and sorted(self.block_order) != list(range(len(self.block_order))):
            raise ValueError("block_order must be a permutation of range(P)")
        if self.addend not in ("first", "last"):
            raise ValueError(f"addend must be 'first' or 'last', got {self.addend!r}")
        if self.addend_rounding not in ROUNDING_MODES:
            raise ValueError(f"addend_rounding must be one of {ROUNDING_MODES}")
        if self.f16_accumulation not in ("native", "f32"):
            raise ValueError(f"f16_accumulation must be 'native' or 'f32', got {self.f16_accumulation!r}")
        if self.tf32_conversion not in ("truncate", "rna"):
            raise ValueError(f"tf32_conversion must be 'truncate' or 'rna', got {self.tf32_conversion!r}")

    @property
    def stochastic(self) -> bool:
        return "stochastic" in (self.rounding, self.f16_rounding, self.addend_rounding)

    def replace(self, **changes) -> "BlockFMA":
        return dataclasses.replace(self, **changes)
