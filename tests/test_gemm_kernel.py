"""The Pallas GEMM kernel (tcemu/_src/gemm_kernel.py) gives the XLA path's bits: on every kind of
model (float and integer alignment, sticky bits, normalised products, zero-term exponents, block
orders, C added last, f16 and 13-bit accumulators), with NaN only where a special value may
decide the result. On CPU the kernel runs in Pallas's interpreter; on a GPU, compiled by Triton.
The XLA path itself is checked against hardware captures and the register-level instructions
(test_gemm.py, test_*_hw.py)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tcemu
from tcemu._src import formats as fm
from tcemu._src import gemm, gemm_kernel
from tcemu._src.arch import resolve
from tcemu._src.numerics import mma as mma_numerics

KERNEL = "triton" if jax.default_backend() == "gpu" else "interpret"

PRESETS = [("wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16", "H100"),
           ("m16n8k16.f32.f16.f16.f32", "A100"),
           ("m16n8k16.f32.bf16.bf16.f32", "H100"),
           ("m16n8k8.f32.tf32.tf32.f32", "A100"),
           ("m16n8k32.f32.e4m3.e5m2.f32", "H100"),
           ("wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3", "H100"),
           ("m16n8k16.f16.f16.f16.f16", "A100"),
           ("wmma.mma.sync.aligned.row.col.m16n16k16.f32.f32", "V100"),
           ("m16n8k32.f16.e5m2.e4m3.f16", "B200")]

BF16 = "m16n8k16.f32.bf16.bf16.f32"
CUSTOM = [  # (instruction, model changes): the integer path's shifts, sticky bits and policies
    (BF16, dict(sticky=True, fraction_bits=24, block_size=8)),
    (BF16, dict(normalize_products=True, fraction_bits=23)),
    (BF16, dict(zero_exponent=-30, min_exponent=-20, rounding="rne")),
    (BF16, dict(accumulator_fraction_bits=13, rounding="rz", block_size=16)),
    ("m16n8k16.f32.f16.f16.f32", dict(subnormal_inputs=False, subnormal_outputs=False, addend="last",
                                      addend_rounding="rne")),
    ("m16n8k16.f32.f16.f16.f32", dict(fraction_bits=27, block_order=(1, 0, 3, 2), rounding="rd")),
]


def _operands(ins, M, K, N, seed):
    """Random operands over a wide exponent range that keeps sums finite in every accumulator."""
    spread = min(fm.FORMATS[t].emax for t in (ins.atype, ins.btype, ins.dtype)) // 2 - 1
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((M, K)) * 2.0 ** rng.integers(-spread, spread, (M, K))
    b = rng.standard_normal((K, N)) * 2.0 ** rng.integers(-spread, spread, (K, N))
    a[rng.random((M, K)) < 0.1] = 0.0
    qa = gemm.quantize(jnp.asarray(a, jnp.float32), ins.atype)
    qb = gemm.quantize(jnp.asarray(b, jnp.float32), ins.btype)
    return gemm._bits(qa, ins.atype), gemm._bits(qb, ins.btype)


def _both(monkeypatch, cfg, A, B):
    """(XLA path's D bits, kernel's D bits, accumulator format) of one sequential GEMM."""
    ins = cfg.ins
    model = mma_numerics.resolve_model(ins, cfg.model, resolve(cfg.arch))
    monkeypatch.setenv("TCEMU_GEMM_KERNEL", "off")
    ref, fmt = gemm.gemm_bits(A, B, cfg)
    monkeypatch.setenv("TCEMU_GEMM_KERNEL", KERNEL)
    m, n, k = ins.m, ins.n, ins.k
    (M, K), N = A.shape, B.shape[1]
    Ap = jnp.pad(A, ((0, -M % m), (0, -K % k)))
    Bp = jnp.pad(B, ((0, -K % k), (0, -N % n)))
    got = jax.jit(lambda x, y: gemm_kernel.sequential(x, y, ins, model))(Ap, Bp)[:M, :N]
    return np.asarray(ref), np.asarray(got), fmt


@pytest.mark.parametrize("instruction,arch", PRESETS)
def test_kernel_equals_xla_path_on_presets(monkeypatch, instruction, arch):
    cfg = tcemu.GemmConfig(arch=arch, instruction=instruction)
    ins = cfg.ins
    A, B = _operands(ins, ins.m + 5, 3 * ins.k + 3, 2 * ins.n + 3, seed=len(instruction))
    ref, got, fmt = _both(monkeypatch, cfg, A, B)
    assert not np.asarray(fm.decode(got, fmt).is_nan).any()
    assert (ref != got).sum() == 0


@pytest.mark.parametrize("instruction,changes", CUSTOM)
def test_kernel_equals_xla_path_on_custom_models(monkeypatch, instruction, changes):
    ins = gemm._instruction(instruction)
    model = mma_numerics.resolve_model(ins, None, resolve("H100")).replace(**changes)
    cfg = tcemu.GemmConfig(arch="H100", instruction=instruction, model=model)
    A, B = _operands(ins, 21, 70, 19, seed=7)
    ref, got, fmt = _both(monkeypatch, cfg, A, B)
    assert not np.asarray(fm.decode(got, fmt).is_nan).any()
    assert (ref != got).sum() == 0


@pytest.mark.parametrize("instruction,arch", [PRESETS[0], PRESETS[2], PRESETS[6]])
def test_kernel_defers_special_values(monkeypatch, instruction, arch):
    """NaN, infinities, -0 and overflow: every output where the kernel differs is NaN there (the
    GEMM then takes the exact path), and tcemu.matmul gives the same bits either way."""
    cfg = tcemu.GemmConfig(arch=arch, instruction=instruction)
    ins = cfg.ins
    M, K, N = 24, 4 * ins.k, 20
    rng = np.random.default_rng(3)
    a = rng.standard_normal((M, K)).astype(np.float32)
    b = rng.standard_normal((K, N)).astype(np.float32)
    a[0, 5], a[1, 9], a[2, :] = np.nan, np.inf, -0.0
    b[3, 4], b[:, 6] = -np.inf, -0.0
    a[4, 0], b[0, 7] = 6e4, 6e4  # overflows f16 accumulators in the middle of K
    A, B = (gemm._bits(gemm.quantize(jnp.asarray(x), t), t) for x, t in ((a, ins.atype), (b, ins.btype)))
    ref, got, fmt = _both(monkeypatch, cfg, A, B)
    nan = np.asarray(fm.decode(got, fmt).is_nan)
    assert nan.any() and not nan.all()
    assert ((ref != got) & ~nan).sum() == 0
    outs = {}
    for mode in ("off", KERNEL):
        monkeypatch.setenv("TCEMU_GEMM_KERNEL", mode)
        outs[mode] = np.asarray(jax.jit(lambda x, y: tcemu.matmul(x, y, config=cfg))(a, b))
    np.testing.assert_array_equal(outs["off"].view(np.uint32), outs[KERNEL].view(np.uint32))


def test_kernel_mode_validation(monkeypatch):
    monkeypatch.setenv("TCEMU_GEMM_KERNEL", "fast")
    with pytest.raises(ValueError, match="auto, off, interpret, triton"):
        gemm_kernel.mode()
    monkeypatch.setenv("TCEMU_GEMM_TILE", "48x64")
    with pytest.raises(ValueError, match="powers of two"):
        gemm_kernel.tile()
