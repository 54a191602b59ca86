"""Compiled kernels for the MMA and GEMM hot loop (XLA FFI), with the pure-JAX engine as reference.

``blockfma.cc`` computes chains of fused block FMAs exactly as :mod:`tcemu._src.numerics.engine`
does on its one-word path (per-product alignment, int32 block sum, one rounding): it decodes the
operands' bits itself, vectorises over output columns (one vector register: 16 with AVX-512, 8
with AVX2, 4 otherwise; :func:`lanes`, and outputs narrower than that with more rows run
transposed, D^T = B^T A^T) and threads over column strips and batch entries. It is compiled on first
use with the system's C++ compiler (``$CXX`` or ``c++``) against the XLA FFI headers that jaxlib
ships, cached under ``$TCEMU_CACHE_DIR`` (default
``~/.cache/tcemu``), and used on the CPU backend for the models it covers (:func:`supports`) by
:func:`tcemu.matmul` (every chain of a K schedule in one call) and by single MMAs at the value
and register level (``numerics.mma``; batches and ``jax.vmap`` of warps in one call). Without a
compiler tcemu runs the pure-JAX path: same bits, slower.

On NVIDIA GPUs, ``blockfma_gpu.cu`` holds the same two custom calls for XLA's CUDA backend (a
thread per 4 x 2 outputs, blocks of threads sharing operand tiles in shared memory, same bits): it
is compiled on first use with ``nvcc`` (``$TCEMU_NVCC``, ``$CUDA_HOME/bin/nvcc``,
``$CUDA_PATH/bin/nvcc``, ``nvcc`` on the ``PATH``, the pip wheels' ``nvidia/*/bin/nvcc``, or
``/usr/local/cuda/bin/nvcc``: :mod:`.toolchain`) for every GPU's compute capability, and used by
:func:`tcemu.matmul` on the GPU backend for blocks of at most 32 products (64 for grouped fp4);
without ``nvcc`` GEMMs run the pure-JAX path there.

Both register with :mod:`tcemu._src.numerics.backends` when this module is imported (the face,
``tcemu/__init__.py``, does), which picks them for the models :func:`supports` or
:func:`supports_grouped` cover; building and loading is :mod:`.build`. ``TCEMU_NATIVE=0`` turns
the kernels off; ``TCEMU_NATIVE=1`` makes a failed build an error (read once per process).

Example::

    >>> from tcemu._src import native
    >>> native.available() in (True, False)
    True
"""
from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np

from tcemu._src import formats as fm
from tcemu._src.native.build import GROUPED, TARGET, _error, _gpu, _nvcc, _state, available, available_gpu  # noqa: F401
from tcemu._src.numerics import engine
from tcemu._src.numerics.backends import Kernel, register

_GPU_MAX_BLOCK = 32  # blockfma_gpu.cu's kLmax: the longest block its shared-memory tiles hold
_GPU_MAX_GROUPED_BLOCK = 64  # its kGLmax: the same for the grouped model
_MODES = {"rz": 0, "rne": 1, "rna": 2, "ru": 3, "rd": 4}
# formats whose exact values have float32 products far from the float32 range limits
_SAFE = ("f16", "e4m3", "e5m2", "e3m2", "e2m3", "e2m1")
_KIND_SAFE, _KIND_HYBRID = 1, 2  # blockfma.cc's Kind: exact values always, or where a block allows
_BIG = engine._BIG  # the engine's exponent sentinels (zero: -_BIG // 4, NaN/inf: _BIG)


def supports(model, afmt: fm.FloatFormat, bfmt: fm.FloatFormat, k: int, acc: str) -> bool:
    """Whether the kernel computes instructions of ``k`` with this :class:`BlockFMA` exactly as the
    engine does: fused blocks with the addend first, truncating alignment without sticky bits
    (int32 terms: ``fraction_bits <= 29``), deterministic rounding into a binary32-range
    accumulator, products of significands of at most 12 bits."""
    L = min(model.block_size, k)
    return (acc == "f32" and model.block_sum == "fused" and model.addend == "first" and not model.sticky
            and not model.normalize_products and model.scale_group is None and model.rounding in _MODES
            and model.overflow in ("inf", "ieee") and model.exact_zero == "+0" and k % L == 0
            and model.fraction_bits <= 29 and afmt.fraction_bits <= 11 and bfmt.fraction_bits <= 11)


def supports_grouped(model, k: int) -> bool:
    """Whether the kernel computes the grouped block-scaled fp4 model (``scale_group``) of an
    instruction of ``k`` as :mod:`~tcemu._src.numerics.grouped` does."""
    L = min(model.block_size, k)
    return (model.rounding in _MODES and model.overflow in ("inf", "ieee") and k % L == 0
            and L // model.scale_group <= 8 and model.fraction_bits <= 40)


def _covers(model, afmt, bfmt, k: int, acc: str) -> bool:
    """:func:`supports`, or :func:`supports_grouped` for grouped models (f32 accumulation)."""
    if model.scale_group is not None:
        return acc == "f32" and supports_grouped(model, k)
    return supports(model, afmt, bfmt, k, acc)


def _accepts_cpu(model, afmt, bfmt, k: int, acc: str, gemm: bool) -> bool:
    return _covers(model, afmt, bfmt, k, acc) and available()


def _accepts_gpu(model, afmt, bfmt, k: int, acc: str, gemm: bool) -> bool:
    """GEMMs only, whose blocks the GPU kernel's shared-memory tiles hold."""
    longest = _GPU_MAX_GROUPED_BLOCK if model.scale_group is not None else _GPU_MAX_BLOCK
    return (gemm and _covers(model, afmt, bfmt, k, acc) and min(model.block_size, k) <= longest and _gpu()
            and available_gpu())


def lanes() -> int:
    """Output columns per vector of the CPU kernel (16 with AVX-512, 8 with AVX2, 4 otherwise; 0
    without the kernel)."""
    return int(_state["CPU"][1].tcemu_lanes()) if available() else 0


def _threads() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


def _format(fmt: fm.FloatFormat) -> int:
    """An element format as the kernel reads it: eb | fb << 8 | shift << 16 | has_inf << 24 |
    has_nan << 25."""
    return (fmt.exponent_bits | fmt.fraction_bits << 8 | fmt.shift << 16 | int(fmt.has_inf) << 24
            | int(fmt.has_nan) << 25)


def _chain_attrs(model, afmt, bfmt, *, k, chain_k, kind, scaled, has, scale_block, transposed) -> dict:
    """The chains kernel's attributes: the model, the operand formats and the call's layout."""
    zpol = model.zero_exponent is not None and afmt.emin + bfmt.emin - (254 if scaled else 0) < model.zero_exponent
    L = min(model.block_size, k)
    return dict(chain_k=chain_k, block=L, F=model.fraction_bits, group=max(1, min(L, 1 << (29 - model.fraction_bits))),
                kind=kind, ab_shift=afmt.fraction_bits + bfmt.fraction_bits, zero_policy=int(zpol),
                zero_exp=-_BIG if model.zero_exponent is None else model.zero_exponent,
                has_min_exp=int(model.min_exponent is not None), min_exp=model.min_exponent or 0,
                mode=_MODES[model.rounding], p=model.accumulator_fraction_bits,
                subnormals=int(model.subnormal_outputs), overflow_ieee=int(model.overflow == "ieee"),
                flush_c=int(not model.subnormal_inputs), a_format=_format(afmt), b_format=_format(bfmt), **has,
                scale_block=scale_block if scaled else 0, threads=_threads(), transposed=int(transposed))


def chains(a_bits, b_bits, afmt: fm.FloatFormat, bfmt: fm.FloatFormat, model, *, k: int, chain_k: int, lens,
           a_exp=None, b_exp=None, c=None, scale_block: int = 0):
    """Accumulator bits (..., C, M, N) of C chains of instructions over the K of ``a_bits`` (...,
    M, C * chain_k) and ``b_bits`` (..., C * chain_k, N) (bit patterns with leading batch axes,
    or none for an operand shared by the batch; ``a_exp`` / ``b_exp``: exponents added per
    element, the ue8m0 scales of ``kind::mxf8f6f4``, or per block of ``scale_block`` elements
    along K, shaped (..., M, K / scale_block) and (..., K / scale_block, N)): chain c runs its
    first ``lens[c]`` elements (whole instructions) from the float32 bits ``c`` (..., M, N), or
    from +0, as :func:`~tcemu._src.numerics.engine.fused_dot` would (tf32 conversion and block order
    included). NaN/inf operands follow the engine's special-value path. Under ``jax.vmap`` the
    kernel runs the whole batch in one call."""
    gpu = _gpu()
    if not (available_gpu() if gpu else available()):
        raise RuntimeError(f"tcemu: the compiled kernel is not available ({_error('GPU' if gpu else 'CPU')})")
    M, N = np.shape(a_bits)[-2], np.shape(b_bits)[-1]
    # narrow outputs (m16n8) on the CPU: D^T = B^T A^T fills more of a vector. The kernel reads
    # 16- and 32-bit operands transposed itself (tf32 m16n8k8, 8192 tiles: 4.4-5.0 -> 1.9-3.5 ms);
    # XLA transposes narrower codes faster (e4m3 m16n8k32: 7.9 ms against 9.7-12.5 in the kernel),
    # and the operands with exponents (the kernel reads none transposed)
    narrow = not gpu and N < lanes() and N < M
    if narrow and (min(afmt.bits, bfmt.bits) < 16 or a_exp is not None or b_exp is not None):
        t = lambda x: None if x is None else jnp.swapaxes(jnp.asarray(x), -1, -2)  # noqa: E731
        return t(chains(t(b_bits), t(a_bits), bfmt, afmt, model, k=k, chain_k=chain_k, lens=lens, a_exp=t(b_exp),
                        b_exp=t(a_exp), c=t(c), scale_block=scale_block))
    scaled = a_exp is not None or b_exp is not None
    kind = _KIND_SAFE if not scaled and afmt.name in _SAFE and bfmt.name in _SAFE else _KIND_HYBRID
    a_bits, b_bits = jnp.asarray(a_bits).astype(jnp.uint32), jnp.asarray(b_bits).astype(jnp.uint32)
    if model.tf32_conversion == "rna":
        a_bits = engine.convert(a_bits, fm.F32, fm.TF32, "rna") if afmt is fm.TF32 else a_bits
        b_bits = engine.convert(b_bits, fm.F32, fm.TF32, "rna") if bfmt is fm.TF32 else b_bits
    perm = engine._order(k, model)
    if perm is not None and scale_block:  # the order moves elements between scale blocks
        a_exp = None if a_exp is None else jnp.repeat(a_exp, scale_block, axis=-1)
        b_exp = None if b_exp is None else jnp.repeat(b_exp, scale_block, axis=-2)
        scale_block = 0
    if perm is not None:  # one instruction's order, for every instruction of K
        perm = (np.arange(0, a_bits.shape[-1], k, dtype=np.int32)[:, None] + perm[None, :]).reshape(-1)
        a_bits, b_bits = a_bits[..., perm], b_bits[..., perm, :]
        a_exp = None if a_exp is None else a_exp[..., perm]
        b_exp = None if b_exp is None else b_exp[..., perm, :]
    (M, K), N = a_bits.shape[-2:], b_bits.shape[-1]
    if narrow:  # the kernel reads the operands as stored (transposed), A and B in swapped roles
        (a_bits, a_exp, afmt), (b_bits, b_exp, bfmt) = (b_bits, b_exp, bfmt), (a_bits, a_exp, afmt)
    absent = jnp.zeros((1,), jnp.int32)  # an operand not given (one element: XLA's partitioners handle no empty one)
    has = dict(has_c=int(c is not None), has_a_exp=int(a_exp is not None), has_b_exp=int(b_exp is not None))
    c = absent.astype(jnp.uint32) if c is None else jnp.asarray(c).astype(jnp.uint32)
    batch = jnp.broadcast_shapes(a_bits.shape[:-2], b_bits.shape[:-2], c.shape[:-2] if c.ndim > 1 else (),
                                 *(x.shape[:-2] for x in (a_exp, b_exp) if x is not None))

    def full(x, *like):  # per batch entry, or one for all (an operand and its exponents alike)
        if x is None:
            return absent
        x = jnp.asarray(x)
        if x.ndim < 2 or all(y.shape[:-2] == () for y in (x, *like) if y is not None):
            return x
        return jnp.broadcast_to(x, batch + x.shape[-2:])

    attrs = _chain_attrs(model, afmt, bfmt, k=k, chain_k=chain_k, kind=kind, scaled=scaled, has=has,
                         scale_block=scale_block, transposed=narrow)
    # the words travel typed float32: XLA cancels a bitcast from float32 and back (no copy)
    words = lambda x: jax.lax.bitcast_convert_type(x.astype(jnp.uint32), jnp.float32)  # noqa: E731
    args = (jnp.asarray(lens, jnp.int32), words(full(a_bits, a_exp)), words(full(b_bits, b_exp)),
            full(None if a_exp is None else a_exp.astype(jnp.int32), a_bits),
            full(None if b_exp is None else b_exp.astype(jnp.int32), b_bits), words(full(c)))
    results = [jax.ShapeDtypeStruct(batch + (K // chain_k, M, N), jnp.float32)]
    if gpu:  # blockfma_gpu.cu decodes the operands into a second result (scratch)
        na, nb = (int(np.prod(x.shape[:-2], dtype=np.int64)) for x in args[1:3])
        words_needed = (2 if kind == _KIND_SAFE else 3) * K * (na * _pad4(M) + nb * _pad4(N)) + 4
        results.append(jax.ShapeDtypeStruct((words_needed,), jnp.int32))
    call = jax.ffi.ffi_call(TARGET, tuple(results), vmap_method="broadcast_all")
    out = call(*args, **{name: np.int64(v) for name, v in attrs.items()})[0]
    return jax.lax.bitcast_convert_type(out, jnp.uint32)


def _pad4(n: int) -> int:
    return -(-n // 4) * 4


def gpu_fits(k: int, m: int, n: int) -> bool:
    """Whether blockfma_gpu.cu's 32-bit offsets reach a GEMM of K x M and K x N operands (rows and
    columns padded to multiples of 4)."""
    return k * _pad4(max(m, n)) < 1 << 31


def grouped_chains(a_bits, b_bits, sa: fm.Scale, sb: fm.Scale, model, *, k: int, chain_k: int, lens):
    """:func:`chains` of the grouped block-scaled fp4 model: e2m1 codes ``a_bits`` (M, K),
    ``b_bits`` (K, N), scales decoded per group of ``model.scale_group`` (``sa`` (M, K / G), ``sb``
    (K / G, N))."""
    gpu = _gpu()
    if not (available_gpu() if gpu else available()):
        raise RuntimeError(f"tcemu: the compiled kernel is not available ({_error('GPU' if gpu else 'CPU')})")
    flush = not model.subnormal_inputs

    def values(bits):  # e2m1 as integers times 2**-1, as grouped.grouped_dot reads them
        d = fm.decode(jnp.asarray(bits).astype(jnp.uint32), fm.E2M1, flush_subnormals=flush)
        v = d.sig << (d.exp - fm.E2M1.emin)
        return jnp.where(d.sign != 0, -v, v).astype(jnp.float32)

    (M, K), N = a_bits.shape, b_bits.shape[1]
    G, L = model.scale_group, min(model.block_size, k)
    attrs = dict(chain_k=chain_k, block=L, group=G, F=model.fraction_bits,
                 zero_exp=-_BIG if model.zero_exponent is None else model.zero_exponent, mode=_MODES[model.rounding],
                 subnormals=int(model.subnormal_outputs), overflow_ieee=int(model.overflow == "ieee"),
                 flush_c=int(flush), threads=_threads())
    i32 = lambda x, pad: jnp.pad(x.astype(jnp.int32), pad)  # noqa: E731
    lens = jnp.asarray(lens, jnp.int32)
    if gpu:  # blockfma_gpu.cu: (K, M) and (K, N) layouts, the scale significands in the values
        Mp, Np = _pad4(M), _pad4(N)
        va = values(a_bits) * jnp.repeat(sa.sig, G, axis=1).astype(jnp.float32)  # (M, K)
        vb = values(b_bits) * jnp.repeat(sb.sig, G, axis=0).astype(jnp.float32)  # (K, N)

        def masks(v):  # (K, X) -> (K / G, X): bit i where element i of the group is nonzero
            bits = (v.reshape(K // G, G, -1) != 0).astype(jnp.uint32) << jnp.arange(G, dtype=jnp.uint32)[:, None]
            return jnp.sum(bits, axis=1, dtype=jnp.uint32)

        rows, cols = ((0, 0), (0, Mp - M)), ((0, 0), (0, Np - N))
        call = jax.ffi.ffi_call(GROUPED, jax.ShapeDtypeStruct((K // chain_k, M, N), jnp.uint32),
                                vmap_method="sequential")
        return call(lens, jnp.pad(va.T, rows), i32(sa.exp.T, rows), jnp.pad(masks(va.T), rows), jnp.pad(vb, cols),
                    i32(sb.exp, cols), jnp.pad(masks(vb), cols), **{name: np.int64(v) for name, v in attrs.items()})
    Mp, Np = _pad4(M), -(-N // 16) * 16  # blockfma.cc: rows by 4, columns by its widest vector
    rows, cols = ((0, Mp - M), (0, 0)), ((0, 0), (0, Np - N))
    call = jax.ffi.ffi_call(GROUPED, jax.ShapeDtypeStruct((K // chain_k, Mp, Np), jnp.uint32),
                            vmap_method="sequential")
    out = call(lens, jnp.pad(values(a_bits), rows), i32(sa.sig, rows),
               i32(sa.exp, rows), jnp.pad(values(b_bits), cols), i32(sb.sig, cols), i32(sb.exp, cols),
               **{name: np.int64(v) for name, v in attrs.items()})
    return out[:, :M, :N]


register(Kernel("CPU kernel", "cpu", _accepts_cpu, chains, grouped_chains, lambda K, M, N: True, scale_per_block=True))
# the GPU kernel's exponents per block have not run on a GPU: it reads one per element
register(Kernel("GPU kernel", "gpu", _accepts_gpu, chains, grouped_chains, gpu_fits, scale_per_block=False))
