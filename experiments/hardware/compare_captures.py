"""Do two captures of the same grid (``library_gemm.py``, two processes) hold the same bits?

    python experiments/hardware/compare_captures.py FIRST.npz SECOND.npz [MORE.npz ...]

For each case of FIRST: whether every other capture has the same output bits at the crop, the
fraction of outputs that differ, and, where they differ, the kernels each process ran (XLA's HLO
lines for jnp.dot, torch profiler names). Prints the number of cases that agree.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from identify_captures import _hlo_kernels  # noqa: E402
from tcemu._src.captures import load  # noqa: E402


def kernels(case):
    return case.get("kernels") or _hlo_kernels(case.get("hlo", []))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("captures", nargs="+")
    args = p.parse_args(argv)
    if len(args.captures) < 2:
        p.error("give at least two captures of the same grid")
    loaded = [(z, [c for c in m["cases"] if "key" in c]) for z, m in map(load, args.captures)]
    z0, cases = loaded[0]
    same = 0
    for i, c in enumerate(cases):  # the grid's i-th case in every capture (keys may differ: c0, a0)
        d0 = z0[f"{c['key']}.d"]
        diffs = []
        for path, (z, others) in zip(args.captures[1:], loaded[1:]):
            other = others[i] if i < len(others) else {}
            if [other.get(f) for f in ("batch", "M", "N", "K", "a", "out")] != [c[f] for f in ("batch", "M", "N", "K", "a", "out")]:
                p.error(f"{path}: case {i} is another GEMM; compare captures of one grid")
            d = z[f"{other['key']}.d"]
            if not np.array_equal(d, d0):
                diffs.append((Path(path).name, float((d != d0).mean()), kernels(other)))
        same += not diffs
        if diffs:
            print(f"{c['key']} {c['lib']} b{c['batch']} {c['M']}x{c['N']}x{c['K']} {c['a']}->{c['out']}: first {kernels(c)}")
            for name, frac, ks in diffs:
                print(f"    {name}: {frac:.1%} of outputs differ; {json.dumps(ks)}")
    print(f"{same} of {len(cases)} cases have the same bits in all {len(args.captures)} captures")


if __name__ == "__main__":
    main()
