"""Identify the K schedule of every captured library GEMM (``library_gemm.py``) with
``tcemu.identify`` on the first 32 captured rows, check it on the other rows, and write the table
that ``tcemu.library_config`` ships.

    python experiments/hardware/identify_captures.py tests/data/library_gemm_*.npz \
        --out tcemu/_src/data/library_gemm.json.gz [--jobs 2]

Each row: the case (library, GPU, shape, types, flags, kernels), the configuration found (or
the closest candidates when none reproduces the 32 rows), and the fraction of held-out outputs
it reproduces. Inputs are regenerated from the seeds (``tcemu._src.captures``).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
from tcemu._src.captures import OUT_STORAGE, captured, crop_operands, evaluate, hlo_slices, load  # noqa: E402
from tcemu._src.identify import triton_trees  # noqa: E402
from tcemu._src.library import read_json, shipped_gpu, slice_alignment  # noqa: E402
from tcemu._src.gemm import KSchedule  # noqa: E402

SEEN = 32


def emulate(case, rows, cols, cfg):
    """The captured crop as ``tcemu.matmul`` with ``cfg`` computes it."""
    import tcemu

    return evaluate(case, rows, cols, lambda a, b: tcemu.matmul(a, b, config=cfg))


def config_dict(cfg):
    return {"instruction": cfg.instruction, "schedule": dataclasses.asdict(cfg.schedule)}


def one(job):
    """Identify one case; with ``twin`` (the configuration found for a case of the same shape,
    types and kernels), first check whether that one reproduces all captured rows."""
    import tcemu

    path, key, twin, seconds, n_seen = job
    case, gpu, arch, rows, cols, d = captured(path, key)
    t = time.time()
    row = {k: case[k] for k in ("lib", "batch", "M", "N", "K", "a", "b", "out", "flags", "seed")}
    row.update(gpu=gpu, arch=arch, key=key, kernels=case.get("kernels") or _hlo_kernels(case.get("hlo", [])))
    # the first n_seen rows of one batch index are what identify sees
    bt = rows // case["M"]
    seen = np.zeros(len(rows), bool)
    seen[np.flatnonzero(bt == bt[0])[:n_seen]] = True
    a, _, bs = crop_operands(case, rows[seen], cols)
    store = OUT_STORAGE[case["out"]]

    def reproduces(cfg):
        return (emulate(case, rows, cols, cfg).view(store) == d.view(store)).all()

    if twin is not None:
        cfg = tcemu.GemmConfig(arch=arch, instruction=twin["instruction"], schedule=tcemu.KSchedule(**twin["schedule"]))
        if reproduces(cfg):
            row.update(config_dict(cfg), held_out=1.0, seconds=round(time.time() - t, 1), twin=twin["key"])
            return row
    for ins, fields in hinted(case):
        cfg = tcemu.GemmConfig(arch=arch, instruction=ins, schedule=tcemu.KSchedule(**fields))
        if reproduces(cfg):
            row.update(config_dict(cfg), held_out=1.0, seconds=round(time.time() - t, 1), hinted=True)
            return row
    if seconds <= 0:
        row.update(closest=[], searched=False, seconds=round(time.time() - t, 1))
        return row
    try:
        cfg = tcemu.identify(a, bs[int(bt[0])], d[seen], arch=arch, rows=n_seen, library=case["lib"],
                              shape=((case["batch"],) if case["batch"] else ()) + (case["M"], case["N"]),
                              hlo="\n".join(case["hlo"]) if case.get("hlo") else None,
                              max_seconds=seconds)
        row.update(config_dict(cfg), seen=int(seen.sum()))
        held = emulate(case, rows[~seen], cols, cfg).view(store) == d[~seen].view(store)
        row["held_out"] = float(held.mean()) if held.size else None
    except tcemu.NoMatch as e:
        row["closest"] = [dict(match=f, **config_dict(c)) for f, c in e.closest]
    row["seconds"] = round(time.time() - t, 1)
    return row


def hinted(case):
    """(instruction, schedule fields) the kernel information points to: XLA's Triton split-K (S
    from the split dot's shape, K padded to a multiple of S * 16 bytes, k-tiles of the fusion's
    block_k with the residue last in each slice; the float32 partials reduced by a Triton
    reduction fusion (pairwise, over threads, lanes and warps) or by XLA's reduction emitter
    (shuffle tree)), or one chain for an unsplit Triton GEMM. fp8 Triton GEMMs with block_k below
    32 (XLA's default tiling with the autotuner off) widen fp8 to f16 exactly and run the f16 MMA."""
    hlo = " ".join(case.get("hlo", []))
    bk = re.search(r'dot\(.*?"sizes":\["(\d+)"\]', hlo)
    if not bk:
        return []
    fp8 = case["a"] in ("e4m3", "e5m2")
    ins = (f"m16n8k16.f32.{case['a']}.{case['b']}.f32" if not fp8 and int(bk.group(1)) % 16 == 0
           else f"wgmma.mma_async.sync.aligned.m64n8k32.f32.{case['a']}.{case['b']}" if int(bk.group(1)) % 32 == 0
           else "m16n8k16.f32.f16.f16.f32" if fp8 and int(bk.group(1)) % 16 == 0 else None)
    if ins is None:
        return []
    S = hlo_slices(case)
    if S is None:  # no split-K: one chain
        return [(ins, {})] if "triton_gemm" in hlo or "__triton" in hlo else []
    base = {"slices": S, "k_tile": int(bk.group(1)), "slice_align": slice_alignment(case["a"], case["b"])}
    reds = [{"reduction": "pairwise"}] + [{"reduction": "pairwise", "reduce_threads": T, "reduce_lanes": L}
                                          for T, L in triton_trees(S)]
    reds = reds + [{"reduction": "shuffle"}] if '"kind":"__triton"}' in hlo else [{"reduction": "shuffle"}] + reds
    return [(ins, base | r) for r in reds + [{"reduction": "sequential"}]]


def _hlo_kernels(hlo):
    """The GEMM-relevant facts of XLA's optimised HLO: Triton fusions (tiles, split-K), cuBLAS."""
    out = []
    for ln in hlo:
        if "custom_call_target=" in ln:
            out.append(ln.split('custom_call_target="')[1].split('"')[0])
        elif "__triton_nested_gemm_fusion" in ln or "__triton_gemm" in ln:
            out.append("triton_gemm " + ln.split("=")[1].split("fusion(")[0].strip()
                       + " tiles " + ln.split('"output_tiles":')[1].split("]}]")[0] + "]")
        elif ln.startswith(("ROOT %dot", "%dot")) and '"sizes"' in ln:
            out.append("dot block_k " + ln.split('"sizes":')[1].split("}")[0])
        elif "loop_reduce_fusion" in ln and "__triton" in ln:
            out.append("split-K reduce (triton)")
    return out


def kernel_family(row):
    """A short name of the kernel that ran (cuBLAS nvjet / CUTLASS 2, split-K; XLA Triton/cuBLAS)."""
    ks = " ".join(row["kernels"])
    if row["lib"] == "jnp.dot":  # split-K: the dot gains a leading slice axis
        split = bool(re.search(r"\[\d+,\d+,\d+\]" if not row["batch"] else r"\[\d+,\d+,\d+,\d+\]", ks))
        return ("XLA cuBLAS" if "cublas" in ks else "XLA Triton") + (" + split-K" if split else "")
    fam = "nvjet" if "nvjet" in ks else "CUTLASS 2 (sm75/sm80)" if "cutlass" in ks else "other"
    return fam + (" + split-K" if "splitK" in ks else "")


def summary(table) -> str:
    """Markdown: per GPU, library and kernel family, cases whose configuration reproduces every
    captured output, and the schedules found."""
    groups = {}
    for r in table["cases"]:
        groups.setdefault((r["arch"], r["lib"], kernel_family(r)), []).append(r)
    lines = ["| GPU | library | kernels | cases | reproduced | schedules found |", "|---|---|---|---|---|---|"]
    for (arch, lib, fam), rs in sorted(groups.items()):
        ok = [r for r in rs if "schedule" in r and r.get("held_out") in (1.0, None)]
        scheds = sorted({(r["instruction"].split(".")[0] if not r["instruction"].startswith("wgmma") else "wgmma k32")
                         + ": " + KSchedule(**r["schedule"]).describe() for r in ok})
        lines.append(f"| {arch} | {lib} | {fam} | {len(rs)} | {len(ok)} | {'; '.join(scheds[:4])}"
                     + (f" (+{len(scheds) - 4} more)" if len(scheds) > 4 else "") + " |")
    allok = sum("schedule" in r and r.get("held_out") in (1.0, None) for r in table["cases"])
    lines.append(f"\n{allok} of {len(table['cases'])} cases reproduced bit for bit on every captured output.")
    return "\n".join(lines)


def check_config(job):
    """Whether ``tcemu.library_config`` (no outputs seen) reproduces every captured output of a case."""
    import tcemu

    path, key = job
    case, gpu, arch, rows, cols, d = captured(path, key)
    cfg = tcemu.library_config(case["lib"], arch=arch, M=case["M"], N=case["N"], K=case["K"], a=case["a"],
                               b=case["b"], out=case["out"], batch=case["batch"], **case["flags"])
    store = OUT_STORAGE[case["out"]]
    ok = emulate(case, rows, cols, cfg).view(store) == d.view(store)
    return dict({k: case[k] for k in ("lib", "batch", "M", "N", "K", "a", "b", "out", "flags")}, arch=arch, key=key,
                kernels=case.get("kernels") or _hlo_kernels(case.get("hlo", [])), match=float(ok.mean()),
                **config_dict(cfg))


def check_summary(rows) -> str:
    """Markdown: per GPU and library, cases ``library_config`` reproduces bit for bit."""
    groups = {}
    for r in rows:
        groups.setdefault((r["arch"], r["lib"], kernel_family(r)), []).append(r)
    lines = ["| GPU | library | kernels | cases | reproduced |", "|---|---|---|---|---|"]
    for (arch, lib, fam), rs in sorted(groups.items()):
        lines.append(f"| {arch} | {lib} | {fam} | {len(rs)} | {sum(r['match'] == 1.0 for r in rs)} |")
    ok = sum(r["match"] == 1.0 for r in rows)
    lines.append(f"\n{ok} of {len(rows)} cases ({ok / max(1, len(rows)):.1%}) reproduced bit for bit by library_config.")
    return "\n".join(lines)


def write_json(path, obj):
    """``obj`` as JSON at ``path``, gzip-compressed when the name ends in .gz (the shipped table)."""
    import gzip

    text = json.dumps(obj, indent=0)
    if str(path).endswith(".gz"):
        with gzip.open(path, "wt", compresslevel=9) as f:
            f.write(text)
    else:
        Path(path).write_text(text)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("captures", nargs="*")
    p.add_argument("--out", help="the table to write (or, with --summary, to read)")
    p.add_argument("--summary", action="store_true", help="print the markdown summary of the table --out")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--only", default="", help="comma-separated case keys (debugging)")
    p.add_argument("--seconds", type=float, default=30.0, help="search time per case before giving up")
    p.add_argument("--seen", type=int, default=SEEN,
                   help="captured rows identify sees (the others check its answer); all 64 leave none held out")
    p.add_argument("--resume", help="a partial table (a run cut off by a time limit): keep its rows, do the rest")
    p.add_argument("--retry-failed", action="store_true", help="with --resume: run the unreproduced cases again")
    p.add_argument("--lib", default="", help="only cases of libraries starting with this (torch, jnp.dot, ...)")
    p.add_argument("--no-search", action="store_true",
                   help="only check the configuration of a case with the same shape, types and kernels (cheap)")
    p.add_argument("--check-config", action="store_true",
                   help="check tcemu.library_config (which sees no outputs) on every case of the captures; "
                        "write the rows to --out")
    args = p.parse_args(argv)
    if args.check_config:
        jobs = []
        for path in args.captures:
            z, meta = load(path)
            jobs += [(path, c["key"]) for c in meta["cases"] if "key" in c and c["lib"].startswith(args.lib)]
        with ProcessPoolExecutor(args.jobs) as ex:
            rows = list(ex.map(check_config, jobs))
        for r in rows:
            if r["match"] < 1:
                print(f"{r['arch']} {r['key']} {r['lib']} b{r['batch']} {r['M']}x{r['N']}x{r['K']} {r['a']}->{r['out']} "
                      f"{r['flags']} {kernel_family(r)}: {r['match']:.3f} with {r['schedule']}")
        print(check_summary(rows))
        if args.out:
            write_json(args.out, rows)
        return
    if args.summary:
        print(summary(read_json(args.out)))
        return
    jobs, headers = [], {}
    done = read_json(args.resume)["cases"] if args.resume else []
    if args.retry_failed:  # run again the cases whose configuration was not found
        done = [r for r in done if ("schedule" in r and r.get("held_out") in (1.0, None))
                or not r["lib"].startswith(args.lib)]
    have = {(r["arch"], r["lib"].startswith("torch"), r["key"]) for r in done}
    for path in args.captures:
        z, meta = load(path)
        headers[Path(path).name] = meta["header"]
        arch = shipped_gpu(meta["header"]["versions"]["gpu"])
        jobs += [(path, c["key"]) for c in meta["cases"] if "key" in c
                 and (not args.only or c["key"] in args.only.split(","))
                 and (arch, c["lib"].startswith("torch"), c["key"]) not in have and c["lib"].startswith(args.lib)]
    # cases of the same shape, types and kernels (torch's reduction flag often changes nothing;
    # the H100 and H200 often run the same kernel) are checked against the first one's answer
    groups = {}
    for path, key in jobs:
        z, meta = load(path)
        c = next(c for c in meta["cases"] if c.get("key") == key)
        sig = json.dumps([c["lib"], c["batch"], c["M"], c["N"], c["K"], c["a"], c["b"], c["out"],
                          c.get("kernels") or _hlo_kernels(c.get("hlo", []))])
        groups.setdefault(sig, []).append((path, key))
    rows = list(done)
    if args.no_search:  # answers of done cases with the same signature (other GPU, other flag), hints
        by_sig = {}
        for r in done:
            if "schedule" in r and r.get("held_out") in (1.0, None):
                by_sig.setdefault(json.dumps([r["lib"], r["batch"], r["M"], r["N"], r["K"], r["a"], r["b"], r["out"],
                                              r["kernels"]]), r)
        todo = []
        for path, key in jobs:
            z, meta = load(path)
            c = next(c for c in meta["cases"] if c.get("key") == key)
            sig = json.dumps([c["lib"], c["batch"], c["M"], c["N"], c["K"], c["a"], c["b"], c["out"],
                              c.get("kernels") or _hlo_kernels(c.get("hlo", []))])
            todo.append((path, key, by_sig.get(sig), 0.0, args.seen))
        groups = {}

    def show(row):
        rows.append(row)
        found = row.get("schedule")
        print(f"{row['gpu'][-4:]} {row['key']} {row['lib']} {row['M']}x{row['N']}x{row['K']} b{row['batch']} "
              f"{row['a']}x{row['b']}->{row['out']} {row['flags']}: "
              + (f"{row['instruction']} {found} held {row['held_out']}" if found
                 else f"NO MATCH {row['closest'][0]['match']:.3f}" if row["closest"] else "not searched")
              + f" ({row['seconds']} s)", flush=True)
        if len(rows) % 20 == 0:  # partial tables survive a time limit
            write()
        return row

    def write():
        write_json(args.out, {"captures": headers, "cases": rows})

    with ProcessPoolExecutor(args.jobs) as ex:
        if args.no_search:
            for row in ex.map(one, todo):
                show(row)
        firsts = [show(r) for r in ex.map(one, [(p, k, None, args.seconds, args.seen)
                                                for p, k in (g[0] for g in groups.values())])]
        rest = [(p, k, f if "schedule" in f else None, args.seconds, args.seen)
                for f, g in zip(firsts, groups.values()) for p, k in g[1:]]
        for row in ex.map(one, rest):
            show(row)
    write()


if __name__ == "__main__":
    main()
