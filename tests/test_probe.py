"""tcemu.probe: the feature tests recover every preset's parameters (the AMD adders' fields
included), flag a wrong custom model, recover random custom models, tell apart custom models that
differ in one AMD field, and find on the emulator what they found on the H200's tensor cores
(tests/data/probe_sm90.json, from experiments/hardware/probe_hw.py)."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

import tcemu
from tcemu.__main__ import main
from tcemu._src.arch import resolve
from tcemu._src.isa.parse import parse
from tcemu._src.numerics import presets
from tcemu._src.numerics.mma import resolve_model
from tcemu._src.probe import expected, probe_instruction

DATA = Path(__file__).parent / "data"

# every (GPU, instruction) whose numerics a preset defines, one per distinct model; the H100/H200
# mma.sync and wgmma forms probed on the hardware are checked against it below instead
PRESET_CASES = [
    ("V100", "wmma.mma.sync.aligned.row.col.m16n16k16.f32.f32"),
    ("V100", "mma.sync.aligned.m8n8k4.row.col.f32.f16.f16.f32"),
    ("T4", "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32"),
    ("A100", "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"),
    ("A100", "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"),
    ("A100", "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32"),
    ("L40S", "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32"),
    ("H100", "wmma.mma.sync.aligned.row.col.m16n16k8.f32.tf32.tf32.f32"),
    ("H100", "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e5m2.f32"),
    ("B200", "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"),
    ("B200", "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32"),
    ("B200", "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32"),
    ("RTX5090", "mma.sync.aligned.m16n8k32.row.col.kind::mxf8f6f4.block_scale.scale_vec::1X.f32.e4m3.e5m2.f32.ue8m0"),
]


def _check(r: tcemu.ProbeResult, want: dict):
    for key, v in want.items():
        got = getattr(r, key)
        if got is None and key == "addend":
            # C's block shows only when the alignment keeps bits the accumulator loses
            assert r.fraction_bits <= r.accumulator_bits, r
            continue
        assert got == v, (key, got, v)


@pytest.mark.parametrize("arch,spelling", PRESET_CASES)
def test_probe_recovers_preset(arch, spelling):
    r = tcemu.probe(arch, instruction=spelling)
    _check(r, expected(resolve_model(parse(spelling), None, resolve(arch)), spelling))


H200 = json.loads((DATA / "probe_sm90.json").read_text())


def test_hardware_probe_covers_mma_sync_and_wgmma():
    assert len(H200) == 12 and sum(sp.startswith("wgmma") for sp in H200) == 5


@pytest.mark.parametrize("spelling", sorted(H200))
def test_probe_matches_h200_tensor_cores(spelling):
    """The same probe, run on the H200 through experiments/hardware/probe_hw.py, found these (the
    AMD adders' fields, added since, are the preset's)."""
    r = dataclasses.asdict(tcemu.probe("sm_90", instruction=spelling))
    want = dict(H200[spelling]["hardware"])
    want["block_order"] = None if want["block_order"] is None else tuple(want["block_order"])
    assert {k: r[k] for k in want} == want
    preset = expected(resolve_model(parse(spelling), None, resolve("sm_90")), spelling)
    assert {k: r[k] for k in AMD_FIELDS} == {k: preset[k] for k in AMD_FIELDS}


AMD_FIELDS = ("block_sum", "addend_alignment", "sum_fraction_bits", "split_even_odd", "product_overflow")
# every AMD (GPU, MFMA) whose numerics a preset defines: CDNA3 f16, bf16, xf32 and the four fp8/bf8
# pairs; CDNA2 f16, bf16 (pairs) and bf16_1k (pairs of pairs)
AMD_CASES = [("MI300X", f"v_mfma_f32_{s}") for s in (
    "32x32x8_f16", "32x32x8_bf16", "32x32x4_xf32", "32x32x16_fp8_fp8", "32x32x16_fp8_bf8", "32x32x16_bf8_fp8",
    "32x32x16_bf8_bf8")] + [("MI250X", f"v_mfma_f32_{s}") for s in ("32x32x8f16", "32x32x4bf16", "32x32x8bf16_1k")] + [
    ("MI100", f"v_mfma_f32_{s}") for s in ("32x32x8f16", "32x32x4bf16")]


@pytest.mark.parametrize("arch,spelling", AMD_CASES)
def test_probe_recovers_amd_preset(arch, spelling):
    """Every field the probe measures equals the preset's: CDNA3's floor alignment of C, its F2 =
    31, the fp8 even/odd split and the infinite product of 2**128 (bf16, xf32: f16 and fp8 inputs
    cannot form one: None); CDNA2's pairwise sum, its block of 4 (bf16 without _1k: 2) and flush
    to zero (the fields of a fused block, F and C's alignment, are None there)."""
    a = resolve(arch)
    m = resolve_model(probe_instruction(spelling, a), None, a)
    r = tcemu.probe(arch, instruction=spelling)
    _check(r, expected(m, spelling, a))
    if m.block_sum == "pairwise":
        assert (r.block_sum, r.block_size, r.subnormal_inputs, r.fraction_bits) == ("pairwise", m.block_size, False, None)
    elif m.block_sum == "exact":  # CDNA1: 4 (bf16: 2) products and C summed exactly, subnormals kept
        assert (r.block_sum, r.block_size, r.subnormal_inputs, r.fraction_bits) == ("exact", m.block_size, True, None)
    else:
        want = dict(addend_alignment="floor", sum_fraction_bits=31, split_even_odd=m.split_even_odd,
                    fraction_bits=24, block_size=m.block_size, rounding="rne")
        assert {k: getattr(r, k) for k in want} == want


_CDNA3_FP8 = presets.numerics("MI300X").fp8_mma
# custom models that differ from a preset in one AMD field (product_overflow goes with "fused",
# which does not take it; the last two differ in F and the rounding as well, to see the even/odd
# split with F = 26 and F2 under RZ): (GPU, input format, model, field that differs); the truth is
# the configured model, not the probe's inference
ONE_FIELD = [
    ("MI300X", "f16", presets.CDNA3_TR.replace(addend_alignment="fused", product_overflow="none"), "addend_alignment"),
    ("MI300X", "f16", presets.CDNA3_TR.replace(sum_fraction_bits=28), "sum_fraction_bits"),
    ("MI300X", "f16", presets.CDNA3_TR.replace(sum_fraction_bits=30), "sum_fraction_bits"),
    ("MI300X", "e4m3fnuz", _CDNA3_FP8.replace(split_even_odd=False), "split_even_odd"),
    ("MI300X", "bf16", presets.CDNA3_TR.replace(product_overflow="none"), "product_overflow"),
    ("MI250X", "f16", presets.CDNA2_FTZ.replace(block_sum="fused"), "block_sum"),
    ("MI250X", "f16", presets.CDNA2_FTZ.replace(block_sum="exact", subnormal_inputs=True, subnormal_outputs=True,
                                                exact_zero="+0"), "block_sum"),
    ("MI100", "f16", presets.numerics("MI100").f16.replace(block_sum="pairwise", exact_zero="ieee"), "block_sum"),
    ("MI300X", "e5m2fnuz", _CDNA3_FP8.replace(fraction_bits=26), "fraction_bits"),
    ("MI300X", "bf16", presets.CDNA3_TR.replace(sum_fraction_bits=25, rounding="rz"), "sum_fraction_bits"),
]


@pytest.mark.parametrize("arch,fmt,model,field", ONE_FIELD)
def test_probe_tells_apart_one_amd_field(arch, fmt, model, field):
    """The probe, told nothing of the model, finds the field that differs (and the preset's value
    on the preset: test_probe_recovers_amd_preset), and every other feature it measures."""
    r = tcemu.probe(arch, fmt, model=model)
    preset = resolve_model(probe_instruction(r.instruction, resolve(arch)), None, resolve(arch))
    assert getattr(r, field) == getattr(model, field) != getattr(preset, field)
    _check(r, expected(model, r.instruction, resolve(arch)))


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow],
          phases=[Phase.explicit, Phase.reuse, Phase.generate])
@given(F=st.integers(23, 28), L=st.sampled_from([4, 8, 16]), rounding=st.sampled_from(["rz", "rne", "rna", "ru", "rd"]),
       normalize=st.booleans())
@example(F=24, L=4, rounding="rna", normalize=False)
@example(F=23, L=8, rounding="ru", normalize=True)
def test_probe_recovers_custom_models(F, L, rounding, normalize):
    m = tcemu.BlockFMA(fraction_bits=F, block_size=L, rounding=rounding, normalize_products=normalize)
    sp = "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"
    r = tcemu.probe("H100", instruction=sp, model=m)
    want = expected(m, sp)
    if F - normalize < 23:  # the rounding and block tests need bits the accumulator does not keep
        assert r.rounding == "undetermined" and r.block_size is None
        want.pop("rounding")
        want.pop("block_size")
    _check(r, want)


def test_probe_cli_flags_a_wrong_model(capsys):
    assert main(["probe", "--arch", "H100", "--format", "f16", "--model", "fraction_bits=24,block_size=16"]) == 1
    out = capsys.readouterr().out
    assert "24   <-- differs from the H100 preset (25)" in out
    assert "1 feature(s) of your model differ" in out
    assert main(["probe", "--arch", "H100", "--format", "bf16", "--model", "fraction_bits=25,block_size=8,rounding=rne"]) == 1
    out = capsys.readouterr().out
    assert "differs from the H100 preset (16)" in out and "differs from the H100 preset (rz)" in out


def test_probe_cli_preset_and_errors(capsys):
    assert main(["probe", "--arch", "A100", "--format", "tf32"]) == 0
    out = capsys.readouterr().out
    assert "fused block size" in out and "every measured feature equals the preset" in out
    with pytest.raises(SystemExit) as e:
        main(["probe", "--model", "bogus=1"])
    assert e.value.code == 2
    assert "unknown BlockFMA field 'bogus'" in capsys.readouterr().err
    with pytest.raises(ValueError, match="fmt='bf16' disagrees with the instruction: .* takes f16 inputs"):
        tcemu.probe("H100", "bf16", instruction="mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32")
    with pytest.raises(ValueError, match="f32 C and D"):
        tcemu.probe("H100", instruction="mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16")
