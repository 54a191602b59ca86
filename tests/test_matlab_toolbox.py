"""tcemu's AMD MFMAs against the second peer model, the MATLAB tensor-core toolbox of Khattak and
Mikaitis (its MI100MC, MI250MC and MI300XMC models run under GNU Octave): tests/data/matlab_toolbox_amd.npz,
made by experiments/matlab_toolbox/ (its README has the table and the reading of every disagreement).

A case is one output element of an MFMA (a row of A, a column of B, C), with the toolbox's D and
MMA-Sim 2.1.1's: elements of tcemu's MMA-Sim vectors and the experiment's own inputs (K up to twice
the instruction's, chained as two instructions). Where the two peers agree, tcemu must give the
toolbox's bits. Where they do not, the data file names the cause (``explain``: the toolbox's
overflow handling, its quads for CDNA2 bf16 without ``_1k``, its 31-bit product sum under a larger
C, or an Octave error) and tcemu must give MMA-Sim's bits; each cause also has a minimal reproduction
here. NaN equals NaN (the peers' NaN payloads differ). CI runs the instruction of each CDNA3 type
that the own, multi-block cases use and CDNA2's bf16 without ``_1k``; ``TCEMU_ALL_VECTORS=1`` runs
every instruction.
"""
from __future__ import annotations

import functools
import json
import os

import ml_dtypes
import numpy as np
import pytest

import tcemu
from conftest import DATA
from tcemu._src.isa.mfma import parse_mfma

GFX = {"CDNA1": "gfx908", "CDNA2": "gfx90a", "CDNA3": "gfx942"}
ARCH = {"MI100": "gfx908", "MI250X": "gfx90a", "MI300X": "gfx942"}
VIEW = {"f16": np.float16, "bf16": ml_dtypes.bfloat16, "xf32": np.float32,
        "fp8": ml_dtypes.float8_e4m3fnuz, "bf8": ml_dtypes.float8_e5m2fnuz}
# every disagreement's cause, totalled over the data file (the README's table)
CAUSES = {"overflow": 276, "bf16_pairs_not_quads": 57, "product_sum_31_bits_below_c": 2, "octave_error": 6}


@functools.cache
def data():
    z = np.load(DATA / "matlab_toolbox_amd.npz")
    return json.loads(str(z["meta"])), {k: z[k] for k in z.files if k != "meta"}


def forms():
    meta, _ = data()
    out = {}
    for g in meta["groups"]:
        out.setdefault((g["gen"], g["suffix"]), []).append(g)
    return out


def _sample():
    """CI's: the instruction the own (multi-block) cases use, per CDNA3 type, and CDNA2's bf16
    without _1k (the only CDNA2 type with a disagreement other than overflow; CDNA2's forms take
    seconds each to trace)."""
    return sorted({(g["gen"], g["suffix"]) for gs in forms().values() for g in gs if g["source"].startswith("own:")
                   and (g["gen"] == "CDNA3" or (g["gen"], g["suffix"]) == ("CDNA2", "f32_16x16x8bf16"))})


def _params():
    every = os.environ.get("TCEMU_ALL_VECTORS") == "1"
    return sorted(forms()) if every else _sample()


def same(x, y):
    return (x == y) | (np.isnan(x.view(np.float32)) & np.isnan(y.view(np.float32)))


def batch(gen, suffix):
    """The batch (of the instruction's D) that holds every case of the instruction in the data file."""
    return -(-sum(g["n"] for g in forms()[(gen, suffix)]) // parse_mfma("v_mfma_" + suffix, GFX[gen]).m)


def run_tcemu(gen, suffix, t, a, b, c):
    """tcemu's D of each case (rows of a and b: K codes; c: binary32 bits). Cases sit on the
    diagonals of a batch of the instruction's D, as many as the instruction's cases in the data file
    need (so that any subset is the same shape, traced once); a case k blocks of the instruction
    long is k chained MFMAs (D becomes the next C), other cases keeping their D."""
    ins = parse_mfma("v_mfma_" + suffix, GFX[gen])
    M, ki = ins.m, ins.k
    n = len(c)
    nb = batch(gen, suffix)
    kmax = max(x.shape[0] for x in a)
    diag = (np.arange(n) // M, np.arange(n) % M, np.arange(n) % M)
    A = np.zeros((nb, M, kmax), a[0].dtype)
    B = np.zeros((nb, kmax, M), a[0].dtype)
    blocks = np.zeros((nb, M), int)
    for i, (x, y) in enumerate(zip(a, b)):
        A[i // M, i % M, :x.shape[0]] = x
        B[i // M, :y.shape[0], i % M] = y
        blocks[i // M, i % M] = x.shape[0] // ki
    D = np.zeros((nb, M, M), np.uint32)
    D[diag] = c
    view = VIEW[t]
    for j in range(kmax // ki):
        new = np.asarray(tcemu.mma(ins.spelling, A[..., j * ki:(j + 1) * ki].view(view),
                                   B[:, j * ki:(j + 1) * ki, :].copy().view(view), D.view(np.float32),
                                   arch=GFX[gen])).view(np.uint32)
        D = np.where((blocks > j)[:, :, None], new, D)
    return D[diag]


def _cases(gs):
    _, z = data()
    cat = lambda p: np.concatenate([z[f"{g['group']}|{p}"] for g in gs])  # noqa: E731
    a = [x for g in gs for x in z[f"{g['group']}|a"]]
    b = [x for g in gs for x in z[f"{g['group']}|b"]]
    return a, b, cat("c"), cat("d_toolbox"), cat("d_mmasim"), cat("explain"), cat("status")


@pytest.mark.parametrize("gen,suffix", _params())
def test_instruction(gen, suffix):
    gs = forms()[(gen, suffix)]
    a, b, c, d_tb, d_ms, ex, st = _cases(gs)
    try:
        d = run_tcemu(gen, suffix, gs[0]["type"], a, b, c)
    except ValueError as e:
        if "not modelled" in str(e):
            pytest.skip(f"tcemu has no {gen} {gs[0]['type']} numerics (the README compares the toolbox with MMA-Sim there)")
        raise
    agree = ex == 0
    bad = np.flatnonzero(agree & ~same(d, d_tb))
    assert bad.size == 0, f"{bad.size} cases where tcemu differs from both peers; first: case {bad[0]}, " \
                          f"tcemu {d[bad[0]]:#010x}, toolbox = MMA-Sim {d_tb[bad[0]]:#010x}"
    dis = ~agree
    assert same(d[dis], d_ms[dis]).all(), "a documented disagreement where tcemu does not side with MMA-Sim"
    assert not (same(d_tb, d_ms) & dis & (st != 1)).any()


def test_every_disagreement_has_a_cause():
    """The data file's tallies: every case where the toolbox differs from MMA-Sim is one of the
    README's causes, and where it is not the two agree bit for bit (NaN as NaN)."""
    meta, z = data()
    names = meta["explain"]
    tally = dict.fromkeys(CAUSES, 0)
    for g in meta["groups"]:
        k = g["group"]
        ex, tb, ms, st = z[f"{k}|explain"], z[f"{k}|d_toolbox"], z[f"{k}|d_mmasim"], z[f"{k}|status"]
        assert "unexplained" not in {names[e] for e in ex}
        assert same(tb, ms)[ex == 0].all() and (st[ex == 0] != 1).all()
        for e in ex[ex != 0]:
            tally[names[e]] += 1
    assert tally == CAUSES
    assert {g["gen"] for g in meta["groups"]} == set(GFX) and meta["toolbox_commit"].startswith("b12b5a7")


# Minimal reproductions: (arch, instruction, nonzero (k, a_k, b_k), C, toolbox D, MMA-Sim D). The
# experiment's README reads both models' code for each.
REPROS = {
    # a product of magnitude >= 2**128 (bf16): the toolbox's block returns +Inf whatever the sign
    # (Generic_BFMA_TC's prd_limit); MMA-Sim keeps the product's sign
    "negative_product_overflow_cdna3": ("MI300X", "v_mfma_f32_32x32x8_bf16", [(0, 2.0 ** 127, -2.0)], 0.0,
                                        0x7F800000, 0xFF800000),
    "negative_product_overflow_cdna2": ("MI250X", "v_mfma_f32_16x16x8bf16", [(0, 2.0 ** 127, -2.0)], 0.0,
                                        0x7F800000, 0xFF800000),
    # the first block of 8 overflows to +Inf; the toolbox hands Inf to the next block as a finite C
    # (its NaN/Inf test looks at the inputs only) and returns a finite number
    "inf_not_carried_to_next_block": ("MI300X", "v_mfma_f32_16x16x16_bf16",
                                      [(0, 1.5 * 2.0 ** 127, 1.0), (1, 1.5 * 2.0 ** 127, 1.0), (8, 1.0, 1.0)], 0.0,
                                      0x43010000, 0x7F800000),
    # CDNA1: the first block's 2**129 stays a double for the next block (Inf only at a biased
    # exponent of exactly 255), so -2**129 + 1 gives 1; MMA-Sim rounds each block to binary32
    "wide_accumulator_between_blocks": ("MI100", "v_mfma_f32_16x16x8bf16",
                                        [(0, 2.0 ** 127, 4.0), (2, 2.0 ** 127, -4.0), (3, 1.0, 1.0)], 0.0,
                                        0x3F800000, 0x7F800000),
    # CDNA2 bf16 without _1k: the toolbox sums quads ((p0 + p1) + (p2 + p3)) + C, MMA-Sim pairs
    # ((C + (p0 + p1)) + (p2 + p3)): 2**-24 + 2**-24 = 2**-23 is kept, each 2**-24 alone is a tie lost
    "bf16_pairs_not_quads": ("MI250X", "v_mfma_f32_16x16x8bf16",
                             [(0, 2.0 ** -12, 2.0 ** -12), (2, 2.0 ** -12, 2.0 ** -12)], 1.0, 0x3F800001, 0x3F800000),
    # under a larger C the toolbox floors the product sum 31 bits below C's exponent (eab = 31 - 24),
    # MMA-Sim 32 (F2 + 1): the 2**-32 product makes 1 - 2**-8 - 2**-25 - 2**-32 round away from a tie
    "product_sum_31_bits_below_c_f16": ("MI300X", "v_mfma_f32_32x32x8_f16",
                                        [(0, 2.0 ** -4, 2.0 ** -4), (1, 2.0 ** -12, 2.0 ** -13),
                                         (2, 2.0 ** -16, 2.0 ** -16)], -1.0, 0xBF7F0000, 0xBF7EFFFF),
    "product_sum_31_bits_below_c_bf8": ("MI300X", "v_mfma_f32_16x16x32_bf8_bf8",
                                        [(0, 2.0 ** -4, 2.0 ** -4), (2, 2.0 ** -12, 2.0 ** -13),
                                         (4, 2.0 ** -16, 2.0 ** -16)], -1.0, 0xBF7F0000, 0xBF7EFFFF),
    # every product of the block zero, C not: Octave 7 stops in the toolbox's AlignSignficand
    # (bitshift of an empty array); None: no toolbox result
    "all_products_zero_octave_error": ("MI300X", "v_mfma_f32_32x32x8_f16", [(0, 1.0, 0.0), (1, 0.0, 1.0)], 1.0,
                                       None, 0x3F800000),
}


def _stored(name):
    """The data file's record of a reproduction: its group (inputs, run_toolbox.m's and MMA-Sim's results)."""
    meta, z = data()
    base = name.removesuffix("_cdna3").removesuffix("_cdna2").removesuffix("_f16").removesuffix("_bf8")
    arch, spelling = REPROS[name][:2]
    (g,) = [g for g in meta["groups"] if g["source"] == f"repro:{base}" and GFX[g["gen"]] == ARCH[arch]
            and spelling.endswith(g["suffix"])]
    return g, {p: z[f"{g['group']}|{p}"][0] for p in ("a", "b", "c", "d_toolbox", "d_mmasim", "status")}


@pytest.mark.parametrize("name", sorted(REPROS))
def test_reproduction(name):
    arch, spelling, terms, c, toolbox, mmasim = REPROS[name]
    g, rec = _stored(name)
    assert rec["d_mmasim"] == mmasim
    assert rec["status"] == 1 if toolbox is None else (rec["status"] == 0 and rec["d_toolbox"] == toolbox)
    view = VIEW[g["type"]]
    a, b = np.zeros(g["k"]), np.zeros(g["k"])
    for k, x, y in terms:
        a[k], b[k] = x, y
    a, b = (x.astype(view).view(rec["a"].dtype) for x in (a, b))
    c = np.asarray([c], np.float32).view(np.uint32)
    assert np.array_equal(a, rec["a"]) and np.array_equal(b, rec["b"]) and c[0] == rec["c"]
    try:
        d = run_tcemu(g["gen"], g["suffix"], g["type"], [a], [b], c)
    except ValueError as e:
        if "not modelled" in str(e):
            pytest.skip(f"tcemu has no numerics for {spelling} on {arch} (toolbox {toolbox:#x}, MMA-Sim {mmasim:#x})")
        raise
    assert d[0] == mmasim
