"""mma.sync against the H200, register level (tests/data/mma_sync_sm90.npz: random and adversarial
values laid out per register slot, registers in -> registers out), and value level through the
PTX fragment layouts. On sm_90, fp8 mma.sync runs as two interleaved f16 HMMAs plus an RNE add of C,
m16n8k8 tf32 fuses 8 products, and m8n8k4 .f16 is compiled to an FFMA chain."""
from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tcemu
from tcemu._src.isa.parse import parse
from tcemu._src.isa.wmma import fragment_to_matrix, matrix_to_fragment, mma_sync_fragments
from conftest import capture

CAP = "mma_sync_sm90.npz"
F64 = "mma_sync_f64_sm90.npz"  # sm_90's f64 m16n8kK (DMMA), H200, its own capture


def forms(cap=CAP):
    return sorted({k.rsplit(".", 1)[0] for k in capture(cap)})


@pytest.mark.parametrize("cap,short", [(CAP, s) for s in forms()] + [(F64, s) for s in forms(F64)])
def test_register_level_matches_h200(cap, short):
    z = capture(cap)
    sp = "mma.sync.aligned." + short
    na, nb, nc, nd = (int(x) for x in z[short + ".nregs"])
    with jax.enable_x64(True) if ".f64." in sp else contextlib.nullcontext():  # x64 on stays on
        f = tcemu.ptx(sp, arch="sm_90")
        run = jax.jit(jax.vmap(lambda r: f(
            jnp.concatenate([r, jnp.zeros((32, nd), jnp.uint32)], 1), a=range(na), b=range(na, na + nb),
            c=range(na + nb, na + nb + nc), d=range(na + nb + nc, na + nb + nc + nd))[:, na + nb + nc:]))
        got = np.asarray(run(jnp.asarray(z[short + ".regs_in"])))
    bad = got != z[short + ".regs_out"]
    per_class = {str(n): int(bad[z[short + ".class"] == i].sum()) for i, n in enumerate(z[short + ".classes"])}
    assert not bad.any(), f"mismatching register words per input class: {per_class}"


def test_all_forms_captured():
    assert len(forms()) == 53 and len(forms(F64)) == 6


FP8 = [f for f in forms() if "e4m3" in f or "e5m2" in f] + ["m16n8k16.row.col.f32.f16.f16.f32",
                                                          "m16n8k16.row.col.f32.bf16.bf16.f32",
                                                          "m16n8k8.row.col.f32.tf32.tf32.f32"]


@pytest.mark.parametrize("short", FP8)
def test_value_level_equals_hardware(short):
    """tcemu.mma on the matrices the registers hold gives the hardware's D (fp8: issue's spelling)."""
    z = capture(CAP)
    sp = "mma.sync.aligned." + short
    ins = parse(sp)
    fa, fb, fc, fd = mma_sync_fragments(ins)
    na, nb, nc, nd = (int(x) for x in z[short + ".nregs"])
    regs = jnp.asarray(z[short + ".regs_in"])
    A = jax.vmap(lambda r: fragment_to_matrix(r[:, :na], fa))(regs)
    B = jax.vmap(lambda r: fragment_to_matrix(r[:, na:na + nb], fb))(regs)
    C = jax.vmap(lambda r: fragment_to_matrix(r[:, na + nb:na + nb + nc], fc))(regs)
    typ = {"f16": jnp.float16, "bf16": jnp.bfloat16, "tf32": jnp.float32, "f32": jnp.float32,
           "e4m3": tcemu._src.formats.VALUE_DTYPES["e4m3"], "e5m2": tcemu._src.formats.VALUE_DTYPES["e5m2"]}
    conv = lambda x, t: tcemu._src.formats.from_bits(x, t).astype(typ[t])  # noqa: E731
    D = tcemu.mma(sp, conv(A, ins.atype), conv(B, ins.btype), conv(C, ins.ctype), arch="H200")
    Dbits = tcemu._src.formats.to_bits(D, ins.dtype)
    got = np.asarray(jax.vmap(lambda d: matrix_to_fragment(d, fd))(Dbits))
    np.testing.assert_array_equal(got, z[short + ".regs_out"])
