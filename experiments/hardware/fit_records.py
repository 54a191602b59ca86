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
written are checked to give scikit-learn's own predictions through ``library_fit.vote`` on
every row. ``--jobs`` processes read the files and fit the groups, each forest's trees in
``--threads`` threads (on a machine of many cores, e.g. ``--jobs 12 --threads 5``: with one
thread a forest, a group of 911,044 rows keeps one core busy for most of the fit). The forests
are the same for any counts: on the shipped records and two random sets, this script with two
processes and one thread, with one process and five threads, and the one-process script it
replaced at stop 57 wrote the same forests and templates.
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


def _digest(args):
    """A records file as ``fit`` needs it (one process a file): its header, each row's (key,
    offgrid, label) but those of ``own``, and each label's first such row (by :func:`_order`) as
    (order, key, template)."""
    path, own = args
    with gzip.open(path, "rt") as f:
        data = json.load(f)
    rows, first = [], {}
    for r in data["cases"]:
        k = R.key(r)
        if r.get("calls") and r.get("kernels") and k not in own:
            lab, order = label(r), _order(k)
            rows.append((k, bool(r.get("offgrid")), lab))
            if lab not in first or order < first[lab][0]:
                first[lab] = (order, k, {"kernels": r["kernels"],
                                         "calls": [{"fn": c.get("fn"), "algo": c.get("algo", {})} for c in r["calls"]]})
    return data["header"], rows, first


def _order(k) -> tuple:
    """Rows in the order the fit takes them: by batch, M, N, K, then the case."""
    return (k[1] or 0, k[2], k[3], k[4], json.dumps(k))


def read(paths, own: set, pool):
    """(the first file's header, {key: (offgrid, label)} but the keys of ``own``, with later
    files' rows in the place of earlier ones', {label: (order, key, template)}: the first row by
    :func:`_order` that has it, as the rows read one by one would give)."""
    header, rows, first = None, {}, {}
    digests = list(pool.map(_digest, [(p, own) for p in paths]))
    for h, rs, _ in digests:
        header = header or h
        rows.update((k, (off, sys.intern(lab))) for k, off, lab in rs)
    for _, _, fs in digests:  # a later file's row of the same case (the same order) in the place of an earlier one's
        for lab, (order, k, template) in fs.items():
            if rows[k][1] == lab and (lab not in first or order <= first[lab][0]):
                first[lab] = (order, k, template)
    for _, _, fs in digests:
        for lab, (order, k, _) in fs.items():
            if rows[k][1] != lab and (lab not in first or order < first[lab][0]):
                raise SystemExit(f"{k}: recorded as {lab} first, then otherwise: its label's template is not known")
    return header, rows, first


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


def groups(rows: dict) -> dict:
    """Class string -> group number (:func:`library_fit.group_key`), from ``{key: (offgrid,
    label)}``."""
    forms, kind = defaultdict(dict), {}
    for k, (off, lab) in rows.items():
        c = F.group_key(R._class(k))
        kind[c] = (k[5], k[6], k[7], bool(k[1]))
        if off:
            forms[c][(k[1], k[2], k[3], k[4])] = lab
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


MEMBERS: list = []  # per group: shapes (M, N, K, batch, alignment) and labels in the fit's order, for the forked processes


def _features(shapes: np.ndarray, sms: int) -> np.ndarray:
    return np.stack([F.features(M, N, K, batch or None, align, sms) for M, N, K, batch, align in shapes.tolist()])


def _fit_group(args):
    """One group's forest (one process a group), exported, and scikit-learn's own predictions;
    its features kept in ``tmp`` for :func:`_check_group`."""
    g, sms, trees, max_features, template_index, threads, tmp = args
    from sklearn.ensemble import RandomForestClassifier

    shapes, labels = MEMBERS[g]
    X = _features(shapes, sms)
    np.save(Path(tmp) / f"{g}.npy", X)
    model = RandomForestClassifier(n_estimators=trees, criterion="entropy", max_features=max_features,
                                   random_state=0, n_jobs=threads).fit(X, labels)
    want = np.asarray([template_index[w] for w in model.predict(X)])
    return (export(model, template_index), want, sum(e.tree_.node_count for e in model.estimators_),
            len(model.classes_), int(sum(w == template_index[lab] for w, lab in zip(want, labels))))


def _check_group(args):
    """The template numbers the written forest of group ``g`` gives its rows through
    ``library_fit`` equal scikit-learn's (``want``)."""
    out, g, want, tmp = args
    forest = F.load(out)["forests"][g]
    got = np.asarray(forest["classes"])[F.vote(forest, np.load(Path(tmp) / f"{g}.npy"))]
    bad = np.flatnonzero(got != want)
    return None if not bad.size else MEMBERS[g][0][bad[0]].tolist()


def fit(out: str, paths: list[str], trees: int = 5, max_features: float = 0.5, jobs: int = 2, threads: int = 1) -> None:
    import multiprocessing
    import tempfile

    from sklearn import __version__ as sklearn_version  # development only: not needed to read records

    pool = multiprocessing.get_context("fork").Pool(jobs)
    own = captured(paths[0])
    header, rows, first = read(paths, own, pool)
    print(f"{len(rows)} rows ({len(own)} at captured shapes left out)", flush=True)
    sms = int(header["sms"])
    group = groups(rows)
    used = {lab for _, lab in rows.values()}
    ordered = sorted((v[0], lab) for lab, v in first.items() if lab in used)
    template_index = {lab: i for i, (_, lab) in enumerate(ordered)}
    templates = [first[lab][2] for _, lab in ordered]
    members = defaultdict(lambda: ([], []))
    for k in sorted(rows, key=_order):
        shapes, labels = members[group[F.group_key(R._class(k))]]
        shapes.append((k[2], k[3], k[4], k[1] or 0, R._class(k)[-1]))
        labels.append(rows[k][1])
    MEMBERS[:] = [(np.asarray(members[g][0], np.int64), members[g][1]) for g in range(len(members))]
    del rows, members
    pool.close()
    pool = multiprocessing.get_context("fork").Pool(jobs)  # forked after MEMBERS is set
    order = sorted(range(len(MEMBERS)), key=lambda g: -len(MEMBERS[g][0]))  # the largest groups first
    tmp = tempfile.TemporaryDirectory()
    done = dict(zip(order, pool.map(_fit_group, [(g, sms, trees, max_features, template_index, threads, tmp.name)
                                                 for g in order], chunksize=1)))
    for g in range(len(MEMBERS)):
        print(f"group {g}: {len(MEMBERS[g][0])} rows, {done[g][2]} nodes, {done[g][3]} labels", flush=True)
    fitted = {"header": {"gpu": header["gpu"], "sms": sms, "sklearn": sklearn_version,
                         "records": [Path(p).name for p in paths], "features": list(F.FEATURES),
                         "forest": {"trees": trees, "max_features": max_features, "criterion": "entropy",
                                    "random_state": 0}},
              "groups": group, "forests": [done[g][0] for g in range(len(MEMBERS))], "templates": templates}
    with gzip.open(out, "wt", compresslevel=9) as f:
        json.dump(fitted, f, separators=(",", ":"))
    for g, bad in zip(order, pool.map(_check_group, [(out, g, done[g][1], tmp.name) for g in order], chunksize=1)):
        if bad is not None:
            raise SystemExit(f"the exported forest of group {g} differs from scikit-learn's at (M, N, K, batch, "
                             f"alignment) {bad}")
    pool.close()
    tmp.cleanup()
    right, total = sum(d[4] for d in done.values()), sum(len(m[1]) for m in MEMBERS)
    print(f"wrote {out}: {len(MEMBERS)} forests of {trees} trees, {len(templates)} templates; exported = "
          f"scikit-learn on all {total} rows; the fit reproduces {right} of them")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("records", nargs="+", help="the shipped records file first, then development random sets")
    p.add_argument("--trees", type=int, default=5, help="trees per forest (default 5)")
    p.add_argument("--max-features", type=float, default=0.5, help="share of the features tried at each split")
    p.add_argument("--jobs", type=int, default=2, help="processes: the files read and the groups fitted in parallel")
    p.add_argument("--threads", type=int, default=1, help="threads a forest's trees are fitted in (scikit-learn's "
                   "n_jobs: the same trees for any count)")
    args = p.parse_args(argv)
    fit(args.out, args.records, args.trees, args.max_features, args.jobs, args.threads)


if __name__ == "__main__":
    main()
