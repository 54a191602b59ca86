"""The sign of zero results against the H200 (tests/data/signed_zeros_sm90.npz, made by
``python experiments/hardware/capture.py --only signed_zeros``): products cancelling in exact
pairs, products cancelling only after alignment (the small terms truncated away), all products
signed zeros, and C = -(A @ B) exactly; C +-0, tiny, small or ordinary, of both signs. Every
accumulator type of wmma.mma, mma.sync (incl. the FFMA-compiled m8n8k4 .f16 and the fp8 pairs of
f16 HMMAs) and wgmma; value level, and register level for wmma and mma.sync. The same tests run on
tests/data/underflow_sm90.npz (``capture.py --only underflow``, H100): nonzero sums that round to
zero, whose zero is +0 from a tensor core as well."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tcemu
from tcemu._src import formats as fm
from tcemu._src.isa.parse import parse
from tcemu._src.isa.wmma import fragment_to_matrix, matrix_to_fragment, mma_sync_fragments
import test_wgmma_hw
from conftest import capture

CAP = "signed_zeros_sm90.npz"
UNDERFLOW = "underflow_sm90.npz"


def forms(prefix, cap=CAP):
    return sorted({k.rsplit(".", 1)[0] for k in capture(cap) if k.startswith(prefix)})


def both(prefix, keep=lambda f: True):
    return [(cap, f) for cap in (CAP, UNDERFLOW) for f in forms(prefix, cap) if keep(f)]


def _typed(bits, etype):
    return fm.from_bits(jnp.asarray(bits.astype(np.uint32)), etype)


def _report(got, want, z, key):
    bad = got != want
    per_class = {str(n): int(bad[z[key + ".class"] == i].sum()) for i, n in enumerate(z[key + ".classes"])}
    ins = parse(key if key.startswith(("wmma.", "wgmma.")) else "mma.sync.aligned." + key)
    mag = 0x7FFF7FFF if ins.dtype == "f16" else 0x7FFFFFFF  # (f16 pairs in a register)
    zero_sign = int(np.sum(bad & ((got | want) & mag == 0))) if bad.any() else 0
    assert not bad.any(), f"mismatches per input class: {per_class} ({zero_sign} differ only in the sign of zero)"


def test_capture_covers_every_accumulator_and_zero_results():
    z = capture(CAP)
    assert len(forms("wmma.")) == 6 and len(forms("m")) == 13 and len(forms("wgmma.")) == 8
    assert all(int(z[f + ".sanity_mismatches"]) == 0 for f in forms("wgmma."))
    for sp in forms("wmma."):  # plenty of zero results, and of -0 addends
        ins = parse(sp)
        zero = np.uint32(0x7FFF if ins.dtype == "f16" else 0x7FFFFFFF)
        neg0 = np.uint32(0x8000 if ins.ctype == "f16" else 0x80000000)
        assert np.sum((z[sp + ".d"].astype(np.uint32) & zero) == 0) > 1000, sp
        assert np.sum(z[sp + ".c"].astype(np.uint32) == neg0) > 500, sp


def _all_negative_zero(a, b, c, ins):
    """Outputs whose every addend (products and C) is -0: IEEE 754 says -0."""
    A, B, C = (np.asarray(_typed(x, t)).astype(np.float64) for x, t in ((a, ins.atype), (b, ins.btype), (c, ins.ctype)))
    P = A[..., :, :, None] * B[..., None, :, :]  # (T, M, K, N)
    return np.all((P == 0) & np.signbit(P), axis=-2) & (C == 0) & np.signbit(C)


def test_exact_zero_sign_rule():
    """What the capture shows: when every addend is -0, a tensor core (HMMA) returns +0, while
    m8n8k4 .f16 (compiled to CUDA-core FFMA/FADD code on sm_90) returns -0 as IEEE 754 says."""
    z = capture(CAP)
    for sp in forms("wmma."):
        ins = parse(sp)
        mask = _all_negative_zero(z[sp + ".a"], z[sp + ".b"], z[sp + ".c"], ins)
        assert mask.sum() > 10 and np.all(z[sp + ".d"][mask] == 0), sp
    short = "m8n8k4.row.col.f16.f16.f16.f16"
    ins = parse("mma.sync.aligned." + short)
    d = np.asarray(jax.vmap(lambda r: fragment_to_matrix(r, mma_sync_fragments(ins)[3]))(
        jnp.asarray(z[short + ".regs_out"])))
    blocks = [(slice(8 * q, 8 * q + 8), slice(8 * q, 8 * q + 8)) for q in range(4)]  # one MMA per quad pair
    mask = np.concatenate([_all_negative_zero(z[short + ".a"][:, r], z[short + ".b"][:, :, cols], z[short + ".c"][:, r],
                                              ins) for r, cols in blocks], axis=1)
    assert mask.sum() > 10 and np.all(d[mask] == 0x8000)


def test_underflow_zero_is_positive():
    """[H100] A negative sum that rounds to zero: +0 from a binary16 tensor-core accumulator, -0
    when a binary32 result is converted to binary16 by cvt.rn.f16.f32 (.f16.f32 wmma)."""
    z = capture(UNDERFLOW)
    native, cvt = "wmma.mma.sync.aligned.row.col.m16n16k16.f16.f16", "wmma.mma.sync.aligned.row.col.m16n16k16.f16.f32"
    assert np.all(z[native + ".d"] != 0x8000) and np.sum(z[native + ".d"] == 0) > 1000
    assert np.sum(z[cvt + ".d"] == 0x8000) > 1000
    d = tcemu.mma(native, _typed(z[native + ".a"], "f16"), _typed(z[native + ".b"], "f16"), _typed(z[native + ".c"], "f16"),
                  arch="H100", model=tcemu.numerics("H100").f16.replace(exact_zero="ieee"))
    assert np.sum(np.asarray(fm.to_bits(d, "f16")) == 0x8000) > 500  # what an IEEE rounding of the same sums gives


@pytest.mark.parametrize("cap,sp", both("wmma."))
def test_wmma_value_and_register_level(cap, sp):
    z = capture(cap)
    ins = parse(sp)
    d = tcemu.mma(sp, _typed(z[sp + ".a"], ins.atype), _typed(z[sp + ".b"], ins.btype),
                  _typed(z[sp + ".c"], ins.ctype), arch="H200")
    got = np.asarray(fm.to_bits(d, ins.dtype))
    _report(got, z[sp + ".d"].astype(np.uint32), z, sp)
    mma = tcemu.ptx(sp, arch="sm_90")
    frags = (mma.fa, mma.fb, mma.fc, mma.fd)
    n = [f.nregs for f in frags]
    regs = np.zeros((8, 32, sum(n)), np.uint32)
    for i, (f, m) in enumerate(zip(frags[:3], "abc")):
        regs[:, :, sum(n[:i]):sum(n[:i + 1])] = np.asarray(jax.vmap(lambda x: matrix_to_fragment(x, f))(
            jnp.asarray(z[f"{sp}.{m}"][:8].astype(np.uint32))))
    r = [range(sum(n[:i]), sum(n[:i + 1])) for i in range(4)]
    out = jax.vmap(lambda x: mma(x, a=r[0], b=r[1], c=r[2], d=r[3]))(jnp.asarray(regs))
    np.testing.assert_array_equal(np.asarray(out)[:, :, r[3].start:], z[sp + ".dregs"][:8])


@pytest.mark.parametrize("cap,short", both("m"))
def test_mma_sync_register_level(cap, short):
    z = capture(cap)
    f = tcemu.ptx("mma.sync.aligned." + short, arch="sm_90")
    na, nb, nc, nd = (int(x) for x in z[short + ".nregs"])
    run = jax.jit(jax.vmap(lambda r: f(
        jnp.concatenate([r, jnp.zeros((32, nd), jnp.uint32)], 1), a=range(na), b=range(na, na + nb),
        c=range(na + nb, na + nb + nc), d=range(na + nb + nc, na + nb + nc + nd))[:, na + nb + nc:]))
    _report(np.asarray(run(jnp.asarray(z[short + ".regs_in"]))), z[short + ".regs_out"], z, short)


@pytest.mark.parametrize("cap,short", both("m", lambda f: not f.startswith("m8n8k4")))
def test_mma_sync_value_level(cap, short):
    z = capture(cap)
    sp = "mma.sync.aligned." + short
    ins = parse(sp)
    d = tcemu.mma(sp, _typed(z[short + ".a"], ins.atype), _typed(z[short + ".b"], ins.btype),
                  _typed(z[short + ".c"], ins.ctype), arch="H200")
    fd = mma_sync_fragments(ins)[3]
    got = np.asarray(jax.vmap(lambda x: matrix_to_fragment(x, fd))(fm.to_bits(d, ins.dtype)))
    _report(got, z[short + ".regs_out"], z, short)


@pytest.mark.parametrize("cap,sp", both("wgmma."))
def test_wgmma_value_level(cap, sp):
    z = capture(cap)
    _report(test_wgmma_hw.emulate(z, sp), z[sp + ".d_regs"], z, sp)
