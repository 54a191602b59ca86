"""tcemu: bit-exact emulation of NVIDIA tensor-core warp instructions in JAX.

Register level: ``tcemu.ptx(spelling, arch)`` returns a pure function over a warp's registers
(``tcemu.regfile``) and byte-addressed memory (``tcemu.memory``). Value level: ``tcemu.mma``
(sparse ``mma.sp`` and ``wgmma.mma_async.sp`` on an A compressed by ``tcemu.sparsify``; their
metadata registers: ``tcemu.sparse_metadata``).
Numerics: ``tcemu.BlockFMA`` (the fused block-FMA model), ``tcemu.numerics(arch)`` (presets).
GEMMs: ``tcemu.matmul``, ``tcemu.dot_general`` (a ``jax.lax.dot_general`` drop-in),
``tcemu.einsum``, configured by ``tcemu.GemmConfig`` (epilogues: ``tcemu.Epilogue``);
``tcemu.quantize`` and ``tcemu.block_quantize`` (MX and NVFP4) round their inputs; real
libraries' configurations: ``tcemu.library_config``, ``tcemu.identify``, ``tcemu.record`` (cuBLAS's
kernel choices on your GPU). Whole models:
``tcemu.emulate`` runs any JAX function with every GEMM emulated, configs assigned by
``tcemu.Policy`` to each ``tcemu.GemmOp``. Studies: ``tcemu.probe`` (feature tests of an MMA),
``tcemu.error_vs_k`` (accumulation error as dot products grow).
"""
from tcemu._src.api import mma, ptx, regfile
from tcemu._src.isa.sparse import sparse_metadata, sparsify
from tcemu._src.isa.wgmma import WgmmaDescriptor, wgmma_descriptor
from tcemu._src import native as _native  # noqa: F401 (registers the compiled kernels)
from tcemu._src.gemm import Epilogue, GemmConfig, KSchedule, dot_general, einsum, matmul
from tcemu._src.identify import AmbiguousFit, NoMatch, identify
from tcemu._src.emulate import GemmOp, Policy, emulate
from tcemu._src.library import library_versions
from tcemu._src.library_layers import library_config
from tcemu._src.record import record
from tcemu._src.arch import Arch
from tcemu._src.quant.blocks import BlockQuantized, block_quantize
from tcemu._src.quant.elements import quantize
from tcemu._src.memory import get_matrix, memory, put_matrix
from tcemu._src.numerics.model import BlockFMA
from tcemu._src.numerics.presets import ArchNumerics, numerics
from tcemu._src.probe import ProbeResult, probe
from tcemu._src.studies import ErrorCurve, error_vs_k

__version__ = "0.1.0"

__all__ = ["AmbiguousFit", "Arch", "ArchNumerics", "BlockFMA", "BlockQuantized", "Epilogue", "ErrorCurve", "GemmConfig", "GemmOp", "KSchedule", "NoMatch", "Policy", "ProbeResult", "block_quantize", "dot_general", "einsum",
           "emulate", "error_vs_k", "get_matrix", "identify", "library_config", "library_versions", "matmul", "memory", "mma", "numerics", "probe", "ptx", "put_matrix",
           "quantize", "record", "regfile", "sparse_metadata", "sparsify", "WgmmaDescriptor", "wgmma_descriptor"]
