"""Bad and edge inputs of the command line and the studies (tcemu.probe, tcemu.error_vs_k and their
result classes): the CLI answers a bad argument with one line on stderr and exit status 2, the
functions with a TypeError/ValueError raised by tcemu that names the argument."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import tcemu
from tcemu.__main__ import main, parse_model
from tcemu._src.arch import SM
from tcemu._src.studies import fp32_chain_error

F16_MMA = "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"
BF16_MMA = "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"
LOAD_A = "wmma.load.a.sync.aligned.row.m16n16k16.f16"
WGMMA = "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3"


def _one_line_error(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    assert re.match(r"tcemu( (demo|layout|probe))?: error: \S", lines[0]), lines[0]
    return lines[0]


# ---------------------------------------------------------------------------------------------
# the command line

BAD_ARGV = [  # (argv, part of the message); {tmp} is a fresh directory
    (["layout", LOAD_A, "--png", "/nonexistent/x.png"], "no such directory /nonexistent"),
    (["layout", LOAD_A, "--png", "{tmp}/dir.png"], "is a directory"),
    (["layout", LOAD_A, "--png", "{tmp}"], "does not end in .png"),
    (["layout", LOAD_A, "--png", "{tmp}/x.svg"], "does not end in .png"),
    (["layout", LOAD_A, "--arch", "sm_99"], "unknown arch 'sm_99'"),
    (["layout", LOAD_A, "--arch", ""], "unknown arch"),
    (["layout", LOAD_A + "x"], "unknown qualifier .f16x"),
    (["layout", ""], "empty PTX spelling"),
    (["layout", F16_MMA, "--matrix", "z"], "invalid choice: 'z'"),
    (["layout", LOAD_A, "--matrix", "b"], "--matrix picks an operand of an MMA"),
    (["layout", WGMMA, "--matrix", "b"], "in shared memory: pass --desc"),
    (["layout", WGMMA, "--desc", "0x1g"], "is not an integer"),
    (["layout", WGMMA, "--desc", str(1 << 14)], "lie outside its fields"),
    (["layout", WGMMA, "--desc", "0", "--tnsp"], "only f16/bf16 operands can be MN-major"),
    (["layout", WGMMA, "--desc", "0", "--matrix", "d"], "only A and B are read through a descriptor"),
    (["layout", F16_MMA, "--desc", "0"], "--desc and --tnsp are for wgmma.mma_async"),
    (["layout", "wgmma.fence.sync.aligned"], "has no fragment to draw"),
    (["layout"], "required: spelling"),
    (["probe", "--arch", "sm_99"], "unknown arch 'sm_99'"),
    (["probe", "--arch", "H1000"], "did you mean"),
    (["probe", "--model", "fraction_bits=abc"], "fraction_bits"),
    (["probe", "--model", "fraction_bits=24.5"], "fraction_bits"),
    (["probe", "--model", "fraction_bits=-3"], "fraction_bits"),
    (["probe", "--model", "nosuchfield=1"], "unknown BlockFMA field 'nosuchfield'; valid: fraction_bits"),
    (["probe", "--model", "rounding=xyz"], "rounding must be one of 'rz'"),
    (["probe", "--model", "fraction_bits"], "'fraction_bits' is not name=value"),
    (["probe", "--model", ""], "sets no field"),
    (["probe", "--model", "block_size=8,block_size=16"], "'block_size' given twice"),
    (["probe", "--model", "block_order=[0,1"], "item '1' is not name=value"),
    (["probe", "--format", "fp16"], "invalid choice: 'fp16'"),
    (["probe", "--format", "f16", "--instruction", BF16_MMA], "--format f16 disagrees with --instruction"),
    (["probe", "--format", "e5m2", "--instruction", "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e5m2.f32"],
     "disagrees"),
    (["probe", "--instruction", LOAD_A], "probe needs an MMA instruction"),
    (["probe", "--instruction", "mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16"], "f32 C and D"),
    (["probe", "--instruction", "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32"], "f32 C and D"),
    (["probe", "--instruction", "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f33"], "unknown qualifier"),
    (["probe", "--instruction", ""], "empty PTX spelling"),
    (["probe", "--arch", "V100", "--format", "bf16"], "requires sm_80"),
    (["probe", "--arch", "T4", "--format", "tf32", "--model", "fraction_bits=24"], "requires sm_80"),
    (["demo", "--kmax", "8"], "--kmax: must be an integer from 32 to 16384, got '8'"),
    (["demo", "--kmax", "16"], "from 32 to 16384"),
    (["demo", "--kmax", "-32"], "from 32 to 16384"),
    (["demo", "--kmax", "32768"], "from 32 to 16384"),
    (["demo", "--kmax", "1e3"], "from 32 to 16384"),
    (["demo", "--outputs", "0"], "--outputs: must be an integer from 1 to 4096, got '0'"),
    (["demo", "--outputs", "-5"], "from 1 to 4096"),
    (["demo", "--outputs", "x"], "from 1 to 4096"),
    (["demo", "--out", "/nonexistent/x"], "no such directory /nonexistent"),
    (["demo", "--out", "{tmp}/"], "names no file"),
    (["demo", "--out", "{tmp}/csvdir"], "csvdir.csv is a directory"),
    (["demo", "--nosuch"], "unrecognized arguments"),
    ([], "required: cmd"),
    (["bogus"], "invalid choice: 'bogus'"),
]


@pytest.mark.parametrize("argv,message", BAD_ARGV, ids=[" ".join(a)[:60] or "none" for a, _ in BAD_ARGV])
def test_cli_bad_argument_is_one_line_exit_2(tmp_path, capsys, argv, message):
    (tmp_path / "dir.png").mkdir()
    (tmp_path / "csvdir.csv").mkdir()
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""  # checked before any work is done
    line = _one_line_error(err)
    assert message in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["csvdir.csv", "dir.png"]  # nothing written


@pytest.mark.parametrize("argv", [["layout", LOAD_A, "--png", "/nonexistent/x.png"],
                                  ["probe", "--model", "fraction_bits=abc"],
                                  ["probe", "--format", "f16", "--instruction", BF16_MMA],
                                  ["demo", "--kmax", "8"]])
def test_cli_entry_point_bad_argument(argv):
    r = subprocess.run([sys.executable, "-m", "tcemu", *argv], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and r.stdout == ""
    assert _one_line_error(r.stderr).startswith(f"tcemu {argv[0]}: error: ")


def test_cli_write_error_while_writing(tmp_path, capsys, monkeypatch):
    """A file that passes the early check but cannot be written: the OSError becomes one line."""
    import tcemu._src.draw as draw

    def fail(frag, title="", path=None):
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(draw, "draw_fragment", fail)
    png = tmp_path / "x.png"
    with pytest.raises(SystemExit) as e:
        main(["layout", LOAD_A, "--png", str(png)])
    assert e.value.code == 2
    line = _one_line_error(capsys.readouterr().err)
    assert line.endswith(f"cannot write {png}: Permission denied")


@pytest.mark.parametrize("arch", sorted(SM))
def test_cli_layout_every_arch(capsys, arch):
    assert main(["layout", LOAD_A, "--arch", arch]) == 0
    assert f"on {arch}: 16 x 16" in capsys.readouterr().out


@pytest.mark.parametrize("arch", ["sm_72", "sm_87"])
def test_cli_probe_jetson_archs(capsys, arch):
    assert main(["probe", "--arch", arch, "--format", "f16"]) == 0
    assert "every measured feature equals the preset" in capsys.readouterr().out


def test_cli_probe_format_agreeing_with_instruction(capsys):
    assert main(["probe", "--arch", "A100", "--format", "bf16", "--instruction", BF16_MMA]) == 0
    out = capsys.readouterr().out
    assert f"bf16 inputs: {BF16_MMA}" in out and "f16 inputs" not in out.replace("bf16 inputs", "")


def test_cli_demo_smallest_kmax(tmp_path, capsys):
    """--kmax 32, the smallest the help offers, gives every row (fp8 too) a result at K = 32."""
    out = tmp_path / "d"
    assert main(["demo", "--kmax", "32", "--outputs", "1", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    header = next(ln for ln in text.splitlines() if "max relative error" in ln)
    assert header.split()[-2:] == ["K=16", "K=32"]
    rows = [ln for ln in text.splitlines() if "e4m3" in ln and ln.startswith("   ") and "chain" not in ln]
    assert len(rows) == 4 and all(re.fullmatch(r"\d\.\de[+-]\d\d", ln.split()[-1]) for ln in rows), rows
    csv = (tmp_path / "d.csv").read_text().splitlines()
    fp8 = {ln.split(",")[0] for ln in csv if ",e4m3,wgmma" in ln or ",e4m3,mma" in ln}
    assert fp8 == {"L40S e4m3", "H100 e4m3", "H100 e4m3 + promotion/128", "B200 e4m3"}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["fraction_bits", "block_size", "rounding", "block_order", "sticky",
                                           "addend", "nosuch", ""]),
                          st.sampled_from(["", "=", "=24", "=8", "=rne", "=xyz", "=[0,1]", "=[0,1", "=(1,", "=None",
                                           "=true", "=1e999", "=-1", "=2.5", "={}", "=[[[]]]", "='a'", "=first"])),
                max_size=4),
       st.text(max_size=6))
def test_parse_model_gives_blockfma_or_clear_error(items, noise):
    text = ",".join(k + v for k, v in items) + noise
    try:
        m = parse_model(text)
    except (ValueError, TypeError) as e:
        assert str(e)
    else:
        assert isinstance(m, tcemu.BlockFMA)


# ---------------------------------------------------------------------------------------------
# tcemu.error_vs_k and ErrorCurve

OK = dict(fmt="f16", arch="H100", ks=(16,), outputs=4)
BAD_ERROR_VS_K = [  # (changes, error, message)
    (dict(outputs=0), ValueError, "outputs must be an integer >= 1, got 0"),
    (dict(outputs=-1), ValueError, "outputs"),
    (dict(outputs=2.5), TypeError, "outputs"),
    (dict(outputs=True), TypeError, "outputs"),
    (dict(outputs="4"), TypeError, "outputs"),
    (dict(ks=()), ValueError, "ks is empty"),
    (dict(ks=(16.0,)), TypeError, r"ks\[0\]"),
    (dict(ks=(16, -16)), ValueError, r"ks\[1\] must be an integer >= 1"),
    (dict(ks=(0,)), ValueError, r"ks\[0\]"),
    (dict(ks=16), TypeError, "ks must be a sequence"),
    (dict(ks="16"), TypeError, "ks must be a sequence"),
    (dict(ks=(16, 24)), ValueError, r"multiples of the instruction's K = 16, got \[24\]"),
    (dict(ks=(8,)), ValueError, "below the instruction's K = 16"),
    (dict(fmt="fp16"), ValueError, "fmt must be one of 'f16'"),
    (dict(fmt=16), TypeError, "fmt"),
    (dict(dist="gauss"), ValueError, "dist must be one of 'uniform', 'normal'"),
    (dict(seed=-1), ValueError, "seed"),
    (dict(seed=1.5), TypeError, "seed"),
    (dict(model="rz"), TypeError, "model"),
    (dict(model={"fraction_bits": 24}), TypeError, "model"),
    (dict(model=tcemu.numerics("V100"), fmt="bf16"), ValueError, "model="),
    (dict(arch="sm_99"), ValueError, "unknown arch 'sm_99'"),
    (dict(arch=90), TypeError, "arch"),
    (dict(arch="V100", fmt="bf16"), ValueError, "requires sm_80"),
    (dict(instruction=BF16_MMA), ValueError, "fmt='f16'"),
    (dict(instruction="mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16"), ValueError, "f32 D"),
    (dict(instruction=LOAD_A), ValueError, "instruction must be an MMA"),
    (dict(instruction=5), TypeError, "instruction"),
    (dict(promotion_interval=0), ValueError, "promotion_interval"),
    (dict(promotion_interval=2.5), TypeError, "promotion_interval"),
    (dict(promotion_interval=24), ValueError, "promotion_interval must be a positive multiple of K = 16"),
    (dict(label=5), TypeError, "label"),
]


@pytest.mark.parametrize("changes,err,match", BAD_ERROR_VS_K, ids=[str(c)[:50] for c, _, _ in BAD_ERROR_VS_K])
def test_error_vs_k_bad_arguments(changes, err, match):
    kw = {**OK, **changes}
    with pytest.raises(err, match=match):
        tcemu.error_vs_k(kw.pop("fmt"), kw.pop("arch"), kw.pop("ks"), **kw)


@pytest.mark.parametrize("changes,err,match", [  # no instruction here: any positive length goes
    c for c in BAD_ERROR_VS_K if set(c[0]) <= {"fmt", "ks", "outputs", "dist", "seed"} and "instruction" not in c[2]])
def test_fp32_chain_error_bad_arguments(changes, err, match):
    kw = {**OK, **changes}
    kw.pop("arch")
    with pytest.raises(err, match=match):
        fp32_chain_error(kw.pop("fmt"), kw.pop("ks"), **kw)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(BAD_ERROR_VS_K), st.sampled_from([{}, dict(dist="normal"), dict(seed=3),
                                                         dict(promotion_interval=32), dict(ks=(16, 64, 32))]))
def test_error_vs_k_one_bad_argument_among_good_ones(bad, good):
    """Any bad argument, whatever the good ones beside it, is named in a TypeError/ValueError."""
    changes, err, match = bad
    kw = {**OK, **good, **changes}
    with pytest.raises((TypeError, ValueError)) as e:
        tcemu.error_vs_k(kw.pop("fmt"), kw.pop("arch"), kw.pop("ks"), **kw)
    named = [k for k in changes if k in str(e.value)] or [k for k in changes if re.search(match, str(e.value))]
    assert named, (changes, str(e.value))


def test_error_vs_k_outputs_are_the_dot_products_measured():
    """outputs=1 measures one dot product (max = mean), not a whole 16 x 8 tile; lengths below the
    instruction's K are skipped and repeats merged."""
    r = tcemu.error_vs_k("e4m3", "L40S", ks=(16, 32, 32), outputs=1)
    assert r.k == (32,) and r.max_rel == r.mean_rel
    r = tcemu.error_vs_k("f16", "A100", ks=(16, 32), outputs=2)
    assert r.k == (16, 32) and all(mx > mn for mx, mn in zip(r.max_rel, r.mean_rel))
    c = fp32_chain_error("bf16", (8, 4096), outputs=1)
    assert c.k == (8, 4096) and c.max_rel == c.mean_rel


def test_error_curve_validates_and_normalises():
    c = tcemu.ErrorCurve("x", "f16", F16_MMA, [16, 32], [np.float64(1e-7), 2e-7], (5e-8, 0))
    assert c.k == (16, 32) and c.max_rel == (1e-7, 2e-7) and c.mean_rel == (5e-8, 0.0)
    assert type(c.max_rel[0]) is float and hash(c)
    bad = [(dict(label=5), TypeError, "label"), (dict(fmt="fp8"), ValueError, "fmt"),
           (dict(instruction=None), TypeError, "instruction"), (dict(k=(32, 16)), ValueError, "increasing"),
           (dict(k=(16, 16)), ValueError, "increasing"), (dict(k=(0, 16)), ValueError, r"k\[0\]"),
           (dict(k=16), TypeError, "ErrorCurve.k"), (dict(k=(16.0, 32)), TypeError, r"k\[0\]"),
           (dict(max_rel=(1e-7,)), ValueError, "max_rel must have one error per k"),
           (dict(mean_rel=(1e-7, -1.0)), ValueError, r"mean_rel\[1\] must be >= 0"),
           (dict(mean_rel=("a", 1.0)), TypeError, r"mean_rel\[0\]"), (dict(max_rel=None), TypeError, "max_rel")]
    base = dict(label="x", fmt="f16", instruction=F16_MMA, k=(16, 32), max_rel=(1e-7, 2e-7), mean_rel=(5e-8, 1e-7))
    for changes, err, match in bad:
        with pytest.raises(err, match=match):
            tcemu.ErrorCurve(**{**base, **changes})


# ---------------------------------------------------------------------------------------------
# tcemu.probe and ProbeResult


@pytest.mark.parametrize("kw,err,match", [
    (dict(arch="sm_99"), ValueError, "unknown arch 'sm_99'"),
    (dict(arch=90), TypeError, "arch"),
    (dict(fmt="fp16"), ValueError, "fmt must be one of 'f16'"),
    (dict(fmt=16), TypeError, "fmt"),
    (dict(model="rz"), TypeError, "model"),
    (dict(model=dict(fraction_bits=24)), TypeError, "model"),
    (dict(model=tcemu.numerics("V100"), fmt="bf16"), ValueError, "model="),
    (dict(instruction=5), TypeError, "instruction"),
    (dict(instruction=LOAD_A), ValueError, "needs an MMA"),
    (dict(instruction="mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64"), ValueError, "f32 C and D"),
    (dict(instruction=F16_MMA, fmt="bf16"), ValueError, "fmt='bf16' disagrees"),
    (dict(arch="V100", fmt="bf16"), ValueError, "requires sm_80"),
    (dict(mma=5), TypeError, "mma must be a function"),
    (dict(mma=tcemu.mma, model=tcemu.BlockFMA()), ValueError, "not both"),
])
def test_probe_bad_arguments(kw, err, match):
    with pytest.raises(err, match=match):
        tcemu.probe(**kw)


def _emulated(sp, a, b, c):
    return tcemu.mma(sp, a, b, c, arch="H100")


@pytest.mark.parametrize("wrong,what", [
    (lambda sp, a, b, c: _emulated(sp, a, b, c)[:, :, :4], r"shape=\(\d+, 16, 4\)"),
    (lambda sp, a, b, c: _emulated(sp, a, b, c)[0], r"shape=\(16, 8\)"),
    (lambda sp, a, b, c: np.asarray(_emulated(sp, a, b, c), np.float64), "dtype=float64"),
    (lambda sp, a, b, c: np.asarray(_emulated(sp, a, b, c)).astype(np.float16), "dtype=float16"),
    (lambda sp, a, b, c: 3.0, "returned float shape=None"),
    (lambda sp, a, b, c: np.asarray(_emulated(sp, a, b, c)).tolist(), "returned list"),
])
def test_probe_user_function_wrong_return(wrong, what):
    with pytest.raises(ValueError, match=what) as e:
        tcemu.probe("H100", instruction=F16_MMA, mma=wrong)
    assert re.search(r"expected D as a float32 array of shape \(\d+, 16, 8\)", str(e.value))


def test_probe_user_function_numpy_float32():
    """A function returning NumPy float32 arrays (as a GPU runner does) is probed like the emulator."""
    mine = tcemu.probe("H100", instruction=F16_MMA, mma=lambda sp, a, b, c: np.asarray(_emulated(sp, a, b, c)))
    assert mine == tcemu.probe("H100", instruction=F16_MMA)


def test_probe_result_validates_and_normalises():
    hw = json.loads((Path(__file__).parent / "data" / "probe_sm90.json").read_text())
    for pair in hw.values():
        for fields in pair.values():
            r = tcemu.ProbeResult(**fields)  # JSON lists become tuples
            assert r.block_order is None or type(r.block_order) is tuple
            assert hash(r)
    base = dict(instruction=F16_MMA, fraction_bits=25, accumulator_bits=23, block_size=16, block_order=None,
                rounding="rz", normalized_products=False, addend="first", subnormal_inputs=True,
                subnormal_outputs=True)
    assert tcemu.ProbeResult(**{**base, "block_order": [0, 1, 4, 5], "fraction_bits": np.int64(24)}) == \
        tcemu.ProbeResult(**{**base, "block_order": (0, 1, 4, 5), "fraction_bits": 24})
    bad = [(dict(instruction=None), TypeError, "instruction"), (dict(fraction_bits="25"), TypeError, "fraction_bits"),
           (dict(fraction_bits=-1), ValueError, "fraction_bits"), (dict(block_size=0), ValueError, "block_size"),
           (dict(accumulator_bits=23.0), TypeError, "accumulator_bits"),
           (dict(block_order="0,1"), TypeError, "block_order"), (dict(block_order=[0, -1]), ValueError, "block_order"),
           (dict(rounding="nearest"), ValueError, "rounding must be one of 'rz'"),
           (dict(addend="middle"), ValueError, "addend"), (dict(normalized_products="no"), TypeError, "normalized"),
           (dict(subnormal_inputs=None), TypeError, "subnormal_inputs"),
           (dict(subnormal_outputs=1), TypeError, "subnormal_outputs"),
           (dict(block_sum="separate"), ValueError, "block_sum must be one of 'fused', 'pairwise'"),
           (dict(addend_alignment="truncate"), ValueError, "addend_alignment"),
           (dict(sum_fraction_bits=0), ValueError, "sum_fraction_bits"),
           (dict(split_even_odd="yes"), TypeError, "split_even_odd must be a bool or None"),
           (dict(product_overflow="nan"), ValueError, "product_overflow")]
    for changes, err, match in bad:
        with pytest.raises(err, match=match):
            tcemu.ProbeResult(**{**base, **changes})


def test_studies_same_results_with_x64(x64):
    """probe and error_vs_k find the same with jax_enable_x64 on (this test) as off (the rest)."""
    import jax

    assert jax.config.jax_enable_x64
    assert tcemu.probe("A100", "tf32") == tcemu.ProbeResult(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32", 24, 23, 4, None, "rz", False, "first", True, True,
        block_sum="fused", addend_alignment="fused", split_even_odd=False, product_overflow="none")
    with_x64 = tcemu.error_vs_k("e4m3", "H100", ks=(32, 256), outputs=4, promotion_interval=128)
    with jax.enable_x64(False):
        assert tcemu.error_vs_k("e4m3", "H100", ks=(32, 256), outputs=4, promotion_interval=128) == with_x64
