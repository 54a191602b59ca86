"""AMD MFMA register layouts (tcemu/_src/layouts/mfma.py) against AMD's Matrix Instruction
Calculator: every element of A, B, C and D of every dense MFMA of gfx908, gfx90a and gfx942, with
every legal CBSZ/ABID on A and BLGP on B (tests/data/mfma_layouts_calculator.npz, written by
experiments/amd_calculator/generate_layouts.py; 1223 layouts, 340544 elements)."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import DATA
from tcemu._src.layouts import mfma as L

ALL = [(s, a) for a in L.ARCHS for s in L.SPELLINGS[a]]


@functools.lru_cache(maxsize=None)
def _calculator():
    z = np.load(DATA / "mfma_layouts_calculator.npz")
    out = {}
    for key, shape, start in zip(z["keys"], z["shape"], z["start"]):
        arch, name, matrix, cbsz, abid, blgp = key.split()
        n = int(np.prod(shape))
        loc = z["loc"][start:start + n].astype(np.int64).reshape(*shape, 3)
        out[(arch, name, matrix, int(cbsz), int(abid), int(blgp))] = loc
    return out


def _by_instruction():
    groups = {}
    for key in _calculator():
        groups.setdefault(key[:2], []).append(key)
    return groups


def test_data_covers_every_instruction():
    calc = _calculator()
    assert len(calc) == 1223 and sum(v[..., 0].size for v in calc.values()) == 340544
    for arch in L.ARCHS:
        names = {k[1] for k in calc if k[0] == arch}
        assert {L.mfma(n, arch).spelling for n in names} == set(L.SPELLINGS[arch])
        assert len(names) == len(L.SPELLINGS[arch]) == {"gfx908": 20, "gfx90a": 27, "gfx942": 32}[arch]


@pytest.mark.parametrize("arch,name", sorted(_by_instruction()))
def test_layout_matches_calculator(arch, name):
    """locate, element and unpack of every layout (with modifiers) equal the calculator's."""
    ins = L.mfma(name, arch)
    for key in _by_instruction()[(arch, name)]:
        _, _, matrix, cbsz, abid, blgp = key
        want = _calculator()[key]
        assert ins.shape(matrix) == want.shape[:3], key
        got = np.stack(L.locate(ins, matrix, *np.indices(want.shape[:3]), cbsz=cbsz, abid=abid, blgp=blgp), -1)
        np.testing.assert_array_equal(got, want, err_msg=str(key))
        # what unpack reads from registers tagged by (lane, VGPR, field) is the calculator's slot
        bits, nregs = ins.bits(matrix), ins.nregs(matrix)
        lane, reg, bit = np.moveaxis(want, -1, 0)
        if (cbsz, abid, blgp) == (0, 0, 0):
            assert nregs == reg.max() + (2 if bits == 64 else 1), key
            np.testing.assert_array_equal(np.stack(L.element(ins, matrix, lane, reg, bit), -1),
                                          np.moveaxis(np.indices(want.shape[:3]), 0, -1), err_msg=str(key))
        words = np.random.default_rng(len(key[1]) + 8 * cbsz + abid + 64 * blgp).integers(
            0, 1 << 32, (64, nregs), dtype=np.uint32)
        got = np.asarray(L.unpack(ins, matrix, jnp.asarray(words), cbsz=cbsz, abid=abid, blgp=blgp))
        if bits == 64:
            want_bits = np.stack([words[lane, reg], words[lane, reg + 1]], -1)
        else:
            want_bits = (words[lane, reg] >> bit.astype(np.uint32)) & np.uint32((1 << bits) - 1 if bits < 32 else 0xFFFFFFFF)
        np.testing.assert_array_equal(got, want_bits, err_msg=str(key))
        if (cbsz, abid, blgp) == (0, 0, 0):  # pack puts every element where the calculator says
            packed = np.asarray(L.pack(ins, matrix, jnp.asarray(want_bits)))
            np.testing.assert_array_equal(packed, words, err_msg=str(key))


@pytest.mark.parametrize("arch", L.ARCHS)
def test_every_element_exactly_once(arch):
    """Without modifiers every (lane, VGPR, bit field) of an operand holds exactly one element."""
    for name in L.SPELLINGS[arch]:
        ins = L.mfma(name, arch)
        for matrix in "abcd":
            bits, nregs = ins.bits(matrix), ins.nregs(matrix)
            lane, reg, bit = (x.ravel() for x in L.locate(ins, matrix, *np.indices(ins.shape(matrix))))
            slot = (lane * nregs + reg) * (32 // min(bits, 32)) + bit // min(bits, 32)
            assert np.array_equal(np.sort(slot), np.arange(0, 64 * nregs * 32 // min(bits, 32),
                                                           2 if bits == 64 else 1)), (name, matrix)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(ALL), st.sampled_from("abcd"), st.integers(0, 2**32 - 1))
def test_pack_unpack_round_trip(spelling_arch, matrix, seed):
    ins = L.mfma(*spelling_arch)
    rng = np.random.default_rng(seed)
    words = jnp.asarray(rng.integers(0, 1 << 32, (64, ins.nregs(matrix)), dtype=np.uint32))
    x = L.unpack(ins, matrix, words)
    assert x.dtype == jnp.uint32 and np.array_equal(L.pack(ins, matrix, x), words)
    assert np.array_equal(L.unpack(ins, matrix, L.pack(ins, matrix, x)), x)


def test_jit():
    ins = L.mfma("v_mfma_f32_16x16x32_fp8_bf8", "MI300X")
    x = jnp.asarray(np.random.default_rng(1).integers(0, 256, ins.shape("b"), dtype=np.uint32))
    words = jax.jit(functools.partial(L.pack, ins, "b"))(x)
    assert np.array_equal(jax.jit(functools.partial(L.unpack, ins, "b", blgp=0))(words), x)


def test_spellings_and_modifiers():
    assert L.mfma("v_mfma_f32_32x32x4bf16_1k", "gfx90a") == L.mfma("v_mfma_f32_32x32x4_2b_bf16", "MI250X")
    assert L.mfma("v_mfma_f32_32x32x4bf16", "gfx908").spelling == "v_mfma_f32_32x32x4_bf16"
    assert L.mfma("v_mfma_f64_4x4x4_4b_f64", "gfx942").blgp == "negate"
    with pytest.raises(ValueError, match="not an MFMA of gfx942"):
        L.mfma("v_mfma_f32_32x32x4bf16", "gfx942")  # CDNA1/2's single-block bf16 is gone on CDNA3
    with pytest.raises(ValueError, match="not an MFMA of gfx908"):
        L.mfma("v_mfma_f64_16x16x4_f64", "MI100")
    with pytest.raises(ValueError, match="unknown AMD architecture"):
        L.mfma("v_mfma_f32_32x32x8_f16", "sm_90")
    ins = L.mfma("v_mfma_f32_32x32x8_f16", "gfx942")
    with pytest.raises(ValueError, match="takes no CBSZ"):
        L.locate(ins, "a", 0, 0, 0, cbsz=1)
    with pytest.raises(ValueError, match="takes no BLGP"):
        L.unpack(ins, "b", jnp.zeros((64, 2), jnp.uint32), blgp=1)
    ins = L.mfma("v_mfma_f32_4x4x4_16b_f16", "gfx942")
    with pytest.raises(ValueError, match="abid 0"):
        L.locate(ins, "a", 0, 0, 0, cbsz=2, abid=4)
    with pytest.raises(ValueError, match="uint32"):
        L.pack(ins, "a", jnp.zeros((16, 4, 4), jnp.int32))
    with pytest.raises(IndexError):
        L.element(ins, "c", 64, 0)


def test_mfma_view_text_matches_calculator():
    """The `layout` table of an MFMA (tcemu._src.draw.mfma_view) names the calculator's lane/VGPR."""
    from tcemu._src import draw

    want = _calculator()[("gfx90a", "v_mfma_f32_16x16x4bf16_1k", "b", 0, 0, 0)]  # (4 blocks, K 4, N 16)
    frag, title, header = draw.mfma_view("v_mfma_f32_16x16x4bf16_1k", "MI210", "b")
    assert title == "v_mfma_f32_16x16x4_4b_bf16 [b] on gfx90a" and "4 blocks" in header
    rows = draw.fragment_text(frag, names=("L", "v")).splitlines()[1:]
    for b, k, j in np.ndindex(want.shape[:3]):
        lane, reg, bit = want[b, k, j]
        assert rows[k].split()[1 + 16 * b + j] == f"L{lane}:v{reg}.{bit // 16}"
