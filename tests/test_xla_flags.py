"""The suite compiles with flags that make XLA compile faster unless ``TCEMU_FULL=1``
(tests/conftest.py ``CI_XLA_FLAGS``: LLVM at its lowest optimisation level). The same GEMMs
compiled both ways, in fresh processes with the pure-JAX engine (the compiled kernel does not go
through XLA), give the same bits: split-K and promotion, instructions of five numerics families
(f16, tf32, fp8 on Hopper and Ada, MXFP4), specials and a 40-binade spread of exponents; and so do
``tcemu.quantize``'s conversions (XLA's) of specials, tiny, huge and random values to every
8-, 6- and 4-bit format."""
from __future__ import annotations

import os

from conftest import CI_XLA_FLAGS, run_on_devices

SCRIPT = """
import sys
sys.path.insert(0, "benchmarks")
import numpy as np
import tcemu
import bits_digest as B
rng = np.random.default_rng(0)
a = (rng.standard_normal((32, 256)) * 2.0 ** rng.integers(-20, 21, (32, 256))).astype(np.float32)
b = (rng.standard_normal((256, 24)) * 2.0 ** rng.integers(-20, 21, (256, 24))).astype(np.float32)
a[3, 5], b[7, 2] = np.inf, np.nan
cases = [("H100", "m16n8k16.f32.f16.f16.f32", B.SCHEDULES[1]), ("A100", "m16n8k8.f32.tf32.tf32.f32", {}),
         ("H100", "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3", B.SCHEDULES[2]),
         ("sm_89", "m16n8k32.f32.e4m3.e5m2.f32", {}), B.FAMILIES[13] + ({},)]
for arch, ins, s in cases:
    print(arch, ins, s, B.digest(tcemu.matmul(a, b, config=tcemu.GemmConfig(arch=arch, instruction=ins, **s))))
x = np.concatenate([np.float32([0, -0.0, 1e6, -1e6, np.inf, -np.inf, np.nan, -1e-9, 1e-9, 0.3, -17.5]),
                    (rng.standard_normal(4096) * 2.0 ** rng.integers(-30, 30, 4096)).astype(np.float32)])
for f in ("e4m3", "e5m2", "e4m3fnuz", "e5m2fnuz", "e3m2", "e2m3", "e2m1"):
    print(f, B.digest(tcemu.quantize(x, f)))
"""


def _digests(ci_flags: bool) -> list[str]:
    names = [f.split("=")[0] for f in CI_XLA_FLAGS]
    flags = " ".join(f for f in os.environ.get("XLA_FLAGS", "").split() if f.split("=")[0] not in names)
    run = run_on_devices(SCRIPT, 1, xla_flags=" ".join([flags, *CI_XLA_FLAGS]) if ci_flags else flags,
                         TCEMU_NATIVE="0")
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout.splitlines()


def test_ci_flags_give_the_same_bits():
    default, ci = _digests(False), _digests(True)
    assert len(default) == 12 and default == ci
