"""Emulated GEMMs of any size from one instruction's numerics, differentiable, with a
``jax.lax.dot_general``-compatible entry point for Flax/Optax models.

    >>> import jax.numpy as jnp, tcemu
    >>> a = jnp.ones((37, 100)); b = jnp.ones((100, 19))
    >>> y = tcemu.matmul(a, b, arch="H100", instruction="m16n8k16.f32.bf16.bf16.f32")
    >>> float(y[0, 0])
    100.0

The GEMM is tiled by the instruction's (m, n, k) (padding with zeros); each output tile runs the
K loop in the order ``GemmConfig.k_order``:

* ``"sequential"``: one instruction per k-tile, D of one step is C of the next (a CUTLASS-style
  mainloop), starting from +0.
* ``"split_k"``: K cut into ``split_k`` contiguous slices, each sequential from +0, then the
  slices' results added in order with float32 RNE additions (the reduction kernel).
* ``"promotion"``: every ``promotion_interval`` elements of K the tensor-core accumulator (started
  at +0) is added into a float32 accumulator with an RNE addition (DeepSeek-V3's FP8 recipe,
  interval 128).
* ``"pairwise"``: every k-tile's instruction starts from +0; the partial results are summed
  pairwise with float32 RNE additions (adjacent pairs, then pairs of pairs; a non-power-of-two
  count leaves the odd subtrees to be added from the largest down).

Memory stays bounded: the products of one step exist only inside fused loops, and the output is
processed in row blocks, so a 4096^3 GEMM needs O(M N) memory, never O(M N K).

The package is the GEMM's pipeline, a module a step:

* :mod:`.config`: :class:`GemmConfig` (frozen, validated);
* :mod:`tcemu._src.quant`: the inputs rounded to the instruction's formats (MX / NVFP4 blocks);
* :mod:`.schedule` and :mod:`.plan`: the K schedule (:class:`KSchedule`) made concrete for one K;
* :mod:`.execute`: the backend chosen in one place, batches over devices; :mod:`.xla` (pure JAX,
  the reference) and :mod:`.kernel` (the compiled kernels) run the plan;
* :mod:`.reduce`: promotion groups and split-K partials combined;
* :mod:`.epilogue`: the kernel's epilogue (:class:`Epilogue`: scales, alpha, beta * C, bias, the
  output type), the NVFP4 tensor scales;
* :mod:`.autodiff`: straight-through quantisation and the backward GEMMs;
* :mod:`.api`: :func:`matmul`, :func:`dot_general`, :func:`einsum`.
"""
from tcemu._src.gemm.api import dot_general, einsum, matmul
from tcemu._src.gemm.config import GemmConfig
from tcemu._src.gemm.epilogue import Epilogue
from tcemu._src.gemm.execute import batched_gemm_bits, gemm_bits
from tcemu._src.gemm.schedule import KSchedule

__all__ = ["Epilogue", "GemmConfig", "KSchedule", "batched_gemm_bits", "dot_general", "einsum", "gemm_bits", "matmul"]
