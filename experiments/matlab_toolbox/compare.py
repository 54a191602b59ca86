"""Compare the MATLAB toolbox's outputs (run_toolbox.m) with MMA-Sim's (make_cases.py) and tcemu's.

Reads ``<work>/cases.npz`` and ``<work>/gNNN.out``, runs tcemu on every case (the cases of a group
packed on the diagonals of a batch of the instruction's D, chained over the instruction's K when the
case is longer), prints the agreement table (markdown) and every disagreement, and writes the
compact data file the tests read::

    python experiments/matlab_toolbox/compare.py --work /tmp/mtc-work --out tests/data/matlab_toolbox_amd.npz

Equality is bit equality of binary32 results, except that any NaN equals any NaN (the toolbox's
NaN is MATLAB's 0x7FC00000, MMA-Sim's two-stage adders return 0x7FFFFFFF and its CDNA1/CDNA2 models
the host's arithmetic NaN).
"""
from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import ml_dtypes
import numpy as np

GFX = {"CDNA1": "gfx908", "CDNA2": "gfx90a", "CDNA3": "gfx942"}
VIEW = {"f16": np.float16, "bf16": ml_dtypes.bfloat16, "xf32": np.float32,
        "fp8": ml_dtypes.float8_e4m3fnuz, "bf8": ml_dtypes.float8_e5m2fnuz}
STATUS = {0: "ok", 1: "toolbox error", 2: "not binary32"}
# why a toolbox result differs from MMA-Sim's (README.md, "Disagreements"); 0: it does not
EXPLAIN = ("agree", "overflow", "bf16_pairs_not_quads", "product_sum_31_bits_below_c", "octave_error", "unexplained")


def toolbox_bits(d):
    """binary32 bits of the toolbox's float64 results, and a status: 2 where the double is not a
    binary32 value (a result outside the format: the model's own rounding did not produce one)."""
    with np.errstate(over="ignore"):
        f = d.astype(np.float32)
    exact = np.isnan(d) | (f.astype(np.float64) == d)
    return f.view(np.uint32), np.where(exact, 0, 2)


def same(x, y):
    fx, fy = x.view(np.float32), y.view(np.float32)
    return (x == y) | (np.isnan(fx) & np.isnan(fy))


def tcemu_cases(g, a, b, c):
    """tcemu's D for the cases (None where tcemu has no numerics for the instruction)."""
    import tcemu
    from tcemu._src.isa.mfma import parse_mfma

    ins = parse_mfma("v_mfma_" + g["suffix"], GFX[g["gen"]])
    n, k = a.shape
    M, N, ki = ins.m, ins.n, ins.k
    nb = -(-n // M)
    idx = np.arange(n)
    A = np.zeros((nb * M, k), a.dtype)
    A[idx] = a
    A = A.reshape(nb, M, k)
    B = np.zeros((nb * N, k), b.dtype)
    B[idx] = b
    B = B.reshape(nb, N, k).transpose(0, 2, 1)
    C = np.zeros((nb * M,), np.uint32)
    C[idx] = c
    D = np.zeros((nb, M, N), np.uint32)
    D[np.arange(nb)[:, None], np.arange(M), np.arange(M)] = C.reshape(nb, M)
    view = VIEW[g["type"]]
    try:
        for j in range(k // ki):
            D = np.asarray(tcemu.mma(ins.spelling, A[..., j * ki:(j + 1) * ki].view(view),
                                     np.ascontiguousarray(B[:, j * ki:(j + 1) * ki, :]).view(view),
                                     D.view(np.float32), arch=GFX[g["gen"]])).view(np.uint32)
    except ValueError as e:
        if "not modelled" in str(e):
            return None
        raise
    return D[:, np.arange(M), np.arange(M)].reshape(-1)[:n]


def explain(g, st, tb_m, ovf, dt, dv):
    """The EXPLAIN code of each case: its agreement, else the first rule that accounts for it."""
    e = np.full(st.shape, EXPLAIN.index("unexplained"), np.uint8)
    if g["variant"]:
        e[same(dt, dv)] = EXPLAIN.index(g["variant"])
    e[ovf] = EXPLAIN.index("overflow")
    e[st == 1] = EXPLAIN.index("octave_error")
    e[tb_m] = 0
    return e


def family(g):
    t = g["type"] + ("_1k" if g["suffix"].endswith("_1k") else "")
    if g["gen"] == "CDNA2" and t == "bf16":
        t = "bf16 (no _1k)"
    return f"{g['gen']} {g['model']}", t


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--toolbox-commit", default="b12b5a700957655375a1b0c1d0c26e76065da015")
    p.add_argument("--octave", default="7.3.0")
    args = p.parse_args()
    work = Path(args.work)
    z = np.load(work / "cases.npz")
    meta = json.loads(str(z["meta"]))
    # cases, tb==tcemu, tb==mmasim, tcemu==mmasim, tcemu n/a, tb beyond binary32, then per EXPLAIN code
    table = defaultdict(lambda: np.zeros(6 + len(EXPLAIN), int))
    out, diffs = {}, []
    for g in meta["groups"]:
        key = g["group"]
        a, b, c, dm = (z[f"{key}|{x}"] for x in "abcd")
        raw = np.fromfile(work / f"{key}.out", np.float64)
        n = g["n"]
        dt, st = toolbox_bits(raw[:n])
        st = np.where(raw[n:] == 1, 1, st)
        de = tcemu_cases(g, a, b, c)
        gen_model, t = family(g)
        src = g["source"].split(":")
        row = (gen_model, t, src[0] + ":" + src[1])
        tb_m = same(dt, dm) & (st != 1)
        ex = explain(g, st, tb_m, z[f"{key}|overflow"], dt, z[f"{key}|d_variant"])
        r = table[row]
        r[5] += (st == 2).sum()
        r[6:] += np.bincount(ex, minlength=len(EXPLAIN))
        r[0] += n
        r[2] += tb_m.sum()
        if de is None:
            r[4] += n
        else:
            tb_e = same(dt, de) & (st != 1)
            r[1] += tb_e.sum()
            r[3] += same(de, dm).sum()
        for i in np.flatnonzero(~tb_m | (de is not None and ~same(de, dm)) | (st == 2)):
            diffs.append(dict(group=key, case=int(i), form=f"{g['gen']} {g['suffix']}", source=g["source"],
                              status=STATUS[int(st[i])], explain=EXPLAIN[ex[i]], toolbox=f"{dt[i]:#010x}", mmasim=f"{dm[i]:#010x}",
                              tcemu=None if de is None else f"{de[i]:#010x}"))
        for name, x in (("a", a), ("b", b), ("c", c), ("d_mmasim", dm), ("d_toolbox", dt), ("status", st.astype(np.uint8)), ("explain", ex)):
            out[f"{key}|{name}"] = x
    print("| generation, toolbox model | type | inputs | cases | toolbox = tcemu | toolbox = MMA-Sim | tcemu = MMA-Sim "
          "| toolbox D beyond binary32 | disagreements by cause |")
    print("|---|---|---|---:|---:|---:|---:|---:|---|")
    for (gm, t, s), r in sorted(table.items()):
        na = r[4] == r[0]
        why = ", ".join(f"{EXPLAIN[j]} {r[6 + j]}" for j in range(1, len(EXPLAIN)) if r[6 + j])
        print(f"| {gm} | {t} | {s} | {r[0]} | {'n/a' if na else r[1]} | {r[2]} | {'n/a' if na else r[3]} "
              f"| {r[5] or ''} | {why} |")
    print(f"\n{len(diffs)} cases with a disagreement:")
    for d in diffs:
        print(json.dumps(d))
    keep = dict(explain=EXPLAIN, toolbox_commit=args.toolbox_commit, mi300mc_commit="122c221", octave=args.octave,
                seed=meta["seed"], groups=meta["groups"])
    np.savez_compressed(args.out, meta=np.asarray(json.dumps(keep)), **out)
    (work / "diffs.json").write_text(json.dumps(diffs, indent=1))
    print(f"wrote {args.out} ({Path(args.out).stat().st_size} bytes)")


if __name__ == "__main__":
    main()
