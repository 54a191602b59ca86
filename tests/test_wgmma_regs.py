"""wgmma at register level without hardware: descriptors (fields, encoding, errors), operands
written and read through descriptors, register level equal to value level, vmap/jit, and the
checks of every argument. The hardware comparison: tests/test_wgmma_regs_hw.py."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import tcemu
from tcemu._src.isa.fragments import fragment_to_matrix, matrix_to_fragment
from tcemu._src.isa.parse import parse

F16 = "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16"
SWIZZLES = ("none", "32B", "64B", "128B")
DTYPES = {"f16": np.float16, "bf16": ml_dtypes.bfloat16, "tf32": np.float32, "e4m3": ml_dtypes.float8_e4m3fn,
          "e5m2": ml_dtypes.float8_e5m2, "s8": np.int8, "u8": np.uint8, "b1": np.uint8}


# ---------------------------------------------------------------------------------------------
# descriptors


@settings(max_examples=200, deadline=None)
@given(st.integers(0, (1 << 14) - 1), st.integers(0, (1 << 14) - 1), st.integers(0, (1 << 14) - 1),
       st.sampled_from(SWIZZLES), st.integers(0, 7))
def test_descriptor_round_trip(start, lbo, sbo, swizzle, base):
    d = tcemu.WgmmaDescriptor(16 * start, 16 * lbo, 16 * sbo, swizzle, base)
    v = d.encode()
    assert 0 <= v < 1 << 64 and tcemu.WgmmaDescriptor.decode(v) == d
    assert v == tcemu.wgmma_descriptor(16 * start, 16 * lbo, 16 * sbo, swizzle, base)
    # the PTX ISA's fields, read independently: (x & 0x3FFFF) >> 4 at bits 0, 16, 32
    assert (v & 0x3FFF, (v >> 16) & 0x3FFF, (v >> 32) & 0x3FFF, (v >> 49) & 7) == (start, lbo, sbo, base)
    assert v >> 62 == {"none": 0, "128B": 1, "64B": 2, "32B": 3}[swizzle]


@pytest.mark.parametrize("kw,msg", [
    (dict(start=8), "start must be a multiple of 16"), (dict(lbo=1 << 18), "lbo must be a multiple of 16"),
    (dict(sbo=-16), "sbo must be a multiple of 16"), (dict(start=1.5), "start must be an integer"),
    (dict(swizzle="256B"), "swizzle must be one of"), (dict(base_offset=8), "base_offset must be an integer 0..7")])
def test_descriptor_fields_checked(kw, msg):
    args = dict(start=0, lbo=0, sbo=0) | kw
    with pytest.raises((ValueError, TypeError), match=msg):
        tcemu.WgmmaDescriptor(**args)


@pytest.mark.parametrize("desc,err,msg", [
    (1 << 14, ValueError, "lie outside its fields"), (1 << 60, ValueError, "lie outside its fields"),
    (-1, ValueError, "64-bit unsigned"), (1 << 64, ValueError, "64-bit unsigned"),
    (1.0, TypeError, "concrete integer"), (jnp.zeros(2, jnp.uint32), TypeError, "cannot be traced")])
def test_descriptor_decode_checked(desc, err, msg):
    with pytest.raises(err, match=msg):
        tcemu.WgmmaDescriptor.decode(desc)


@pytest.mark.parametrize("etype", list(DTYPES))
@pytest.mark.parametrize("swizzle", SWIZZLES)
def test_put_get_round_trip(etype, swizzle):
    """An operand written through a descriptor reads back equal, and the 16 bytes of every
    swizzled unit stay together (the swizzle permutes whole units)."""
    rng = np.random.default_rng(1)
    k = {"f16": 16, "bf16": 16, "tf32": 8, "b1": 256}.get(etype, 32)
    for operand, tnsp in [("a", 0), ("b", 0)] + ([("b", 1), ("a", 1)] if etype in ("f16", "bf16") else []):
        shape = (64, k) if operand == "a" else (k, 24)
        if etype in ("s8", "u8", "b1"):
            x = rng.integers(0, 2 if etype == "b1" else 256, shape).astype(DTYPES[etype])
        else:
            x = rng.standard_normal(shape).astype(np.float32).astype(DTYPES[etype])
        lbo, sbo = {(0, True): (128, 256), (0, False): (16, 1024), (1, True): (1024, 128),
                    (1, False): (2048, 1024)}[tnsp, swizzle == "none"]  # a canonical tile: no byte twice
        desc = tcemu.WgmmaDescriptor(start=2048 + 128, lbo=lbo, sbo=sbo, swizzle=swizzle, base_offset=1)
        smem = desc.put(tcemu.memory(16384), x, etype, operand=operand, tnsp=tnsp)
        got = np.asarray(desc.get(smem, etype, operand=operand, n=24, tnsp=tnsp))
        assert np.array_equal(got.view(np.uint8), np.asarray(x).view(np.uint8)), (operand, tnsp)


def test_put_get_checked():
    desc = tcemu.WgmmaDescriptor(0, 128, 256)
    x = np.zeros((16, 8), np.float16)
    with pytest.raises(ValueError, match="operand must be 'a' or 'b'"):
        desc.put(tcemu.memory(4096), x, "f16", operand="c")
    with pytest.raises(ValueError, match="must have shape"):
        desc.put(tcemu.memory(4096), x, "f16", operand="a")
    with pytest.raises(ValueError, match="tnsp must be 0, or 1 with f16/bf16"):
        desc.put(tcemu.memory(4096), np.zeros((32, 8), np.uint8), "u8", operand="b", tnsp=1)
    with pytest.raises(IndexError, match="outside the shared memory of 64 bytes"):
        desc.put(tcemu.memory(64), x, "f16", operand="b")
    with pytest.raises(ValueError, match="B needs N"):
        desc.get(tcemu.memory(4096), "f16", operand="b")


# ---------------------------------------------------------------------------------------------
# register level == value level


def _typed(rng, etype, shape):
    if etype in ("s8", "u8", "b1"):
        lo, hi = {"s8": (-128, 128), "u8": (0, 256), "b1": (0, 2)}[etype]
        return rng.integers(lo, hi, shape).astype(DTYPES[etype])
    return (rng.standard_normal(shape) * 2.0 ** rng.integers(-6, 6, shape)).astype(np.float32).astype(DTYPES[etype])


FORMS = [  # spelling, A in registers?, tnsp_a, tnsp_b, imm_scale_a, imm_scale_b, swizzle of B
    ("wgmma.mma_async.sync.aligned.m64n24k16.f16.f16.f16", False, 1, 1, -1, 1, "64B"),
    ("wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16", True, 0, 1, 1, -1, "128B"),
    ("wgmma.mma_async.sync.aligned.m64n8k8.f32.tf32.tf32", True, 0, 0, -1, -1, "32B"),
    ("wgmma.mma_async.sync.aligned.m64n40k32.f16.e4m3.e5m2", False, 0, 0, 1, 1, "none"),
    ("wgmma.mma_async.sync.aligned.m64n48k32.satfinite.s32.s8.u8", True, 0, 0, 1, 1, "128B"),
    ("wgmma.mma_async.sync.aligned.m64n16k256.s32.b1.b1.and.popc", False, 0, 0, 1, 1, "64B"),
]


@pytest.mark.parametrize("form", FORMS, ids=[f[0].split("aligned.")[1] for f in FORMS])
def test_register_level_equals_value_level(form):
    sp, a_regs, ta, tb, sa, sb, swz = form
    ins = parse(sp)
    wg = tcemu.ptx(sp, arch="H100")
    rng = np.random.default_rng(7)
    a, b = _typed(rng, ins.atype, (64, ins.k)), _typed(rng, ins.btype, (ins.k, ins.n))
    c = (rng.integers(-1000, 1000, (64, ins.n)).astype(np.int32) if ins.dtype == "s32"
         else rng.standard_normal((64, ins.n)).astype(DTYPES.get(ins.dtype, np.float32)))
    a_desc = tcemu.WgmmaDescriptor(0, 2048, 256 if not ta else 1024, "none" if not ta else "128B")
    b_desc = tcemu.WgmmaDescriptor(8192, 1024, 2048, swz, 0)
    smem = b_desc.put(tcemu.memory(32768), b, ins.btype, operand="b", tnsp=tb)
    nd = wg.fd.nregs
    regs = np.zeros((128, 4 + nd), np.uint32)
    regs[:, 4:] = np.asarray(matrix_to_fragment(jnp.asarray(np.asarray(c).view(
        {2: np.uint16, 4: np.uint32}[np.asarray(c).itemsize]).astype(np.uint32)), wg.fd))
    if a_regs:
        from tcemu._src import formats as fm

        abits = np.asarray(fm.to_bits(a, ins.atype)).astype(np.uint32) & np.uint32((1 << wg.fa.bits) - 1 & 0xFFFFFFFF)
        regs[:, :4] = np.asarray(matrix_to_fragment(jnp.asarray(abits), wg.fa))
        kw = dict(a=range(4))
    else:
        smem = a_desc.put(smem, a, ins.atype, operand="a", tnsp=ta)
        kw = dict(a_desc=a_desc.encode(), tnsp_a=ta)
    if ins.atype in ("f16", "bf16"):
        kw["tnsp_b"] = tb
    if ins.dtype != "s32":
        kw.update(imm_scale_a=sa, imm_scale_b=sb)
    for scale_d in (1, 0):
        out = wg(jnp.asarray(regs), smem, d=range(4, 4 + nd), b_desc=b_desc.encode(), scale_d=scale_d, **kw)
        got = np.asarray(fragment_to_matrix(out[:, 4:], wg.fd))
        neg = lambda x, s: x if s == 1 else -x  # noqa: E731
        cc = c if scale_d else np.zeros_like(c)
        want = tcemu.mma(sp, neg(a, sa), neg(b, sb), cc, arch="H100")
        want = np.asarray(want).view({2: np.uint16, 4: np.uint32}[np.asarray(want).itemsize])
        assert np.array_equal(got, want.astype(np.uint32)), (sp, scale_d)


def test_vmap_over_warpgroups_and_traced_scale_d():
    wg = tcemu.ptx(F16, arch="H100")
    desc = tcemu.WgmmaDescriptor(0, 128, 256)
    rng = np.random.default_rng(3)
    bs = [_typed(rng, "f16", (16, 16)) for _ in range(3)]
    smems = jnp.stack([desc.put(tcemu.memory(2048), b, "f16", operand="b") for b in bs])
    a = _typed(rng, "f16", (64, 16))
    regs = np.zeros((128, 12), np.uint32)
    regs[:, :4] = np.asarray(matrix_to_fragment(jnp.asarray(a.view(np.uint16).astype(np.uint32)), wg.fa))
    regs = jnp.broadcast_to(jnp.asarray(regs), (3, 128, 12))
    run = jax.jit(jax.vmap(lambda r, m, s: wg(r, m, d=range(4, 12), a=range(4), b_desc=desc.encode(), scale_d=s)))
    out = run(regs, smems, jnp.array([1, 0, 1]))
    for i, b in enumerate(bs):
        want = tcemu.mma(F16, a, b, np.zeros((64, 16), np.float32), arch="H100")
        assert np.array_equal(np.asarray(fragment_to_matrix(out[i, :, 4:], wg.fd)).view(np.float32), np.asarray(want))


# ---------------------------------------------------------------------------------------------
# argument checks


def _call(**kw):
    wg = tcemu.ptx(F16, arch="H100")
    args = dict(regs=tcemu.regfile(12, lanes=128), smem=tcemu.memory(4096), d=range(4, 12),
                b_desc=tcemu.wgmma_descriptor(0, 128, 256), a=range(4)) | kw
    regs, smem = args.pop("regs"), args.pop("smem")
    return wg(regs, smem, **args)


@pytest.mark.parametrize("kw,err,msg", [
    (dict(a_desc=0), ValueError, "not both or neither"), (dict(a=None), ValueError, "not both or neither"),
    (dict(imm_scale_a=2), ValueError, "imm_scale_a must be 1 or -1"),
    (dict(tnsp_a=1), ValueError, "tnsp_a must be 0"), (dict(tnsp_b=2), ValueError, "tnsp_b must be 0 or 1"),
    (dict(scale_d=2), ValueError, "scale_d must be 0 or 1"), (dict(d=range(4)), ValueError, "d= needs 8 registers"),
    (dict(regs=tcemu.regfile(12)), ValueError, r"shape \(128, nregs\)"),
    (dict(smem=tcemu.memory(64)), IndexError, "outside the shared memory of 64 bytes"),
    (dict(b_desc=jnp.uint32(0)), TypeError, "cannot be traced"),
    (dict(b_desc=1 << 15), ValueError, "lie outside its fields")])
def test_wgmma_arguments_checked(kw, err, msg):
    with pytest.raises(err, match=msg):
        _call(**kw)


def test_integer_and_tf32_forms_refuse_float_only_immediates():
    s8 = tcemu.ptx("wgmma.mma_async.sync.aligned.m64n8k32.s32.s8.s8", arch="H100")
    with pytest.raises(ValueError, match="imm_scale_a must be 1,"):
        s8(tcemu.regfile(8, lanes=128), tcemu.memory(4096), d=range(4, 8), a=range(4), b_desc=0, imm_scale_a=-1)
    tf32 = tcemu.ptx("wgmma.mma_async.sync.aligned.m64n8k8.f32.tf32.tf32", arch="H100")
    with pytest.raises(ValueError, match="tnsp_b must be 0,"):
        tf32(tcemu.regfile(8, lanes=128), tcemu.memory(4096), d=range(4, 8), a=range(4), b_desc=0, tnsp_b=1)


BAD_SPELLINGS = [  # (spelling, arch, message)
    (F16, "A100", "exists only on sm_90"),
    ("wgmma.mma_async.sync.aligned.m64n40k32.s32.s8.s8", "H100", "N = 8, 16, 24 or a multiple of 16"),
    ("wgmma.mma_async.sync.aligned.m64n8k256.s32.b1.b1", "H100", "needs .and.popc"),
    ("wgmma.mma_async.sync.aligned.m64n8k16.satfinite.f32.f16.f16", "H100", ".satfinite is valid only with .s8/.u8"),
    ("wgmma.mma_async.sync.aligned.m64n8k16.f16.bf16.bf16", "H100", "valid: f32$"),
    ("wgmma.mma_async.sp.sync.aligned.m64n8k32.f32.f16.f16", "A100", "exists only on sm_90"),
    ("wgmma.mma_async.sp.sync.aligned.m64n8k16.f32.f16.f16", "H100", "not a wgmma.mma_async.sp shape for .f16 .K = 32"),
    ("wgmma.mma_async.sp.sync.aligned.m64n40k64.s32.s8.s8", "H100", "N = 8, 16, 24 or a multiple of 16"),
    ("wgmma.mma_async.sp.sync.aligned.m64n8k32.f16.bf16.bf16", "H100", "not a valid wgmma.mma_async.sp type"),
    ("wgmma.mma_async.sp.sync.aligned.m64n8k16.satfinite.f32.tf32.tf32", "H100", ".satfinite is valid only"),
    ("wgmma.mma_async.sp.sync.aligned.m64n8k512.s32.b1.b1.and.popc", "H100", "unknown qualifier .b1"),
    ("wgmma.arrive.sync.aligned", "H100", "unsupported wgmma instruction")]


@pytest.mark.parametrize("spelling,arch,msg", BAD_SPELLINGS)
def test_parse_and_arch_checked(spelling, arch, msg):
    with pytest.raises(ValueError, match=msg):
        tcemu.ptx(spelling, arch=arch)


def test_regfile_lanes_checked():
    with pytest.raises(ValueError, match="regfile: lanes must be 32"):
        tcemu.regfile(4, lanes=48)


def test_ordering_instructions():
    regs = tcemu.regfile(4, lanes=128) + 7
    fence, commit, wait = (tcemu.ptx(f"wgmma.{op}.sync.aligned", arch="H100")
                           for op in ("fence", "commit_group", "wait_group"))
    assert np.array_equal(wait(commit(fence(regs)), 1), regs)
    with pytest.raises(ValueError, match="n .* must be an integer >= 0"):
        wait(regs, -1)
    with pytest.raises(TypeError, match="takes no operand"):
        fence(regs, 0)
    with pytest.raises(ValueError, match="needs .sync.aligned"):
        tcemu.ptx("wgmma.fence", arch="H100")
    with pytest.raises(ValueError, match="exists only on sm_90"):
        tcemu.ptx("wgmma.fence.sync.aligned", arch="B200")
