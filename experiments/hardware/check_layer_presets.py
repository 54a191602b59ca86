"""How often ``tcemu.library_config`` (with ``tcemu.matmul``'s epilogue) reproduces captured GEMM
layers (``layer_gemm.py``) bit for bit, on every captured row, without looking at the outputs.

    python experiments/hardware/check_layer_presets.py tests/data/layer_gemm_*.npz [--out FILE.json]

Per capture and layer: cases reproduced / cases, and the same for the cases whose kernels did not
split K (no ``splitKreduce`` kernel, no XLA split-K fusion), which the presets must all get.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1]))
from identify_layers import emulate, epilogue_operands  # noqa: E402
from tcemu._src import captures as C  # noqa: E402
from tcemu._src.library import shipped_gpu  # noqa: E402


def preset(case) -> tuple[str, dict, int, int | None]:
    """(library_config's lib, its flags, M, batch) for a captured case."""
    layer, mode = case["layer"], case.get("mode", "default")
    split = {"allow_splitk": mode != "splitk_off"}
    if layer in ("mm", "matmul3d"):
        return "torch.matmul", split, case["M"], None
    if layer.startswith("linear"):
        return "F.linear", dict(split, bias=bool(case["bias"])), case["M"], None
    if layer.startswith("addmm"):
        c = "row" if layer == "addmm_row" else "matrix"
        return "torch.addmm", dict(split, c=c, alpha=case["alpha"], beta=case["beta"]), case["M"], None
    if layer.startswith("baddbmm"):
        return "torch.baddbmm", dict(split, alpha=case["alpha"], beta=case["beta"]), case["M"], case["batch"]
    if layer == "scaled_block":
        return "torch._scaled_mm", {"scaling": case["flags"]["scaling"]}, case["M"], None
    if layer == "scaled_mm":
        return "torch._scaled_mm", {"use_fast_accum": case["flags"]["use_fast_accum"],
                                    "scaling": case["flags"]["scaling"]}, case["M"], None
    return "jax.dense", {"bias": bool(case["bias"]), "xla_autotune": mode != "autotune_off"}, case["M"], None


def splits(case) -> bool:
    """Whether the captured kernels split K: a split-K reduction kernel, a CUTLASS 2 kernel after a
    memset (serial split-K into the zeroed output), or an XLA dot with a split axis."""
    text = " ".join(case.get("kernels", []) + case.get("hlo", []))
    return "splitKreduce" in text or ("Memset" in text and "cutlass" in text) or bool(re.search(r"f32\[\d+,\d+,\d+\]", text)) and not case["batch"]


def check(path):
    import tcemu

    z, meta = C.load(path)
    gpu = meta["header"]["versions"]["gpu"]
    arch = shipped_gpu(gpu)
    out = []
    for case in meta["cases"]:
        if "key" not in case:
            continue
        lib, flags, M, batch = preset(case)
        rows, cols = z[f"{case['key']}.rows"], z[f"{case['key']}.cols"]
        d = z[f"{case['key']}.d"]
        try:
            cfg = tcemu.library_config(lib, arch=arch, M=M, N=case["N"], K=case["K"], a=case["a"], b=case["b"],
                                       out=case["out"], batch=batch, **flags)
            got = emulate(case, rows, cols, cfg, epilogue_operands(case, rows, cols)).view(d.dtype)
            ok = float((got == d).mean())
        except ValueError as e:
            ok, cfg = None, str(e)
        out.append(dict(capture=Path(path).name, key=case["key"], layer=case["layer"], lib=lib, flags=flags,
                        shape=[case["batch"], M, case["N"], case["K"]], a=case["a"], out_type=case["out"],
                        splits=splits(case), match=ok, config=repr(cfg)))
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("captures", nargs="+")
    p.add_argument("--out")
    args = p.parse_args(argv)
    rows = [r for path in args.captures for r in check(path)]
    table = defaultdict(lambda: [0, 0, 0, 0])
    for r in rows:
        t = table[(r["capture"], r["layer"])]
        exact = r["match"] == 1.0
        t[0] += exact
        t[1] += 1
        if not r["splits"]:
            t[2] += exact
            t[3] += 1
        if not exact:
            print(f"  miss {r['capture']} {r['key']} {r['layer']} {r['shape']} {r['a']}->{r['out_type']} "
                  f"match={r['match']} splits={r['splits']}", flush=True)
    print("| capture | layer | reproduced | without split-K |\n|---|---|---|---|")
    for (cap, layer), (n, t, ns, nt) in sorted(table.items()):
        print(f"| {cap} | {layer} | {n}/{t} | {ns}/{nt} |")
    tot = np.sum(list(table.values()), axis=0)
    print(f"| all | | {tot[0]}/{tot[1]} | {tot[2]}/{tot[3]} |")
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
