"""Derive linear-layout bases from the one-hot wmma capture and print them as Python literals.

    python experiments/hardware/derive_layouts.py tests/data/wmma_layouts_sm90.npz

Every table measured on the H200 is linear over GF(2): each bit of the lane index and of the
value index (register * elements_per_register + slot) moves the element by a fixed (row, col)
offset, (0, 0) for replicated copies. The output is what ``tcemu/_src/layouts/wmma.py`` holds
for sm_75+ (``SM75``); the test suite re-checks it against every captured table.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tcemu._src.isa import wmma_spec as S  # noqa: E402


def bases_of(table: np.ndarray, cols: int, f64: bool):
    """table (32, nregs, slots) of element indices -> (lane_bases, value_bases) or None."""
    t = table.reshape(32, -1)
    if f64:
        t = t[:, ::2] // 2
    r, c = t // cols, t % cols
    nv = t.shape[1]
    vb = [(int(r[0, 1 << i] ^ r[0, 0]), int(c[0, 1 << i] ^ c[0, 0])) for i in range(nv.bit_length() - 1)]
    lb = [(int(r[1 << i, 0] ^ r[0, 0]), int(c[1 << i, 0] ^ c[0, 0])) for i in range(5)]
    for lane in range(32):
        for v in range(nv):
            rr, cc = r[0, 0], c[0, 0]
            for i, (dr, dc) in enumerate(lb):
                if lane >> i & 1:
                    rr, cc = rr ^ dr, cc ^ dc
            for i, (dr, dc) in enumerate(vb):
                if v >> i & 1:
                    rr, cc = rr ^ dr, cc ^ dc
            if (rr, cc) != (r[lane, v], c[lane, v]):
                return None
    assert (r[0, 0], c[0, 0]) == (0, 0)
    return tuple(lb), tuple(vb)


def main(path):
    z = np.load(path)
    found = {}
    for key in sorted(z.files):
        if not key.endswith(".table"):
            continue
        parts = key.split(".")
        if parts[0] == "ld":
            _, mat, lay, shape, et, _ = parts
        else:
            _, lay, shape, et, _ = parts
            mat = "c"
        rows, cols = S.matrix_dims(shape, mat)
        b = bases_of(z[key], cols, et == "f64")
        if b is None:
            raise SystemExit(f"{key}: not a linear layout")
        found.setdefault((shape, mat, et), set()).add(b)
    for (shape, mat, et), bs in sorted(found.items()):
        assert len(bs) == 1, f"{shape} {mat} {et}: .row/.col or load/store fragments differ"
        lb, vb = next(iter(bs))
        print(f'    ("{shape}", "{mat}", "{et}"): (\n        {lb},\n        {vb}),')


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("capture", nargs="?", default=str(Path(__file__).resolve().parents[2] / "tests" / "data"
                                                       / "wmma_layouts_sm90.npz"),
                    help="the one-hot wmma layout capture (default: tests/data/wmma_layouts_sm90.npz)")
    main(ap.parse_args().capture)
