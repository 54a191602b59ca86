"""Capture the GEMM layers ML code calls, with their epilogues, on this GPU: ``F.linear`` (with and
without bias, 2-D and 3-D activations), ``torch.addmm`` (full C, a broadcast bias row, alpha = 2
and beta = 0.5), ``torch.mm``, ``torch.baddbmm`` and fp8 ``torch._scaled_mm`` (per-tensor and
row-wise scales, with and without bias; 1x128 and 128x128 block scales along K, DeepSeek-V3's
recipe) through PyTorch, and a jitted dense layer through XLA.

    python experiments/hardware/layer_gemm.py --lib torch --mode all --out OUTDIR [--grid held-out]
    python experiments/hardware/layer_gemm.py --lib jax --out OUTDIR [--grid held-out]
    XLA_FLAGS=--xla_gpu_autotune_level=0 python experiments/hardware/layer_gemm.py --lib jax --out OUTDIR
    python experiments/hardware/layer_gemm.py --lib torch --mode all --dry-run --out /tmp/x   # CPU check

Writes ``OUTDIR/layer_gemm_<gpu>_<lib>_<mode>[_heldout][_salt<N>].npz`` in ``library_gemm.py``'s
format (``<key>.d`` output bits at the crop, ``<key>.rows`` flat over batch * M, ``<key>.cols``,
``meta``: a header with versions, date, command, seconds, the mode's settings; the cases with the
CUDA kernels in launch order (torch profiler) or the GEMM/fusion lines of XLA's optimised HLO, and
whether two runs gave the same bits). Modes: torch ``default`` and ``splitk_off`` (cuBLASLt,
reduced-precision reduction off, split-K off where torch takes the tuple form; ``all``: both in
one process); jax ``default`` and ``autotune_off`` (from ``XLA_FLAGS``).

Operands (from the case's seed, ``tcemu._src.captures``): "a" is A (batch, M, K), the activation x
(the 3-D one is A viewed as (B, S, K), ``x3``); "b" is B (K, N): a linear layer's weight is
W = B.T (N, K), nn.Linear's layout (y = x W^T + b = A B + b), jax's W is B; "bias" an (N,) row,
"c" a full (batch, M, N) C; fp8 row-wise scales ``scale_values``, block scales ``block_scales``
("scaled_block" cases: ``scale_a``/``scale_b`` name the recipe, "1x128" or "128x128"). ``b_layout``: how B lies in
memory for the call ("row": (K, N) row-major; "col": W = B.T row-major).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1]))
import gemm_inputs as G  # noqa: E402
import library_gemm as LG  # noqa: E402
from tcemu._src import captures as C  # noqa: E402
from tcemu._src.record import environment  # noqa: E402

SHAPES = {  # (M, N, K): odd and round, skinny and deep
    "dev": [(77, 3072, 768), (128, 768, 3072), (333, 1000, 555), (512, 1024, 1024), (1024, 4096, 1024),
            (256, 11008, 4096), (2048, 1024, 11008), (4096, 4096, 4096)],
    "held-out": [(65, 2304, 768), (200, 1536, 6144), (999, 777, 1111), (384, 4096, 1024), (1536, 512, 2048),
                 (3000, 1000, 333), (96, 8192, 1024), (2048, 2048, 5120)],
    "dry": [(13, 40, 24), (32, 48, 64), (18, 24, 40)],  # --dry-run: small K, so float64 sums are exact
    # after the cuBLAS record rules were frozen (library_gemm.py's fresh grid, unbatched)
    "fresh": [(40, 4096, 4096), (112, 1536, 5120), (704, 896, 4992), (1200, 2400, 800), (96, 7168, 2048),
              (272, 272, 9216), (2560, 2560, 1088), (80, 80, 20480), (555, 777, 999), (1234, 567, 890),
              (64, 1000, 3333)],
    "fresh2": [(48, 5120, 3584), (176, 704, 7040), (640, 1792, 2816), (1536, 3584, 576), (208, 208, 14336),
               (3072, 768, 1216), (24, 1024, 10240), (777, 333, 2222), (100, 4000, 1001), (2000, 1500, 755)],
    # after serial split-K's epilogue was frozen (0781544): shapes where both GPUs' records run
    # cuBLASLt's INPLACE split-K for F.linear with a bias and torch.addmm
    "serial": [(3000, 3001, 1000), (333, 8192, 4097), (8192, 337, 4100), (1000, 3000, 4098), (3000, 1001, 4097),
               (1000, 3004, 4100), (333, 8196, 16384), (3000, 1000, 16388)],
    # after stop 48's jnp.dot rule and off-grid records were frozen (library_gemm.py's fresh3, unbatched)
    "fresh3": [(2448, 1600, 1482), (480, 382, 6144), (192, 916, 13312), (2816, 2872, 7616), (1344, 64, 2944),
               (3968, 633, 1792), (59, 80, 11088), (64, 1104, 4544), (64, 659, 490), (64, 160, 3840)],
    # after stop 51's CUTLASS 2 slice alignment was frozen (library_gemm.py's fresh4, unbatched)
    "fresh4": [s[1:] for s in G.FRESH4_SHAPES if s[0] is None],
    # after stop 52's refit (library_gemm.py's fresh5, unbatched)
    "fresh5": [s[1:] for s in G.FRESH5_SHAPES if s[0] is None],
    # after stop 54's refit (library_gemm.py's fresh6, unbatched)
    "fresh6": [s[1:] for s in G.FRESH6_SHAPES if s[0] is None],
    # after stop 55's freeze (library_gemm.py's fresh7, unbatched)
    "fresh7": [s[1:] for s in G.FRESH7_SHAPES if s[0] is None],
    # after stop 56's freeze (library_gemm.py's fresh8, unbatched)
    "fresh8": [s[1:] for s in G.FRESH8_SHAPES if s[0] is None],
    # after stop 57's freeze (library_gemm.py's fresh9, unbatched)
    "fresh9": [s[1:] for s in G.FRESH9_SHAPES if s[0] is None],
    # after stop 58's freeze (library_gemm.py's fresh10, unbatched)
    "fresh10": [s[1:] for s in G.FRESH10_SHAPES if s[0] is None],
    # stop 59's zero-workspace held-out grid (library_gemm.py's fresh11, unbatched)
    "fresh11": [s[1:] for s in G.FRESH11_SHAPES if s[0] is None],
}
BLOCK_SHAPES = {  # fp8 block scales along K: K a multiple of 128
    "dev": [(256, 768, 512), (384, 128, 1280), (512, 1024, 4096), (128, 4096, 7168), (2048, 2048, 2048),
            (200, 512, 1024)],
    "held-out": [(640, 1536, 3072), (96, 2048, 1024), (1024, 512, 6144), (320, 896, 2560)],
    "dry": [(16, 24, 256)],
}  # the other grids: none
BLOCK_PAIRS = (("1x128", "1x128"), ("1x128", "128x128"), ("128x128", "1x128"))  # (scale_a, scale_b) recipes
BATCHED = {"dev": [(4, 512, 512, 1024), (2, 77, 3072, 768)], "held-out": [(3, 200, 640, 1536), (8, 64, 1024, 4096)],
           "dry": [(2, 16, 24, 32)]}  # torch.baddbmm: (batch, M, N, K); the other grids: none
LIB = {"mm": "torch.mm", "matmul": "torch.matmul", "linear": "F.linear", "addmm": "torch.addmm", "baddbmm": "torch.baddbmm",
       "scaled": "torch._scaled_mm", "dense": "jax.jit(x @ W [+ b])"}
SCALES = (float(np.float32(0.0123)), float(np.float32(3.7)))  # per-tensor fp8 scales: inexact product in f32
MODES = {"torch": ("default", "splitk_off"), "jax": ("default", "autotune_off")}
PREFIX = {"default": "l", "splitk_off": "s", "autotune_off": "a"}  # case keys l0, l1, ... s0, ... a0, ...
HLO_LINE = re.compile(r"custom_call_target|__triton|triton_gemm|split_k|cublas|epilogue|\bdot\(|reduce\(|"
                      r"fusion\(|\badd\(|bitcast\(|ENTRY|ROOT")


def seed_of(batch, M, N, K, a, b, salt=0) -> int:
    """``gemm_inputs.seed_of`` (the library captures' inputs at a shared shape) for salt 0;
    otherwise new inputs for the same grid."""
    if not salt:
        return G.seed_of(batch, M, N, K, a, b)
    return int.from_bytes(hashlib.sha256(f"{salt}:{batch},{M},{N},{K},{a},{b}".encode()).digest()[:4], "little")


def x3_of(M) -> list:
    """The 3-D activation's (B, S), B * S = M: B = 4 or 2 where it divides M, else 1."""
    return next([B, M // B] for B in (4, 2, 1) if M % B == 0)


def cases(grid="dev", lib="torch", salt=0) -> list:
    """The case grid: dicts with lib, layer, batch, M, N, K, a, b, out, bias, c (formats or None),
    alpha, beta, x3, b_layout, scale_a, scale_b (a float, "row" or None), flags, seed."""
    out = []

    def add(layer, shape, t, o=None, bias=None, c=None, alpha=1.0, beta=1.0, x3=None, scaling=None, **flags):
        bt, M, N, K = shape
        sa, sb = scaling if isinstance(scaling, tuple) else {"tensor": SCALES, "row": ("row", "row"),
                                                             None: (None, None)}[scaling]
        out.append(dict(lib=LIB[re.match("[a-z]+", layer)[0]], layer=layer, batch=bt, M=M, N=N, K=K, a=t, b=t,
                        out=o or t, bias=bias, c=c, alpha=alpha, beta=beta, x3=x3,
                        b_layout="col" if layer.startswith(("linear", "scaled")) else "row", scale_a=sa, scale_b=sb,
                        flags=dict(flags, **({"scaling": ",".join(scaling) if isinstance(scaling, tuple) else scaling}
                                             if scaling else {})),
                        seed=seed_of(bt, M, N, K, t, t, salt)))

    for M, N, K in SHAPES[grid]:
        s = (None, M, N, K)
        for t in ("f16", "bf16"):
            if lib == "jax":
                add("dense", s, t), add("dense_bias", s, t, bias=t), add("dense3d_bias", s, t, bias=t, x3=x3_of(M))
                continue
            add("mm", s, t), add("linear", s, t), add("linear_bias", s, t, bias=t)
            add("linear3d_bias", s, t, bias=t, x3=x3_of(M)), add("matmul3d", s, t, x3=x3_of(M))
            add("addmm_c", s, t, c=t), add("addmm_row", s, t, bias=t), add("addmm_c_ab", s, t, c=t, alpha=2.0, beta=0.5)
        if lib == "torch" and all(v % 16 == 0 for v in (M, N, K)):
            for scaling, outs in (("tensor", ("bf16", "f32")), ("row", ("bf16",))):
                for o in outs:
                    for bias in (None, "bf16"):
                        for fast in (False, True):
                            add("scaled_mm", s, "e4m3", o, bias=bias, scaling=scaling, use_fast_accum=fast)
    for M, N, K in BLOCK_SHAPES.get(grid, []) if lib == "torch" else ():
        for pair in BLOCK_PAIRS:
            for o in ("bf16", "f32"):
                add("scaled_block", (None, M, N, K), "e4m3", o, scaling=pair)
    for s in BATCHED.get(grid, []) if lib == "torch" else ():
        for t in ("f16", "bf16"):
            add("baddbmm_c", s, t, c=t)
    return out


def bits_full(case, which, gpu=True, chunk=1 << 22):
    """``captures.full``: through CuPy on the GPU when it is installed (and ``gpu``), else numpy in
    threads."""
    try:
        import cupy

        if gpu:
            return C.full(case, which, cupy)
    except ImportError:
        pass
    shape = C.shape_of(case, which)
    n = int(np.prod(shape))
    with ThreadPoolExecutor(os.cpu_count()) as ex:
        parts = ex.map(lambda s: C.operand_bits(case["seed"], which, case[which], np.arange(s, min(n, s + chunk))),
                       range(0, n, chunk))
        return np.concatenate(list(parts)).reshape(shape)


def operands(case, ops, cache) -> dict:
    """The case's operands as the library's arrays (``ops.tensor``), each made once a process."""
    t = {}
    for which in ("a", "b", "bias", "c"):
        if case[which]:
            key = (case["seed"], which, case[which], C.shape_of(case, which))
            if key not in cache:
                cache[key] = ops.tensor(bits_full(case, which, ops.gpu), case[which])
            t[which] = cache[key]
    for which, shape in (("scale_a", (-1, 1)), ("scale_b", (1, -1))):
        v = case[which]
        if v in C.BLOCK_RECIPES:
            t[which] = ops.f32(C.block_scales(case, which))
        elif v is not None:
            t[which] = ops.f32(C.scale_values(case, which).reshape(shape) if v == "row" else np.float32(v))
    return t


def layer_call(ops, case, t):
    """The torch call of a case, as a function of no arguments (``ops``: torch or ``NumpyOps``)."""
    layer, M, K = case["layer"], case["M"], case["K"]
    if layer == "baddbmm_c":
        return lambda: ops.baddbmm(t["c"], t["a"], t["b"])
    a, b = ops.reshape(t["a"], (M, K)), ops.reshape(t["b"], (K, case["N"]))
    if layer == "mm":
        return lambda: ops.mm(a, b)
    if layer == "matmul3d":  # torch.matmul of a 3-D activation (B, S, K) and a (K, N) weight
        x3 = ops.reshape(a, tuple(case["x3"]) + (K,))
        return lambda: ops.matmul(x3, b)
    if layer.startswith("linear"):
        w = ops.transpose_copy(b)  # nn.Linear's weight (N, K)
        x = ops.reshape(a, tuple(case["x3"]) + (K,)) if case["x3"] else a
        args = (x, w) + ((t["bias"],) if case["bias"] else ())
        return lambda: ops.linear(*args)
    if layer.startswith("addmm"):
        c = ops.reshape(t["c"], (M, case["N"])) if case["c"] else t["bias"]
        kw = {} if (case["alpha"], case["beta"]) == (1.0, 1.0) else {"beta": case["beta"], "alpha": case["alpha"]}
        return lambda: ops.addmm(c, a, b, **kw)
    if layer == "scaled_block":
        bcol = ops.col_major(b)
        recipes = (case["scale_a"], case["scale_b"])
        return lambda: ops.scaled_block(a, bcol, t["scale_a"], t["scale_b"], recipes, ops.dtype(case["out"]))
    assert layer == "scaled_mm", layer
    kw = dict(scale_a=t["scale_a"], scale_b=t["scale_b"], out_dtype=ops.dtype(case["out"]),
              use_fast_accum=case["flags"]["use_fast_accum"], **({"bias": t["bias"]} if case["bias"] else {}))
    bcol = ops.col_major(b)  # column-major (K, N), as cuBLASLt fp8 needs
    return lambda: ops.scaled_mm(a, bcol, **kw)


class NumpyOps:
    """CPU stand-ins for the torch calls (``--dry-run``): float64 arithmetic on the regenerated
    operands (exact sums at the dry grid's K), one rounding to the output type."""
    gpu = False
    reshape, col_major, dtype = staticmethod(np.reshape), staticmethod(np.asfortranarray), staticmethod(C.NUMPY.get)
    tensor = staticmethod(lambda bits, fmt: LG._host(bits).view(C.NUMPY[fmt]))
    f32 = staticmethod(lambda v: np.asarray(v, np.float32))
    transpose_copy = staticmethod(lambda b: np.ascontiguousarray(b.T))

    def mm(self, a, b):
        return (a.astype(np.float64) @ b.astype(np.float64)).astype(a.dtype)

    def matmul(self, x, b):
        return (x.astype(np.float64) @ b.astype(np.float64)).astype(x.dtype)

    def linear(self, x, w, bias=None):
        y = x.astype(np.float64) @ w.astype(np.float64).T
        return (y if bias is None else y + bias.astype(np.float64)).astype(x.dtype)

    def addmm(self, c, a, b, beta=1.0, alpha=1.0):
        return (beta * c.astype(np.float64) + alpha * (a.astype(np.float64) @ b.astype(np.float64))).astype(a.dtype)

    def baddbmm(self, c, a, b):
        return (c.astype(np.float64) + a.astype(np.float64) @ b.astype(np.float64)).astype(a.dtype)

    def scaled_mm(self, a, b, scale_a, scale_b, out_dtype, use_fast_accum, bias=None):
        y = a.astype(np.float64) @ b.astype(np.float64) * scale_a.astype(np.float64) * scale_b.astype(np.float64)
        return (y if bias is None else y + bias.astype(np.float64)).astype(out_dtype)

    def scaled_block(self, a, b, scale_a, scale_b, recipes, out_dtype):
        """Each K block's product times its scales, in float64 (exact at the dry grid's sizes)."""
        M, K = a.shape
        N = b.shape[1]
        sa = np.repeat(scale_a, C.BLOCK_K, axis=0)[:M] if recipes[0] == "128x128" else scale_a
        sb = np.repeat(scale_b, C.BLOCK_K, axis=0)[:N] if recipes[1] == "128x128" else scale_b
        y = np.zeros((M, N))
        for j in range(-(-K // C.BLOCK_K)):
            ks = slice(j * C.BLOCK_K, (j + 1) * C.BLOCK_K)
            p = a[:, ks].astype(np.float64) @ b[ks].astype(np.float64)
            y += p * sa[:, j:j + 1].astype(np.float64) * sb[:, j][None].astype(np.float64)
        return y.astype(out_dtype)


class DryTorch:
    """``--dry-run``: the torch path's grid, operands, layer calls and files, on ``NumpyOps``."""

    def __init__(self):
        self.ops, self.cache = NumpyOps(), {}

    def versions(self):
        return {"gpu": "cpu (dry run: numpy stand-ins)", "numpy": np.__version__}

    def set_mode(self, mode):
        return {"dry_run": "no torch settings applied"}

    def run(self, case):
        f = layer_call(self.ops, case, operands(case, self.ops, self.cache))
        d1, d2 = f(), f()
        bits = [d.reshape(-1, d.shape[-1]).view(C.OUT_STORAGE[case["out"]]) for d in (d1, d2)]
        rows, cols = G.crop(case)
        return bits[0][np.ix_(rows, cols)], {"kernels": ["numpy stand-in"],
                                            "deterministic": bool(np.array_equal(*bits))}


class Torch:
    """The torch runner; also the ``ops`` of ``layer_call`` (operands and calls)."""

    def __init__(self):
        import torch
        import torch.nn.functional as F

        self.torch, self.cache = torch, {}
        self.dt = {"f16": torch.float16, "bf16": torch.bfloat16, "e4m3": torch.float8_e4m3fn, "f32": torch.float32}
        self.int_of = {2: torch.int16, 4: torch.int32}
        self.dtype, self.gpu = self.dt.get, True
        self.reshape, self.transpose_copy = (lambda x, shape: x.reshape(shape)), (lambda b: b.t().contiguous())
        self.col_major = lambda b: b.t().contiguous().t()
        self.mm, self.addmm, self.baddbmm, self.linear = torch.mm, torch.addmm, torch.baddbmm, F.linear
        self.matmul = torch.matmul
        self.scaled_mm = torch._scaled_mm
        self.block_call = None  # how this torch takes block scales, found on the first call

    def scaled_block(self, a, b, scale_a, scale_b, recipes, out_dtype):
        """fp8 GEMM with block scales along K (``scale_a``, ``scale_b`` as ``block_scales`` stores
        them), in the layouts torch's own tests give cuBLASLt: 1x128 scales outer-dim major,
        128x128 scales with K padded to a multiple of 4 blocks and transposed; through
        ``torch.nn.functional.scaled_mm`` with the recipes where this torch has it, else
        ``torch._scaled_mm`` (recipes from the shapes)."""
        t = self.torch

        def layout(s, recipe):
            if recipe == "1x128":
                return s.t().contiguous().t()
            L4 = -(-s.shape[1] // 4) * 4
            return t.nn.functional.pad(s, (0, L4 - s.shape[1])).t()

        sa, sb = layout(scale_a, recipes[0]), layout(scale_b, recipes[1])
        if self.block_call is None:
            self.block_call = self._block_calls(a, b, sa, sb, recipes, out_dtype)
        return self.block_call[1](a, b, sa, sb, recipes, out_dtype)

    def _block_calls(self, a, b, sa, sb, recipes, out_dtype):
        """(name, call) of the first way of passing block scales this torch accepts."""
        t = self.torch
        F = t.nn.functional

        def recipe(name):
            enum = getattr(F, "ScalingType", None)
            for spelling in ("BlockWise" + name, "Blockwise_" + name):
                if enum is not None and hasattr(enum, spelling):
                    return getattr(enum, spelling)
            raise AttributeError(f"no ScalingType for {name}")

        calls = [("torch.nn.functional.scaled_mm", lambda a, b, sa, sb, r, o: F.scaled_mm(
                     a, b, sa, recipe(r[0]), sb, recipe(r[1]), output_dtype=o)),
                 ("torch._scaled_mm", lambda a, b, sa, sb, r, o: t._scaled_mm(a, b, sa, sb, out_dtype=o))]
        errors = []
        for name, call in calls:
            try:
                call(a, b, sa, sb, recipes, out_dtype)
                print(f"block scales through {name}", flush=True)
                return name, call
            except Exception as e:  # noqa: BLE001 - try the next spelling
                errors.append(f"{name}: {type(e).__name__}: {str(e)[:300]}")
        raise RuntimeError("; ".join(errors))

    def versions(self):
        t = self.torch
        return {"torch": t.__version__, "cuda": t.version.cuda, "cublas": LG._cublas_version(), "env": environment(),
                "sms": t.cuda.get_device_properties(0).multi_processor_count, "gpu": t.cuda.get_device_name(0)}

    def tensor(self, bits, fmt):
        x = self.torch.as_tensor(bits.view({1: "uint8", 2: "int16"}[bits.dtype.itemsize]), device="cuda")
        return x.view(self.dt[fmt])

    def f32(self, v):
        return self.torch.as_tensor(v, dtype=self.torch.float32, device="cuda")

    def set_mode(self, mode):
        """``splitk_off``: cuBLASLt, and reduced-precision reduction off with split-K off where torch
        takes the tuple form (torch >= 2.10), else reduced-precision reduction off only."""
        t = self.torch
        m, s = t.backends.cuda.matmul, {}
        if mode == "splitk_off":
            t.backends.cuda.preferred_blas_library("cublaslt")
            for ty in ("fp16", "bf16"):
                name = f"allow_{ty}_reduced_precision_reduction"
                try:
                    setattr(m, name, (False, False))
                    s[f"{ty}_set"] = "(False, False): reduced-precision reduction off, split-K off"
                except Exception as e:  # noqa: BLE001 - an older torch: the bool only
                    setattr(m, name, False)
                    s[f"{ty}_set"] = f"False (the tuple form refused: {type(e).__name__}: {str(e)[:200]})"
        s["preferred_blas_library"] = str(t.backends.cuda.preferred_blas_library())
        for ty in ("fp16", "bf16"):
            s[f"{ty}_read_back"] = repr(getattr(m, f"allow_{ty}_reduced_precision_reduction"))
            getter = getattr(t._C, f"_get_cublas_allow_{ty}_reduced_precision_reduction", None)
            s[f"{ty}_C_getter"] = repr(getter()) if getter else None
        return s

    def run(self, case):
        t = self.torch
        from torch.profiler import ProfilerActivity, profile

        f = layer_call(self, case, operands(case, self, self.cache))
        d1 = f()
        t.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            d2 = f()
            t.cuda.synchronize()
        events = sorted((e for e in prof.events() if e.device_type.name == "CUDA"), key=lambda e: e.time_range.start)
        assert d1.dtype == self.dt[case["out"]], (d1.dtype, case)
        b1, b2 = (d.reshape(-1, d.shape[-1]).view(self.int_of[d.element_size()]) for d in (d1, d2))
        rows, cols = (t.as_tensor(x, device="cuda") for x in G.crop(case))
        crop = b1[rows][:, cols].cpu().numpy().view(C.OUT_STORAGE[case["out"]])
        info = {"kernels": [e.name for e in events], "deterministic": bool(t.equal(b1, b2))}
        if case["layer"] == "scaled_block":
            info["call"] = self.block_call[0]
        return crop, info


class Jax:
    def __init__(self):
        import jax
        import jax.numpy as jnp

        self.jax, self.jnp, self.cache = jax, jnp, {}
        self.gpu = jax.default_backend() == "gpu"

    def versions(self):
        import jaxlib

        return {"jax": self.jax.__version__, "jaxlib": jaxlib.__version__, "cublas": LG._cublas_version(),
                "gpu": str(self.jax.devices()[0].device_kind), "XLA_FLAGS": os.environ.get("XLA_FLAGS", "")}

    def set_mode(self, mode):
        return {"XLA_FLAGS": os.environ.get("XLA_FLAGS", "")}

    def tensor(self, bits, fmt):
        return self.jnp.asarray(LG._host(bits).view(C.NUMPY[fmt]))

    def run(self, case):
        jax, jnp = self.jax, self.jnp
        t = operands(case, self, self.cache)
        M, N, K = case["M"], case["N"], case["K"]
        x = t["a"].reshape(tuple(case["x3"] or [M]) + (K,))
        args = (x, t["b"].reshape(K, N)) + ((t["bias"],) if case["bias"] else ())
        f = jax.jit((lambda x, w, b: x @ w + b) if case["bias"] else (lambda x, w: x @ w))
        compiled = f.lower(*args).compile()
        hlo = [re.sub(r",? metadata=\{[^}]*\}", "", ln.strip())[:1000] for ln in compiled.as_text().splitlines()
               if HLO_LINE.search(ln)]
        d1, d2 = compiled(*args), compiled(*args)
        assert d1.dtype == C.NUMPY[case["out"]], (d1.dtype, case)
        b1, b2 = (jax.lax.bitcast_convert_type(d.reshape(-1, N), jnp.uint16) for d in (d1, d2))
        rows, cols = G.crop(case)
        return np.asarray(b1[rows][:, cols]), {"hlo": hlo, "deterministic": bool((b1 == b2).all())}


def modes_of(args) -> list:
    """The modes to run: jax's from ``XLA_FLAGS`` (``--mode``, if given, must agree); torch's from
    ``--mode`` (``all``: both, default first)."""
    if args.lib == "jax":
        env = "autotune_off" if "--xla_gpu_autotune_level=0" in os.environ.get("XLA_FLAGS", "").split() else "default"
        if args.mode not in (None, env):
            raise SystemExit(f"--mode {args.mode} needs XLA_FLAGS=--xla_gpu_autotune_level=0 set (or not) "
                             f"before the process starts; XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}")
        return [env]
    if args.mode == "autotune_off":
        raise SystemExit("--lib torch: --mode is one of default, splitk_off, all")
    return list(MODES["torch"]) if args.mode == "all" else [args.mode or "default"]


def main(argv=None) -> list:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lib", choices=("torch", "jax"), required=True)
    p.add_argument("--mode", choices=("default", "splitk_off", "autotune_off", "all"))
    p.add_argument("--out", required=True)
    p.add_argument("--grid", choices=tuple(SHAPES), help="dev (default), held-out; dry (--dry-run's default)")
    p.add_argument("--seed-salt", type=int, default=0, help="mixed into every seed: new inputs, same grid")
    p.add_argument("--limit", type=int, default=0, help="first N cases only")
    p.add_argument("--layers", help="only these layers (comma-separated, e.g. scaled_block); named in the file")
    p.add_argument("--dry-run", action="store_true", help="CPU: numpy stand-ins for torch, jax on the CPU")
    args = p.parse_args(argv)
    args.grid = args.grid or ("dry" if args.dry_run else "dev")
    modes = modes_of(args)
    runner = (DryTorch() if args.dry_run else Torch()) if args.lib == "torch" else Jax()
    todo = cases(args.grid, args.lib, args.seed_salt)
    if args.dry_run:
        print("cases a mode: " + ", ".join(f"{g} {len(cases(g, args.lib))}" for g in SHAPES), flush=True)
    if args.layers:
        todo = [c for c in todo if c["layer"] in args.layers.split(",")]
    todo = todo[:args.limit] if args.limit else todo
    written = []
    for mode in modes:
        t0, settings, arrays, meta = time.time(), runner.set_mode(mode), {}, []
        for i, case in enumerate(todo):
            case = dict(case, mode=mode)
            try:
                d, info = runner.run(case)
            except Exception as e:  # noqa: BLE001 - a library refusing a call is a finding, recorded
                meta.append(dict(case, error=f"{type(e).__name__}: {str(e)[:300]}"))
                print(f"{mode} {i} {_describe(case)}: {type(e).__name__}: {str(e)[:120]}", flush=True)
                continue
            key = f"{PREFIX[mode]}{i}"
            arrays[f"{key}.d"], (arrays[f"{key}.rows"], arrays[f"{key}.cols"]) = d, G.crop(case)
            meta.append(dict(case, key=key, **info))
            what = info.get("kernels") or [ln[:200] for ln in info["hlo"] if re.search("call_target|kCustom", ln)]
            print(f"{key} {_describe(case)}: {what} det={info['deterministic']}", flush=True)
            if i % 25 == 24:  # partial results survive a time limit
                save(args, runner, mode, settings, arrays, meta, t0)
        written.append(save(args, runner, mode, settings, arrays, meta, t0))
    return written


def _describe(case) -> str:
    return (f"{case['layer']} b{case['batch']} {case['M']}x{case['N']}x{case['K']} {case['a']}->{case['out']}"
            f" bias={case['bias']} c={case['c']} {case['flags']}")


def save(args, runner, mode, settings, arrays, meta, t0) -> Path:
    xla = os.environ.get("XLA_FLAGS", "") if args.lib == "jax" else ""
    header = {"versions": runner.versions(), "date": time.strftime("%Y-%m-%d"), "seconds": round(time.time() - t0, 1),
              "mode": mode, "settings": settings, "grid": args.grid, "seed_salt": args.seed_salt,
              "dry_run": args.dry_run, "command": (f"XLA_FLAGS={xla} " if xla else "")
              + f"python experiments/hardware/layer_gemm.py --lib {args.lib} --mode {mode} --grid {args.grid}"
              + f" --seed-salt {args.seed_salt} --out OUTDIR" + (" --dry-run" if args.dry_run else "")
              + (f" --layers {args.layers}" if args.layers else "")}
    suffix = (G.grid_suffix(args.grid)
              + (f"_salt{args.seed_salt}" if args.seed_salt else "")
              + ("_" + args.layers.replace(",", "_") if args.layers else ""))
    gpu = "cpu" if args.dry_run else LG.gpu_name()
    out = Path(args.out) / f"layer_gemm_{gpu}_{args.lib}_{mode}{suffix}.npz"
    np.savez_compressed(out, **arrays, meta=np.array(json.dumps({"header": header, "cases": meta})))
    print(f"wrote {out} ({out.stat().st_size / 1e6:.2f} MB, {len(meta)} cases, {time.time() - t0:.0f} s)", flush=True)
    return out


if __name__ == "__main__":
    main()
