"""wmma.load / wmma.store.d fragments against the H200 capture (tests/data/wmma_layouts_sm90.npz,
made by experiments/hardware/capture.py) and Volta against ptxas-derived tables."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

import tcemu
from tcemu._src.arch import resolve
from tcemu._src.isa import wmma_spec as S
from tcemu._src.layouts import wmma as wl
from conftest import capture

CAP = "wmma_layouts_sm90.npz"


def test_every_config_was_captured():
    z = capture(CAP)
    assert len(S.load_forms()) == 88 and len(S.store_forms()) == 26
    for mat, lay, shape, et in S.load_forms():
        assert f"ld.{mat}.{lay}.{shape}.{et}.table" in z
    for lay, shape, et in S.store_forms():
        assert f"st.{lay}.{shape}.{et}.table" in z


@pytest.mark.parametrize("mat,lay,shape,et", S.load_forms())
def test_load_fragment_equals_onehot_capture(mat, lay, shape, et):
    """Every lane, register and bit slot holds the element the H200 put there (replicas too)."""
    ld = tcemu.ptx(f"wmma.load.{mat}.sync.aligned.{lay}.{shape}.{et}", arch="sm_90")
    np.testing.assert_array_equal(ld.fragment.slot_table(), capture(CAP)[f"ld.{mat}.{lay}.{shape}.{et}.table"])


@pytest.mark.parametrize("lay,shape,et", S.store_forms())
def test_store_fragment_equals_onehot_capture(lay, shape, et):
    st = tcemu.ptx(f"wmma.store.d.sync.aligned.{lay}.{shape}.{et}", arch="sm_90")
    np.testing.assert_array_equal(st.fragment.slot_table(), capture(CAP)[f"st.{lay}.{shape}.{et}.table"])


@pytest.mark.parametrize("mat,lay,shape,et", S.load_forms())
def test_load_random_memory_with_stride_and_offset(mat, lay, shape, et):
    """Random bytes, explicit stride above the default, nonzero aligned p: all registers match."""
    z = capture(CAP)
    key = f"ld.{mat}.{lay}.{shape}.{et}"
    p, stride = (int(x) for x in z[key + ".rand_p_stride"])
    ld = tcemu.ptx(f"wmma.load.{mat}.sync.aligned.{lay}.{shape}.global.{et}", arch="sm_90")
    for mem, want in zip(z[key + ".rand_mem"], z[key + ".rand_regs"]):
        regs = ld(tcemu.regfile(ld.nregs), jnp.asarray(mem), dst=range(ld.nregs), p=p, stride=stride)
        np.testing.assert_array_equal(np.asarray(regs), want)


@pytest.mark.parametrize("lay,shape,et", S.store_forms())
def test_store_random_registers_leaves_other_bytes(lay, shape, et):
    """Stores write exactly the matrix: every byte of the region, in and between rows, matches."""
    z = capture(CAP)
    key = f"st.{lay}.{shape}.{et}"
    p, stride = (int(x) for x in z[key + ".rand_p_stride"])
    st = tcemu.ptx(f"wmma.store.d.sync.aligned.{lay}.{shape}.{et}", arch="sm_90")
    for before, regs, after in zip(z[key + ".rand_mem_before"], z[key + ".rand_regs"], z[key + ".rand_mem_after"]):
        mem = st(jnp.asarray(before), jnp.asarray(regs), src=range(st.nregs), p=p, stride=stride)
        np.testing.assert_array_equal(np.asarray(mem), after)


@pytest.mark.parametrize("arch", ["sm_75", "sm_80", "sm_86", "sm_89", "sm_100", "T4", "A100", "L40S", "H100", "B200"])
def test_turing_and_later_share_the_measured_layouts(arch):
    sm = resolve(arch).sm
    for mat, lay, shape, et in S.load_forms():
        if sm < max(S.MIN_SM_FOR_TYPE[et], S.MIN_SM_FOR_SHAPE.get(shape, 0)):
            continue
        sp = f"wmma.load.{mat}.sync.aligned.{lay}.{shape}.{et}"
        assert tcemu.ptx(sp, arch=arch).fragment == tcemu.ptx(sp, arch="sm_90").fragment


@pytest.mark.parametrize("name,nel,mat", [("api_ld_a_row_m16n16k16_f16", 16, "a.row"),
                                          ("api_ld_b_col_m16n16k16_f16", 16, "b.col"),
                                          ("api_ld_c_row_m16n16k16_f32", 8, "c.row")])
def test_cpp_wmma_api_agrees(name, nel, mat):
    """nvcuda::wmma::load_matrix_sync on the H200 gives the same fragment elements (x[i] is half
    i%2 of register i//2 for f16) as the inline-PTX load that tcemu models."""
    z = capture(CAP)
    et = "f32" if mat.startswith("c") else "f16"
    m, lay = mat.split(".")
    ld = tcemu.ptx(f"wmma.load.{m}.sync.aligned.{lay}.m16n16k16.{et}", arch="sm_90")
    for mem, elems in zip(z[name + ".mem"], z[name + ".elems"]):
        regs = np.asarray(ld(tcemu.regfile(ld.nregs), jnp.asarray(mem), dst=range(ld.nregs), p=0))
        if et == "f16":
            mine = np.stack([regs & 0xFFFF, regs >> 16], -1).reshape(32, 16)
        else:
            mine = regs
        np.testing.assert_array_equal(mine, elems)


def test_volta_layouts_match_ptxas_sm70_tables():
    """sm_70 fragments (published description) equal what ptxas 12.4 generates for sm_70."""
    z = capture("wmma_layouts_sm70_ptxas.npz")
    assert len(z) == 24
    for name, table in z.items():
        shape, mat, lay, et = name.split("_")
        if mat == "c":
            sp = f"wmma.load.c.sync.aligned.{lay}.{shape}.{et}"
        else:
            sp = f"wmma.load.{mat}.sync.aligned.{lay}.{shape}.f16"
        frag = tcemu.ptx(sp, arch="sm_70").fragment
        np.testing.assert_array_equal(frag.coords, table)


def test_volta_store_uses_the_accumulator_layout():
    for shape in ("m16n16k16", "m32n8k16", "m8n32k16"):
        for et in ("f16", "f32"):
            for lay in ("row", "col"):
                st = tcemu.ptx(f"wmma.store.d.sync.aligned.{lay}.{shape}.{et}", arch="V100")
                ld = tcemu.ptx(f"wmma.load.c.sync.aligned.{lay}.{shape}.{et}", arch="V100")
                assert st.fragment.coords.tolist() == ld.fragment.coords.tolist()


def test_replication_factors():
    """sm_90 keeps f16 A (m16n16k16) twice, m8n32k16 A and m32n8k16 B four times; Volta the same."""
    for arch in ("sm_90", "sm_70"):
        copies = lambda mat, lay, shape: tcemu.ptx(  # noqa: E731
            f"wmma.load.{mat}.sync.aligned.{lay}.{shape}.f16", arch=arch).fragment.copies
        assert copies("a", "row", "m16n16k16") == 2 and copies("b", "col", "m16n16k16") == 2
        assert copies("a", "row", "m8n32k16") == 4 and copies("b", "row", "m32n8k16") == 4
        assert copies("a", "row", "m32n8k16") == 1 and copies("b", "col", "m8n32k16") == 1
    assert set(wl.SM75) == set(S.FRAGMENT_REGS)
