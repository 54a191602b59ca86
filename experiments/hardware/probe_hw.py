"""Run tcemu's feature-detection probe on the real tensor cores and on the emulator, side by side.

    python experiments/hardware/probe_hw.py --out OUTDIR      # on a GPU machine (nvcc, CuPy)

``tcemu.probe(..., mma=f)`` accepts any function with the value-level signature of ``tcemu.mma``;
here ``f`` packs the matrices into registers with the PTX fragment layouts (checked bit for bit
against this GPU by tests/test_mma_sync_hw.py), runs the mma.sync kernel of ``kernels.py`` once per
chained instruction, and unpacks D; wgmma forms run the warpgroup kernel of ``wgmma.py`` (A from
registers, B from shared memory through a descriptor; layouts checked by tests/test_wgmma_hw.py). Writes ``probe_sm90.json`` (the hardware's and the emulator's
ProbeResult per instruction); tests/test_probe.py compares the emulator with it.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1]))

import inputs as I  # noqa: E402
import kernels as Kn  # noqa: E402
from capture import Gpu  # noqa: E402

import tcemu  # noqa: E402
import tcemu._src.studies  # noqa: E402
from tcemu._src import formats as fm  # noqa: E402

INSTRUCTIONS = [
    "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32",
    "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32",
    "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32",
    "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32",
    "mma.sync.aligned.m16n8k4.row.col.f32.tf32.tf32.f32",
    "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32",
    "mma.sync.aligned.m16n8k32.row.col.f32.e5m2.e5m2.f32",
    "wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16",
    "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16",
    "wgmma.mma_async.sync.aligned.m64n8k8.f32.tf32.tf32",
    "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3",
    "wgmma.mma_async.sync.aligned.m64n8k32.f32.e5m2.e5m2",
]


def hardware_mma(gpu):
    """``mma(spelling, a, b, c) -> d`` on the GPU, for the mma.sync forms of ``kernels.py``."""
    forms = {f.spelling: f for f in Kn.mma_sync_forms()}

    def run(spelling, a, b, c):
        f = forms[spelling]
        ins = tcemu.ptx(spelling, arch="sm_90")
        etype = spelling.split(".")[-2]
        a, b, c = (np.asarray(x) for x in (a, b, c))
        T = a.shape[0]

        def vals(x, frag, et):  # (T, R, C) typed -> (T, 32, nvalues) bit patterns
            bits = np.asarray(fm.to_bits(x, et))
            co = frag.coords
            return bits[:, co[..., 0], co[..., 1]]

        regs_in = np.concatenate([I.pack_slots(vals(a, ins.fa, etype), ins.fa.bits, f.na),
                                  I.pack_slots(vals(b, ins.fb, etype), ins.fb.bits, f.nb),
                                  I.pack_slots(vals(c.astype(np.float32), ins.fc, "f32"), 32, f.nc)], axis=2)
        out = np.zeros((T, 32, f.nd), np.uint32)
        (out,) = gpu.run(f.name, T, [regs_in.ravel(), out.ravel()], [1])
        out = out.reshape(T, 32, f.nd)
        d = np.zeros((T, ins.fd.rows, ins.fd.cols), np.uint32)
        co = ins.fd.coords
        d[:, co[..., 0], co[..., 1]] = out
        return d.view(np.float32)

    return run


def hardware_wgmma(gpu):
    """``mma(spelling, a, b, c) -> d`` on the GPU, for the f32-accumulator forms of ``wgmma.py``."""
    import wgmma as W

    forms = {W.spelling(d, a, K): (d, a, K, bits, na, nd) for d, a, K, bits, na, nd in W.FORMS if d == "f32"}

    def run(spelling, a, b, c):
        d, at, K, bits, na, nd = forms[spelling]
        A, B = (np.asarray(fm.to_bits(x, at)) for x in (a, b))
        C = np.asarray(c, np.float32).view(np.uint32)
        T = A.shape[0]
        ac, dc = W.a_coords(K, bits), W.d_coords(nd)
        a_regs = I.pack_slots(A[:, ac[..., 0], ac[..., 1]], bits, na)
        c_regs = I.pack_slots(C[:, dc[..., 0], dc[..., 1]], 32, nd)
        bimg = np.stack([W.b_image(B[t], bits) for t in range(T)])
        d_regs = np.zeros((T, 128, nd), np.uint32)
        (d_regs,) = gpu.run(W.kname(d, at, K), T, [a_regs.ravel(), c_regs.ravel(), bimg.ravel(), d_regs.ravel()],
                            [3], threads=128)
        out = np.zeros((T, 64, 8), np.uint32)
        out[:, dc[..., 0], dc[..., 1]] = d_regs.reshape(T, 128, nd)
        return out.view(np.float32)

    return run


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    import wgmma as W

    build = Path(tempfile.mkdtemp())
    hw, hw_wg = hardware_mma(Gpu(build)), hardware_wgmma(W.Gpu(build))
    results = {}
    rng = np.random.default_rng(7)
    runner = {sp: hw_wg if sp.startswith("wgmma") else hw for sp in INSTRUCTIONS}
    for sp in INSTRUCTIONS:  # the packing: random inputs give tcemu.mma's bits
        ins = tcemu._src.isa.parse.parse(sp)
        dt = tcemu._src.studies.DTYPES[ins.atype]
        a = rng.standard_normal((8, ins.m, ins.k)).astype(np.float32).astype(dt)
        b = rng.standard_normal((8, ins.k, ins.n)).astype(np.float32).astype(dt)
        if ins.atype == "tf32":
            a, b = (tcemu.quantize(x, "tf32") for x in (a, b))
        c = rng.standard_normal((8, ins.m, ins.n)).astype(np.float32)
        d_hw = runner[sp](sp, a, b, c)
        same = np.array_equal(d_hw.view(np.uint32), np.asarray(tcemu.mma(sp, a, b, c, arch="sm_90")).view(np.uint32))
        print(f"{sp}: random inputs, hardware bits == tcemu.mma: {same}")
    for sp in INSTRUCTIONS:
        r_hw = tcemu.probe("sm_90", instruction=sp, mma=runner[sp])
        r_emu = tcemu.probe("sm_90", instruction=sp)
        results[sp] = {"hardware": dataclasses.asdict(r_hw), "emulator": dataclasses.asdict(r_emu)}
        same = r_hw == r_emu
        print(f"{sp}: {'same' if same else 'DIFFERENT'}")
        for (_, name, v_hw), (_, _, v_emu) in zip(r_hw.rows(), r_emu.rows()):
            print(f"   {name:40s} {v_hw!s:>24s} {'' if v_hw == v_emu else '  emulator: ' + str(v_emu)}")
    (out / "probe_sm90.json").write_text(json.dumps(results, indent=1))
    print(f"wrote {out / 'probe_sm90.json'}")


if __name__ == "__main__":
    main()
