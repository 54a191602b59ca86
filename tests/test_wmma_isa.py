"""wmma register-file semantics: PTX validation errors, load/store properties (hypothesis), vmap over
warps equals a Python loop, and sharding the warp axis over devices."""
from __future__ import annotations

import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tcemu
from tcemu._src.isa import wmma_spec as S
from conftest import run_on_devices

LD_A = "wmma.load.a.sync.aligned.row.m16n16k16.f16"

BAD_SPELLINGS = [
    ("wmma.load.a.sync.aligned.rows.m16n16k16.f16", "did you mean .row"),
    ("wmma.load.a.sync.aligned.row.m16n16k32.f16", "valid shapes"),
    ("wmma.load.a.sync.aligned.row.m16n16k8.f16", "valid: .tf32"),
    ("wmma.load.a.sync.aligned.row.m16n16k16.f64", "valid: .f16, .bf16, .s8, .u8"),
    ("wmma.load.a.sync.aligned.col.m8n8k32.s4", "must be .row"),
    ("wmma.load.b.sync.aligned.row.m8n8k128.b1", "must be .col"),
    ("wmma.load.c.sync.aligned.row.m8n8k32.f32", "valid: .s32"),
    ("wmma.load.a.aligned.row.m16n16k16.f16", ".sync"),
    ("wmma.load.a.sync.aligned.row.col.m16n16k16.f16", "more than one layout"),
    ("wmma.load.d.sync.aligned.row.m16n16k16.f16", ".a, .b or .c"),
    ("wmma.load.a.sync.aligned.row.m16n16k16.global.shared.f16", "more than one space"),
    ("wmma.store.d.sync.aligned.row.m16n16k16.bf16", "valid D type"),
    ("wmma.store.d.sync.aligned.row.m16n16k8.f16", "valid D type"),
    ("wmma.mma.sync.aligned.row.col.m16n16k16.f32.tf32.tf32.f32", "valid: .m16n16k8"),
    ("wmma.mma.sync.aligned.row.col.m16n16k16.f32.f32.satfinite", "removed in PTX ISA 6.5"),
    ("wmma.mma.sync.aligned.row.col.m16n16k16.rz.f32.f32", "only valid for .f64"),
    ("wmma.mma.sync.aligned.row.col.m16n16k16.s32.s8.u8.s32", "not a valid combination"),
    ("wmma.mma.sync.aligned.row.col.m8n8k128.s32.b1.b1.s32", ".xor.popc or .and.popc"),
    ("wmma.mma.sync.aligned.col.row.m8n8k32.s32.s4.s4.s32", "must be .row.col"),
    ("wmma.mma.sync.aligned.row.m16n16k16.f32.f32", "two layout qualifiers"),
    ("wmma.mma.sync.aligned.row.col.m8n8k4.f32.f32", "valid: .m16n16k16"),
    ("mma.sync.aligned.m16n8k16.row.col.f32.tf32.tf32.f32", "valid for tf32"),
    ("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f16", "not a valid mma.sync type"),
    ("wgmma.mma_async.sync.aligned.m64n8k16.f32.e4m3.e4m3", "K = 32"),
    ("cp.async.ca.shared.global.b16", "unsupported instruction"),
    ("ldmatrix.sync.aligned.m8n8.x3.shared.b16", "valid"),
]


@pytest.mark.parametrize("spelling,message", BAD_SPELLINGS)
def test_bad_spellings_raise_clear_errors(spelling, message):
    with pytest.raises(ValueError, match=message.replace(".", r"\.").replace("(", r"\(")):
        tcemu.ptx(spelling, arch="sm_90")


@pytest.mark.parametrize("spelling,arch,need", [
    ("wmma.load.a.sync.aligned.row.m16n16k16.bf16", "sm_75", "sm_80"),
    ("wmma.load.a.sync.aligned.row.m16n16k8.tf32", "T4", "sm_80"),
    ("wmma.load.c.sync.aligned.row.m8n8k4.f64", "sm_75", "sm_80"),
    ("wmma.load.a.sync.aligned.row.m16n16k16.s8", "V100", "sm_72"),
    ("wmma.load.a.sync.aligned.row.m8n8k32.s4", "sm_70", "sm_75"),
    ("wmma.mma.and.popc.sync.aligned.row.col.m8n8k128.s32.b1.b1.s32", "sm_75", "sm_80"),
    ("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32", "sm_80", "sm_89"),
])
def test_architecture_without_the_instruction(spelling, arch, need):
    with pytest.raises(ValueError, match=need):
        tcemu.ptx(spelling, arch=arch)


def test_unknown_arch():
    with pytest.raises(ValueError, match="did you mean H100"):
        tcemu.ptx(LD_A, arch="H10")


@pytest.mark.parametrize("spelling", [
    "wmma.load.a.sync.row.m16n16k16.f16",  # .aligned implicit before PTX 6.3
    "wmma.load.a.sync.aligned.m16n16k16.row.f16",  # shape before layout (PTX examples)
    "wmma.load.a.sync.aligned.m16n16k16.global.row.f16",
    "wmma.load.a.sync.aligned.row.m16n16k16.shared::cta.f16",
    "wmma.load.a.sync.aligned.row.m16n16k16.shared.f16;",
])
def test_spelling_variants_parse_to_the_same_instruction(spelling):
    assert tcemu.ptx(spelling, arch="sm_90").fragment == tcemu.ptx(LD_A, arch="sm_90").fragment


def test_register_and_address_validation():
    ld = tcemu.ptx(LD_A, arch="sm_90")
    mem, regs = tcemu.memory(4096), tcemu.regfile(10)
    with pytest.raises(ValueError, match="needs 8 registers"):
        ld(regs, mem, dst=range(7), p=0)
    with pytest.raises(ValueError, match=r"out of range 0..9"):
        ld(regs, mem, dst=range(3, 11), p=0)
    with pytest.raises(ValueError, match="names a register twice"):
        ld(regs, mem, dst=[0, 1, 2, 3, 4, 5, 6, 6], p=0)
    with pytest.raises(TypeError, match="uint32"):
        ld(regs.astype(jnp.int32), mem, dst=range(8), p=0)
    with pytest.raises(ValueError, match="use jax.vmap"):
        ld(jnp.zeros((2, 32, 8), jnp.uint32), mem, dst=range(8), p=0)
    with pytest.raises(ValueError, match="multiple of 32 bytes"):
        ld(regs, mem, dst=range(8), p=16)
    with pytest.raises(ValueError, match="below the default 16"):
        ld(regs, mem, dst=range(8), p=0, stride=8)
    with pytest.raises(ValueError, match="multiple of 32 bytes"):
        ld(regs, mem, dst=range(8), p=0, stride=24)
    with pytest.raises(IndexError, match="outside the memory"):
        ld(regs, mem, dst=range(8), p=4096 - 256)
    with pytest.raises(TypeError, match="1-D uint8"):
        ld(regs, jnp.zeros(64, jnp.int32), dst=range(8), p=0)
    mma = tcemu.ptx("wmma.mma.sync.aligned.row.col.m16n16k16.f32.f32", arch="sm_90")
    with pytest.raises(ValueError, match="c= needs 8 registers"):
        mma(tcemu.regfile(40), d=range(0, 8), a=range(8, 16), b=range(16, 24), c=range(24, 28))


def test_traced_address_is_not_checked_but_out_of_range_reads_zero():
    """Under jit, p cannot be checked: bytes outside mem read as 0 (documented), never wrap."""
    ld = tcemu.ptx("wmma.load.c.sync.aligned.row.m16n16k16.f32", arch="sm_90")
    mem = jnp.full((1024,), 0xAB, jnp.uint8)
    regs = jax.jit(lambda p: ld(tcemu.regfile(8), mem, dst=range(8), p=p))(jnp.int32(1024))
    assert not np.asarray(regs).any()


def c_configs():
    return [(lay, shape, et) for shape, mats in S.LOAD_TYPES.items() for et in mats["c"] for lay in ("row", "col")]


@pytest.mark.parametrize("i", range(len(c_configs())), ids=["-".join(c) for c in c_configs()])
def test_store_after_load_is_identity_on_memory(i):
    """Every C/D layout, shape and type once; the address (0..4 alignment units) and the extra
    stride (0..3 alignment units) cycle over the configurations."""
    lay, shape, et = c_configs()[i]
    p_units, extra, seed = i % 5, i // 5 % 4, 1000 + i
    ld = tcemu.ptx(f"wmma.load.c.sync.aligned.{lay}.{shape}.{et}", arch="sm_90")
    st_ = tcemu.ptx(f"wmma.store.d.sync.aligned.{lay}.{shape}.{et}", arch="sm_90")
    align = ld.alignment
    stride = ld.default_stride + extra * align * 8 // S.ELEMENT_BITS[et]
    mem = jnp.asarray(np.random.default_rng(seed).integers(0, 256, 16384, dtype=np.uint8))
    regs = ld(tcemu.regfile(ld.nregs), mem, dst=range(ld.nregs), p=p_units * align, stride=stride)
    out = st_(mem, regs, src=range(ld.nregs), p=p_units * align, stride=stride)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(mem))


def all_load_spellings():
    out = []
    for shape, mats in S.LOAD_TYPES.items():
        for mat, types in mats.items():
            for et in types:
                lay = S.FIXED_LAYOUT.get((shape, mat), "row")
                out.append(f"wmma.load.{mat}.sync.aligned.{lay}.{shape}.{et}")
    return out


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sp=st.sampled_from(all_load_spellings()), seed=st.integers(0, 2 ** 31 - 1))
def test_registers_not_named_in_dst_are_unchanged(sp, seed):
    rng = np.random.default_rng(seed)
    ld = tcemu.ptx(sp, arch="sm_90")
    n = ld.nregs + int(rng.integers(0, 6))
    dst = [int(x) for x in rng.permutation(n)[:ld.nregs]]
    regs = jnp.asarray(rng.integers(0, 2 ** 32, (32, n), dtype=np.uint32))
    mem = jnp.asarray(rng.integers(0, 256, 8192, dtype=np.uint8))
    out = np.asarray(ld(regs, mem, dst=dst, p=0))
    keep = [i for i in range(n) if i not in dst]
    np.testing.assert_array_equal(out[:, keep], np.asarray(regs)[:, keep])


def test_vmap_over_warps_equals_python_loop():
    ld = tcemu.ptx(LD_A, arch="sm_90")
    st_ = tcemu.ptx("wmma.store.d.sync.aligned.col.m16n16k16.f32", arch="sm_90")
    rng = np.random.default_rng(1)
    W = 6
    mem = jnp.asarray(rng.integers(0, 256, 8192, dtype=np.uint8))
    regs = jnp.asarray(rng.integers(0, 2 ** 32, (W, 32, 16), dtype=np.uint32))
    ps = jnp.asarray(rng.integers(0, 64, W) * 32, jnp.int32)
    batched = jax.jit(jax.vmap(lambda r, p: ld(r, mem, dst=range(8), p=p)))(regs, ps)
    mems = jax.vmap(lambda r, p: st_(mem, r, src=range(8, 16), p=p))(regs, ps)
    for w in range(W):
        one = ld(regs[w], mem, dst=range(8), p=int(ps[w]))
        np.testing.assert_array_equal(np.asarray(batched[w]), np.asarray(one))
        np.testing.assert_array_equal(np.asarray(mems[w]), np.asarray(st_(mem, regs[w], src=range(8, 16), p=int(ps[w]))))


SHARD_SCRIPT = textwrap.dedent("""
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    import tcemu
    assert len(jax.devices()) == 8, jax.devices()
    ld = tcemu.ptx("wmma.load.a.sync.aligned.row.m16n16k16.f16", arch="sm_90")
    mma = tcemu.ptx("wmma.mma.sync.aligned.row.col.m16n16k16.f32.f32", arch="sm_90")
    rng = np.random.default_rng(0)
    W = 64
    mem = jnp.asarray(rng.integers(0, 60, 65536, dtype=np.uint8))
    ps = jnp.asarray(rng.integers(0, 1000, W) * 32, jnp.int32)
    def warp(p):
        r = ld(tcemu.regfile(32), mem, dst=range(8), p=p)
        r = ld(r, mem, dst=range(8, 16), p=p + 512)
        return mma(r, d=range(24, 32), a=range(8), b=range(8, 16), c=range(16, 24))
    f = jax.jit(jax.vmap(warp))
    mesh = Mesh(np.array(jax.devices()), ("warps",))
    sharded = f(jax.device_put(ps, NamedSharding(mesh, P("warps"))))
    assert len(sharded.sharding.device_set) == 8, sharded.sharding
    np.testing.assert_array_equal(np.asarray(sharded), np.asarray(f(ps)))
    print("OK")
""")


def test_batch_emulation_shards_over_8_devices():
    r = run_on_devices(SHARD_SCRIPT, 8)
    assert r.returncode == 0 and "OK" in r.stdout, r.stderr[-3000:]
