"""Numerics of one MMA instruction on matrices of bit patterns, for every input family.

``mma_bits(ins, a, b, c, model)`` is what both the register-level instructions and the value
level :func:`tcemu.mma` call, so the two agree bit for bit by construction.

Operand encodings: floating point as uint32 bit patterns of their PTX type (tf32: the float32
pattern), float64 as uint64 patterns (x64 required), integers as int32 values (s8/s4 sign
extended, b1 as 0/1); the result in the same encoding for ``.dtype``.
"""
from __future__ import annotations

import jax.numpy as jnp

from tcemu._src import formats as fm
from tcemu._src.arch import resolve
from tcemu._src.isa.parse import Mma
from tcemu._src.numerics import engine, fma64, integer
from tcemu._src.numerics.model import BlockFMA
from tcemu._src.numerics.presets import ArchNumerics, numerics

_MIN_SM = {("wmma", "f16"): 70, ("wmma", "int"): 72, ("wmma", "b1"): 75, ("wmma", "bf16"): 80,
           ("wmma", "tf32"): 80, ("wmma", "f64"): 80}


def check_arch(ins: Mma, arch) -> None:
    """Raise if ``arch`` lacks the instruction (PTX ISA "Target ISA Notes")."""
    from tcemu._src.isa.parse import MMA_SYNC_MIN_SM

    a = resolve(arch)
    if ins.kind == "wmma":
        fam = "int" if ins.atype in ("s8", "u8") else ("b1" if ins.atype in ("s4", "u4", "b1") else ins.family)
        need = _MIN_SM[("wmma", fam)]
        if ins.op == "and":
            need = 80
    elif ins.kind == "wgmma":
        need = 90
        if a.sm != 90:
            raise ValueError(f"{ins.spelling!r}: wgmma exists only on sm_90 (Hopper), not {a}")
    else:
        fam = {"int": "int4" if ins.atype in ("s4", "u4") else "int8"}.get(ins.family, ins.family)
        need = MMA_SYNC_MIN_SM[fam]
        if ins.shape in ("m16n8k4", "m16n8k8", "m16n8k16") and ins.family == "f64":
            need = 90
    if a.sm < need:
        raise ValueError(f"{ins.spelling!r} requires sm_{need} or newer; {a} does not have it")


def resolve_model(ins: Mma, model, arch) -> BlockFMA:
    """The :class:`BlockFMA` for a floating-point instruction: ``model`` if it is one, else the
    ``ArchNumerics`` given (or the preset of ``arch``)."""
    if isinstance(model, BlockFMA):
        return model
    nums = model if isinstance(model, ArchNumerics) else numerics(arch)
    m = nums.for_instruction(ins)
    if m is None:
        raise ValueError(f"{ins.spelling!r}: no {ins.family} {ins.kind} numerics for {nums.arch}; "
                         "pass model=tcemu.BlockFMA(...) to use your own")
    return m


def mma_bits(ins: Mma, a, b, c, model, *, arch="sm_90", key=None):
    """``D = A @ B + C`` of instruction ``ins`` on encoded operands (see module docstring)."""
    fam = ins.family
    if fam == "int":
        return integer.int_mma(a, b, c, satfinite=ins.satfinite)
    if fam == "b1":
        return integer.b1_mma(a, b, c, op=ins.op)
    if fam == "f64":
        return fma64.fma_chain_bits(a, b, c, ins.rnd)
    m = resolve_model(ins, model, arch)
    fa, fb = fm.FORMATS[ins.atype], fm.FORMATS[ins.btype]
    c = jnp.asarray(c).astype(jnp.uint32)
    if ins.ctype == ins.dtype and not (ins.dtype == "f16" and m.f16_accumulation == "f32"):
        acc, cfmt = ins.dtype, fm.FORMATS[ins.ctype]
    elif ins.ctype == "f16":  # .f32.f16: C is widened to f32 exactly, f32 accumulation
        c, acc, cfmt = engine.convert(c, fm.F16, fm.F32), "f32", fm.F32
    else:  # .f16.f32: f32 accumulation, then cvt.rn.f16.f32 of the result
        acc, cfmt = "f32", fm.F32
    d = engine.fused_dot(a, fa, b, fb, c, cfmt, m, acc=acc, key=key)
    if ins.dtype == "f16" and acc == "f32":
        d = engine.convert(d, fm.F32, fm.F16, "rne")
    return d
