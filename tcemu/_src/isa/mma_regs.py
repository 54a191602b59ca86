"""Register-level MMAs: ``wmma.mma`` and ``mma.sync`` (``.block_scale`` included) as
``f(regs, *, d, a, b, c, key=None) -> regs``: the A, B and C fragments gathered into matrices,
their element bits turned into the encodings of :func:`tcemu._src.numerics.mma.mma_bits`, the
numerics run, and D scattered back into its fragment. The fragments are those of
:mod:`tcemu._src.isa.fragments` (``mma.sync`` fragments for ``mma.sync``, the measured ``wmma``
ones for ``wmma.mma``).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from tcemu._src.formats import ELEMENT_BITS
from tcemu._src.isa.fragments import fragment_to_matrix, matrix_to_fragment
from tcemu._src.isa.instructions import Mma
from tcemu._src.isa.targets import check_arch
from tcemu._src.isa.registers import Instruction, check_regs, read_regs, register_index, register_indices, write_regs
from tcemu._src.numerics import mma as mma_numerics
from tcemu._src.checks import check_key

_U32 = jnp.uint32


def _to_numeric(bits, etype, packed=False):
    """Element bits -> the encoding of ``numerics.mma.mma_bits`` for integer/f64 types, and the
    codes of fp6/fp4 elements: PTX places an e2m1 in bits 5:2 of its 8-bit container and an
    e3m2/e2m3 in bits 5:0 (the padding bits are not read); packed e2m1 is the whole nibble."""
    if etype == "e2m1":
        return bits & 0xF if packed else (bits >> 2) & 0xF
    if etype in ("e3m2", "e2m3"):
        return bits & 0x3F
    if etype == "f64":
        lo, hi = bits
        return lo.astype(jnp.uint64) | (hi.astype(jnp.uint64) << 32)
    if etype in ("s8", "s4"):
        w = ELEMENT_BITS[etype]
        return (bits.astype(jnp.int32) << (32 - w)) >> (32 - w)
    if etype in ("u8", "u4", "b1", "s32"):
        return bits.astype(jnp.int32) if etype != "s32" else jax.lax.bitcast_convert_type(bits, jnp.int32)
    return bits


def _from_numeric(vals, etype):
    if etype == "f64":
        v = vals.astype(jnp.uint64)
        return (v & 0xFFFFFFFF).astype(_U32), (v >> 32).astype(_U32)
    if etype == "s32":
        return jax.lax.bitcast_convert_type(vals.astype(jnp.int32), _U32)
    return vals.astype(_U32)


class MmaRegs(Instruction):
    """``f(regs, *, d, a, b, c, key=None) -> regs`` for an MMA with fragments ``fa``, ``fb``, ``fc``,
    ``fd``; ``key`` is a PRNG key for models with stochastic rounding."""

    def __init__(self, ins: Mma, arch, fragments, model=None):
        super().__init__(ins, arch)
        check_arch(ins, arch)
        self.fa, self.fb, self.fc, self.fd = fragments
        if ins.family not in ("int", "b1", "f64"):
            self.model = mma_numerics.resolve_model(ins, model, arch)
        else:
            self.model = None
        self._impl = jax.jit(self._mma, static_argnames=("d", "a", "b", "c"))

    def _mma(self, regs, key, d, a, b, c, scales=None):
        ins = self.ins
        packed = self.fa.bits == 4 and ins.atype == "e2m1"
        A = _to_numeric(fragment_to_matrix(read_regs(regs, a), self.fa), ins.atype, packed)
        B = _to_numeric(fragment_to_matrix(read_regs(regs, b), self.fb), ins.btype, packed)
        C = _to_numeric(fragment_to_matrix(read_regs(regs, c), self.fc), ins.ctype)
        if self.fa.rows == 4 * ins.m:  # m8n8k4 .f16: four independent quad-pair MMAs, stacked
            A = A.reshape(4, ins.m, ins.k)
            B = jnp.moveaxis(B.reshape(ins.k, 4, ins.n), 1, 0)
            C = C.reshape(4, ins.m, ins.n)
        if scales is None and key is None:  # jax.vmap over warps: the batched numerics
            D = mma_numerics.mma_bits_vmappable(ins, self.model, self.arch)(A, B, C)
        else:
            sa, sb = scales if scales is not None else (None, None)
            D = mma_numerics.mma_bits(ins, A, B, C, self.model, arch=self.arch, key=key, scale_a=sa, scale_b=sb,
                                      over_devices=True)
        D = D.reshape(self.fd.rows, self.fd.cols)
        return write_regs(regs, d, matrix_to_fragment(_from_numeric(D, ins.dtype), self.fd))

    def _checked(self, regs, key, d, a, b, c):
        """(regs, key, fragment register indices) validated."""
        regs = check_regs(self.spelling, regs)
        key = check_key(key, self.spelling)
        given = {"d": d, "a": a, "b": b, "c": c}
        frags = {"d": self.fd, "a": self.fa, "b": self.fb, "c": self.fc}
        return regs, key, {n: register_indices(self.spelling, n, given[n], frags[n].nregs, regs.shape[1]) for n in given}

    def __call__(self, regs, *, d, a, b, c, key=None):
        regs, key, args = self._checked(regs, key, d, a, b, c)
        if self.ins.family == "f64":
            from tcemu._src.numerics.fma64 import require_x64

            require_x64(f"{self.spelling!r}")
        return self._impl(regs, key, **args)


# Block-scale selectors of mma.sync (PTX ISA "Warp-level matrix multiply with block scaling",
# Table 37): valid byte-id per scale_vec; thread-id-a picks a lane pair of each quad, thread-id-b a lane.
_BYTE_IDS = {1: (0, 1, 2, 3), 2: (0, 2), 4: (0,)}


class MmaBlockScaleRegs(MmaRegs):
    """``f(regs, *, d, a, b, c, scale_a, scale_b, byte_id_a=0, thread_id_a=0, byte_id_b=0,
    thread_id_b=0)`` for ``mma.sync ... .block_scale`` (sm_120): ``scale_a``/``scale_b`` are the
    registers of ``scale-a-data``/``scale-b-data``, the selectors the immediates of
    ``{byte-id-a, thread-id-a}`` and ``{byte-id-b, thread-id-b}``.

    Which lanes supply the scales (PTX ISA text, and the layout CUTLASS ``SM120_16x8x*_TN_VS``
    ``SFALayout``/``SFBLayout`` and MMA-Sim's kernels use): row ``r`` of A takes lane
    ``4 (r % 8) + 2 thread-id-a + r // 8``, column ``n`` of B lane ``4 n + thread-id-b``; scale
    ``j`` (the K block ``j``) is byte ``byte-id + j`` of that lane's register, byte 0 the least
    significant.
    """

    def __init__(self, ins: Mma, arch, fragments, model=None):
        super().__init__(ins, arch, fragments, model)
        self._impl = jax.jit(self._scaled, static_argnames=("d", "a", "b", "c", "sel"))

    def _scaled(self, regs, key, d, a, b, c, sel):
        sa, sb, bida, tida, bidb, tidb = sel
        S = self.ins.scale_vec
        j = jnp.arange(S, dtype=_U32)
        r = jnp.arange(16)
        wa = regs[4 * (r % 8) + 2 * tida + r // 8, sa]
        wb = regs[4 * jnp.arange(8) + tidb, sb]
        scale_a = (wa[:, None] >> (8 * (bida + j))[None, :]) & 0xFF  # (16, S)
        scale_b = (wb[None, :] >> (8 * (bidb + j))[:, None]) & 0xFF  # (S, 8)
        return self._mma(regs, key, d, a, b, c, scales=(scale_a, scale_b))

    def __call__(self, regs, *, d, a, b, c, scale_a, scale_b, byte_id_a=0, thread_id_a=0, byte_id_b=0,
                 thread_id_b=0, key=None):
        regs, key, args = self._checked(regs, key, d, a, b, c)
        regs_s = [register_indices(self.spelling, n, [v] if register_index(v) is not None else v, 1, regs.shape[1])[0]
                  for n, v in (("scale_a", scale_a), ("scale_b", scale_b))]
        S = self.ins.scale_vec
        sels = []
        for name, v, valid in (("byte_id_a", byte_id_a, _BYTE_IDS[S]), ("thread_id_a", thread_id_a, (0, 1)),
                               ("byte_id_b", byte_id_b, _BYTE_IDS[S]), ("thread_id_b", thread_id_b, (0, 1, 2, 3))):
            iv = register_index(v)
            if iv is None or iv not in valid:
                raise ValueError(f"{self.spelling}: {name} must be one of {', '.join(map(str, valid))} with "
                                 f".scale_vec::{S}X, got {v!r}")
            sels.append(iv)
        return self._impl(regs, key, sel=(regs_s[0], regs_s[1], *sels), **args)
