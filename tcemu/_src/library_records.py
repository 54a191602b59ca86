"""cuBLAS's recorded kernel choices (``tcemu.record``) as GEMM configurations.

A record row says which cuBLASLt algorithm PyTorch ran for one shape, types and flags, and which
kernels that launched. Each kernel family has one K schedule (measured on the H100 captures,
``experiments/hardware/README.md``), so the row gives the configuration:

* nvjet kernels (Hopper ``wgmma``; k16 HMMA numerics for f16/bf16, the fp8 ``wgmma`` for fp8):
  one chain in k-tiles (the kernel name's ``_<tile>_<k-tile>x<stages>_``: 64 for 16-bit inputs,
  128 for fp8), residue last; with ``numSplitsK`` = S > 1 (``..._splitK_...`` +
  ``splitKreduce_kernel``) S slices aligned to the k-tiles, float32 partials added in order.
* CUTLASS 2 kernels (``cutlass_75_tensorop_*s1688*``: k8 numerics; ``cutlass_80_tensorop_*s16816*``
  and ``*wmma*s161616*``: k16): the partial k-tile first (the k-tile of the kernel's name,
  ``_<M>x<N>_<K>x<stages>_``, else 32 for the s1688 kernels); split-K slices of
  ``ceil(K / S)`` rounded up to 16 bytes, reduced by ``splitKreduce_kernel`` in float32
  (``COMPUTE_TYPE``) or with the partials rounded to the output type (``OUTPUT_TYPE``); the
  ``INPLACE`` scheme (serial split-K: each slice adds its partial onto the previous slices'
  output, rounded to the output type each time) is :data:`SERIAL`.
* ``sm90_xmma`` kernels (cuBLASLt's Hopper kernels for K or N off a multiple of 8, split-K
  off): one chain of 64-wide k-tiles, residue last.
* ``gemmSN`` kernels (M = 8 with K or N off a multiple of 8): float32 FMAs on the CUDA cores,
  not the tensor core: not emulated (:class:`NotEmulated`).

A shape the records do not hold is answered by the rule of :func:`lookup`.
"""
from __future__ import annotations

import copy
import functools
import gzip
import json
import math
import re
from pathlib import Path

from tcemu._src import library_fit
from tcemu._src.gemm import GemmConfig, KSchedule
from tcemu._src.library import cutlass2_schedule, nvjet_schedule

DATA = Path(__file__).parent / "data"
# the records shipped per GPU (the H200's differ from the H100's in 18,398 of 119,566 cases: split-K
# counts and kernels; the H200's also hold 120,400 cases at 4000 random shapes, "offgrid"); another
# GPU: record it with tcemu.record
SHIPPED = {"H100": DATA / "cublas_records_h100.json.gz", "H200": DATA / "cublas_records_h200.json.gz"}
# a GPU whose shipped records have no fit of their own takes another's, with the split-K count of a
# translation fitted on both GPUs' records where they differ around the shape: the H100 (no random
# shapes recorded on one) the H200's (the same GH100 chip and 132 SMs, the same cuBLAS; measured in
# experiments/hardware/README.md)
FIT_FROM = {"H100": "H200"}
# a record file made on a shipped GPU with the shipped records' torch and cuBLASLt takes their fit
TWIN = ("gpu", "sms", "torch", "cublaslt")
SOURCES = ("recorded", "rule", "nearest")
SERIAL = "INPLACE"


class NotEmulated(ValueError):
    """cuBLAS runs a kernel here whose arithmetic tcemu does not emulate (CUDA-core FMAs)."""


def family(kernels) -> str:
    """"nvjet", "cutlass_k8", "cutlass_k16", "xmma", "simt" or "other" from the kernel names."""
    names = " ".join(kernels)
    if "nvjet" in names:
        return "nvjet"
    if "s1688" in names:
        return "cutlass_k8"
    if "s16816" in names or "wmma" in names:
        return "cutlass_k16"
    if "_xmma_gemm" in names:
        return "xmma"
    if "gemmSN" in names or "gemv" in names.lower():
        return "simt"
    return "other"


def _nvjet_k_tile(kernels) -> int:
    m = re.search(r"nvjet_sm\d+_\w+?_\d+x\d+_(\d+)x\d+_", " ".join(kernels))
    return int(m.group(1)) if m else 64


def _cutlass_k_tile(kernels) -> int:
    """A CUTLASS 2 kernel's k-tile: its name's ``_<M>x<N>_<K>x<stages>_`` (``..._32x32_128x1_...``),
    else 32 (the ``cutlass_75_tensorop_*s1688gemm_<M>x<N>_*`` kernels, measured)."""
    m = re.search(r"cutlass_\w+?_\d+x\d+_(\d+)x\d+_", " ".join(kernels))
    return int(m.group(1)) if m else 32


def algo(row: dict) -> dict:
    """The algorithm of a record row's (last) cuBLASLt call."""
    return row["calls"][-1]["algo"] if row.get("calls") else {}


def row_schedule(row: dict, K: int | None = None) -> tuple[str, KSchedule]:
    """(the instruction's k numerics "k8"/"k16"/"wgmma", the K schedule) of a record row's
    kernel and algorithm at depth ``K`` (default: the row's own)."""
    fam, al = family(row["kernels"]), algo(row)
    S, scheme = int(al.get("numSplitsK", 1)), al.get("reductionScheme", "NONE")
    if fam == "simt":
        raise NotEmulated(f"library_config: cuBLAS runs {row['kernels'][0].split('<')[0]} (float32 FMAs on the CUDA "
                          f"cores, not the tensor core) for {row['lib']} {row['M']}x{row['N']}x{row['K']}: not emulated")
    if fam == "other":
        raise NotEmulated(f"library_config: the recorded kernel {row['kernels'][:1]} is of no family tcemu knows")
    if fam == "nvjet":
        sched = nvjet_schedule(S, _nvjet_k_tile(row["kernels"]))
        if S > 1 and scheme == SERIAL and row["out"] != "f32":
            sched = sched.replace(reduction="serial", partials=row["out"])
        return ("wgmma" if row["a"] in ("e4m3", "e5m2") else "k16"), sched
    if fam == "xmma":
        return "k16", KSchedule()
    partials = row["out"] if scheme in ("OUTPUT_TYPE", SERIAL) and row["out"] != "f32" else "f32"
    return ("k8" if fam == "cutlass_k8" else "k16"), cutlass2_schedule(
        row["K"] if K is None else K, row["a"], row["b"], k_tile=_cutlass_k_tile(row["kernels"]), slices=S,
        partials=partials, reduction="serial" if scheme == SERIAL else "sequential")


def row_config(row: dict, gpu: str, base: GemmConfig | None = None, K: int | None = None) -> GemmConfig:
    """A record row's configuration at depth ``K`` (default: the row's own); ``base`` (the fp8
    ``_scaled_mm`` configuration: its instruction and promotion) keeps its instruction and
    promotion."""
    k, sched = row_schedule(row, K)
    if row["a"] in ("e4m3", "e5m2"):
        promo = base.schedule.promotion if base is not None else 0
        return GemmConfig(arch=gpu, instruction=base.instruction if base is not None else
                          f"wgmma.mma_async.sync.aligned.m64n8k32.f32.{row['a']}.{row['b']}",
                          schedule=sched.replace(promotion=promo) if promo else sched)
    return GemmConfig(arch=gpu, instruction=f"m16n8k{k[1:]}.f32.{row['a']}.{row['b']}.f32", schedule=sched)


@functools.lru_cache(maxsize=8)
def load(path: str) -> tuple[dict, dict]:
    """(header, rows by key) of a record file (:func:`tcemu.record`)."""
    try:
        with gzip.open(path, "rt") as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"library_config: records={path!r} is not a record file of tcemu.record ({e})") from None
    if not isinstance(data, dict) or "header" not in data or "cases" not in data:
        raise ValueError(f"library_config: records={path!r} is not a record file of tcemu.record")
    return data["header"], {key(r): r for r in data["cases"] if r.get("calls") and r.get("kernels")}


def key(row: dict) -> tuple:
    return (row["lib"], row["batch"] or None, row["M"], row["N"], row["K"], row["a"], row["b"], row["out"],
            tuple(sorted(row["flags"].items())))


def _class(row_or_args) -> tuple:
    """Rows a shape may be compared with: same library, batch or not, types, flags, and the
    alignment of K and N (the elements, up to 8, every leading dimension is a multiple of)."""
    lib, batch, M, N, K, a, b, out, flags = row_or_args
    g = math.gcd(K, N)
    return lib, bool(batch), a, b, out, flags, min(8, g & -g)


@functools.lru_cache(maxsize=8)
def _by_class(path: str) -> dict:
    out = {}
    for k, r in load(path)[1].items():
        out.setdefault(_class(k), []).append(r)
    return out


@functools.lru_cache(maxsize=8)
def _grid_by_class(path: str) -> dict:
    """:func:`_by_class` without the off-grid rows (those make no grid cell)."""
    return {c: [r for r in rows if not r.get("offgrid")] for c, rows in _by_class(path).items()}


def _form(row, K: int | None = None) -> tuple:
    """What decides a row's bits at depth ``K`` (default: the row's own): (the instruction's k,
    the K schedule); ("simt",) where tcemu does not emulate the kernel."""
    try:
        return row_schedule(row, K)
    except NotEmulated:
        return ("simt",)


def lookup(path: str, lib: str, batch, M: int, N: int, K: int, a: str, b: str, out: str, flags: dict):
    """(row, source) for a case from a record file. "recorded": the record of this very case.
    "rule": the rows at the 8 corners of a recorded grid cell around the shape, in its class
    (:func:`_class`; :func:`_corners`), all give the nearest grid row's instruction and K
    schedule: that one. "nearest": otherwise, for the shipped records (and records made on a
    shipped GPU with their torch and cuBLASLt: :func:`_shipped_twin`), the kernel and algorithm
    the random forest fitted on them gives (:mod:`~tcemu._src.library_fit`; the row returned is
    marked ``"fitted": true``); a GPU of :data:`FIT_FROM` takes the other GPU's forest, with its
    split-K count translated where the two GPUs' records differ around the shape (:func:`_fitted`).
    Otherwise, and for other records, the
    row at the least ``|log2 M/M'| + |log2 N/N'| + |log2 K/K'|`` (batch too) of its class,
    off-grid rows included (``"offgrid": true``: shapes recorded at random, which make no grid
    cells). None when the class has no rows."""
    k = (lib, batch or None, M, N, K, a, b, out, tuple(sorted(flags.items())))
    rows = load(path)[1]
    if k in rows:
        return rows[k], "recorded"
    cands = _by_class(path).get(_class(k), [])
    if not cands:
        return None, None

    def dist(r):
        d = sum(abs(math.log2(v / r[n])) for n, v in (("M", M), ("N", N), ("K", K)))
        return d + (abs(math.log2((batch or 1) / (r["batch"] or 1))))

    def nearest(rows):
        return min(rows, key=lambda r: (dist(r), r["M"] * r["N"] * r["K"]))

    cell = _corners(path, _class(k), M, N, K, batch) or []
    forms = {_form(r, K) for r in cell}
    if len(forms) == 1:
        best = nearest(_grid_by_class(path)[_class(k)])
        if forms == {_form(best, K)}:
            return best, "rule"
    near = functools.cache(lambda: nearest(cands))
    return _fitted(path, k, cell, near) or near(), "nearest"


def _fitted(path: str, k: tuple, cell: list, near) -> dict | None:
    """The row the fitted forest gives case ``k`` (marked ``"fitted": true``), or None: the records
    at ``path`` have no fit or its class no forest. The fit of another GPU (:data:`FIT_FROM`) is
    taken as it is where that GPU's records hold, with their forms at the case's K, the rows at
    the 8 corners of the grid cell around the shape (``cell``: :func:`_corners`), or where there
    is none the nearest row (``near()``); else
    with its nvjet split-K count translated to this GPU's (:func:`_translated`)."""
    lib, batch, M, N, K, a, b, out, flags = k
    shipped = _shipped_twin(path)
    fit, donor = library_fit.fitted_path(shipped, SHIPPED, FIT_FROM)
    template = fit and library_fit.predict(fit, _class(k), M, N, K, batch)
    if not template:
        return None
    row = dict(template, lib=lib, batch=batch, M=M, N=N, K=K, a=a, b=b, out=out, flags=dict(flags), fitted=True)
    if not donor or all(_agrees(donor, r, K) for r in cell or [near()]):
        return row
    return _translated(shipped, fit, row, k)


def _shipped_twin(path: str) -> str:
    """The shipped records file of the GPU the records at ``path`` were made on, where their
    header names it with the same torch and cuBLASLt (:data:`TWIN`: the same heuristic), else
    ``path``."""
    if path in {str(p) for p in SHIPPED.values()}:
        return path
    mine = header(path)
    return next((str(p) for p in SHIPPED.values()
                 if p.exists() and all(mine.get(f) == header(str(p)).get(f) for f in TWIN)), path)


def _translated(path: str, fit: str, row: dict, k: tuple) -> dict | None:
    """A donor's fitted ``row`` with the split-K count the translation of ``path``'s GPU gives
    (:func:`library_fit.splits`; nvjet kernels splitting K: the two GPUs' records differ in nothing
    else); no split: the first of the fit's nvjet templates without split-K of the same k-tile
    and C handling. None where no translation ships (then the nearest row answers)."""
    tr = library_fit.translation_path(path, SHIPPED, FIT_FROM)
    S = int(algo(row).get("numSplitsK", 1))
    if tr is None or family(row["kernels"]) != "nvjet" or S == 1:
        return row if tr else None
    S1 = library_fit.splits(tr, _class(k), k[2], k[3], k[4], k[1], S)
    if S1 > 1:
        out = copy.deepcopy(row)
        out["calls"][-1]["algo"]["numSplitsK"] = S1
        return out
    tile, badd = _nvjet_k_tile(row["kernels"]), "_badd_" in " ".join(row["kernels"])
    template = next((t for t in library_fit.load(fit)["templates"] if family(t["kernels"]) == "nvjet"
                     and int(algo(t).get("numSplitsK", 1)) == 1 and _nvjet_k_tile(t["kernels"]) == tile
                     and ("_badd_" in " ".join(t["kernels"])) == badd), None)
    return template and dict(row, **copy.deepcopy({k: template[k] for k in ("kernels", "calls")}))


def _agrees(donor: str, row: dict, K: int) -> bool:
    """Whether the records at ``donor`` (another GPU's) hold ``row``'s case with its form at ``K``."""
    other = load(donor)[1].get(key(row))
    return other is not None and _form(other, K) == _form(row, K)


@functools.lru_cache(maxsize=256)
def _cell_index(path: str, cls: tuple, batch) -> tuple[dict, dict, tuple]:
    """(rows by (M, N, K), the recorded K by (M, N), the sorted recorded M, N and K) of a class's
    grid rows of one batch."""
    same = [r for r in _grid_by_class(path).get(cls, []) if (r["batch"] or None) == batch]
    ks = {}
    for r in same:
        ks.setdefault((r["M"], r["N"]), set()).add(r["K"])
    return ({(r["M"], r["N"], r["K"]): r for r in same}, ks,
            tuple(sorted({r[n] for r in same}) for n in "MNK"))


def _corners(path: str, cls: tuple, M, N, K, batch):
    """The rows at the 8 corners of the smallest recorded grid cell holding (M, N, K) (same
    batch): on each axis one of the 4 nearest recorded values at or below the shape's and one of
    the 4 at or above, all 8 corners recorded; None when there is no such cell. The smallest:
    the least sum of the axes' log2(upper / lower); of equal sums, the first in the order of M's
    pairs, then N's, then K's, each axis's pairs by their difference."""
    at, ks, values = _cell_index(path, cls, batch or None)
    axes = []
    for vals, v in zip(values, (M, N, K)):
        lo, hi = [x for x in vals if x <= v][::-1][:4], [x for x in vals if x >= v][:4]
        if not lo or not hi:
            return None
        axes.append([(math.log2(b / a), a, b) for a, b in sorted(((a, b) for a in lo for b in hi),
                                                                  key=lambda ab: ab[1] - ab[0])])
    best, none = None, set()
    for i, (wm, m0, m1) in enumerate(axes[0]):
        for j, (wn, n0, n1) in enumerate(axes[1]):
            both = (ks.get((m0, n0), none) & ks.get((m0, n1), none) & ks.get((m1, n0), none)
                    & ks.get((m1, n1), none))
            for k, (wk, k0, k1) in enumerate(axes[2]) if both else ():
                if k0 in both and k1 in both and (best is None or (wm + wn + wk, i, j, k) < best[0]):
                    best = (wm + wn + wk, i, j, k), (m0, m1, n0, n1, k0, k1)
    if best is None:
        return None
    m0, m1, n0, n1, k0, k1 = best[1]
    return [at[(m, n, k)] for m in (m0, m1) for n in (n0, n1) for k in (k0, k1)]


def zero_workspace(env: dict) -> bool:
    """Whether torch's environment (a record header's ``env``) gives cuBLAS no workspace: both
    ``CUBLAS_WORKSPACE_CONFIG`` (``:SIZE:COUNT`` pairs, KiB) and ``CUBLASLT_WORKSPACE_SIZE``
    (KiB) zero, the setting measured.

    >>> zero_workspace({"CUBLAS_WORKSPACE_CONFIG": ":0:0", "CUBLASLT_WORKSPACE_SIZE": "0"})
    True
    >>> zero_workspace({"CUBLAS_WORKSPACE_CONFIG": ":4096:8"})
    False
    """
    pairs = str(env.get("CUBLAS_WORKSPACE_CONFIG", "")).strip(":").split(":")
    try:
        sizes = [int(pairs[i]) * int(pairs[i + 1]) for i in range(0, len(pairs) - 1, 2)]
    except ValueError:
        return False
    return bool(sizes) and not any(sizes) and str(env.get("CUBLASLT_WORKSPACE_SIZE", "")).strip() == "0"


@functools.lru_cache(maxsize=8)
def header(path: str) -> dict:
    """The header of the record file at ``path``."""
    return load(path)[0]


def records_path(records, arch, gpu: str):
    """The record file ``library_config`` reads: ``records`` None (the file shipped for ``gpu``,
    if any), False (none) or a path (a file of :func:`tcemu.record` made on a GPU whose name
    holds ``arch`` as a word)."""
    if records is None:
        p = SHIPPED.get(gpu)
        return str(p) if p is not None and p.exists() else None
    if records is False:
        return None
    if not isinstance(records, (str, Path)):
        raise TypeError(f"library_config: records must be a path to a file of tcemu.record, None (the records "
                        f"shipped for {', '.join(SHIPPED)}) or False (none), got {records!r}")
    if not Path(records).is_file():
        raise ValueError(f"library_config: records={str(records)!r} is not a file (write one with tcemu.record)")
    made_on = header(str(records)).get("gpu")
    words = re.split(r"[^A-Z0-9]+", str(made_on or "").upper())
    if gpu not in words:
        raise ValueError(f"library_config: records={str(records)!r} were made on {made_on!r}, not on "
                         f"arch={arch!r}")
    return str(records)


def answer(path: str, lib: str, gpu: str, M, N, K, a, b, out, batch, flags, base=None):
    """(config, source, record row) from the records at ``path`` (:func:`lookup`), or None
    where they hold no row of the case's class or the nearest row's kernel is not emulated. A
    recorded case whose kernel tcemu does not emulate raises :class:`NotEmulated`."""
    row, source = lookup(path, lib, batch, M, N, K, a, b, out, flags)
    if row is None:
        return None
    if algo(row).get("reductionScheme") == SERIAL and lib == "torch._scaled_mm":
        source = "nearest"  # serial split-K with fp8 scales: not seen on the GPUs, not measured
    try:
        return row_config(row, gpu, base, K), source, row
    except NotEmulated:
        if source == "recorded":
            raise
        return None
