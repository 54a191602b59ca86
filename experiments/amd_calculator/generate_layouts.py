"""Register layouts of every CDNA1/2/3 MFMA from AMD's Matrix Instruction Calculator, as test data.

Runs the calculator's gfx9 layout function (``InstCalcGfx9._get_reg_lanes``, the one behind its
``--get-register`` / ``--register-layout`` output) for every element of A, B, C and D of every
dense MFMA of cdna1 (gfx908), cdna2 (gfx90a) and cdna3 (gfx942), with every legal CBSZ/ABID pair
on A and every BLGP on B where the calculator says the instruction takes them (CDNA3 f64 reads
BLGP as negate bits, not a lane pattern: not a layout, not stored), and checks the last element
of every entry against the calculator's command line (``--get-register``). Writes
tests/data/mfma_layouts_calculator.npz:

- ``keys``: "arch spelling matrix cbsz abid blgp" per entry (spelling as the calculator lists it)
- ``shape``: (blocks, rows, cols) per entry; A is (B, M, K), B (B, K, N), C/D (B, M, N)
- ``start``: offset of the entry in ``loc``
- ``loc``: uint8 (total, 3): (lane, first VGPR, low bit) of every element, block-major row-major

Usage: python generate_layouts.py /path/to/matrix_calculator.py [out.npz]
"""
import importlib.util
import re
import sys
from pathlib import Path

import numpy as np

ARCHS = {"cdna1": "gfx908", "cdna2": "gfx90a", "cdna3": "gfx942"}
_REG = re.compile(r"v(?:\[(\d+):(\d+)\]|(\d+))(?:\.\[(\d+):(\d+)\])?$")


def _parse_reg(reg):
    m = _REG.match(reg)
    if not m:
        raise ValueError(reg)
    first = int(m[2]) if m[2] is not None else int(m[3])
    return first, int(m[5]) if m[5] is not None else 0


def _entry(calc, info, matrix, cbsz, abid, blgp):
    B, M, N, K = info["blocks"], info["m"], info["n"], info["k"]
    rows, cols = {"a": (M, K), "b": (K, N), "c": (M, N), "d": (M, N)}[matrix]
    out = np.zeros((B, rows, cols, 3), np.uint8)
    for b in range(B):
        for r in range(rows):
            for c in range(cols):
                i, j, k = {"a": (r, 0, c), "b": (0, c, r)}.get(matrix, (r, c, 0))
                _, reg, lanes = calc._get_reg_lanes(matrix, i, j, k, b, cbsz, abid, blgp, 0)
                assert len(lanes) == 1, (matrix, reg, lanes)
                out[b, r, c] = (lanes[0], *_parse_reg(reg))
    return (B, rows, cols), out.reshape(-1, 3)


_CLI = re.compile(r"= (v[^{]*)\{(\d+)\}(\.\[\d+:\d+\])?")


def _cli_check(mc, arch, name, matrix, cbsz, abid, blgp, shape, loc):
    """The last element of the entry through the calculator's command line (--get-register)."""
    import contextlib
    import io

    b, r, c = (s - 1 for s in shape)
    i, j, k = {"a": (r, 0, c), "b": (0, c, r)}.get(matrix, (r, c, 0))
    argv = ["matrix_calculator.py", "-a", arch, "-i", name, f"-{matrix.upper()}", "-g", "-I", str(i),
            "-J", str(j), "-K", str(k), "-b", str(b), "--cbsz", str(cbsz), "--abid", str(abid), "--blgp", str(blgp)]
    buf, old = io.StringIO(), sys.argv
    try:
        sys.argv = argv
        with contextlib.redirect_stdout(buf):
            mc.parse_and_run()
    finally:
        sys.argv = old
    m = _CLI.search(buf.getvalue())
    want = (int(m[2]), *_parse_reg(m[1] + (m[3] or "")))
    assert tuple(loc[-1]) == want, (" ".join(argv), buf.getvalue(), loc[-1])


def main(calculator, out):
    spec = importlib.util.spec_from_file_location("matrix_calculator", calculator)
    mc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mc)
    keys, shapes, starts, locs, total = [], [], [], [], 0
    for arch, gfx in ARCHS.items():
        for name, info in mc.dict_insts[arch].items():
            if info["sparse"]:  # v_smfmac: sparse A with a K index matrix, not covered here
                continue
            calc = mc.InstCalcGfx9(name, info, 64)
            mods = [("a", 0, 0, 0), ("b", 0, 0, 0), ("c", 0, 0, 0), ("d", 0, 0, 0)]
            if info["cbsz_abid"]:
                nb = info["blocks"].bit_length() - 1
                mods += [("a", cb, ab, 0) for cb in range(1, nb + 1) for ab in range(1 << cb)]
            if info["blgp"] and info["in_type"] != "fp64":
                mods += [("b", 0, 0, g) for g in range(1, 8)]
            for matrix, cbsz, abid, blgp in mods:
                shape, loc = _entry(calc, info, matrix, cbsz, abid, blgp)
                _cli_check(mc, arch, name, matrix, cbsz, abid, blgp, shape, loc)
                keys.append(f"{gfx} {name} {matrix} {cbsz} {abid} {blgp}")
                shapes.append(shape)
                starts.append(total)
                locs.append(loc)
                total += len(loc)
    np.savez_compressed(out, keys=np.array(keys), shape=np.array(shapes, np.int16),
                        start=np.array(starts, np.int32), loc=np.concatenate(locs))
    print(f"{len(keys)} entries, {total} elements -> {out}")


if __name__ == "__main__":
    default = Path(__file__).resolve().parents[2] / "tests/data/mfma_layouts_calculator.npz"
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else default)
