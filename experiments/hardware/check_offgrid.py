"""How often ``library_config``'s record lookup names cuBLAS's own choice at shapes it has no
record of: each case of a record file made at new shapes (``cublas_record.py --only random``) is
looked up in the shipped records (``library_records.lookup``) and its answer's form (the
instruction's k and the K schedule: what the bits follow, ``library_records._form``) compared
with the recorded one's. A recorded kernel's form reproduced every captured row it was checked
on (``check_records.py``), so the form is the bits here.

    python experiments/hardware/check_offgrid.py RANDOM.json.gz [--records SHIPPED.json.gz] [--exclude-own]
    python experiments/hardware/check_offgrid.py --captured H100 [--no-fit-from]

``--exclude-own``: drop the file's own shapes from the records first (a file that was merged into
them: what the lookup gives at shapes it has no record of; a GPU's shipped records keep their
forests). ``--captured GPU``: the rows of the GPU's shipped records at the captured shapes
(``fit_records.captured``: every torch capture's shapes, whose bits the recorded rows reproduce),
each looked up without the captures' shapes (``--exclude-own``); the forests were fitted without them.
``--no-fit-from``: without ``library_records.FIT_FROM`` (the H100 takes the nearest row). Prints the counts by source ("rule", "nearest")
and by kind of case (K and N multiples of 8 or not; split-K allowed or off; unrecorded shapes only).
Cases whose kernel tcemu does not emulate (``gemmSN``, CUDA cores) are counted apart, and so are
cases at a shape the records hold already ("recorded": a random shape met before).
"""
from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import math
import sys
import tempfile
from collections import Counter
from pathlib import Path
from unittest import mock

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1]))
from tcemu._src import library_records as R  # noqa: E402
from tcemu._src.library import shipped_gpu  # noqa: E402


def _kind(r) -> str:
    g = math.gcd(r["K"], r["N"])
    aligned = "K, N multiples of 8" if min(8, g & -g) == 8 else "K or N not"
    return f"{aligned}, {'split-K off' if r['flags'].get('allow_splitk') is False else 'default'}"


def records_without(records: str, shapes: set, fields=("lib", "batch", "M", "N", "K")) -> str:
    """A copy (in a new temporary folder, under the same name) of the record file ``records``
    without its rows whose ``fields`` are in ``shapes``."""
    with gzip.open(records, "rt") as f:
        data = json.load(f)
    data["cases"] = [r for r in data["cases"] if tuple(r[k] for k in fields) not in shapes]
    out = str(Path(tempfile.mkdtemp()) / Path(records).name)
    with gzip.open(out, "wt") as f:
        json.dump(data, f)
    return out


@contextlib.contextmanager
def shipped_as(gpu: str | None, records: str):
    """``records`` in the place of the GPU's shipped records (``library_records.SHIPPED``: the
    GPU's fit is kept) inside the block; nothing where ``gpu`` is None."""
    if gpu is None:
        yield
        return
    before = R.SHIPPED[gpu]
    R.SHIPPED[gpu] = Path(records)
    try:
        yield
    finally:
        R.SHIPPED[gpu] = before


@contextlib.contextmanager
def lookups(shipped: dict | None = None, fit_from: bool = True):
    """Inside the block: ``shipped`` ({GPU: records file}) in the place of those GPUs' shipped
    records (:func:`shipped_as`), and no ``library_records.FIT_FROM`` where ``fit_from`` is False."""
    with contextlib.ExitStack() as stack:
        for gpu, p in (shipped or {}).items():
            stack.enter_context(shipped_as(gpu, p))
        if not fit_from:
            stack.enter_context(mock.patch.dict(R.FIT_FROM, clear=True))
        yield


def check(path: str, records: str, exclude_own: bool, test=None) -> Counter:
    """Counts by (source or kind of case, right) of the rows of ``path`` (or the rows ``test``),
    each looked up in ``records``; ``exclude_own``: in a copy without the rows' shapes, in the place
    of the GPU's shipped records where ``records`` are those (:func:`shipped_as`)."""
    if test is None:
        with gzip.open(path, "rt") as f:
            test = [r for r in json.load(f)["cases"] if r.get("calls") and r.get("kernels")]
    gpu = None
    if exclude_own:
        gpu = next((g for g, p in R.SHIPPED.items() if str(p) == records), None)
        records = records_without(records, {(r["lib"], r["batch"], r["M"], r["N"], r["K"]) for r in test})
    with shipped_as(gpu, records):
        out = _count(test, records)
    if out[("recorded", True)] + out[("recorded", False)] > len(test) // 10:
        raise SystemExit(f"{path}: most shapes are recorded in {records}: not a check of unrecorded shapes "
                         "(--exclude-own?)")
    return out


def _count(test: list[dict], records: str) -> Counter:
    out = Counter()
    for r in test:
        if R.family(r["kernels"]) == "simt":
            out[("not emulated (gemmSN)", "")] += 1
            continue
        row, source = R.lookup(records, r["lib"], r["batch"], r["M"], r["N"], r["K"], r["a"], r["b"], r["out"],
                               r["flags"])
        if row is None:
            out[("no row of the class", "")] += 1
            continue
        ok = R._form(row, r["K"]) == R._form(r)
        out[(source, ok)] += 1
        if source != "recorded":  # a random shape may meet one recorded before: counted apart
            out[(_kind(r), ok)] += 1
    return out


def captured_rows(gpu: str) -> list[dict]:
    """The rows of the GPU's shipped records at captured shapes (``fit_records.captured``)."""
    from fit_records import captured
    own = captured(str(R.SHIPPED[gpu]))
    return [r for k, r in R.load(str(R.SHIPPED[gpu]))[1].items() if k in own]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("path", nargs="?")
    p.add_argument("--records", help="default: the shipped records of the file's GPU")
    p.add_argument("--exclude-own", action="store_true")
    p.add_argument("--captured", choices=sorted(R.SHIPPED), help="the shipped records' rows at captured shapes")
    p.add_argument("--no-fit-from", action="store_true")
    args = p.parse_args(argv)
    if (args.path is None) == (args.captured is None):
        p.error("give a records file or --captured GPU")
    test = None
    if args.captured:
        args.path, args.exclude_own, test = str(R.SHIPPED[args.captured]), True, captured_rows(args.captured)
    with gzip.open(args.path, "rt") as f:
        gpu = json.load(f)["header"]["gpu"]
    records = args.records or str(R.SHIPPED[shipped_gpu(gpu)])
    with lookups(fit_from=not args.no_fit_from):
        res = check(args.path, records, args.exclude_own, test)
    print(f"{args.path} ({gpu}) against {records}{' without its own shapes' if args.exclude_own else ''}\n")
    print("| answer / case | right | of | % |\n|---|---|---|---|")
    for what in sorted({k for k, _ in res}, key=str):
        if what in ("not emulated (gemmSN)", "no row of the class"):
            print(f"| {what} | | {res[(what, '')]} | |")
            continue
        right, n = res[(what, True)], res[(what, True)] + res[(what, False)]
        print(f"| {what} | {right} | {n} | {100 * right / n:.1f} |")


if __name__ == "__main__":
    main()
