"""Shared test helpers: hardware capture data (tests/data), the published peer vectors, and the
x64 modes the tests run under.

``TCEMU_X64`` selects them: ``1`` turns ``jax_enable_x64`` on for the whole session (to run any
test file, or the entire suite, with x64 on); ``0`` leaves it off everywhere; unset (CI), it is off
and the modules :data:`X64_MODULES` run every test a second time with x64 on (test ids
``[x32-...]`` and ``[x64-...]``; ``-k x64`` selects the second run). The other hardware modules
(wmma.mma, mma.sync, signed zeros: most of CI's time if run twice) are covered with x64 on by
tests/test_x64.py: every captured form's numerics traced under x64 hold no 64-bit value, and
value and register level give the same bits both ways on representative forms of each kind.
``TCEMU_X64=1`` runs them whole with x64 on.

On the CPU, MMAs and GEMMs run the compiled kernel (tcemu/_src/native) where it covers the model;
the second, x64 run of :data:`X64_MODULES` runs the pure-JAX engine instead (``TCEMU_NATIVE=0``),
so both are checked against the hardware captures and the published vectors.

``TCEMU_FULL=1`` runs every case of every test, ``TCEMU_FULL=rest`` only the cases CI leaves out.
Unset (CI), the families in :data:`CI_SAMPLE`
run every k-th of their selected cases, to keep CI short on 2 cores: families whose
cases each compile a program of their own (a form at register level, a capture file, a schedule)
while a cheaper test covers every form (value level) or the same rule. A developer runs the whole
suite with ``TCEMU_FULL=1`` before a stop; a test picked by name or ``-k`` always runs (the sample
is taken of the tests selected). In the x64 modules the x64 run takes the cases the x32 run leaves
out. Without ``TCEMU_FULL=1`` XLA compiles with :data:`CI_XLA_FLAGS` (faster to compile, the
same bits).
"""
from __future__ import annotations

import collections
import contextlib
import functools
import os
import subprocess
import sys
from pathlib import Path
from unittest import mock

import jax
import numpy as np
import pytest

DATA = Path(__file__).parent / "data"
ROOT = Path(__file__).resolve().parents[1]

X64_ENV = os.environ.get("TCEMU_X64")
# Modules whose tests also run with x64 on when TCEMU_X64 is unset.
# (test_engine_exact runs once: tests/test_x64.py covers every engine path with x64 on)
X64_MODULES = ("test_wgmma_hw", "test_wgmma_regs_hw", "test_wgmma_sp_hw", "test_peer_vectors")


FULL_ENV = os.environ.get("TCEMU_FULL")
FULL = FULL_ENV == "1"  # every case (tests that sample inside read it)
# Without TCEMU_FULL=1 XLA compiles the tests' programs faster: LLVM at its lowest optimisation
# level (most of CI's time is XLA compiling small programs); TCEMU_FULL=1 compiles as users'
# programs are compiled. tests/test_xla_flags.py checks that both give the same bits. A flag
# XLA_FLAGS sets is kept. (Not --xla_cpu_use_fusion_emitters=false, which halves the compile time
# but converts -1e-9 to float8_e4m3fnuz's NaN, and some values to e4m3 otherwise than ml_dtypes.)
CI_XLA_FLAGS = ("--xla_backend_optimization_level=0",)
if not FULL:
    os.environ["XLA_FLAGS"] = " ".join([os.environ.get("XLA_FLAGS", "")] + [
        f for f in CI_XLA_FLAGS if f.split("=")[0] not in os.environ.get("XLA_FLAGS", "")]).strip()
# (test module, test function) -> k: without TCEMU_FULL=1, every k-th selected case runs
CI_SAMPLE = {
    ("test_wmma_mma_hw", "test_register_level_matches_h200"): 16,  # value level: every form
    ("test_mma_sync_hw", "test_register_level_matches_h200"): 3,
    ("test_signed_zeros_hw", "test_mma_sync_register_level"): 2,
    ("test_signed_zeros_hw", "test_mma_sync_value_level"): 2,
    ("test_signed_zeros_hw", "test_wgmma_value_level"): 2,
    ("test_signed_zeros_hw", "test_wmma_value_and_register_level"): 2,
    ("test_mma_sp_hw", "test_value_level_matches_h100"): 2,
    ("test_wgmma_regs_hw", "test_numerics_bit_exact"): 2,
    ("test_peer_vectors", "test_peer_set_bit_exact"): 8,
    ("test_mmasim", "test_value_level"): 2,
    ("test_mfma_regs", "test_register_level_on_mmasim_vectors"): 6,
    ("test_probe", "test_probe_recovers_amd_preset"): 2,
    ("test_native", "test_schedules_equal_engine"): 4,
    ("test_native", "test_mma_equal_engine"): 4,
    ("test_native", "test_families_equal_engine"): 2,
    ("test_x64", "test_engine_paths_same_bits"): 2,
    ("test_x64", "test_value_level_same_bits"): 2,
    ("test_schedule", "test_matmul_follows_schedule"): 6,
    ("test_schedule", "test_serial_split_k_runs_the_epilogue_per_slice"): 2,
    ("test_gemm_epilogue", "test_epilogue_against_numpy_model"): 6,
    ("test_library", "test_library_config_reproduces_captures"): 2,
    ("test_library", "test_identify_reproduces_held_out_rows"): 3,
    ("test_library", "test_identify_with_the_library_reproduces_held_out_rows"): 2,
    ("test_library_layers", "test_presets_reproduce_captured_layers"): 16,
    ("test_library_records", "test_identify_finds_serial_split_k_with_the_epilogue"): 2,
    ("test_library_records", "test_tcemu_record_reproduces_h200_captures"): 6,
    ("test_library_workspace", "test_default_splits_dropped"): 3,
    ("test_library_workspace", "test_default_unsplit_kept"): 2,
    ("test_library_records", "test_shipped_records_reproduce_captures"): 4,
    ("test_library_records", "test_tcemu_record_reproduces_a_fresh_capture"): 4,
    ("test_library", "test_identify_tries_the_records_at_the_whole_shape_first"): 4,
    ("test_library_xla", "test_held_out_fresh3_without_the_hlo"): 8,
    ("test_mfma", "test_value_level"): 8,
    ("test_mfma_cdna1", "test_value_level"): 2,
    ("test_mfma_regs", "test_modifiers_equal_the_value_level"): 2,
    ("test_mmasim", "test_register_level_sm120"): 2,
    ("test_wgmma_sp_hw", "test_numerics_bit_exact"): 4,
    ("test_wgmma_sp_hw", "test_metadata_and_operand_layouts_index_coded"): 4,
    ("test_wgmma_sp_hw", "test_descriptor_layouts_random"): 2,
    ("test_wgmma_regs_hw", "test_layout_rule_on_every_descriptor"): 2,
    ("test_wgmma_sp", "test_register_level_equals_value_level"): 2,
    ("test_wgmma_regs", "test_register_level_equals_value_level"): 2,
    ("test_blackwell", "test_block_scaled_matmul_equals_instruction_chain"): 2,
    ("test_native", "test_model_options_equal_engine"): 2,
    ("test_native", "test_large_outputs_equal_engine"): 2,
    ("test_native", "test_fast_finish_edges_equal_engine"): 2,
    ("test_x64", "test_matmul_same_bits"): 2,
    ("test_gemm_kscales", "test_block_scaled_promotion_against_model"): 2,
    ("test_gemm_epilogue", "test_identify_finds_the_epilogue"): 2,
    ("test_emulate", "test_emulated_conv_is_exact_on_exactly_summable_inputs"): 2,
    ("test_probe", "test_probe_tells_apart_one_amd_field"): 2,
    ("test_gemm_epilogue", "test_matmul_epilogue_is_product_then_epilogue"): 2,
    ("test_mfma", "test_gemm_chains_the_instruction"): 2,
    ("test_library_fit", "test_held_out_random_shapes"): 7,  # the first set and the last (held out)
}


def pytest_configure(config):
    if X64_ENV not in (None, "0", "1"):
        raise pytest.UsageError(f"TCEMU_X64={X64_ENV!r}; valid: 0 (x64 off), 1 (x64 on), or unset")
    if FULL_ENV not in (None, "0", "1", "rest"):
        raise pytest.UsageError(f"TCEMU_FULL={FULL_ENV!r}; valid: 1 (every case), rest (the cases CI's sample "
                                "leaves out), 0 or unset (CI's sample)")
    if X64_ENV == "1":  # before any test module is imported
        jax.config.update("jax_enable_x64", True)


@pytest.hookimpl(trylast=True)  # after -k and -m: the sample is of the selected tests
def pytest_collection_modifyitems(config, items):
    if FULL_ENV == "1":
        return
    seen, keep, drop = collections.Counter(), [], []
    for item in items:
        family = (item.module.__name__, getattr(item, "originalname", item.name))
        k = CI_SAMPLE.get(family, 1)
        # in the x64 modules the x64 run takes the cases the x32 run leaves (k = 2: each case once)
        mode = getattr(getattr(item, "callspec", None), "params", {}).get("x64_mode")
        (keep if (seen[family, mode] + bool(mode)) % k == 0 else drop).append(item)
        seen[family, mode] += 1
    if FULL_ENV == "rest":
        keep, drop = drop, keep
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_generate_tests(metafunc):
    if X64_ENV is None and metafunc.module.__name__ in X64_MODULES:
        metafunc.parametrize("x64_mode", [False, True], ids=["x32", "x64"], indirect=True, scope="module")


@contextlib.contextmanager
def tcemu_env(env: dict):
    """tcemu's environment variables set to ``env`` inside the block. tcemu reads them once per
    process and compiled functions keep what they traced, so both are forgotten on entry and on
    exit (the settings are read again, the functions traced again)."""
    from tcemu._src.native import build

    def fresh():
        build._reread_settings()
        jax.clear_caches()

    with mock.patch.dict(os.environ, env):
        fresh()
        try:
            yield
        finally:
            fresh()
    fresh()


@pytest.fixture(scope="module", autouse=True)
def x64_mode(request):
    """jax_enable_x64 for the tests of a module that :func:`pytest_generate_tests` parametrised
    (module scope: hypothesis tests may not use function-scoped fixtures, and each mode's tests
    run together); elsewhere the session's setting, unchanged."""
    on = getattr(request, "param", None)
    if on is None:
        yield jax.config.jax_enable_x64
        return
    with jax.enable_x64(on), tcemu_env({"TCEMU_NATIVE": "0"} if on else {}):
        yield on


@functools.lru_cache(maxsize=None)
def capture(name: str):
    """A committed capture file, loaded once (``np.load`` of tests/data/<name>)."""
    return dict(np.load(DATA / name))


def run_on_devices(script: str, devices: int, *, platform: str = "cpu", timeout: int = 600,
                   xla_flags: str | None = None, **env):
    """Run the Python ``script`` in a fresh process with tcemu from this checkout on ``platform``
    (``JAX_PLATFORMS``), in the checkout's root; on the CPU, with ``devices`` host devices
    (``--xla_force_host_platform_device_count``). ``xla_flags``: the process's ``XLA_FLAGS``
    (default: this one's, the CI flags kept). ``env``: more environment variables. Returns the
    ``subprocess.CompletedProcess`` (text stdout and stderr)."""
    env = dict(os.environ, JAX_PLATFORMS=platform, PYTHONPATH=str(ROOT), **env)
    flags = os.environ.get("XLA_FLAGS", "") if xla_flags is None else xla_flags
    env["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={devices}".strip() if platform == "cpu" else flags
    return subprocess.run([sys.executable, "-c", script], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def peer_dir() -> Path | None:
    env = os.environ.get("TCEMU_PEER_VECTORS")
    p = Path(env) if env else ROOT.parent / "shared" / "peer-vectors"
    return p if (p / "index.json").exists() else None


@pytest.fixture
def x64():
    """Run a test with jax_enable_x64 on (the f64 paths need it)."""
    with jax.enable_x64(True):
        yield
