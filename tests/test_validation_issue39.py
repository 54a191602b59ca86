"""Bad inputs of issue 39's probe: every one a tcemu ValueError/TypeError naming the argument and
its valid choices, never a JAX-internal traceback or a silently wrong number.

* Which architecture has which MMA, for every form the parser accepts, at value level
  (``tcemu.mma``), register level (``tcemu.ptx``) and in ``GemmConfig``, against tables written
  here from the PTX ISA's "Target ISA Notes" (not from tcemu's own tables).
* ``identify``: instructions the architecture lacks are skipped (none left: an error saying
  why), batch sizes that do not broadcast, bad ``candidates`` / ``max_seconds`` / ``library``.
* ``KSchedule.equivalent`` with a non-schedule; sizes beyond int32 in ``library_config`` and
  ``KSchedule.plan``.
* Forward-mode autodiff (``jax.jvp``, ``jax.jacfwd``) of ``tcemu.matmul`` against the exact
  tangent on the quantised operands (small integers: exact in float32, so NumPy's integer
  arithmetic is the truth), and its clear error for emulated backward GEMMs.
* Configurations as arguments of ``jax.jit`` (static pytrees).
* Hypothesis fuzz of ``identify``, ``library_config`` and ``KSchedule``.
"""
from __future__ import annotations

import functools
import itertools
import re
import time
import traceback
from pathlib import Path

import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import tcemu
from tcemu._src.isa.parse import parse
from tcemu._src.isa.instructions import TYPES

# the architectures of the issue (sm_89: RTX 4090 / L40S; sm_72: Xavier, where integer wmma starts)
ARCHS = {"V100": 70, "sm_72": 72, "T4": 75, "A100": 80, "sm_89": 89, "H100": 90, "B200": 100, "RTX5090": 120}
ARCH_ERROR = re.compile(r"requires sm_\d+|exists only on")

# ---------------------------------------------------------------------------------------------
# PTX ISA 9.7.14.5.14 (mma), "Target ISA Notes": the oldest sm_XX of each mma.sync type and shape

MMA_SYNC_SM = {
    ("f16", "m8n8k4"): 70,  # ".f16 floating point type mma operation with .m8n8k4 shape requires sm_70 or higher."
    ("f16", "m16n8k8"): 75,  # ".f16 floating point type mma operation with .m16n8k8 shape requires sm_75 or higher."
    ("f16", "m16n8k16"): 80,  # ".f16 floating point type mma operation with .m16n8k16 shape requires sm_80 or higher."
    # ".bf16 alternate floating point type mma operation with .m16n8k8 and .m16n8k16 shapes requires sm_80 or higher."
    ("bf16", "m16n8k8"): 80, ("bf16", "m16n8k16"): 80,
    # ".tf32 alternate floating point type mma operation with .m16n8k4 and .m16n8k8 shapes requires sm_80 or higher."
    ("tf32", "m16n8k4"): 80, ("tf32", "m16n8k8"): 80,
    ("f64", "m8n8k4"): 80,  # ".f64 floating point type mma operation with .m8n8k4 shape requires sm_80 or higher."
    # ".f64 floating point type mma operation with .m16n8k4, .m16n8k8, and .m16n8k16 shapes require sm_90 or higher."
    ("f64", "m16n8k4"): 90, ("f64", "m16n8k8"): 90, ("f64", "m16n8k16"): 90,
    ("int8", "m8n8k16"): 75,  # ".u8/.s8 integer type mma operation with .m8n8k16 shape requires sm_75 or higher."
    # ".u8/.s8 integer type mma operation with .m16n8k16 and .m16n8k32 shapes requires sm_80 or higher."
    ("int8", "m16n8k16"): 80, ("int8", "m16n8k32"): 80,
    ("int4", "m8n8k32"): 75,  # ".u4/.s4 integer type mma operation with .m8n8k32 shape sm_75 or higher."
    # ".u4/.s4 integer type mma operation with .m16n8k32 and .m16n8k64 shapes requires sm_80 or higher."
    ("int4", "m16n8k32"): 80, ("int4", "m16n8k64"): 80,
    ("b1", "m8n8k128"): 75,  # ".b1 single-bit integer type mma operation with .m8n8k128 shape sm_75 or higher."
    # ".b1 single-bit integer type mma operation with .m16n8k128 and .m16n8k256 shapes requires sm_80 or higher."
    ("b1", "m16n8k128"): 80, ("b1", "m16n8k256"): 80,
    # ".e4m3 and .e5m2 alternate floating point type mma operation requires sm_89 or higher."
    ("fp8", "m16n8k32"): 89,
    # .m16n8k16 with .e4m3 / .e5m2 came with PTX ISA 8.7 for sm_120a (the H200 capture
    # tests/data/mma_sync_sm90.npz holds every other fp8 form, not this one)
    ("fp8", "m16n8k16"): 120,
}
AND_SM = 80  # ".and operation in single-bit mma requires sm_80 or higher." (wmma: the same words)
# mma.sync .kind::f8f6f4 / .kind::mxf8f6f4 / .kind::mxf4 / .kind::mxf4nvf4 (types .e3m2, .e2m3,
# .e2m1, qualifiers .kind, .block_scale, .scale_vec_size): PTX ISA 8.7, sm_120a only
KIND_SM = 120
WGMMA_SM = 90  # wgmma.mma_async: "Requires sm_90a."
TCGEN05_SM = 100  # tcgen05.mma: sm_100a (of the architectures here)

# PTX ISA 9.7.14.4 (wmma), "Target ISA Notes" (/work/shared/ptx-isa/9.7.14.4-*.md)
WMMA_TYPE_SM = {
    **dict.fromkeys(("f16", "f32"), 70),  # "Floating point wmma requires sm_70 or higher."
    **dict.fromkeys(("s8", "u8", "s32"), 72),  # "Integer wmma requires sm_72 or higher."
    **dict.fromkeys(("s4", "u4", "b1"), 75),  # "Sub-byte and single-bit wmma requires sm_75 or higher."
    # "Double precision and alternate floating point precision wmma requires sm_80 or higher."
    **dict.fromkeys(("f64", "bf16", "tf32"), 80),
}
# "Double precision wmma and shape .m16n16k8 requires sm_80 or higher."; the sub-byte and
# single-bit shapes are sub-byte / single-bit wmma whatever the type (the s32 C of them too)
WMMA_SHAPE_SM = {"m16n16k8": 80, "m8n8k4": 80, "m8n8k32": 75, "m8n8k128": 75}

ACC = ("f16", "f32", "f64", "s32")  # the accumulator (C, D) types PTX has
FAMILY = {"f16": "f16", "bf16": "bf16", "tf32": "tf32", "f64": "f64", "e4m3": "fp8", "e5m2": "fp8",
          "s8": "int8", "u8": "int8", "s4": "int4", "u4": "int4", "b1": "b1"}


def _parses(spelling):
    try:
        parse(spelling)
    except ValueError:
        return False
    return True


@functools.lru_cache(maxsize=None)
def mma_sync_forms():
    """Every mma.sync spelling the parser accepts (D and C over the accumulator types, A and B over
    every type, then each accepted form with its optional qualifiers and layouts)."""
    shapes = ("m8n8k4", "m16n8k4", "m16n8k8", "m16n8k16", "m16n8k32", "m16n8k64", "m8n8k16", "m8n8k32",
              "m8n8k128", "m16n8k128", "m16n8k256")
    out = []
    for sh in shapes:
        for d, a, b, c in itertools.product(ACC, TYPES, TYPES, ACC):
            base = f"mma.sync.aligned.{sh}.row.col.{d}.{a}.{b}.{c}"
            for sp in ([base + ".xor.popc", base + ".and.popc"] if a == "b1" else [base]):
                if _parses(sp):
                    out.append(sp)
                    out += [v for x in ("satfinite", "rn", "rz", "rm", "rp")
                            if _parses(v := sp.replace(".row.col.", f".row.col.{x}."))]
                    out += [v for x in ("col.row", "row.row", "col.col")
                            if _parses(v := sp.replace(".row.col.", f".{x}."))]
    f8f6f4 = ("e4m3", "e5m2", "e3m2", "e2m3", "e2m1")
    out += [f"mma.sync.aligned.m16n8k32.row.col.kind::f8f6f4.{d}.{a}.{b}.{d}"
            for d in ("f32", "f16") for a in f8f6f4 for b in f8f6f4]
    out += [f"mma.sync.aligned.m16n8k32.row.col.kind::mxf8f6f4.block_scale{v}.f32.{a}.{b}.f32.ue8m0"
            for v in ("", ".scale_vec::1X") for a in f8f6f4 for b in f8f6f4]
    out += [f"mma.sync.aligned.m16n8k64.row.col.kind::mxf4.block_scale{v}.f32.e2m1.e2m1.f32.ue8m0"
            for v in ("", ".scale_vec::2X")]
    out += [f"mma.sync.aligned.m16n8k64.row.col.kind::mxf4nvf4.block_scale.scale_vec::{v}.f32.e2m1.e2m1.f32.{s}"
            for v, s in (("2X", "ue8m0"), ("4X", "ue8m0"), ("4X", "ue4m3"))]
    assert all(_parses(s) for s in out)
    return out


def mma_sync_need(spelling):
    """(oldest SM, whether only that one) from the spelling's own tokens and the tables above."""
    if ".kind::" in spelling:
        return KIND_SM, True
    toks = spelling.split(".")
    shape = next(t for t in toks if re.fullmatch(r"m\d+n\d+k\d+", t))
    atype = [t for t in toks if t in TYPES][1]
    need = MMA_SYNC_SM[(FAMILY[atype], shape)]
    return (max(need, AND_SM) if "and" in toks else need), False


@functools.lru_cache(maxsize=None)
def wmma_mma_forms():
    """Every wmma.mma spelling the parser accepts (A and B of one type, as wmma.mma has them)."""
    out = []
    for sh, lay in itertools.product(("m16n16k16", "m32n8k16", "m8n32k16", "m16n16k8", "m8n8k4", "m8n8k32", "m8n8k128"),
                                     ("row.col", "col.row", "row.row", "col.col")):
        for d, c in itertools.product(ACC, ACC):
            bases = [f"wmma.mma.sync.aligned.{lay}.{sh}.{d}.{c}"]
            bases += [f"wmma.mma.{op}sync.aligned.{lay}.{sh}.{d}.{a}.{a}.{c}" for a in TYPES
                      for op in (("xor.popc.", "and.popc.") if a == "b1" else ("",))]
            for sp in filter(_parses, bases):
                out.append(sp)
                out += [v for x in ("satfinite", "rn", "rz", "rm", "rp")
                        if _parses(v := sp.replace(f".{sh}.", f".{sh}.{x}."))]
    return out


def wmma_need(spelling):
    toks = spelling.split(".")
    shape = next(t for t in toks if t in WMMA_SHAPE_SM or re.fullmatch(r"m\d+n\d+k\d+", t))
    types = [t for t in toks if t in TYPES]
    if toks[1] == "mma":  # A's type; the two-type form .dtype.ctype is f16
        etype = types[1] if len(types) == 4 else "f16"
    else:  # wmma.load / wmma.store: the element type
        etype = types[-1]
    need = max(WMMA_TYPE_SM[etype], WMMA_SHAPE_SM.get(shape, 70))
    return max(need, AND_SM) if "and" in toks else need


@functools.lru_cache(maxsize=None)
def wmma_memory_forms():
    """Every wmma.load / wmma.store.d spelling the parser accepts (layout first)."""
    shapes = ("m16n16k16", "m32n8k16", "m8n32k16", "m16n16k8", "m8n8k4", "m8n8k32", "m8n8k128")
    cand = [f"wmma.load.{m}.sync.aligned.{lay}.{sh}.{t}" for m in "abc" for lay in ("row", "col") for sh in shapes
            for t in TYPES] + [f"wmma.store.d.sync.aligned.{lay}.{sh}.{t}" for lay in ("row", "col") for sh in shapes
                               for t in TYPES]
    return [s for s in cand if _parses(s)]


def _assert_arch_error(call, need, arch, only=False):
    """``call`` on ``arch``: an arch error naming sm_<need> where the ISA says it lacks the
    instruction; otherwise no arch error (it runs, or fails for another, stated reason)."""
    lacks = ARCHS[arch] != need if only else ARCHS[arch] < need
    try:
        call()
    except ValueError as e:
        if lacks:
            assert ARCH_ERROR.search(str(e)) and (f"sm_{need}" in str(e) or "only on" in str(e)), str(e)
            return
        assert not ARCH_ERROR.search(str(e)), f"{arch} has it (sm_{need}+), but: {e}"
        return
    assert not lacks, f"accepted on {arch}, which lacks it (needs sm_{need})"


def test_form_enumeration():
    """The enumerations hold every form of the captures (tests/data: mma.sync on the H200, every
    wmma.load / wmma.store.d form) and the counts pin them down."""
    forms = set(mma_sync_forms())
    with np.load(Path(__file__).parent / "data" / "mma_sync_sm90.npz") as z:
        captured = {"mma.sync.aligned." + k.rsplit(".", 1)[0] for k in z.files}
    assert captured <= forms
    assert len(forms) == len(mma_sync_forms()) == 118 + 105  # 105 of them .kind::*
    assert len(wmma_mma_forms()) == 186
    assert len(wmma_memory_forms()) == 88 + 26


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("spelling", mma_sync_forms())
def test_mma_sync_arch_everywhere(spelling, arch):
    need, only = mma_sync_need(spelling)
    bad = np.zeros((1, 1), np.float32)  # past the arch check, a shape error, nothing computed
    _assert_arch_error(lambda: tcemu.mma(spelling, bad, bad, bad, arch=arch), need, arch, only)
    _assert_arch_error(lambda: tcemu.ptx(spelling, arch=arch), need, arch, only)
    ins = parse(spelling)
    if ins.family not in ("int", "b1", "f64") and ins.ctype == ins.dtype:
        _assert_arch_error(lambda: tcemu.GemmConfig(arch=arch, instruction=spelling), need, arch, only)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("spelling", wmma_mma_forms())
def test_wmma_mma_arch_everywhere(spelling, arch):
    need = wmma_need(spelling)
    ins = parse(spelling)
    bad = np.zeros((1, 1), np.float32)
    _assert_arch_error(lambda: tcemu.mma(spelling, bad, bad, bad, arch=arch), need, arch)
    _assert_arch_error(lambda: tcemu.ptx(spelling, arch=arch), need, arch)
    if ins.family not in ("int", "b1", "f64") and ins.ctype == ins.dtype:
        _assert_arch_error(lambda: tcemu.GemmConfig(arch=arch, instruction=spelling), need, arch)


@pytest.mark.parametrize("arch", ARCHS)
def test_wmma_load_store_arch(arch):
    for spelling in wmma_memory_forms():
        _assert_arch_error(lambda: tcemu.ptx(spelling, arch=arch), wmma_need(spelling), arch)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("types", ["f16.f16.f16", "f32.f16.f16", "f32.bf16.bf16", "f32.tf32.tf32"]
                         + [f"{d}.{a}.{b}" for d in ("f16", "f32") for a in ("e4m3", "e5m2") for b in ("e4m3", "e5m2")])
def test_wgmma_arch(types, arch):
    k = {"f16": 16, "bf16": 16, "tf32": 8}.get(types.split(".")[1], 32)
    bad = np.zeros((1, 1), np.float32)
    for n in range(8, 257, 8):
        spelling = f"wgmma.mma_async.sync.aligned.m64n{n}k{k}.{types}"
        _assert_arch_error(lambda: tcemu.mma(spelling, bad, bad, bad, arch=arch), WGMMA_SM, arch, only=True)
        _assert_arch_error(lambda: tcemu.ptx(spelling, arch=arch), WGMMA_SM, arch, only=True)
        _assert_arch_error(lambda: tcemu.GemmConfig(arch=arch, instruction=spelling), WGMMA_SM, arch, only=True)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("kind,dtype,scales", [("tf32", np.float32, None), ("f16", np.float16, None),
                                               ("f8f6f4", ml_dtypes.float8_e4m3fn, None),
                                               ("mxf8f6f4.block_scale", ml_dtypes.float8_e4m3fn, 32),
                                               ("mxf4.block_scale", ml_dtypes.float4_e2m1fn, 32),
                                               ("mxf4nvf4.block_scale.scale_vec::4X", ml_dtypes.float4_e2m1fn, 16)])
def test_tcgen05_arch(kind, dtype, scales, arch):
    K = {"tf32": 8, "f16": 16}.get(kind, 64 if "mxf4" in kind else 32)
    a, b = np.zeros((128, K), dtype), np.zeros((K, 8), dtype)
    kw = {}
    if scales:
        e8 = ml_dtypes.float8_e8m0fnu
        kw = dict(scale_a=np.ones((128, K // scales), e8), scale_b=np.ones((K // scales, 8), e8))
    bad_c = np.zeros((1, 1), np.float32)  # past the arch check, a shape error
    _assert_arch_error(lambda: tcemu.mma(f"tcgen05.mma.cta_group::1.kind::{kind}", a, b, bad_c, arch=arch, **kw),
                       TCGEN05_SM, arch, only=True)


def test_issue_examples_on_v100():
    """The two forms the probe ran on a V100, at every level (they used to give numbers)."""
    a, b, c = jnp.ones((16, 16), jnp.float16), jnp.ones((16, 8), jnp.float16), jnp.zeros((16, 8), jnp.float32)
    with pytest.raises(ValueError, match="requires sm_80 or newer; sm_70 \\(V100\\)"):
        tcemu.mma("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32", a, b, c, arch="V100")
    with pytest.raises(ValueError, match="requires sm_75 or newer; sm_70 \\(V100\\)"):
        tcemu.mma("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32", a[:, :8], b[:8], c, arch="V100")
    with pytest.raises(ValueError, match="requires sm_80"):
        tcemu.ptx("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32", arch="V100")
    with pytest.raises(ValueError, match="requires sm_80"):
        tcemu.matmul(jnp.ones((4, 16)), jnp.ones((16, 4)), arch="V100", instruction="m16n8k16.f32.f16.f16.f32")
    # what the V100 has: wmma and mma.sync m8n8k4
    assert float(tcemu.mma("wmma.mma.sync.aligned.row.col.m16n16k16.f32.f32", a, jnp.ones((16, 16), jnp.float16),
                           jnp.zeros((16, 16), jnp.float32), arch="V100")[0, 0]) == 16.0
    assert float(tcemu.mma("mma.sync.aligned.m8n8k4.row.col.f32.f16.f16.f32", a[:8, :4], b[:4], c[:8],
                           arch="V100")[0, 0]) == 4.0


def test_register_level_checks_the_arch_before_what_tcemu_emulates():
    with pytest.raises(ValueError, match="requires sm_90"):  # not "no register-level layout"
        tcemu.ptx("mma.sync.aligned.m16n8k8.row.col.f64.f64.f64.f64", arch="A100")
    with pytest.raises(ValueError, match="exists only on sm_90"):  # not "not available yet"
        tcemu.ptx("wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16", arch="B200")


# ---------------------------------------------------------------------------------------------
# identify

def _ident_inputs(M=16, K=48, N=8, seed=0, dtype=np.float16):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((M, K)).astype(dtype), rng.standard_normal((K, N)).astype(dtype)


def test_identify_skips_instructions_the_arch_lacks():
    assert tcemu._src.identify.instructions("V100", "f16", "f16") == []
    assert tcemu._src.identify.instructions("T4", "f16", "f16") == ["m16n8k8.f32.f16.f16.f32"]
    assert tcemu._src.identify.instructions("A100", "e4m3", "e4m3") == ["m16n8k16.f32.f16.f16.f32"]
    assert len(tcemu._src.identify.instructions("H100", "e4m3", "e5m2")) == 3


@pytest.mark.parametrize("arch,at,needs", [("V100", np.float16, ["sm_80", "sm_75"]),
                                           ("T4", ml_dtypes.bfloat16, ["sm_80", "sm_80"])])
def test_identify_on_an_arch_without_the_instructions(arch, at, needs):
    a, b = _ident_inputs(dtype=at)
    d = (a.astype(np.float32) @ b.astype(np.float32)).astype(np.float32)
    t0 = time.time()
    with pytest.raises(ValueError) as e:
        tcemu.identify(a, b, d, arch=arch)
    assert time.time() - t0 < 5  # no search
    msg = str(e.value)
    assert msg.startswith("identify: ") and arch in msg and "has none of the instructions" in msg
    assert [m for m in re.findall(r"requires (sm_\d+)", msg)] == needs


def test_identify_on_t4_tries_only_what_it_has():
    a, b = _ident_inputs(K=40)
    truth = tcemu.GemmConfig(arch="T4", instruction="m16n8k8.f32.f16.f16.f32", schedule=tcemu.KSchedule(k_tile=16))
    d = np.asarray(tcemu.matmul(a, b, config=truth))
    cfg = tcemu.identify(a, b, d, arch="T4", candidates=[tcemu.KSchedule(k_tile=32, residue="first"), truth.schedule])
    assert cfg.instruction == truth.instruction
    np.testing.assert_array_equal(np.asarray(tcemu.matmul(a, b, config=cfg)).view(np.uint32), d.view(np.uint32))


def test_identify_instruction_the_arch_lacks():
    a, b = _ident_inputs()
    with pytest.raises(ValueError, match="identify: instruction='m16n8k16.f32.f16.f16.f32' on V100: .*requires sm_80"):
        tcemu.identify(a, b, np.zeros((16, 8), np.float32), arch="V100", instruction="m16n8k16.f32.f16.f16.f32")


@pytest.mark.parametrize("sa,sb,sd", [((2, 16, 48), (3, 48, 8), (2, 16, 8)), ((2, 16, 48), (3, 48, 8), (3, 16, 8)),
                                      ((2, 16, 48), (3, 48, 8), (6, 16, 8)), ((4, 2, 16, 48), (3, 48, 8), (4, 3, 16, 8))])
def test_identify_batches_that_do_not_broadcast(sa, sb, sd):
    a, b = np.zeros(sa, np.float16), np.zeros(sb, np.float16)
    with pytest.raises(ValueError, match=r"identify: the batch axes of a .* and b .* do not broadcast"):
        tcemu.identify(a, b, np.zeros(sd, np.float32), arch="H100")


def test_identify_broadcast_batches_work():
    rng = np.random.default_rng(3)
    a = rng.standard_normal((2, 1, 16, 32)).astype(np.float16)
    b = rng.standard_normal((3, 32, 8)).astype(np.float16)
    truth = tcemu.GemmConfig(arch="H100", instruction="m16n8k16.f32.f16.f16.f32")
    d = np.asarray(tcemu.matmul(a, b, config=truth))
    assert d.shape == (2, 3, 16, 8)
    cfg = tcemu.identify(a, b, d, arch="H100", instruction=truth.instruction, candidates=[tcemu.KSchedule()])
    assert cfg.schedule == tcemu.KSchedule()


@pytest.mark.parametrize("kw,exc,pattern", [
    (dict(candidates=[1, 2]), TypeError, r"candidates must be None or a non-empty list of tcemu.KSchedule, got 1"),
    (dict(candidates="ab"), TypeError, "candidates must be"),
    (dict(candidates=tcemu.KSchedule()), TypeError, "candidates must be"),
    (dict(candidates=[]), ValueError, "candidates must be .* got an empty one"),
    (dict(max_seconds="5"), TypeError, "max_seconds must be a number of seconds"),
    (dict(max_seconds=None), TypeError, "max_seconds must be a number"),
    (dict(max_seconds=True), TypeError, "max_seconds must be a number"),
    (dict(max_seconds=-1.0), ValueError, "max_seconds must be >= 0"),
    (dict(max_seconds=float("nan")), ValueError, "max_seconds must be >= 0"),
    (dict(library=["torch.mm"]), TypeError, "library must be None or one of torch.mm, torch.bmm, torch._scaled_mm, jnp.dot"),
    (dict(library="torch.mmm"), ValueError, "library must be None or one of torch.mm"),
    (dict(library=3), TypeError, "library must be None or one of"),
    (dict(instruction=5), TypeError, "instruction must be None or a PTX spelling"),
    (dict(instruction="m16n8k16.f32.f16.f16"), ValueError, "identify: instruction="),
    (dict(arch=["H100"]), TypeError, "arch must be a string"),
    (dict(arch="H1000"), ValueError, "unknown arch"),
    (dict(rows=0), ValueError, "rows must be a positive integer"),
])
def test_identify_bad_arguments(kw, exc, pattern):
    a, b = _ident_inputs()
    args = dict(arch="H100") | kw
    with pytest.raises(exc, match=pattern):
        tcemu.identify(a, b, np.zeros((16, 8), np.float32), **args)


def test_identify_empty_outputs():
    a, b = _ident_inputs()
    with pytest.raises(ValueError, match="is empty: nothing to identify"):
        tcemu.identify(a[:0], b, np.zeros((0, 8), np.float32), arch="H100")


# ---------------------------------------------------------------------------------------------
# KSchedule.equivalent, sizes beyond int32

@pytest.mark.parametrize("other", ["x", None, 3, tcemu.GemmConfig(), {"k_tile": 64}])
def test_kschedule_equivalent_other_must_be_a_kschedule(other):
    with pytest.raises(TypeError, match=r"KSchedule.equivalent: other must be a tcemu.KSchedule, got"):
        tcemu.KSchedule().equivalent(other, 64, 16)


@pytest.mark.parametrize("K,k,name", [(10 ** 400, 16, "K"), (2 ** 31, 16, "K"), (64, 10 ** 400, "k"), (64, 2 ** 31, "k"),
                                      (-1, 16, "K"), (64, 0, "k")])
def test_kschedule_plan_sizes(K, k, name):
    with pytest.raises(ValueError, match=rf"KSchedule.plan: {name} must be an integer >= \d and below 2\*\*31"):
        tcemu.KSchedule().plan(K, k)


@pytest.mark.parametrize("field", ["k_tile", "slice_align", "promotion"])
def test_kschedule_plan_schedule_sizes(field):
    s = tcemu.KSchedule(**{field: 2 ** 31 if field != "promotion" else 2 ** 35})
    with pytest.raises(ValueError, match=rf"KSchedule.plan: {field}=\d+ must be below 2\*\*31"):
        s.plan(64, 16)
    assert tcemu.KSchedule(k_tile=2 ** 20).plan(100, 16).instruction_ranges()[0][-1] == (96, 100)


LIB = dict(arch="H100", M=128, N=128, K=256, a="bf16", b="bf16", out="bf16")


@pytest.mark.parametrize("lib", ["torch.mm", "torch.bmm", "F.linear", "jnp.dot", "torch.addmm"])
@pytest.mark.parametrize("name", ["M", "N", "K", "batch"])
@pytest.mark.parametrize("value", [10 ** 400, 2 ** 31, 2 ** 64, np.uint64(2 ** 63)])
def test_library_config_sizes_beyond_int32(lib, name, value):
    with pytest.raises(ValueError, match=rf"library_config: {name} must be an integer >= 1 and below 2\*\*31"):
        tcemu.library_config(lib, **(LIB | {name: value}))


def test_library_config_lowercase_size_is_an_unknown_flag():
    with pytest.raises(TypeError, match="library_config: torch.mm takes no flag m; its flags: reduced_precision_reduction"):
        tcemu.library_config("torch.mm", **LIB, m=10 ** 400)


def test_library_config_largest_sizes():
    big = 2 ** 31 - 1
    for lib in ("torch.mm", "jnp.dot", "F.linear"):
        assert isinstance(tcemu.library_config(lib, **(LIB | dict(M=big, N=big, K=big))), tcemu.GemmConfig)
    cfg = tcemu.library_config("jnp.dot", **(LIB | dict(M=big, N=8, K=big, batch=big, xla_autotune=False)))
    assert cfg.schedule.slices >= 1


@pytest.mark.parametrize("lib,arch,exc,pattern", [
    (["torch.mm"], "H100", TypeError, "lib must be one of torch.mm, .*jax.dense \\(a string\\)"),
    (None, "H100", TypeError, "lib must be one of"),
    ("torch.mm", ["H100"], TypeError, "arch must be one of H100, H200"),
    ("F.linear", 100, TypeError, "arch must be one of H100, H200"),
])
def test_library_config_lib_and_arch_types(lib, arch, exc, pattern):
    with pytest.raises(exc, match=pattern):
        tcemu.library_config(lib, **(LIB | dict(arch=arch)))


# ---------------------------------------------------------------------------------------------
# forward-mode autodiff

CFG = tcemu.GemmConfig(arch="H100", instruction="m16n8k16.f32.bf16.bf16.f32")
SHAPES = [((8, 32), (32, 4)), ((2, 8, 32), (32, 4)), ((2, 8, 32), (2, 32, 4)), ((8, 32), (3, 32, 4)),
          ((2, 1, 8, 32), (3, 32, 4))]


def _small_ints(rng, shape):
    return rng.integers(-3, 4, shape).astype(np.float32)


@pytest.mark.parametrize("sa,sb", SHAPES)
def test_jvp_is_the_exact_tangent(sa, sb):
    rng = np.random.default_rng(0)
    a, b, ta, tb = (_small_ints(rng, s) for s in (sa, sb, sa, sb))
    f = lambda a, b: tcemu.matmul(a, b, config=CFG)  # noqa: E731
    y, t = jax.jvp(f, (a, b), (ta, tb))
    want = np.matmul(ta.astype(np.int64), b.astype(np.int64)) + np.matmul(a.astype(np.int64), tb.astype(np.int64))
    np.testing.assert_array_equal(np.asarray(t), want.astype(np.float32))
    np.testing.assert_array_equal(np.asarray(y).view(np.uint32), np.asarray(f(a, b)).view(np.uint32))
    yj, tj = jax.jit(lambda *x: jax.jvp(f, x[:2], x[2:]))(a, b, ta, tb)
    np.testing.assert_array_equal(np.asarray(tj), want.astype(np.float32))
    np.testing.assert_array_equal(np.asarray(yj).view(np.uint32), np.asarray(y).view(np.uint32))


def test_jvp_is_straight_through_the_quantisation():
    """The tangent uses the operands rounded to bf16, as the backward does: 1 + 2**-10 is 1 in bf16."""
    a = np.full((16, 16), 1 + 2.0 ** -10, np.float32)
    b, tb = np.ones((16, 8), np.float32), np.full((16, 8), 2.0, np.float32)
    _, t = jax.jvp(lambda b: tcemu.matmul(a, b, config=CFG), (b,), (tb,))
    qa = a.astype(ml_dtypes.bfloat16).astype(np.float64)
    np.testing.assert_array_equal(np.asarray(t), (qa @ tb).astype(np.float32))
    assert float(t[0, 0]) == 32.0


def test_jacfwd_equals_jacrev_and_the_exact_jacobian():
    rng = np.random.default_rng(1)
    a, b = _small_ints(rng, (4, 16)), _small_ints(rng, (16, 3))
    f = lambda a: tcemu.matmul(a, b, config=CFG)  # noqa: E731
    jf, jr = np.asarray(jax.jacfwd(f)(a)), np.asarray(jax.jacrev(f)(a))
    want = np.einsum("ij,kn->injk", np.eye(4), b)  # d(a @ b)[i, n] / d a[j, k] = delta_ij b[k, n]
    np.testing.assert_array_equal(jf, want)
    np.testing.assert_array_equal(jr, want)
    jb = np.asarray(jax.jacfwd(lambda b: tcemu.matmul(a, b, config=CFG))(b))
    np.testing.assert_array_equal(jb, np.einsum("ik,nm->inkm", a, np.eye(3)))


def test_grad_is_the_exact_backward():
    rng = np.random.default_rng(2)
    a, b, g = _small_ints(rng, (3, 8, 32)), _small_ints(rng, (32, 4)), _small_ints(rng, (3, 8, 4))
    ga, gb = jax.grad(lambda a, b: jnp.sum(tcemu.matmul(a, b, config=CFG) * g), argnums=(0, 1))(a, b)
    np.testing.assert_array_equal(np.asarray(ga), g @ b.T)
    np.testing.assert_array_equal(np.asarray(gb), np.einsum("bmk,bmn->kn", a, g))


def test_hessian_and_linearize():
    rng = np.random.default_rng(4)
    a, b = _small_ints(rng, (2, 16)), _small_ints(rng, (16, 2))
    h = jax.hessian(lambda a: jnp.sum(tcemu.matmul(a, b, config=CFG) ** 2))(a)
    np.testing.assert_array_equal(np.asarray(h), 2 * np.einsum("ij,kn,ln->ikjl", np.eye(2), b, b))
    y, lin = jax.linearize(lambda a: tcemu.matmul(a, b, config=CFG), a)
    np.testing.assert_array_equal(np.asarray(lin(a)), a @ b)


def test_block_scaled_jvp():
    """Block-scaled: the tangent on the dequantised operands (small integers: MX-exact), as jacrev."""
    cfg = tcemu.GemmConfig(arch="RTX5090", instruction="mma.sync.aligned.m16n8k32.row.col.kind::mxf8f6f4.block_scale"
                           ".scale_vec::1X.f32.e4m3.e4m3.f32.ue8m0")
    rng = np.random.default_rng(5)
    a, b = _small_ints(rng, (4, 32)), _small_ints(rng, (32, 2))
    f = lambda a: tcemu.matmul(a, b, config=cfg)  # noqa: E731
    np.testing.assert_array_equal(np.asarray(jax.jacfwd(f)(a)), np.asarray(jax.jacrev(f)(a)))
    _, t = jax.jvp(f, (a,), (a,))
    np.testing.assert_array_equal(np.asarray(t), a @ b)


EMULATED_BACKWARD = [CFG.replace(grad_lhs=CFG), CFG.replace(grad_rhs=CFG)]


@pytest.mark.parametrize("cfg", EMULATED_BACKWARD)
@pytest.mark.parametrize("how", ["jvp", "jit(jvp)", "jacfwd", "linearize"])
def test_forward_mode_with_emulated_backward_gemms_raises(cfg, how):
    a, b = np.ones((8, 32), np.float32), np.ones((32, 4), np.float32)
    f = lambda a: tcemu.matmul(a, b, config=cfg)  # noqa: E731
    run = {"jvp": lambda: jax.jvp(f, (a,), (a,)), "jit(jvp)": lambda: jax.jit(lambda a: jax.jvp(f, (a,), (a,)))(a),
           "jacfwd": lambda: jax.jacfwd(f)(a), "linearize": lambda: jax.linearize(f, a)[1](a)}[how]
    with pytest.raises(ValueError, match=r"forward-mode differentiation .* needs GemmConfig.grad_lhs = grad_rhs = None"):
        run()


@pytest.mark.parametrize("cfg", EMULATED_BACKWARD)
def test_reverse_mode_with_emulated_backward_gemms(cfg):
    """grad still runs the configured backward GEMM: dA = g @ b.T through matmul(config=grad_lhs)."""
    rng = np.random.default_rng(6)
    a, b = rng.standard_normal((8, 32)).astype(np.float32), rng.standard_normal((32, 16)).astype(np.float32)
    g = rng.standard_normal((8, 16)).astype(np.float32)
    ga, gb = jax.grad(lambda a, b: jnp.sum(tcemu.matmul(a, b, config=cfg) * g), argnums=(0, 1))(a, b)
    qa, qb = (x.astype(ml_dtypes.bfloat16).astype(np.float32) for x in (a, b))
    want_a = tcemu.matmul(g, qb.T, config=cfg.grad_lhs) if cfg.grad_lhs else g.astype(np.float64) @ qb.T
    want_b = tcemu.matmul(qa.T, g, config=cfg.grad_rhs) if cfg.grad_rhs else qa.T.astype(np.float64) @ g
    for got, want, emulated in ((ga, want_a, cfg.grad_lhs), (gb, want_b, cfg.grad_rhs)):
        want = np.asarray(want, np.float64)
        np.testing.assert_allclose(np.asarray(got), want, rtol=0, atol=0 if emulated else 1e-5 * np.abs(want).max())


# ---------------------------------------------------------------------------------------------
# configurations as jit arguments (static pytrees)

def _bits(x):
    return np.asarray(x).view(np.uint32)


def test_config_as_a_jit_argument():
    a = jnp.array([[1.0] + [2.0 ** -12] * 4 + [0.0] * 11], jnp.bfloat16)  # 1 + four products of 2**-25
    b = jnp.array([[1.0] + [2.0 ** -13] * 4 + [0.0] * 11], jnp.bfloat16).T
    traces = []

    @jax.jit
    def f(x, y, c):
        traces.append(c)
        assert isinstance(c, tcemu.GemmConfig)  # the object itself, not a tracer
        return tcemu.matmul(x, y, config=c)

    a100, h100 = tcemu.GemmConfig(arch="A100"), tcemu.GemmConfig(arch="H100")
    got = f(a, b, a100)
    np.testing.assert_array_equal(_bits(got), _bits(tcemu.matmul(a, b, config=a100)))
    assert float(got[0, 0]) == 1.0  # 24 fraction bits: the small products are truncated
    got2 = f(a, b, h100)
    assert len(traces) == 2  # another config, another compilation...
    np.testing.assert_array_equal(_bits(got2), _bits(tcemu.matmul(a, b, config=h100)))
    assert float(got2[0, 0]) == 1 + 2.0 ** -23  # ...with its own bits (25 fraction bits)
    f(a, b, tcemu.GemmConfig(arch="A100"))  # an equal config: the cache
    assert len(traces) == 2


def test_schedule_epilogue_and_models_as_jit_arguments():
    rng = np.random.default_rng(7)
    x = jnp.asarray(rng.standard_normal((16, 96)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((96, 8)), jnp.float32)
    bias = jnp.asarray(rng.standard_normal(8), jnp.float32)
    f = jax.jit(lambda x, w, s, e, m: tcemu.matmul(x, w, bias=bias, out_type="bf16", arch="H100", schedule=s,
                                                   epilogue=e, model=m))
    for s, e, m in [(tcemu.KSchedule(slices=3), tcemu.Epilogue(bias="output"), tcemu.numerics("A100").bf16),
                    (tcemu.KSchedule(), tcemu.Epilogue(), tcemu.numerics("H100"))]:
        want = tcemu.matmul(x, w, bias=bias, out_type="bf16", arch="H100", schedule=s, epilogue=e, model=m)
        np.testing.assert_array_equal(np.asarray(f(x, w, s, e, m)).view(np.uint16), np.asarray(want).view(np.uint16))


def test_config_through_vmap_and_tree_util():
    cfg = tcemu.GemmConfig(arch="A100", schedule=tcemu.KSchedule(k_tile=32))
    assert jax.tree_util.tree_leaves(cfg) == []
    assert jax.tree_util.tree_map(lambda x: x, cfg) == cfg
    x = jnp.ones((3, 4, 64))
    out = jax.vmap(lambda x, c: tcemu.matmul(x, jnp.ones((64, 2)), config=c), in_axes=(0, None))(x, cfg)
    assert out.shape == (3, 4, 2) and float(out[0, 0, 0]) == 64.0


# ---------------------------------------------------------------------------------------------
# fuzz: identify, library_config, KSchedule

FUZZ = settings(max_examples=40, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _our_error(err: BaseException):
    """A ValueError / TypeError raised in tcemu's own code."""
    assert isinstance(err, (ValueError, TypeError)), f"{type(err).__name__}: {err}"
    frames = traceback.extract_tb(err.__traceback__)
    assert "/tcemu/" in frames[-1].filename.replace("\\", "/"), \
        f"raised outside tcemu ({frames[-1].filename}:{frames[-1].lineno}): {type(err).__name__}: {err}"


GOOD_SIZES = st.one_of(st.integers(1, 8192), st.sampled_from([2 ** 31 - 1, 127, 4097]), st.integers(1, 4096).map(np.int64),
                       st.integers(1, 4096).map(np.uint32))
BAD_SIZES = st.sampled_from([0, -1, -4096, 2 ** 31, 2 ** 63, 10 ** 400, np.int64(-8), 64.0, 1.5, float("nan"), "64", None,
                             True, [64], np.float32(8)])
LIBS = list(tcemu._src.library.LIBRARIES) + list(tcemu._src.library_layers.LAYERS)
FLAGS = {**tcemu._src.library.LIBRARIES, **tcemu._src.library_layers.LAYERS, "torch._scaled_mm": ("use_fast_accum", "scaling")}
GOOD_FLAGS = {"c": st.sampled_from(["matrix", "row"]), "alpha": st.sampled_from([1, 1.0, 0.5, -2]),
              "beta": st.sampled_from([1, 0.0, 2.5]), "scaling": st.sampled_from(["tensor", "row"])}
BAD_TYPES = st.sampled_from(["F16", "fp16", "float8", "int8", "", 3, None, object(), np.int32, [16]])
LIB_BAD = {"lib": st.sampled_from(["torch.MM", "", "torch", "linear", None, 3, ["torch.mm"], ("F.linear",)]),
           "arch": st.sampled_from(["A100", "h1000", "H100x", "", None, ["H100"], 100, b"H100"]),
           "M": BAD_SIZES, "N": BAD_SIZES, "K": BAD_SIZES, "batch": BAD_SIZES, "a": BAD_TYPES, "b": BAD_TYPES,
           "out": st.sampled_from(["f64", "F32", "", None, 3, np.int8])}


@functools.lru_cache(maxsize=None)
def library_combos():
    """(lib, a, b, out) that library_config answers (at one shape, its flags' defaults)."""
    out = []
    for lib, a, b, o in itertools.product(LIBS, ("f16", "bf16", "e4m3", "e5m2"), ("f16", "bf16", "e4m3", "e5m2"),
                                          ("f32", "f16", "bf16")):
        try:
            tcemu.library_config(lib, **(LIB | dict(a=a, b=b, out=o)))
        except ValueError:
            continue
        out.append((lib, a, b, o))
    return out


def test_library_combos():
    combos = library_combos()
    assert {c[0] for c in combos} == set(LIBS) and len(combos) >= 20


@FUZZ
@given(st.data())
def test_fuzz_library_config(data):
    """Valid arguments (a combination the table answers, any sizes, the library's own flags) with at
    most one replaced by a bad value: a valid GemmConfig, or our ValueError/TypeError naming it."""
    lib, a, b, out = data.draw(st.sampled_from(library_combos()))
    dt = {"f16": np.float16, "bf16": jnp.bfloat16, "e4m3": ml_dtypes.float8_e4m3fn, "e5m2": jnp.float8_e5m2,
          "f32": np.float32}
    kw = dict(arch=data.draw(st.sampled_from(["H100", "H200", "NVIDIA H200 141GB HBM3e"])), M=data.draw(GOOD_SIZES),
              N=data.draw(GOOD_SIZES), K=data.draw(GOOD_SIZES),
              a=data.draw(st.sampled_from([a, dt[a]])), b=data.draw(st.sampled_from([b, dt[b]])),
              out=data.draw(st.sampled_from([out, dt[out]])))
    if data.draw(st.booleans()):
        kw["batch"] = data.draw(GOOD_SIZES)
    for flag in data.draw(st.lists(st.sampled_from(FLAGS[lib]), unique=True)):
        kw[flag] = data.draw(GOOD_FLAGS.get(flag, st.booleans()))
    bad = data.draw(st.sampled_from([None, None, None, *LIB_BAD, "flag name", "flag value"]))
    if bad == "lib":
        lib = data.draw(LIB_BAD["lib"])
    elif bad == "flag name":
        kw[data.draw(st.sampled_from(["m", "bias_", "fast_accum", "splitk"]))] = True
    elif bad == "flag value":
        kw[data.draw(st.sampled_from(FLAGS[lib]))] = data.draw(st.sampled_from([None, "yes", [True], 2j]))
    elif bad is not None:
        kw[bad] = data.draw(LIB_BAD[bad])
    try:
        cfg = tcemu.library_config(lib, **kw)
    except Exception as err:  # noqa: BLE001 - checked
        _our_error(err)
        if bad is None:  # valid: only XLA's autotuner-off rules refuse some types (and the layers' out)
            assert re.search(r"takes f16 x f16|returns its input type|no measurements", str(err)), str(err)
        return
    assert bad is None, f"bad {bad} accepted: {lib!r}, {kw}"
    assert isinstance(cfg, tcemu.GemmConfig)
    assert cfg == cfg.replace()  # a valid config: construction validates it again


GOOD_FIELDS = {"k_tile": st.sampled_from([0, 16, 32, 64, 128]), "residue": st.sampled_from(["last", "first"]),
               "slices": st.integers(0, 40), "slice_align": st.sampled_from([0, 1, 8, 16, 64]),
               "slice_pad": st.sampled_from(["end", "start"]), "promotion": st.sampled_from([0, 128, 256]),
               "reduction": st.sampled_from(["sequential", "pairwise", "shuffle"]),
               "partials": st.sampled_from(["f32", "f16", "bf16"]), "reduce_threads": st.sampled_from([1, 2, 4, 32]),
               "reduce_lanes": st.sampled_from([0, 1, 2, 8])}
BAD_FIELDS = {"k_tile": st.sampled_from([-16, 2 ** 31, 10 ** 400, 1.5, "64", None, True, np.float64(64)]),
              "residue": st.sampled_from(["middle", "", None, 1, "LAST"]),
              "slices": st.sampled_from([-1, 2.0, "2", None, False]),
              "slice_align": st.sampled_from([-8, 2 ** 31, 10 ** 400, 0.5, "8"]),
              "slice_pad": st.sampled_from(["both", 0, None]),
              "promotion": st.sampled_from([-128, 2 ** 40, 10 ** 400, 1e3, "128"]),
              "reduction": st.sampled_from(["tree", None, 3]),
              "partials": st.sampled_from(["e4m3", np.float32, "F32", None]),
              "reduce_threads": st.sampled_from([3, 0, -2, 10 ** 400, "4", 2.0]),
              "reduce_lanes": st.sampled_from([3, -2, 10 ** 400, 1.0])}
BAD_DEPTHS = st.sampled_from([-1, 2 ** 31, 10 ** 400, 1.5, "64", None, True, np.float32(96), [64]])


@FUZZ
@given(st.data())
def test_fuzz_kschedule(data):
    """KSchedule fields, plan(K, k), equivalent(other, K, k), describe(): a valid result (the
    plan reads every element of K exactly once) or our error, one bad argument at a time."""
    kw = {f: data.draw(s) for f, s in GOOD_FIELDS.items() if data.draw(st.booleans())}
    if kw.get("reduction", "sequential") != "pairwise":
        kw.pop("reduce_threads", None)
    if kw.get("reduce_threads", 1) % (kw.get("reduce_lanes") or 1):
        kw.pop("reduce_lanes")
    bad = data.draw(st.sampled_from([None, None, *BAD_FIELDS, "K", "k", "other"]))
    if bad in BAD_FIELDS:
        kw[bad] = data.draw(BAD_FIELDS[bad])
    K = data.draw(BAD_DEPTHS) if bad == "K" else data.draw(st.one_of(st.integers(0, 3000), st.just(np.int32(96))))
    k = data.draw(st.sampled_from([0, -16, 2 ** 31, 16.0])) if bad == "k" else data.draw(st.sampled_from([1, 4, 8, 16, 32]))
    other = data.draw(st.sampled_from(["x", None, 3, tcemu.GemmConfig()])) if bad == "other" else tcemu.KSchedule()
    try:
        s = tcemu.KSchedule(**kw)
        assert isinstance(s.describe(), str) and s == s.replace() and hash(s) == hash(s.replace())
        plan = s.plan(K, k)
        same = s.equivalent(other, K, k)
    except Exception as err:  # noqa: BLE001 - checked
        _our_error(err)
        fits = kw.get("k_tile", 0) % k == 0 and kw.get("promotion", 0) % k == 0 if bad is None else False
        assert not fits, f"valid schedule {kw} refused at K={K}, k={k}: {err}"
        return
    assert bad is None, f"bad {bad} accepted: {kw}, K={K!r}, k={k!r}, other={other!r}"
    np.testing.assert_array_equal(np.sort(plan.index[plan.index >= 0]), np.arange(int(K)))
    assert isinstance(same, bool) and s.equivalent(s, K, k)


IDENT_CFGS = [tcemu.GemmConfig(arch="H100", instruction="m16n8k16.f32.f16.f16.f32"),
              tcemu.GemmConfig(arch="H100", instruction="m16n8k16.f32.f16.f16.f32",
                               schedule=tcemu.KSchedule(k_tile=32, residue="first")),
              tcemu.GemmConfig(arch="H100", instruction="m16n8k8.f32.f16.f16.f32", schedule=tcemu.KSchedule(slices=2))]


@settings(max_examples=12, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.data())
def test_fuzz_identify(data):
    rng = np.random.default_rng(data.draw(st.integers(0, 2 ** 16)))
    M, N, K = data.draw(st.integers(1, 16)), data.draw(st.integers(1, 8)), data.draw(st.integers(1, 48))
    batch = data.draw(st.sampled_from([(), (2,)]))
    a = rng.integers(-4, 5, batch + (M, K)).astype(np.float16)
    b = rng.integers(-4, 5, (K, N)).astype(np.float16)
    truth = data.draw(st.sampled_from(IDENT_CFGS))
    d = np.asarray(tcemu.matmul(a, b, config=truth))
    bad = data.draw(st.sampled_from([None, "arch", "candidates", "library", "max_seconds", "rows", "d", "b", "dtype"]))
    kw = dict(arch="H100", instruction=truth.instruction,
              candidates=data.draw(st.sampled_from([[c.schedule for c in IDENT_CFGS], [truth.schedule]])),
              library=data.draw(st.sampled_from([None, "torch.mm", "jnp.dot"])), max_seconds=60)
    if bad == "arch":
        kw["arch"] = data.draw(st.sampled_from(["V100", "T4", "sm_89", "H1000", None, 90]))
    elif bad == "candidates":
        kw["candidates"] = data.draw(st.sampled_from([[1, 2], "ab", [], [tcemu.KSchedule(), None], 3]))
    elif bad == "library":
        kw["library"] = data.draw(st.sampled_from([["torch.mm"], "torch", 3, {"lib": 1}]))
    elif bad == "max_seconds":
        kw["max_seconds"] = data.draw(st.sampled_from(["5", None, -1, float("nan"), [1]]))
    elif bad == "rows":
        kw["rows"] = data.draw(st.sampled_from([0, -3, 2.5, "8", None]))
    elif bad == "d":
        d = data.draw(st.sampled_from([d[..., :-1] if N > 1 else d[..., :0], d.astype(np.float64), d[None, None],
                                       np.zeros((3,) + d.shape, np.float32)]))
    elif bad == "b":
        b = data.draw(st.sampled_from([np.zeros((3, K, N), np.float16), np.zeros((K + 1, N), np.float16), b[0]]))
    elif bad == "dtype":
        a = a.astype(np.float32)
    try:
        cfg = tcemu.identify(a, b, d, **kw)
    except Exception as err:  # noqa: BLE001 - checked
        _our_error(err)
        return
    np.testing.assert_array_equal(np.asarray(tcemu.matmul(a, b, config=cfg)).view(np.uint32), d.view(np.uint32))
