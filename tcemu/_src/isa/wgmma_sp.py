"""``wgmma.mma_async.sp`` (sm_90a) at register level: the dense wgmma's registers and descriptors
with a compressed A and a metadata register.

Contract (public)::

    wgmma.mma_async.sp: f(regs, smem, *, d, b_desc, sp_meta, a=None, a_desc=None, sp_sel=0, scale_d=1,
                          imm_scale_a=1, imm_scale_b=1, tnsp_a=0, tnsp_b=0, key=None) -> regs

As :mod:`tcemu._src.isa.wgmma`, plus ``sp_meta`` (the index of the metadata register, one a lane)
and ``sp_sel`` (the sparsity selector, an immediate: 0 or 1 for f16/bf16/tf32, 0 for 8-bit types).
Measured on an H200 (``tests/data/wgmma_sp_sm90.npz``, ``experiments/hardware/wgmma_sp.py``):

* A is the compressed 64 x K/2, in the registers or at the descriptor exactly as the dense wgmma's
  A of K/2; B is the dense K x N at its descriptor (K twice the dense wgmma's: the K-major layouts
  step from one swizzle atom of K to the next by LBO, :mod:`tcemu._src.layouts.wgmma`).
* Warp ``w`` of the warpgroup holds the metadata of rows ``16 w .. 16 w + 15`` in its lanes as
  ``mma.sp`` of the same K holds its 16 rows (:func:`tcemu._src.isa.sparse.metadata_lanes`;
  :func:`tcemu.sparse_metadata` packs value-level metadata);
  every index pair, unsorted or equal ones included, selects its dense columns (tf32: only the
  chunks 0b0100 and 0b1110 are defined).
* The kept products take the dense wgmma's numerics of K/2 products
  (:func:`tcemu._src.isa.sparse.sparse_mma_bits`).
"""
from __future__ import annotations

import numpy as np

from tcemu._src.isa import sparse as SP
from tcemu._src.isa.registers import register_index, register_indices
from tcemu._src.isa.wgmma import WgmmaRegs


class WgmmaSpRegs(WgmmaRegs):
    """``f(regs, smem, *, d, b_desc, sp_meta, a=None, a_desc=None, sp_sel=0, scale_d=1, imm_scale_a=1,
    imm_scale_b=1, tnsp_a=0, tnsp_b=0, key=None) -> regs`` (see the module docstring)."""

    def __init__(self, ins: SP.SparseMma, arch, model=None):
        super().__init__(ins, arch, model, ka=ins.k // 2)

    def _product(self, regs, A, B, C, key, e, sel, neg):
        pos = SP.register_positions(self.ins, regs[:, e], sel)
        if neg[1]:  # imm-scale-b negates the B value a product reads (tf32: after its halves are assembled)
            B = B ^ SP.sign_bit(self.ins.btype)
        return SP.sparse_mma_bits(self.ins, A, B, C, pos, self.model, arch=self.arch, key=key, neg_b=neg[1])

    def __call__(self, regs, smem, *, d, b_desc, sp_meta, a=None, a_desc=None, sp_sel=0, scale_d=1, imm_scale_a=1,
                 imm_scale_b=1, tnsp_a=0, tnsp_b=0, key=None):
        sp = self.spelling
        if register_index(sp_meta) is None:
            raise TypeError(f"{sp}: sp_meta= (the metadata register) must be one integer register index, "
                            f"got {sp_meta!r}")
        nregs = np.shape(regs)[1] if np.ndim(regs) == 2 else 0
        (e,) = register_indices(sp, "sp_meta", [sp_meta], 1, nregs) if nregs else (sp_meta,)
        sel = register_index(sp_sel)
        if sel is None or sel not in self.ins.selectors:
            raise ValueError(f"{sp}: sp_sel (the sparsity selector) must be one of "
                             f"{', '.join(map(str, self.ins.selectors))} for .{self.ins.atype}, got {sp_sel!r}")
        return self._call(regs, smem, d, b_desc, a, a_desc, scale_d, imm_scale_a, imm_scale_b, tnsp_a, tnsp_b, key,
                          e=e, sel=sel)
