"""library_config from cuBLAS's recorded choices (tcemu.record): every answer labelled "recorded"
reproduces the captured bits, on development captures and on the held-out captures made after the
rules were frozen (fresh2: new shapes, new inputs, recorded with ``python -m tcemu record``); the
sources, strict mode and the records argument; the serial split-K reduction."""
from __future__ import annotations

import gzip
import json
import sys

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import tcemu
from conftest import ROOT
from tcemu._src import captures as C
from tcemu._src import library_records as R

sys.path.insert(0, str(ROOT / "experiments" / "hardware"))
from check_records import check  # noqa: E402
from identify_layers import emulate, epilogue_operands  # noqa: E402

DATA = ROOT / "tests" / "data"
FRESH2 = sorted(DATA.glob("*_h100_torch*_fresh2.npz"))
FRESH2_RECORDS = str(DATA / "cublas_records_h100_fresh2.json.gz")


def _jobs(paths, stride):
    out = []
    for path in paths:
        z, meta = C.load(path)
        keys = [c["key"] for c in meta["cases"] if "key" in c and c["lib"].startswith(("torch", "F."))]
        out += [(str(path), k) for k in keys[::stride]]
    return out


def _recorded_answers_right(path, records, rows, stride, share):
    """Every "recorded" answer on every ``stride``-th case of a capture (``rows`` rows) is right,
    and at least ``share`` of the cases are answered "recorded"."""
    out = [check((p, k, records, rows)) for p, k in _jobs([path], stride)]
    wrong = [(r["key"], r["lib"], r["shape"], r["match"]) for r in out if r["source"] == "recorded" and r["match"] != 1]
    assert not wrong
    assert sum(r["source"] == "recorded" for r in out) >= share * len(out)


@pytest.mark.parametrize("path", FRESH2, ids=[p.name for p in FRESH2])
def test_tcemu_record_reproduces_a_fresh_capture(path):
    # the user's workflow: tcemu record at their shapes, then library_config(records=...)
    _recorded_answers_right(path, FRESH2_RECORDS, rows=8, stride=12, share=0.9)


# tcemu record at the shapes of H200 captures, then library_config(records=...): fresh3 (captured at
# stop 48; 44 of 452 cases missed until stop 51's CUTLASS 2 slice alignment, made on them) and the
# capture made to decide that rule (CUTLASS 2 split-K with K a multiple of 16, 32 or 64)
H200_RECORDED = [("library_gemm_h200_torch_slices.npz", "cublas_records_h200_slices.json.gz", 3),
                 ("library_gemm_h200_torch_fresh3.npz", "cublas_records_h200_fresh3.json.gz", 3),
                 ("layer_gemm_h200_torch_default_fresh3.npz", "cublas_records_h200_fresh3.json.gz", 10),
                 # held out: 18 shapes captured after that rule was frozen (7943db5); every row of
                 # its 640 cases with these records: experiments/hardware/README.md
                 ("library_gemm_h200_torch_fresh4.npz", "cublas_records_h200_fresh4.json.gz", 6),
                 ("layer_gemm_h200_torch_default_fresh4.npz", "cublas_records_h200_fresh4.json.gz", 15),
                 # 14 shapes captured after stop 52's refit: every row of 468 cases right (README)
                 ("library_gemm_h200_torch_fresh5.npz", "cublas_records_h200_fresh5.json.gz", 4),
                 # 14 shapes captured after stop 54's refit: every row of 440 cases right (README)
                 ("layer_gemm_h200_torch_default_fresh6.npz", "cublas_records_h200_fresh6.json.gz", 24),
                 # 14 shapes captured after stop 55's forests were frozen: every row of 440 cases right (README)
                 ("layer_gemm_h200_torch_splitk_off_fresh7.npz", "cublas_records_h200_fresh7.json.gz", 24),
                 # 14 shapes captured after stop 56's refit was frozen: every row of 468 cases right (README)
                 ("library_gemm_h200_torch_fresh8.npz", "cublas_records_h200_fresh8.json.gz", 4),
                 # 14 shapes captured after stop 57's refit was frozen: every row of 468 cases right (README)
                 ("layer_gemm_h200_torch_default_fresh9.npz", "cublas_records_h200_fresh9.json.gz", 24),
                 # 14 shapes captured after stop 58's refit was frozen: every row of 440 cases right (README)
                 ("library_gemm_h200_torch_fresh10.npz", "cublas_records_h200_fresh10.json.gz", 4)]


# every stride-th case (CI time); each sample holds cases whose slices the rule changes
@pytest.mark.parametrize("name, records, stride", H200_RECORDED, ids=[n for n, _, _ in H200_RECORDED])
def test_tcemu_record_reproduces_h200_captures(name, records, stride):
    _recorded_answers_right(DATA / name, str(DATA / records), rows=8, stride=stride, share=1.0)


def test_cutlass_split_k_slices_of_64_where_k_is_a_multiple_of_64():
    row = {"lib": "torch.mm", "a": "f16", "b": "f16", "out": "f16", "K": 6144,
           "kernels": ["cutlass::Kernel2<cutlass_80_tensorop_f16_s16816gemm_f16_128x256_64x3_nn_align2>",
                       "cublasLt::splitKreduce_kernel"],
           "calls": [{"algo": {"algoId": 23, "reductionScheme": "OUTPUT_TYPE", "numSplitsK": 22}}]}
    assert R.row_schedule(row)[1].slice_align == 64  # 19 slices of 320 and one of 64
    assert R.row_schedule(row, 6152)[1].slice_align == 8  # 16 bytes
    assert R.row_schedule(row, 6160)[1].slice_align == 8  # a multiple of 16 only: 16 bytes too


DEV = [DATA / n for n in ("library_gemm_h100_torch_heldout.npz", "layer_gemm_h100_torch_default_fresh.npz",
                          "layer_gemm_h100_torch_splitk_off_fresh.npz")]


@pytest.mark.parametrize("path", DEV, ids=[p.name for p in DEV])
def test_shipped_records_reproduce_captures(path):
    _recorded_answers_right(path, None, rows=4, stride=12, share=0.85)


KW = dict(arch="H100", a="bf16", b="bf16", out="bf16")


def test_sources_and_strict():
    cfg, src = tcemu.library_config("torch.mm", M=64, N=64, K=16384, with_source=True, **KW)
    assert src == "recorded" and cfg.schedule.slices == 12  # cuBLAS's numSplitsK on the H100
    assert tcemu.library_config("torch.mm", M=64, N=64, K=16384, strict=True, **KW) == cfg
    # not recorded, inside a grid cell whose 8 recorded corners run one schedule: the rule
    assert tcemu.library_config("torch.mm", M=2000, N=2000, K=2000, with_source=True, **KW)[1] == "rule"
    # not recorded, and no such cell around it (K and N off a multiple of 8): a guess
    assert tcemu.library_config("torch.mm", M=1000, N=3002, K=1003, with_source=True, **KW)[1] == "nearest"
    with pytest.raises(ValueError, match="strict=True refuses the nearest"):
        tcemu.library_config("torch.mm", M=1000, N=3002, K=1003, strict=True, **KW)
    # XLA's rules with the autotuner off
    assert tcemu.library_config("jnp.dot", M=300, N=300, K=3000, xla_autotune=False, with_source=True, **KW)[1] == "rule"
    # records=False: the measured table only, a guess even at its own shapes (a schedule that
    # fits 64 captured rows: at 512 x 512 x 777 bf16 the table splits K in 2, cuBLAS in 8)
    _, src = tcemu.library_config("torch.mm", M=64, N=64, K=16384, records=False, with_source=True, **KW)
    assert src == "nearest"
    assert tcemu.library_config("torch.mm", M=512, N=512, K=777, records=False, **KW).schedule.slices == 2
    assert tcemu.library_config("torch.mm", M=512, N=512, K=777, **KW).schedule.slices == 8
    # the H200's own records (recorded on an H200): cuBLAS splits K one more time there at this shape
    h200 = dict(KW, arch="H200")
    cfg, src = tcemu.library_config("torch.mm", M=8, N=160, K=32768, with_source=True, **h200)
    assert (src, cfg.schedule.slices) == ("recorded", 25)
    assert tcemu.library_config("torch.mm", M=8, N=160, K=32768, **KW).schedule.slices == 24
    assert tcemu.library_config("torch.mm", M=1000, N=3002, K=1003, with_source=True, **h200)[1] == "nearest"


def test_records_argument(tmp_path):
    rec = tcemu.library_config("torch.mm", M=777, N=333, K=2222, records=FRESH2_RECORDS, with_source=True, **KW)
    assert rec[1] == "recorded"
    with pytest.raises(ValueError, match="is not a file"):
        tcemu.library_config("torch.mm", M=64, N=64, K=64, records=str(tmp_path / "none.json.gz"), **KW)
    bad = tmp_path / "bad.json.gz"
    bad.write_bytes(b"not gzip")
    with pytest.raises(ValueError, match="is not a record file of tcemu.record"):
        tcemu.library_config("torch.mm", M=64, N=64, K=64, records=str(bad), **KW)
    other = tmp_path / "a100.json.gz"
    with gzip.open(FRESH2_RECORDS, "rt") as f:
        data = json.load(f)
    data["header"]["gpu"] = "NVIDIA A100-SXM4-80GB"
    with gzip.open(other, "wt") as f:
        json.dump(data, f)
    with pytest.raises(ValueError, match="were made on 'NVIDIA A100-SXM4-80GB', not on arch='H100'"):
        tcemu.library_config("torch.mm", M=64, N=64, K=64, records=str(other), **KW)
    with pytest.raises(TypeError, match="records must be a path"):
        tcemu.library_config("torch.mm", M=64, N=64, K=64, records=3, **KW)
    with pytest.raises(TypeError, match="strict must be True or False"):
        tcemu.library_config("torch.mm", M=64, N=64, K=64, strict="yes", **KW)


def test_offgrid_rows_answer_nearest_but_make_no_grid_cell(tmp_path):
    # a grid of 8 corners all running one kernel, and a random-shape row of another kernel inside the cell
    nvjet, cutlass = ["nvjet_sm90_tst_128x128_64x4_1x2_h_bz_NNT"], ["cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_" \
                                                                     "bf16_128x64_64x3_nn_align8>"]
    rows = [dict(_row(nvjet), M=m, N=n, K=k) for m in (256, 1024) for n in (256, 1024) for k in (256, 1024)]
    rows.append(dict(_row(cutlass), M=504, N=504, K=504, offgrid=True))
    path = tmp_path / "records.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"header": {"gpu": "NVIDIA H100 80GB HBM3"}, "cases": rows}, f)

    def ask(M, N, K):
        row, source = R.lookup(str(path), "torch.mm", None, M, N, K, "bf16", "bf16", "bf16", {})
        return row["kernels"], source

    assert ask(504, 504, 504) == (cutlass, "recorded")
    assert ask(520, 504, 504) == (nvjet, "rule")  # the corners agree: the random row is not a corner
    assert ask(520, 504, 2048) == (cutlass, "nearest")  # outside every cell: the nearest row, off the grid or not
    assert ask(2000, 2000, 2000) == (nvjet, "nearest")


def _row(kernels, S=1, scheme=None, a="bf16", out="bf16", lib="torch.mm"):
    algo = {"algoId": 66} | ({"numSplitsK": S, "reductionScheme": scheme} if S > 1 else {})
    return dict(lib=lib, batch=None, M=64, N=64, K=777, a=a, b=a, out=out, flags={}, kernels=kernels,
                calls=[{"algo": algo}])


def test_kernel_families_and_schedules():
    # real kernel names of the H100 records
    k16, s = R.row_schedule(_row(["nvjet_sm90_tst_64x32_64x16_4x1_v_bz_splitK_NNT", "cublasLt::splitKreduce_kernel"],
                                 5, "COMPUTE_TYPE"))
    assert (k16, s) == ("k16", tcemu.KSchedule(k_tile=64, slices=5))
    k8, s = R.row_schedule(_row(["cutlass::Kernel2<cutlass_75_tensorop_bf16_s1688gemm_bf16_128x128_tn_align1>"],
                                11, "OUTPUT_TYPE"))
    assert k8 == "k8" and (s.residue, s.slices, s.slice_align, s.partials) == ("first", 11, 8, "bf16")
    _, s = R.row_schedule(_row(["cutlass_80_wmma_tensorop_f16_s161616gemm_f16_32x32_128x1_tn_align1"], 3, "INPLACE",
                               a="f16", out="f16"))
    assert (s.reduction, s.partials) == ("serial", "f16")
    assert R.row_schedule(_row(["nvjet_sm90_qqtst_64x32_128x16_4x1_v_bz_splitK_TNT"], 3, "COMPUTE_TYPE",
                               a="e4m3", out="bf16"))[1].k_tile == 128
    assert R.row_schedule(_row(["sm80_xmma_gemm_f16f16_f16f32_f32_nn_n_tilesize96x128x32_stage4"]))[1] == tcemu.KSchedule()
    with pytest.raises(R.NotEmulated, match="CUDA cores"):
        R.row_schedule(_row(["gemmSN_NN_kernel<float, 256, 4, 2, 8, 4, 4, false>"]))


def test_serial_reduction_rounds_the_running_total():
    # four slices of 8 elements: partials 1, 2^-9, 2^-9, 2^-9 exactly (one nonzero product each)
    a = np.zeros((1, 32), np.float32)
    a[0, [0, 8, 16, 24]] = [1.0, 2.0**-9, 2.0**-9, 2.0**-9]
    b = np.ones((32, 1), np.float32)
    a, b = jnp.asarray(a, jnp.bfloat16), jnp.asarray(b, jnp.bfloat16)
    sched = tcemu.KSchedule(k_tile=8, slices=4, slice_align=8, partials="bf16")
    got = {}
    for red in ("serial", "sequential"):
        cfg = tcemu.GemmConfig(arch="H100", instruction="m16n8k8.f32.bf16.bf16.f32", schedule=sched.replace(reduction=red))
        got[red] = float(tcemu.matmul(a, b, config=cfg, out_type="f32")[0, 0])
    # serial: round_bf16(1 + 2^-9) = 1 at every step; sequential: 1 + 3 * 2^-9 in float32
    assert got == {"serial": 1.0, "sequential": 1.0 + 3 * 2.0**-9}
    assert float(ml_dtypes.bfloat16(1.0 + 2.0**-9)) == 1.0


def test_serial_split_k_epilogue_held_out():
    """Captured on an H200 after serial split-K's epilogue was frozen (0781544), at shapes where the
    records run INPLACE split-K: F.linear with a bias, torch.addmm with a C row, a full C and
    alpha = 2, beta = 0.5 (every 13th case, 8 rows; all 127 serial cases reproduce every row:
    check_records.py)."""
    path = DATA / "layer_gemm_h200_torch_default_serial_salt13.npz"
    out = [check((p, k, None, 8)) for p, k in _jobs([path], 13)]
    assert all(r["source"] == "recorded" and r["match"] == 1 for r in out)
    serial = {r["lib"] + str(sorted(r["flags"].items())) for r in out if "reduction='serial'" in r["config"]}
    assert len(serial) >= 4  # bias, C row, full C, alpha/beta


def test_check_takes_other_records_inside_the_call_only():
    """check_records.check with ``shipped`` and without FIT_FROM answers from those records, and
    leaves library_records.SHIPPED and FIT_FROM as they were."""
    path = str(DATA / "library_gemm_h200_torch_fresh7.npz")
    before = (dict(R.SHIPPED), dict(R.FIT_FROM))
    p, key = _jobs([path], 1)[0]
    r = check((p, key, None, 4), shipped={"H200": str(DATA / "cublas_records_h200_fresh7.json.gz")}, fit_from=False)
    assert (r["source"], r["match"]) == ("recorded", 1)
    assert (dict(R.SHIPPED), dict(R.FIT_FROM)) == before


@pytest.mark.parametrize("name,key", [("default_fresh2_salt17_scaled_mm", "l21"), ("default_fresh2_salt17_scaled_mm", "l57"),
                                      ("default_salt17_scaled_mm", "l57"), ("splitk_off_fresh2_salt17_scaled_mm", "s21")])
def test_row_scales_b_first_held_out(name, key):
    """Row-wise fp8 scales, (acc * scale_b) * scale_a: captured on an H200 after the order was
    frozen; in these cases (acc * scale_a) * scale_b misses one output (176 row-scaled cases)."""
    path = str(DATA / f"layer_gemm_h200_torch_{name}.npz")
    r = check((path, key, None, 0))
    assert (r["flags"]["scaling"], r["source"], r["match"]) == ("row", "recorded", 1)
    z, meta = C.load(path)
    case = next(c for c in meta["cases"] if c.get("key") == key)
    rows, cols, d = z[f"{key}.rows"], z[f"{key}.cols"], z[f"{key}.d"]
    cfg = tcemu.library_config("torch._scaled_mm", arch="H200", M=case["M"], N=case["N"], K=case["K"], a="e4m3",
                               b="e4m3", out=case["out"], **case["flags"])
    assert cfg.epilogue.scales == "sequential_ba"
    a_first = emulate(case, rows, cols, cfg.replace(epilogue=tcemu.Epilogue(scales="sequential")),
                      epilogue_operands(case, rows, cols)).view(d.dtype)
    assert (a_first != d).sum() == 1


@pytest.mark.parametrize("key", ["l18", "l31"])  # F.linear with a bias (f16); addmm with alpha, beta, C (bf16)
def test_identify_finds_serial_split_k_with_the_epilogue(key):
    """identify given the layer's operands on 32 rows of the held-out serial capture (H200,
    333 x 8192 x 4097) finds serial split-K with its epilogue (the library's bare-GEMM record,
    tried first) and reproduces the other 32 rows."""
    z, meta = C.load(DATA / "layer_gemm_h200_torch_default_serial_salt13.npz")
    case = next(c for c in meta["cases"] if c.get("key") == key)
    rows, cols, d = z[f"{key}.rows"], z[f"{key}.cols"], z[f"{key}.d"].view(C.NUMPY[case["out"]])
    ops = epilogue_operands(case, rows, cols)
    seen = np.arange(len(rows)) < 32
    a, _, bs = C.crop_operands(case, rows[seen], cols)
    cfg = tcemu.identify(a, bs[0], d[seen], arch="H200", library="torch.mm", shape=(case["M"], case["N"]),
                         max_seconds=60, **{k: (v[seen] if k == "c" else v) for k, v in ops.items()})
    assert cfg.schedule.reduction == "serial"
    held = {k: (v[~seen] if k == "c" else v) for k, v in ops.items()}
    got = emulate(case, rows[~seen], cols, cfg, held).view(d.dtype)
    assert np.array_equal(got, d[~seen])


def test_identify_says_when_the_rows_fit_several_library_configurations():
    """torch.mm with split-K off (H100, salt 7, 999 x 777 x 1111 bf16; one k16 chain in an
    sm90_xmma kernel): the 32 rows seen also fit the default mode's recorded 4-slice CUTLASS 2
    split, tried first. identify returns it and warns, naming split-K off's configuration, which
    reproduces the other 32 rows where the one returned misses some."""
    from identify_layers import _select

    path = DATA / "layer_gemm_h100_torch_splitk_off_heldout_salt7.npz"
    z, meta = C.load(path)
    case = next(c for c in meta["cases"] if c.get("key") == "s40")
    rows, cols, d = z["s40.rows"], z["s40.cols"], z["s40.d"].view(C.NUMPY[case["out"]])
    ops, seen = epilogue_operands(case, rows, cols), np.arange(len(rows)) < 32
    a, _, bs = C.crop_operands(case, rows[seen], cols)
    with pytest.warns(tcemu.AmbiguousFit, match="fit 2 of the library's configurations") as caught:
        cfg = tcemu.identify(a, bs[0], d[seen], arch="H100", library="torch.mm", shape=(case["M"], case["N"]))
    (alt,) = next(w.message for w in caught if w.category is tcemu.AmbiguousFit).alternatives

    def held(c):
        return (emulate(case, rows[~seen], cols, c, _select(ops, ~seen)).view(d.dtype) == d[~seen]).mean()

    assert cfg.schedule.slices == 4 and alt.schedule.slices == 1
    assert held(cfg) < 1 and held(alt) == 1


@pytest.mark.parametrize("key,order", [("l1", "sequential"), ("l3", "product")])  # 1x128 x 1x128; 1x128 x 128x128
def test_identify_finds_block_scales_along_k(key, order):
    """identify given DeepSeek-V3 block scales (scale_a (M, K / 128), scale_b (K / 128, N)) on 32
    rows of the H100's held-out block-scaled capture (f32 outputs, which tell the orders apart):
    promotion every 128, the measured order, the other 32 rows reproduced."""
    z, meta = C.load(DATA / "layer_gemm_h100_torch_default_heldout_scaled_block.npz")
    case = next(c for c in meta["cases"] if c.get("key") == key)
    rows, cols, d = z[f"{key}.rows"], z[f"{key}.cols"], z[f"{key}.d"].view(C.NUMPY[case["out"]])
    ops = epilogue_operands(case, rows, cols)
    seen = np.arange(len(rows)) < 32
    pick = lambda sel: {k: (v[sel] if k == "scale_a" else v) for k, v in ops.items()}  # noqa: E731
    a, _, bs = C.crop_operands(case, rows[seen], cols)
    cfg = tcemu.identify(a, bs[0], d[seen], arch="H100", library="torch._scaled_mm", shape=(case["M"], case["N"]),
                         max_seconds=60, **pick(seen))
    assert (cfg.schedule.promotion, cfg.epilogue.scale_block, cfg.epilogue.scales) == (128, 128, order)
    assert np.array_equal(emulate(case, rows[~seen], cols, cfg, pick(~seen)).view(d.dtype), d[~seen])


def test_identify_block_scale_errors():
    a = np.ones((4, 256), ml_dtypes.float8_e4m3fn)
    b = np.ones((256, 8), ml_dtypes.float8_e4m3fn)
    d = np.ones((4, 8), np.float32)
    with pytest.raises(ValueError, match=r"block scales along K need both scale_a \(M, 2\)"):
        tcemu.identify(a, b, d, arch="H100", scale_a=np.ones((4, 2)), scale_b=np.ones((1, 8)))
    with pytest.raises(ValueError, match="scale_block=128 go with block scales"):
        tcemu.identify(a, b, d, arch="H100", scale_a=np.ones((4, 1)), scale_b=np.ones((1, 8)),
                       epilogues=[tcemu.Epilogue(scale_block=128)])


@pytest.mark.parametrize("argv, match", [
    (["--out", "o", "--only", "grid", "--seed", "0"], "--seed and --count go with --only random"),
    (["--out", "o", "--count", "5"], "--seed and --count go with --only random"),
    (["--out", "o", "--only", "captures", "--unaligned"], "--seed and --count go with --only random"),
    (["--out", "o", "--only", "grid", "--deep"], "--deep, --seed and --count go with --only random"),
    (["--out", "o", "--only", "random", "--captures", "a.npz"], "--captures goes with --only captures"),
    (["--only", "random"], "--out is required"),
])
def test_cublas_record_refuses_misplaced_options(argv, match, capsys):
    from cublas_record import main

    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and match in capsys.readouterr().err
