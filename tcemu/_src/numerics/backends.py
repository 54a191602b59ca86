"""Compiled kernels that restate the engine, plugged in from beside the numerics layer.

The JAX engine (:mod:`~tcemu._src.numerics.engine`) is the reference and runs everywhere. A
kernel (``tcemu/_src/native``: C++ on the CPU, CUDA on NVIDIA GPUs) computes chains of fused block
FMAs with the same bits for the models it covers; it registers itself here with
:func:`register`, so the numerics never import a kernel. :func:`kernel_for` is the one place that
chooses between a kernel and the engine, for single MMAs and GEMMs alike.

    >>> from tcemu._src import formats as fm
    >>> from tcemu._src.numerics.backends import kernel_for
    >>> from tcemu._src.numerics.model import BlockFMA
    >>> k = kernel_for(BlockFMA(24, 8), fm.F16, fm.F16, 16, "f32", gemm=True)
    >>> k is None or k.platform in ("cpu", "gpu")
    True
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import jax


@dataclasses.dataclass(frozen=True)
class Kernel:
    """A compiled backend of the block-FMA numerics for one JAX platform.

    Attributes:
      name: what messages call it ("CPU kernel", "GPU kernel").
      platform: the JAX backend whose arrays it computes on ("cpu" or "gpu").
      accepts: ``(model, afmt, bfmt, k, acc, gemm) -> bool``: whether it computes instructions of
        depth ``k`` with this :class:`~tcemu._src.numerics.model.BlockFMA` into accumulator ``acc``
        exactly as the engine does, for a GEMM (``gemm``) or single MMAs, and is built.
      chains: accumulator bits of chains of instructions (``native.chains``'s contract).
      grouped_chains: the same for the grouped block-scaled fp4 model.
      fits: ``(K, M, N) -> bool``: whether one GEMM of that size fits the kernel's offsets.
      scale_per_block: whether it reads ue8m0 scale exponents once per scale block (else one per
        element of K).
    """

    name: str
    platform: str
    accepts: Callable[..., bool]
    chains: Callable
    grouped_chains: Callable
    fits: Callable[[int, int, int], bool]
    scale_per_block: bool


_KERNELS: dict[str, Kernel] = {}


def register(kernel: Kernel) -> None:
    """Make ``kernel`` the compiled backend of its platform."""
    if kernel.platform not in ("cpu", "gpu"):
        raise ValueError(f"register: platform must be 'cpu' or 'gpu', got {kernel.platform!r}")
    _KERNELS[kernel.platform] = kernel


def kernel_for(model, afmt, bfmt, k: int, acc: str, *, gemm: bool = False) -> Kernel | None:
    """The registered kernel of the default JAX backend if it computes this model exactly as the
    engine does (``Kernel.accepts``), else None: the pure-JAX engine runs it."""
    kernel = _KERNELS.get(jax.default_backend())
    # the kernels restate the fused block only: AMD's adders (two-stage, pairwise, exact) and fnuz fp8 run in the engine
    if model.addend_alignment != "fused" or model.block_sum in ("pairwise", "exact") or afmt.fnuz or bfmt.fnuz:
        return None
    if kernel is None or not kernel.accepts(model, afmt, bfmt, k, acc, gemm):
        return None
    return kernel
