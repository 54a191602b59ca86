"""Fit the split-K translation a GPU that takes another's forests (``library_records.FIT_FROM``:
the H100, the H200's) answers with where the two GPUs' records differ around a shape
(``library_fit.splits``).

    pip install scikit-learn   # development only
    python experiments/hardware/fit_from.py tcemu/_src/data/cublas_fit_h100_from_h200.json.gz \
        tcemu/_src/data/cublas_records_h100.json.gz tcemu/_src/data/cublas_records_h200.json.gz

Rows: the cases both GPUs' shipped records hold, but those at captured shapes
(``fit_records.captured``, kept to check it), where the donor (the second file) ran an nvjet
kernel with split-K (the two GPUs' records differ in nothing else: at the H100's 119,566 grid
cases, 6369 forms differ, every one an nvjet split count). Label: this GPU's split count minus the
donor's. One ``RandomForestClassifier`` (``--trees`` 15, grown fully with entropy, half the
features at each split, ``random_state=0``) on ``library_fit.split_features``; the forest written
is checked to give scikit-learn's predictions through ``library_fit.vote`` on every row.
"""
from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1]))
from fit_records import captured, export  # noqa: E402

from tcemu._src import library_fit as F  # noqa: E402
from tcemu._src import library_records as R  # noqa: E402


def rows(records: str, donor: str) -> tuple[np.ndarray, np.ndarray, int, str]:
    """(features, labels, SMs, GPU) of the cases of ``records`` (not at captured shapes) that
    ``donor`` holds with an nvjet kernel splitting K; labels: the split count minus the donor's."""
    own, (header, mine), theirs = captured(records), R.load(records), R.load(donor)[1]
    X, y = [], []
    for k in sorted(mine, key=lambda k: json.dumps(k)):
        other = theirs.get(k)
        if k in own or other is None or R.family(other["kernels"]) != "nvjet":
            continue
        S = int(R.algo(other).get("numSplitsK", 1))
        if S > 1:
            if R.family(mine[k]["kernels"]) != "nvjet":
                raise SystemExit(f"{k}: nvjet on the donor, {mine[k]['kernels'][0]} here: not a split-K difference")
            X.append(F.split_features(R._class(k), k[2], k[3], k[4], k[1], S, int(header["sms"])))
            y.append(int(R.algo(mine[k]).get("numSplitsK", 1)) - S)
    return np.stack(X), np.asarray(y), int(header["sms"]), header["gpu"]


def fit(out: str, records: str, donor: str, trees: int = 15) -> None:
    from sklearn import __version__ as sklearn_version  # development only
    from sklearn.ensemble import RandomForestClassifier

    X, y, sms, gpu = rows(records, donor)
    model = RandomForestClassifier(n_estimators=trees, criterion="entropy", max_features=0.5,
                                   random_state=0).fit(X, y)
    want = model.predict(X)
    forest = export(model, {int(c): int(c) for c in model.classes_})
    header = {"gpu": gpu, "sms": sms, "donor": R.load(donor)[0]["gpu"], "sklearn": sklearn_version,
              "records": [Path(records).name, Path(donor).name], "features": list(F.SPLIT_FEATURES),
              "forest": {"trees": trees, "max_features": 0.5, "criterion": "entropy", "random_state": 0}}
    with gzip.open(out, "wt", compresslevel=9) as f:
        json.dump({"header": header, "forest": forest}, f, separators=(",", ":"))
    F.load_splits.cache_clear()
    got = np.asarray(forest["classes"])[F.vote(F.load_splits(out)["forest"], X)]
    if not np.array_equal(got, want):
        raise SystemExit(f"the exported forest differs from scikit-learn's at row {int(np.flatnonzero(got != want)[0])}")
    print(f"wrote {out}: {len(y)} rows ({int((y == 0).sum())} with the donor's count), {trees} trees, "
          f"{len(model.classes_)} labels; exported = scikit-learn on every row; the fit reproduces "
          f"{int((want == y).sum())} of them")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("records", help="the shipped records of the GPU that takes the other's forests")
    p.add_argument("donor", help="the shipped records of the GPU whose forests it takes")
    p.add_argument("--trees", type=int, default=15)
    args = p.parse_args(argv)
    fit(args.out, args.records, args.donor, args.trees)


if __name__ == "__main__":
    main()
