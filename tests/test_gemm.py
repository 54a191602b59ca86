"""tcemu.matmul / dot_general / einsum: bit-exact against the register-level instructions over the
same tiling, accumulation-order behaviour, gradients, transformations, and a Flax model."""
from __future__ import annotations

import functools
import textwrap

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import tcemu
from tcemu._src.isa.wmma import matrix_to_fragment, fragment_to_matrix, mma_sync_fragments
from conftest import run_on_devices

WMMA = "wmma.mma.sync.aligned.row.col.m16n16k16.f32.f32"


def _tiles_loop_wmma(a16, b16, arch):
    """A CUTLASS-style mainloop through memory with the register-level instructions: for every
    output tile, wmma.load.c the accumulator, then per k-tile load.a, load.b, mma, store.d."""
    M, K = a16.shape
    N = b16.shape[1]
    Mp, Np, Kp = -(-M // 16) * 16, -(-N // 16) * 16, -(-K // 16) * 16
    A = np.zeros((Mp, Kp), np.float16); A[:M, :K] = a16
    B = np.zeros((Kp, Np), np.float16); B[:K, :N] = b16
    ld_a = tcemu.ptx("wmma.load.a.sync.aligned.row.m16n16k16.f16", arch=arch)
    ld_b = tcemu.ptx("wmma.load.b.sync.aligned.row.m16n16k16.f16", arch=arch)
    ld_c = tcemu.ptx("wmma.load.c.sync.aligned.row.m16n16k16.f32", arch=arch)
    mma = tcemu.ptx("wmma.mma.sync.aligned.row.row.m16n16k16.f32.f32", arch=arch)
    st_d = tcemu.ptx("wmma.store.d.sync.aligned.row.m16n16k16.f32", arch=arch)
    pa, pb, pd = 0, Mp * Kp * 2, Mp * Kp * 2 + Kp * Np * 2
    mem = tcemu.memory(pd + Mp * Np * 4)
    mem = tcemu.put_matrix(mem, A, p=pa)
    mem = tcemu.put_matrix(mem, B, p=pb)

    @jax.jit
    def tile(mem, i, j):
        dp = pd + (i * 16 * Np + j * 16) * 4

        def body(kt, mem):
            regs = ld_c(tcemu.regfile(32), mem, dst=range(16, 24), p=dp, stride=Np)
            regs = ld_a(regs, mem, dst=range(0, 8), p=pa + (i * 16 * Kp + kt * 16) * 2, stride=Kp)
            regs = ld_b(regs, mem, dst=range(8, 16), p=pb + (kt * 16 * Np + j * 16) * 2, stride=Np)
            regs = mma(regs, d=range(24, 32), a=range(0, 8), b=range(8, 16), c=range(16, 24))
            return st_d(mem, regs, src=range(24, 32), p=dp, stride=Np)

        return jax.lax.fori_loop(0, Kp // 16, body, mem)

    for i in range(Mp // 16):
        for j in range(Np // 16):
            mem = tile(mem, i, j)
    return np.asarray(tcemu.get_matrix(mem, (Mp, Np), "f32", p=pd))[:M, :N]


@pytest.mark.parametrize("arch", ["H100", "V100"])
def test_matmul_equals_register_level_wmma_mainloop(arch):
    rng = np.random.default_rng(5)
    a = rng.standard_normal((37, 50)).astype(np.float16)
    b = rng.standard_normal((50, 21)).astype(np.float16)
    want = _tiles_loop_wmma(a, b, arch)
    got = tcemu.matmul(a, b, arch=arch, instruction=WMMA)
    np.testing.assert_array_equal(np.asarray(got).view(np.uint32), want.view(np.uint32))


def _mma_sync_mainloop(a, b, instruction):
    """D of mma.sync chained through registers over k-tiles (fragments from the PTX layouts)."""
    M, K = a.shape
    N = b.shape[1]
    sp = "mma.sync.aligned." + instruction.split(".")[0] + ".row.col." + ".".join(instruction.split(".")[1:])
    ins = tcemu._src.isa.parse.parse(sp)
    fa, fb, fc, fd = mma_sync_fragments(ins)
    f = tcemu.ptx(sp, arch="H100")
    m, n, k = ins.m, ins.n, ins.k
    Mp, Np, Kp = -(-M // m) * m, -(-N // n) * n, -(-K // k) * k
    et = ins.atype
    bits = lambda x: np.asarray(tcemu._src.quant.elements.to_codes(jnp.asarray(x), et))  # noqa: E731
    A = np.zeros((Mp, Kp), np.uint32); A[:M, :K] = bits(a)
    B = np.zeros((Kp, Np), np.uint32); B[:K, :N] = bits(b)
    D = np.zeros((Mp, Np), np.uint32)
    na, nb, nc = fa.nregs, fb.nregs, fc.nregs
    for i in range(0, Mp, m):
        for j in range(0, Np, n):
            regs = jnp.zeros((32, na + nb + nc), jnp.uint32)
            regs = regs.at[:, na + nb:].set(matrix_to_fragment(jnp.zeros((m, n), jnp.uint32), fc))
            for kk in range(0, Kp, k):
                regs = regs.at[:, :na].set(matrix_to_fragment(jnp.asarray(A[i:i + m, kk:kk + k]), fa))
                regs = regs.at[:, na:na + nb].set(matrix_to_fragment(jnp.asarray(B[kk:kk + k, j:j + n]), fb))
                regs = f(regs, a=range(na), b=range(na, na + nb), c=range(na + nb, na + nb + nc),
                         d=range(na + nb, na + nb + nc))
            D[i:i + m, j:j + n] = np.asarray(fragment_to_matrix(regs[:, na + nb:], fd))
    return D[:M, :N]


@pytest.mark.parametrize("instruction,dt", [("m16n8k16.f32.bf16.bf16.f32", ml_dtypes.bfloat16),
                                            ("m16n8k32.f32.e4m3.e4m3.f32", ml_dtypes.float8_e4m3fn),
                                            ("m16n8k8.f32.tf32.tf32.f32", np.float32)])
def test_matmul_equals_register_level_mma_sync(instruction, dt):
    """mma.sync chained through registers (fragments built from the PTX layouts), odd sizes."""
    rng = np.random.default_rng(6)
    M, K, N = 19, 45, 13
    a = rng.standard_normal((M, K)).astype(dt).astype(np.float32)
    b = rng.standard_normal((K, N)).astype(dt).astype(np.float32)
    if dt is np.float32:
        a = tcemu.quantize(a, "tf32"); b = tcemu.quantize(b, "tf32")
    got = tcemu.matmul(a, b, arch="H100", instruction=instruction)
    np.testing.assert_array_equal(np.asarray(got).view(np.uint32), _mma_sync_mainloop(a, b, instruction))


@pytest.mark.parametrize("k_order,instruction", [("sequential", "m16n8k16.f32.bf16.bf16.f32"),
                                                 ("promotion", "m16n8k16.f32.bf16.bf16.f32"),
                                                 ("sequential", "m16n8k16.f16.f16.f16.f16"),
                                                 ("sequential", "m16n8k32.f32.e5m2.e5m2.f32")])
def test_matmul_special_values_equal_register_level(k_order, instruction):
    """NaN, inf, overflow in the middle of the K loop, and exact cancellation of a negative
    accumulator (the cases the GEMM's fast path defers to an exact recomputation) give the
    register-level bits; so do blocks without them next to blocks with them."""
    rng = np.random.default_rng(8)
    M, K, N = 40, 64, 16
    dt = {"bf16": ml_dtypes.bfloat16, "f16": np.float16, "e5m2": ml_dtypes.float8_e5m2}[instruction.split(".")[2]]
    big = 2.0 ** (100 if dt is ml_dtypes.bfloat16 else 14)
    a = rng.standard_normal((M, K)).astype(dt).astype(np.float32)
    b = rng.standard_normal((K, N)).astype(dt).astype(np.float32)
    a[0, 3], a[1, 20], b[40, 2] = np.inf, -np.inf, np.nan
    a[2, :] = 0.0; a[2, 17] = big; b[17, :] = big                   # overflows in the second k-tile
    a[3, :] = 0.0; a[3, 0], a[3, 40] = -1.0, 1.0; b[:, 5] = 1.0      # D = -1, then exactly 0
    a[4, :] = -0.0                                                  # all products -0 or +0
    cfg = tcemu.GemmConfig(arch="H100", instruction=instruction, k_order=k_order, promotion_interval=32)
    y = np.asarray(tcemu.matmul(a, b, config=cfg))  # float32 (f16 D widened exactly)
    got = y.view(np.uint32)
    f16_out = instruction.split(".")[1] == "f16"
    if k_order == "sequential":
        want = _mma_sync_mainloop(a, b, instruction)
    else:  # promotion: chains of 32 from +0, each added to the float32 total with one RNE add
        halves = [_mma_sync_mainloop(a[:, h:h + 32], b[h:h + 32], instruction).view(np.float32) for h in (0, 32)]
        want = tcemu._src.numerics.engine.add(
            jnp.asarray(np.zeros((M, N), np.uint32)), jnp.asarray(halves[0].view(np.uint32)))
        want = np.asarray(tcemu._src.numerics.engine.add(want, jnp.asarray(halves[1].view(np.uint32))))
    if f16_out:
        want = np.asarray(tcemu._src.numerics.engine.convert(jnp.asarray(want), tcemu._src.formats.F16,
                                                             tcemu._src.formats.F32))
    np.testing.assert_array_equal(got, want)
    assert np.isinf(y[0]).sum() >= N - 1
    if dt is ml_dtypes.bfloat16 or f16_out:  # the product (bf16) or the f16 sum overflows
        assert np.isinf(y[2]).sum() >= N - 2
    assert got[3, 5] == 0 and (np.delete(got[4], 2) == 0).all()  # +0: exact zeros from a +0 start


def _rel_err(y, a, b):
    ref = np.asarray(a, np.float64) @ np.asarray(b, np.float64)
    return float(np.max(np.abs(np.asarray(y, np.float64) - ref) / np.abs(ref)))


def test_hopper_fp8_needs_promotion():
    """DeepSeek-V3: Hopper FP8 GEMMs keep ~14 bits; without promotion the error grows with K
    (here, positive inputs: 0.7 % at K = 512, 8 % at K = 4096), with promotion every 128 it
    stays at the error of one 128-long tensor-core chunk (~5e-4)."""
    rng = np.random.default_rng(0)
    cfg = tcemu.GemmConfig(arch="H100", instruction="wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3")
    errs = {}
    for K in (512, 4096):
        a = tcemu.quantize(rng.random((64, K)) + 0.1, "e4m3")  # positive: errors accumulate
        b = tcemu.quantize(rng.random((K, 8)) + 0.1, "e4m3")
        errs[K, "seq"] = _rel_err(tcemu.matmul(a, b, config=cfg), a, b)
        errs[K, "promo"] = _rel_err(tcemu.matmul(a, b, config=cfg.replace(k_order="promotion")), a, b)
    assert errs[4096, "seq"] > 2 * errs[512, "seq"]
    assert 0.01 < errs[4096, "seq"] < 0.2
    assert errs[4096, "promo"] < errs[4096, "seq"] / 20
    assert errs[4096, "promo"] < 1e-3 and errs[4096, "promo"] < 2 * errs[512, "promo"]  # does not grow


@pytest.mark.parametrize("k_order", ["sequential", "split_k", "promotion", "pairwise"])
def test_k_orders_against_exact_reductions(k_order):
    """The accumulation orders equal their definitions written with single instructions."""
    rng = np.random.default_rng(1)
    a = rng.standard_normal((16, 128)).astype(np.float16)
    b = rng.standard_normal((128, 8)).astype(np.float16)
    sp = "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"
    cfg = tcemu.GemmConfig(arch="A100", instruction="m16n8k16.f32.f16.f16.f32", k_order=k_order,
                           split_k=3, promotion_interval=32)
    one = lambda i, c: np.asarray(tcemu.mma(sp, a[:, 16 * i:16 * i + 16], b[16 * i:16 * i + 16], c, arch="A100"))  # noqa: E731
    z = np.zeros((16, 8), np.float32)
    f32 = lambda x: np.asarray(x, np.float32)  # noqa: E731
    if k_order == "sequential":
        d = z
        for i in range(8):
            d = one(i, d)
    elif k_order == "split_k":  # slices of ceil(8/3)=3 tiles: [0,1,2], [3,4,5], [6,7]
        parts = []
        for sl in ([0, 1, 2], [3, 4, 5], [6, 7]):
            d = z
            for i in sl:
                d = one(i, d)
            parts.append(d)
        d = f32(f32(parts[0] + parts[1]) + parts[2])
    elif k_order == "promotion":  # 2 tiles per promotion
        d = z
        for g in range(4):
            d = f32(d + one(2 * g + 1, one(2 * g, z)))
    else:
        p = [one(i, z) for i in range(8)]
        p = [f32(p[0] + p[1]), f32(p[2] + p[3]), f32(p[4] + p[5]), f32(p[6] + p[7])]
        d = f32(f32(p[0] + p[1]) + f32(p[2] + p[3]))
    got = tcemu.matmul(a, b, config=cfg)
    np.testing.assert_array_equal(np.asarray(got).view(np.uint32), np.asarray(d).view(np.uint32))


def test_gradients_agree_with_jnp_dot():
    rng = np.random.default_rng(2)
    a = jnp.asarray(rng.standard_normal((24, 40)), jnp.float32)
    b = jnp.asarray(rng.standard_normal((40, 12)), jnp.float32)
    cfg = tcemu.GemmConfig(arch="H100", instruction="m16n8k16.f32.bf16.bf16.f32")
    dot = functools.partial(tcemu.dot_general, config=cfg)
    loss = lambda f: lambda a, b: jnp.sum(jnp.sin(f(a, b, (((1,), (0,)), ((), ())))))  # noqa: E731
    ga, gb = jax.grad(loss(dot), argnums=(0, 1))(a, b)
    ra, rb = jax.grad(loss(jax.lax.dot_general), argnums=(0, 1))(a, b)
    # bf16 inputs: the forward differs by ~2**-8 relatively, the gradients by the same order
    np.testing.assert_allclose(ga, ra, rtol=0, atol=0.05 * float(jnp.abs(ra).max()))
    np.testing.assert_allclose(gb, rb, rtol=0, atol=0.05 * float(jnp.abs(rb).max()))
    # emulated backward GEMMs (their own config) stay close as well
    cfg2 = cfg.replace(grad_lhs=cfg, grad_rhs=cfg)
    ga2 = jax.grad(loss(functools.partial(tcemu.dot_general, config=cfg2)))(a, b)
    np.testing.assert_allclose(ga2, ga, rtol=0, atol=0.02 * float(jnp.abs(ga).max()))


def test_check_grads_exact_backward():
    """check_grads in exact-backward mode. The emulated forward is bilinear up to rounding its
    inputs to tf32 (2**-11), so central differences with a unit step are accurate to that."""
    from jax.test_util import check_grads

    rng = np.random.default_rng(3)
    a = jnp.asarray(rng.standard_normal((3, 5, 16)), jnp.float32)
    b = jnp.asarray(rng.standard_normal((16, 7)), jnp.float32)
    b3 = jnp.asarray(rng.standard_normal((3, 16, 7)), jnp.float32)
    cfg = tcemu.GemmConfig(arch="H100", instruction="m16n8k8.f32.tf32.tf32.f32")
    f = lambda a, b: tcemu.matmul(a, b, config=cfg)  # noqa: E731
    check_grads(f, (a, b), order=1, modes=["rev"], eps=1.0)
    check_grads(f, (a, b3), order=1, modes=["rev"], eps=1.0)


def test_dot_general_dimension_numbers_and_einsum():
    rng = np.random.default_rng(4)
    x = jnp.asarray(rng.standard_normal((3, 20, 4, 7)).astype(np.float16))
    y = jnp.asarray(rng.standard_normal((3, 7, 5, 20)).astype(np.float16))
    dn = (((1, 3), (3, 1)), ((0,), (0,)))
    cfg = tcemu.GemmConfig(arch="A100", instruction="m16n8k16.f32.f16.f16.f32")
    got = tcemu.dot_general(x, y, dn, preferred_element_type=jnp.float32, config=cfg)
    want = jax.lax.dot_general(x.astype(jnp.float32), y.astype(jnp.float32), dn, precision="highest")
    assert got.shape == want.shape == (3, 4, 5)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    assert tcemu.dot_general(x, y, dn, config=cfg).dtype == jnp.float16
    e = tcemu.einsum("bmk,bkn->bmn", x[:, :, 0, :].astype(jnp.float32), y[:, :, 0, :4].astype(jnp.float32), config=cfg)
    np.testing.assert_allclose(e, jnp.einsum("bmk,bkn->bmn", x[:, :, 0, :].astype(jnp.float32),
                                             y[:, :, 0, :4].astype(jnp.float32)), rtol=1e-5, atol=1e-4)


def test_jit_vmap_and_stochastic_quantisation():
    rng = np.random.default_rng(8)
    a = jnp.asarray(rng.standard_normal((4, 18, 33)), jnp.float32)
    b = jnp.asarray(rng.standard_normal((33, 9)), jnp.float32)
    cfg = tcemu.GemmConfig(arch="B200", instruction="m16n8k16.f32.bf16.bf16.f32")
    batched = jax.jit(jax.vmap(lambda x: tcemu.matmul(x, b, config=cfg)))(a)
    for i in range(4):
        np.testing.assert_array_equal(np.asarray(batched[i]), np.asarray(tcemu.matmul(a[i], b, config=cfg)))
    sr = cfg.replace(quantize="stochastic")
    k = jax.random.key(0)
    y1, y2 = tcemu.matmul(a[0], b, config=sr, key=k), tcemu.matmul(a[0], b, config=sr, key=k)
    np.testing.assert_array_equal(np.asarray(y1), np.asarray(y2))
    assert not np.array_equal(np.asarray(y1), np.asarray(tcemu.matmul(a[0], b, config=sr, key=jax.random.key(1))))
    with pytest.raises(ValueError, match="needs key"):
        tcemu.matmul(a[0], b, config=sr)


def test_config_validation():
    with pytest.raises(ValueError, match="k_order must be one of"):
        tcemu.GemmConfig(k_order="random")
    with pytest.raises(ValueError, match="same type"):
        tcemu.GemmConfig(instruction="m16n8k16.f16.f16.f16.f32")
    with pytest.raises(ValueError, match="floating-point"):
        tcemu.GemmConfig(instruction="m16n8k32.s32.s8.s8.s32")
    with pytest.raises(ValueError, match="multiple of the instruction's k=32"):
        tcemu.GemmConfig(instruction="m16n8k32.f32.e4m3.e4m3.f32", promotion_interval=48)
    with pytest.raises(ValueError, match="requires sm_89"):
        tcemu.GemmConfig(arch="A100", instruction="m16n8k32.f32.e4m3.e4m3.f32")


def test_flax_nnx_linear_trains():
    nnx = pytest.importorskip("flax.nnx")
    optax = pytest.importorskip("optax")
    dot = functools.partial(tcemu.dot_general, config=tcemu.GemmConfig(arch="H100", instruction="m16n8k16.f32.bf16.bf16.f32"))
    rngs = nnx.Rngs(0)
    model = nnx.Sequential(nnx.Linear(8, 16, dot_general=dot, rngs=rngs), jax.nn.relu,
                           nnx.Linear(16, 1, dot_general=dot, rngs=rngs))
    opt = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
    x = jax.random.normal(jax.random.key(1), (64, 8))
    y = jnp.sum(x[:, :3], axis=1, keepdims=True)

    @nnx.jit
    def step(model, opt):
        loss, grads = nnx.value_and_grad(lambda m: jnp.mean((m(x) - y) ** 2))(model)
        opt.update(model, grads)
        return loss

    losses = [float(step(model, opt)) for _ in range(30)]
    assert losses[-1] < 0.5 * losses[0]


def test_flax_linen_dense_accepts_dot_general():
    nn = pytest.importorskip("flax.linen")
    dot = functools.partial(tcemu.dot_general, config=tcemu.GemmConfig(arch="A100", instruction="m16n8k16.f32.f16.f16.f32"))
    layer = nn.Dense(5, dot_general=dot)
    x = jnp.ones((3, 7))
    params = layer.init(jax.random.key(0), x)
    y = layer.apply(params, x)
    w = params["params"]["kernel"].astype(jnp.float16).astype(jnp.float32)
    np.testing.assert_allclose(y, x @ w + params["params"]["bias"], rtol=1e-6, atol=1e-6)


SHARD = textwrap.dedent("""
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    import tcemu
    mesh = Mesh(np.array(jax.devices()), ("data",))
    x = jnp.asarray(np.random.default_rng(0).standard_normal((64, 40)), jnp.float32)
    w = jnp.asarray(np.random.default_rng(1).standard_normal((40, 24)), jnp.float32)
    cfg = tcemu.GemmConfig(arch="H100", instruction="m16n8k16.f32.bf16.bf16.f32")
    f = jax.jit(lambda x, w: tcemu.matmul(x, w, config=cfg))
    xs = jax.device_put(x, NamedSharding(mesh, P("data")))
    out = f(xs, w)
    assert len(out.sharding.device_set) == 8, out.sharding
    np.testing.assert_array_equal(np.asarray(out), np.asarray(f(x, w)))
    grad = jax.jit(jax.grad(lambda x: f(x, w).sum()))
    np.testing.assert_array_equal(np.asarray(grad(xs)), np.asarray(grad(x)))
    print("OK")
""")


def test_matmul_shards_over_devices():
    r = run_on_devices(SHARD, 8)
    assert r.returncode == 0 and "OK" in r.stdout, r.stderr[-3000:]


@pytest.mark.parametrize("k_order", ["sequential", "pairwise"])
def test_4096_cubed_fits_in_4_gib(k_order):
    """Compiled memory of an emulated 4096^3 GEMM (XLA's memory analysis; not run here)."""
    s = jax.ShapeDtypeStruct((4096, 4096), jnp.float32)
    cfg = tcemu.GemmConfig(arch="H100", instruction="m16n8k16.f32.bf16.bf16.f32", k_order=k_order)
    m = jax.jit(lambda a, b: tcemu.matmul(a, b, config=cfg)).lower(s, s).compile().memory_analysis()
    assert m.temp_size_in_bytes + m.argument_size_in_bytes + m.output_size_in_bytes < 4 * 2 ** 30
