"""library_config(..., workspace=0): torch's GEMMs in a process with a zero cuBLAS workspace
(``CUBLAS_WORKSPACE_CONFIG=:0:0``, ``CUBLASLT_WORKSPACE_SIZE=0``), against captures made so on an
H200 (development: ``*fresh10_workspace0.npz`` and the layer grid's; held out: ``*fresh11_workspace0.npz``,
opened after 98b90a4 froze the rule); the argument's checks; records made so."""
from __future__ import annotations

import gzip
import json
import sys

import pytest

import tcemu
from conftest import ROOT
from tcemu._src import captures as C
from tcemu._src import library_records as R

sys.path.insert(0, str(ROOT / "experiments" / "hardware"))
from check_layer_presets import preset  # noqa: E402
from check_records import check  # noqa: E402

DATA = ROOT / "tests" / "data"
DEV = ("library_gemm_h200_torch_fresh10_workspace0.npz", "layer_gemm_h200_torch_default_fresh10_workspace0.npz",
       "layer_gemm_h200_torch_default_workspace0.npz")
# the development captures' misses (every one a "nearest" answer: the default answer's own guess
# at 1112 x 176 x 358 bf16, and a CUTLASS 2 split at 333 x 1000 x 555 f16 whose unsplit kernel is
# another CUTLASS kernel)
DEV_MISSES = {("library_gemm_h200_torch_fresh10_workspace0.npz", "c6"), ("library_gemm_h200_torch_fresh10_workspace0.npz", "c7"),
              ("layer_gemm_h200_torch_default_fresh10_workspace0.npz", "l24"),
              ("layer_gemm_h200_torch_default_fresh10_workspace0.npz", "l28"),
              *(("layer_gemm_h200_torch_default_workspace0.npz", k) for k in ("l44", "l48", "l49", "l51"))}
HELD_OUT = ("library_gemm_h200_torch_fresh11_workspace0.npz", "layer_gemm_h200_torch_default_fresh11_workspace0.npz")
# the held-out capture's misses (all at K or N off a multiple of 8, "nearest": f16 at 864 x 64 x
# 2615 and 157 x 4213 x 2944, where cuBLAS's unsplit kernel is CUTLASS's wmma s161616, not the
# default's s1688)
HELD_OUT_MISSES = {*(("library_gemm_h200_torch_fresh11_workspace0.npz", k) for k in ("c0", "c1", "c48", "c49")),
                   *(("layer_gemm_h200_torch_default_fresh11_workspace0.npz", f"l{i}")
                     for i in (0, 1, 4, 5, 7, 172, 173, 174, 175, 176, 177, 178, 179))}
MISSES = DEV_MISSES | HELD_OUT_MISSES


def _default_splits(meta, case) -> bool:
    """Whether library_config's default-workspace answer splits K for a captured case."""
    lib, flags, M, batch = preset(case) if "layer" in case else (case["lib"], case["flags"], case["M"], case["batch"])
    cfg = tcemu.library_config(lib, arch="H200", M=M, N=case["N"], K=case["K"], a=case["a"], b=case["b"],
                               out=case["out"], batch=batch, **flags)
    return cfg.schedule.slices != 1


def _cases(names, split):
    out = []
    for name in names:
        meta = C.load(DATA / name)[1]
        out += [(name, c["key"]) for c in meta["cases"]
                if "key" in c and c["lib"].startswith(("torch", "F.")) and _default_splits(meta, c) == split]
    return out


SPLIT = _cases(DEV + HELD_OUT, True)
UNSPLIT = _cases(DEV + HELD_OUT, False)


def test_the_captures_ran_with_a_zero_workspace():
    for name in DEV + HELD_OUT:
        env = C.load(DATA / name)[1]["header"]["versions"]["env"]
        assert env == {"CUBLASLT_WORKSPACE_SIZE": "0", "CUBLAS_WORKSPACE_CONFIG": ":0:0"} and R.zero_workspace(env)
    assert len(SPLIT) == 202 and len(UNSPLIT) == 540  # development 138 and 338


@pytest.mark.parametrize("name, key", SPLIT, ids=[f"{n[:-4]}-{k}" for n, k in SPLIT])
def test_default_splits_dropped(name, key):
    # where cuBLAS would split K with a workspace: the same kernel unsplit; only the pinned misses
    # fail, each a "nearest" answer at K or N off a multiple of 8; with K and N multiples of 8: "rule"
    r = check((str(DATA / name), key, None, 8))
    assert r["flags"]["workspace"] == 0 and "slices=1," in r["config"]
    assert (r["match"] == 1) == ((name, key) not in MISSES), r
    aligned = r["shape"][3] % 8 == 0 and r["shape"][2] % 8 == 0
    assert r["source"] == ("rule" if aligned else "nearest"), r


@pytest.mark.parametrize("name, key", UNSPLIT[::5], ids=[f"{n[:-4]}-{k}" for n, k in UNSPLIT[::5]])
def test_default_unsplit_kept(name, key):
    # no split by default: the default answer ("recorded" ones all right; "rule" where it is one
    # chain per tile at K and N multiples of 8)
    r = check((str(DATA / name), key, None, 8))
    assert (r["match"] == 1) == ((name, key) not in MISSES), r
    assert r["source"] != "nearest" or r["shape"][3] % 8 or r["shape"][2] % 8 or r["lib"] == "torch._scaled_mm" \
        or "k_tile=0, residue='last', slices=1" not in r["config"], r


KW = dict(arch="H200", a="bf16", b="bf16", out="bf16")


def test_sources():
    cfg, src = tcemu.library_config("torch.mm", M=8, N=160, K=32768, with_source=True, **KW)
    assert (src, cfg.schedule.slices) == ("recorded", 25)
    cfg, src = tcemu.library_config("torch.mm", M=8, N=160, K=32768, workspace=0, with_source=True, **KW)
    assert (src, cfg.schedule.slices) == ("rule", 1)  # nvjet, recorded: the rule
    # no split by default: nothing changes
    plain = tcemu.library_config("torch.mm", M=4096, N=4096, K=512, with_source=True, **KW)
    assert tcemu.library_config("torch.mm", M=4096, N=4096, K=512, workspace=0, with_source=True, **KW) == plain


@pytest.mark.parametrize("kwargs, match", [
    (dict(lib="torch.mm", workspace=4096), "workspace must be 0"),
    (dict(lib="torch.mm", workspace=True), "workspace must be 0"),
    (dict(lib="torch.mm", workspace="0"), "workspace must be 0"),
    (dict(lib="jnp.dot", workspace=0), "workspace=0 is for cuBLAS through torch"),
    (dict(lib="jax.dense", workspace=0), "workspace=0 is for cuBLAS through torch"),
    (dict(lib="F.linear", workspace=0, allow_splitk=False), "OOM trying to allocate workspace"),
])
def test_bad_workspace(kwargs, match):
    with pytest.raises(ValueError, match=match):
        tcemu.library_config(M=64, N=64, K=16384, **kwargs, **KW)


def _records(tmp_path, env):
    # a record file of the H200 (shipped torch and cuBLASLt) holding one row, with the given environment
    header = {k: R.header(str(R.SHIPPED["H200"]))[k] for k in ("schema", "gpu", "sms", "cc", "torch", "cuda", "cublaslt")}
    row = {"lib": "torch.mm", "batch": None, "M": 64, "N": 64, "K": 64, "a": "bf16", "b": "bf16", "out": "bf16",
           "flags": {"reduced_precision_reduction": True}, "calls": [{"algo": {"algoId": 66, "numSplitsK": 1}}],
           "kernels": ["nvjet_sm90_tst_64x8_64x16_1x4_h_bz_NNT"]}
    path = tmp_path / f"h200_{len(env)}.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"header": dict(header, env=env), "cases": [row]}, f)
    return str(path)


def test_records_made_with_a_zero_workspace_imply_it(tmp_path):
    zero = _records(tmp_path, {"CUBLAS_WORKSPACE_CONFIG": ":0:0", "CUBLASLT_WORKSPACE_SIZE": "0"})
    other = _records(tmp_path, {})
    # off the file's one shape, the shipped forests answer (the twin GPU): split by default, unsplit here
    assert tcemu.library_config("torch.mm", M=8, N=160, K=32768, records=other, **KW).schedule.slices > 1
    assert tcemu.library_config("torch.mm", M=8, N=160, K=32768, records=zero, **KW).schedule.slices == 1
    with pytest.raises(ValueError, match="OOM trying"):
        tcemu.library_config("F.linear", M=8, N=160, K=32768, records=zero, allow_splitk=False, **KW)


def test_zero_workspace_reads_both_variables():
    assert not R.zero_workspace({"CUBLAS_WORKSPACE_CONFIG": ":0:0"})
    assert not R.zero_workspace({"CUBLASLT_WORKSPACE_SIZE": "0"})
    assert R.zero_workspace({"CUBLAS_WORKSPACE_CONFIG": ":0:8:4096:0", "CUBLASLT_WORKSPACE_SIZE": "0"})
    assert not R.zero_workspace({"CUBLAS_WORKSPACE_CONFIG": ":4096:8", "CUBLASLT_WORKSPACE_SIZE": "0"})
    assert not R.zero_workspace({"CUBLAS_WORKSPACE_CONFIG": "bad", "CUBLASLT_WORKSPACE_SIZE": "0"})
