"""The GEMM's configuration: which instruction's numerics, which K schedule, how inputs are
quantised, and the backward GEMMs' own configurations. Frozen and validated on construction.

    >>> import tcemu
    >>> cfg = tcemu.GemmConfig(arch="H100", instruction="m16n8k16.f32.bf16.bf16.f32", k_order="split_k")
    >>> cfg.k_schedule.describe()
    'one instruction per k-tile, residue last, 4 slices, sequential reduction of f32 partials'
"""
from __future__ import annotations

import dataclasses
import functools

import jax

from tcemu._src.arch import resolve
from tcemu._src.gemm.epilogue import Epilogue
from tcemu._src.gemm.schedule import KSchedule
from tcemu._src.isa.parse import Mma, parse
from tcemu._src.isa.mfma import parse_mfma
from tcemu._src.isa.targets import check_arch
from tcemu._src.numerics import mma as mma_numerics
from tcemu._src.numerics.model import BlockFMA, choice_field, int_field, replace_fields
from tcemu._src.numerics.presets import check_model
from tcemu._src.quant.elements import MODES as QUANTIZE_MODES

K_ORDERS = ("sequential", "split_k", "promotion", "pairwise")


@jax.tree_util.register_static  # a static argument of jit / vmap, hashed into the cache key
@dataclasses.dataclass(frozen=True)
class GemmConfig:
    """How an emulated GEMM computes (hashable; pass as ``config=``).

    Attributes:
      arch: architecture whose numerics preset is used ("H100", "sm_80", ...).
      instruction: the MMA instruction: a full PTX spelling (wmma/mma.sync/wgmma) or the mma.sync
        short form "m16n8k16.f32.bf16.bf16.f32" (shape.dtype.atype.btype.ctype).
      k_order: "sequential", "split_k", "promotion" or "pairwise" (see :mod:`tcemu._src.gemm`).
      split_k: number of K slices for "split_k".
      promotion_interval: K elements accumulated in the tensor core between promotions.
      schedule: a :class:`tcemu.KSchedule` describing the kernel's K schedule completely (k-tile,
        residue, slices, promotion, reduction); when given it replaces ``k_order``,
        ``split_k`` and ``promotion_interval``.
      model: a :class:`tcemu.BlockFMA` or :class:`tcemu.ArchNumerics` replacing the preset's numerics.
      quantize: how inputs are rounded to the instruction's format: "rne" or "stochastic"
        (needs ``key=``).
      grad_lhs, grad_rhs: configs of the backward GEMMs dA = dY B^T and dB = A^T dY; ``None``
        computes them exactly in float32.
      epilogue: a :class:`tcemu.Epilogue`: where the kernel adds ``c`` and ``bias``, in which
        order it applies the input scales, whether the output saturates.

    >>> import tcemu
    >>> tcemu.GemmConfig(arch="A100", instruction="m16n8k8.f32.tf32.tf32.f32").ins.k
    8
    """

    arch: str = "H100"
    instruction: str = "m16n8k16.f32.bf16.bf16.f32"
    k_order: str = "sequential"
    split_k: int = 4
    promotion_interval: int = 128
    schedule: KSchedule | None = None
    model: BlockFMA | None = None
    quantize: str = "rne"
    grad_lhs: "GemmConfig | None" = None
    grad_rhs: "GemmConfig | None" = None
    epilogue: Epilogue = Epilogue()

    def __post_init__(self):
        arch = resolve(self.arch)
        if not isinstance(self.instruction, str):
            raise TypeError(f"GemmConfig.instruction must be a PTX spelling or a short form such as "
                            f"'m16n8k16.f32.bf16.bf16.f32' (str), got {self.instruction!r}")
        choice_field(self, "k_order", K_ORDERS)
        choice_field(self, "quantize", QUANTIZE_MODES)
        int_field(self, "split_k", 1, None)
        int_field(self, "promotion_interval", 1, None)
        check_model(self.model, "GemmConfig")
        if self.schedule is not None and not isinstance(self.schedule, KSchedule):
            raise TypeError(f"GemmConfig.schedule must be a tcemu.KSchedule or None, got {self.schedule!r}")
        if not isinstance(self.epilogue, Epilogue):
            raise TypeError(f"GemmConfig.epilogue must be a tcemu.Epilogue, got {self.epilogue!r}")
        for name in ("grad_lhs", "grad_rhs"):
            v = getattr(self, name)
            if v is not None and not isinstance(v, GemmConfig):
                raise TypeError(f"GemmConfig.{name} must be a tcemu.GemmConfig or None (exact float32), got {v!r}")
        self._check_instruction(arch)

    def _check_instruction(self, arch):
        ins = self.ins
        if ins.kind == "mfma" and ins.family == "int":
            raise ValueError(f"{ins.spelling!r}: integer MFMAs are exact (int32 sums that wrap), and GEMM emulation "
                             "is for floating-point instructions (as with NVIDIA's s8 mma); run them with tcemu.mma")
        if ins.kind == "mfma" and ins.family in ("f32", "f64"):
            raise ValueError(f"{ins.spelling!r}: f32/f64 MFMAs are FMA chains; GEMM emulation takes the f16, bf16, "
                             "xf32 and fp8/bf8 MFMAs")
        if ins.family in ("int", "b1", "f64"):
            raise ValueError(f"{ins.spelling!r}: GEMM emulation takes floating-point instructions "
                             "(f16, bf16, tf32, e4m3/e5m2, kind::f8f6f4)")
        if ins.scale_vec is not None and self.quantize != "rne":
            raise ValueError(f"{ins.spelling!r}: block-scaled GEMMs quantise with the MX/NVFP4 recipes "
                             "(round to nearest even); quantize='stochastic' is not available for them")
        if ins.ctype != ins.dtype:
            raise ValueError(f"{ins.spelling!r}: chaining needs C and D of the same type")
        if self.schedule is None and self.promotion_interval % ins.k:
            raise ValueError(f"promotion_interval={self.promotion_interval} must be a multiple of the "
                             f"instruction's k={ins.k}")
        if self.schedule is not None:
            self.schedule.check(ins.k, f"GemmConfig.schedule with {ins.spelling!r}")
        check_arch(ins, arch)
        mma_numerics.resolve_model(ins, self.model, arch)  # the preset or model= has numerics for it
        self._check_block_scales(ins)

    def _check_block_scales(self, ins):
        blk = self.epilogue.scale_block
        if not blk:
            return
        where = f"GemmConfig: Epilogue(scale_block={blk})"
        if ins.scale_vec is not None:
            raise ValueError(f"{where}: {ins.spelling!r} has block scales of its own (MX/NVFP4); block scales along "
                             "K are for instructions without them (fp8 wgmma/mma)")
        if self.grad_lhs is not None or self.grad_rhs is not None:
            raise ValueError(f"{where}: the backward GEMMs of a GEMM with block scales along K are the exact float32 "
                             "ones of the scaled inputs; give grad_lhs=None and grad_rhs=None")
        p = self.k_schedule.promotion
        if not p or blk % p:
            raise ValueError(f"{where}: needs a K schedule whose promotion groups divide the block (promotion={p}): "
                             f"k_order='promotion' with promotion_interval={blk}, or schedule=KSchedule(promotion={blk})")

    @property
    def ins(self) -> Mma:
        """The parsed instruction (an AMD ``v_mfma_...`` is parsed for ``arch``)."""
        if self.instruction.strip().startswith("v_mfma"):
            return _mfma(self.instruction, resolve(self.arch).name)
        return instruction(self.instruction)

    @property
    def k_schedule(self) -> KSchedule:
        """The K schedule this config runs: ``schedule``, or the one ``k_order`` names."""
        if self.schedule is not None:
            return self.schedule
        return {"sequential": KSchedule(), "split_k": KSchedule(slices=self.split_k),
                "promotion": KSchedule(promotion=self.promotion_interval),
                "pairwise": KSchedule(slices=0, reduction="pairwise")}[self.k_order]

    @property
    def numerics(self) -> BlockFMA:
        """The :class:`tcemu.BlockFMA` the instructions compute with (``model`` or the preset's)."""
        return mma_numerics.resolve_model(self.ins, self.model, resolve(self.arch))

    def replace(self, **changes) -> "GemmConfig":
        """A copy with ``changes`` applied (validated)."""
        return replace_fields(self, changes)


def as_config(config, changes: dict, where: str) -> GemmConfig:
    """``config`` (a GemmConfig, default ``GemmConfig()``) with ``changes`` applied."""
    if config is not None and not isinstance(config, GemmConfig):
        raise TypeError(f"{where}: config must be a tcemu.GemmConfig or None, got {type(config).__name__}; "
                        "build one with tcemu.GemmConfig(arch=..., instruction=..., ...)")
    cfg = config if config is not None else GemmConfig()
    return cfg.replace(**changes) if changes else cfg


@functools.lru_cache(maxsize=None)
def _mfma(spelling: str, arch: str):
    try:
        return parse_mfma(spelling, arch)
    except ValueError as e:
        raise ValueError(f"GemmConfig.instruction {spelling!r}: {e}") from None


@functools.lru_cache(maxsize=None)
def instruction(spelling: str) -> Mma:
    """The MMA a config names: a PTX spelling, or the mma.sync short form."""
    s = spelling.strip()
    if not s.startswith(("wmma.", "mma.", "wgmma.")):
        parts = s.split(".")
        if len(parts) != 5:
            raise ValueError(f"instruction {spelling!r}: give a PTX spelling or shape.dtype.atype.btype.ctype, "
                             "e.g. 'm16n8k16.f32.bf16.bf16.f32'")
        s = f"mma.sync.aligned.{parts[0]}.row.col.{'.'.join(parts[1:])}"
    try:
        ins = parse(s)
    except ValueError as e:
        raise ValueError(f"instruction {spelling!r}: {e}") from None
    if not isinstance(ins, Mma):
        raise ValueError(f"instruction {spelling!r} is not an MMA")
    return ins
