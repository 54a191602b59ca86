"""The random forests fitted on cuBLAS's records (library_fit): the tree walk, the vote and the
float32 features on forests written by hand, which records get a forest, the shipped H200 forests
on random shapes recorded after they were frozen (5f44699), and the H100's use of them
(``library_records.FIT_FROM``, with the split-K translation) at the captured shapes."""
from __future__ import annotations

import gzip
import json
import sys
from fractions import Fraction

import numpy as np
import pytest

from conftest import ROOT
from tcemu._src import library_fit as F
from tcemu._src import library_records as R

sys.path.insert(0, str(ROOT / "experiments" / "hardware"))
from check_offgrid import captured_rows  # noqa: E402
from check_offgrid import check as check_offgrid  # noqa: E402
from check_offgrid import records_without, shipped_as  # noqa: E402

DATA = ROOT / "tests" / "data"
CLS = ("torch.mm", False, "bf16", "bf16", "bf16", (("reduced_precision_reduction", True),), 1)
NVJET = {"kernels": ["nvjet_sm90_tst_128x128_64x4_1x2_h_bz_NNT"], "calls": [{"algo": {"algoId": 66}}]}
SPLIT = {"kernels": ["cutlass_75_tensorop_bf16_s1688gemm_bf16_64x64_nn_align1", "splitKreduce_kernel"],
         "calls": [{"algo": {"algoId": 24, "numSplitsK": 7, "reductionScheme": "COMPUTE_TYPE"}}]}
SERIAL = dict(SPLIT, calls=[{"algo": {"algoId": 24, "numSplitsK": 3, "reductionScheme": "INPLACE"}}])


def _write(tmp_path, name, forests, templates, groups=None):
    path = tmp_path / name
    with gzip.open(path, "wt") as f:
        json.dump({"header": {"gpu": "NVIDIA H200", "sms": 132, "features": list(F.FEATURES)},
                   "groups": groups or {F.group_key(CLS): 0}, "forests": forests, "templates": templates}, f)
    return str(path)


def _fit(tmp_path, name="fit.json.gz"):
    """One tree: K <= 1000.5: the nvjet template; else alignment <= 4.5 (K or N odd..4): 7 slices; else serial."""
    K, align = F.FEATURES.index("K"), F.FEATURES.index("alignment")
    tree = {"feature": [K, -1, align, -1, -1], "threshold": [1000.5, 0.0, 4.5, 0.0, 0.0],
            "right": [2, -1, 4, -1, -1], "leaf": [-1, 0, -1, 1, 2]}
    return _write(tmp_path, name, [{"classes": [0, 1, 2], "trees": [tree]}], [NVJET, SPLIT, SERIAL])


def test_tree_walk(tmp_path):
    path = _fit(tmp_path)
    assert F.predict(path, CLS, 100, 333, 1000, None) == NVJET
    assert F.predict(path, CLS, 100, 333, 1001, None) == SPLIT
    assert F.predict(path, CLS[:-1] + (8,), 100, 336, 1008, None) == SERIAL
    assert F.predict(path, ("torch.mm",) + CLS[1:5] + ((),) + (1,), 100, 333, 1001, None) is None  # no tree


def test_forest_vote(tmp_path):
    """The most votes win; a tie goes to the first of the forest's labels (scikit-learn's argmax)."""
    K = F.FEATURES.index("K")
    split, nvjet = {"right": [-1], "leaf": [0], "feature": [-1], "threshold": [0.0]}, \
        {"right": [-1], "leaf": [1], "feature": [-1], "threshold": [0.0]}
    by_k = {"feature": [K, -1, -1], "threshold": [1000.5, 0.0, 0.0], "right": [2, -1, -1], "leaf": [-1, 0, 1]}
    three = _write(tmp_path, "three.json.gz", [{"classes": [1, 0], "trees": [split, nvjet, by_k]}], [NVJET, SPLIT])
    assert F.predict(three, CLS, 100, 333, 1000, None) == SPLIT
    assert F.predict(three, CLS, 100, 333, 1001, None) == NVJET
    tie = _write(tmp_path, "tie.json.gz", [{"classes": [1, 0], "trees": [nvjet, split]}], [NVJET, SPLIT])
    assert F.predict(tie, CLS, 100, 333, 1001, None) == SPLIT


def test_vote_on_many_rows_is_each_rows_vote(tmp_path):
    """library_fit.vote over rows at once (the fit's export check) gives each row's own answer."""
    path = _fit(tmp_path)
    shapes = [(100, 333, 1000), (100, 333, 1001), (100, 336, 1008), (7, 8, 1000), (5000, 4096, 4097)]
    aligns = [R._class(("torch.mm", None, M, N, K, "bf16", "bf16", "bf16", ()))[-1] for M, N, K in shapes]
    X = np.stack([F.features(M, N, K, None, al, 132) for (M, N, K), al in zip(shapes, aligns)])
    one_by_one = [[NVJET, SPLIT, SERIAL].index(F.predict(path, CLS[:-1] + (al,), M, N, K, None))
                  for (M, N, K), al in zip(shapes, aligns)]
    assert F.vote(F.load(path)["forests"][0], X).tolist() == one_by_one == [0, 1, 2, 0, 1]


def test_features_are_float32_of_exact_integer_arithmetic():
    x = F.features(1000, 3000, 777, None, 1, 132)
    assert x.dtype == np.float32 and len(x) == len(F.FEATURES)
    t64 = 16 * 47
    want = dict(zip(F.FEATURES, x.tolist()))
    assert want["tiles 64x64"] == t64 and want["tiles 256x128"] == 4 * 24 and want["k-tiles of 64"] == 13
    assert want["K / tiles 64x64"] == float(np.float32(777 / t64)) and want["K mod 8"] == 1 and want["batch"] == 1
    assert want["MNK"] == float(np.float32(1000 * 3000 * 777))


def test_tile_wave_features_by_hand():
    """The stop-50 features at 100 x 333 x 1000, batch 3, on 132 SMs, computed here by hand."""
    want = {"batched tiles 16x16": 7 * 21 * 3, "waves 16x16": 441 / 132, "K / batched tiles 16x16": 1000 / 441,
            "whole waves 16x16": 4, "batched tiles 128x256": 1 * 2 * 3, "waves 128x256": 6 / 132,
            "K / batched tiles 128x256": 1000 / 6, "whole waves 128x256": 1, "batched tiles 64x64": 2 * 6 * 3,
            "K mod 64": 40, "K mod 32": 8, "N mod 4": 1, "K mod 4": 0,
            "MNK / (MN + NK + MK)": Fraction(100 * 333 * 1000, 100 * 333 + 333 * 1000 + 100 * 1000)}
    x = dict(zip(F.FEATURES, F.features(100, 333, 1000, 3, 1, 132).tolist()))
    assert {n: x[n] for n in want} == {n: float(np.float32(float(v))) for n, v in want.items()}
    assert x["tiles 64x64"] == 2 * 6  # unbatched


def test_fit_files_name_their_features(tmp_path):
    assert F.load(str(R.DATA / "cublas_fit_h200.json.gz"))["header"]["features"] == list(F.FEATURES)
    with gzip.open(R.DATA / "cublas_fit_h200.json.gz", "rt") as f:
        fit = json.load(f)  # as written (load's trees are arrays)
    small = dict(fit, forests=fit["forests"][:1], templates=[])  # the shipped header; writing it all is slow
    path = tmp_path / "other.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump(dict(small, header=dict(fit["header"], features=list(F.FEATURES[:-1]))), f)
    with pytest.raises(ValueError, match="other features than library_fit.FEATURES"):
        F.load(str(path))
    unnamed = tmp_path / "unnamed.json.gz"
    with gzip.open(unnamed, "wt") as f:
        json.dump(dict(small, header={k: v for k, v in fit["header"].items() if k != "features"}), f)
    with pytest.raises(ValueError, match="other features than library_fit.FEATURES"):
        F.load(str(unnamed))
    trees = tmp_path / "trees.json.gz"  # stop 54's format: one tree per group
    with gzip.open(trees, "wt") as f:
        json.dump(dict({k: v for k, v in small.items() if k != "forests"}, trees=[]), f)
    with pytest.raises(ValueError, match="not a forest per group"):
        F.load(str(trees))
    same = tmp_path / "same.json.gz"
    with gzip.open(same, "wt") as f:
        json.dump(small, f)
    assert F.load(str(same))["header"] == fit["header"]


def test_fit_only_for_the_shipped_records(tmp_path):
    h200 = str(R.SHIPPED["H200"])
    assert F.fitted_path(h200, R.SHIPPED, R.FIT_FROM) == (str(R.DATA / "cublas_fit_h200.json.gz"), None)
    # no random records on the H100: the H200's trees where the two GPUs' records agree
    assert F.fitted_path(str(R.SHIPPED["H100"]), R.SHIPPED, R.FIT_FROM) == (str(R.DATA / "cublas_fit_h200.json.gz"),
                                                                             h200)
    assert F.fitted_path(str(R.SHIPPED["H100"]), R.SHIPPED, {}) == (None, None)
    assert F.fitted_path(str(tmp_path / "mine.json.gz"), R.SHIPPED, R.FIT_FROM) == (None, None)
    row, source = R.lookup(h200, "torch.mm", None, 1000, 3002, 1003, "bf16", "bf16", "bf16",
                           {"reduced_precision_reduction": True})
    assert source == "nearest" and row["fitted"] and (row["M"], row["N"], row["K"]) == (1000, 3002, 1003)


def _records(path, kernels, algo, header=None):
    """A record file of one row at 64 x 333 x 4097 (header: the file's name as the GPU's)."""
    row = {"lib": "torch.mm", "batch": None, "M": 64, "N": 333, "K": 4097, "a": "bf16", "b": "bf16", "out": "bf16",
           "flags": {"reduced_precision_reduction": True}, "kernels": kernels, "calls": [{"algo": algo}]}
    with gzip.open(path, "wt") as f:
        json.dump({"header": header or {"gpu": path.name}, "cases": [row]}, f)
    return path


def _lookup(monkeypatch, tmp_path, shipped, records):
    """``records``' answer at 100 x 333 x 1001 with ``shipped`` as the shipped records and the fit
    files written in ``tmp_path``."""
    monkeypatch.setattr(F, "DATA", tmp_path)
    monkeypatch.setattr(R, "SHIPPED", shipped)
    return R.lookup(str(records), "torch.mm", None, 100, 333, 1001, "bf16", "bf16", "bf16",
                    {"reduced_precision_reduction": True})


@pytest.mark.parametrize("h200_kernels, fitted", [(NVJET["kernels"], True), (SPLIT["kernels"], False)])
def test_h100_takes_the_h200_trees_where_their_records_agree(tmp_path, monkeypatch, h200_kernels, fitted):
    # one recorded row per GPU, at 64 x 333 x 4097; the H200's tree gives SPLIT at 100 x 333 x 1001
    shipped = {"H100": _records(tmp_path / "h100.json.gz", NVJET["kernels"], {"algoId": 66}),
               "H200": _records(tmp_path / "h200.json.gz", h200_kernels, SPLIT["calls"][0]["algo"]
                                if h200_kernels == SPLIT["kernels"] else {"algoId": 66})}
    _fit(tmp_path, "cublas_fit_h200.json.gz")
    row, source = _lookup(monkeypatch, tmp_path, shipped, shipped["H100"])
    assert source == "nearest" and bool(row.get("fitted")) == fitted
    assert row["kernels"] == (SPLIT["kernels"] if fitted else NVJET["kernels"])


NVJET_SPLIT = {"kernels": ["nvjet_sm90_tst_128x128_64x4_1x2_h_bz_splitK_NNT", "splitKreduce_kernel"],
               "calls": [{"algo": {"algoId": 66, "numSplitsK": 6, "reductionScheme": "COMPUTE_TYPE"}}]}


def _translation(tmp_path, delta):
    """A split-K translation of one leaf: the donor's count plus ``delta``."""
    with gzip.open(tmp_path / "cublas_fit_h100_from_h200.json.gz", "wt") as f:
        json.dump({"header": {"gpu": "NVIDIA H100", "sms": 132, "features": list(F.SPLIT_FEATURES)},
                   "forest": {"classes": [delta], "trees": [{"feature": [-1], "threshold": [0.0], "right": [-1],
                                                             "leaf": [0]}]}}, f)


@pytest.mark.parametrize("h200_algo, delta, want", [
    ({"algoId": 66}, -2, NVJET_SPLIT),  # the records agree at the nearest row: the H200's answer
    (NVJET_SPLIT["calls"][0]["algo"], -2, 4),  # they differ: its split count translated, 6 - 2
    (NVJET_SPLIT["calls"][0]["algo"], -5, NVJET),  # 6 - 5: the fit's nvjet template without split-K
    (NVJET_SPLIT["calls"][0]["algo"], 1, 7)])
def test_h100_translates_the_h200_split_count_where_their_records_differ(tmp_path, monkeypatch, h200_algo, delta,
                                                                         want):
    # one recorded row per GPU, at 64 x 333 x 4097, nvjet on both, split 6 ways on the H200 or not;
    # the H200's forest gives nvjet split 6 ways at 100 x 333 x 1001
    shipped = {"H100": _records(tmp_path / "h100.json.gz", NVJET["kernels"], {"algoId": 66}),
               "H200": _records(tmp_path / "h200.json.gz", NVJET_SPLIT["kernels"] if len(h200_algo) > 1
                                else NVJET["kernels"], h200_algo)}
    _write(tmp_path, "cublas_fit_h200.json.gz", [{"classes": [0], "trees": [
        {"feature": [-1], "threshold": [0.0], "right": [-1], "leaf": [0]}]}], [NVJET_SPLIT, NVJET])
    _translation(tmp_path, delta)
    row, source = _lookup(monkeypatch, tmp_path, shipped, shipped["H100"])
    assert source == "nearest" and row["fitted"] and (row["M"], row["N"], row["K"]) == (100, 333, 1001)
    if isinstance(want, int):
        assert row["kernels"] == NVJET_SPLIT["kernels"] and R.algo(row)["numSplitsK"] == want
        assert NVJET_SPLIT["calls"][0]["algo"]["numSplitsK"] == 6  # the template is not changed
    else:
        assert {k: row[k] for k in ("kernels", "calls")} == want


@pytest.mark.parametrize("header, fitted", [({"gpu": "h200.json.gz"}, True),
                                             ({"gpu": "h200.json.gz", "cublaslt": 120900}, False),
                                             ({"gpu": "NVIDIA A100"}, False)])
def test_own_records_of_a_shipped_gpu_and_library_take_its_forests(tmp_path, monkeypatch, header, fitted):
    # a file of tcemu.record made on the H200 with the shipped torch and cuBLASLt (the header's
    # GPU, SMs, torch, cuBLASLt): the shipped forests answer the shapes it does not hold
    shipped = {"H200": _records(tmp_path / "h200.json.gz", NVJET["kernels"], {"algoId": 66})}
    mine = _records(tmp_path / "mine.json.gz", NVJET["kernels"], {"algoId": 66}, header)
    _fit(tmp_path, "cublas_fit_h200.json.gz")
    row, source = _lookup(monkeypatch, tmp_path, shipped, mine)
    assert source == "nearest" and bool(row.get("fitted")) == fitted
    assert row["kernels"] == (SPLIT["kernels"] if fitted else NVJET["kernels"])


def test_translation_files_name_their_features(tmp_path):
    fit = F.load_splits(str(R.DATA / "cublas_fit_h100_from_h200.json.gz"))
    assert fit["header"]["features"] == list(F.SPLIT_FEATURES) and fit["header"]["donor"] == "NVIDIA H200"
    assert F.translation_path(str(R.SHIPPED["H100"]), R.SHIPPED, R.FIT_FROM) == \
        str(R.DATA / "cublas_fit_h100_from_h200.json.gz")
    assert F.translation_path(str(R.SHIPPED["H200"]), R.SHIPPED, R.FIT_FROM) is None
    _translation(tmp_path, 0)
    with gzip.open(tmp_path / "cublas_fit_h100_from_h200.json.gz", "rt") as f:
        data = json.load(f)
    data["header"]["features"] = list(F.FEATURES)
    with gzip.open(tmp_path / "old.json.gz", "wt") as f:
        json.dump(data, f)
    with pytest.raises(ValueError, match="not a split-K translation on library_fit.SPLIT_FEATURES"):
        F.load_splits(str(tmp_path / "old.json.gz"))


def test_split_features_by_hand():
    cls = ("torch._scaled_mm", False, "e4m3", "e4m3", "f32", (("scaling", "row"), ("use_fast_accum", True)), 8)
    x = dict(zip(F.SPLIT_FEATURES, F.split_features(cls, 64, 512, 1000, None, 3, 132).tolist()))
    assert x["K / donor's split-K count"] == float(np.float32(1000 / 3)) and x["k-tiles of 64 a donor's slice"] == 6
    assert (x["library"], x["input type"], x["output type"]) == (1, 2, 4)
    assert (x["fast accumulation"], x["row-wise scales"], x["bias"], x["C row"]) == (1, 1, 0, 0)
    assert F.split_features(cls, 64, 512, 1000, None, 3, 132)[:len(F.FEATURES)].tolist() == \
        F.features(64, 512, 1000, None, 8, 132).tolist()


def test_every_shipped_class_has_a_forest():
    fit = F.load(str(R.DATA / "cublas_fit_h200.json.gz"))
    classes = {F.group_key(c) for c in R._by_class(str(R.SHIPPED["H200"]))}
    assert classes <= set(fit["groups"]) and len(fit["forests"]) == max(fit["groups"].values()) + 1
    for forest in fit["forests"]:
        assert forest["trees"] and all(0 <= c < len(fit["templates"]) for c in forest["classes"])
        for t in forest["trees"]:
            inner = {i for i, r in enumerate(t["right"]) if r >= 0}
            assert all(t["leaf"][i] == -1 and t["right"][i] > i + 1 and 0 <= t["feature"][i] < len(F.FEATURES)
                       for i in inner)
            assert all(0 <= t["leaf"][i] < len(forest["classes"]) for i in range(len(t["leaf"])) if i not in inner)


@pytest.mark.parametrize("name, want", [
    # every 20th case of sets recorded on the H200 after stop 55's forests were frozen (5f44699):
    # 2500 random shapes, 2000 with K or N off a multiple of 8; held out for those forests,
    # development for stop 56's refit (measured on them, never fitted on since); the measured
    # counts of these samples with stop 58's forests (every case: experiments/hardware/README.md)
    ("cublas_records_h200_random20261222.json.gz",
     {"recorded": (14, 14), "rule": (541, 546), "nearest": (3038, 3155)}),
    ("cublas_records_h200_unaligned20261223.json.gz",
     {"recorded": (0, 0), "rule": (138, 142), "nearest": (2304, 2452)}),
    # recorded after stop 56's refit was frozen (f6fba64): held out for it; never fitted on since
    ("cublas_records_h200_random20261310.json.gz",
     {"recorded": (7, 7), "rule": (565, 566), "nearest": (3022, 3164)}),
    ("cublas_records_h200_unaligned20261311.json.gz",
     {"recorded": (0, 0), "rule": (147, 151), "nearest": (2302, 2443)}),
    # recorded after stop 57's refit was frozen (f84ff87): held out for it; never fitted on since
    ("cublas_records_h200_random20261700-03.json.gz",
     {"recorded": (5, 5), "rule": (624, 634), "nearest": (3044, 3101)}),
    ("cublas_records_h200_unaligned20261710-13.json.gz",
     {"recorded": (0, 0), "rule": (158, 163), "nearest": (2317, 2434)}),
    # held out: recorded on the H200 after stop 58's refit was frozen (42e1b5e), 2500 random shapes
    # and 2000 with K or N off a multiple of 8
    ("cublas_records_h200_random20262000-03.json.gz",
     {"recorded": (22, 22), "rule": (525, 533), "nearest": (3077, 3181)}),
    ("cublas_records_h200_unaligned20262010-13.json.gz",
     {"recorded": (1, 1), "rule": (166, 173), "nearest": (2267, 2424)}),
])
def test_held_out_random_shapes(tmp_path, name, want):
    with gzip.open(DATA / name, "rt") as f:
        data = json.load(f)
    data["cases"] = data["cases"][::20]
    path = tmp_path / name
    with gzip.open(path, "wt") as f:
        json.dump(data, f)
    res = check_offgrid(str(path), str(R.SHIPPED["H200"]), False)
    got = {s: (res[(s, True)], res[(s, True)] + res[(s, False)]) for s in R.SOURCES}
    assert got == want


def test_h100_captured_shapes_with_the_h200_trees(monkeypatch):
    # every 12th row of the H100's records at captured shapes (bits reproduced by the recorded
    # rows), each looked up without the captured shapes; the trees and the split-K translation
    # were fitted without them (80 of 109 "nearest" before the translation, 89 with stop 57's forests)
    rows = captured_rows("H100")[::12]
    own = records_without(str(R.SHIPPED["H100"]), {(r["lib"], r["batch"], r["M"], r["N"], r["K"]) for r in rows})
    with shipped_as("H100", own):
        res = check_offgrid(own, own, False, rows)
        got = {s: (res[(s, True)], res[(s, True)] + res[(s, False)]) for s in ("rule", "nearest")}
        assert got == {"rule": (121, 121), "nearest": (88, 109)}
        monkeypatch.setattr(R, "FIT_FROM", {})  # the nearest row alone
        res = check_offgrid(own, own, False, rows)
        got = {s: (res[(s, True)], res[(s, True)] + res[(s, False)]) for s in ("rule", "nearest")}
        assert got == {"rule": (121, 121), "nearest": (56, 109)}
    assert str(R.SHIPPED["H100"]) != own
