"""The GEMM layers ML code calls, as their libraries run them on the H100 and H200: the K schedule
and the epilogue (where the bias or C is added, and in what precision) of ``F.linear``,
``torch.matmul``, ``torch.addmm``, ``torch.baddbmm`` and a jitted JAX dense layer ``x @ W + b``.

The rules were read from the layer captures (``experiments/hardware/layer_gemm.py``: the kernels
each call launched, and ``tcemu.identify`` given the bias / C on every case):

* cuBLAS adds ``F.linear``'s bias in its kernel's epilogue, to the float32 accumulator before the
  one rounding (nvjet ``..._bias_...`` kernels, CUTLASS 2 kernels), as ``torch.addmm`` does with a
  bias row (cuBLASLt's bias epilogue) and with ``alpha``/``beta`` other than 1 (nvjet ``_bx_``
  kernels). ``torch.addmm`` and ``torch.baddbmm`` with a full C and ``alpha = beta = 1`` copy C
  into D and run nvjet ``_badd_`` kernels, which add C to the product rounded to the output type.
* With split-K off (``allow_splitk=False``: ``torch.backends.cuda.preferred_blas_library("cublaslt")``
  and ``allow_{fp16,bf16}_reduced_precision_reduction = (False, False)``) every layer runs one
  chain per output tile: nvjet kernels (k16 numerics, the residue last) where K and N are
  multiples of 8, else CUTLASS 2 kernels with the partial k-tile first (bf16: ``s1688`` (k8); f16:
  ``wmma`` ``s161616`` (k16)). With split-K allowed (torch's default) the same, unless
  ``torch.mm``'s (``torch.bmm``'s) table holds the shape (the same 128 x 128 output tiles, K and
  divisibility by 8) and cuBLAS split K there: then the table's split.
* XLA keeps a jitted ``x @ W + b`` as the HLO says, two roundings (the product rounded to the
  input type, then the bias added and rounded), unless it runs the GEMM on cuBLASLt with the bias
  fused into the call (large shapes), which adds it to the float32 accumulator.

    >>> import tcemu
    >>> cfg = tcemu.library_config("F.linear", arch="H100", M=512, N=1024, K=1024, a="bf16", b="bf16",
    ...                            out="bf16", allow_splitk=False)
    >>> cfg.epilogue.bias, cfg.schedule.describe()
    ('accumulator', 'one instruction per k-tile, residue last')
"""
from __future__ import annotations

from pathlib import Path

from tcemu._src.gemm import Epilogue, GemmConfig, KSchedule
from tcemu._src import library_records as R
from tcemu._src import library_xla as X
from tcemu._src.library import (LIBRARIES, check_common, cublas_family, distance, gemm_config, gemm_config_sourced,
                                nearest_row)

LAYERS = {"F.linear": ("bias", "allow_splitk"), "torch.matmul": ("allow_splitk",),
          "torch.addmm": ("c", "alpha", "beta", "allow_splitk"), "torch.baddbmm": ("alpha", "beta", "allow_splitk"),
          "jax.dense": ("bias", "xla_autotune")}
DEFAULTS = {"bias": True, "allow_splitk": True, "c": "matrix", "alpha": 1.0, "beta": 1.0, "xla_autotune": True}
# what library_config's workspace=0 (a zero cuBLAS workspace) answers for
ZERO_WORKSPACE_LIBS = ("torch.mm", "torch.bmm", "torch._scaled_mm", "F.linear", "torch.matmul", "torch.addmm",
                       "torch.baddbmm")


def _flags(lib: str, flags: dict) -> dict:
    unknown = sorted(set(flags) - set(LAYERS[lib]))
    if unknown:
        raise TypeError(f"library_config: {lib} takes no flag {', '.join(unknown)}; its flags: {', '.join(LAYERS[lib])}")
    out = {f: flags.get(f, DEFAULTS[f]) for f in LAYERS[lib]}
    for f, v in out.items():
        if f in ("bias", "allow_splitk", "xla_autotune") and not isinstance(v, bool):
            raise TypeError(f"library_config: {f} must be True or False, got {v!r}")
        if f in ("alpha", "beta") and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise TypeError(f"library_config: {f} must be a number (torch's alpha / beta), got {v!r}")
    if out.get("c", "matrix") not in ("matrix", "row"):
        raise ValueError(f"library_config: c must be 'matrix' (a full (M, N) C) or 'row' (an (N,) row broadcast "
                         f"over the rows, nn.Linear's old addmm form), got {out['c']!r}")
    return out


def _unsplit(gpu: str, K: int, N: int, t: str) -> GemmConfig:
    """cuBLASLt with split-K off: one chain per output tile (nvjet), or a CUTLASS 2 mainloop with
    the partial k-tile first (bf16 on s1688 (k8), f16 on wmma s161616 (k16))."""
    if cublas_family(K, N) == "nvjet":
        return GemmConfig(arch=gpu, instruction=f"m16n8k16.f32.{t}.{t}.f32", schedule=KSchedule())
    k = "8" if t == "bf16" else "16"
    return GemmConfig(arch=gpu, instruction=f"m16n8k{k}.f32.{t}.{t}.f32", schedule=KSchedule(k_tile=64, residue="first"))


def _torch_epilogue(lib: str, f: dict, K: int, N: int) -> Epilogue:
    if lib in ("torch.addmm", "torch.baddbmm") and f.get("c", "matrix") == "matrix" and (f["alpha"], f["beta"]) == (1, 1):
        return Epilogue(c="output" if cublas_family(K, N) == "nvjet" else "accumulator")
    return Epilogue()


def _dense(gpu, M, N, K, batch, t, out, f) -> tuple[GemmConfig, str]:
    """The jitted ``x @ W + b``. Autotuner off: ``jnp.dot``'s configuration (XLA's rules), the
    bias added after the rounding. Autotuner on: XLA picked cuBLASLt, with the bias fused into the
    call (added to the accumulator) and K unsplit, for the GEMMs of at least 2**33 multiply-adds
    with K and N multiples of 8 in the captures, and otherwise ``jnp.dot``'s configuration."""
    kw = dict(arch=gpu, M=M, N=N, K=K, a=t, b=t, out=out, batch=batch, xla_autotune=f["xla_autotune"])
    if f["xla_autotune"] and (batch or 1) * M * N * K >= 2**33 and cublas_family(K, N) == "nvjet":
        cfg = GemmConfig(arch=gpu, instruction=f"m16n8k16.f32.{t}.{t}.f32", schedule=KSchedule())
        return cfg.replace(epilogue=Epilogue(bias="accumulator")), "nearest"  # XLA's autotuner decides per process
    cfg, source = gemm_config_sourced("jnp.dot", **kw)
    return cfg.replace(epilogue=Epilogue(bias="output")), source


# block scales along K (scale_a's recipe, scale_b's) -> the order of the scales in each promotion's FFMA
BLOCK_SCALINGS = {"1x128,1x128": "sequential", "1x128,128x128": "product", "128x128,1x128": "product"}


def _scaled_mm(kw: dict, flags: dict) -> tuple[GemmConfig, str]:
    """``torch._scaled_mm``: the table's schedule; the scales as cuBLASLt applies them (layer
    captures): per-tensor scales multiplied together first, ``acc * (scale_a * scale_b)``,
    row-wise scales (its outer-vector-scale kernels) in turn, B's first: ``(acc * scale_b) * scale_a``
    (every row-scaled case of the H100 and H200 layer captures, 208; the other orders miss one
    output in 2 to 4 of them).
    Block scales along K (``scaling`` one of :data:`BLOCK_SCALINGS`, cuBLASLt's nvjet
    block-scaled kernels, no split-K seen): promotion every 128 elements of K, each block's
    partial entering the float32 accumulator by ``fma(p * scale_a, scale_b, acc)`` with two
    1x128 scales and ``fma(p, scale_a * scale_b, acc)`` with a 128x128 one."""
    flags = dict(flags)
    scaling = flags.pop("scaling", "tensor")
    if scaling not in ("tensor", "row", *BLOCK_SCALINGS):
        raise ValueError(f"library_config: scaling must be 'tensor' (scalar scales), 'row' (scale_a (M, 1), "
                         f"scale_b (1, N)) or block scales along K, scale_a's recipe and scale_b's: "
                         f"{', '.join(map(repr, BLOCK_SCALINGS))}; got {scaling!r}")
    if scaling in BLOCK_SCALINGS and flags.get("use_fast_accum"):
        raise ValueError("library_config: block-scaled fp8 GEMMs promote every 128 elements of K; "
                         "use_fast_accum=True is not available with them")
    cfg, source = gemm_config_sourced("torch._scaled_mm", **kw, **flags)
    if scaling in BLOCK_SCALINGS:  # measured: every block-scaled case of the captures, no split-K
        return (cfg.replace(schedule=KSchedule(promotion=128),
                            epilogue=Epilogue(scale_block=128, scales=BLOCK_SCALINGS[scaling])), "rule")
    return cfg.replace(epilogue=Epilogue(scales="product" if scaling == "tensor" else "sequential_ba")), source


def layer_config(lib: str, *, gpu: str, M: int, N: int, K: int, a: str, out: str, batch, flags: dict
                 ) -> tuple[GemmConfig, str]:
    """The configuration of one of :data:`LAYERS` (arguments already checked by
    :func:`tcemu.library_config`; ``a`` is the input type of both operands)."""
    if a not in ("f16", "bf16"):
        raise ValueError(f"library_config: {lib} takes f16 or bf16 inputs (the layers captured), got {a}")
    f = _flags(lib, flags)
    if lib == "jax.dense":
        return _dense(gpu, M, N, K, batch, a, out, f)
    if out != a:
        raise ValueError(f"library_config: {lib} returns its input type ({a}), got out={out!r}")
    cfg = _unsplit(gpu, K, N, a)
    # split-K off: the rule measured at every shape with K and N multiples of 8; other shapes run
    # a kernel of cuBLAS's heuristic (records)
    source = "rule" if not f["allow_splitk"] and cublas_family(K, N) == "nvjet" else "nearest"
    if f["allow_splitk"]:  # torch.mm's (torch.bmm's) measured split where the table holds this shape
        mm = "torch.bmm" if lib == "torch.baddbmm" else "torch.mm"
        kw = dict(arch=gpu, M=M, N=N, K=K, a=a, b=a, out=out, batch=batch if mm == "torch.bmm" else None)
        row = nearest_row(mm, **kw, reduced_precision_reduction=True)
        if distance(row, M, N, K, kw["batch"]) == 0 and row["schedule"].get("slices", 1) > 1:
            cfg = gemm_config(mm, **kw, reduced_precision_reduction=True)
    return cfg.replace(epilogue=_torch_epilogue(lib, f, K, N)), source


def library_config(lib: str, *, arch: str, M: int, N: int, K: int, a, b, out, batch: int | None = None,
                   records=None, strict: bool = False, with_source: bool = False, hlo=None, **flags):
    """The :class:`GemmConfig` with which ``tcemu.matmul`` gives what ``lib`` returns on ``arch``.

    ``lib``: "torch.mm", "torch.bmm", "torch._scaled_mm" or "jnp.dot" (bare GEMMs), or a layer
    with its epilogue: "F.linear", "torch.matmul", "torch.addmm", "torch.baddbmm", "jax.dense"
    (:mod:`~tcemu._src.library_layers`); ``arch``: "H100" or "H200";
    ``a``, ``b``: input types ("f16", "bf16", "e4m3", "e5m2" or dtypes); ``out``: "f32", "f16" or
    "bf16"; ``batch``: the batch size of a batched product (torch.bmm, batched jnp.dot). Flags:
    ``reduced_precision_reduction`` (torch.mm/bmm: torch's
    ``allow_{fp16,bf16}_reduced_precision_reduction``, default True), ``use_fast_accum``
    (torch._scaled_mm, default False) and ``xla_autotune`` (jnp.dot: False for
    ``XLA_FLAGS=--xla_gpu_autotune_level=0``; default True). With XLA's autotuner on, each new
    process times candidate kernels and may pick another one: on the H100, 10 of 90 jnp.dot
    shapes gave other bits in another process. With it off XLA's choices, and bits, are the same
    in every process, and the answer follows XLA's rules for any shape (no table).

    Layers' flags: ``bias`` (F.linear, jax.dense: whether a bias is given; default True),
    ``allow_splitk`` (torch layers: False for ``preferred_blas_library("cublaslt")`` with
    ``allow_{fp16,bf16}_reduced_precision_reduction = (False, False)``; default True), ``c``
    (torch.addmm: "matrix" or "row"), ``alpha``, ``beta`` (torch.addmm, torch.baddbmm; default
    1), ``xla_autotune`` (jax.dense); ``scaling`` (torch._scaled_mm: "tensor" (default), "row"
    scales, or block scales along K "1x128,1x128", "1x128,128x128", "128x128,1x128": scale_a's
    recipe and scale_b's, given to ``matmul`` as (M, K / 128) and (K / 128, N)). Pass the layer's bias / C / alpha / beta to
    :func:`tcemu.matmul` with the config returned: its ``epilogue`` says where they are added.

    ``workspace=0`` (torch's GEMMs, default mode): a process with a zero cuBLAS workspace
    (``CUBLAS_WORKSPACE_CONFIG=:0:0`` and ``CUBLASLT_WORKSPACE_SIZE=0``): cuBLAS then runs the
    default answer's kernel without split-K (source "rule" for f16 / bf16 at K and N multiples of
    8, one chain per tile; "nearest" where K or N is not). With ``allow_splitk=False`` it is
    refused (torch raises for most such GEMMs). Records made by :func:`tcemu.record` in such a
    process (its header's ``env``) imply ``workspace=0``.

    Where the answer comes from: ``records`` (default: the records shipped for ``arch``; a path:
    a file of :func:`tcemu.record` made on the user's GPU, whose name must hold ``arch``; False:
    none) holds cuBLAS's own choices for torch.mm, torch.bmm, torch._scaled_mm (tensor and row
    scales), F.linear, torch.matmul and torch.addmm (:mod:`~tcemu._src.library_records`; shipped
    for the H100 and the H200). ``with_source=True`` returns
    ``(config, source)``: "recorded" (cuBLAS's choice for this very case), "rule" (a documented
    rule: XLA's own with its autotuner off, the layers' split-K-off rule where K and N are
    multiples of 8, block-scaled fp8, or records agreeing around the shape) or "nearest" (a
    guess: for the shipped records, and a file made on the H100 or H200 with their torch and
    cuBLASLt, the kernel a random forest fitted on the H200's gives (the H100: with its own split-K
    count where the two GPUs' records differ around the shape; :mod:`~tcemu._src.library_fit`);
    otherwise the nearest measured shape's configuration, the
    measured table's included; jnp.dot
    with the autotuner on at a shape the table lacks: XLA's split-K rewriter's slices in
    64-element k-tiles, reduced in order);
    ``strict=True`` raises ``ValueError`` instead of guessing.

    ``hlo`` (jnp.dot): the optimised HLO of the user's own compiled function (``jax.jit(f).lower(x,
    y).compile().as_text()``, or a file holding it): with the autotuner on, the kernel XLA kept in
    that process is read off it (:mod:`~tcemu._src.library_xla`): source "compiled" for a Triton
    GEMM, "recorded" for a cuBLAS call the records hold; otherwise the answer without it.

    >>> import tcemu
    >>> cfg = tcemu.library_config("jnp.dot", arch="H100", M=128, N=128, K=8192, a="bf16", b="bf16",
    ...                            out="f32", xla_autotune=False)
    >>> cfg.instruction
    'm16n8k16.f32.bf16.bf16.f32'
    >>> cfg.schedule.describe()                    # XLA's split-K: 64 slices, a warp-shuffle reduction
    'k-tile 16, residue last, 64 slices aligned to 8, shuffle reduction of f32 partials'
    """
    if not isinstance(lib, str):
        raise TypeError(f"library_config: lib must be one of {', '.join(list(LIBRARIES) + list(LAYERS))} (a string), "
                        f"got {lib!r} ({type(lib).__name__})")
    for name, v in (("strict", strict), ("with_source", with_source)):
        if not isinstance(v, bool):
            raise TypeError(f"library_config: {name} must be True or False, got {v!r}")
    if hlo is not None and lib != "jnp.dot":
        raise ValueError(f"library_config: hlo= is for jnp.dot (XLA's compiled choice), not {lib}")
    zero = _check_workspace(lib, flags, records)
    cfg, source = _answer(lib, arch, M, N, K, a, b, out, batch, records, flags, hlo)
    if zero:
        cfg, source = _zero_workspace(lib, cfg, source, K, N, flags)
    if strict and source not in ("recorded", "rule", "compiled"):
        raise ValueError(f"library_config: no record or rule answers {lib} on {arch} at {M}x{N}x{K} "
                         f"({a} x {b} -> {out}, batch {batch}, flags {flags}); strict=True refuses the nearest "
                         "measured shape's configuration (run tcemu.record on the GPU for this shape)")
    return (cfg, source) if with_source else cfg


def _check_workspace(lib: str, flags: dict, records) -> bool:
    """Takes ``workspace`` out of ``flags``: whether it asks for a zero workspace (see
    :func:`_zero_workspace`), or ``records`` were made with one; anything else than 0 or
    omitted is refused."""
    if "workspace" not in flags:
        if not (lib in ZERO_WORKSPACE_LIBS and isinstance(records, (str, Path)) and Path(records).is_file()
                and R.zero_workspace(R.header(str(records)).get("env", {}))):
            return False
        flags["workspace"] = 0  # records made with a zero workspace answer for it
    w = flags.pop("workspace")
    if isinstance(w, bool) or not isinstance(w, int) or w != 0:
        raise ValueError(f"library_config: workspace must be 0 (CUBLAS_WORKSPACE_CONFIG=:0:0 and "
                         f"CUBLASLT_WORKSPACE_SIZE=0) or left out (torch's default workspace), got {w!r}; for "
                         "another size, run tcemu.record under it and pass records=")
    if lib not in ZERO_WORKSPACE_LIBS:
        raise ValueError(f"library_config: workspace=0 is for cuBLAS through torch ({', '.join(ZERO_WORKSPACE_LIBS)}), "
                         f"not {lib}")
    if flags.get("allow_splitk", True) is False:
        raise ValueError("library_config: workspace=0 with allow_splitk=False is not modelled: torch 2.11 raises "
                         "'OOM trying to allocate workspace for cublaslt' for most such GEMMs (measured on an H200: "
                         "torch.mm, torch.matmul, F.linear without bias, torch.addmm with a C matrix)")
    return True


def _zero_workspace(lib: str, cfg: GemmConfig, source: str, K: int, N: int, flags: dict) -> tuple[GemmConfig, str]:
    """torch's GEMMs with a zero cuBLAS workspace: cuBLAS runs the default answer's kernel
    without its split-K (no workspace for the partials), and a layer's bias or C where that
    kernel adds them unsplit. With K and N multiples of 8 (nvjet) an f16 / bf16 GEMM is then one
    chain per output tile whatever the tile: a rule. Measured on the H200 (zero-workspace
    captures, ``experiments/hardware/README.md``): every such case right. Where a CUTLASS 2
    kernel (K or N off a multiple of 8) loses its split, cuBLAS may take another CUTLASS kernel
    (s1688 or wmma s161616, by shape), so that answer is "nearest"."""
    s = cfg.k_schedule
    nvjet = cublas_family(K, N) == "nvjet"
    if s.slices != 1:
        cfg = cfg.replace(schedule=KSchedule(k_tile=s.k_tile, residue=s.residue, promotion=s.promotion))
        if lib in LAYERS:
            cfg = cfg.replace(epilogue=_torch_epilogue(lib, _flags(lib, flags), K, N))
        source = "rule" if nvjet and source in ("recorded", "rule") else "nearest"
    if nvjet and source == "nearest" and lib != "torch._scaled_mm" and cfg.k_schedule == KSchedule(k_tile=s.k_tile):
        source = "rule"  # one chain per tile: the bits do not depend on the guessed kernel
    return cfg, source


def _recorded_epilogue(lib: str, f: dict, row: dict, epi: Epilogue) -> Epilogue:
    """A torch layer's epilogue given the kernel cuBLAS recorded: ``torch.addmm`` with a full C
    and alpha = beta = 1 copies C into D, and nvjet ``_badd_`` kernels add it to the rounded
    product, other kernels before the rounding; a bias (F.linear) or C row (torch.addmm) meets a
    split-K reduction in the output type (``OUTPUT_TYPE``) after its rounding (the dev captures'
    one such shape, 64 x 1000 x 3333 bf16: both layers)."""
    names = " ".join(row["kernels"])
    if lib == "torch.addmm" and f["c"] == "matrix" and (f["alpha"], f["beta"]) == (1, 1):
        return Epilogue(c="output" if "_badd_" in names else "accumulator")
    if R.algo(row).get("reductionScheme") == "OUTPUT_TYPE":
        if lib == "F.linear" and f["bias"]:
            return Epilogue(bias="output")
        if lib == "torch.addmm" and f["c"] == "row":
            return Epilogue(c="output")
    return epi


def _answer(lib, arch, M, N, K, a, b, out, batch, records, flags, hlo=None):
    """(config, source) of :func:`library_config`."""
    if lib not in LIBRARIES and lib not in LAYERS:
        raise ValueError(f"library_config: lib must be one of {', '.join(list(LIBRARIES) + list(LAYERS))}, got {lib!r}")
    gpu, M, N, K, a, b, out = check_common(arch, M, N, K, a, b, out, batch)
    path = R.records_path(records, arch, gpu)
    if hlo is not None:
        def recorded(lib2, f):
            base = _scaled_mm(dict(arch=arch, M=M, N=N, K=K, a=a, b=b, out=out, batch=batch), f)[0] \
                if lib2 == "torch._scaled_mm" else None
            return R.answer(path, lib2, gpu, M, N, K, a, b, out, batch, f, **({"base": base} if base else {})) \
                if path else None
        got = X.config_from_hlo(gpu, M, N, K, batch, a, b, out, hlo, recorded)
        if got is not None:
            return got
    if lib == "torch._scaled_mm":
        cfg, source = _scaled_mm(dict(arch=arch, M=M, N=N, K=K, a=a, b=b, out=out, batch=batch), flags)
        scaling = flags.get("scaling", "tensor")
        if path and scaling in ("tensor", "row") and isinstance(flags.get("use_fast_accum", False), bool):
            f = {"use_fast_accum": flags.get("use_fast_accum", False)} | ({"scaling": "row"} if scaling == "row" else {})
            rec = R.answer(path, "torch._scaled_mm", gpu, M, N, K, a, b, out, batch, f, base=cfg)
            if rec is not None:
                return rec[0].replace(epilogue=cfg.epilogue), rec[1]
        return cfg, source
    if lib in LIBRARIES:
        if path and lib in ("torch.mm", "torch.bmm") and set(flags) <= {"reduced_precision_reduction"}:
            f = {"reduced_precision_reduction": flags.get("reduced_precision_reduction", True)}
            if isinstance(f["reduced_precision_reduction"], bool):
                rec = R.answer(path, lib, gpu, M, N, K, a, b, out, batch, f)
                if rec is not None:
                    return rec[:2]
        return gemm_config_sourced(lib, arch=arch, M=M, N=N, K=K, a=a, b=b, out=out, batch=batch, **flags)
    if a != b:
        raise ValueError(f"library_config: {lib} takes a and b of one type, got {a} and {b}")
    cfg, source = layer_config(lib, gpu=gpu, M=M, N=N, K=K, a=a, out=out, batch=batch, flags=flags)
    if path and lib in ("F.linear", "torch.matmul", "torch.addmm") and a in ("f16", "bf16") and out == a and not batch:
        f = _flags(lib, flags)
        if lib == "F.linear":
            rec = R.answer(path, lib, gpu, M, N, K, a, b, out, None, {"bias": f["bias"], "allow_splitk": f["allow_splitk"]})
        elif lib == "torch.addmm":
            rec = R.answer(path, lib, gpu, M, N, K, a, b, out, None,
                           {k: (float(v) if k in ("alpha", "beta") else v) for k, v in f.items()})
        else:  # torch.matmul of 2-D operands (3-D activations flattened) is torch.mm
            mode = ({"reduced_precision_reduction": True} if f["allow_splitk"] else
                    {"reduced_precision_reduction": False, "allow_splitk": False})
            rec = R.answer(path, "torch.mm", gpu, M, N, K, a, b, out, None, mode)
        if rec is not None:
            return rec[0].replace(epilogue=_recorded_epilogue(lib, f, rec[2], cfg.epilogue)), rec[1]
    return cfg, source
