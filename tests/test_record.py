"""tcemu.record: parsing cuBLASLt's trace messages (real ones, from an H100), the case grid, and
bad input (no GPU, bad cases, bad CLI arguments). Recording itself runs on a GPU
(experiments/hardware/cublas_record.py); its records are checked against captures in
tests/test_library_records.py."""
from __future__ import annotations

import gzip
import json
import re
import sys

import pytest

import tcemu
from conftest import ROOT
from tcemu.__main__ import main
from tcemu._src import record as R

# cuBLASLt trace messages as an H100 logged them (torch 2.11, cuBLAS 13.1): torch.mm 64x64x16384
# bf16 (cublasGemmEx through cuBLASLt), torch.mm 1000x3000x777, F.linear with bias (cuBLASLt)
SPLIT = ("A=0X7F11C8A00000 Adesc=[type=R_16BF rows=64 cols=16384 ld=64] B=0X7F11C8800000 Bdesc=[type=R_16BF "
         "rows=16384 cols=64 ld=16384] C=0X7F11C9C00000 Cdesc=[type=R_16BF rows=64 cols=64 ld=64] D=0X7F11C9C00000 "
         "Ddesc=[type=R_16BF rows=64 cols=64 ld=64] computeDesc=[computeType=COMPUTE_32F scaleType=R_32F "
         "smCountTarget=132] algo=[algoId=66 tile=MATMUL_TILE_64x32 stages=MATMUL_STAGES_64xAUTO "
         "reductionScheme=REDUCTION_SCHEME_COMPUTE_TYPE numSplitsK=12 customOption=3 clusterShape=CLUSTER_SHAPE_1x2x1] "
         "workSpace=0X7F11A4000000 workSpaceSizeInBytes=196624 beta=0 outOfPlace=0 stream=0X0")
CUTLASS = ("A=0X7F11C8D7B800 Adesc=[type=R_16BF rows=3000 cols=777 ld=3000] B=0X7F11C8C00000 Bdesc=[type=R_16BF "
           "rows=777 cols=1000 ld=777] C=0X7F11C91EDC00 Cdesc=[type=R_16BF rows=3000 cols=1000 ld=3000] "
           "D=0X7F11C91EDC00 Ddesc=[type=R_16BF rows=3000 cols=1000 ld=3000] computeDesc=[computeType=COMPUTE_32F "
           "scaleType=R_32F smCountTarget=132] algo=[algoId=24 tile=MATMUL_TILE_256x128] workSpace=0X0 "
           "workSpaceSizeInBytes=0 beta=0 outOfPlace=0 stream=0X0")
BIAS = ("A=0X7F04A8000000 Adesc=[type=R_16BF rows=1001 cols=334 ld=1001] computeDesc=[computeType=COMPUTE_32F "
        "scaleType=R_32F transa=OP_T epilogue=EPILOGUE_BIAS biasPointer=0x7f55e7e00400] algo=[algoId=42 "
        "tile=MATMUL_TILE_256x64 stages=MATMUL_STAGES_64xAUTO clusterShape=CLUSTER_SHAPE_1x1x1] workSpace=0X7F55E7E10A00")


def test_parse_trace_real_messages():
    r = R.parse_trace("cublasLtTSTMatmul", SPLIT)
    assert r["algo"] == {"algoId": 66, "tile": "64x32", "stages": "64xAUTO", "reductionScheme": "COMPUTE_TYPE",
                         "numSplitsK": 12, "customOption": 3, "clusterShape": "1x2x1"}
    assert r["Ddesc"] == {"type": "R_16BF", "rows": 64, "cols": 64, "ld": 64}
    assert r["computeDesc"]["smCountTarget"] == 132 and r["fn"] == "cublasLtTSTMatmul"
    assert R.parse_trace("cublasLtTSTMatmul", CUTLASS)["algo"] == {"algoId": 24, "tile": "256x128"}
    b = R.parse_trace("cublasLtMatmul", BIAS)
    assert b["computeDesc"]["epilogue"] == "BIAS" and b["computeDesc"]["transa"] == "OP_T"
    assert "Bdesc" not in b and b["algo"]["algoId"] == 42


def test_default_grid():
    cases = R.default_cases()
    libs = {c["lib"] for c in cases}
    assert libs == set(R.LIBS)
    R._check_cases(cases)  # every case of the grid is one record() takes
    assert len({(c["lib"], c["batch"], c["M"], c["N"], c["K"], c["a"], c["b"], c["out"],
                 tuple(sorted(c["flags"].items()))) for c in cases}) == len(cases)
    assert all(c["M"] % 16 == c["N"] % 16 == c["K"] % 16 == 0 for c in cases if c["lib"] == "torch._scaled_mm")
    # the fresh capture's shapes (the held-out check of the records) are not on the grid
    sys.path.insert(0, str(ROOT / "experiments" / "hardware"))
    import gemm_inputs
    on_grid = {(c["M"], c["N"], c["K"]) for c in cases}
    assert not [s for s in gemm_inputs.FRESH_SHAPES if s[1:] in on_grid]


def test_record_needs_torch_and_a_gpu(tmp_path):
    try:
        import torch
        if torch.cuda.is_available():
            pytest.skip("a GPU is here: recording is exercised by experiments/hardware/cublas_record.py")
    except ImportError:
        pass
    with pytest.raises(RuntimeError, match=r"tcemu.record (runs on|needs) an NVIDIA GPU"):
        tcemu.record(tmp_path / "r.json.gz", shapes=[(64, 64, 64)])


CASE = dict(lib="torch.mm", batch=None, M=64, N=64, K=64, a="bf16", b="bf16", out="bf16",
            flags={"reduced_precision_reduction": True})


@pytest.mark.parametrize("kwargs,match", [
    (dict(cases=[]), "cases must be a non-empty list"),
    (dict(cases=[dict(CASE, lib="torch.conv")]), "lib one of torch.mm"),
    (dict(cases=[dict(CASE, M=0)]), "M must be a positive integer"),
    (dict(cases=[dict(CASE, K=2.5)]), "K must be a positive integer"),
    (dict(cases=[dict(CASE, a="f32")]), r"takes \(a, b, out\) one of"),
    (dict(cases=[dict(CASE, flags={"use_fast_accum": True})]), "takes flags one of"),
    (dict(cases=[dict(CASE, batch=4)]), "batch is a positive integer for torch.bmm"),
    (dict(shapes=[(64, 64)]), r"shapes must be a list of \(M, N, K\)"),
    (dict(shapes=[(64, 64, -1)]), r"shapes must be a list of \(M, N, K\)"),
    (dict(shapes=[(64, 64, 64)], cases=[CASE]), "pass cases or shapes, not both"),
    (dict(shapes=[(64, 64, 64)], chunk=0), "chunk must be a positive integer"),
])
def test_record_bad_arguments(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        tcemu.record(tmp_path / "r.json.gz", **kwargs)


def test_record_path_in_a_missing_folder(tmp_path):
    with pytest.raises(ValueError, match="path's folder .* does not exist"):
        tcemu.record(tmp_path / "missing" / "r.json.gz", shapes=[(64, 64, 64)])
    with pytest.raises(TypeError, match="path must be a file path"):
        tcemu.record(5, shapes=[(64, 64, 64)])


@pytest.mark.parametrize("name", ["quick", "progress"])
def test_record_flags_are_bools(tmp_path, name):
    with pytest.raises(TypeError, match=f"{name} must be True or False"):
        tcemu.record(tmp_path / "r.json.gz", shapes=[(64, 64, 64)], **{name: "yes"})


@pytest.mark.parametrize("argv,message", [
    (["record", "out.json", "--shapes", "64x64x64"], "does not end in .json.gz"),
    (["record", "out.json.gz", "--shapes", "64x64"], "shapes are MxNxK"),
    (["record", "out.json.gz", "--shapes", "64x0x64"], "shapes are MxNxK"),
])
def test_cli_record_bad_arguments(tmp_path, capsys, monkeypatch, argv, message):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and message in err and err.startswith("tcemu record: error:")


def test_cli_record_without_gpu_is_one_line(tmp_path, capsys):
    try:
        import torch
        if torch.cuda.is_available():
            pytest.skip("a GPU is here")
    except ImportError:
        pass
    with pytest.raises(SystemExit) as e:
        main(["record", str(tmp_path / "r.json.gz"), "--shapes", "64x64x64"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.splitlines()) == 1
    assert re.match(r"tcemu record: error: tcemu.record (runs on|needs) an NVIDIA GPU", err)


def test_partial_write_cut_off_keeps_the_last_one(tmp_path):
    # record writes its rows every minute; a write cut off (a time limit, an error) must leave the
    # previous file readable (stop 54 lost a set to a gzip cut mid-stream)
    path = tmp_path / "r.json.gz"
    R._write(path, {"gpu": "X"}, [{"calls": [1]}], 0.0)
    with pytest.raises(TypeError):
        R._write(path, {"gpu": "X"}, [{"calls": [1]}, {"calls": [object()]}], 0.0)
    with gzip.open(path, "rt") as f:
        assert json.load(f)["cases"] == [{"calls": [1]}]


def test_a_case_torch_refuses_is_kept_with_its_error():
    from tcemu._src.record import attempt, environment

    def refused():
        raise RuntimeError("OOM trying to allocate workspace for cublaslt")

    assert attempt(refused) == "RuntimeError: OOM trying to allocate workspace for cublaslt"
    with pytest.raises(TypeError):  # not torch's refusal: a bug, raised
        attempt(lambda: None + 1)
    env = {"CUBLAS_WORKSPACE_CONFIG": ":0:0", "CUBLASLT_WORKSPACE_SIZE": "0", "PATH": "/bin"}
    assert environment(env) == {"CUBLAS_WORKSPACE_CONFIG": ":0:0", "CUBLASLT_WORKSPACE_SIZE": "0"}
