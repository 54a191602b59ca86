"""The compiled kernels (tcemu/_src/native) against the pure-JAX engine they replace: the same
GEMM bits for every instruction family, K schedule, model option and special value they cover.
On the CPU backend this tests blockfma.cc; on a CUDA backend (with nvcc) blockfma_gpu.cu, which
runs GEMMs only (the single-MMA tests are skipped there).

The pure-JAX path is itself checked against hardware captures and exact arithmetic elsewhere
(test_gemm, test_library, test_engine_exact); with the kernel on, those tests also run through it.
"""
from __future__ import annotations

import shutil

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import tcemu
from tcemu._src import formats as fm
from tcemu._src import gemm, native
from tcemu._src.gemm.execute import kernel_of
from tcemu._src.gemm.plan import scale_unit
from tcemu._src.numerics.backends import _KERNELS
from tcemu._src.arch import resolve
from tcemu._src.native import build
from tcemu._src.numerics import mma as mma_numerics

_CPU = jax.default_backend() == "cpu"
pytestmark = [pytest.mark.skipif(not (shutil.which("c++") if _CPU else native._gpu() and native._nvcc()),
                                 reason="no compiler for this backend's kernel (c++ on CPUs, nvcc on CUDA GPUs)")]
cpu_only = pytest.mark.skipif(not _CPU, reason="the GPU kernel runs GEMMs only")

H100_F16 = "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16"
H100_BF16 = "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"
H100_TF32 = "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32"
H100_E4M3 = "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3"
H100_E5M2 = "wgmma.mma_async.sync.aligned.m64n128k32.f32.e5m2.e4m3"
WMMA_F16 = "wmma.mma.sync.aligned.row.col.m16n16k16.f32.f32"
SM89_E4M3 = "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e5m2.f32"
SM120 = "mma.sync.aligned.m16n8k32.row.col.kind::f8f6f4.f32.{}.{}.f32"
SM120_MX = "mma.sync.aligned.m16n8k32.row.col.kind::mxf8f6f4.block_scale.scale_vec::1X.f32.e4m3.e2m1.f32.ue8m0"


def _bits(rng, shape, etype, spread=4, specials=0):
    """Bit patterns of random values of ``etype``: normal values times 2**U(-spread, spread)
    (subnormals and zeros included), and ``specials`` NaN/inf/huge elements at random places."""
    fmt = fm.FORMATS[etype]
    if etype in ("e3m2", "e2m3", "e2m1"):  # every code is a finite value
        bits = rng.integers(0, 1 << (1 + fmt.exponent_bits + fmt.fraction_bits), shape).astype(np.uint32)
    else:
        x = rng.standard_normal(shape) * np.exp2(rng.integers(-spread, spread + 1, shape))
        x[rng.random(shape) < 0.05] = 0.0
        if etype == "tf32":
            bits = x.astype(np.float32).view(np.uint32) & np.uint32(0xFFFFE000)
        else:
            with np.errstate(over="ignore"):  # values beyond the format's range become infinities
                x = x.astype(fm.VALUE_DTYPES[etype])
            bits = np.asarray(fm.to_bits(jnp.asarray(x), etype)).astype(np.uint32)
    if specials:
        flat = bits.reshape(-1)
        where = rng.choice(flat.size, specials, replace=False)
        top = (1 << fmt.exponent_bits) - 1
        inf = (top << fmt.fraction_bits) << fmt.shift
        pool = [inf, inf | (1 << fmt.shift), inf | ((1 << fmt.fraction_bits) - 1) << fmt.shift,
                ((top - 1) << fmt.fraction_bits | ((1 << fmt.fraction_bits) - 1)) << fmt.shift]
        flat[where] = rng.choice(pool, specials) | (rng.integers(0, 2, specials) * (fmt.sign_bit))
    return jnp.asarray(bits)


@pytest.fixture(autouse=True)
def _reread_native():
    """TCEMU_NATIVE is read once per process: the tests that set it read it again (:func:`_native`),
    and the next test reads the session's."""
    yield
    build._setting.cache_clear()


def _native(monkeypatch, setting: str):
    monkeypatch.setenv("TCEMU_NATIVE", setting)
    build._setting.cache_clear()


def _run(monkeypatch, a, b, cfg, setting, scales=None):
    _native(monkeypatch, setting)
    fmt = []

    def f(a, b, s):
        out, f = gemm.gemm_bits(a, b, cfg, scales=s)
        fmt.append(f)
        return out

    return np.asarray(jax.jit(f)(a, b, scales)), fmt[0]


def _model(cfg):
    return mma_numerics.resolve_model(cfg.ins, cfg.model, resolve(cfg.arch))


def _tiled(a, b):
    """A and B repeated to at least 128 x 128 outputs: the GPU kernel's large tiles (its 1 x 1
    kernel runs below 16384 outputs) see every row and column of the originals."""
    return np.tile(a, (-(-128 // a.shape[0]), 1)), np.tile(b, (1, -(-128 // b.shape[1])))


def _check(monkeypatch, cfg, a, b, scales=None):
    """gemm_bits on the kernel against gemm_bits on the engine: same bits, same format."""
    _native(monkeypatch, "1")
    assert kernel_of(cfg) is not None, "the kernel must cover this case"
    got, f1 = _run(monkeypatch, a, b, cfg, "1", scales)
    want, f0 = _run(monkeypatch, a, b, cfg, "0", scales)
    assert f1 is f0
    np.testing.assert_array_equal(got, want)
    return got


def test_kernel_builds_here():
    """Where the backend's compiler exists, its kernel builds and registers."""
    assert native.available() if _CPU else native.available_gpu()


FAMILIES = [("H100", H100_F16, "f16", "f16"), ("H100", H100_BF16, "bf16", "bf16"),
            ("H100", H100_TF32, "tf32", "tf32"), ("H100", H100_E4M3, "e4m3", "e4m3"),
            ("H100", H100_E5M2, "e5m2", "e4m3"), ("H100", WMMA_F16, "f16", "f16"),
            ("V100", WMMA_F16, "f16", "f16"), ("A100", H100_BF16, "bf16", "bf16"),
            ("A100", H100_TF32, "tf32", "tf32"), ("sm_89", SM89_E4M3, "e4m3", "e5m2"),
            ("sm_120", SM120.format("e2m1", "e3m2"), "e2m1", "e3m2"),
            ("sm_120", SM120.format("e2m3", "e4m3"), "e2m3", "e4m3"),
            ("sm_120", SM120.format("e5m2", "e2m1"), "e5m2", "e2m1")]


@pytest.mark.parametrize("arch,ins,at,bt", FAMILIES, ids=[f"{f[0]}-{f[1].split('.')[-3]}{i}" for i, f in
                                                          enumerate(FAMILIES)])
def test_families_equal_engine(monkeypatch, arch, ins, at, bt):
    rng = np.random.default_rng(len(ins) + len(arch))
    cfg = tcemu.GemmConfig(arch=arch, instruction=ins)
    _check(monkeypatch, cfg, _bits(rng, (37, 96), at), _bits(rng, (96, 21), bt))


SCHEDULES = [dict(k_order="split_k", split_k=3), dict(k_order="promotion", promotion_interval=64),
             dict(k_order="pairwise"),
             dict(schedule=tcemu.KSchedule(k_tile=64, residue="first")),
             dict(schedule=tcemu.KSchedule(k_tile=64, residue="first", slices=2, reduction="pairwise",
                                           partials="bf16"))]


@pytest.mark.parametrize("sched", SCHEDULES, ids=lambda s: str(s.get("k_order") or "kschedule"))
@pytest.mark.parametrize("ins,t", [(H100_F16, "f16"), (H100_BF16, "bf16")])
def test_schedules_equal_engine(monkeypatch, sched, ins, t):
    rng = np.random.default_rng(7)
    cfg = tcemu.GemmConfig(arch="H100", instruction=ins, **sched)
    _check(monkeypatch, cfg, _bits(rng, (20, 500), t), _bits(rng, (500, 33), t))


MODELS = [dict(rounding=r) for r in ("rne", "rna", "ru", "rd")] + [
    dict(overflow="ieee", rounding="rz"), dict(overflow="ieee", rounding="ru"),
    dict(subnormal_outputs=False), dict(subnormal_inputs=False), dict(accumulator_fraction_bits=13),
    dict(min_exponent=-20), dict(zero_exponent=None), dict(zero_exponent=-60, fraction_bits=24),
    dict(block_size=8, fraction_bits=23), dict(block_order=(1, 0, 3, 2))]


@pytest.mark.parametrize("changes", MODELS, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_model_options_equal_engine(monkeypatch, changes):
    """Every option the kernel reads, alternately on bf16 (wide exponents: tiny sums, zero
    products below the zero exponent, overflow to infinity) and fp16 (the float32 fast path)."""
    rng = np.random.default_rng(11)
    paths = ((H100_BF16, "bf16", 70), (H100_F16, "f16", 10))
    for ins, t, spread in paths[:1] if MODELS.index(changes) % 2 else paths[1:]:
        model = tcemu.numerics("H100").for_instruction(tcemu.GemmConfig(instruction=ins).ins).replace(**changes)
        cfg = tcemu.GemmConfig(arch="H100", instruction=ins, model=model)
        _check(monkeypatch, cfg, _bits(rng, (24, 64), t, spread), _bits(rng, (64, 40), t, spread))


@pytest.mark.parametrize("ins,t", [(H100_F16, "f16"), (H100_BF16, "bf16"), (H100_E4M3, "e4m3")])
def test_special_values_equal_engine(monkeypatch, ins, t):
    """NaN, infinities and the largest finite values: the kernel's special-value path (NaN
    products, inf * 0, infinities of both signs, an infinite accumulator carried along)."""
    rng = np.random.default_rng(3)
    cfg = tcemu.GemmConfig(arch="H100", instruction=ins)
    a, b = _bits(rng, (16, 64), t, specials=3), _bits(rng, (64, 32), t, specials=3)
    got = _check(monkeypatch, cfg, a, b).view(np.float32)
    assert np.isnan(got).any() and np.isfinite(got).any()
    assert np.isinf(got).any() == fm.FORMATS[t].has_inf  # e4m3 has no infinity


def test_overflow_and_cancellation_equal_engine(monkeypatch):
    """Sums that overflow binary32 mid-chain, and rows that cancel exactly (zeros and signs)."""
    rng = np.random.default_rng(5)
    big = np.full((8, 64), 3e38, np.float32)
    big[:, 1::2] *= -1
    big[4:] = rng.standard_normal((4, 64)).astype(np.float32)
    a = fm.to_bits(jnp.asarray(big.astype(ml_dtypes.bfloat16)), "bf16")
    bmat = np.ones((64, 16), np.float32)
    bmat[:, 8:] = np.sign(rng.standard_normal((64, 8)))
    b = fm.to_bits(jnp.asarray(bmat.astype(ml_dtypes.bfloat16)), "bf16")
    _check(monkeypatch, tcemu.GemmConfig(arch="H100", instruction=H100_BF16), a, b)


def test_block_scaled_equal_engine(monkeypatch):
    """kind::mxf8f6f4: ue8m0 exponents added to the products, including extreme and NaN scales."""
    rng = np.random.default_rng(9)
    cfg = tcemu.GemmConfig(arch="sm_120", instruction=SM120_MX)
    a, b = _bits(rng, (16, 128), "e4m3"), _bits(rng, (128, 24), "e2m1")
    sa = jnp.asarray(rng.integers(100, 160, (16, 4)).astype(np.uint32))
    sb = jnp.asarray(rng.integers(0, 255, (4, 24)).astype(np.uint32))
    _check(monkeypatch, cfg, a, b, (sa, sb))
    _check(monkeypatch, cfg, a, b, (sa.at[3, 1].set(255), sb))


MX_SCHEDULES = [dict(), dict(schedule=tcemu.KSchedule(k_tile=64, residue="first", slices=2)),
                dict(schedule=tcemu.KSchedule(k_tile=128, residue="first", slices=3, slice_align=32))]


@pytest.mark.parametrize("sched", MX_SCHEDULES, ids=lambda s: s["schedule"].describe() if s else "one chain")
def test_block_scaled_schedules_equal_engine(monkeypatch, sched):
    """kind::mxf8f6f4 GEMMs under K schedules (residue first, slices): the CPU kernel reads one
    exponent per 32-element scale block (gemm.plan.scale_unit), a NaN scale included."""
    rng = np.random.default_rng(37)
    K = 224
    cfg = tcemu.GemmConfig(arch="sm_120", instruction=SM120_MX, **sched)
    assert scale_unit(cfg.k_schedule.plan(K, cfg.ins.k), cfg.ins.k, 32, None) == 32
    a, b = _bits(rng, (20, K), "e4m3"), _bits(rng, (K, 40), "e2m1")
    sa = jnp.asarray(rng.integers(110, 150, (20, K // 32)).astype(np.uint32))
    sb = jnp.asarray(rng.integers(100, 160, (K // 32, 40)).astype(np.uint32))
    _check(monkeypatch, cfg, a, b, (sa, sb.at[2, 5].set(255)))


def test_scale_unit_keeps_blocks_whole():
    """Per element where a plan's runs or zero fills cut scale blocks (slices of 80 elements with
    blocks of 32), or the grouped model's groups do not nest with the blocks."""
    cut = tcemu.KSchedule(slices=3, slice_align=8).plan(224, 32)
    whole = tcemu.KSchedule(slices=2).plan(224, 32)
    assert scale_unit(cut, 32, 32, None) == 1 and scale_unit(whole, 32, 32, None) == 32
    assert scale_unit(whole, 32, 32, 16) == 32 and scale_unit(whole, 32, 32, 48) == 1
    assert scale_unit(whole, 32, 64, None) == 1  # instructions shorter than a block


LARGE = [("H100", H100_F16, "f16", "f16", {}), ("H100", H100_TF32, "tf32", "tf32", {}),
         ("V100", WMMA_F16, "f16", "f16", {}), ("A100", H100_BF16, "bf16", "bf16", {}),
         ("H100", H100_E4M3, "e4m3", "e4m3", {}), ("sm_89", SM89_E4M3, "e4m3", "e5m2", {}),
         ("sm_120", SM120.format("e4m3", "e2m1"), "e4m3", "e2m1", {}), ("sm_120", SM120_MX, "e4m3", "e2m1", {}),
         ("H100", H100_BF16, "bf16", "bf16", dict(schedule=tcemu.KSchedule(k_tile=64, residue="first", slices=2)))]


@pytest.mark.parametrize("arch,ins,at,bt,sched", LARGE, ids=[f"{f[0]}-{f[2]}{i}" for i, f in enumerate(LARGE)])
def test_large_outputs_equal_engine(monkeypatch, arch, ins, at, bt, sched):
    """GEMMs of at least 128 x 128 outputs (the GPU kernel's 4 x 2 outputs per thread, blocks of 4
    to 32 products, several blocks per shared-memory tile, chains that end inside a tile, block
    sums in one int32 word or in int32 groups added in int64), with a few NaN/inf/huge elements."""
    rng = np.random.default_rng(len(ins) + len(sched))
    cfg = tcemu.GemmConfig(arch=arch, instruction=ins, **sched)
    a, b = _bits(rng, (133, 192), at, specials=4), _bits(rng, (192, 131), bt, specials=4)
    if "block_scale" in ins:
        sa = jnp.asarray(rng.integers(100, 160, (133, 6)).astype(np.uint32))
        sb = jnp.asarray(rng.integers(90, 170, (6, 131)).astype(np.uint32))
        _check(monkeypatch, cfg, a, b, (sa, sb))
    else:
        _check(monkeypatch, cfg, a, b)


@pytest.mark.parametrize("seed", range(3))
def test_shapes_equal_engine(monkeypatch, seed):
    """Shapes that are not multiples of the kernel's 4 x 16 output tiles or of the instruction."""
    rng = np.random.default_rng(seed)
    M, K, N = (int(v) for v in rng.integers(1, 70, 3))
    cfg = tcemu.GemmConfig(arch="H100", instruction=H100_F16)
    _check(monkeypatch, cfg, _bits(rng, (M, K), "f16"), _bits(rng, (K, N), "f16"))


def test_matmul_uses_kernel_and_not_outside_its_models(monkeypatch):
    """What runs where: f32 accumulation on the CPU takes the kernel; f16 accumulation, sticky
    alignment and stochastic rounding stay on the engine; TCEMU_NATIVE=0 turns it off."""
    cfg = tcemu.GemmConfig(arch="H100", instruction=H100_F16)
    assert kernel_of(cfg) is not None
    f16acc = tcemu.GemmConfig(arch="H100", instruction="mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16")
    assert kernel_of(f16acc) is None
    for changes in (dict(sticky=True), dict(rounding="stochastic"), dict(block_sum="separate")):
        assert kernel_of(cfg.replace(model=_model(cfg).replace(**changes))) is None
    _native(monkeypatch, "0")
    assert kernel_of(cfg) is None
    _native(monkeypatch, "2")
    with pytest.raises(ValueError, match="TCEMU_NATIVE"):
        native.available()


SM120_FP4 = "mma.sync.aligned.m16n8k64.row.col.kind::{}.block_scale.scale_vec::{}.f32.e2m1.e2m1.f32.{}"
FP4_KINDS = [("mxf4nvf4", "4X", "ue4m3"), ("mxf4nvf4", "4X", "ue8m0"), ("mxf4nvf4", "2X", "ue8m0"),
             ("mxf4", "2X", "ue8m0")]


def _scales(rng, shape, stype, nan=False):
    lo, hi = (100, 150) if stype == "ue8m0" else (0, 0x7F)
    s = rng.integers(lo, hi, shape).astype(np.uint32)
    s[rng.random(shape) < 0.05] = 0  # zero (ue4m3) / 2**-127 (ue8m0) scales
    if nan:
        s[0, 0] = 0xFF
    return jnp.asarray(s)


@pytest.mark.parametrize("kind,vec,stype", FP4_KINDS)
def test_grouped_fp4_equal_engine(monkeypatch, kind, vec, stype):
    """kind::mxf4 / mxf4nvf4 (NVFP4, MXFP4): group sums, scale products, alignment by the scale
    exponents; a NaN scale through the exact path."""
    rng = np.random.default_rng(13)
    cfg = tcemu.GemmConfig(arch="sm_120", instruction=SM120_FP4.format(kind, vec, stype))
    blk = cfg.ins.scale_block
    a, b = _bits(rng, (20, 256), "e2m1"), _bits(rng, (256, 36), "e2m1")
    sa, sb = _scales(rng, (20, 256 // blk), stype), _scales(rng, (256 // blk, 36), stype)
    _check(monkeypatch, cfg, a, b, (sa, sb))
    _check(monkeypatch, cfg, a, b, (sa, _scales(rng, (256 // blk, 36), stype, nan=True)))


GROUPED_MODELS = [dict(rounding="rne"), dict(rounding="rd", fraction_bits=30), dict(fraction_bits=20, scale_group=8),
                  dict(scale_group=32), dict(zero_exponent=-126, overflow="ieee", rounding="ru"),
                  dict(subnormal_inputs=False, subnormal_outputs=False)]


@pytest.mark.parametrize("changes", GROUPED_MODELS, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_grouped_model_options_equal_engine(monkeypatch, changes):
    rng = np.random.default_rng(17)
    ins = SM120_FP4.format("mxf4nvf4", "2X", "ue8m0")
    base = tcemu.numerics("sm_120").for_instruction(tcemu.GemmConfig(arch="sm_120", instruction=ins).ins)
    cfg = tcemu.GemmConfig(arch="sm_120", instruction=ins, model=base.replace(**changes))
    a, b = _bits(rng, (8, 128), "e2m1"), _bits(rng, (128, 16), "e2m1")
    sa = jnp.asarray(rng.integers(60, 200, (8, 4)).astype(np.uint32))
    sb = jnp.asarray(rng.integers(60, 200, (4, 16)).astype(np.uint32))
    _check(monkeypatch, cfg, a, b, (sa, sb))


LARGE_FP4 = [("4X", "ue4m3", {}, {}), ("2X", "ue8m0", dict(scale_group=8, rounding="rne"), {}),
             ("2X", "ue8m0", dict(zero_exponent=None, rounding="rd"),
              dict(schedule=tcemu.KSchedule(k_tile=128, residue="first", slices=2)))]


@pytest.mark.parametrize("vec,stype,changes,sched", LARGE_FP4, ids=lambda x: "-".join(f"{k}={v}" for k, v in x.items())
                         if isinstance(x, dict) else str(x))
def test_large_grouped_fp4_equal_engine(monkeypatch, vec, stype, changes, sched):
    """Grouped fp4 GEMMs of at least 128 x 128 outputs (the GPU kernel's 4 x 2 outputs per thread,
    its kernel for blocks of 64 in groups of 16 and its generic one, chains that end inside a tile):
    zero groups, zero scales, scales whose exponents leave the fast finish's range, a NaN scale."""
    rng = np.random.default_rng(23 + len(changes))
    ins = SM120_FP4.format("mxf4nvf4", vec, stype)
    base = tcemu.numerics("sm_120").for_instruction(tcemu.GemmConfig(arch="sm_120", instruction=ins).ins)
    cfg = tcemu.GemmConfig(arch="sm_120", instruction=ins, model=base.replace(**changes), **sched)
    blk = cfg.ins.scale_block
    a, b = _bits(rng, (133, 320), "e2m1"), _bits(rng, (320, 131), "e2m1")
    a = a.at[:, 64:96].set(0)  # a block whose groups are all zero for every output
    sa, sb = _scales(rng, (133, 320 // blk), stype), _scales(rng, (320 // blk, 131), stype)
    if stype == "ue8m0":
        sa, sb = sa.at[5, :].set(250), sb.at[:, 7].set(250)  # e_g = 246: the exact finish, overflow
    _check(monkeypatch, cfg, a, b, (sa, sb.at[2, 3].set(0xFF if stype == "ue8m0" else 0x7F)))


@pytest.mark.parametrize("sched", SCHEDULES[:2] + SCHEDULES[3:4], ids=lambda s: str(s.get("k_order") or "kschedule"))
def test_chains_one_at_a_time_equal_engine(monkeypatch, sched):
    """Large GEMMs fold their chains one at a time (memory O(M N))."""
    monkeypatch.setattr(gemm.kernel, "CHAIN_BYTES", 0)
    rng = np.random.default_rng(19)
    cfg = tcemu.GemmConfig(arch="H100", instruction=H100_F16, **sched)
    _check(monkeypatch, cfg, _bits(rng, (12, 300), "f16"), _bits(rng, (300, 20), "f16"))


MMAS = [("H100", "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32", "f16", "f16", "f32"),
        ("H100", "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f16", "f16", "f16", "f16"),
        ("H100", "mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f32", "f16", "f16", "f32"),
        ("H100", H100_BF16, "bf16", "bf16", "f32"), ("A100", H100_TF32, "tf32", "tf32", "f32"),
        ("V100", WMMA_F16, "f16", "f16", "f32"), ("sm_89", SM89_E4M3, "e4m3", "e5m2", "f32"),
        ("H100", "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32", "e4m3", "e4m3", "f32"),  # addend last
        ("H100", "wgmma.mma_async.sync.aligned.m64n16k32.f32.e5m2.e4m3", "e5m2", "e4m3", "f32"),
        ("sm_120", SM120.format("e2m1", "e3m2"), "e2m1", "e3m2", "f32"),
        ("sm_120", SM120_MX, "e4m3", "e2m1", "f32")]


def _mma(ins, arch, setting, monkeypatch, *args, vmap=None):
    _native(monkeypatch, setting)

    def f(a, b, c, sa, sb):
        return mma_numerics.mma_bits(ins, a, b, c, None, arch=resolve(arch), scale_a=sa, scale_b=sb)

    return np.asarray(jax.jit(jax.vmap(f, in_axes=vmap) if vmap else f)(*args))


@cpu_only
@pytest.mark.parametrize("arch,spelling,at,bt,ct", MMAS, ids=[f"{m[0]}-{m[1].split('.')[-4]}{i}" for i, m in
                                                             enumerate(MMAS)])
def test_mma_equal_engine(monkeypatch, arch, spelling, at, bt, ct):
    """Single MMAs (the value and register levels) on the kernel: a batch of (2, 3) instructions
    from C with zeros, subnormals and special values (f16 C widened, f16 D narrowed), as one call
    and under vmap with B shared, against the engine."""
    from tcemu._src.isa.parse import parse

    ins = parse(spelling)
    assert mma_numerics._kernel(ins, mma_numerics.resolve_model(ins, None, resolve(arch))) is not None
    rng = np.random.default_rng(len(spelling))
    a = _bits(rng, (2, 3, ins.m, ins.k), at, specials=2)
    b = _bits(rng, (2, 3, ins.k, ins.n), bt, specials=1)
    c = _bits(rng, (2, 3, ins.m, ins.n), ct, spread=20, specials=3)
    if ct == "f32":  # subnormal addends
        c = c.at[1, 2, 0, :2].set(jnp.asarray([0x00000123, 0x80400000], jnp.uint32))
    sa = sb = None
    if ins.scale_vec is not None:
        kb = ins.k // ins.scale_block
        sa = jnp.asarray(rng.integers(110, 150, (2, 3, ins.m, kb)).astype(np.uint32)).at[0, 1, 2, 0].set(255)
        sb = jnp.asarray(rng.integers(110, 150, (2, 3, kb, ins.n)).astype(np.uint32))
    args = (a, b, c, sa, sb)
    want = _mma(ins, arch, "0", monkeypatch, *args)
    np.testing.assert_array_equal(_mma(ins, arch, "1", monkeypatch, *args), want)
    flat = [None if x is None else x.reshape((6,) + x.shape[2:]) for x in args]
    flat[1] = flat[1][4]  # B shared by the vmapped batch
    axes = (0, None, 0, None if sa is None else 0, None if sb is None else 0)
    want_v = _mma(ins, arch, "0", monkeypatch, *flat, vmap=axes)
    np.testing.assert_array_equal(_mma(ins, arch, "1", monkeypatch, *flat, vmap=axes), want_v)
    inner = list(args)  # vmap over axis 0 of a batch of 3 inside, B shared by the vmapped axis only
    inner[1] = b[1]
    axes = (0, None, 0, None if sa is None else 0, None if sb is None else 0)
    want_v = _mma(ins, arch, "0", monkeypatch, *inner, vmap=axes)
    np.testing.assert_array_equal(_mma(ins, arch, "1", monkeypatch, *inner, vmap=axes), want_v)


def _edge_operands(t, K, rng):
    """A (8, K) and B (K, 24) values of ``t`` for the kernel's fast block finish and its
    fallbacks: blocks whose int32 sum with the accumulator passes 2**31 (maximal significands
    against B's first 8 columns, the second block 32 times the first), cancellation to tiny
    results, values near the largest finite (blocks above 2**126: bf16 and tf32 read as
    significands there), products near and below float32's smallest normal beside larger ones in
    one block (against B's last 4 columns; the alignment exponent below F - 125, and a product
    that float32 would round up across its truncation point), and random rows."""
    big = {"f16": 2.0 ** 13, "bf16": 2.0 ** 125, "tf32": 2.0 ** 125}[t]
    tiny = {"f16": 2.0 ** -14, "bf16": 2.0 ** -120, "tf32": 2.0 ** -120}[t]
    low = {"f16": 2.0 ** -8, "bf16": 2.0 ** -70, "tf32": 2.0 ** -70}[t]
    top = {"f16": 2 - 2.0 ** -10, "bf16": 2 - 2.0 ** -7, "tf32": 2 - 2.0 ** -10}[t]
    sig = lambda *shape: 1 + rng.integers(0, 128, shape) / 128  # noqa: E731
    k = np.arange(K)
    a = np.zeros((8, K))  # rows 0-3 and 4-7: the kernel's row groups (the first free of special values)
    a[0] = np.where(k % 32 < 16, top, 32 * top)
    a[1] = -a[0]
    a[2] = np.where(k % 16 == 0, low * 2.0 ** (10 if t == "f16" else 25), low) * sig(K) * rng.choice([-1.0, 1.0], K)
    a[2, 1::16] = low * 181 / 128  # times B's: a product just below 2 * low**2, near float32's subnormal grid
    a[3] = rng.standard_normal(K) * np.exp2(rng.integers(-8, 9, K))
    a[4] = tiny * np.where(k % 2, 1, -1) * (1 + (k % 3) / 8)  # near-cancelling
    a[4, ::7] *= 1.5
    a[5] = big * rng.choice([-1.0, 1.0], K) * sig(K)
    a[6] = np.where(k % 48 < 16, big, 1.0) * rng.standard_normal(K)
    a[7] = rng.standard_normal(K) * np.exp2(rng.integers(-8, 9, K))
    b = np.ones((K, 24))
    b[:, :8] = top
    b[:, 8:16] = np.sign(rng.standard_normal((K, 8)))
    b[:, 16:20] = rng.standard_normal((K, 4)) * np.exp2(rng.integers(-4, 5, (K, 4)))
    b[:, 20:] = low * sig(K, 4) * rng.choice([-1.0, 1.0], (K, 4))
    b[1::16, 20] = low * 181 / 128
    return a, b


@pytest.mark.parametrize("rounding", ["rz", "rne", "ru", "rd"])
@pytest.mark.parametrize("ins,t", [(H100_F16, "f16"), (H100_BF16, "bf16"), (H100_TF32, "tf32")])
def test_fast_finish_edges_equal_engine(monkeypatch, ins, t, rounding):
    """The kernel's block finish by float32 conversion in the model's rounding direction, its
    exact-value products for bf16/tf32, and the fallbacks where they do not hold (int32 wrap,
    results near the float32 limits, blocks beyond float32's exponents), against the engine."""
    rng = np.random.default_rng(23)
    a, b = _tiled(*_edge_operands(t, 96, rng))

    def bits(x):
        if t == "tf32":
            return jnp.asarray(x.astype(np.float32).view(np.uint32) & np.uint32(0xFFFFE000))
        return fm.to_bits(jnp.asarray(x.astype(fm.VALUE_DTYPES[t])), t)

    model = tcemu.numerics("H100").for_instruction(tcemu.GemmConfig(instruction=ins).ins).replace(rounding=rounding)
    cfg = tcemu.GemmConfig(arch="H100", instruction=ins, model=model)
    got = _check(monkeypatch, cfg, bits(a), bits(b)).view(np.float32)
    tiny = np.abs(a[4]).min()
    assert np.isfinite(got[4]).all() and (np.abs(got[4, 8:16]) <= 64 * tiny).all()  # the cancelling row stays tiny
    assert (np.abs(got[0, :8]) > 2.0 ** 12).all() and (np.abs(got[5]) > 2.0 ** 100).any() == (t != "f16")


MIXED = [("V100", WMMA_F16, "f16", {}), ("V100", WMMA_F16, "f16", dict(zero_exponent=None)),
         ("A100", H100_TF32, "tf32", {}), ("A100", H100_BF16, "bf16", {}),
         ("A100", H100_BF16, "bf16", dict(subnormal_inputs=False, rounding="rne")),
         ("A100", H100_BF16, "bf16", dict(min_exponent=-100))]


@pytest.mark.parametrize("arch,ins,t,changes", MIXED, ids=lambda x: "-".join(f"{k}={v}" for k, v in x.items())
                         if isinstance(x, dict) else str(x).split(".")[-1])
def test_mixed_row_groups_equal_engine(monkeypatch, arch, ins, t, changes):
    """Blocks where the fast path holds for some rows of a 4-row group and not for others (all-zero
    blocks beside a zero accumulator; tiny products near float32's smallest normal; products above
    2**100; subnormal inputs), so that the hot path and the careful block alternate within one
    chain, on the small-block families and on models outside the kernel's simple path (a zero
    accumulator without exponent, flushed inputs, a minimum exponent)."""
    rng = np.random.default_rng(31)
    K = 128
    k = np.arange(K)
    wide = t != "f16"
    a = rng.standard_normal((8, K)) * np.exp2(rng.integers(-6, 7, (8, K)))
    a[1] = np.where(k % 32 < 12, 0.0, a[1])                         # zero blocks, first with a zero accumulator
    a[2] *= 2.0 ** (-118 if wide else -20)                          # tiny products (subnormal f16 inputs)
    a[3] = rng.standard_normal(K) * np.where((k // 8) % 3 == 1, 2.0 ** (100 if wide else 10), 1.0)
    a[5, :40] = 0.0
    a[6, 64:] *= 2.0 ** (-60 if wide else -12)                      # a chain that drops to tiny terms
    b = rng.standard_normal((K, 40)) * np.exp2(rng.integers(-4, 5, (K, 40)))
    b[:, 30:] *= 2.0 ** (-8 if wide else -4)
    if wide:  # products near 2**-150 on a zero accumulator: its exponent (-126) sets their truncation
        a[7] *= 2.0 ** -110
        b[:, 36:] *= 2.0 ** -24

    def bits(x):
        if t == "tf32":
            return jnp.asarray(x.astype(np.float32).view(np.uint32) & np.uint32(0xFFFFE000))
        return fm.to_bits(jnp.asarray(x.astype(fm.VALUE_DTYPES[t])), t)

    cfg = tcemu.GemmConfig(arch=arch, instruction=ins)
    cfg = tcemu.GemmConfig(arch=arch, instruction=ins, model=_model(cfg).replace(**changes))
    a, b = _tiled(a, b)
    got = _check(monkeypatch, cfg, bits(a), bits(b)).view(np.float32)
    assert (got[2] != 0).any() and (np.abs(got[3]) > 2.0 ** (90 if wide else 12)).any()


def test_wide_fast_finish_edges_equal_engine(monkeypatch):
    """sm_120 kind::f8f6f4 (blocks of 32, F = 25: two-word sums): sums of maximal products that
    leave the one-word fast finish, beside ordinary ones."""
    rng = np.random.default_rng(29)
    K = 128
    x = rng.standard_normal((8, K)) * np.exp2(rng.integers(-4, 5, (8, K)))
    x[:3] = 448.0
    x[1, 32:] *= -1
    bmat = np.ones((K, 16)) * 448.0
    bmat[:, 8:] = rng.standard_normal((K, 8))
    e4m3 = lambda v: fm.to_bits(jnp.asarray(v.astype(ml_dtypes.float8_e4m3fn)), "e4m3")  # noqa: E731
    cfg = tcemu.GemmConfig(arch="sm_120", instruction=SM120.format("e4m3", "e4m3"))
    _check(monkeypatch, cfg, *(e4m3(v) for v in _tiled(x, bmat)))


@cpu_only
def test_mma_block_scales_per_block_equal_engine(monkeypatch):
    """kind::mxf8f6f4 MMAs pass one ue8m0 exponent per block to the kernel: scales at both ends
    of the range (values beyond float32's, read as significands) and NaN, against the engine."""
    from tcemu._src.isa.parse import parse

    ins = parse(SM120_MX)
    rng = np.random.default_rng(31)
    a, b = _bits(rng, (6, ins.m, ins.k), "e4m3"), _bits(rng, (6, ins.k, ins.n), "e2m1")
    c = _bits(rng, (6, ins.m, ins.n), "f32", spread=20)
    kb = ins.k // ins.scale_block
    sa = rng.integers(110, 150, (6, ins.m, kb)).astype(np.uint32)
    sb = rng.integers(110, 150, (6, kb, ins.n)).astype(np.uint32)
    sa[1], sb[2] = 254, 0  # 2**127 and 2**-127
    sa[3, 0, 0] = 255
    args = (a, b, c, jnp.asarray(sa), jnp.asarray(sb))
    want = _mma(ins, "sm_120", "0", monkeypatch, *args)
    np.testing.assert_array_equal(_mma(ins, "sm_120", "1", monkeypatch, *args), want)


def _use(model, afmt, bfmt, k, acc, gemm=False, platform="gpu"):
    """Whether the registered kernel of ``platform`` takes this model."""
    return _KERNELS[platform].accepts(model, afmt, bfmt, k, acc, gemm)


def test_gpu_kernel_dispatch_rule(monkeypatch):
    """On a CUDA backend the GPU kernel runs GEMMs (not single MMAs) of models the CPU kernel covers,
    with blocks of at most 32 products, or 64 for grouped fp4."""
    assert native.gpu_fits(8192, 8192, 8192) and native.gpu_fits(1 << 20, 2044, 1)
    assert not native.gpu_fits(1 << 20, 1, 2045)  # 32-bit offsets: K x (M, N padded to 4) below 2**31
    monkeypatch.setattr(native, "_gpu", lambda: True)
    monkeypatch.setattr(native, "available_gpu", lambda: True)
    cfg = tcemu.GemmConfig(arch="H100", instruction=H100_F16)
    m, f16 = _model(cfg), fm.FORMATS["f16"]
    assert _use(m, f16, f16, 16, "f32", gemm=True)
    assert not _use(m, f16, f16, 16, "f32")  # single MMAs
    assert _use(m.replace(block_size=32), f16, f16, 64, "f32", gemm=True)
    assert not _use(m.replace(block_size=64), f16, f16, 64, "f32", gemm=True)
    assert not _use(m.replace(sticky=True), f16, f16, 16, "f32", gemm=True)
    fp4 = tcemu.GemmConfig(arch="sm_120", instruction=SM120_FP4.format("mxf4nvf4", "4X", "ue4m3"))
    m4, e2m1 = _model(fp4), fm.FORMATS["e2m1"]
    assert _use(m4, e2m1, e2m1, 64, "f32", gemm=True) and not _use(m4, e2m1, e2m1, 64, "f32")
    assert not _use(m4.replace(block_size=128), e2m1, e2m1, 128, "f32", gemm=True)
    monkeypatch.setattr(native, "available", lambda: True)
    assert _use(m4.replace(block_size=128), e2m1, e2m1, 128, "f32", platform="cpu")
