"""``jnp.dot`` as XLA compiled it: the GEMM configuration read off the optimised HLO.

With XLA's GEMM autotuner on, each process times candidate kernels and keeps one; the compiled
module says which (``jax.jit(f).lower(*args).compile().as_text()``). :func:`config_from_hlo` reads
it (measured on the H100 and H200 captures of ``experiments/hardware/library_gemm.py``):

* a Triton GEMM fusion (``__triton_nested_gemm_fusion``): its dot's k-tile
  (``backend_config={"sizes":[block_k]}``) and split-K slice count (the split dot's extra axis),
  numerics as XLA's rules with the autotuner off (:func:`tcemu._src.library.xla_triton_config`);
* the split-K partials reduced by a Triton reduction fusion (``kind":"__triton"``): a pairwise
  tree over the threads that hold one output element's partials in Triton's blocked layout of the
  reduction's tile (sides rounded up to powers of two): 16-byte vectors along the output row (one
  element with TMA loads), threads then warps filling the row, the tile's rows, then the slices;
  otherwise by XLA's reduction
  emitters (in order below 32 slices, a warp-shuffle tree from 32);
* a cuBLAS call (``__cublas$lt$matmul``, ``__cublas$gemm``; fp8 ``...$f8``): cuBLAS's choice
  recorded for PyTorch's call of the same shape and types (``torch.mm`` / ``torch.bmm``; fp8:
  ``torch._scaled_mm`` with fast accumulation, as XLA calls it), where the records hold one;
  else one nvjet chain, alone or per slice of XLA's own split-K (:func:`_cublas`).
"""
from __future__ import annotations

import math
import re
from pathlib import Path

from tcemu._src.gemm import GemmConfig, KSchedule
from tcemu._src.library import slice_alignment, xla_triton_config

_SHAPE = r"(\w+)\[([\d,]*)\]\{[\d,]*\}"
_FUSION = re.compile(r"%(\S+) = " + _SHAPE + r" fusion\((.*?)\).*?backend_config=(\{.*)$")
_DOT = re.compile(r"= " + _SHAPE + r" dot\(.*backend_config=\{\"sizes\":\[\"(\d+)\"\]\}")
_CUBLAS = re.compile(r"= \(" + _SHAPE + r", s8\[\d+\]\{0\}\) custom-call\(.*custom_call_target=\"(__cublas\$[\w$]+)\"")


def read_hlo(hlo) -> str:
    """The HLO text: ``hlo`` itself, or the file it names (a path or a str ending in .txt)."""
    if isinstance(hlo, Path) or (isinstance(hlo, str) and "\n" not in hlo and hlo.endswith(".txt")):
        return Path(hlo).read_text()
    if not isinstance(hlo, str):
        raise TypeError(f"library_config: hlo must be the compiled HLO text (jax.jit(f).lower(...).compile()"
                        f".as_text()) or the path of a file holding it, got {type(hlo).__name__}")
    return hlo


def _dims(s: str) -> tuple[int, ...]:
    return tuple(int(x) for x in s.split(",") if x)


def _block(cfg: str) -> dict:
    """The block-level fusion config of a fusion's backend_config (read field by field: a line
    may be cut short after them)."""
    tma = re.search(r'"is_tma_allowed":(true|false)', cfg)
    warps = re.search(r'"num_warps":"?(\d+)', cfg)
    tile = re.search(r'"output_tiles":\[\{"sizes":\[([^\]]*)\]', cfg)
    if not (tma and warps and tile):
        raise ValueError(f"library_config: a reduction fusion of the HLO lacks its block-level config: {cfg[:200]}")
    return {"is_tma_allowed": tma.group(1) == "true", "num_warps": int(warps.group(1)),
            "tile": [int(x.strip('"')) for x in tile.group(1).split(",")]}


def gemms(text: str) -> list[dict]:
    """Every GEMM of an optimised HLO module: {"kind": "triton" | "cublas", "dims": its output
    dims, "block_k", "reduce" (the reduction fusion reading it, or None), "target"}."""
    lines = text.splitlines()
    fusions = {}
    for ln in lines:
        m = _FUSION.search(ln)
        if m:
            fusions[m.group(1)] = (_dims(m.group(3)), m.group(4), m.group(5), ln)
    dots = [(_dims(m.group(2)), int(m.group(3))) for m in map(_DOT.search, lines) if m]
    out = []
    for name, (dims, _, cfg, ln) in fusions.items():
        if "__triton_nested_gemm_fusion" not in ln:
            continue
        ks = [k for d, k in dots if sorted(d) == sorted(dims)] or [k for _, k in dots]
        red = next((f for f in fusions.values() if re.search(r"%" + re.escape(name) + r"\b", f[1])
                    and "reduce_fusion" in f[3]), None)
        out.append({"kind": "triton", "dims": dims, "block_k": ks[0] if ks else None, "reduce": red})
    for m in map(_CUBLAS.search, lines):
        if m:  # its partials (through get-tuple-element and bitcasts) meet the module's reduction
            red = next((f for f in fusions.values() if "reduce_fusion" in f[3]), None)
            out.append({"kind": "cublas", "dims": _dims(m.group(2)), "target": m.group(3), "split": "reduce(" in text,
                        "reduce": red})
    return out


def reduce_tree(red, S: int) -> tuple[str, int, int]:
    """(reduction, threads, lanes) of the split-K partials' reduction fusion ``red``."""
    if red is None or '"kind":"__triton"' not in red[3]:
        return ("sequential" if S < 32 else "shuffle"), 1, 0
    blk = _block(red[2])
    tile, warps = blk["tile"], blk["num_warps"]
    cols, rows = (1 << (max(x, 1) - 1).bit_length() for x in (tile[-1], math.prod(tile[:-1])))  # Triton: powers of 2
    vec = 1 if blk.get("is_tma_allowed") else min(4, cols)
    t_cols = min(32, max(1, cols // vec))
    t_rows = min(32 // t_cols, rows)
    t_s = 32 // (t_cols * t_rows)
    w_cols = min(warps, max(1, cols // (vec * t_cols)))
    w_rows = min(warps // w_cols, max(1, rows // t_rows))
    threads = min(S, t_s * (warps // (w_cols * w_rows)))
    return "pairwise", threads, min(t_s, threads)


def config_from_hlo(gpu: str, M: int, N: int, K: int, batch, a: str, b: str, out: str, hlo, records_answer):
    """(GemmConfig, "compiled" | "recorded") for ``jnp.dot`` of this shape in the compiled module
    ``hlo``, or None where it holds no GEMM of this shape that tcemu reads (``records_answer(lib,
    flags)``: the records' answer for a torch call, or None)."""
    text = read_hlo(hlo)
    want = ((batch,) if batch else ()) + (M, N)
    for g in gemms(text):
        d = g["dims"]
        core = d if len(d) == len(want) else d[:len(want) - 2] + d[len(want) - 1:]
        if sorted(core) != sorted(want):
            continue
        S = 1 if len(d) == len(want) else d[len(want) - 2]
        if g["kind"] == "triton" and g["block_k"]:
            red, threads, lanes = reduce_tree(g["reduce"], S)
            return xla_triton_config(gpu, a, b, S, g["block_k"], red if S > 1 else None, threads, lanes), "compiled"
        if g["kind"] == "cublas":
            return _cublas(gpu, a, b, out, batch, S, g, records_answer)
    return None


def _cublas(gpu, a, b, out, batch, S, g, records_answer):
    """A cuBLAS call: the records' choice for the same torch call where they hold it (unsplit);
    else cuBLASLt's nvjet kernel, one chain of k-tiles (64 elements; fp8 with fast accumulation:
    128), residue last: alone (16-bit inputs to f32 output, which torch never asks for), or per
    slice of XLA's own split-K (a batched call of S slices of 16 bytes' alignment), the partials
    then reduced as a Triton GEMM's are (:func:`reduce_tree`)."""
    fp8 = g["target"].endswith("$f8")
    if S == 1 and not g["split"]:
        if fp8:
            rec = records_answer("torch._scaled_mm", {"use_fast_accum": True})
        elif out == a:
            rec = records_answer("torch.bmm" if batch else "torch.mm", {"reduced_precision_reduction": True})
        else:
            rec = None
        if rec is not None:
            return rec[0], "recorded"
    ins = f"wgmma.mma_async.sync.aligned.m64n8k32.f32.{a}.{b}" if fp8 else f"m16n8k16.f32.{a}.{b}.f32"
    k_tile = 128 if fp8 else 64
    if S == 1:
        if g["split"] or (fp8 or out == a):  # a reduce we cannot place, or a case the records should hold
            return None
        return GemmConfig(arch=gpu, instruction=ins, schedule=KSchedule(k_tile=k_tile)), "compiled"
    red, threads, lanes = reduce_tree(g["reduce"], S)
    return GemmConfig(arch=gpu, instruction=ins, schedule=KSchedule(
        slices=S, k_tile=k_tile, slice_align=slice_alignment(a, b), reduction=red, reduce_threads=threads,
        reduce_lanes=lanes)), "compiled"
