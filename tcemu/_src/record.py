"""Record which cuBLAS kernels PyTorch runs on this GPU: ``tcemu.record``.

cuBLAS picks a GEMM's kernel (tile, split-K count, reduction scheme) with a heuristic of the GPU,
its SM count, the library version, the workspace and the types; no formula can know it, but
cuBLASLt says what it launched. ``record`` calls each GEMM once on uninitialised operands with
cuBLASLt's logger on (``cublasLtLoggerSetCallback``, trace mask: the parameters of every call
that launches a kernel, cuBLAS's own ``cublasGemmEx`` included, which runs through cuBLASLt),
and reads the kernels that ran from the torch profiler. The record file (gzipped JSON) holds the
GPU, its SM count, the library versions and, per case, the algorithm each cuBLASLt call ran:
``algoId``, ``tile``, ``stages``, ``reductionScheme``, ``numSplitsK``, ``customOption``,
``clusterShape``, with the kernel names. ``tcemu.library_config(..., records=path)`` answers
from it anywhere, without a GPU.

    tcemu.record("h100.json.gz")                       # the default grid, about a minute
    python -m tcemu record h100.json.gz --shapes 1000x3000x777,16x4096x4096

On a machine without PyTorch or without an NVIDIA GPU, ``record`` raises ``RuntimeError``.
"""
from __future__ import annotations

import ctypes
import gzip
import json
import os
import re
import sys
import time
from pathlib import Path

SCHEMA = 1
# what record() can call, each with the flag combinations it records (names as library_config's;
# allow_splitk=False: torch.backends.cuda.preferred_blas_library("cublaslt") and
# allow_{fp16,bf16}_reduced_precision_reduction = (False, False), the layers' split-K-off mode)
LIBS = {"torch.mm": ({"reduced_precision_reduction": True}, {"reduced_precision_reduction": False},
                     {"reduced_precision_reduction": False, "allow_splitk": False}),
        "torch.bmm": ({"reduced_precision_reduction": True}, {"reduced_precision_reduction": False}),
        "torch._scaled_mm": ({"use_fast_accum": False}, {"use_fast_accum": True},
                             {"use_fast_accum": False, "scaling": "row"}, {"use_fast_accum": True, "scaling": "row"}),
        "F.linear": tuple({"bias": b, "allow_splitk": s} for b in (True, False) for s in (True, False)),
        "torch.addmm": tuple(dict(c=c, alpha=al, beta=be, allow_splitk=s) for c, al, be in
                             (("matrix", 1.0, 1.0), ("row", 1.0, 1.0), ("matrix", 2.0, 0.5)) for s in (True, False))}
_FP8 = tuple((a, b, o) for a in ("e4m3", "e5m2") for b in ("e4m3", "e5m2") if (a, b) != ("e5m2", "e5m2")
             for o in ("bf16", "f16", "f32"))
TYPES = {"torch.mm": (("f16", "f16", "f16"), ("bf16", "bf16", "bf16")),
         "torch.bmm": (("f16", "f16", "f16"), ("bf16", "bf16", "bf16")),
         "torch._scaled_mm": _FP8,
         "F.linear": (("f16", "f16", "f16"), ("bf16", "bf16", "bf16")),
         "torch.addmm": (("f16", "f16", "f16"), ("bf16", "bf16", "bf16"))}
# torch._scaled_mm's row-wise scales (scale_a (M, 1), scale_b (1, N)): e4m3 inputs, bf16 output
ROW_TYPES = (("e4m3", "e4m3", "bf16"),)

# the default grid: every M and N of SIDES with every K of DEPTHS (multiples of 8: cuBLAS's
# Hopper kernels), and a coarser grid of K and N off a multiple of 8 (its CUTLASS 2 kernels)
SIDES = (8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256, 320, 384, 512, 640, 768, 1024, 1536, 2048, 3072,
         4096, 6144, 8192)
DEPTHS = (64, 128, 192, 256, 384, 512, 640, 768, 1024, 1536, 2048, 2560, 3072, 4096, 6144, 8192, 12288, 16384,
          24576, 32768)
ODD_SIDES = (8, 32, 128, 333, 1000, 3000, 8192)
ODD_DEPTHS = (64, 256, 1000, 4096, 16384)
OFFSETS = ((1, 0), (2, 0), (4, 0), (0, 1), (0, 2), (0, 4), (4, 4), (1, 1))  # (dK, dN)
BATCHES = (2, 4, 8, 16)
COARSE = (16, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
COARSE_DEPTHS = (64, 256, 1024, 4096, 16384)


def default_cases(quick: bool = False) -> list[dict]:
    """The cases ``record`` runs without ``cases=``: torch.mm (both reduction flags) on the dense
    grid; torch.bmm, torch._scaled_mm and F.linear on coarser ones. ``quick``: a few shapes."""
    sides, depths = ((64, 1000, 4096),) * 2 if quick else (SIDES, DEPTHS)
    aligned = [(M, N, K) for M in sides for N in sides for K in depths if K % 8 == 0 and N % 8 == 0]
    osides, odepths = ((333,), (1000,)) if quick else (ODD_SIDES, ODD_DEPTHS)
    odd = [(M, N + dn, K + dk) for M in osides for N in osides for K in odepths for dk, dn in OFFSETS]
    coarse = [(M, N, K) for M in (COARSE[:2] if quick else COARSE) for N in (COARSE[:2] if quick else COARSE)
              for K in (COARSE_DEPTHS[:2] if quick else COARSE_DEPTHS)]
    mm = LIBS["torch.mm"]
    return (expand("torch.mm", aligned + odd, flags=mm[:2]) + expand("torch.mm", coarse + odd, flags=mm[2:])
            + expand("torch.bmm", coarse, BATCHES[:1 + 3 * (not quick)]) + expand("torch._scaled_mm", coarse)
            + expand("F.linear", coarse + odd) + expand("torch.addmm", coarse + odd))


def expand(lib: str, shapes, batches=(None,), flags=None) -> list[dict]:
    """Cases of ``lib`` at each (M, N, K) for each batch, type triple of :data:`TYPES` and flag
    combination of :data:`LIBS` (or ``flags``: some of them), fp8 where M, N and K are multiples
    of 16 (``_scaled_mm``'s requirement)."""
    combos = LIBS[lib] if flags is None else flags
    out = []
    for M, N, K in shapes:
        if lib == "torch._scaled_mm" and (M % 16 or N % 16 or K % 16):
            continue
        for batch in batches:
            for f in combos:
                types = ROW_TYPES if f.get("scaling") == "row" else TYPES[lib]
                out += [dict(lib=lib, batch=batch, M=M, N=N, K=K, a=a, b=b, out=o, flags=f) for a, b, o in types]
    return out


_GROUP = re.compile(r"(\w+)=\[([^\]]*)\]")
_FIELD = re.compile(r"(\w+)=(\S+)")


def parse_trace(function: str, message: str) -> dict:
    """One cuBLASLt trace message as a dict: the function, the algorithm's fields (numbers as
    int, the ``MATMUL_TILE_`` / ``REDUCTION_SCHEME_`` prefixes dropped), the compute descriptor and
    the D matrix layout.

    >>> parse_trace("cublasLtMatmul", "Ddesc=[type=R_16BF rows=64 cols=64 ld=64] "
    ...             "algo=[algoId=66 tile=MATMUL_TILE_64x32 numSplitsK=12 reductionScheme=REDUCTION_SCHEME_COMPUTE_TYPE]")["algo"]
    {'algoId': 66, 'tile': '64x32', 'numSplitsK': 12, 'reductionScheme': 'COMPUTE_TYPE'}
    """
    out = {"fn": function}
    for name, body in _GROUP.findall(message):
        if name in ("algo", "computeDesc", "Ddesc", "Adesc", "Bdesc"):
            fields = {}
            for k, v in _FIELD.findall(body):
                v = re.sub(r"^(MATMUL_TILE_|MATMUL_STAGES_|REDUCTION_SCHEME_|CLUSTER_SHAPE_|EPILOGUE_)", "", v)
                fields[k] = int(v) if re.fullmatch(r"-?\d+", v) else v
            out[name] = fields
    return out


def _torch():
    try:
        import torch
    except ImportError as e:
        raise RuntimeError("tcemu.record runs on an NVIDIA GPU with PyTorch (pip install torch): torch is not "
                           "installed") from e
    if not torch.cuda.is_available() or torch.version.cuda is None:
        raise RuntimeError("tcemu.record needs an NVIDIA GPU that PyTorch can use (torch.cuda.is_available() is "
                           "False here)")
    return torch


def _loaded_cublaslt():
    """The libcublasLt PyTorch loaded (the same library, so the logger sees torch's calls)."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError as e:
        raise RuntimeError("tcemu.record reads /proc/self/maps to find PyTorch's cuBLASLt (Linux only)") from e
    for line in maps.splitlines():
        if "libcublasLt.so" in line:
            return ctypes.CDLL(line.split(None, 5)[-1])
    raise RuntimeError("tcemu.record: PyTorch did not load libcublasLt (is this a CUDA build of torch?)")


class _Logger:
    """cuBLASLt's trace messages, collected into ``self.calls`` while active."""
    TRACE = 2  # cublasLtLoggerSetMask: parameters of the calls that launch kernels

    def __init__(self, lib):
        self.lib, self.calls = lib, None
        proto = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p)
        self._cb = proto(self._on)  # kept: cuBLASLt holds a raw pointer to it
        # the messages go to the callback only, not to stdout (cuBLASLt's default log file)
        for fn, arg in (("cublasLtLoggerOpenFile", b"/dev/null"), ("cublasLtLoggerSetCallback", self._cb),
                        ("cublasLtLoggerSetMask", self.TRACE)):
            if getattr(lib, fn)(arg) != 0:
                raise RuntimeError(f"tcemu.record: {fn} failed")

    def _on(self, level, function, message):
        if self.calls is not None and b"Matmul" in (function or b"") and b"algo=[" in (message or b""):
            self.calls.append(parse_trace(function.decode(), message.decode()))

    def close(self):
        self.lib.cublasLtLoggerSetMask(0)
        self.lib.cublasLtLoggerSetCallback(None)


def _set_reduction(matmul, reduced: bool, splitk: bool):
    """torch's ``allow_{fp16,bf16}_reduced_precision_reduction``: the (reduced precision, split-K)
    tuple of torch >= 2.10, the bool before (split-K then always allowed)."""
    for name in ("allow_fp16_reduced_precision_reduction", "allow_bf16_reduced_precision_reduction"):
        try:
            setattr(matmul, name, (reduced, splitk))
        except (TypeError, ValueError, RuntimeError):
            if not splitk:
                raise RuntimeError("tcemu.record: this torch has no split-K-off setting (the tuple form of "
                                   f"torch.backends.cuda.matmul.{name}, torch >= 2.10)") from None
            setattr(matmul, name, reduced)


class _Runner:
    def __init__(self, torch):
        self.t = torch
        self.dt = {"f16": torch.float16, "bf16": torch.bfloat16, "e4m3": torch.float8_e4m3fn,
                   "e5m2": torch.float8_e5m2, "f32": torch.float32}

    def call(self, c):
        """A function running case ``c`` on uninitialised operands (cuBLAS's choice does not look
        at the values), with torch's settings of the case's flags."""
        t, f, dt = self.t, c["flags"], self.dt
        matmul = t.backends.cuda.matmul
        off = f.get("allow_splitk", True) is False
        _set_reduction(matmul, False if off else f.get("reduced_precision_reduction", True), not off)
        t.backends.cuda.preferred_blas_library("cublaslt" if off else "cublas")
        M, N, K, B = c["M"], c["N"], c["K"], c["batch"]
        lead = (B,) if B else ()
        if c["lib"] == "torch._scaled_mm":
            a = t.empty((M, K), dtype=dt[c["a"]], device="cuda")
            b = t.empty((N, K), dtype=dt[c["b"]], device="cuda").t()  # column-major, as cuBLASLt fp8 needs
            if f.get("scaling") == "row":
                sa, sb = t.ones((M, 1), device="cuda", dtype=t.float32), t.ones((1, N), device="cuda", dtype=t.float32)
            else:
                sa = sb = t.ones((), device="cuda", dtype=t.float32)
            return lambda: t._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=dt[c["out"]],
                                        use_fast_accum=f["use_fast_accum"])
        if c["lib"] == "F.linear":
            x = t.empty(lead + (M, K), dtype=dt[c["a"]], device="cuda")
            w = t.empty((N, K), dtype=dt[c["b"]], device="cuda")
            bias = t.empty((N,), dtype=dt[c["a"]], device="cuda") if f["bias"] else None
            return lambda: t.nn.functional.linear(x, w, bias)
        a = t.empty(lead + (M, K), dtype=dt[c["a"]], device="cuda")
        b = t.empty(lead + (K, N), dtype=dt[c["b"]], device="cuda")
        if c["lib"] == "torch.addmm":
            cc = t.empty((M, N) if f["c"] == "matrix" else (N,), dtype=dt[c["out"]], device="cuda")
            kw = {} if (f["alpha"], f["beta"]) == (1.0, 1.0) else {"alpha": f["alpha"], "beta": f["beta"]}
            return lambda: t.addmm(cc, a, b, **kw)
        return (lambda: t.bmm(a, b)) if c["lib"] == "torch.bmm" else (lambda: t.mm(a, b))

    def chunk(self, cases, logger):
        """Per case: the cuBLASLt calls (parsed trace messages), the kernels that ran, and the
        error torch raised (None: it ran)."""
        t = self.t
        from torch.profiler import ProfilerActivity, profile, record_function
        calls, errors = [], []
        m = t.backends.cuda.matmul
        blas, saved = t.backends.cuda.preferred_blas_library(), (m.allow_fp16_reduced_precision_reduction,
                                                                 m.allow_bf16_reduced_precision_reduction)
        try:
            with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
                for i, c in enumerate(cases):
                    fn = self.call(c)
                    logger.calls = []
                    with record_function(f"tcemu_case{i}"):
                        errors.append(attempt(fn))
                    calls.append(logger.calls)
                    logger.calls = None
                t.cuda.synchronize()
        finally:
            t.backends.cuda.preferred_blas_library(blas)
            m.allow_fp16_reduced_precision_reduction, m.allow_bf16_reduced_precision_reduction = saved
        return calls, _kernels(prof, len(cases)), errors


def attempt(fn) -> str | None:
    """Run ``fn``; the message of the ``RuntimeError`` it raises, or None. torch raises per call
    where its settings leave cuBLAS no way to run the GEMM (with ``CUBLASLT_WORKSPACE_SIZE=0``,
    cuBLASLt calls raise "OOM trying to allocate workspace for cublaslt"): that case is recorded
    with its error, and the rest of the grid goes on.

    >>> attempt(lambda: None) is None
    True
    """
    try:
        fn()
    except RuntimeError as e:
        return f"{type(e).__name__}: {str(e)[:300]}"
    return None


# torch's environment variables that change cuBLAS's choices, kept in a record's header
ENV = ("CUBLAS_WORKSPACE_CONFIG", "CUBLASLT_WORKSPACE_SIZE", "TORCH_BLAS_PREFER_CUBLASLT", "DISABLE_ADDMM_CUDA_LT")


def environment(environ=os.environ) -> dict:
    """The variables of :data:`ENV` set in ``environ``.

    >>> environment({"CUBLAS_WORKSPACE_CONFIG": ":0:0", "HOME": "/root"})
    {'CUBLAS_WORKSPACE_CONFIG': ':0:0'}
    """
    return {k: environ[k] for k in ENV if k in environ}


def _kernels(prof, n):
    """The GPU kernels each ``tcemu_case<i>`` range launched: the kernel's launch (runtime or
    driver call, by correlation id) falls inside the range."""
    import bisect
    import os
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        trace = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(trace)
        events = json.loads(Path(trace).read_text())["traceEvents"]
    spans = sorted((e["ts"], e["ts"] + e["dur"], int(e["name"][10:])) for e in events
                   if e.get("cat") == "user_annotation" and e.get("name", "").startswith("tcemu_case"))
    starts = [s[0] for s in spans]
    launch = {e["args"]["correlation"]: e["ts"] for e in events
              if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    out = [[] for _ in range(n)]
    for e in sorted((e for e in events if e.get("cat") == "kernel"), key=lambda e: e["ts"]):
        ts = launch.get(e.get("args", {}).get("correlation"))
        j = bisect.bisect_right(starts, ts) - 1 if ts is not None else -1
        if j >= 0 and ts <= spans[j][1]:
            out[spans[j][2]].append(re.sub(r"^void ", "", e["name"]))
    return out


def _check_cases(cases):
    if not isinstance(cases, (list, tuple)) or not cases:
        raise ValueError(f"record: cases must be a non-empty list of case dicts (see tcemu._src.record.expand), "
                         f"got {cases!r:.80}")
    for c in cases:
        if not isinstance(c, dict) or c.get("lib") not in LIBS:
            raise ValueError(f"record: each case is a dict with lib one of {', '.join(LIBS)}, got {c!r:.120}")
        for k in ("M", "N", "K"):
            if not isinstance(c.get(k), int) or isinstance(c.get(k), bool) or c[k] < 1:
                raise ValueError(f"record: {k} must be a positive integer, got {c.get(k)!r} in {c!r:.120}")
        if c.get("flags") not in LIBS[c["lib"]]:
            raise ValueError(f"record: {c['lib']} takes flags one of {list(LIBS[c['lib']])}, got {c.get('flags')!r}")
        types = ROW_TYPES if c["flags"].get("scaling") == "row" else TYPES[c["lib"]]
        if (c.get("a"), c.get("b"), c.get("out")) not in types:
            raise ValueError(f"record: {c['lib']} with flags {c['flags']} takes (a, b, out) one of {types}, got "
                             f"{(c.get('a'), c.get('b'), c.get('out'))}")
        if c.get("batch") is not None and (c["lib"] != "torch.bmm" or not isinstance(c["batch"], int) or c["batch"] < 1):
            raise ValueError(f"record: batch is a positive integer for torch.bmm and None otherwise, got "
                             f"{c.get('batch')!r} for {c['lib']}")


def _write(path, header, rows, t0):
    header = header | {"seconds": round(time.time() - t0, 1),
                       "cases without a cuBLASLt call": sum(not r["calls"] for r in rows),
                       "cases torch refused": sum("error" in r for r in rows)}
    part = Path(path).with_name(Path(path).name + ".partial")  # a write cut off leaves the last one whole
    with gzip.open(part, "wt") as f:
        json.dump({"header": header, "cases": rows}, f, separators=(",", ":"))
    os.replace(part, path)


def record(path, *, cases=None, shapes=None, quick: bool = False, chunk: int = 500, progress=True) -> Path:
    """Record the cuBLAS algorithm PyTorch runs for each case on this GPU into ``path``
    (gzipped JSON), for :func:`tcemu.library_config` ``(..., records=path)``.

    ``cases``: case dicts (``lib``, ``batch``, ``M``, ``N``, ``K``, ``a``, ``b``, ``out``,
    ``flags``; :func:`expand` builds them); ``shapes``: instead, (M, N, K) triples, run as
    torch.mm, F.linear, torch.addmm and torch._scaled_mm with every type and flag of
    :data:`LIBS` (fp8 where M, N and K are multiples of 16); neither: the default grid
    (:func:`default_cases`; ``quick``: a few shapes). Needs PyTorch and an NVIDIA GPU (a
    ``RuntimeError`` otherwise); prints a line of progress every 10 s when ``progress``.

    >>> import tcemu
    >>> try:
    ...     path = tcemu.record("gpu.json.gz", shapes=[(1000, 3000, 777)])
    ... except RuntimeError:                       # no NVIDIA GPU (or no torch) here
    ...     path = None
    """
    if cases is not None and shapes is not None:
        raise ValueError("record: pass cases or shapes, not both")
    if shapes is not None:
        if not isinstance(shapes, (list, tuple)) or not all(
                isinstance(s, (list, tuple)) and len(s) == 3 and all(isinstance(x, int) and x > 0 for x in s)
                for s in shapes):
            raise ValueError(f"record: shapes must be a list of (M, N, K) positive integer triples, got {shapes!r:.80}")
        cases = [c for lib in ("torch.mm", "F.linear", "torch.addmm", "torch._scaled_mm")
                 for c in expand(lib, [tuple(s) for s in shapes])]
    cases = default_cases(quick) if cases is None else list(cases)
    _check_cases(cases)
    if not isinstance(chunk, int) or isinstance(chunk, bool) or chunk < 1:
        raise ValueError(f"record: chunk must be a positive integer, got {chunk!r}")
    for name, v in (("quick", quick), ("progress", progress)):
        if not isinstance(v, bool):
            raise TypeError(f"record: {name} must be True or False, got {v!r}")
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"record: path must be a file path (str or os.PathLike), got {path!r}")
    if not Path(path).parent.is_dir():  # before the work, not at the first write a minute in
        raise ValueError(f"record: path's folder {str(Path(path).parent)!r} does not exist")
    torch = _torch()
    runner = _Runner(torch)
    torch.mm(torch.ones(8, 8, device="cuda", dtype=torch.float16), torch.ones(8, 8, device="cuda", dtype=torch.float16))
    lib = _loaded_cublaslt()
    logger = _Logger(lib)
    t0 = last = shown = time.time()
    rows = []
    lib.cublasLtGetVersion.restype = ctypes.c_size_t
    props = torch.cuda.get_device_properties(0)
    header = {"schema": SCHEMA, "gpu": torch.cuda.get_device_name(0), "sms": props.multi_processor_count,
              "cc": f"{props.major}.{props.minor}", "torch": torch.__version__, "cuda": torch.version.cuda,
              "cublaslt": int(lib.cublasLtGetVersion()), "env": environment(), "date": time.strftime("%Y-%m-%d")}
    path = Path(path)
    try:
        if progress:
            print(f"tcemu.record: {len(cases)} cases on {header['gpu']}", file=sys.stderr, flush=True)
        for i in range(0, len(cases), chunk):
            part = cases[i:i + chunk]
            calls, kernels, errors = runner.chunk(part, logger)
            rows += [dict(c, calls=[], kernels=[], error=e) if e else dict(c, calls=cl, kernels=k)
                     for c, cl, k, e in zip(part, calls, kernels, errors)]
            if progress and (time.time() - shown > 10 or len(rows) == len(cases)):  # a line every 10 s
                print(f"tcemu.record: {len(rows)} of {len(cases)} cases, {time.time() - t0:.0f} s", file=sys.stderr,
                      flush=True)
                shown = time.time()
            if time.time() - last > 60 and len(rows) < len(cases):  # partial results survive a time limit
                _write(path, header | {"complete": False}, rows, t0)
                last = time.time()
    finally:
        logger.close()
    _write(path, header | {"complete": True}, rows, t0)
    return path
