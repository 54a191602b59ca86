"""Record cuBLAS's algorithm choices on this GPU with ``tcemu.record`` (cuBLASLt's logger and
the torch profiler), over the default grid and at the shapes of the committed torch captures.

    python experiments/hardware/cublas_record.py --out OUTDIR [--quick] [--only grid|captures] [--captures NPZ ...]
    python experiments/hardware/cublas_record.py --out OUTDIR --only random --seed S --count N [--unaligned] [--deep]
    python experiments/hardware/cublas_record.py --compact --merge tcemu/_src/data/cublas_records_h100.json.gz \
        OUTDIR/cublas_records_h100.json.gz OUTDIR/cublas_records_h100_captures.json.gz \
        tests/data/cublas_records_h100_fresh.json.gz tests/data/cublas_records_h100_fresh2.json.gz
    python experiments/hardware/cublas_record.py --compact --merge tcemu/_src/data/cublas_records_h200.json.gz \
        OUTDIR/cublas_records_h200.json.gz OUTDIR/cublas_records_h200_captures.json.gz \
        --offgrid tests/data/cublas_records_h200_random20261128.json.gz \
        tests/data/cublas_records_h200_random20261129.json.gz

Writes ``OUTDIR/cublas_records_<gpu>.json.gz`` (``tcemu._src.record.default_cases``: the grid
shipped in ``tcemu/_src/data``) and ``OUTDIR/cublas_records_<gpu>_captures.json.gz`` (every
lib of ``tcemu.record`` at each shape of ``tests/data/{library,layer}_gemm_*torch*.npz``, every
type and flag: the records the captures' bits check). ``--merge``: the file shipped in
``tcemu/_src/data``, the grid with the records at the captured shapes (those of the fresh
capture included, ``python -m tcemu record ... --shapes``: see ``README.md``); ``--offgrid``:
files of random shapes merged too, their rows marked ``"offgrid"`` (``library_config`` answers
"nearest" from them but builds no grid cell of them: ``library_records.lookup``).
"""
from __future__ import annotations

import argparse
import glob
import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))
from library_gemm import gpu_name  # noqa: E402
from tcemu._src import record as R  # noqa: E402


def capture_cases(paths=None) -> list[dict]:
    """torch.mm, torch.bmm, F.linear and torch._scaled_mm cases at every shape of the committed
    torch captures, or of the captures ``paths`` (F.linear's 3-D activations flattened to M rows,
    batched ones as torch.bmm)."""
    shapes, batched = set(), set()
    for path in paths or sorted(glob.glob(str(ROOT / "tests/data/library_gemm_*torch*.npz"))
                                + glob.glob(str(ROOT / "tests/data/layer_gemm_*torch*.npz"))):
        with np.load(path) as z:
            for c in json.loads(str(z["meta"]))["cases"]:
                rows = c["M"]  # a 3-D activation (x3) is M rows flattened
                if c.get("batch") and c["lib"] in ("torch.bmm", "torch.baddbmm"):
                    batched.add((c["batch"], c["M"], c["N"], c["K"]))
                else:
                    shapes.add((rows, c["N"], c["K"]))
    shapes = sorted(shapes)
    out = []
    for lib in ("torch.mm", "F.linear", "torch.addmm", "torch._scaled_mm"):
        out += R.expand(lib, shapes)
    for b, M, N, K in sorted(batched):
        out += R.expand("torch.bmm", [(M, N, K)], (b,))
    return out


def random_shapes(seed: int, count: int, unaligned: bool = False, deep: bool = False) -> list[tuple[int, int, int]]:
    """``count`` (M, N, K) shapes of ML GEMMs drawn at random (numpy ``default_rng(seed)``): M
    log-uniform in 8..8192 (half of them multiples of 16), N and K log-uniform in 64..16384 (K
    in 64..32768 one time in ten); N and K multiples of 64 half the time, of 8 (not of 64) a
    quarter, any integer the rest; no shape of the default grid. ``unaligned``: only the shapes
    drawn so whose K or N is not a multiple of 8 (where cuBLAS's CUTLASS 2 split-K choices vary
    most), for development sets that sample that region densely. ``deep``: M in 8..1024, N in
    64..2048 and K in 2048..65536 instead (few output tiles and a deep K: where cuBLAS splits K
    most, and its split counts vary most)."""
    rng = np.random.default_rng(seed)
    grid = {(c["M"], c["N"], c["K"]) for c in R.default_cases()}
    m_hi, n_hi, k_lo = (1024, 2048, 2048) if deep else (8192, 16384, 64)

    def logu(lo, hi):
        return int(round(float(np.exp(rng.uniform(np.log(lo), np.log(hi))))))

    def aligned(v):
        u = rng.random()
        return max(64, v // 64 * 64) if u < 0.5 else max(8, v // 8 * 8 + (8 if v % 64 == 0 else 0)) if u < 0.75 else v

    out = set()
    while len(out) < count:
        M = logu(8, m_hi)
        M = max(16, M // 16 * 16) if rng.random() < 0.5 else M
        N = aligned(logu(64, n_hi))
        shape = (M, N, aligned(logu(k_lo, 65536 if deep else 32768 if rng.random() < 0.1 else 16384)))
        if shape not in grid and not (unaligned and shape[1] % 8 == 0 and shape[2] % 8 == 0):
            out.add(shape)
    return sorted(out)


def merge(out: str, inputs: list[str], compact: bool = False, offgrid: list[str] = ()) -> None:
    """One record file from several of one GPU (the first's header; later rows replace earlier
    ones of the same case), each input's header kept under ``"parts"``; ``compact``: each call
    keeps its function and algorithm only (what ``library_config`` reads), not the matrix and
    compute descriptors, and each kernel its name without its parameter list (the file shipped in ``tcemu/_src/data``: half the size); the rows of
    ``offgrid`` (merged after ``inputs``) are marked ``"offgrid": true``."""
    import gzip

    headers, rows = [], {}
    for path in [*inputs, *offgrid]:
        with gzip.open(path, "rt") as f:
            data = json.load(f)
        h, off = data["header"], path in offgrid  # a merged file brings the headers of its parts
        headers += [p for p in h["parts"]] if h.get("parts") else [dict(h, file=Path(path).name, offgrid=off)]
        for r in data["cases"]:
            r = dict(r, offgrid=True) if off else r
            if compact and r.get("calls"):
                r = dict(r, calls=[{"fn": c.get("fn"), "algo": c.get("algo", {})} for c in r["calls"]],
                         kernels=[k.split("(")[0] for k in r.get("kernels", [])])
            rows[json.dumps([r["lib"], r["batch"], r["M"], r["N"], r["K"], r["a"], r["b"], r["out"],
                             sorted(r["flags"].items())])] = r
    if len({h["gpu"] for h in headers}) != 1:
        raise SystemExit(f"records of several GPUs: {sorted({h['gpu'] for h in headers})}")
    with gzip.open(out, "wt", compresslevel=9) as f:
        first = {k: v for k, v in headers[0].items() if k != "file"}
        json.dump({"header": dict(first, parts=headers), "cases": list(rows.values())}, f, separators=(",", ":"))
    print(f"wrote {out}: {len(rows)} cases from {len(inputs) + len(offgrid)} files")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--merge", nargs="+", metavar=("OUT", "IN"), help="merge record files of one GPU into OUT")
    p.add_argument("--compact", action="store_true", help="with --merge: keep each call's algorithm only")
    p.add_argument("--offgrid", nargs="+", default=[], metavar="IN",
                   help="with --merge: record files of random shapes, used for 'nearest' answers only")
    p.add_argument("--out")
    p.add_argument("--quick", action="store_true", help="a few shapes of the grid (plumbing check)")
    p.add_argument("--only", choices=("grid", "captures", "random"))
    p.add_argument("--seed", type=int, help="--only random: the shapes' seed (default 0)")
    p.add_argument("--count", type=int, help="--only random: how many shapes (default 2000)")
    p.add_argument("--captures", nargs="+", metavar="NPZ", help="--only captures: these captures' shapes (file name "
                                                                 "..._captures_<first capture's name>)")
    p.add_argument("--deep", action="store_true", help="--only random: small M and N, K in 2048..65536 "
                                                       "(file name ..._deep<seed>)")
    p.add_argument("--unaligned", action="store_true", help="--only random: only shapes whose K or N is not a "
                                                            "multiple of 8 (file name ..._unaligned<seed>)")
    args = p.parse_args(argv)
    if args.merge:
        merge(args.merge[0], args.merge[1:], args.compact, args.offgrid)
        return
    if not args.out:
        p.error("--out is required (or --merge)")
    if args.only != "random" and (args.unaligned or args.deep or args.seed is not None or args.count is not None):
        p.error("--unaligned, --deep, --seed and --count go with --only random")
    if args.captures and args.only != "captures":
        p.error("--captures goes with --only captures")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    gpu = gpu_name()
    if args.only == "random":
        args.seed, args.count = args.seed or 0, 2000 if args.count is None else args.count
        kind = "unaligned" * args.unaligned + "deep" * args.deep or "random"
        R.record(Path(args.out) / f"cublas_records_{gpu}_{kind}{args.seed}.json.gz",
                 shapes=random_shapes(args.seed, args.count, args.unaligned, args.deep))
        return
    if args.only != "grid":
        cases = capture_cases(args.captures)
        name = f"_{Path(args.captures[0]).stem}" if args.captures else ""
        R.record(Path(args.out) / f"cublas_records_{gpu}_captures{name}.json.gz",
                 cases=cases[:60] if args.quick else cases)
    if args.only != "captures":
        R.record(Path(args.out) / f"cublas_records_{gpu}.json.gz", quick=args.quick)


if __name__ == "__main__":
    main()
