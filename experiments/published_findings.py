"""Published tensor-core findings, reproduced with tcemu.

    python experiments/published_findings.py [--kmax 16384] [--outputs 1024] [--out experiments/results]

1. Feature tests (``tcemu.probe``) of every GPU preset: bits kept in alignment, accumulator
   width, fused block size, rounding, normalisation, subnormals. Published values: Fasi et al.
   2021 (V100, T4, A100), Khattak & Mikaitis 2025 and MMA-Sim 2025 (Ada, H100, B200). For the
   H200 the same tests were run on the real tensor cores (``experiments/hardware/probe_hw.py``,
   ``tests/data/probe_sm90.json``) and are shown beside the emulator's answers.
2. Error of long dot products against float64 as K grows, per format and GPU (PNG and CSV).
3. DeepSeek-V3's FP8 finding: an H100 FP8 GEMM with K = 4096 keeps about 14 bits of
   accumulation, which promoting the partial sums to float32 every 128 products repairs.
4. ml_dtypes' README example: 10,000 U[0,1) values summed in bfloat16 give 256.

Writes ``probe.csv``, ``error_vs_k.{csv,png}`` and ``deepseek_fp8.csv`` into ``--out`` and
prints every table.
"""
from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from pathlib import Path

import numpy as np

import tcemu
from tcemu._src.studies import GPU_CONFIGS, curves_table, write_csv

ROOT = Path(__file__).resolve().parents[1]

# (GPU, instruction, what the literature reports), one row per distinct numerics
PROBE_CASES = [
    ("V100", "wmma.mma.sync.aligned.row.col.m16n16k16.f32.f32", "F21: no extra bits, blocks of 4, RZ"),
    ("T4", "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32", "F21: 1 extra bit, RZ"),
    ("A100", "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32", "F21: 1 extra bit, blocks of 8, RZ"),
    ("A100", "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32", "KM25: 1 extra bit, blocks of 4"),
    ("L40S", "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32", "MS25: 13-bit accumulator"),
    ("H100", "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32", "KM25: 2 extra bits, blocks of 16"),
    ("H100", "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32", "KM25: 2 extra bits, blocks of 8"),
    ("H100", "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3",
     "MS25: 13-bit accumulator; DeepSeek-V3: ~14 bits"),
    ("B200", "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32", "KM25: 2 extra bits, blocks of 16"),
    ("B200", "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32", "KM25: fp8 no longer limited to 13 bits"),
]

COLUMNS = [("F", "fraction_bits"), ("acc", "accumulator_bits"), ("block", "block_size"),
           ("rounding", "rounding"), ("normalised", "normalized_products"), ("C", "addend"),
           ("subnormals in/out", None)]

FP8_GEMMS = {
    "H100 wgmma e4m3": tcemu.GemmConfig(arch="H100", instruction="wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3"),
    "H100 wgmma e4m3 + promotion/128": tcemu.GemmConfig(
        arch="H100", instruction="wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3", k_order="promotion",
        promotion_interval=128),
    "L40S mma.sync e4m3": tcemu.GemmConfig(arch="L40S", instruction="m16n8k32.f32.e4m3.e4m3.f32"),
    "B200 mma.sync e4m3": tcemu.GemmConfig(arch="B200", instruction="m16n8k32.f32.e4m3.e4m3.f32"),
}


def _cells(r: tcemu.ProbeResult):
    out = []
    for _, key in COLUMNS:
        if key is None:
            out.append(f"{'yes' if r.subnormal_inputs else 'flushed'}/{'yes' if r.subnormal_outputs else 'flushed'}")
        else:
            v = getattr(r, key)
            out.append("-" if v is None else str(v))
    return out


def probe_table(cases=PROBE_CASES):
    """Rows (GPU, instruction, source, probe cells...) for ``cases``, then the H200 hardware rows."""
    rows = [[gpu, sp, "emulator", note] + _cells(tcemu.probe(gpu, instruction=sp)) for gpu, sp, note in cases]
    hw = json.loads((ROOT / "tests" / "data" / "probe_sm90.json").read_text())
    for sp, pair in hw.items():
        for who in ("hardware", "emulator"):
            rows.append(["H200", sp, who, "experiments/hardware/probe_hw.py"]
                        + _cells(tcemu.ProbeResult(**pair[who])))
    return rows


def print_probe(rows, file=sys.stdout):
    head = ["GPU", "instruction", "measured on"] + [c for c, _ in COLUMNS]
    w = [5, 52, 11, 3, 4, 6, 9, 11, 6, 18]
    print("  ".join(h.ljust(n) for h, n in zip(head, w)), file=file)
    for r in rows:
        print("  ".join(str(x).ljust(n) for x, n in zip(r[:3] + r[4:], w)), file=file)


def error_curves(ks, outputs):
    return [tcemu.error_vs_k(fmt, gpu, ks, outputs=outputs, promotion_interval=p) for fmt, gpu, p in GPU_CONFIGS]


# the same input formats on the H100 and on the MI300X (CDNA3: MMA-Sim's model) and MI250X (CDNA2)
AMD_VS_H100 = (("f16", "H100"), ("f16", "MI300X"), ("f16", "MI250X"), ("bf16", "H100"), ("bf16", "MI300X"),
               ("e4m3", "H100"), ("e4m3fnuz", "MI300X"))


def amd_vs_h100_curves(ks, outputs, dist="uniform"):
    """error_vs_k of each (format, GPU) of :data:`AMD_VS_H100`, one chained MMA per GPU."""
    return [tcemu.error_vs_k(fmt, gpu, ks, outputs=outputs, dist=dist) for fmt, gpu in AMD_VS_H100]


def fp8_gemm_errors(k=4096, size=64, seed=0):
    """Rows (config, distribution, normwise error, max elementwise relative error, max |err| / max |ref|)."""
    rng = np.random.default_rng(seed)
    rows = []
    for dist in ("uniform", "normal"):
        draw = rng.random if dist == "uniform" else rng.standard_normal
        a = tcemu.quantize(draw((size, k)), "e4m3")
        b = tcemu.quantize(draw((k, size)), "e4m3")
        ref = np.asarray(a, np.float64) @ np.asarray(b, np.float64)
        for name, cfg in FP8_GEMMS.items():
            y = np.asarray(tcemu.matmul(a, b, config=cfg), np.float64)
            err = np.abs(y - ref)
            rows.append([name, dist, np.linalg.norm(y - ref) / np.linalg.norm(ref),
                         float(np.max(err / np.abs(ref))), float(err.max() / np.abs(ref).max())])
    return rows


def print_fp8(rows, k, file=sys.stdout):
    print(f"{'FP8 GEMM, K = ' + str(k):34s} {'inputs':8s} {'normwise':>9s} {'max rel':>9s} {'max|err|/max|ref|':>18s}",
          file=file)
    for name, dist, nw, mr, ma in rows:
        print(f"{name:34s} {dist:8s} {nw:9.2e} {mr:9.2e} {ma:18.2e}", file=file)


def bf16_sum_example(n=10000, seed=0):
    """ml_dtypes' README: NumPy's bfloat16 sum of ``n`` U[0,1) values, and float32 accumulation
    rounded to bfloat16, next to tcemu's GEMM against a column of ones with a bfloat16 accumulator
    (round to nearest after every product) and with the A100 preset."""
    import jax.numpy as jnp
    import ml_dtypes

    bf16 = ml_dtypes.bfloat16
    vals = np.random.default_rng(seed=seed).uniform(size=n).astype(bf16)
    acc = tcemu.BlockFMA(fraction_bits=28, block_size=1, rounding="rne", sticky=True, accumulator_fraction_bits=7)
    x, ones = jnp.asarray(vals, jnp.float32)[None, :], jnp.ones((n, 1), jnp.float32)
    gemm = dict(arch="A100", instruction="m16n8k16.f32.bf16.bf16.f32")
    return {"exact": float(vals.astype(np.float64).sum()),
            "numpy bfloat16 sum": float(vals.sum()),
            "tcemu, bfloat16 accumulator": float(tcemu.matmul(x, ones, config=tcemu.GemmConfig(**gemm, model=acc))[0, 0]),
            "numpy float32 sum -> bfloat16": float(vals.sum(dtype="float32").astype(bf16)),
            "tcemu, A100 preset -> bfloat16": float(np.asarray(tcemu.matmul(x, ones, config=tcemu.GemmConfig(**gemm)))[0, 0].astype(bf16))}


def amd_section(ks, args, out, t0):
    """Section 5: :data:`AMD_VS_H100`'s curves, printed and written (amd_vs_h100.csv/.png)."""
    from tcemu._src.draw import plot_error_curves

    print(f"\n5. AMD MI300X / MI250X against the H100: max relative error of {args.outputs} dot products\n")
    curves = amd_vs_h100_curves(ks, args.outputs)
    print("\n".join(curves_table(curves, (64, 256, 1024, 4096, 16384))))
    write_csv(curves, out / "amd_vs_h100.csv")
    plot_error_curves(curves, out / "amd_vs_h100.png",
                      title=f"H100 and AMD matrix cores vs float64 ({args.outputs} outputs, U[0,1))")
    print(f"wrote {out}/amd_vs_h100.csv, amd_vs_h100.png ({time.perf_counter() - t0:.0f} s)")
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kmax", type=int, default=16384)
    p.add_argument("--outputs", type=int, default=1024, help="dot products per length")
    p.add_argument("--fp8-k", type=int, default=4096)
    p.add_argument("--out", default=str(ROOT / "experiments" / "results"))
    p.add_argument("--amd-only", action="store_true", help="only section 5 (MI300X and MI250X against the H100)")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    ks = [2 ** i for i in range(4, 20) if 2 ** i <= args.kmax]
    if args.amd_only:
        return amd_section(ks, args, out, t0)

    print("1. Feature tests (tcemu.probe); F = fraction bits kept in alignment, acc = accumulator bits\n")
    rows = probe_table()
    print_probe(rows)
    with open(out / "probe.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["gpu", "instruction", "measured_on", "literature"] + [c for c, _ in COLUMNS])
        w.writerows(rows)

    print(f"\n2. Max relative error of {args.outputs} dot products of U[0,1) inputs against float64\n")
    curves = error_curves(ks, args.outputs)
    print("\n".join(curves_table(curves, (64, 256, 1024, 4096, 16384))))
    write_csv(curves, out / "error_vs_k.csv")
    from tcemu._src.draw import plot_error_curves

    plot_error_curves(curves, out / "error_vs_k.png",
                      title=f"Emulated tensor-core dot products vs float64 ({args.outputs} outputs, U[0,1))")

    print()
    fp8 = fp8_gemm_errors(args.fp8_k)
    print_fp8(fp8, args.fp8_k)
    with open(out / "deepseek_fp8.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["config", "inputs", "normwise", "max_rel", "max_abs_over_max_ref"])
        w.writerows([r[:2] + [f"{x:.4e}" for x in r[2:]] for r in fp8])
    print("\n4. ml_dtypes' README: 10,000 U[0,1) values summed in bfloat16\n")
    for name, v in bf16_sum_example().items():
        print(f"{name:34s} {v}")
    amd_section(ks, args, out, t0)
    print(f"\nwrote {out}/probe.csv, error_vs_k.csv, error_vs_k.png, deepseek_fp8.csv "
          f"({time.perf_counter() - t0:.0f} s)\nreproduce: python experiments/published_findings.py "
          f"--kmax {args.kmax} --outputs {args.outputs} --fp8-k {args.fp8_k}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
