"""Per-architecture numerics presets: which :class:`BlockFMA` each GPU uses for each instruction.

Every parameter names its source:

* [F21] Fasi, Higham, Mikaitis, Pranesh, "Numerical behavior of NVIDIA tensor cores", PeerJ CS
  7:e330 (2021): V100/T4/A100 feature tests (truncation, no guard digits on V100, one extra bit on
  T4/A100, RZ for fp32 output, RN for fp16 output, block of 4 (V100) / 8 (A100) products + c).
* [KM25] Khattak & Mikaitis, "Accurate Models of NVIDIA Tensor Cores", arXiv 2512.07004, and their
  MATLAB models (north-numerical-computing/MATLAB-tensor-core: ``V100TC.m``, ``A100TC.m``,
  ``AdaTC.m``, ``H100TC.m``, ``B200TC.m``): fused block size ``fma`` and extra alignment bits
  ``neab`` (fraction_bits = 23 + neab) per GPU and input format.
* [MS25] Xie et al., "MMA-Sim", arXiv 2511.10909 (microsoft/MMA-Sim ``nv_ptx/sim.py``): F and
  L_max per architecture; E8M13 (13-bit) accumulation of Ada and Hopper fp8; zero terms count with
  exponent -126 when finding the alignment exponent.
* [H200] tcemu's own captures on an H200 (``tests/data/*_sm90.npz``, ``experiments/hardware``).
* [PV] the published validation vectors of [KM25] (``../shared/peer-vectors``), which every preset
  reproduces bit for bit (``tests/test_peer_vectors.py``).

Example::

    >>> import tcemu
    >>> tcemu.numerics("H100").f16.fraction_bits
    25
"""
from __future__ import annotations

import dataclasses

import jax

from tcemu._src.arch import Arch, resolve
from tcemu._src.numerics.model import BlockFMA

# mma.sync m16n8k32 fp8 on sm_90/sm_100 runs as two f16 HMMAs: the low byte pair of every 32-bit
# operand register (k % 4 in {0, 1}) first, then the high pair; C is added last with one RNE add.
FP8_AS_F16_PAIRS = tuple(k for k in range(32) if k % 4 < 2) + tuple(k for k in range(32) if k % 4 >= 2)


@jax.tree_util.register_static  # a static argument of jit / vmap, hashed into the cache key
@dataclasses.dataclass(frozen=True)
class ArchNumerics:
    """The numerics of one architecture, per input family and instruction kind.

    ``None`` means the architecture has no such MMA. ``fp8_mma`` is ``mma.sync`` with e4m3/e5m2
    inputs, ``fp8_wgmma`` Hopper's ``wgmma``; ``bf16_1k`` AMD CDNA2's ``..bf16_1k`` MFMAs.
    ``f8f6f4``, ``mxf8f6f4`` and ``mxf4`` are the
    Blackwell kinds of ``mma.sync`` (sm_120) and ``tcgen05.mma`` (sm_100): ``.kind::f8f6f4``,
    its block-scaled ``.kind::mxf8f6f4``, and ``.kind::mxf4``/``.kind::mxf4nvf4`` (packed fp4). ``mma_m8n8k4_f16`` is ``mma.m8n8k4`` with f16
    inputs, ``mma_m8n8k4_f16_d`` the same with an f16 D where that is computed differently
    (``None``: as ``mma_m8n8k4_f16``).

    >>> import tcemu
    >>> n = tcemu.numerics("A100")
    >>> n.arch, n.f16.fraction_bits, n.f16.block_size, n.fp8_mma is None
    ('sm_80', 24, 8, True)
    >>> mine = tcemu.ArchNumerics("my GPU", f16=n.f16)      # a model= for tcemu.mma, tcemu.matmul
    >>> mine.bf16 is None
    True
    """

    arch: str
    f16: BlockFMA | None = None
    bf16: BlockFMA | None = None
    tf32: BlockFMA | None = None
    fp8_mma: BlockFMA | None = None
    fp8_wgmma: BlockFMA | None = None
    wgmma_tf32: BlockFMA | None = None
    wmma_tf32: BlockFMA | None = None
    mma_m8n8k4_f16: BlockFMA | None = None
    mma_m8n8k4_f16_d: BlockFMA | None = None
    f8f6f4: BlockFMA | None = None
    mxf8f6f4: BlockFMA | None = None
    mxf4: BlockFMA | None = None
    bf16_1k: BlockFMA | None = None
    notes: str = ""

    def __post_init__(self):
        if not isinstance(self.arch, str):
            raise TypeError(f"ArchNumerics.arch must be a name (str), got {self.arch!r}")
        if not isinstance(self.notes, str):
            raise TypeError(f"ArchNumerics.notes must be a str, got {self.notes!r}")
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name not in ("arch", "notes") and v is not None and not isinstance(v, BlockFMA):
                raise TypeError(f"ArchNumerics.{f.name} must be a tcemu.BlockFMA or None, got {v!r}")

    def for_instruction(self, ins) -> BlockFMA | None:
        """The model of a parsed MMA instruction (``tcemu._src.isa.parse.Mma``)."""
        kind, family = ins.kind, ins.family
        if kind == "mfma" and getattr(ins, "onek", False):  # CDNA2's bf16 _1k MFMAs
            return self.bf16_1k
        if family == "fp8":
            return self.fp8_wgmma if kind == "wgmma" else self.fp8_mma
        if family == "tf32":
            return {"wgmma": self.wgmma_tf32, "wmma": self.wmma_tf32 or self.tf32}.get(kind, self.tf32)
        if kind == "mma" and ins.shape == "m8n8k4" and family == "f16":
            return (self.mma_m8n8k4_f16_d if ins.dtype == "f16" else None) or self.mma_m8n8k4_f16
        return getattr(self, family, None)


# Turing and later run mma.sync.m8n8k4 .f16 (Volta's HMMA.884) as compiled CUDA-core code, IEEE
# signed zeros included. [H200] f32 C/D: a sequential binary32 FMA chain over k = 0..3 from +0,
# then C added with one RNE add. f16 D (SASS and tests/data/signed_zeros_sm90.npz): per pair of k
# fma(a1, b1, a0*b0) and fma(a3, b3, a2*b2), then (C + pair 0) + pair 1 in binary32 (C widened),
# then one cvt.rn.f16.f32.
FFMA_M8N8K4 = BlockFMA(fraction_bits=26, block_size=1, rounding="rne", sticky=True, addend="last",
                       f16_accumulation="f32", exact_zero="ieee")
FFMA_M8N8K4_F16 = BlockFMA(fraction_bits=26, block_size=2, rounding="rne", sticky=True, block_sum="separate",
                           f16_accumulation="f32", exact_zero="ieee")


def _volta(name="sm_70", notes="") -> ArchNumerics:
    m = BlockFMA(fraction_bits=23, block_size=4)  # [F21] no guard digits, 4 + c; [KM25] [MS25] [PV]
    return ArchNumerics(name, f16=m, mma_m8n8k4_f16=m,  # wmma on Volta is HMMA.884 (README, Evidence)
                        notes=notes or "fp16 only; 23 fraction bits kept, blocks of 4 products")


def _turing() -> ArchNumerics:
    return ArchNumerics(
        "sm_75",
        f16=BlockFMA(fraction_bits=24, block_size=8),  # [F21] one extra bit; [MS25] L=8
        notes="fp16 only; from [MS25] (no published vectors for T4)")


def _ampere(name, notes="") -> ArchNumerics:
    m = BlockFMA(fraction_bits=24, block_size=8)  # [F21] [KM25] A100TC.m fma=8 neab=1; [MS25]; [PV]
    return ArchNumerics(name, f16=m, bf16=m,
                        tf32=BlockFMA(fraction_bits=24, block_size=4),  # [KM25] fma=4; [MS25]; [PV]
                        mma_m8n8k4_f16=FFMA_M8N8K4, mma_m8n8k4_f16_d=FFMA_M8N8K4_F16,  # assumed as on sm_90 (no HMMA.884 after Volta)
                        notes=notes)


# The Jetson GPUs have no published tensor-core measurements; their presets are assumed to follow
# the GPU generation NVIDIA builds them from: Jetson AGX Xavier (sm_72) has a 512-core Volta GPU with
# 64 Tensor Cores (NVIDIA Jetson AGX Xavier data sheet), Jetson Orin (sm_87, GA10B) an Ampere GPU
# with third-generation Tensor Cores (NVIDIA Jetson AGX Orin Series Technical Brief). Pass model=
# to use other numerics.
_ASSUMED = "assumed: the numerics of {} ({}), not measured on {}"


def _ada() -> ArchNumerics:
    a = _ampere("sm_89")  # [KM25] [MS25] [PV]: same fp16/bf16/tf32 numerics as Ampere
    # [KM25] AdaTC.m/L40STC.m fp8: fma=16, neab=-10; [MS25] Ada fp8 F=13, RZ-E8M13 output; [PV]
    fp8 = BlockFMA(fraction_bits=13, block_size=16, accumulator_fraction_bits=13)
    return dataclasses.replace(a, fp8_mma=fp8)


def _hopper() -> ArchNumerics:
    m = BlockFMA(fraction_bits=25, block_size=16)  # [KM25] H100TC.m fma=16 neab=2; [MS25]; [PV]; [H200]
    return ArchNumerics(
        "sm_90", f16=m, bf16=m,
        # [H200] mma.sync m16n8k8 tf32 fuses all 8 products ([MS25], latest [KM25] H100TC.m), but
        # wmma m16n16k8 tf32 runs in blocks of 4 ([PV] tf32 vectors have k=4 and cannot tell).
        tf32=BlockFMA(fraction_bits=25, block_size=8),
        wmma_tf32=BlockFMA(fraction_bits=25, block_size=4),
        wgmma_tf32=BlockFMA(fraction_bits=25, block_size=8),  # [MS25]; [H200] wgmma m64n8k8
        mma_m8n8k4_f16=FFMA_M8N8K4, mma_m8n8k4_f16_d=FFMA_M8N8K4_F16,  # [H200]
        # [H200] mma.sync m16n8k32 e4m3/e5m2 compiles to two f16 HMMAs (no fp8 MMA on sm_90):
        fp8_mma=m.replace(block_order=FP8_AS_F16_PAIRS, addend="last"),
        # [MS25] wgmma fp8: F=13, L=32, RZ-E8M13 (f16 output: RNE); [KM25] latest H100TC.m
        # fma=32 neab=-10; [PV] (f32 output); [H200] wgmma m64n8k32 f32 and f16 output, NaN 0x7FFFFFFF
        fp8_wgmma=BlockFMA(fraction_bits=13, block_size=32, accumulator_fraction_bits=13))


# [MS25] Blackwell kinds (nv_ptx/sim.py, MMA_T_FDPA / MMA_ST_FDPA / MMA_GST_FDPA): F=25 over blocks
# of 32 bytes of inputs; zero terms count with exponent -133; block-scaled fp4 (k64) sums groups
# of 16 products exactly and aligns them by the scale exponents with 35 fraction bits, zero
# groups and a zero C counting with -139. Checked against MMA-Sim's vectors
# (tests/data/mmasim_blackwell.npz).
F8F6F4 = BlockFMA(fraction_bits=25, block_size=32, zero_exponent=-133)
MXF4 = BlockFMA(fraction_bits=35, block_size=64, scale_group=16, zero_exponent=-139)


def _blackwell() -> ArchNumerics:
    m = BlockFMA(fraction_bits=25, block_size=16)  # [KM25] B200TC.m; [MS25]; [PV]
    return ArchNumerics(
        "sm_100", f16=m, bf16=m,
        tf32=BlockFMA(fraction_bits=25, block_size=8),  # [MS25]; [KM25] latest B200TC.m fma=8
        wmma_tf32=BlockFMA(fraction_bits=25, block_size=4),  # assumed as on sm_90 ([PV] k=4 agrees)
        mma_m8n8k4_f16=FFMA_M8N8K4, mma_m8n8k4_f16_d=FFMA_M8N8K4_F16,  # assumed as measured on sm_90
        # [PV] B200 e4m3/e5m2 (mma.sync m16n8k32): two interleaved f16 HMMAs, then RNE add of C
        fp8_mma=m.replace(block_order=FP8_AS_F16_PAIRS, addend="last"),
        f8f6f4=F8F6F4, mxf8f6f4=F8F6F4, mxf4=MXF4)  # tcgen05.mma kinds [MS25]


def _rtx_blackwell() -> ArchNumerics:
    m = BlockFMA(fraction_bits=25, block_size=16)  # [MS25] RTX Blackwell: F=25, 32-byte blocks
    return ArchNumerics(
        "sm_120", f16=m, bf16=m,
        tf32=BlockFMA(fraction_bits=25, block_size=8),  # [MS25]
        wmma_tf32=BlockFMA(fraction_bits=25, block_size=4),  # assumed as measured on sm_90
        mma_m8n8k4_f16=FFMA_M8N8K4, mma_m8n8k4_f16_d=FFMA_M8N8K4_F16,  # assumed as measured on sm_90
        fp8_mma=BlockFMA(fraction_bits=25, block_size=32),  # [MS25]: a native fp8 MMA, 32 products per block
        f8f6f4=F8F6F4, mxf8f6f4=F8F6F4, mxf4=MXF4,
        notes="from [MS25] (MMA-Sim, validated by its authors on an RTX 5090); no published vectors")


# AMD CDNA matrix cores: taken from a peer model ([MS25] MMA-Sim 2.1.1, ``mmasim/amd/sim.py``), not
# measured. CDNA3 (gfx942): f16/bf16 blocks of 8 and xf32 blocks of 4 products, F=24, F2=31, RNE
# (MMA_TR_FDPA); fp8/bf8 blocks of 16 with even and odd products summed apart (MMA_GTR_FDPA).
# f32 and f64 MFMAs are chains of correctly rounded FMAs (no BlockFMA: tcemu._src.numerics.mma).
_PEER = "taken from a peer model (MMA-Sim 2.1.1), not measured"
CDNA3_TR = BlockFMA(fraction_bits=24, block_size=8, rounding="rne", zero_exponent=None, addend_alignment="floor",
                    sum_fraction_bits=31, product_overflow="inf")


def _cdna3() -> ArchNumerics:
    return ArchNumerics("gfx942", f16=CDNA3_TR, bf16=CDNA3_TR, tf32=CDNA3_TR.replace(block_size=4),
                        fp8_mma=CDNA3_TR.replace(block_size=16, split_even_odd=True, product_overflow="none"),
                        notes=f"CDNA3 (MI300A/MI300X/MI325X): {_PEER}")


# CDNA2 (gfx90a) f16 and bf16 _1k: pairs of pairs of binary32 products, flush to zero; bf16
# without _1k: pairs ([MS25] MMA_FTZ_MUL_ADD(P)).
CDNA2_FTZ = BlockFMA(block_size=4, rounding="rne", block_sum="pairwise", subnormal_inputs=False,
                     subnormal_outputs=False, exact_zero="ieee")


def _cdna2() -> ArchNumerics:
    return ArchNumerics("gfx90a", f16=CDNA2_FTZ, bf16=CDNA2_FTZ.replace(block_size=2), bf16_1k=CDNA2_FTZ,
                        notes=f"CDNA2 (MI210/MI250/MI250X): {_PEER}")


# CDNA1 (gfx908) f16 and bf16 ([MS25] MMA_E_FDPA(L)): blocks of 4 (f16) / 2 (bf16) products and C
# summed exactly and rounded once to binary32 (RNE), subnormals kept, an exact zero +0. MMA-Sim
# computes this in float64 with error-free transformations; tcemu with an exact integer
# accumulator (numerics.exact_sum), which agrees with it except at two places where float64
# rounds twice (experiments/mmasim/README.md, tests/test_mfma_cdna1.py).
CDNA1_EXACT = BlockFMA(block_size=4, rounding="rne", block_sum="exact")


def _cdna1() -> ArchNumerics:
    return ArchNumerics("gfx908", f16=CDNA1_EXACT, bf16=CDNA1_EXACT.replace(block_size=2),
                        notes=f"CDNA1 (MI100): {_PEER}")


PRESETS: dict[str, ArchNumerics] = {
    "sm_70": _volta(), "sm_72": _volta("sm_72", _ASSUMED.format("sm_70", "Volta", "Jetson AGX Xavier")),
    "sm_75": _turing(), "sm_80": _ampere("sm_80"), "sm_86": _ampere("sm_86"),
    "sm_87": _ampere("sm_87", _ASSUMED.format("sm_80/sm_86", "Ampere", "Jetson Orin")),
    "sm_89": _ada(), "sm_90": _hopper(), "sm_100": _blackwell(), "sm_120": _rtx_blackwell(),
    "gfx908": _cdna1(), "gfx90a": _cdna2(),
    "gfx942": _cdna3(),
}


def numerics(arch) -> ArchNumerics:
    """The :class:`ArchNumerics` preset of an architecture ("sm_90", "H100", ...); those of the
    Jetson GPUs (sm_72, sm_87) are assumed from their generation (see their ``notes``).

    >>> import tcemu
    >>> tcemu.numerics("L40S").fp8_mma.accumulator_fraction_bits    # Ada's E8M13 fp8 accumulator
    13
    """
    a: Arch = resolve(arch)
    return PRESETS[a.name]


def check_model(model, where: str) -> None:
    """Raise a TypeError naming ``where`` unless ``model`` is a BlockFMA, an ArchNumerics or None."""
    if model is not None and not isinstance(model, (BlockFMA, ArchNumerics)):
        raise TypeError(f"{where}: model must be a tcemu.BlockFMA, a tcemu.ArchNumerics or None, "
                        f"got {model!r} ({type(model).__name__})")
