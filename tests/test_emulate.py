"""``tcemu.emulate``: whole Flax nnx / linen / Equinox / plain-JAX functions with every GEMM
emulated give the bits of the same model written by hand with ``tcemu.dot_general`` /
``tcemu.einsum`` (outputs and gradients), convolutions are exact implicit GEMMs, policies pick
configs per GEMM, unsupported GEMMs are reported, and the wrapper composes with JAX's transforms.
"""
from __future__ import annotations

import collections
import functools
import re

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import linen, nnx

import tcemu

CFG = tcemu.GemmConfig(arch="H100")  # bf16 inputs rounded to nearest even: float32 values change visibly
DOT = functools.partial(tcemu.dot_general, config=CFG)
EINSUM = functools.partial(tcemu.einsum, config=CFG)


@pytest.fixture(autouse=True)
def _float32_models():
    """The models here are built with JAX's default dtypes, float64 under ``TCEMU_X64=1``, and
    float64 GEMMs have no emulation (they are reported unsupported, as tested): x64 stays off,
    except inside :func:`test_same_bits_with_x64`, which turns it on itself."""
    with jax.enable_x64(False):
        yield


def bits(tree):
    return [(x.shape, x.dtype, np.asarray(x).tobytes()) for x in jax.tree.leaves(tree)]


def assert_same(a, b):
    assert bits(a) == bits(b)


def differs(a, b):
    return any(not np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def normal(seed, shape, dtype=jnp.float32):
    return jax.random.normal(jax.random.key(seed), shape, dtype)


def im2col_conv(lhs, rhs, window_strides, padding, lhs_dilation=None, rhs_dilation=None, dimension_numbers=None,
                feature_group_count=1, precision=None, preferred_element_type=None, out_sharding=None):
    """NHWC x HWIO convolution by hand: im2col with K over (r, s, c), c fastest, one tcemu GEMM."""
    assert feature_group_count == 1 and set(lhs_dilation or (1,)) == set(rhs_dilation or (1,)) == {1}
    R, S, C, O = rhs.shape
    pads = jax.lax.padtype_to_pads(lhs.shape[1:3], (R, S), window_strides, padding) if isinstance(padding, str) else padding
    xp = jnp.pad(lhs, ((0, 0), *pads, (0, 0)))
    (sh, sw), Ho, Wo = window_strides, (xp.shape[1] - R) // window_strides[0] + 1, (xp.shape[2] - S) // window_strides[1] + 1
    taps = [xp[:, r:r + (Ho - 1) * sh + 1:sh, s:s + (Wo - 1) * sw + 1:sw, :] for r in range(R) for s in range(S)]
    a = jnp.stack(taps, axis=3).reshape(-1, R * S * C)
    return DOT(a, rhs.reshape(R * S * C, O), (((1,), (0,)), ((), ()))).reshape(lhs.shape[0], Ho, Wo, O)


# ---------------------------------------------------------------- models, native and by hand


class NnxNet(nnx.Module):
    """Conv, an MLP over the pixels as tokens, einsum attention; the GEMM functions pluggable."""

    def __init__(self, rngs, dot=jax.lax.dot_general, conv=jax.lax.conv_general_dilated, einsum=jnp.einsum):
        self.conv = nnx.Conv(3, 4, (3, 3), rngs=rngs, conv_general_dilated=conv)
        self.mlp_in = nnx.Linear(4, 16, rngs=rngs, dot_general=dot)
        self.mlp_out = nnx.Linear(16, 8, rngs=rngs, dot_general=dot)
        self.qkv = nnx.Linear(8, 24, rngs=rngs, dot_general=dot)
        self.einsum = einsum

    def __call__(self, x):
        h = jax.nn.relu(self.conv(x))
        h = self.mlp_out(jax.nn.gelu(self.mlp_in(h.reshape(h.shape[0], -1, h.shape[-1]))))
        q, k, v = jnp.split(self.qkv(h), 3, axis=-1)
        p = jax.nn.softmax(self.einsum("btd,bsd->bts", q, k) / jnp.sqrt(8.0), axis=-1)
        return self.einsum("bts,bsd->btd", p, v)


class LinenNet(linen.Module):
    dot: object = None
    conv: object = None
    einsum: object = jnp.einsum

    @linen.compact
    def __call__(self, x):
        h = linen.relu(linen.Conv(4, (3, 3), name="conv", conv_general_dilated=self.conv)(x))
        h = h.reshape(h.shape[0], -1, h.shape[-1])
        h = linen.Dense(8, name="mlp_in", dot_general=self.dot or jax.lax.dot_general)(h)
        with jax.named_scope("attn"):
            s = self.einsum("btd,bsd->bts", h, h)
            return self.einsum("bts,bsd->btd", jax.nn.softmax(s, axis=-1), h)


def eqx_model(key):
    k1, k2, k3 = jax.random.split(key, 3)
    return (eqx.nn.Conv2d(3, 4, 3, padding=1, key=k1), eqx.nn.Linear(64, 8, key=k2),
            eqx.nn.MLP(8, 2, width_size=16, depth=2, key=k3))


def eqx_native(model, x):  # one example (3, 4, 4)
    conv, lin, mlp = model
    return mlp(lin(jax.nn.relu(conv(x)).reshape(-1)))


def eqx_by_hand(model, x):
    conv, lin, mlp = model
    h = im2col_conv(x.transpose(1, 2, 0)[None], conv.weight.transpose(2, 3, 1, 0), (1, 1), ((1, 1), (1, 1)))
    h = jax.nn.relu(h[0].transpose(2, 0, 1) + conv.bias).reshape(-1)
    linear = lambda layer, v: DOT(layer.weight, v, (((1,), (0,)), ((), ()))) + layer.bias  # noqa: E731
    h = linear(lin, h)
    for layer in mlp.layers[:-1]:
        h = mlp.activation(linear(layer, h))
    return mlp.final_activation(linear(mlp.layers[-1], h))


# ---------------------------------------------------------------- 1. models: outputs and gradients


# The comparisons run under jax.jit, as models run: each side is one XLA program. (Run eagerly,
# emulate evaluates the jitted functions a model calls, such as jnp.einsum's, op by op, where the
# hand-written model runs them compiled; XLA may then sum a float32 gradient GEMM in another order.)


def test_nnx_model_outputs_and_gradients_are_the_hand_written_bits():
    x = normal(0, (2, 4, 4, 3))
    native, hand = NnxNet(nnx.Rngs(0)), NnxNet(nnx.Rngs(0), DOT, im2col_conv, EINSUM)
    fwd = tcemu.emulate(lambda m, x: m(x), CFG)
    call = jax.jit(lambda m, x: m(x))
    assert_same(jax.jit(fwd)(native, x), call(hand, x))
    assert differs(jax.jit(fwd)(native, x), call(native, x))
    grad = jax.jit(lambda f, m: nnx.grad(lambda m: (f(m, x) ** 2).sum())(m), static_argnums=0)
    assert_same(grad(fwd, native), grad(lambda m, x: m(x), hand))
    rows = fwd.report(native, x)
    assert [r.op.primitive for r in rows] == ["conv_general_dilated"] + ["dot_general"] * 5
    assert all(r.status == "emulated" for r in rows)
    assert rows[0].op.params == ("0/conv/kernel/value", "1") and (rows[0].op.M, rows[0].op.N, rows[0].op.K) == (32, 4, 27)


def test_linen_model_outputs_and_gradients_are_the_hand_written_bits():
    x = normal(1, (2, 4, 4, 3))
    params = LinenNet().init(jax.random.key(0), x)
    hand = LinenNet(DOT, im2col_conv, EINSUM)
    fwd = tcemu.emulate(LinenNet().apply, CFG)
    assert_same(jax.jit(fwd)(params, x), jax.jit(hand.apply)(params, x))
    assert differs(jax.jit(fwd)(params, x), LinenNet().apply(params, x))
    grad = jax.jit(lambda f, p: jax.grad(lambda p: (f(p, x) ** 2).sum())(p), static_argnums=0)
    assert_same(grad(fwd, params), grad(hand.apply, params))
    scopes = [r.op.scope for r in fwd.report(params, x)]
    assert scopes == ["LinenNet/conv", "LinenNet/mlp_in", "LinenNet/attn/btd,bsd->bts", "LinenNet/attn/bts,bsd->btd"]


def test_equinox_model_outputs_and_gradients_are_the_hand_written_bits():
    model, xs = eqx_model(jax.random.key(2)), normal(3, (2, 3, 4, 4))
    # vmapped outside, as the hand-written model (inside, the batch would be one GEMM, its gradient
    # summed over the batch in one dot instead of per example then added)
    fwd = jax.vmap(tcemu.emulate(eqx_native, CFG), in_axes=(None, 0))
    by_hand = jax.vmap(eqx_by_hand, in_axes=(None, 0))
    assert_same(eqx.filter_jit(fwd)(model, xs), eqx.filter_jit(by_hand)(model, xs))
    assert differs(eqx.filter_jit(fwd)(model, xs), jax.vmap(eqx_native, in_axes=(None, 0))(model, xs))
    grad = lambda f: eqx.filter_jit(eqx.filter_grad(lambda m: (f(m, xs) ** 2).sum()))(model)  # noqa: E731
    assert_same(grad(fwd), grad(by_hand))
    params = [r.op.params[0] for r in tcemu.emulate(eqx_native, CFG).report(model, xs[0])]
    assert params == ["0/0/weight", "0/1/weight", "0/2/layers/0/weight", "0/2/layers/1/weight", "0/2/layers/2/weight"]


# ---------------------------------------------------------------- 2. convolutions

CONVS = [  # (spatial dims, layouts, strides, padding, lhs dilation, rhs dilation, feature groups, batch groups)
    (1, ("NCH", "OIH", "NCH"), (2,), "SAME", (1,), (2,), 4, 1),
    (2, ("NCHW", "OIHW", "NCHW"), (1, 1), "VALID", (1, 1), (1, 1), 1, 1),
    (2, ("NHWC", "HWIO", "NHWC"), (2, 1), "SAME", (1, 1), (2, 1), 2, 1),
    (2, ("NCHW", "OIHW", "NHWC"), (1, 2), ((1, 2), (0, -1)), (2, 1), (1, 1), 1, 1),
    (2, ("NHWC", "OIHW", "NCHW"), (1, 1), ((2, 0), (1, 1)), (1, 1), (1, 1), 1, 2),
    (3, ("NCDHW", "OIDHW", "NCDHW"), (1, 2, 1), "SAME", (1, 1, 1), (1, 1, 2), 2, 1),
]


def _conv_operands(spatial, layouts, fg, bg, rng, draw):
    size = {"N": 2 * bg, "C": 4, "O": 4, "I": 4 // fg}
    names = "HWX"[:spatial]  # D written X: it is a spatial dim here
    lhs_layout, rhs_layout = layouts[0].replace("D", "X"), layouts[1].replace("D", "X")
    lhs_shape = [size.get(c) or dict(zip(names, (5, 6, 4)))[c] for c in lhs_layout]
    rhs_shape = [size.get(c) or dict(zip(names, (3, 2, 2)))[c] for c in rhs_layout]
    return draw(rng, lhs_shape), draw(rng, rhs_shape)


@pytest.mark.parametrize("case", CONVS, ids=lambda c: f"{c[0]}d-{c[1][0]}-g{c[6]}b{c[7]}")
def test_emulated_conv_is_exact_on_exactly_summable_inputs(case):
    spatial, layouts, strides, padding, lhs_dil, rhs_dil, fg, bg = case
    rng = np.random.default_rng(spatial + fg)
    ints = lambda r, s: jnp.asarray(r.integers(-3, 4, s), jnp.float32)  # noqa: E731
    x, w = _conv_operands(spatial, layouts, fg, bg, rng, ints)
    dn = jax.lax.conv_dimension_numbers(x.shape, w.shape, layouts)
    conv = lambda x, w: jax.lax.conv_general_dilated(x, w, strides, padding, lhs_dil, rhs_dil, dn, fg, bg)  # noqa: E731
    out = tcemu.emulate(conv, CFG)(x, w)
    assert_same(out, conv(x, w))
    if case is CONVS[2]:  # random values: bf16 rounding shows
        x, w = _conv_operands(spatial, layouts, fg, bg, rng, lambda r, s: jnp.asarray(r.normal(size=s), jnp.float32))
        assert differs(tcemu.emulate(conv, CFG)(x, w), conv(x, w))


def test_conv_k_order_is_taps_then_channels_channel_fastest():
    """The implicit GEMM's K runs over (kernel taps, input channels), channel fastest: the bits of
    the NHWC im2col, not of conv_general_dilated_patches' channel-slowest order."""
    x, w = normal(20, (1, 4, 4, 8)), normal(21, (3, 3, 8, 4))
    nhwc = ("NHWC", "HWIO", "NHWC")
    conv = lambda x, w: jax.lax.conv_general_dilated(x, w, (1, 1), "VALID", dimension_numbers=nhwc)  # noqa: E731
    out = tcemu.emulate(conv, CFG)(x, w)
    assert_same(out, im2col_conv(x, w, (1, 1), "VALID"))
    p = jax.lax.conv_general_dilated_patches(x, (3, 3), (1, 1), "VALID", dimension_numbers=nhwc,
                                             precision=jax.lax.Precision.HIGHEST)  # features (c, r, s)
    channel_slowest = DOT(p.reshape(-1, 72), w.transpose(2, 0, 1, 3).reshape(72, 4), (((1,), (0,)), ((), ())))
    assert differs(out, channel_slowest.reshape(out.shape))


def test_conv_patches_move_infinities_unchanged():
    """The patches are data movement: an infinity reaches only its windows (no inf * 0 = NaN of a
    one-hot patch convolution)."""
    x = jnp.full((1, 1, 5, 5), -0.0).at[0, 0, 2, 2].set(jnp.inf)
    w = jnp.full((1, 1, 3, 3), 2.0)
    conv = lambda x, w: jax.lax.conv_general_dilated(x, w, (1, 1), "SAME")  # noqa: E731
    out = tcemu.emulate(conv, CFG)(x, w)
    assert int(jnp.isinf(out).sum()) == 9 and not bool(jnp.isnan(out).any())
    assert_same(out, conv(x, w))


def test_conv_gradients_inside_follow_the_vjp_rule():
    """A convolution's gradient convolutions (jax.grad inside) run exactly in float32 on the
    forward operands as quantised (the kernel read reversed): jax.grad outside, up to the order
    of float32 sums."""
    x, w = normal(24, (1, 4, 4, 3)), normal(25, (3, 3, 3, 2))
    conv = lambda x, w: jax.lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))  # noqa: E731
    loss = lambda x, w: (conv(x, w) ** 2).sum()  # noqa: E731
    inside = tcemu.emulate(jax.grad(loss, argnums=(0, 1)), CFG)
    assert [r.status for r in inside.report(x, w)] == ["emulated", "exact float32 (vjp)", "exact float32 (vjp)"]
    got, want = jax.jit(inside)(x, w), jax.jit(jax.grad(tcemu.emulate(loss, CFG), argnums=(0, 1)))(x, w)
    for a, b, c in zip(got, want, jax.grad(loss, argnums=(0, 1))(x, w)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
        assert float(jnp.abs(a - b).max()) < float(jnp.abs(b - c).max()) / 10


# ---------------------------------------------------------------- 3. policies


def test_policy_shorthands_rules_and_library():
    x, w = normal(4, (4, 16), jnp.bfloat16), normal(5, (16, 8), jnp.bfloat16)
    f = lambda x, w: jnp.dot(x, w, preferred_element_type=jnp.float32)  # noqa: E731
    by_cfg = tcemu.emulate(f, CFG)(x, w)
    assert_same(by_cfg, tcemu.matmul(x, w, config=CFG))
    assert_same(tcemu.emulate(f, lambda op: CFG if op.K == 16 else None)(x, w), by_cfg)
    assert_same(tcemu.emulate(f, lambda op: None)(x, w), f(x, w))
    assert_same(tcemu.emulate(f, tcemu.Policy(rules=[({"dtype": "bfloat16"}, CFG)]))(x, w), by_cfg)
    assert_same(tcemu.emulate(f, tcemu.Policy(rules=[({"dtype": ["float16"]}, CFG)]))(x, w), f(x, w))
    assert_same(tcemu.emulate(f, tcemu.Policy(rules=[({"min_k": 17}, CFG)], default=None))(x, w), f(x, w))
    lib = tcemu.library_config("jnp.dot", arch="H100", M=4, N=8, K=16, a="bf16", b="bf16", out="f32")
    assert_same(tcemu.emulate(f, tcemu.Policy.library("jnp.dot", arch="H100"))(x, w),
                tcemu.matmul(x, w, config=lib))
    rows = tcemu.emulate(f, tcemu.Policy.library("jnp.dot", arch="H100")).report(x.astype(jnp.float32), w)
    assert rows[0].status.startswith("unsupported: library_config: a must be one of")


def test_policy_rules_by_scope_param_and_backward():
    x = normal(6, (2, 4, 4, 3))
    params = LinenNet().init(jax.random.key(0), x)
    attn_only = tcemu.Policy(rules=[({"scope": "*attn*"}, CFG)])
    assert [r.status for r in tcemu.emulate(LinenNet().apply, attn_only).report(params, x)] == \
        ["native (policy)"] * 2 + ["emulated"] * 2
    hand = LinenNet(einsum=EINSUM)
    assert_same(tcemu.emulate(LinenNet().apply, attn_only)(params, x), hand.apply(params, x))
    model = NnxNet(nnx.Rngs(0))
    by_param = tcemu.Policy(rules=[({"param": "*mlp_*kernel*"}, CFG)])
    rows = tcemu.emulate(lambda m, x: m(x), by_param).report(model, x)
    assert [r.status == "emulated" for r in rows] == [False, True, True, False, False, False]
    # a train step: gradient GEMMs by the VJP rule, or by a "backward" rule
    step = lambda m, x: nnx.grad(lambda m: (m(x) ** 2).sum())(m)  # noqa: E731
    rows = tcemu.emulate(step, by_param).report(model, x)
    assert {r.status for r in rows if r.op.backward} == {"native (policy)", "exact float32 (vjp)"}
    assert all(r.op.scope.startswith("transpose(jvp(") for r in rows if r.op.backward)
    grads_emulated = tcemu.Policy(rules=[({"param": "*mlp_*kernel*"}, CFG), ({"backward": True}, CFG)])
    rows = tcemu.emulate(step, grads_emulated).report(model, x)
    assert all(r.status == "emulated" for r in rows if r.op.backward)
    rows = tcemu.emulate(step, tcemu.Policy(default=CFG, backward=None)).report(model, x)
    assert all(r.status == ("native (policy)" if r.op.backward else "emulated") for r in rows)
    rows = tcemu.emulate(step, tcemu.Policy(default=CFG, backward="forward")).report(model, x)
    assert all(r.status == "emulated" and r.config == CFG for r in rows)


def test_policy_validation_errors():
    with pytest.raises(TypeError, match="policy must be a tcemu.GemmConfig"):
        tcemu.emulate(jnp.dot, "H100")
    with pytest.raises(ValueError, match="unsupported must be one of 'error', 'native'"):
        tcemu.emulate(jnp.dot, CFG, unsupported="skip")
    with pytest.raises(ValueError, match=r"unknown key\(s\) 'name'; valid keys: scope, param"):
        tcemu.Policy(rules=[({"name": "x"}, CFG)])
    with pytest.raises(TypeError, match=r"Policy.rules\[0\] must be a \(match, config\) pair"):
        tcemu.Policy(rules=[{"scope": "x"}])
    with pytest.raises(ValueError, match="unknown primitive"):
        tcemu.Policy(rules=[({"primitive": "conv"}, CFG)])
    with pytest.raises(ValueError, match="is not a dtype"):
        tcemu.Policy(rules=[({"dtype": "bf16"}, CFG)])
    with pytest.raises(TypeError, match="Policy.default must be a tcemu.GemmConfig, None"):
        tcemu.Policy(default="H100")
    with pytest.raises(ValueError, match="Policy.backward must be one of 'vjp', 'forward'"):
        tcemu.Policy(backward="exact")
    with pytest.raises(ValueError, match="Policy.library: lib must be one of torch.mm"):
        tcemu.Policy.library("cublas", arch="H100")
    with pytest.raises(TypeError, match="jnp.dot takes no flag use_fast_accum"):
        tcemu.Policy.library("jnp.dot", arch="H100", use_fast_accum=True)
    with pytest.raises(TypeError, match="must return a tcemu.GemmConfig or None"):
        tcemu.emulate(jnp.dot, lambda op: "H100")(jnp.ones((2, 2)), jnp.ones((2, 2)))


# ---------------------------------------------------------------- 4. reports and unsupported GEMMs


def test_report_and_unsupported_gemms():
    def f(x, w, i):
        return x @ w, jnp.dot(i, i, preferred_element_type=jnp.int32)

    x, w, i = jnp.ones((2, 16)), jnp.ones((16, 8)), jnp.ones((4, 4), jnp.int8)
    rows = tcemu.emulate(f, CFG).report(x, w, i)
    assert [r.status for r in rows][0] == "emulated"
    assert rows[1].status.startswith("unsupported: lhs is int8: tcemu's GEMM emulates floating-point")
    table = str(rows)
    assert "int8[4,4] x int8[4,4] -> int32" in table and "H100 m16n8k16.f32.bf16.bf16.f32" in table
    with pytest.raises(ValueError, match=r"dot_general '' int8\[4,4\] x int8\[4,4\] -> int32 .*unsupported=\"native\""):
        tcemu.emulate(f, CFG)(x, w, i)
    with pytest.warns(UserWarning, match="runs dot_general '' int8.* natively: lhs is int8") as record:
        out = tcemu.emulate(f, CFG, unsupported="native")(x, w, i)
    assert len([r for r in record if "tcemu.emulate" in str(r.message)]) == 1
    assert_same(out[1], f(x, w, i)[1])
    assert tcemu.emulate(f, tcemu.Policy(rules=[({"dtype": "float32"}, CFG)])).report(x, w, i)[1].status == "native (policy)"
    mx = tcemu.GemmConfig(arch="RTX5090", instruction="mma.sync.aligned.m16n8k32.row.col.kind::mxf8f6f4.block_scale"
                                                    ".scale_vec::1X.f32.e4m3.e4m3.f32.ue8m0")
    row = tcemu.emulate(jnp.dot, mx).report(jnp.ones((16, 48)), jnp.ones((48, 8)))[0]
    assert row.status.startswith("unsupported: ") and "multiple of the scale block 32" in row.status


def test_gemms_inside_an_unknown_primitive_are_unsupported():
    def solve(a, b):
        return jax.lax.custom_linear_solve(lambda x: a @ x, b, lambda mv, b: b / jnp.diag(a))

    a, b = jnp.eye(4) * 2.0, jnp.ones(4)
    rows = tcemu.emulate(solve, CFG).report(a, b)
    assert rows and all("inside custom_linear_solve" in r.status for r in rows)
    with pytest.warns(UserWarning, match="inside custom_linear_solve"):
        assert_same(tcemu.emulate(solve, CFG, unsupported="native")(a, b), solve(a, b))


# ---------------------------------------------------------------- 5. composition with JAX


def test_jit_vmap_grad_compose_both_ways():
    x, w = normal(7, (3, 4, 16)), normal(8, (16, 8))
    f = lambda x, w: jnp.tanh(x @ w).sum()  # noqa: E731
    hand = lambda x, w: jnp.tanh(DOT(x, w, (((x.ndim - 1,), (0,)), ((), ())))).sum()  # noqa: E731
    em = tcemu.emulate(f, CFG)
    assert_same(jax.jit(jax.grad(em, argnums=1))(x, w), jax.jit(jax.grad(hand, argnums=1))(x, w))
    assert_same(jax.vmap(em, in_axes=(0, None))(x, w), jax.vmap(hand, in_axes=(0, None))(x, w))
    assert_same(tcemu.emulate(jax.vmap(f, in_axes=(0, None)), CFG)(x, w), jax.vmap(hand, in_axes=(0, None))(x, w))
    # grad inside: the gradient GEMMs as tcemu's VJP computes them, exact or with their own configs
    inner = tcemu.emulate(jax.grad(f, argnums=1), CFG)
    assert_same(jax.jit(inner)(x, w), jax.jit(jax.grad(hand, argnums=1))(x, w))
    cfg = CFG.replace(grad_lhs=tcemu.GemmConfig(arch="A100"), grad_rhs=CFG)
    hand = lambda x, w: jnp.tanh(tcemu.dot_general(x, w, (((2,), (0,)), ((), ())), config=cfg)).sum()  # noqa: E731
    inner = tcemu.emulate(jax.grad(f, argnums=(0, 1)), cfg)
    assert_same(jax.jit(inner)(x, w), jax.jit(jax.grad(hand, argnums=(0, 1)))(x, w))
    assert [(r.status, r.config) for r in inner.report(x, w)][1:] == [("emulated", cfg.grad_rhs), ("emulated", cfg.grad_lhs)]


def test_shard_map():
    mesh = jax.make_mesh((1,), ("x",))
    w = normal(22, (8, 8))
    f = jax.shard_map(lambda x: jnp.tanh(x @ w), mesh=mesh, in_specs=jax.P(), out_specs=jax.P())
    x = normal(23, (4, 8))
    assert_same(tcemu.emulate(f, CFG)(x), jnp.tanh(tcemu.matmul(x, w, config=CFG)))


def test_scan_checkpoint_cond_while_and_inner_jit():
    ws, x = normal(9, (3, 16, 16)) / 4, normal(10, (4, 16))

    def net(ws, x, mm, loop=False):
        h, _ = jax.lax.scan(lambda h, w: (jnp.tanh(mm(h, w)), None), x, ws)
        h = jax.checkpoint(lambda h: jnp.sin(mm(h, ws[0])))(h)
        h = jax.lax.cond(h.sum() > 0, lambda h: mm(h, ws[1]), lambda h: -mm(h, ws[2]), h)
        if loop:  # not reverse-differentiable
            h = jax.lax.while_loop(lambda c: c[1] < 2, lambda c: (mm(c[0], ws[0]), c[1] + 1), (h, 0))[0]
        return jax.jit(lambda h: mm(h, ws[1]))(h).sum()

    native = functools.partial(net, mm=jnp.matmul)
    hand = functools.partial(net, mm=lambda a, b: tcemu.matmul(a, b, config=CFG))
    em = tcemu.emulate(native, CFG)
    jit = functools.partial(jax.jit, static_argnames="loop")
    assert_same(jit(em)(ws, x, loop=True), jit(hand)(ws, x, loop=True))
    assert_same(jax.jit(jax.grad(em))(ws, x), jax.jit(jax.grad(hand))(ws, x))
    rows = em.report(ws, x, loop=True)
    assert len(rows) == 6 and all(r.status == "emulated" for r in rows)
    assert [r.op.params for r in rows] == [("0",)] * 6  # a slice of the stacked weights keeps its path


def test_custom_jvp_and_vjp_with_gemms_inside_use_the_emulated_gemms_rule():
    w = normal(11, (8, 8))

    @jax.custom_jvp
    def f(x):
        return x @ w

    f.defjvp(lambda p, t: (p[0] @ w, 0.0 * t[0]))  # a wrong rule, dropped: the emulated GEMM's own VJP

    @jax.custom_vjp
    def g(x):
        return x @ w

    g.defvjp(lambda x: (x @ w, None), lambda _, ct: (0.0 * ct,))
    x = normal(12, (2, 8))
    for fn in (f, g):
        grad = jax.grad(lambda x: tcemu.emulate(fn, CFG)(x).sum())(x)
        assert_same(grad, jax.grad(lambda x: tcemu.matmul(x, w, config=CFG).sum())(x))
    relu = tcemu.emulate(lambda x: jax.nn.relu(x @ w), CFG)  # a custom_jvp without GEMMs keeps its rule
    by_hand = lambda x: jax.nn.relu(tcemu.matmul(x, w, config=CFG)).sum()  # noqa: E731
    assert_same(jax.grad(lambda x: relu(x).sum())(x), jax.grad(by_hand)(x))


def _train_step(model, opt, x, y):
    def loss(model):
        return ((model(x) - y) ** 2).mean()

    value, grads = nnx.value_and_grad(loss)(model)
    opt.update(model, grads)
    return value


class Mlp(nnx.Module):
    def __init__(self, rngs, dot=jax.lax.dot_general):
        self.l1 = nnx.Linear(8, 16, rngs=rngs, dot_general=dot)
        self.l2 = nnx.Linear(16, 4, rngs=rngs, dot_general=dot)

    def __call__(self, x):
        return self.l2(jax.nn.relu(self.l1(x)))


def test_nnx_train_step_with_optimizer_mutates_the_model_as_the_hand_written_step():
    x, y = normal(13, (4, 8)), normal(14, (4, 4))
    model, hand, native = Mlp(nnx.Rngs(0)), Mlp(nnx.Rngs(0), DOT), Mlp(nnx.Rngs(0))
    opts = [nnx.Optimizer(m, optax.adam(0.1), wrt=nnx.Param) for m in (model, hand, native)]
    step_emulated, step = nnx.jit(tcemu.emulate(_train_step, CFG)), nnx.jit(_train_step)
    for _ in range(2):
        assert_same(step_emulated(model, opts[0], x, y), step(hand, opts[1], x, y))
    assert_same(nnx.state(model), nnx.state(hand))
    assert_same(nnx.state(opts[0]), nnx.state(opts[1]))
    assert int(opts[0].step[...]) == 2
    step(native, opts[2], x, y)
    step(native, opts[2], x, y)
    assert differs(nnx.state(model, nnx.Param), nnx.state(native, nnx.Param))


def test_nnx_arguments_and_models_called_as_fn_are_updated_in_place():
    class Counter(nnx.Module):
        def __init__(self):
            self.w = nnx.Param(jnp.ones((8, 2)))
            self.calls = nnx.Variable(jnp.zeros((), jnp.int32))

        def __call__(self, x):
            self.calls[...] += 1
            return x @ self.w[...]

    m = Counter()
    tcemu.emulate(lambda m, x: m(x), CFG)(m, jnp.ones((1, 8)))
    out = tcemu.emulate(m, CFG)(jnp.ones((1, 8)))
    assert int(m.calls[...]) == 2 and out.tolist() == [[8.0, 8.0]]
    assert tcemu.emulate(m, CFG).report(jnp.ones((1, 8)))[0].op.params == ("0", "fn/w/value")


def test_static_leaves_kwargs_and_the_trace_cache():
    calls = []

    def f(x, *, w, scale, act):
        calls.append(1)
        return act(x @ w) * scale

    em = tcemu.emulate(f, CFG)
    x, w = normal(15, (2, 16)), normal(16, (16, 4))
    a = em(x, w=w, scale=2.0, act=jnp.tanh)
    assert_same(a, jnp.tanh(tcemu.matmul(x, w, config=CFG)) * 2.0)
    em(x + 1, w=w, scale=2.0, act=jnp.tanh)
    assert len(calls) == 1  # traced once per structure, shapes and static values
    em(x, w=w, scale=3.0, act=jnp.tanh)
    assert len(calls) == 2
    assert em.report(x, w=w, scale=2.0, act=jnp.tanh)[0].op.params == ("0", "w")


def test_same_bits_with_x64():
    params, x = {"w1": normal(18, (8, 16)), "w2": normal(19, (16, 4))}, normal(20, (2, 8))
    mlp = tcemu.emulate(lambda p, x: jax.nn.relu(x @ p["w1"]) @ p["w2"] * 0.5, CFG)
    off = mlp(params, x)
    with jax.enable_x64(True):
        on = mlp(params, x)
    assert_same(off, on)
    assert differs(off, jax.nn.relu(x @ params["w1"]) @ params["w2"] * 0.5)


# ---------------------------------------------------------------- 6. no overhead under jit


def _ops(text):
    return collections.Counter(re.findall(r"(?:stablehlo|chlo|func)\.[a-z_]+", text))


def test_jitted_emulated_function_lowers_to_the_hand_written_program():
    x = normal(17, (2, 8))
    model, hand = Mlp(nnx.Rngs(0)), Mlp(nnx.Rngs(0), DOT)
    em = tcemu.emulate(lambda m, x: m(x), CFG)
    lowered = jax.jit(em).lower(model, x).as_text()
    assert _ops(lowered) == _ops(jax.jit(lambda m, x: m(x)).lower(hand, x).as_text())
    step = jax.jit(jax.grad(lambda m: (em(m, x) ** 2).sum()))
    assert _ops(step.lower(model).as_text()) == _ops(jax.jit(jax.grad(lambda m: (m(x) ** 2).sum())).lower(hand).as_text())
