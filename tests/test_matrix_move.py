"""ldmatrix / stmatrix against the H200 (tests/data/ldstmatrix_sm90.npz) and as inverses."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tcemu
from conftest import capture

FORMS = [(x, t) for x in (1, 2, 4) for t in ("", ".trans")]


@pytest.mark.parametrize("x,trans", FORMS)
def test_ldmatrix_matches_h200(x, trans):
    z = capture("ldstmatrix_sm90.npz")
    k = f"ldmatrix.sync.aligned.m8n8.x{x}{trans}.shared.b16"
    ld = tcemu.ptx(k, arch="sm_90")
    for smem, offs, regs in zip(z[k + ".smem"], z[k + ".offs"], z[k + ".regs"]):
        out = ld(tcemu.regfile(x), jnp.asarray(smem.view(np.uint8)), dst=range(x), addrs=offs.astype(np.int32))
        np.testing.assert_array_equal(np.asarray(out), regs)


@pytest.mark.parametrize("x,trans", FORMS)
def test_stmatrix_matches_h200(x, trans):
    """Every byte of the 4 KiB shared memory, written or not, matches the hardware."""
    z = capture("ldstmatrix_sm90.npz")
    k = f"stmatrix.sync.aligned.m8n8.x{x}{trans}.shared.b16"
    st_ = tcemu.ptx(k, arch="sm_90")
    for before, offs, regs, after in zip(z[k + ".smem_before"], z[k + ".offs"], z[k + ".regs"], z[k + ".smem_after"]):
        out = st_(jnp.asarray(before.view(np.uint8)), jnp.asarray(regs), src=range(x), addrs=offs.astype(np.int32))
        np.testing.assert_array_equal(np.asarray(out), after.view(np.uint8))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(form=st.sampled_from(FORMS + [(1, "b8"), (2, "b8"), (4, "b8")]), seed=st.integers(0, 2 ** 31 - 1))
def test_stmatrix_after_ldmatrix_is_identity(form, seed):
    """Any distinct 16-byte rows, in any order: ldmatrix then stmatrix rewrites memory unchanged,
    and stmatrix then ldmatrix gives the registers back."""
    x, t = form
    rng = np.random.default_rng(seed)
    if t == "b8":
        sp, arch = f"matrix.sync.aligned.m16n8.x{x}.trans.shared.b8", "sm_100"
        ld = None
    else:
        sp, arch = f"matrix.sync.aligned.m8n8.x{x}{t}.shared.b16", "sm_90"
        ld = tcemu.ptx("ld" + sp, arch=arch)
    st_ = tcemu.ptx("st" + sp, arch=arch)
    mem = jnp.asarray(rng.integers(0, 256, 2048, dtype=np.uint8))
    addrs = (rng.permutation(128)[:32] * 16).astype(np.int32)
    regs = jnp.asarray(rng.integers(0, 2 ** 32, (32, x), dtype=np.uint32))
    stored = st_(mem, regs, src=range(x), addrs=addrs)
    if ld is not None:
        back = ld(tcemu.regfile(x), stored, dst=range(x), addrs=addrs)
        np.testing.assert_array_equal(np.asarray(back), np.asarray(regs))
        regs2 = ld(tcemu.regfile(x), mem, dst=range(x), addrs=addrs)
        np.testing.assert_array_equal(np.asarray(st_(mem, regs2, src=range(x), addrs=addrs)), np.asarray(mem))
    else:  # b8: every byte of every register lands in exactly one stored byte
        changed = np.asarray(stored) != np.asarray(mem)
        assert changed.sum() <= 128 * x
        rows = np.asarray(addrs[:8 * x])
        assert np.all(np.isin(np.flatnonzero(changed) // 16 * 16, rows))


def test_stmatrix_b8_layout_is_the_m16n8_accumulator_layout():
    """CUTLASS SM100_U8x4_STSM_T: byte j of lane l is element (l/4 + 8(j>>1), 2(l%4) + (j&1)) of the
    16x8 matrix, stored transposed (matrix column c at the row address of lane c)."""
    st_ = tcemu.ptx("stmatrix.sync.aligned.m16n8.x1.trans.shared.b8", arch="sm_100")
    regs = np.zeros((32, 1), np.uint32)
    for lane in range(32):
        for j in range(4):
            r, c = lane // 4 + 8 * (j >> 1), 2 * (lane % 4) + (j & 1)
            regs[lane, 0] |= np.uint32((r * 8 + c) & 0xFF) << np.uint32(8 * j)
    addrs = np.arange(32, dtype=np.int32) * 16
    mem = np.asarray(st_(tcemu.memory(512), jnp.asarray(regs), src=[0], addrs=addrs))
    stored = mem[:128].reshape(8, 16)  # row c holds column c of the matrix
    want = (np.arange(16)[None, :] * 8 + np.arange(8)[:, None]).astype(np.uint8)
    np.testing.assert_array_equal(stored, want)


@pytest.mark.parametrize("spelling,arch,message", [
    ("stmatrix.sync.aligned.m16n8.x1.shared.b8", "sm_100", ".trans is mandatory"),
    ("stmatrix.sync.aligned.m16n8.x1.trans.shared.b16", "sm_100", "valid only with .b8"),
    ("stmatrix.sync.aligned.m8n8.x1.shared.b8", "sm_90", "takes .b16 only"),
    ("stmatrix.sync.aligned.m8n8.x3.shared.b16", "sm_90", "unknown qualifier .x3"),
    ("stmatrix.sync.aligned.m8n8.x1.shared.b16", "sm_89", "requires sm_90"),
    ("ldmatrix.sync.aligned.m8n8.x1.shared.b16", "sm_70", "requires sm_75"),
    ("stmatrix.sync.aligned.m16n8.x1.trans.shared.b8", "sm_90", "requires sm_100"),
    ("ldmatrix.sync.aligned.m16n16.x4.trans.shared.b8", "sm_100", "only .x1 or .x2"),
])
def test_matrix_move_errors(spelling, arch, message):
    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        tcemu.ptx(spelling, arch=arch)


def test_address_checks():
    ld = tcemu.ptx("ldmatrix.sync.aligned.m8n8.x2.shared.b16", arch="sm_90")
    addrs = np.arange(32, dtype=np.int32) * 16
    with pytest.raises(ValueError, match="16-byte aligned; lane 3"):
        ld(tcemu.regfile(2), tcemu.memory(1024), dst=[0, 1], addrs=np.where(np.arange(32) == 3, 8, addrs))
    with pytest.raises(IndexError, match="outside the memory"):
        ld(tcemu.regfile(2), tcemu.memory(128), dst=[0, 1], addrs=addrs)
    ld(tcemu.regfile(2), tcemu.memory(256), dst=[0, 1], addrs=np.where(np.arange(32) >= 16, 12345, addrs))
    with pytest.raises(ValueError, match=r"must be a \(32,\) array"):
        ld(tcemu.regfile(2), tcemu.memory(1024), dst=[0, 1], addrs=addrs[:16])
    with pytest.raises(NotImplementedError, match="not pinned down"):
        tcemu.ptx("ldmatrix.sync.aligned.m16n16.x1.trans.shared.b8", arch="sm_100")
