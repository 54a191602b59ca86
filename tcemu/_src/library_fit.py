"""cuBLAS's choice at a shape its records do not hold, from decision trees fitted on them.

cuBLAS picks a kernel and a split-K count by a heuristic of the GPU that tcemu cannot restate.
``experiments/hardware/fit_records.py`` fits one random forest (scikit-learn's, at development
time only: a few fully grown CART trees, each on a bootstrap sample of the rows and a random half
of the features at each split) per group of record classes (:func:`library_records._class` without
the alignment: classes whose records agree on every shape recorded for both are one group) on the
shipped records (the grid and the shapes recorded at random; not the captured shapes, kept to
check it); the trees vote (the most votes, ties to the first of the group's labels, as
scikit-learn's ``predict``) on what decides the bits (the instruction's k, the K schedule) and the
kernel the epilogue follows (a record row of that form: its kernels and algorithm), from a
shape's :func:`features`. The forests ship in ``data/cublas_fit_<gpu>.json.gz`` beside the
records they were fitted on; a GPU with none takes another's where the two GPUs' records agree
(``library_records.FIT_FROM``), with the split-K count another forest gives for that GPU where
the two GPUs' records differ around the shape (:func:`splits`). Measured on shapes recorded
after the fit in ``experiments/hardware/README.md``.
"""
from __future__ import annotations

import copy
import functools
import gzip
import json
from pathlib import Path

import numpy as np

DATA = Path(__file__).parent / "data"
TILES = ((16, 16), (32, 32), (64, 64), (128, 64), (64, 128), (128, 128), (256, 64), (64, 256), (128, 256), (256, 128))


def group_key(cls: tuple) -> str:
    """A record class (:func:`library_records._class`) without its alignment, as a string."""
    lib, batch, a, b, out, flags, _ = cls
    return json.dumps([lib, bool(batch), a, b, out, [list(f) for f in flags]])


def _named(M: int, N: int, K: int, batch, align: int, sms: int) -> list[tuple[str, float]]:
    """Each feature as (name, value): products and quotients of the shape's integers, each one
    IEEE operation in float64 (the same bits everywhere)."""
    def tiles(tm, tn):
        return -(-M // tm) * -(-N // tn)

    t64, t128 = tiles(64, 64), tiles(128, 128)
    x = [("M", M), ("N", N), ("K", K), ("batch", batch or 1), ("MNK", float(M * N * K)), ("MN", float(M * N)),
         ("tiles 64x64", t64), ("tiles 128x128", t128), ("tiles 128x64", tiles(128, 64)),
         ("tiles 256x128", tiles(256, 128)), ("K / tiles 64x64", K / t64), ("K / tiles 128x128", K / t128),
         ("k-tiles of 64", -(-K // 64)), ("N mod 8", N % 8), ("K mod 8", K % 8), ("N mod 2", N % 2),
         ("K mod 2", K % 2), ("M mod 8", M % 8), ("MNK / (tiles 64x64 * SMs)", M * N * K / (t64 * float(sms))),
         ("alignment", align)]
    for tm, tn in TILES:
        t = tiles(tm, tn) * (batch or 1)
        x += [(f"batched tiles {tm}x{tn}", t), (f"waves {tm}x{tn}", t / sms),
              (f"K / batched tiles {tm}x{tn}", K / t), (f"whole waves {tm}x{tn}", -(-t // sms))]
    return x + [("K mod 64", K % 64), ("K mod 32", K % 32), ("N mod 4", N % 4), ("K mod 4", K % 4),
                ("MNK / (MN + NK + MK)", M * N * K / float(M * N + N * K + M * K))]


FEATURES = tuple(name for name, _ in _named(1, 1, 1, None, 1, 1))


def features(M: int, N: int, K: int, batch, align: int, sms: int) -> np.ndarray:
    """The tree's inputs (:data:`FEATURES`, in that order) as float32, as scikit-learn compares
    them.

    >>> x = features(100, 333, 1000, None, 1, 132)
    >>> int(x[FEATURES.index("tiles 64x64")]), float(x[FEATURES.index("K / tiles 64x64")])
    (12, 83.33333587646484)
    """
    return np.asarray([v for _, v in _named(M, N, K, batch, align, sms)], dtype=np.float64).astype(np.float32)


# a split-K translation's inputs besides FEATURES: the other GPU's split count, and the class
SPLIT_FEATURES = FEATURES + ("donor's split-K count", "K / donor's split-K count", "k-tiles of 64 a donor's slice",
                             "library", "input type", "output type", "bias", "C matrix", "C row", "fast accumulation",
                             "row-wise scales")
_LIBS = ("F.linear", "torch._scaled_mm", "torch.addmm", "torch.bmm", "torch.mm")
_TYPES = ("f16", "bf16", "e4m3", "e5m2", "f32")


def split_features(cls: tuple, M: int, N: int, K: int, batch, S: int, sms: int) -> np.ndarray:
    """A split-K translation's inputs (:data:`SPLIT_FEATURES`) as float32: the shape's
    :func:`features` (class ``cls``: ``library_records._class``), the donor GPU's split count
    ``S`` and the class's library, types and flags as numbers.

    >>> cls = ("torch.mm", False, "bf16", "bf16", "bf16", (("reduced_precision_reduction", True),), 8)
    >>> x = split_features(cls, 64, 512, 16384, None, 8, 132)
    >>> [float(x[SPLIT_FEATURES.index(n)]) for n in ("donor's split-K count", "k-tiles of 64 a donor's slice")]
    [8.0, 32.0]
    """
    lib, _, a, _, out, flags, align = cls
    f = dict(flags)
    extra = [S, K / S, -(-K // (64 * S)), _LIBS.index(lib) if lib in _LIBS else -1, _TYPES.index(a), _TYPES.index(out),
             bool(f.get("bias")), f.get("c") == "matrix", f.get("c") == "row", bool(f.get("use_fast_accum")),
             f.get("scaling") == "row"]
    return np.concatenate([features(M, N, K, batch, align, sms),
                           np.asarray(extra, dtype=np.float64).astype(np.float32)])


def _arrays(forest: dict) -> dict:
    forest["trees"] = [{"feature": np.asarray(t["feature"], np.int64), "right": np.asarray(t["right"], np.int64),
                        "threshold": np.asarray(t["threshold"], np.float64), "leaf": np.asarray(t["leaf"], np.int64)}
                       for t in forest["trees"]]
    return forest


@functools.lru_cache(maxsize=4)
def load_splits(path: str) -> dict:
    """A split-K translation (``experiments/hardware/fit_from.py``): header and one forest whose
    labels are split-count differences from the donor GPU's. Files on other inputs than
    :data:`SPLIT_FEATURES` are refused."""
    with gzip.open(path, "rt") as f:
        fit = json.load(f)
    if fit["header"].get("features") != list(SPLIT_FEATURES) or "forest" not in fit:
        raise ValueError(f"{path}: not a split-K translation on library_fit.SPLIT_FEATURES: refit it "
                         "(experiments/hardware/fit_from.py)")
    _arrays(fit["forest"])
    return fit


def splits(path: str, cls: tuple, M: int, N: int, K: int, batch, S: int) -> int:
    """The split-K count the translation at ``path`` gives a shape of class ``cls`` where the
    donor GPU splits K ``S`` ways (at least 1)."""
    fit = load_splits(path)
    x = split_features(cls, M, N, K, batch, S, fit["header"]["sms"])
    forest = fit["forest"]
    return max(1, S + int(forest["classes"][int(vote(forest, x[None])[0])]))


@functools.lru_cache(maxsize=4)
def load(path: str) -> dict:
    """The fitted forests of ``path``: header, groups (class string -> forest), forests (each the
    group's labels as template numbers and its trees, their node lists as numpy arrays), templates. Fits on other features than
    :data:`FEATURES`, or whose header does not name them, are refused."""
    with gzip.open(path, "rt") as f:
        fit = json.load(f)
    if fit["header"].get("features") != list(FEATURES) or "forests" not in fit:
        raise ValueError(f"{path}: fitted on other features than library_fit.FEATURES (or names none), or not a "
                         "forest per group: refit it (experiments/hardware/fit_records.py)")
    for forest in fit["forests"]:
        _arrays(forest)
    return fit


def leaves(tree: dict, X: np.ndarray) -> np.ndarray:
    """The label (a number in the forest's ``classes``) of the leaf each row of ``X`` (features,
    float32) reaches: an inner node goes to the next node where ``x[feature] <= threshold`` (depth
    first: its left child), else to ``right``; a leaf has ``right`` -1."""
    node = np.zeros(len(X), np.int64)
    while True:
        at = np.flatnonzero(tree["right"][node] >= 0)
        if not at.size:
            return tree["leaf"][node]
        n = node[at]
        left = X[at, tree["feature"][n]].astype(np.float64) <= tree["threshold"][n]
        node[at] = np.where(left, n + 1, tree["right"][n])


def vote(forest: dict, X: np.ndarray) -> np.ndarray:
    """The label number each row of ``X`` gets from the forest's trees: the most votes, ties to the
    first of the forest's labels (scikit-learn's ``predict``)."""
    votes = np.zeros((len(X), len(forest["classes"])), np.int64)
    for tree in forest["trees"]:
        np.add.at(votes, (np.arange(len(X)), leaves(tree, X)), 1)
    return votes.argmax(axis=1)


def predict(path: str, cls: tuple, M: int, N: int, K: int, batch) -> dict | None:
    """The template row (kernels and algorithm) the fitted forest gives a shape of class ``cls``,
    or None where no forest was fitted for the class."""
    fit = load(path)
    g = fit["groups"].get(group_key(cls))
    if g is None:
        return None
    forest = fit["forests"][g]
    best = int(vote(forest, features(M, N, K, batch, cls[-1], fit["header"]["sms"])[None])[0])
    return copy.deepcopy(fit["templates"][forest["classes"][best]])


def fitted_path(records: str, shipped: dict, fit_from: dict) -> tuple[str | None, str | None]:
    """(the fit file for the shipped records file ``records``, None for the user's own records;
    the records of the GPU the fit was made on where ``fit_from`` gives ``records``'s GPU another
    GPU's fit, else None)."""
    return _fitted_path(records, tuple((gpu, str(p)) for gpu, p in shipped.items()), tuple(fit_from.items()))


def translation_path(records: str, shipped: dict, fit_from: dict) -> str | None:
    """The split-K translation (:func:`splits`) for the shipped records file ``records`` of a GPU
    that takes another's forests (``fit_from``), where one ships; else None."""
    for gpu, p in shipped.items():
        if str(p) == records and gpu in fit_from:
            q = DATA / f"cublas_fit_{gpu.lower()}_from_{fit_from[gpu].lower()}.json.gz"
            return str(q) if q.exists() else None
    return None


@functools.lru_cache(maxsize=16)
def _fitted_path(records: str, shipped: tuple, fit_from: tuple) -> tuple[str | None, str | None]:
    for gpu, p in shipped:
        if p == records:
            donor = dict(fit_from).get(gpu)
            q = DATA / f"cublas_fit_{(donor or gpu).lower()}.json.gz"
            return (str(q), donor and dict(shipped)[donor]) if q.exists() else (None, None)
    return None, None
