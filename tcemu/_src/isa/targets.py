"""Which architectures have which MMA (the PTX ISA's "Target ISA Notes"), one table per fact:
wmma by element type and shape (:mod:`~tcemu._src.isa.wmma_spec`), mma.sync by type family
(:data:`MMA_SYNC_MIN_SM`); wgmma only on sm_90, tcgen05 only on sm_100, the Blackwell
``mma.sync .kind::*`` only on sm_120.

    >>> from tcemu._src.isa.parse import parse
    >>> from tcemu._src.isa.targets import check_arch
    >>> check_arch(parse("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"), "A100")
    >>> check_arch(parse("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"), "V100")
    Traceback (most recent call last):
    ...
    ValueError: 'mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32' requires sm_80 or newer; sm_70 (V100) does not have it
"""
from __future__ import annotations

from tcemu._src.arch import resolve
from tcemu._src.isa import wmma_spec as S

MMA_SYNC_MIN_SM = {"f16": 70, "bf16": 80, "tf32": 80, "f64": 80, "fp8": 89, "int8": 75, "int4": 75, "b1": 75}
WMMA_AND_MIN_SM = 80  # wmma.mma .b1 with .and.popc (the .xor form needs sm_75)
MMA_SYNC_F64_SHAPES = ("m16n8k4", "m16n8k8", "m16n8k16")  # the f64 shapes beyond m8n8k4: sm_90
ONLY = {"wgmma": (90, "sm_90 (Hopper)"), "tcgen05": (100, "sm_100 (B200)")}


def check_arch(ins, arch) -> None:
    """Raise a ValueError if ``arch`` lacks the MMA ``ins``."""
    a = resolve(arch)
    if ins.kind in ONLY:
        sm, name = ONLY[ins.kind]
        if a.sm != sm:
            raise ValueError(f"{ins.spelling!r}: {ins.kind} exists only on {name}, not {a}")
        return
    if ins.kind == "wmma":
        need = max(S.MIN_SM_FOR_TYPE[ins.atype], S.MIN_SM_FOR_SHAPE.get(ins.shape, 70))
        if ins.op == "and":
            need = WMMA_AND_MIN_SM
    elif ins.ptx_kind is not None:
        if a.sm != 120:
            raise ValueError(f"{ins.spelling!r}: mma.sync .kind::{ins.ptx_kind} exists only on sm_120 "
                             f"(RTX 50 / RTX PRO Blackwell), not {a}")
        return
    else:
        fam = {"int": "int4" if ins.atype in ("s4", "u4") else "int8"}.get(ins.family, ins.family)
        need = MMA_SYNC_MIN_SM[fam]
        if ins.shape in MMA_SYNC_F64_SHAPES and ins.family == "f64":
            need = 90
    if a.sm < need:
        raise ValueError(f"{ins.spelling!r} requires sm_{need} or newer; {a} does not have it")
