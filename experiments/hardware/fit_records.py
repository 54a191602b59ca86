"""Fit the random forests ``library_config`` answers unrecorded shapes with
(``tcemu/_src/library_fit.py``) on a GPU's shipped records and its development random sets.

    pip install scikit-learn   # development only: tcemu reads the forests without it
    python experiments/hardware/fit_records.py tcemu/_src/data/cublas_fit_h200.json.gz \
        tcemu/_src/data/cublas_records_h200.json.gz tests/data/cublas_records_h200_random*.json.gz ...

The shipped records' rows at captured shapes (neither the grid's nor recorded at random) are kept
out of the fit, so that the captures (``check_records.py --drop-own``) stay a check of it. Groups:
record classes (``library_records._class`` without the alignment) of one input type,
output type and batching whose records agree on every one of at least 1000 shapes recorded for
both (the random sets: e.g. torch.mm with reduced-precision reduction and torch.addmm with a
full C) are fitted together. Label: a row's form (``library_records._form``), whether its kernel
adds C after the rounding (``_badd_``) and its split-K reduction scheme; each label keeps the
first row (by shape) that has it as its template (evaluated at the user's K by
``library_records``). One ``RandomForestClassifier`` per group on ``library_fit.features``
(``--trees`` 5, grown fully with entropy, each split among a random ``--max-features`` 0.5 of the
features, ``random_state=0``; stop 54 and before: one ``DecisionTreeClassifier``). The forests
written are checked to give scikit-learn's own predictions through ``library_fit.predict`` on
every row.
"""
from __future__ import annotations

import argparse
import gzip
import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
from tcemu._src import library_fit as F  # noqa: E402
from tcemu._src import library_records as R  # noqa: E402
from tcemu._src import record as REC  # noqa: E402


def read(paths):
    header, rows = None, {}
    for p in paths:
        with gzip.open(p, "rt") as f:
            data = json.load(f)
        header = header or data["header"]
        for r in data["cases"]:
            if r.get("calls") and r.get("kernels"):
                rows[R.key(r)] = r
    return header, list(rows.values())


def captured(path: str) -> set:
    """The keys of the rows of the records file ``path`` at shapes neither of the grid
    (``record.default_cases``) nor recorded at random (``"offgrid"``)."""
    grid = {(c["lib"], c["batch"] or None, c["M"], c["N"], c["K"]) for c in REC.default_cases()}
    with gzip.open(path, "rt") as f:
        return {R.key(r) for r in json.load(f)["cases"]
                if not r.get("offgrid") and (r["lib"], r["batch"] or None, r["M"], r["N"], r["K"]) not in grid}


def label(r) -> str:
    """The row's form at a depth off a multiple of 64 (the form a template gives at the user's K
    is evaluated there: :func:`library.cutlass_slice_alignment` must not split labels), whether C
    is added after the rounding, and the split-K reduction scheme."""
    return json.dumps([str(R._form(r, K=1)), "_badd_" in " ".join(r["kernels"]), R.algo(r).get("reductionScheme")])


def groups(rows) -> dict:
    """Class string -> group number (:func:`library_fit.group_key`)."""
    forms = defaultdict(dict)
    for r in rows:
        if r.get("offgrid"):
            forms[F.group_key(R._class(R.key(r)))][(r["batch"], r["M"], r["N"], r["K"])] = label(r)
    kind = {F.group_key(R._class(R.key(r))): (r["a"], r["b"], r["out"], bool(r["batch"])) for r in rows}
    heads, out = [], {}
    for c in sorted(kind):
        for i, h in enumerate(heads):
            shared = set(forms[c]) & set(forms[h])
            if kind[c] == kind[h] and len(shared) >= 1000 and all(forms[c][s] == forms[h][s] for s in shared):
                out[c] = i
                break
        else:
            out[c] = len(heads)
            heads.append(c)
    return out


def export(model, templates: dict) -> dict:
    """A fitted forest as ``library_fit`` walks it: its labels as template numbers and, per tree,
    feature, threshold and right child of the inner nodes (the left child is the next node: depth
    first) and the label number of the leaves (the most of its rows)."""
    trees = []
    for est in model.estimators_:
        t = est.tree_
        inner = t.children_left >= 0
        if not np.array_equal(t.children_left[inner], np.flatnonzero(inner) + 1):
            raise SystemExit("a tree is not numbered depth first (left child = next node)")
        trees.append({"feature": [int(f) if i else -1 for f, i in zip(t.feature, inner)],
                      "threshold": [float(v) if i else 0.0 for v, i in zip(t.threshold, inner)],
                      "right": [int(v) for v in t.children_right],
                      "leaf": [-1 if i else int(np.argmax(v)) for v, i in zip(t.value, inner)]})
    return {"classes": [templates[c] for c in model.classes_], "trees": trees}


def fit(out: str, paths: list[str], trees: int = 5, max_features: float = 0.5, jobs: int = 2) -> None:
    from sklearn import __version__ as sklearn_version  # development only: not needed to read records
    from sklearn.ensemble import RandomForestClassifier

    header, rows = read(paths)
    own = captured(paths[0])
    rows = [r for r in rows if R.key(r) not in own]
    print(f"{len(rows)} rows ({len(own)} at captured shapes left out)", flush=True)
    sms = int(header["sms"])
    group = groups(rows)
    rows.sort(key=lambda r: (r["batch"] or 0, r["M"], r["N"], r["K"], json.dumps(R.key(r))))
    templates, template_index = [], {}
    for r in rows:
        if label(r) not in template_index:
            template_index[label(r)] = len(templates)
            templates.append({"kernels": r["kernels"], "calls": [{"fn": c.get("fn"), "algo": c.get("algo", {})}
                                                               for c in r["calls"]]})
    members = defaultdict(list)
    for r in rows:
        members[group[F.group_key(R._class(R.key(r)))]].append(r)
    forests, want = [], []
    for g in range(len(members)):
        rs = members[g]
        X = np.stack([F.features(r["M"], r["N"], r["K"], r["batch"], R._class(R.key(r))[-1], sms) for r in rs])
        model = RandomForestClassifier(n_estimators=trees, criterion="entropy", max_features=max_features,
                                       random_state=0, n_jobs=jobs).fit(X, [label(r) for r in rs])
        forests.append(export(model, template_index))
        print(f"group {g}: {len(rs)} rows, {sum(e.tree_.node_count for e in model.estimators_)} nodes, "
              f"{len(model.classes_)} labels", flush=True)
        want.append((rs, model.predict(X)))
    fitted = {"header": {"gpu": header["gpu"], "sms": sms, "sklearn": sklearn_version,
                         "records": [Path(p).name for p in paths], "features": list(F.FEATURES),
                         "forest": {"trees": trees, "max_features": max_features, "criterion": "entropy",
                                    "random_state": 0}},
              "groups": group, "forests": forests, "templates": templates}
    with gzip.open(out, "wt", compresslevel=9) as f:
        json.dump(fitted, f, separators=(",", ":"))
    for g, (rs, predicted) in enumerate(want):
        for r, w in zip(rs, predicted):
            got = F.predict(out, R._class(R.key(r)), r["M"], r["N"], r["K"], r["batch"])
            if label(dict(r, **got)) != w:
                raise SystemExit(f"the exported forest of group {g} differs from scikit-learn's at {R.key(r)}")
    right = sum(label(r) == w for rs, predicted in want for r, w in zip(rs, predicted))
    print(f"wrote {out}: {len(forests)} forests of {trees} trees, {len(templates)} templates; exported = "
          f"scikit-learn on all {len(rows)} rows; the fit reproduces {right} of them")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("records", nargs="+", help="the shipped records file first, then development random sets")
    p.add_argument("--trees", type=int, default=5, help="trees per forest (default 5)")
    p.add_argument("--max-features", type=float, default=0.5, help="share of the features tried at each split")
    p.add_argument("--jobs", type=int, default=2)
    args = p.parse_args(argv)
    fit(args.out, args.records, args.trees, args.max_features, args.jobs)


if __name__ == "__main__":
    main()
