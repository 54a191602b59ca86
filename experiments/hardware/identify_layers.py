"""Find the configuration (K schedule and epilogue) of every captured GEMM layer
(``layer_gemm.py``) and report which epilogue each layer runs.

    python experiments/hardware/identify_layers.py tests/data/layer_gemm_h100_*.npz \
        --out experiments/results/layers_dev.json [--seconds 120]

Per case: first the configuration of the same shape's bias-free GEMM in the same capture
(``torch.mm`` for torch's layers, the dense layer without bias for JAX) with each epilogue
(:class:`tcemu.Epilogue`: c and bias added to the float32 accumulator or to the rounded output,
both orders of two scales), checked on every captured row; else ``tcemu.identify`` given the
layer's bias / C / alpha / beta / scales on the first 32 rows, checked on the other rows.
Inputs are regenerated from the seeds (``tcemu._src.captures``).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
from tcemu._src import captures as C  # noqa: E402
from tcemu._src.library import shipped_gpu  # noqa: E402

SEEN = 32
TWIN_OF = {"torch": "mm", "jax": "dense"}


def epilogue_operands(case, rows, cols) -> dict:
    """The layer's epilogue operands at the crop, as ``tcemu.matmul`` takes them (float32)."""
    ops = {}
    if case.get("c"):
        ops["c"] = C.c_rows(case, rows, cols).view(C.NUMPY[case["c"]]).astype(np.float32)
    if case.get("bias"):
        bias = C.bias_values(case, cols).astype(np.float32)
        if case["layer"].startswith("addmm_row"):  # torch.addmm(bias_row, A, B): the row is C
            ops["c"] = np.broadcast_to(bias, (len(rows), len(cols)))
        else:
            ops["bias"] = bias
    if (case.get("alpha"), case.get("beta")) not in ((1.0, 1.0), (None, None)):
        ops["alpha"], ops["beta"] = np.float32(case["alpha"]), np.float32(case["beta"])
    for which in ("scale_a", "scale_b"):
        v = case.get(which)
        if v in C.BLOCK_RECIPES:  # block scales along K, (rows, K / 128) and (K / 128, cols)
            s = C.expand_block_scales(case, which)
            ops[which] = s[np.asarray(rows) % case["M"]] if which == "scale_a" else s[:, np.asarray(cols)]
        elif v == "row":
            idx = (np.asarray(rows) % case["M"]) if which == "scale_a" else np.asarray(cols)
            s = C.scale_values(case, which, idx)
            ops[which] = s[:, None] if which == "scale_a" else s[None, :]
        elif v is not None:
            ops[which] = np.float32(v)
    return ops


def _select(ops, sel):
    return {k: (v[sel] if k == "c" or (k == "scale_a" and np.ndim(v)) else v) for k, v in ops.items()}


def emulate(case, rows, cols, cfg, ops):
    """The captured crop as ``tcemu.matmul`` with ``cfg`` and the epilogue computes it."""
    import tcemu

    a, bt, bs = C.crop_operands(case, rows, cols)
    out = np.zeros((len(rows), len(cols)), C.NUMPY[case["out"]])
    for x, b in bs.items():
        sel = bt == x
        out[sel] = np.asarray(tcemu.matmul(a[sel], b, config=cfg, out_type=case["out"], **_select(ops, sel)))
    return out


def epilogues(ops):
    import tcemu
    from tcemu._src.identify.sample import block_scaled, epilogues_to_try

    return epilogues_to_try(None, "c" in ops, "bias" in ops, "scale_a" in ops and "scale_b" in ops,
                            block_scaled(ops)) or [tcemu.Epilogue()]


def config_dict(cfg):
    return {"instruction": cfg.instruction, "schedule": dataclasses.asdict(cfg.schedule),
            "epilogue": dataclasses.asdict(cfg.epilogue)}


def one(path, case, twin, seconds):
    """The row of one case: its configuration (from the twin, or identified) and how it fits."""
    import tcemu

    z, meta = C.load(path)
    key = case["key"]
    rows, cols, d = z[f"{key}.rows"], z[f"{key}.cols"], z[f"{key}.d"].view(C.NUMPY[case["out"]])
    gpu = meta["header"]["versions"]["gpu"]
    arch = shipped_gpu(gpu)
    ops = epilogue_operands(case, rows, cols)
    store = C.OUT_STORAGE[case["out"]]
    t = time.time()
    row = {k: case.get(k) for k in ("lib", "layer", "mode", "batch", "M", "N", "K", "a", "b", "out", "bias", "c",
                                    "alpha", "beta", "scale_a", "scale_b", "flags", "seed", "key")}
    row.update(gpu=gpu, arch=arch, kernels=case.get("kernels") or [ln[:300] for ln in case.get("hlo", [])
                                                                    if "fusion(" in ln or "custom-call" in ln])
    if twin is not None:
        for epi in epilogues(ops):
            cfg = tcemu.GemmConfig(arch=arch, instruction=twin["instruction"],
                                   schedule=tcemu.KSchedule(**twin["schedule"]), epilogue=epi)
            ok = emulate(case, rows, cols, cfg, ops).view(store) == d.view(store)
            if ok.all():
                row.update(config_dict(cfg), held_out=1.0, source="twin", seconds=round(time.time() - t, 1))
                return row
    bt = rows // case["M"]
    seen = np.zeros(len(rows), bool)
    seen[np.flatnonzero(bt == bt[0])[:SEEN]] = True
    a, _, bs = C.crop_operands(case, rows[seen], cols)
    try:
        lib = "jnp.dot" if case["lib"].startswith("jax") else "torch._scaled_mm" if case["a"] == "e4m3" else "torch.mm"
        cfg = tcemu.identify(a, bs[int(bt[0])], d[seen], arch=arch, rows=SEEN, library=lib, max_seconds=seconds,
                             shape=((case["batch"],) if case.get("batch") else ()) + (case["M"], case["N"]),
                             **_select(ops, seen))
        held = emulate(case, rows[~seen], cols, cfg, _select(ops, ~seen)).view(store) == d[~seen].view(store)
        row.update(config_dict(cfg), held_out=float(held.mean()) if held.size else None, source="identify")
    except tcemu.NoMatch as e:
        row["closest"] = [dict(match=f, **config_dict(c)) for f, c in e.closest]
    row["seconds"] = round(time.time() - t, 1)
    return row


def alternatives(path, row) -> list:
    """The epilogues that reproduce every captured row with the row's schedule: one means the
    capture decides the epilogue, several that these inputs cannot tell them apart."""
    import tcemu

    z, meta = C.load(path)
    case = next(c for c in meta["cases"] if c.get("key") == row["key"])
    rows, cols, d = z[f"{row['key']}.rows"], z[f"{row['key']}.cols"], z[f"{row['key']}.d"]
    ops, store = epilogue_operands(case, rows, cols), C.OUT_STORAGE[case["out"]]
    fits = []
    for epi in epilogues(ops):
        cfg = tcemu.GemmConfig(arch=row["arch"], instruction=row["instruction"],
                               schedule=tcemu.KSchedule(**row["schedule"]), epilogue=epi)
        if (emulate(case, rows, cols, cfg, ops).view(store) == d.view(store)).all():
            fits.append(dataclasses.asdict(epi))
    return fits


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("captures", nargs="+")
    p.add_argument("--out", required=True)
    p.add_argument("--seconds", type=float, default=120.0, help="identify's time limit per case")
    p.add_argument("--only", default="", help="comma-separated layers to run (all by default)")
    p.add_argument("--shapes", default="", help="comma-separated MxNxK shapes to run (all by default)")
    args = p.parse_args(argv)
    rows = []
    for path in args.captures:
        _, meta = C.load(path)
        lib = "jax" if "_jax_" in Path(path).name else "torch"
        found = {}
        cases = [c for c in meta["cases"] if "key" in c and (not args.only or c["layer"] in args.only.split(","))
                 and (not args.shapes or f"{c['M']}x{c['N']}x{c['K']}" in args.shapes.split(","))]
        for case in sorted(cases, key=lambda c: c["layer"] != TWIN_OF[lib]):  # the bias-free GEMMs first
            twin_key = (case["M"], case["N"], case["K"], case["a"], case.get("batch"))
            row = one(path, case, found.get(twin_key) if case["layer"] != TWIN_OF[lib] else None, args.seconds)
            row["capture"] = Path(path).name
            if row.get("held_out") == 1.0:
                row["epilogues_that_fit"] = alternatives(path, row)
            if case["layer"] == TWIN_OF[lib] and "schedule" in row:
                found[twin_key] = row
            rows.append(row)
            print(f"{row['capture']} {row['key']} {row['layer']} {row['M']}x{row['N']}x{row['K']} {row['a']}: "
                  f"{row.get('source', 'no match')} {row.get('epilogue', '')} held_out={row.get('held_out')} "
                  f"fit={len(row.get('epilogues_that_fit', []))} "
                  f"{row['seconds']} s", flush=True)
    Path(args.out).write_text(json.dumps({"rows": rows}, indent=1))
    summary = Counter((r["capture"], r["layer"], r.get("source", "none"), json.dumps(r.get("epilogue"))) for r in rows)
    for k, n in sorted(summary.items()):
        print(n, *k)


if __name__ == "__main__":
    main()
