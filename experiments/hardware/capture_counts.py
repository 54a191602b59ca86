"""How many tiles (instances) the hardware captures in tests/data hold, per form.

    python experiments/hardware/capture_counts.py [--list] [--data tests/data]

Reads the capture files in tests/data (nothing is run on a GPU) and prints, per family, the
number of forms and the minimum / median / maximum number of captured tiles per form, with the
tiles per input class; ``--list`` adds one line per form. A tile is one MMA (one warp's, or one warpgroup's
for ``wgmma``) whose inputs and output bits were captured; the tests compare every captured tile.

* ``wmma_mma_{f16,bf16tf32,f64,int}_sm90.npz``: ``<spelling>.d`` (T, M, N);
* ``mma_sync_sm90.npz``: ``<spelling>.regs_out`` (T, 32, nd);
* ``wgmma_sm90.npz``: ``<spelling>.d_regs`` (T, 128, nd);
* ``signed_zeros_sm90.npz``, ``underflow_sm90.npz``: wmma, mma.sync and wgmma forms on the
  zero and underflow classes (a form's tiles here are on top of its tiles above);
* ``mmasim_vectors.npz``: MMA-Sim's outputs (not hardware), ``<form>/d``.

Then the other counts the top-level README states that the data in tests/data can check: wmma
layout configurations, Volta ptxas tables, ldmatrix/stmatrix forms, probed forms, signed-zero
forms per instruction kind, MMA-Sim forms per kind, and library / layer GEMM cases per capture.
"""
from __future__ import annotations

import argparse
import json
import statistics
from collections import Counter
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
WMMA = ("wmma_mma_f16_sm90.npz", "wmma_mma_bf16tf32_sm90.npz", "wmma_mma_f64_sm90.npz", "wmma_mma_int_sm90.npz")


def _forms(z, suffix):
    """{form: number of tiles} of the keys ``<form><suffix>`` of an npz."""
    return {k[: -len(suffix)]: int(z[k].shape[0]) for k in z.files if k.endswith(suffix)}


def _classes(z, form):
    """{input class: tiles} of one form, where the capture records classes."""
    if f"{form}.class" not in z.files or f"{form}.classes" not in z.files:
        return {}
    names = [str(c) for c in z[f"{form}.classes"]]
    return {names[i]: n for i, n in sorted(Counter(int(c) for c in z[f"{form}.class"]).items())}


def families(data: Path):
    """[(family, file, {form: tiles}, {form: {class: tiles}})] of the captures."""
    out = []
    for name in WMMA:
        z = np.load(data / name)
        f = _forms(z, ".d")
        out.append((f"wmma.mma {name.split('_')[2]}", name, f, {k: _classes(z, k) for k in f}))
    z = np.load(data / "mma_sync_sm90.npz")
    f = _forms(z, ".regs_out")
    out.append(("mma.sync", "mma_sync_sm90.npz", f, {k: _classes(z, k) for k in f}))
    z = np.load(data / "wgmma_sm90.npz")
    f = _forms(z, ".d_regs")
    out.append(("wgmma", "wgmma_sm90.npz", f, {k: _classes(z, k) for k in f}))
    for name in ("signed_zeros_sm90.npz", "underflow_sm90.npz"):
        z = np.load(data / name)
        f = {**_forms(z, ".d"), **_forms(z, ".regs_out"), **_forms(z, ".d_regs")}
        out.append((name.split("_sm90")[0], name, f, {k: _classes(z, k) for k in f}))
    z = np.load(data / "mmasim_vectors.npz")
    out.append(("MMA-Sim (not hardware)", "mmasim_vectors.npz", _forms(z, "/d"), {}))
    return out


def _kind(spelling):
    return spelling.split(".")[0] if spelling.startswith("w") else "mma.sync"


def other_counts(data: Path):
    """[(what, count)] of the README's other checkable counts."""
    out = []
    z = np.load(data / "wmma_layouts_sm90.npz")
    for p, what in (("ld.", "wmma.load configurations (layouts)"), ("st.", "wmma.store.d configurations")):
        out.append((what, len({k.rsplit(".", 1)[0] for k in z.files if k.startswith(p) and k.endswith(".table")})))
    out.append(("sm_70 wmma.load tables from ptxas", len(np.load(data / "wmma_layouts_sm70_ptxas.npz").files)))
    z = np.load(data / "ldstmatrix_sm90.npz")
    for p in ("ldmatrix", "stmatrix"):
        out.append((f"{p} forms", len({k.rsplit(".", 1)[0] for k in z.files if k.startswith(p)})))
    probe = json.loads((data / "probe_sm90.json").read_text())
    for kind, n in sorted(Counter(_kind(k) for k in probe).items()):
        out.append((f"probed on hardware: {kind} forms", n))
    z = np.load(data / "signed_zeros_sm90.npz")
    forms = {k.rsplit(".", 1)[0] for k in z.files if k.endswith((".d", ".regs_out", ".d_regs"))}
    for kind, n in sorted(Counter(_kind(f) for f in forms).items()):
        out.append((f"signed zeros: {kind} forms", n))
    meta = json.loads(bytes(np.load(data / "mmasim_vectors.npz")["meta"]).decode())["meta"]

    def mkind(sp):
        if sp.startswith("tcgen05"):
            return "sm_100 tcgen05.mma"
        for k in ("kind::f8f6f4", "kind::mxf8f6f4", "kind::mxf4"):
            if k in sp:
                return f"sm_120 mma.sync .{k}" + ("/mxf4nvf4" if k == "kind::mxf4" else "")
        return "cross-check (earlier forms)"
    for kind, n in sorted(Counter(mkind(v["spelling"]) for v in meta.values()).items()):
        out.append((f"MMA-Sim: {kind}", n))
    for f in sorted(data.glob("library_gemm_*.npz")) + sorted(data.glob("layer_gemm_*.npz")):
        z = np.load(f)
        out.append((f"cases in {f.name}", len({k.split(".")[0] for k in z.files if not k.startswith("meta")})))
    return out


def _span(ns):
    return f"{min(ns)}-{max(ns)} (median {statistics.median(ns):g})" if ns else "none"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=ROOT / "tests" / "data")
    ap.add_argument("--list", action="store_true", help="one line per form")
    args = ap.parse_args()
    fams = families(args.data)
    print(f"{'family':<24} {'file':<28} {'forms':>5}  {'tiles per form: min-max (median)':<34} total")
    allwmma = []
    for fam, name, forms, _ in fams:
        ns = list(forms.values())
        if fam.startswith("wmma.mma"):
            allwmma += ns
        print(f"{fam:<24} {name:<28} {len(ns):>5}  {_span(ns):<34} {sum(ns)}")
    print(f"{'wmma.mma, all files':<24} {'':<28} {len(allwmma):>5}  {_span(allwmma):<34} {sum(allwmma)}")
    print("\nforms by tile count (tiles: forms), and tiles per input class:")
    for fam, name, forms, classes in fams:
        hist = Counter(forms.values())
        print(f"  {fam}: " + ", ".join(f"{n}: {c}" for n, c in sorted(hist.items())))
        per_class = Counter(tuple(sorted(Counter(v.values()).items())) for v in classes.values() if v)
        for shape, c in sorted(per_class.items(), key=lambda x: -x[1]):
            parts = " + ".join(f"{k} class{'es' * (k != 1)} x {n}" for n, k in shape)
            print(f"      {c} form{'s' * (c != 1)}: {parts} tiles")
    print("\nsummary (hardware captures; a form's signed-zero and underflow tiles come on top):")
    hw = {"wmma.mma": allwmma}
    for fam, name, forms, _ in fams:
        if fam in ("mma.sync", "wgmma"):
            hw[fam] = list(forms.values())
    for fam, ns in hw.items():
        line = f"  {fam}: {len(ns)} forms, {min(ns)}-{max(ns)} tiles each (median {statistics.median(ns):g})"
        big, small = [n for n in ns if n >= 96], [n for n in ns if n < 96]
        if big and small:
            line += (f"; {len(big)} forms with {min(big)}-{max(big)} tiles, "
                     f"{len(small)} with {min(small)}-{max(small)}")
        print(line)
    print("\nother counts:")
    for what, n in other_counts(args.data):
        print(f"  {n:>5}  {what}")
    if args.list:
        for fam, name, forms, classes in fams:
            print(f"\n{fam} ({name}):")
            for form, n in sorted(forms.items()):
                print(f"  {n:>4}  {form}")


if __name__ == "__main__":
    main()
