"""How often ``tcemu.library_config`` reproduces captured torch GEMMs and layers bit for bit, by
the source of its answer ("recorded", "rule", "nearest"), with a given record file.

    python experiments/hardware/check_records.py tests/data/library_gemm_h100_torch*.npz \
        tests/data/layer_gemm_h100_torch*.npz [--records FILE.json.gz | --drop-own [--no-fit-from]] \
        [--rows 16] [--jobs 2] [--out FILE.json]

``--records``: a file of ``tcemu.record`` (default: the records shipped with tcemu).
``--drop-own``: the shipped records without the captures' shapes (M, N, K: every library, type and
flag), in their place, the forests kept: what ``library_config`` answers at shapes it has no record
of. ``--no-fit-from``: without ``library_records.FIT_FROM`` (the H100 takes the nearest row). Library
captures (``library_gemm.py``) are checked as ``library_config(case's lib)``; layer captures
(``layer_gemm.py``) as ``check_layer_presets.preset`` maps them, with their epilogue operands.
Prints a table per capture and source, and each miss.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from pathlib import Path


HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1]))
from check_layer_presets import preset  # noqa: E402
from check_offgrid import lookups, records_without  # noqa: E402
from identify_layers import emulate, epilogue_operands  # noqa: E402
from tcemu._src import captures as C  # noqa: E402
from tcemu._src import library_records as R  # noqa: E402
from tcemu._src.library import shipped_gpu  # noqa: E402


def _shape(case) -> tuple:
    return (preset(case)[2] if "layer" in case else case["M"], case["N"], case["K"])


def drop_own(captures: list[str]) -> dict:
    """{GPU: a copy of its shipped records without the captures' shapes (M, N, K)}."""
    shapes = {}
    for path in captures:
        meta = C.load(path)[1]
        gpu = shipped_gpu(meta["header"]["versions"]["gpu"])
        shapes.setdefault(gpu, set()).update(_shape(c) for c in meta["cases"] if "key" in c)
    return {gpu: records_without(str(R.SHIPPED[gpu]), own, fields=("M", "N", "K")) for gpu, own in shapes.items()}


def check(job, shipped=None, fit_from=True):
    """One case: (capture, key, records, rows) -> its source and the share of its rows
    reproduced. ``shipped``: {GPU: records file} in place of the shipped ones (inside the call);
    ``fit_from`` False: no other GPU's forests."""
    with lookups(shipped, fit_from):
        return _check(*job)


def _check(path, key, records, nrows):
    import tcemu

    z, meta = C.load(path)
    case = next(c for c in meta["cases"] if c.get("key") == key)
    arch = shipped_gpu(meta["header"]["versions"]["gpu"])
    if "layer" in case:
        lib, flags, M, batch = preset(case)
    else:
        lib, flags, M, batch = case["lib"], case["flags"], case["M"], case["batch"]
    if R.zero_workspace(meta["header"]["versions"].get("env", {})):  # captured with a zero workspace
        flags = dict(flags, workspace=0)
    rows, cols, d = z[f"{key}.rows"][:nrows or None], z[f"{key}.cols"], z[f"{key}.d"][:nrows or None]
    out = dict(capture=Path(path).name, key=key, lib=lib, flags=flags, shape=[batch, M, case["N"], case["K"]],
               a=case["a"], b=case["b"], out=case["out"], kernels=case.get("kernels"))
    try:
        cfg, source = tcemu.library_config(lib, arch=arch, M=M, N=case["N"], K=case["K"], a=case["a"], b=case["b"],
                                           out=case["out"], batch=batch, records=records, with_source=True, **flags)
    except ValueError as e:
        return dict(out, source="error", match=None, config=str(e))
    ops = epilogue_operands(case, rows, cols) if "layer" in case else {}
    got = emulate(case, rows, cols, cfg, ops).view(d.dtype)
    return dict(out, source=source, match=float((got == d).mean()), config=repr(cfg.schedule) + " " + cfg.instruction)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("captures", nargs="+")
    p.add_argument("--records")
    p.add_argument("--drop-own", action="store_true", help="the shipped records without the captures' shapes")
    p.add_argument("--no-fit-from", action="store_true", help="no other GPU's forests (library_records.FIT_FROM)")
    p.add_argument("--rows", type=int, default=0, help="the first N captured rows of each case (0: all)")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--out")
    args = p.parse_args(argv)
    if args.drop_own and args.records:
        p.error("--drop-own changes the shipped records: not with --records")
    shipped = drop_own(args.captures) if args.drop_own else {}
    jobs = []
    for path in args.captures:
        z, meta = C.load(path)
        jobs += [(path, c["key"], args.records, args.rows) for c in meta["cases"]
                 if "key" in c and c["lib"].startswith(("torch", "F."))]
    with ProcessPoolExecutor(args.jobs) as ex:
        rows = list(ex.map(partial(check, shipped=shipped, fit_from=not args.no_fit_from), jobs, chunksize=4))
    table = defaultdict(lambda: [0, 0])
    for r in rows:
        exact = r["match"] == 1.0
        table[(r["capture"], r["source"])][0] += exact
        table[(r["capture"], r["source"])][1] += 1
        table[("all", r["source"])][0] += exact
        table[("all", r["source"])][1] += 1
        if not exact:
            print(f"  miss {r['capture']} {r['key']} {r['lib']} {r['flags']} {r['shape']} {r['a']}->{r['out']} "
                  f"{r['source']} match={r['match']} {r['config']} | {' '.join(k[:60] for k in r['kernels'] or [])}")
    print("| capture | source | reproduced |\n|---|---|---|")
    for (cap, src), (n, t) in sorted(table.items()):
        print(f"| {cap} | {src} | {n}/{t} |")
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
