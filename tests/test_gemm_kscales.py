"""Block scales along K (``Epilogue(scale_block=...)``, DeepSeek-V3's 1x128 / 128x128 fp8 recipe):
the binary32 FFMA in integers against an exact model, the block-scaled promotion against a numpy
model of each order, the kernel path against the JAX reference, gradients, and bad inputs. The
H100's own block-scaled GEMMs are reproduced in ``test_library_layers.py``."""
from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import tcemu
from tcemu._src.gemm import xla
from tcemu._src.gemm.execute import _k_scales, gemm_bits
from tcemu._src.numerics import fp32

FP8 = "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3"


def fma_model(a, b, c):
    """Correctly rounded float32 fma, exact in numpy float64: the product of two float32 is exact,
    the sum's error is recovered by TwoSum, and a float64 result on a float32 midpoint is moved
    toward the error's sign before the one rounding to float32."""
    a, b, c = (np.asarray(x, np.float32) for x in np.broadcast_arrays(a, b, c))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        p, cc = a.astype(np.float64) * b.astype(np.float64), c.astype(np.float64)
        s = p + cc
        bb = s - p
        err = (p - (s - bb)) + (cc - bb)
        r = s.astype(np.float32)
        for nb in (np.nextafter(r, np.float32(np.inf)), np.nextafter(r, np.float32(-np.inf))):
            mid = (r.astype(np.float64) + nb.astype(np.float64)) / 2
            fix = np.isfinite(s) & (err != 0) & (s == mid)
            r = np.where(fix, np.where(err > 0, np.maximum(r, nb), np.minimum(r, nb)), r)
    return r


def _bits(x):
    return np.asarray(x, np.float32).view(np.uint32)


def test_fma_against_exact_model():
    rng = np.random.default_rng(1)
    n = 60000
    x = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32).view(np.float32).copy()
    y = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32).view(np.float32).copy()
    z = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32).view(np.float32).copy()
    h = n // 2  # products and addends that meet: cancellation, near-ties, subnormal results
    x[:h], y[:h] = rng.standard_normal(h).astype(np.float32), rng.standard_normal(h).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        z[:h // 2] = -(x[:h // 2].astype(np.float64) * y[:h // 2]).astype(np.float32)
    z[h // 2:h] = (rng.standard_normal(h - h // 2) * 10.0 ** rng.integers(-9, 9, h - h // 2)).astype(np.float32)
    with np.errstate(all="ignore"):
        x[-2000:] *= np.float32(2.0**-70)
        y[-2000:] *= np.float32(2.0**-60)
    z[-1000:] = (rng.integers(-2**23, 2**23, 1000) * 2.0**-149).astype(np.float32)
    specials = np.float32([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 2.0**-149, 3.4e38])
    sx, sy, sz = (g.reshape(-1) for g in np.meshgrid(specials, specials, specials))
    x, y, z = np.concatenate([x, sx]), np.concatenate([y, sy]), np.concatenate([z, sz])
    got = np.asarray(fp32.fma(_bits(x), _bits(y), _bits(z)))
    want = fma_model(x, y, z)
    nan = np.isnan(want)
    assert (got[nan] == 0x7FFFFFFF).all()
    assert np.array_equal(got[~nan], want[~nan].view(np.uint32))


def _int_fp8(rng, shape):
    """e4m3 integers -4..4: every block's partial sum is exact in the fp8 accumulator."""
    return jnp.asarray(rng.integers(-4, 5, shape).astype(ml_dtypes.float8_e4m3fn))


def _scales(rng, shape):
    return (rng.uniform(0.25, 4.0, shape)).astype(np.float32)


def _config(order, **schedule):
    sched = tcemu.KSchedule(promotion=128, **schedule)
    return tcemu.GemmConfig(arch="H100", instruction=FP8, schedule=sched,
                            epilogue=tcemu.Epilogue(scale_block=128, scales=order))


def _model(a, b, sa, sb, order, slices=1):
    """numpy: the exact partial of each 128 block of K, entering a float32 total by one fma with
    its scales; with slices, each slice's total from +0, then the slices added in order."""
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    K = a.shape[1]
    kb = K // 128
    totals = []
    for s in range(slices):
        t = np.zeros((a.shape[0], b.shape[1]), np.float32)
        for j in range(s * kb // slices, (s + 1) * kb // slices):
            p = (a[:, j * 128:(j + 1) * 128].astype(np.float64) @ b[j * 128:(j + 1) * 128]).astype(np.float32)
            x, y = sa[:, j:j + 1], sb[j][None]
            if order == "product":
                t = fma_model(p, x * y, t)
            else:
                first, then = (y, x) if order == "sequential_ba" else (x, y)
                t = fma_model((p * first).astype(np.float32), then, t)
        totals.append(t)
    out = totals[0]
    for t in totals[1:]:
        out = (out + t).astype(np.float32)
    return out


@pytest.mark.parametrize("order", ["product", "sequential", "sequential_ba"])
@pytest.mark.parametrize("slices", [1, 2])
def test_block_scaled_promotion_against_model(order, slices):
    rng = np.random.default_rng(3)
    M, N, K = 24, 16, 512
    a, b = _int_fp8(rng, (M, K)), _int_fp8(rng, (K, N))
    sa, sb = _scales(rng, (M, K // 128)), _scales(rng, (K // 128, N))
    got = np.asarray(tcemu.matmul(a, b, scale_a=sa, scale_b=sb, config=_config(order, slices=slices)))
    assert np.array_equal(got.view(np.uint32), _model(a, b, sa, sb, order, slices).view(np.uint32))
    other = _model(a, b, sa, sb, "sequential" if order == "product" else "product", slices)
    assert not np.array_equal(got, other)  # the inputs tell the two orders apart


def test_batched_scales_and_epilogue():
    rng = np.random.default_rng(4)
    a, b = _int_fp8(rng, (3, 16, 256)), _int_fp8(rng, (256, 8))
    sa, sb = _scales(rng, (3, 16, 2)), _scales(rng, (2, 8))
    bias = rng.standard_normal(8).astype(np.float32)
    cfg = _config("product")
    got = tcemu.matmul(a, b, scale_a=sa, scale_b=sb, bias=bias, out_type="bf16", config=cfg)
    for i in range(3):
        acc = _model(a[i], b, sa[i], sb, "product")
        want = (acc + bias).astype(np.float32).astype(ml_dtypes.bfloat16)
        assert np.array_equal(np.asarray(got[i]).view(np.uint16), want.view(np.uint16))
    one = tcemu.matmul(a[1], b, scale_a=sa[1], scale_b=sb, config=cfg)
    assert np.array_equal(np.asarray(one), _model(a[1], b, sa[1], sb, "product"))


def test_kernel_path_equals_jax_reference():
    """The compiled kernel's chains (where it runs) with the scaled promotion, against the pure-JAX
    path, on random fp8 inputs and scales (sums not exact: the accumulator's rounding counts)."""
    rng = np.random.default_rng(5)
    M, N, K = 40, 24, 384
    a = jnp.asarray(rng.standard_normal((M, K)).astype(ml_dtypes.float8_e4m3fn))
    b = jnp.asarray(rng.standard_normal((K, N)).astype(ml_dtypes.float8_e4m3fn))
    sa, sb = _scales(rng, (M, 3)), _scales(rng, (3, N))
    cfg = _config("sequential")
    ab, bb = (jax.lax.bitcast_convert_type(x, jnp.uint8).astype(jnp.uint32) for x in (a, b))
    scales = (fp32.bits(sa), fp32.bits(sb))
    got = gemm_bits(ab, bb, cfg, scales=scales)[0]
    plan = cfg.k_schedule.plan(K, cfg.ins.k)
    ref = xla.run(ab, bb, cfg.ins, cfg.numerics, plan, "H100", None, None, _k_scales(plan, K, scales, cfg))[0]
    assert np.array_equal(np.asarray(got), np.asarray(ref))


def test_gradients_of_the_scaled_product():
    rng = np.random.default_rng(6)
    a, b = rng.standard_normal((8, 256)).astype(np.float32), rng.standard_normal((256, 4)).astype(np.float32)
    sa, sb = _scales(rng, (8, 2)), _scales(rng, (2, 4))
    cfg = _config("product")
    f = lambda a, b, sa, sb: tcemu.matmul(a, b, scale_a=sa, scale_b=sb, config=cfg).sum()  # noqa: E731
    qa = np.asarray(a.astype(ml_dtypes.float8_e4m3fn), np.float32)
    qb = np.asarray(b.astype(ml_dtypes.float8_e4m3fn), np.float32)
    ea, eb = np.repeat(sa, 128, axis=1), np.repeat(sb, 128, axis=0)
    ref = lambda a, b, sa, sb: jnp.matmul(a * jnp.repeat(sa, 128, 1), b * jnp.repeat(sb, 128, 0),  # noqa: E731
                                          precision="highest").sum()
    got = jax.grad(f, argnums=(0, 1, 2, 3))(a, b, sa, sb)
    want = jax.grad(ref, argnums=(0, 1, 2, 3))(qa, qb, sa, sb)
    for g, w in zip(got, want):  # float32 sums in another order (a GPU's GEMMs): within rounding
        w = np.asarray(w)
        np.testing.assert_allclose(np.asarray(g), w, rtol=1e-5, atol=1e-5 * np.abs(w).max())
    np.testing.assert_allclose(got[0], (np.ones((8, 4)) @ (qb * eb).T) * ea, rtol=1e-5, atol=1e-4)


def test_library_config_block_scalings():
    kw = dict(arch="H100", M=256, N=512, K=1024, a="e4m3", b="e4m3", out="bf16")
    orders = {s: tcemu.library_config("torch._scaled_mm", **kw, scaling=s).epilogue
              for s in ("1x128,1x128", "1x128,128x128", "128x128,1x128")}
    assert {s: (e.scale_block, e.scales) for s, e in orders.items()} == {
        "1x128,1x128": (128, "sequential"), "1x128,128x128": (128, "product"), "128x128,1x128": (128, "product")}
    with pytest.raises(ValueError, match="use_fast_accum"):
        tcemu.library_config("torch._scaled_mm", **kw, scaling="1x128,1x128", use_fast_accum=True)
    with pytest.raises(ValueError, match="scaling must be"):
        tcemu.library_config("torch._scaled_mm", **kw, scaling="1x64")


def test_bad_block_scales():
    rng = np.random.default_rng(7)
    a, b = _int_fp8(rng, (16, 256)), _int_fp8(rng, (256, 8))
    sa, sb = _scales(rng, (16, 2)), _scales(rng, (2, 8))
    cfg = _config("product")
    with pytest.raises(ValueError, match="scale_b is missing"):
        tcemu.matmul(a, b, scale_a=sa, config=cfg)
    with pytest.raises(ValueError, match=r"scale_a of shape \(16, 3\) does not broadcast to \(16, 2\)"):
        tcemu.matmul(a, b, scale_a=_scales(rng, (16, 3)), scale_b=sb, config=cfg)
    with pytest.raises(ValueError, match="promotion"):
        tcemu.GemmConfig(arch="H100", instruction=FP8, epilogue=tcemu.Epilogue(scale_block=128))
    with pytest.raises(ValueError, match="promotion"):
        _config("product").replace(schedule=tcemu.KSchedule(promotion=256))
    with pytest.raises(ValueError, match="grad_lhs=None"):
        _config("product").replace(grad_lhs=tcemu.GemmConfig(arch="H100"))
    with pytest.raises(ValueError, match="across block scales"):  # a 64-element residue first: groups straddle
        tcemu.matmul(jnp.ones((16, 200)), jnp.ones((200, 8)), scale_a=jnp.ones((16, 2)), scale_b=jnp.ones((2, 8)),
                     config=_config("product", k_tile=64, residue="first"))
    with pytest.raises(ValueError, match="block scales of its own"):
        tcemu.GemmConfig(arch="RTX5090", instruction="mma.sync.aligned.m16n8k32.row.col.kind::mxf8f6f4"
                         ".block_scale.scale_vec::1X.f32.e4m3.e4m3.f32.ue8m0", k_order="promotion",
                         promotion_interval=32, epilogue=tcemu.Epilogue(scale_block=32))
    with pytest.raises(ValueError, match=r"scale_a of shape \(3, 16, 2\) does not broadcast to \(2, 16, 2\)"):
        tcemu.matmul(jnp.stack([a, a]), b, scale_a=_scales(rng, (3, 16, 2)), scale_b=sb, config=cfg)
    with pytest.raises(ValueError, match="tcemu.matmul"):
        tcemu.dot_general(a, b, (((1,), (0,)), ((), ())), config=cfg)
    with pytest.raises(ValueError, match="tcemu.matmul"):
        tcemu.einsum("ij,jk->ik", a, b, scale_a=sa, scale_b=sb, config=cfg)
    with pytest.raises(ValueError, match="scale_block"):
        tcemu.Epilogue(scale_block=-1)
    with pytest.raises(ValueError, match="scale_block=128 go with block scales along K"):
        tcemu.identify(np.ones((32, 256), ml_dtypes.float8_e4m3fn), np.ones((256, 8), ml_dtypes.float8_e4m3fn),
                       np.ones((32, 8), np.float32), arch="H100", epilogues=[tcemu.Epilogue(scale_block=128)])


def test_per_batch_scales_of_one_weight_matrix():
    """b (K, N) shared by the batch, scale_b (batch, K/128, N) per batch entry: each entry is its
    own GEMM with its own scales."""
    rng = np.random.default_rng(8)
    a, b = _int_fp8(rng, (2, 16, 256)), _int_fp8(rng, (256, 8))
    sa, sb = _scales(rng, (16, 2)), _scales(rng, (2, 2, 8))
    got = tcemu.matmul(a, b, scale_a=sa, scale_b=sb, config=_config("sequential"))
    for i in range(2):
        assert np.array_equal(np.asarray(got[i]), _model(a[i], b, sa, sb[i], "sequential"))
