"""AMD MFMA at register level: ``tcemu.ptx("v_mfma_...", arch="MI300X")`` over a wavefront's
``(64, nregs)`` uint32 VGPRs (``tcemu.regfile(nregs, lanes=64)``; AGPRs are registers like any).

Contract (public)::

    f(regs, *, d, a, b, c, cbsz=0, abid=0, blgp=0, neg=None) -> regs

``a``, ``b``, ``c``, ``d``: the register indices of each operand (as many as the instruction's
layout needs: :attr:`fa`, :attr:`fb`, :attr:`fd` ``.nregs``; an f64 element takes a pair, low word
first; i8 elements are bytes, four a VGPR); C may overlap D. The layouts are AMD's Matrix
Instruction Calculator's (:mod:`tcemu._src.layouts.mfma`): ``cbsz``/``abid`` pick the block of A
each block reads, ``blgp`` the lanes B is read from (lane forms), ``neg`` (gfx942 f64) negates A,
B, C. The values are those of the value level (:mod:`tcemu._src.api_mfma`, MMA-Sim's models).

    >>> import numpy as np, tcemu
    >>> f = tcemu.ptx("v_mfma_f32_32x32x8_f16", arch="MI300X")
    >>> f.fa.nregs, f.fb.nregs, f.fd.nregs                       # VGPRs a lane: A, B, C/D
    (2, 2, 16)
    >>> regs = tcemu.regfile(20, lanes=64)
    >>> ones = np.full(64, 0x3C003C00, np.uint32)                # two f16 ones a register
    >>> regs = regs.at[:, 0:4].set(np.stack([ones] * 4, 1))
    >>> out = f(regs, a=range(2), b=range(2, 4), c=range(4, 20), d=range(4, 20))
    >>> float(out[:, 4:].view(np.float32)[0, 0])                  # 8 products of 1 x 1
    8.0
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from tcemu._src.isa.mfma import Mfma
from tcemu._src.isa.registers import Instruction, check_regs, read_regs, register_index, register_indices, write_regs
from tcemu._src.layouts import mfma as L
from tcemu._src.numerics import mfma as mfma_numerics


def _flag(spelling, name, v, hi):
    iv = register_index(v)
    if iv is None or not 0 <= iv <= hi:
        none = f" ({spelling} takes no {name.upper()})" if hi == 0 else ""
        raise ValueError(f"{spelling}: {name} must be an integer in 0..{hi}{none}, got {v!r}")
    return iv


class MfmaRegs(Instruction):
    """``f(regs, *, d, a, b, c, cbsz=0, abid=0, blgp=0, neg=None) -> regs`` (module docstring)."""

    def __init__(self, ins: Mfma, arch, model=None):
        super().__init__(ins, arch)
        self.layout = L.mfma(ins.spelling, ins.arch)
        self.fa, self.fb, self.fd = (self.layout.fragment(m) for m in ("a", "b", "d"))
        if model is not None and ins.family in ("f32", "f64"):
            raise ValueError(f"{ins.spelling!r}: f32 and f64 MFMAs are FMA chains; model= does not apply")
        if model is not None and ins.family == "int":
            raise ValueError(f"{ins.spelling!r}: integer MFMAs are exact (int32, wrapping); model= does not apply")
        if ins.family not in ("f32", "f64", "int"):
            mfma_numerics.mfma_model(ins, model)  # a preset or model exists (clear error otherwise)
        self.model = model
        self._impl = jax.jit(self._run, static_argnames=("d", "a", "b", "c", "cbsz", "abid", "blgp", "neg"))

    def _run(self, regs, d, a, b, c, cbsz, abid, blgp, neg):
        lay, ins = self.layout, self.ins
        A = L.unpack(lay, "a", read_regs(regs, a), cbsz=cbsz, abid=abid)
        B = L.unpack(lay, "b", read_regs(regs, b), blgp=blgp if lay.blgp == "lanes" else 0)
        C = L.unpack(lay, "c", read_regs(regs, c))
        if ins.family == "f64":
            A, B, C = (x[..., 0].astype(jnp.uint64) | (x[..., 1].astype(jnp.uint64) << 32) for x in (A, B, C))
            sign = jnp.uint64(1 << 63)
            A, B, C = (x ^ sign if f else x for x, f in zip((A, B, C), neg))
        D = mfma_numerics.mfma_bits(ins, A, B, C, self.model)
        if ins.family == "f64":
            D = jnp.stack([(D & 0xFFFFFFFF).astype(jnp.uint32), (D >> 32).astype(jnp.uint32)], -1)
        return write_regs(regs, d, L.pack(lay, "d", D.astype(jnp.uint32)))

    def __call__(self, regs, *, d, a, b, c, cbsz=0, abid=0, blgp=0, neg=None):
        sp, ins, lay = self.spelling, self.ins, self.layout
        regs = check_regs(sp, regs, lanes=64)
        n = regs.shape[1]
        idx = {name: register_indices(sp, name, v, fr.nregs, n)
               for name, v, fr in (("a", a, self.fa), ("b", b, self.fb), ("c", c, self.fd), ("d", d, self.fd))}
        top = int(np.log2(ins.blocks)) if lay.cbsz_abid else 0
        cbsz = _flag(sp, "cbsz", cbsz, top)
        abid = _flag(sp, "abid", abid, (1 << cbsz) - 1)
        blgp = _flag(sp, "blgp", blgp, 7 if lay.blgp == "lanes" else 0)
        if neg is not None and lay.blgp != "negate":
            raise ValueError(f"{sp}: neg is only for the f64 MFMAs of gfx942 (CDNA3), whose BLGP field negates A, B, C")
        if neg is not None and (not isinstance(neg, (tuple, list)) or len(neg) != 3 or
                                any(x not in (0, 1, True, False) for x in neg)):
            raise ValueError(f"{sp}: neg must be three flags (negate A, B, C), got {neg!r}")
        if ins.family == "f64":
            from tcemu._src.numerics.fma64 import require_x64

            require_x64(f"{sp!r}")
        flips = tuple(bool(x) for x in neg) if neg is not None else (False, False, False)
        return self._impl(regs, cbsz=cbsz, abid=abid, blgp=blgp, neg=flips, **idx)
