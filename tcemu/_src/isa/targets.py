"""Which architectures have which MMA (the PTX ISA's "Target ISA Notes"), one table per fact:
wmma by element type and shape (:mod:`~tcemu._src.isa.wmma_spec`), mma.sync by type family and
shape (:data:`MMA_SYNC_MIN_SM`); wgmma only on sm_90, tcgen05 only on sm_100, the Blackwell
``mma.sync .kind::*`` only on sm_120.

    >>> from tcemu._src.isa.parse import parse
    >>> from tcemu._src.isa.targets import check_arch
    >>> check_arch(parse("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"), "A100")
    >>> check_arch(parse("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"), "V100")
    Traceback (most recent call last):
    ...
    ValueError: 'mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32' requires sm_80 or newer; sm_70 (V100) does not have it
"""
from __future__ import annotations

from tcemu._src.arch import resolve
from tcemu._src.isa import wmma_spec as S
from tcemu._src.isa.instructions import WmmaLoad, WmmaStore

# mma.sync (PTX ISA 9.7.14.5.14, Target ISA Notes): oldest sm_XX per type family and shape. fp8
# .m16n8k16 came with PTX ISA 8.7 for sm_120 (RTX Blackwell); fp8 .m16n8k32 needs sm_89.
MMA_SYNC_MIN_SM: dict[str, dict[str, int]] = {
    "f16": {"m8n8k4": 70, "m16n8k8": 75, "m16n8k16": 80},
    "bf16": {"m16n8k8": 80, "m16n8k16": 80},
    "tf32": {"m16n8k4": 80, "m16n8k8": 80},
    "f64": {"m8n8k4": 80, "m16n8k4": 90, "m16n8k8": 90, "m16n8k16": 90},
    "fp8": {"m16n8k16": 120, "m16n8k32": 89},
    "int8": {"m8n8k16": 75, "m16n8k16": 80, "m16n8k32": 80},
    "int4": {"m8n8k32": 75, "m16n8k32": 80, "m16n8k64": 80},
    "b1": {"m8n8k128": 75, "m16n8k128": 80, "m16n8k256": 80},
}
AND_MIN_SM = 80  # .and.popc in single-bit wmma.mma and mma.sync (the .xor form: the shape's own)
ONLY = {"wgmma": (90, "sm_90 (Hopper)"), "tcgen05": (100, "sm_100 (B200)")}


def min_sm(ins) -> int:
    """The oldest SM number (70, 75, 80, ...) whose "Target ISA Notes" list the MMA or wmma.load /
    wmma.store ``ins``; for instructions of one architecture only (wgmma, tcgen05,
    ``mma.sync .kind::*``) that one."""
    if isinstance(ins, (WmmaLoad, WmmaStore)):
        return max(S.MIN_SM_FOR_TYPE[ins.etype], S.MIN_SM_FOR_SHAPE.get(ins.shape, 70))
    if ins.kind in ONLY:
        return ONLY[ins.kind][0]
    if ins.kind == "mma.sp":  # PTX ISA 9.7.14.6.3: sm_80; .e4m3/.e5m2 sm_89
        return 89 if ins.family == "fp8" else 80
    if ins.kind == "mma" and ins.ptx_kind is not None:
        return 120
    if ins.kind == "wmma":
        need = max(S.MIN_SM_FOR_TYPE[ins.atype], S.MIN_SM_FOR_SHAPE.get(ins.shape, 70))
    else:
        fam = {"int": "int4" if ins.atype in ("s4", "u4") else "int8"}.get(ins.family, ins.family)
        need = MMA_SYNC_MIN_SM[fam][ins.shape]
    return max(need, AND_MIN_SM) if ins.op == "and" else need


def check_arch(ins, arch) -> None:
    """Raise a ValueError if ``arch`` lacks the MMA or wmma.load / wmma.store ``ins``."""
    a = resolve(arch)
    kind = getattr(ins, "kind", "wmma")
    if kind == "mfma":  # parsed for its gfx target (tcemu._src.isa.mfma)
        if a.name != ins.arch:
            raise ValueError(f"{ins.spelling!r} was parsed for {ins.arch}, not {a}")
        return
    need = min_sm(ins)
    if kind in ONLY:
        if a.sm != need:
            raise ValueError(f"{ins.spelling!r}: {ins.kind} exists only on {ONLY[ins.kind][1]}, not {a}")
    elif kind == "mma" and ins.ptx_kind is not None:
        if a.sm != need:
            raise ValueError(f"{ins.spelling!r}: mma.sync .kind::{ins.ptx_kind} exists only on sm_120 "
                             f"(RTX 50 / RTX PRO Blackwell), not {a}")
    elif a.sm < need:
        raise ValueError(f"{ins.spelling!r} requires sm_{need} or newer; {a} does not have it")
