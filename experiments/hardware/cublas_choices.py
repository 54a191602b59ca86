"""Which cuBLAS kernel ``torch.mm`` runs, and how it splits K, over a dense grid of shapes: the
kernel names and launch grids from the torch profiler's trace (no outputs; the choice is
cuBLAS's heuristic, the same in every process, and does not look at the values).

    python experiments/hardware/cublas_choices.py --out OUTDIR [--quick]
    python experiments/hardware/cublas_choices.py --nearest experiments/results/cublas_choices_h100.json.gz \
        tests/data/library_gemm_h100_torch_heldout.npz

Writes ``OUTDIR/cublas_choices_<gpu>.json``: the versions, the grid, and per case (M, N, K,
type, ``reduced_precision_reduction``) the kernels that ran with their launch grid (x, y, z)
and cluster-free block size. Shapes of ``gemm_inputs.HELD_OUT_SHAPES`` are left out, so the
held-out captures still check ``library_config`` on shapes it has not seen. f16 and bf16 inputs,
output in the input type, row-major operands as ``library_gemm.py`` passes them.

``--nearest`` checks the capture as a predictor: for each ``torch.mm`` case of a held-out capture
(``library_gemm.py --grid held-out``), whether the nearest captured shape (same type, flag and
alignment of K and N; distance ``|log2 M/M'| + |log2 N/N'| + |log2 K/K'|``) ran the same kernels.
"""
from __future__ import annotations

import argparse
import gzip
import json
import math
import re
import os
import sys
import tempfile
import time
from bisect import bisect_right
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import gemm_inputs as G  # noqa: E402
from library_gemm import Torch, gpu_name  # noqa: E402

# about 1.5x steps from 8 to 8192 (M, N) and 64 to 32768 (K)
SIDES = (8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192)
DEPTHS = (64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384,
          24576, 32768)
# leading dimensions that are not multiples of 8 (cuBLAS then runs CUTLASS 2 kernels): a coarser
# grid, K or N moved off the multiple of 8 by 1, 2 or 4
COARSE_SIDES = (16, 64, 256, 1024, 4096)
COARSE_DEPTHS = (64, 256, 1024, 4096, 16384)
OFFSETS = ((1, 0), (2, 0), (4, 0), (0, 1), (0, 2), (0, 4), (4, 4))


def shapes(quick: bool = False):
    held = {(M, N, K) for b, M, N, K in G.HELD_OUT_SHAPES if b is None}
    sides, depths = ((64, 1024), (256, 4096)) if quick else (SIDES, DEPTHS)
    out = [(M, N, K) for M in sides for N in sides for K in depths]
    csides, cdepths = ((64,), (1024,)) if quick else (COARSE_SIDES, COARSE_DEPTHS)
    out += [(M, N + dn, K + dk) for M in csides for N in csides for K in cdepths for dk, dn in OFFSETS]
    return [s for s in out if s not in held]


def capture(runner, cases):
    """Per case, the kernels (name, grid, block) its torch.mm launched."""
    t = runner.torch
    from torch.profiler import ProfilerActivity, profile, record_function

    matmul = t.backends.cuda.matmul

    def operands(c):  # uninitialised: the choice does not look at values, and no fill kernel runs
        dt = runner.dt[c["a"]]
        matmul.allow_fp16_reduced_precision_reduction = matmul.allow_bf16_reduced_precision_reduction = \
            c["flags"]["reduced_precision_reduction"]
        return t.empty((c["M"], c["K"]), dtype=dt, device="cuda"), t.empty((c["K"], c["N"]), dtype=dt, device="cuda")

    for c in cases[:8]:  # outside the profiler first (cuBLAS handles, workspaces)
        t.mm(*operands(c))
    t.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i, c in enumerate(cases):
            a, b = operands(c)
            with record_function(f"case{i}"):
                t.mm(a, b)
            del a, b
        t.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        events = json.loads(Path(path).read_text())["traceEvents"]
    spans = sorted((e["ts"], e["ts"] + e["dur"], int(e["name"][4:])) for e in events
                   if e.get("cat") == "user_annotation" and e.get("name", "").startswith("case"))
    starts = [s[0] for s in spans]
    launch = {e["args"]["correlation"]: e["ts"] for e in events
              if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    out = [[] for _ in cases]
    for e in sorted((e for e in events if e.get("cat") == "kernel"), key=lambda e: e["ts"]):
        ts = launch.get(e["args"].get("correlation"))
        j = bisect_right(starts, ts) - 1 if ts is not None else -1
        if j < 0 or ts > spans[j][1]:
            continue
        out[spans[j][2]].append([e["name"], e["args"].get("grid"), e["args"].get("block")])
    return out


def _alignment(K: int, N: int) -> int:
    """The elements every leading dimension (K of A; N of B and D) is a multiple of, up to 8."""
    g = math.gcd(K, N)
    return min(8, g & -g)


def nearest(choices_path: str, captures: list[str]) -> None:
    """Print, per held-out ``torch.mm`` case, whether the nearest captured shape ran its kernels."""
    opener = gzip.open if choices_path.endswith(".gz") else open
    with opener(choices_path, "rt") as f:
        choices = json.load(f)["cases"]
    by_class = {}
    for r in choices:
        key = (r["a"], r["flags"]["reduced_precision_reduction"], _alignment(r["K"], r["N"]))
        by_class.setdefault(key, []).append(r)

    def names(kernels):
        return sorted(re.sub(r"^void ", "", k) for k in kernels)

    hits = total = 0
    for path in captures:
        with np.load(path) as z:
            meta = json.loads(str(z["meta"]))
        for c in meta["cases"]:
            if c.get("lib") != "torch.mm" or "kernels" not in c:
                continue
            rows = by_class.get((c["a"], c["flags"]["reduced_precision_reduction"], _alignment(c["K"], c["N"])), [])
            best = min(rows, key=lambda r: sum(abs(math.log2(r[x] / c[x])) for x in "MNK"))
            same = names(k[0] for k in best["kernels"]) == names(c["kernels"])
            hits, total = hits + same, total + 1
            print(f"{c['M']}x{c['N']}x{c['K']} {c['a']} {c['flags']}: {'same' if same else 'other'} kernels as "
                  f"{best['M']}x{best['N']}x{best['K']}")
    print(f"{hits} of {total} held-out torch.mm cases ran the kernels of the nearest captured shape")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out")
    p.add_argument("--nearest", nargs="+", metavar=("CHOICES", "CAPTURE"),
                   help="a capture of this script, then held-out library_gemm.py captures: check the nearest shape")
    p.add_argument("--quick", action="store_true", help="a few shapes (plumbing check)")
    p.add_argument("--batch", type=int, default=400, help="cases per profiler session")
    args = p.parse_args(argv)
    if args.nearest:
        nearest(args.nearest[0], args.nearest[1:])
        return
    if not args.out:
        p.error("--out is required (or --nearest)")
    runner = Torch()
    t0 = time.time()
    cases = [dict(M=M, N=N, K=K, a=t, flags={"reduced_precision_reduction": rpr})
             for M, N, K in shapes(args.quick) for t in ("f16", "bf16") for rpr in (False, True)]
    rows = []
    for i in range(0, len(cases), args.batch):
        chunk = cases[i:i + args.batch]
        for c, ks in zip(chunk, capture(runner, chunk)):
            rows.append(dict(c, kernels=ks))
        print(f"{len(rows)} of {len(cases)} cases, {time.time() - t0:.0f} s", flush=True)
        write(args, runner, rows, t0)  # partial results survive a time limit
    out = write(args, runner, rows, t0)
    print(f"wrote {out} ({out.stat().st_size / 1e6:.2f} MB, {len(rows)} cases, "
          f"{sum(not r['kernels'] for r in rows)} without a kernel, {time.time() - t0:.0f} s)", flush=True)


def write(args, runner, rows, t0):
    missing = sum(not r["kernels"] for r in rows)
    header = {"versions": runner.versions(), "date": time.strftime("%Y-%m-%d"), "seconds": round(time.time() - t0, 1),
              "command": "python experiments/hardware/cublas_choices.py --out OUTDIR"
              + (" --quick" if args.quick else ""),
              "cases without a kernel": missing}
    out = Path(args.out) / f"cublas_choices_{gpu_name()}.json"
    out.write_text(json.dumps({"header": header, "cases": rows}, separators=(",", ":")))
    return out


if __name__ == "__main__":
    main()
