"""wgmma (sm_90a) against the H200 (tests/data/wgmma_sm90.npz, experiments/hardware/wgmma.py): A in
registers (per warp the mma.sync m16n8kK A fragment, rows 16w..16w+15), B from shared memory, D
preloaded with C. Covers Hopper fp8 with fp16 output, which the published H100/H200 vectors cannot
check, and wgmma tf32 (one fused block of 8)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tcemu
from tcemu._src import formats as fm
from tcemu._src.isa.parse import parse
from tcemu._src.isa.wmma import fragment_to_matrix, matrix_to_fragment, mma_sync_fragments
from conftest import capture

CAP = "wgmma_sm90.npz"
PER_WARP = {"f16": "m16n8k16.row.col.{d}.f16.f16.{d}", "bf16": "m16n8k16.row.col.{d}.bf16.bf16.{d}",
            "tf32": "m16n8k8.row.col.{d}.tf32.tf32.{d}", "e4m3": "m16n8k32.row.col.{d}.e4m3.e4m3.{d}",
            "e5m2": "m16n8k32.row.col.{d}.e5m2.e5m2.{d}"}


def forms():
    return sorted({k.rsplit(".", 1)[0] for k in capture(CAP)})


def test_all_forms_captured_and_layout_sanity_passed():
    z = capture(CAP)
    assert len(forms()) == 8
    assert all(int(z[f + ".sanity_mismatches"]) == 0 for f in forms())


def emulate(z, sp):
    """tcemu.mma on the operands of capture ``z`` for wgmma ``sp``, as D registers (T, 128, nd)."""
    ins = parse(sp)
    fa, _, fc, fd = mma_sync_fragments(parse("mma.sync.aligned." + PER_WARP[ins.atype].format(d=ins.dtype)))

    def stack(regs, frag):  # (T, 128, n) -> (T, 64, cols): warp w holds rows 16w..16w+15
        return jnp.concatenate([jax.vmap(lambda r: fragment_to_matrix(r, frag))(jnp.asarray(regs[:, 32 * w:32 * w + 32]))
                                for w in range(4)], axis=1)

    A, C = stack(z[sp + ".a_regs"], fa), stack(z[sp + ".c_regs"], fc)
    d = tcemu.mma(sp, fm.from_bits(A, ins.atype), fm.from_bits(jnp.asarray(z[sp + ".b"]), ins.btype),
                  fm.from_bits(C, ins.ctype), arch="H200")
    bits = fm.to_bits(d, ins.dtype)
    return np.concatenate([np.asarray(jax.vmap(lambda x: matrix_to_fragment(x[16 * w:16 * w + 16], fd))(bits))
                           for w in range(4)], axis=1)


@pytest.mark.parametrize("sp", forms())
def test_wgmma_value_level_matches_h200(sp):
    z = capture(CAP)
    bad = emulate(z, sp) != z[sp + ".d_regs"]
    per_class = {str(n): int(bad[z[sp + ".class"] == i].sum()) for i, n in enumerate(z[sp + ".classes"])}
    assert not bad.any(), f"mismatching register words per input class: {per_class}"
