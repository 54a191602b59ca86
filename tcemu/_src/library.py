"""The GEMM configurations real libraries run on the H100 and H200, without a GPU.

``library_config`` answers from a table measured on the GPUs (``data/library_gemm.json.gz``: real
``torch.mm`` / ``torch.bmm`` / ``torch._scaled_mm`` (cuBLAS) and ``jnp.dot`` (XLA) outputs, the
kernels that ran, and the configuration ``tcemu.identify`` found for each; library versions in
``library_versions()``). A shape outside the table takes the configuration of the nearest
measured shape of the same library, GPU, types and flags, in its kernel family's own form (for
cuBLAS: nvjet residue last, CUTLASS 2 residue first), where that form gives the same bits at the
measured shape. ``jnp.dot`` with XLA's GEMM
autotuner off (``xla_autotune=False``) is answered from XLA's own rules instead, for any shape
(:func:`xla_split_k`); with it on, a shape the table lacks takes the rewriter's slice count too
(:func:`_xla_autotune_on`). Otherwise, split-K and its slice count follow
from how many output tiles there are to fill the GPU and from K, and cuBLAS runs CUTLASS 2
kernels when a leading dimension (K of A, N of B and D) is not a multiple of 8 elements, so the
distance is ``|log2(t / t')| + |log2(K / K')|`` with ``t`` the 128 x 128 output tiles times the
batch, plus 4 for each of K and N whose divisibility by 8 differs, plus 1 when one is batched and
the other not; ties go to the nearest M and N.

    >>> import tcemu
    >>> cfg = tcemu.library_config("torch._scaled_mm", arch="H100", M=4096, N=4096, K=4096,
    ...                            a="e4m3", b="e4m3", out="bf16", use_fast_accum=False)
    >>> cfg.schedule.promotion                     # cuBLAS fp8: promoted every 128 elements of K
    128
"""
from __future__ import annotations

import functools
import gzip
import json
import math
import re
from pathlib import Path

import numpy as np

from tcemu._src import formats as fm
from tcemu._src.gemm import GemmConfig, KSchedule

LIBRARIES = {"torch.mm": ("reduced_precision_reduction",), "torch.bmm": ("reduced_precision_reduction",),
             "torch._scaled_mm": ("use_fast_accum",), "jnp.dot": ("xla_autotune",)}
# the libraries' defaults: torch's, and XLA's GEMM autotuner on (XLA_FLAGS without
# --xla_gpu_autotune_level=0)
FLAG_DEFAULTS = {"reduced_precision_reduction": True, "use_fast_accum": False, "xla_autotune": True}
GPUS = ("H100", "H200")
TYPES = ("f16", "bf16", "e4m3", "e5m2")
OUTS = ("f32", "f16", "bf16")
_DTYPE_NAMES = {"float16": "f16", "bfloat16": "bf16", "float8_e4m3fn": "e4m3", "float8_e5m2": "e5m2",
                "float32": "f32"}
DATA = Path(__file__).parent / "data" / "library_gemm.json.gz"


def read_json(path):
    """A JSON file, gzip-compressed when its name ends in .gz."""
    path = Path(path)
    if path.suffix == ".gz":
        with gzip.open(path, "rt") as f:
            return json.load(f)
    return json.loads(path.read_text())


@functools.lru_cache(maxsize=1)
def _table():
    data = read_json(DATA)
    # rows whose configuration reproduces every captured output (held-out rows included)
    return data["captures"], [r for r in data["cases"] if "schedule" in r and r.get("held_out") in (1.0, None)]


def library_versions() -> dict:
    """Per capture file: the GPU, library versions and date the table was measured with.

    >>> import tcemu
    >>> tcemu.library_versions()["library_gemm_h100_jax.npz"]["gpu"]
    'NVIDIA H100 80GB HBM3'
    """
    return {name: h["versions"] | {"date": h["date"]} for name, h in _table()[0].items()}


def _type(v, name, choices):
    if isinstance(v, str) and v in choices:
        return v
    try:
        s = _DTYPE_NAMES.get(np.dtype(v).name)
    except TypeError:
        s = None
    if s not in choices:
        raise ValueError(f"library_config: {name} must be one of {', '.join(choices)} (or the numpy/JAX dtype), "
                         f"got {v!r}")
    return s


MAX_DIM = 2**31  # sizes JAX can index (int32)


def _dim(v, name, lo=1):
    if not isinstance(v, (int, np.integer)) or isinstance(v, (bool, np.bool_)) or not lo <= v < MAX_DIM:
        raise ValueError(f"library_config: {name} must be an integer >= {lo} and below 2**31 (JAX indexes with int32), "
                         f"got {v!r}")
    return int(v)


def gpu_named(name: str) -> str | None:
    """"H100" or "H200" where ``name`` is that name or a device name holding it as a word, else None.

    >>> gpu_named("NVIDIA H100 80GB HBM3"), gpu_named("H200"), gpu_named("dry run")
    ('H100', 'H200', None)
    """
    words = re.split(r"[^A-Z0-9]+", name.upper())
    return next((g for g in GPUS if g in words), None)


def shipped_gpu(arch):
    """:func:`gpu_named`, raising a clear error where ``arch`` names no GPU the table was measured on.

    >>> shipped_gpu("NVIDIA H100 80GB HBM3"), shipped_gpu("H200")
    ('H100', 'H200')
    """
    if not isinstance(arch, str):
        raise TypeError(f"library_config: arch must be one of {', '.join(GPUS)} (a string, or a device name holding "
                        f"one), got {arch!r} ({type(arch).__name__})")
    gpu = gpu_named(arch)
    if gpu is None:
        raise ValueError(f"library_config: arch must be one of {', '.join(GPUS)} (the GPUs the table was measured "
                         f"on), got {arch!r}")
    return gpu


def config_of(row: dict, gpu: str) -> GemmConfig:
    """The GemmConfig of a table row."""
    return GemmConfig(arch=gpu, instruction=row["instruction"], schedule=KSchedule(**row["schedule"]))


def cublas_family(K: int, N: int) -> str:
    """The kernel family cuBLAS runs for 16-bit ``torch.mm`` / ``torch.bmm``: "cutlass" (CUTLASS 2)
    when a leading dimension (K of A, N of B and D) is not a multiple of 8 elements, else "nvjet"
    (every capture of ``experiments/hardware/library_gemm.py``)."""
    return "cutlass" if K % 8 or N % 8 else "nvjet"


def _kernel_form(row: dict, cfg: GemmConfig, K: int, N: int) -> GemmConfig:
    """A cuBLAS row's configuration in its kernel family's own form, where that gives the row's
    bits at its K: the schedule ``identify`` found can be another one that coincides at that K
    (e.g. residue last where K is a multiple of the k-tile) and differs at the K asked for. nvjet
    kernels run one chain in 64-wide k-tiles, residue last (split-K: slices aligned to the
    k-tiles); CUTLASS 2 kernels run the partial k-tile first (split-K: slices aligned as
    :func:`cutlass_slice_alignment` says at each K, the residue first in each). cuBLAS runs
    CUTLASS 2 kernels where K or N is not a multiple of 8: such a shape whose nearest row ran an
    unsplit nvjet kernel takes the CUTLASS 2 chain."""
    names = " ".join(row["kernels"])
    s, k = cfg.schedule, cfg.ins.k
    if row["lib"] not in ("torch.mm", "torch.bmm") or s.promotion:
        return cfg
    if cublas_family(K, N) == "cutlass" and "nvjet" in names and s.slices == 1:
        return cfg.replace(schedule=cutlass2_schedule(K, row["a"], row["b"], k_tile=64))
    if "nvjet" in names:
        at_row = at_k = nvjet_schedule(s.slices)
    elif "cutlass" in names:
        at_row, at_k = (cutlass2_schedule(at, row["a"], row["b"], k_tile=64, slices=s.slices, partials=s.partials)
                        for at in (row["K"], K))
    else:
        return cfg
    return cfg.replace(schedule=at_k) if at_row.equivalent(s, row["K"], k) else cfg


def nvjet_schedule(slices: int, k_tile: int = 64) -> KSchedule:
    """An nvjet kernel's K schedule: one chain of ``k_tile``-wide k-tiles, residue last; split-K:
    ``slices`` slices aligned to the k-tiles."""
    return KSchedule(k_tile=k_tile, slices=slices) if slices > 1 else KSchedule()


def cutlass2_schedule(K: int, a: str, b: str, *, k_tile: int, slices: int = 1, partials: str = "f32",
                      reduction: str = "sequential") -> KSchedule:
    """A CUTLASS 2 kernel's K schedule at depth ``K``: the partial k-tile first; split-K: slices
    aligned as :func:`cutlass_slice_alignment` says at that K, the residue first in each, the
    partials stored as ``partials`` and combined by ``reduction``."""
    if slices == 1:
        return KSchedule(k_tile=k_tile, residue="first")
    return KSchedule(k_tile=k_tile, residue="first", slices=slices, slice_align=cutlass_slice_alignment(K, a, b),
                     partials=partials, reduction=reduction)


def _tiles(M, N, batch):
    """Output tiles of 128 x 128 over the batch: the parallelism a kernel has without split-K."""
    return (batch or 1) * math.ceil(M / 128) * math.ceil(N / 128)


def distance(row, M, N, K, batch) -> float:
    """How far a table row's shape is from (M, N, K, batch) (0: the same tiles, K and divisibility)."""
    d = abs(math.log2(_tiles(M, N, batch) / _tiles(row["M"], row["N"], row["batch"]))) + abs(math.log2(K / row["K"]))
    d += 4 * ((K % 8 == 0) != (row["K"] % 8 == 0)) + 4 * ((N % 8 == 0) != (row["N"] % 8 == 0))
    return d + (bool(batch) != bool(row["batch"]))


# XLA's split-K rewriter (jax 0.11.2 on Hopper; xla/backends/gpu/transforms/splitk_rewriter.cc): the
# cost weights of compute, memory traffic and the reduction, and a kernel launch
_XLA_WEIGHTS = (100.0, 0.194136, 193.1384, 4.36e7)
_XLA_SPLITS = tuple(2 ** i for i in range(12))  # 1 .. 2048
_XLA_SMS = 132  # H100 SXM and H200


def _bits(t: str) -> int:
    return fm.FORMATS[t].storage_bits


def slice_alignment(a: str, b: str) -> int:
    """Elements of K in 16 bytes of the narrower input type: where the split-K slices of CUTLASS
    2 kernels and of XLA's Triton GEMMs start."""
    return 128 // min(_bits(a), _bits(b))


def cutlass_slice_alignment(K: int, a: str, b: str) -> int:
    """Where cuBLAS's CUTLASS 2 split-K slices start: ``ceil(K / S)`` is rounded up to 64
    elements when K is a multiple of 64, else to 16 bytes (:func:`slice_alignment`): 22 slices
    of K = 6144 are 19 of 320 and one of 64, not 21 of 280 and one of 264. Measured on every
    captured case where the two cut K differently (H100 and H200): 64 at the 8 shapes with K a
    multiple of 64, 16 bytes at the 27 without (K a multiple of 16 or 32 at 6); held out on 79
    cases of ``fresh4`` (experiments/hardware/README.md, stop 51)."""
    return 64 if K % 64 == 0 else slice_alignment(a, b)


def xla_split_k(M: int, N: int, K: int, batch: int | None, a: str, b: str, out: str) -> int:
    """The slice count XLA's split-K rewriter gives a dot when GEMM autotuning is off: the S in
    1, 2, 4, ..., 2048 of least estimated cost (the smallest on a tie), where the cost is the
    larger of compute (waves of 128 x 128 tiles over 132 SMs, times the K of a slice) and memory
    traffic (operands, and the output or the float32 partials), plus a launch and the partials'
    reduction when S > 1.

    >>> xla_split_k(512, 512, 500, None, "f16", "f16", "f16")
    4
    """
    wc, wm, wr, launch = _XLA_WEIGHTS
    M, N, K, B = int(M), int(N), int(K), int(batch or 1)  # Python ints: numpy's overflow at huge shapes
    mt, nt = min(M, 128), min(N, 128)
    best = None
    for S in _XLA_SPLITS:
        tiles = B * S * -(-M // 128) * -(-N // 128)
        waves = max(1.0, tiles / (_XLA_SMS * (128 * 128) / (mt * nt)))
        compute = 2 * mt * nt * -(-K // S) * waves * wc
        memory = (M * K * B * _bits(a) / 8 + N * K * B * _bits(b) / 8 + M * N * B * S * (32 if S > 1 else _bits(out)) / 8) * wm
        cost = max(compute, memory)
        if S > 1:
            cost += launch + (B * S * M * N * 4 + B * M * N * _bits(out) / 8) * wr
        if best is None or cost < best[0]:
            best = (cost, S)
    return best[1]


def _xla_occupancy(M: int, N: int, batch: int, out_bits: int) -> bool:
    """Whether XLA's Triton tile search (autotuner off) is in occupancy mode: fewer than 660
    CTAs (5 warps x 4 schedulers x 132 SMs / 4 warps) with the largest tile the registers allow.
    It then runs 16 x 8 tiles with 16-element k-tiles, otherwise 64 x 32 tiles with 64."""
    e = 65536 * 32 // out_bits
    side = 1 << (math.isqrt(e).bit_length() - 1)
    tm = min(side, 1 << (M - 1).bit_length())
    tn = min(e // side, 1 << (N - 1).bit_length())
    return batch * -(-M // tm) * -(-N // tn) < 660


def _xla_types(a: str, b: str, what: str) -> None:
    if not (a == b in ("f16", "bf16") or {a, b} <= {"e4m3", "e5m2"}):
        raise ValueError(f"library_config: jnp.dot with {what} takes f16 x f16, bf16 x bf16 or fp8 (e4m3, e5m2) "
                         f"inputs, got {a} x {b}")


def _xla_autotune_off(gpu: str, M: int, N: int, K: int, batch: int | None, a: str, b: str, out: str) -> GemmConfig:
    """jnp.dot with XLA's autotuner off, from XLA's own rules: split-K by :func:`xla_split_k`, K
    padded to S x 16 bytes, slices in k-tiles of the Triton tiling's block_k; the float32 partials
    reduced by XLA's loop emitter (in order) below 32 slices, by its reduction emitter (shuffle
    tree) from 32. fp8 with 16-element k-tiles is widened to f16 exactly and runs the f16 MMA."""
    _xla_types(a, b, "xla_autotune=False")
    S = xla_split_k(M, N, K, batch, a, b, out)
    fused_out = 32 if S > 1 else _bits(out)
    block_k = 16 if _xla_occupancy(M, N, (batch or 1) * S, fused_out) else 64
    return xla_triton_config(gpu, a, b, S, block_k)


def _xla_autotune_on(gpu: str, M: int, N: int, K: int, batch: int | None, a: str, b: str, out: str) -> GemmConfig:
    """jnp.dot with XLA's autotuner on at a shape the table did not measure: a guess. The slice
    count is the split-K rewriter's (:func:`xla_split_k`: it runs before the autotuner; 661 of 661
    autotuned captures of the H100 and H200), in 64-element k-tiles (fp8: the wgmma, which every
    autotuned fp8 Triton GEMM captured ran), the partials reduced by XLA's emitters; the
    autotuner's choice of kernel (a Triton reduction fusion's tree, cuBLAS) is the process's own."""
    _xla_types(a, b, "a shape the table lacks")
    return xla_triton_config(gpu, a, b, xla_split_k(M, N, K, batch, a, b, out), 64)


def xla_triton_config(gpu: str, a: str, b: str, S: int, block_k: int, reduction: str | None = None,
                      threads: int = 1, lanes: int = 0) -> GemmConfig:
    """An XLA Triton GEMM: S split-K slices of 16 bytes' alignment in k-tiles of ``block_k`` (16-bit
    inputs: the k16 MMA; fp8: the wgmma, or below 32-element k-tiles the f16 MMA on widened
    inputs), the float32 partials reduced by ``reduction`` (default: XLA's reduction emitters, in
    order below 32 slices, a warp-shuffle tree from 32; a Triton reduction: "pairwise" over
    ``threads`` threads, ``lanes`` a warp)."""
    if a in ("f16", "bf16"):
        ins = f"m16n8k16.f32.{a}.{b}.f32"
    else:
        ins = "m16n8k16.f32.f16.f16.f32" if block_k < 32 else f"wgmma.mma_async.sync.aligned.m64n8k32.f32.{a}.{b}"
    if S == 1:
        return GemmConfig(arch=gpu, instruction=ins, schedule=KSchedule())
    reduction = reduction or ("sequential" if S < 32 else "shuffle")
    return GemmConfig(arch=gpu, instruction=ins,
                      schedule=KSchedule(slices=S, k_tile=block_k, slice_align=slice_alignment(a, b),
                                         reduction=reduction, reduce_threads=threads, reduce_lanes=lanes))


def nearest_row(lib: str, *, arch: str, M: int, N: int, K: int, a: str, b: str, out: str, batch: int | None,
                **flags) -> dict:
    """The table row of ``lib`` nearest to the shape (checked arguments; ``flags`` complete)."""
    gpu = shipped_gpu(arch)
    rows = [r for r in _table()[1] if r["lib"] == lib and r["arch"] == gpu and (r["a"], r["b"], r["out"]) == (a, b, out)
            and {f: r["flags"].get(f, FLAG_DEFAULTS[f]) for f in LIBRARIES[lib]} == flags]
    if not rows:
        have = sorted({(r["a"], r["b"], r["out"]) for r in _table()[1] if r["lib"] == lib})
        raise ValueError(f"library_config: no measurements of {lib} with {a} x {b} -> {out}; measured: "
                         + ", ".join(f"{x} x {y} -> {z}" for x, y, z in have))
    return min(rows, key=lambda r: (distance(r, M, N, K, batch), abs(math.log2(M / r["M"])) + abs(math.log2(N / r["N"])),
                                    r["M"] * r["N"] * r["K"]))


def check_common(arch, M, N, K, a, b, out, batch):
    """``library_config``'s shared arguments checked: (GPU, M, N, K, a, b, out)."""
    gpu = shipped_gpu(arch)
    M, N, K = _dim(M, "M"), _dim(N, "N"), _dim(K, "K")
    if batch is not None:
        _dim(batch, "batch")
    return gpu, M, N, K, _type(a, "a", TYPES), _type(b, "b", TYPES), _type(out, "out", OUTS)


def gemm_config(lib: str, *, arch: str, M: int, N: int, K: int, a, b, out, batch: int | None = None,
                **flags) -> GemmConfig:
    """:func:`gemm_config_sourced`'s configuration.

    >>> gemm_config("torch.mm", arch="H100", M=4096, N=4096, K=4096, a="bf16", b="bf16", out="bf16").instruction
    'm16n8k16.f32.bf16.bf16.f32'
    """
    return gemm_config_sourced(lib, arch=arch, M=M, N=N, K=K, a=a, b=b, out=out, batch=batch, **flags)[0]


def gemm_config_sourced(lib: str, *, arch: str, M: int, N: int, K: int, a, b, out, batch: int | None = None,
                        **flags) -> tuple[GemmConfig, str]:
    """:func:`tcemu.library_config` for the bare GEMMs (``lib`` one of :data:`LIBRARIES`) from the
    table and XLA's rules, with its source: "rule" (jnp.dot with the autotuner off) or "nearest"
    (the table's nearest row, the shape's own included)."""
    gpu, M, N, K, a, b, out = check_common(arch, M, N, K, a, b, out, batch)
    unknown = sorted(set(flags) - set(LIBRARIES[lib]))
    if unknown:
        raise TypeError(f"library_config: {lib} takes no flag {', '.join(unknown)}; its flags: "
                        f"{', '.join(LIBRARIES[lib]) or 'none'}")
    flags = {f: flags.get(f, FLAG_DEFAULTS[f]) for f in LIBRARIES[lib]}
    for f, v in flags.items():
        if not isinstance(v, bool):
            raise TypeError(f"library_config: {f} must be True or False, got {v!r}")
    if lib == "jnp.dot" and not flags["xla_autotune"]:
        return _xla_autotune_off(gpu, M, N, K, batch, a, b, out), "rule"
    best = nearest_row(lib, arch=gpu, M=M, N=N, K=K, a=a, b=b, out=out, batch=batch, **flags)
    if lib == "jnp.dot" and (best["M"], best["N"], best["K"], best["batch"] or None) != (M, N, K, batch or None):
        return _xla_autotune_on(gpu, M, N, K, batch, a, b, out), "nearest"
    # a guess even at a measured shape: the table's schedule is one that fits the 64 captured
    # rows, and several can (the H100's records split 512 x 512 x 777 bf16 into 8 slices where
    # the table has 2); jnp.dot with the autotuner on is each process's own choice
    return _kernel_form(best, config_of(best, gpu), K, N), "nearest"
