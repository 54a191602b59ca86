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
    _recorded_answers_right(path, FRESH2_RECORDS, rows=8, stride=3, share=0.9)


DEV = [DATA / n for n in ("library_gemm_h100_torch_heldout.npz", "layer_gemm_h100_torch_default_fresh.npz",
                          "layer_gemm_h100_torch_splitk_off_fresh.npz")]


@pytest.mark.parametrize("path", DEV, ids=[p.name for p in DEV])
def test_shipped_records_reproduce_captures(path):
    _recorded_answers_right(path, None, rows=4, stride=6, share=0.85)


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
