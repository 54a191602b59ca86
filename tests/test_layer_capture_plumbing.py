"""The layer capture's plumbing (``experiments/hardware/layer_gemm.py``) without a GPU: its
``--dry-run`` (numpy stand-ins for the torch calls, jax on the CPU) writes files that read back
through ``tcemu._src.captures``, whose crop helpers regenerate the operands the run used (A, B,
bias, C, row-wise scales), and the library captures' A and B bits are unchanged."""
from __future__ import annotations

import json
import re
import sys

import numpy as np
import pytest

from conftest import ROOT
from tcemu._src import captures as C

sys.path.insert(0, str(ROOT / "experiments" / "hardware"))
import layer_gemm as L  # noqa: E402

# operand_bits(12345, which, fmt, [0, 1, 2, 1000, 123456]) as generated before the layer operands
# were added: the committed library captures' inputs
A_B_BITS = {
    ("a", "f16"): [45383, 47809, 44592, 45087, 18327], ("a", "bf16"): [48711, 48961, 48560, 48671, 16535],
    ("a", "e4m3"): [167, 177, 152, 167, 79], ("b", "f16"): [43899, 16595, 12913, 18173, 12630],
    ("b", "bf16"): [48507, 16467, 15985, 16637, 15958], ("b", "e4m3"): [147, 67, 33, 77, 38],
}


@pytest.mark.parametrize("which, fmt", sorted(A_B_BITS))
def test_library_operand_bits_are_unchanged(which, fmt):
    got = C.operand_bits(12345, which, fmt, np.array([0, 1, 2, 1000, 123456]))
    assert got.tolist() == A_B_BITS[(which, fmt)]


def test_library_crops_are_unchanged():
    case = dict(batch=None, M=77, N=3072, K=768, a="bf16", b="bf16", seed=987654321)
    assert C.a_rows(case, [0, 76])[:, :3].tolist() == [[16103, 15887, 48504], [49211, 48472, 49356]]
    assert C.b_cols(case, 0, [0, 3071])[:3].tolist() == [[15740, 16282], [48423, 49221], [49306, 49238]]


def test_epilogue_operands_have_their_own_bits():
    case = dict(batch=2, M=5, N=7, K=3, a="f16", b="f16", c="f16", bias="f16", seed=99)
    n = np.arange(10)
    streams = [C.operand_bits(99, w, "f16", n).tolist() for w in ("a", "b", "bias", "c")]
    assert len({tuple(s) for s in streams}) == 4
    assert C.full(case, "c").shape == (2, 5, 7) and C.full(case, "bias").shape == (7,)
    rows, cols = np.array([0, 4, 6, 9]), np.array([1, 6])  # rows flat over batch * M
    assert np.array_equal(C.full(case, "c").reshape(10, 7)[np.ix_(rows, cols)], C.c_rows(case, rows, cols))
    assert np.array_equal(C.full(case, "bias").view(np.float16)[cols], C.bias_values(case, cols))
    s = C.scale_values(dict(case, M=300), "scale_a")
    assert s.dtype == np.float32 and (s > 0).all() and len(np.unique(np.floor(np.log2(s)))) == 8


def test_threaded_generation_equals_full():
    case = dict(batch=3, M=50, N=70, K=30, a="bf16", b="bf16", c="bf16", bias="bf16", seed=7)
    for which in ("a", "b", "c", "bias"):
        assert np.array_equal(L.bits_full(case, which, gpu=False, chunk=1000), C.full(case, which))


def test_grid():
    for grid, n_torch in (("dev", 240), ("held-out", 204)):
        cs = L.cases(grid, "torch")
        assert len(cs) == n_torch and len(L.cases(grid, "jax")) == 48
        fp8 = [c for c in cs if c["layer"] == "scaled_mm"]
        assert fp8 and all(v % 16 == 0 for c in fp8 for v in (c["M"], c["N"], c["K"]))
        assert all(c["x3"][0] * c["x3"][1] == c["M"] for c in cs if c["x3"])
        blocks = [c for c in cs if c["layer"] == "scaled_block"]
        assert len(blocks) == 6 * len(L.BLOCK_SHAPES[grid]) and all(c["K"] % 128 == 0 for c in blocks)
    salted = L.cases("dev", "torch", salt=3)
    assert all(c["seed"] == L.G.seed_of(c["batch"], c["M"], c["N"], c["K"], c["a"], c["b"]) for c in L.cases("dev"))
    assert not {c["seed"] for c in salted} & {c["seed"] for c in L.cases("dev")}
    assert np.float32(L.SCALES[0]) * np.float32(L.SCALES[1]) != np.float64(L.SCALES[0]) * L.SCALES[1]


def test_file_names_follow_the_grid():
    # every committed library and layer capture: the grid its header's command names gives the
    # suffix its file was saved under (layer_gemm.save, library_gemm.save)
    seen = set()
    for p in sorted((ROOT / "tests" / "data").glob("l*_gemm_h*.npz")):
        with np.load(p) as z:
            header = json.loads(str(z["meta"]))["header"]
        m = re.search(r"--grid (\S+)", header["command"])
        grid = m.group(1) if m else "table"
        lib, mode = re.search(r"--lib (\w+)", header["command"]).group(1), header.get("mode")
        stem = ("layer_gemm_h\\d00_" + lib + "_" + mode if mode else
                "library_gemm_h\\d00_" + lib + ("_autotune0" if "autotune_level=0" in header["command"] else ""))
        tail = r"(_salt\d+)?(_scaled_block|_scaled_mm|_process\d)?(_workspace0)?\.npz"
        assert re.fullmatch(stem + L.G.grid_suffix(grid) + tail, p.name), (p.name, grid)
        seen.add(grid)
    assert seen >= {"table", "dev", "held-out", "fresh", "fresh2", "fresh3", "fresh4", "fresh5", "fresh6", "fresh7",
                    "fresh8", "fresh9", "fresh10", "slices", "serial"}


def _values(bits, fmt):
    return np.asarray(bits).view(C.NUMPY[fmt]).astype(np.float64)


def _reference(case, rows, cols):
    """The dry run's arithmetic (float64, exact sums at the dry grid's K, one rounding), written
    out from the crop helpers: what the layer computes in exact arithmetic."""
    a = _values(C.a_rows(case, rows), case["a"])
    bt = np.asarray(rows) // case["M"]
    y = np.zeros((len(rows), len(cols)))
    for x in np.unique(bt):
        y[bt == x] = a[bt == x] @ _values(C.b_cols(case, int(x), cols), case["b"])
    if case["layer"] == "scaled_block":  # each block of 128 along K times its two scales
        sa, sb = C.expand_block_scales(case, "scale_a")[rows], C.expand_block_scales(case, "scale_b")[:, cols]
        a, b = _values(C.a_rows(case, rows), case["a"]), _values(C.b_cols(case, 0, cols), case["b"])
        y = sum((a[:, j * 128:(j + 1) * 128] @ b[j * 128:(j + 1) * 128]) * sa[:, j:j + 1] * sb[j][None]
                for j in range(case["K"] // 128))
    elif case["scale_a"] is not None:
        row = case["scale_a"] == "row"
        sa = C.scale_values(case, "scale_a", rows)[:, None] if row else np.float32(case["scale_a"])
        sb = C.scale_values(case, "scale_b", cols)[None] if row else np.float32(case["scale_b"])
        y = y * np.float64(sa) * np.float64(sb)
    y = case["alpha"] * y
    if case["c"]:
        y = case["beta"] * _values(C.c_rows(case, rows, cols), case["c"]) + y
    if case["bias"]:
        y = y + C.bias_values(case, cols).astype(np.float64)[None]
    return y.astype(C.NUMPY[case["out"]])


def test_torch_dry_run_round_trips(tmp_path):
    paths = L.main(["--lib", "torch", "--mode", "all", "--dry-run", "--out", str(tmp_path)])
    assert [p.name for p in paths] == ["layer_gemm_cpu_torch_default_dry.npz", "layer_gemm_cpu_torch_splitk_off_dry.npz"]
    for path in paths:
        _, meta = C.load(path)
        assert meta["header"]["mode"] in path.name and meta["header"]["dry_run"]
        assert len(meta["cases"]) == len(L.cases("dry", "torch")) == 68
        layers = {c["layer"] for c in meta["cases"]}
        assert layers == {"mm", "linear", "linear_bias", "linear3d_bias", "matmul3d", "addmm_c", "addmm_row", "addmm_c_ab",
                          "baddbmm_c", "scaled_mm", "scaled_block"}
        for case in meta["cases"]:
            assert "error" not in case and case["deterministic"]
            got, _, _, rows, cols, d = C.captured(path, case["key"])
            assert got == case and d.shape == (len(rows), len(cols))
            want = _reference(case, rows, cols)
            assert np.array_equal(d.view(C.OUT_STORAGE[case["out"]]), want.view(C.OUT_STORAGE[case["out"]])), case


def test_block_scales_layout():
    """The stored block scales and the (M, K/128), (K/128, N) ones tcemu takes: a 128x128 scale
    covers 128 rows (columns) of one K block; a 1x128 one a single row (column)."""
    case = dict(M=200, N=130, K=384, seed=5, scale_a="128x128", scale_b="1x128")
    sa, sb = C.block_scales(case, "scale_a"), C.block_scales(case, "scale_b")
    assert sa.shape == (2, 3) and sb.shape == (130, 3) and (sa > 0).all() and np.isfinite(sb).all()
    ea, eb = C.expand_block_scales(case, "scale_a"), C.expand_block_scales(case, "scale_b")
    assert ea.shape == (200, 3) and eb.shape == (3, 130)
    assert (ea[:128] == sa[0]).all() and (ea[128:] == sa[1]).all() and (eb == sb.T).all()


def test_layers_option_names_the_file(tmp_path):
    [path] = L.main(["--lib", "torch", "--mode", "default", "--dry-run", "--layers", "scaled_block", "--out", str(tmp_path)])
    _, meta = C.load(path)
    assert path.name == "layer_gemm_cpu_torch_default_dry_scaled_block.npz" and len(meta["cases"]) == 6
    assert meta["header"]["command"].endswith("--layers scaled_block")


def test_jax_dry_run_round_trips(tmp_path):
    """jax on the CPU: the dense layers' outputs within an output ulp of the product's and one of
    the sum's of exact."""
    [path] = L.main(["--lib", "jax", "--dry-run", "--out", str(tmp_path)])
    assert path.name == "layer_gemm_cpu_jax_default_dry.npz"
    _, meta = C.load(path)
    assert {c["layer"] for c in meta["cases"]} == {"dense", "dense_bias", "dense3d_bias"}
    for case in meta["cases"]:
        assert "error" not in case and case["hlo"] and case["deterministic"]
        _, _, _, rows, cols, d = C.captured(path, case["key"])
        want = _reference(case, rows, cols).astype(np.float64)
        dot = _reference(dict(case, bias=None), rows, cols).astype(np.float64)  # rounded, then the bias added
        tol = 2.0 ** -{"f16": 10, "bf16": 7}[case["out"]] * (np.abs(dot) + np.abs(want)) + 1e-6
        assert (np.abs(d.astype(np.float64) - want) <= tol).all(), case
