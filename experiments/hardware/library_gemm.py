"""Capture what real library GEMMs return on this GPU: torch.mm / torch.bmm / torch._scaled_mm
(cuBLAS through PyTorch) and jnp.dot (XLA), on the grid of ``gemm_inputs.cases()``.

    python experiments/hardware/library_gemm.py --lib torch --out OUTDIR [--grid held-out]
    python experiments/hardware/library_gemm.py --lib jax --out OUTDIR [--grid held-out]

    XLA_FLAGS=--xla_gpu_autotune_level=0 python experiments/hardware/library_gemm.py --lib jax ...

Writes ``OUTDIR/library_gemm_<gpu>_<lib>.npz`` (``..._heldout.npz`` for the held-out grid,
``..._jax_autotune0...`` with XLA's autotuner off): per case ``<i>.d`` the output bits at the crop
(``<i>.rows`` flat over batch*M, ``<i>.cols``) and ``meta``, a JSON list of the cases with the
kernels that ran (torch profiler names; for jnp.dot the GEMM lines of XLA's optimised HLO, with
the Triton tiling / split-K or cuBLAS algorithm XLA picked), whether two runs gave the same bits,
and the library versions. Inputs are regenerated from the seeds (``tcemu._src.captures``).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1]))
import gemm_inputs as G  # noqa: E402
from tcemu._src import captures as C  # noqa: E402
from tcemu._src.record import environment  # noqa: E402


def gpu_name():
    import shutil
    import subprocess

    if not shutil.which("nvidia-smi"):
        return "cpu"
    name = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                          text=True).stdout.strip().splitlines()[0]
    return "h200" if "H200" in name else "h100" if "H100" in name else re.sub(r"\W+", "_", name).lower()


def inputs_on_gpu(case):
    try:
        import cupy as xp
    except ImportError:  # CPU plumbing check (jax only)
        xp = np
    return C.full(case, "a", xp), C.full(case, "b", xp)


class Torch:
    def __init__(self):
        import torch

        self.torch = torch
        self.dt = {"f16": torch.float16, "bf16": torch.bfloat16, "e4m3": torch.float8_e4m3fn,
                   "e5m2": torch.float8_e5m2, "f32": torch.float32}
        self.int_of = {1: torch.uint8, 2: torch.int16, 4: torch.int32}

    def versions(self):
        t = self.torch
        return {"torch": t.__version__, "cuda": t.version.cuda, "cublas": _cublas_version(),
                "blas": str(t.backends.cuda.preferred_blas_library()),
                "env": environment(),
                "sms": t.cuda.get_device_properties(0).multi_processor_count,
                "gpu": t.cuda.get_device_name(0)}

    def tensor(self, bits_cp, fmt):
        t = self.torch
        x = t.as_tensor(bits_cp.view({1: "uint8", 2: "int16"}[bits_cp.dtype.itemsize]), device="cuda")
        return x.view(self.dt[fmt])

    def fn(self, case):
        t = self.torch
        A, B = inputs_on_gpu(case)
        a, b = self.tensor(A, case["a"]), self.tensor(B, case["b"])
        lib, flags = case["lib"], case["flags"]
        if lib in ("torch.mm", "torch.bmm"):
            rpr = flags["reduced_precision_reduction"]
            t.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = rpr
            t.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = rpr
            if lib == "torch.mm":
                return lambda: t.mm(a[0], b[0])
            return lambda: t.bmm(a, b)
        one = t.ones((), device="cuda", dtype=t.float32)
        bcol = b[0].t().contiguous().t()  # column-major (K, N), as cuBLASLt fp8 needs
        return lambda: t._scaled_mm(a[0], bcol, scale_a=one, scale_b=one, out_dtype=self.dt[case["out"]],
                                    use_fast_accum=flags["use_fast_accum"])

    def run(self, case):
        t = self.torch
        from torch.profiler import ProfilerActivity, profile

        f = self.fn(case)
        d1 = f()
        t.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            d2 = f()
            t.cuda.synchronize()
        kernels = sorted({e.name for e in prof.events() if e.device_type.name == "CUDA"
                          and not e.name.lower().startswith(("memcpy", "memset"))})
        same = bool(t.equal(d1.view(self.int_of[d1.element_size()]), d2.view(self.int_of[d2.element_size()])))
        assert d1.dtype == self.dt[case["out"]], (d1.dtype, case)
        bits = d1.reshape(-1, d1.shape[-1]).view(self.int_of[d1.element_size()])
        return bits, {"kernels": kernels, "deterministic": same}


class Jax:
    def __init__(self):
        import jax
        import jax.numpy as jnp
        import ml_dtypes

        self.jax, self.jnp = jax, jnp
        self.dt = {"f16": jnp.float16, "bf16": jnp.bfloat16, "e4m3": jnp.float8_e4m3fn, "f32": jnp.float32}
        self.np_dt = {"f16": np.float16, "bf16": ml_dtypes.bfloat16, "e4m3": ml_dtypes.float8_e4m3fn}
        self.int_of = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32}

    def versions(self):
        import jaxlib

        return {"jax": self.jax.__version__, "jaxlib": jaxlib.__version__, "cublas": _cublas_version(),
                "gpu": str(self.jax.devices()[0].device_kind), "XLA_FLAGS": os.environ.get("XLA_FLAGS", "")}

    def run(self, case):
        jax, jnp = self.jax, self.jnp
        A, B = inputs_on_gpu(case)
        a = jnp.asarray(_host(A).view(self.np_dt[case["a"]]))
        b = jnp.asarray(_host(B).view(self.np_dt[case["b"]]))
        if not case["batch"]:
            a, b = a[0], b[0]
        pet = None if case["out"] == case["a"] else self.dt[case["out"]]
        f = jax.jit(lambda x, y: jnp.matmul(x, y, preferred_element_type=pet))
        compiled = f.lower(a, b).compile()
        hlo = [ln.strip() for ln in compiled.as_text().splitlines()
               if re.search(r"custom_call_target|__triton|kCustom|triton_gemm|split_k|cublas|dot\(|reduce\(", ln)]
        d1, d2 = compiled(a, b), compiled(a, b)
        assert d1.dtype == self.dt[case["out"]], (d1.dtype, case)
        bits = jax.lax.bitcast_convert_type(d1.reshape(-1, d1.shape[-1]), self.int_of[d1.dtype.itemsize])
        same = bool((bits == jax.lax.bitcast_convert_type(d2.reshape(-1, d2.shape[-1]),
                                                          self.int_of[d1.dtype.itemsize])).all())
        return np.asarray(bits), {"hlo": hlo, "deterministic": same}


def _host(x):
    return x.get() if hasattr(x, "get") else x


def _cublas_version():
    import ctypes
    import glob

    for path in sorted(glob.glob("/usr/local/lib/python3*/*-packages/nvidia/cu*/lib/libcublasLt.so*")
                       + glob.glob("/usr/local/cuda*/lib64/libcublasLt.so*") + ["libcublasLt.so"]):
        try:
            return int(ctypes.CDLL(path).cublasLtGetVersion())
        except OSError:
            continue
    return None


def _xla_flags(args) -> dict:
    """jnp.dot's flag in the case records: XLA's GEMM autotuner off (``XLA_FLAGS`` with
    ``--xla_gpu_autotune_level=0``: XLA's default kernel choices, the same in every process).
    With the autotuner on (the default) XLA times candidate kernels in each new process and may
    pick another one, with other bits, in the next (``README.md``)."""
    off = "--xla_gpu_autotune_level=0" in os.environ.get("XLA_FLAGS", "").split()
    return {"xla_autotune": False} if args.lib == "jax" and off else {}


def _key_prefix(args) -> str:
    """Case keys: c0, c1, ...; a0, a1, ... for the autotuner-off captures (the table keys cases by
    GPU, library and key)."""
    return "a" if _xla_flags(args) else "c"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lib", choices=("torch", "jax"), required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--limit", type=int, default=0, help="first N cases only (plumbing check)")
    p.add_argument("--grid", choices=tuple(G.GRIDS), default="table",
                   help="the shapes: the table's grid, or the held-out shapes that check it")
    args = p.parse_args(argv)
    runner = Torch() if args.lib == "torch" else Jax()
    todo = [c for c in G.cases(args.grid) if c["lib"].startswith("torch" if args.lib == "torch" else "jnp")]
    if args.limit:
        todo = todo[:args.limit]
    arrays, meta = {}, []
    t0 = time.time()
    for i, case in enumerate(todo):
        rows, cols = G.crop(case)
        try:
            case = dict(case, flags=case["flags"] | _xla_flags(args))
            bits, info = runner.run(case)
        except Exception as e:  # noqa: BLE001 - a library refusing a shape is a finding, recorded
            meta.append(dict(case, error=f"{type(e).__name__}: {str(e)[:300]}"))
            print(f"{i} {case['lib']} {case['M']}x{case['N']}x{case['K']} {case['a']}: {type(e).__name__}", flush=True)
            continue
        d = np.asarray(bits.cpu() if hasattr(bits, "cpu") else bits)
        key = f"{_key_prefix(args)}{i}"
        arrays[f"{key}.d"] = d[np.ix_(rows, cols)].astype(C.OUT_STORAGE[case["out"]])
        arrays[f"{key}.rows"], arrays[f"{key}.cols"] = rows, cols
        meta.append(dict(case, key=key, **info))
        print(f"{i} {case['lib']} b{case['batch']} {case['M']}x{case['N']}x{case['K']} {case['a']}x{case['b']}->"
              f"{case['out']} {case['flags']}: {info.get('kernels', '')} det={info['deterministic']}", flush=True)
        if i % 25 == 24:  # partial results survive a time limit
            save(args, runner, arrays, meta, t0)
    save(args, runner, arrays, meta, t0)


def save(args, runner, arrays, meta, t0):
    header = {"versions": runner.versions(), "date": time.strftime("%Y-%m-%d"), "seconds": round(time.time() - t0, 1),
              "command": (f"XLA_FLAGS={os.environ['XLA_FLAGS']} " if _xla_flags(args) else "")
              + f"python experiments/hardware/library_gemm.py --lib {args.lib} --out OUTDIR --grid {args.grid}"}
    suffix = ("_autotune0" if _xla_flags(args) else "") + G.grid_suffix(args.grid)
    out = Path(args.out) / f"library_gemm_{gpu_name()}_{args.lib}{suffix}.npz"
    np.savez_compressed(out, **arrays, meta=np.array(json.dumps({"header": header, "cases": meta})))
    print(f"wrote {out} ({out.stat().st_size / 1e6:.2f} MB, {len(meta)} cases, {time.time() - t0:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
