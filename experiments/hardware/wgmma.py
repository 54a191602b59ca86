"""wgmma capture (sm_90a): A from registers, B from shared memory through a matrix descriptor.

    python experiments/hardware/wgmma.py --out OUTDIR [--dry-run]

One 128-thread block (a warpgroup) per tile runs ``wgmma.mma_async.sync.aligned.m64n8kK`` with
D preloaded with C (scale-d = 1). Per warp w, A and D follow the mma.sync m16n8kK fragments on
rows 16w..16w+15 (PTX ISA "Register Fragments and Shared Memory Matrix Layouts" for wgmma).
B (K x N = 8) is K-major in the no-swizzle canonical layout: two 8-row x 16-byte core matrices
along K, ``leading byte offset`` (K direction) = 128, ``stride byte offset`` = 256.
A sanity class of small integers (exact in every format) checks the layout assumptions: the run
reports the mismatches of that class against exact float64 arithmetic.

Writes ``wgmma_sm90.npz``: per spelling ``.a_regs`` (T, 128, 4) u32, ``.b`` (T, K, 8) bit patterns,
``.c_regs`` (T, 128, nd), ``.d_regs`` (T, 128, nd), ``.class``/``.classes``.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import inputs as I  # noqa: E402

FORMS = [  # (dtype, atype, K, element bits, A regs, C/D regs)
    ("f32", "f16", 16, 16, 4, 4), ("f16", "f16", 16, 16, 4, 2), ("f32", "bf16", 16, 16, 4, 4),
    ("f32", "tf32", 8, 32, 4, 4), ("f32", "e4m3", 32, 8, 4, 4), ("f16", "e4m3", 32, 8, 4, 2),
    ("f32", "e5m2", 32, 8, 4, 4), ("f16", "e5m2", 32, 8, 4, 2),
]


def spelling(d, a, K):
    return f"wgmma.mma_async.sync.aligned.m64n8k{K}.{d}.{a}.{a}"


def kname(d, a, K):
    return f"wg_{d}_{a}_k{K}"


def kernel(d, a, K, bits, na, nd):
    acc = "f" if d == "f32" else "r"
    ctype = "float" if d == "f32" else "unsigned"
    tnsp = ", 0" if a in ("f16", "bf16") else ""
    dl = ", ".join(f"%{i}" for i in range(nd))
    al = ", ".join(f"%{nd + i}" for i in range(na))
    outs = ", ".join(f'"+{acc}"(d[{i}])' for i in range(nd))
    ins = ", ".join(f'"r"(a[{i}])' for i in range(na))
    conv_in = "__uint_as_float" if d == "f32" else ""
    conv_out = "__float_as_uint" if d == "f32" else ""
    return f"""
extern "C" __global__ void __launch_bounds__(128) {kname(d, a, K)}(const unsigned* ain, const unsigned* cin,
        const unsigned char* bsmem, unsigned* dout) {{
    __shared__ __align__(128) unsigned char sb[256];
    int t = threadIdx.x;
    const unsigned long long tile = blockIdx.x;
    if (t < 64) ((unsigned*)sb)[t] = ((const unsigned*)(bsmem + tile * 256))[t];
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();
    unsigned a[{na}]; {ctype} d[{nd}];
    for (int i = 0; i < {na}; i++) a[i] = ain[(tile * 128 + t) * {na} + i];
    for (int i = 0; i < {nd}; i++) d[i] = {conv_in}(cin[(tile * 128 + t) * {nd} + i]);
    unsigned long long addr = (unsigned long long)__cvta_generic_to_shared(sb);
    unsigned long long desc = ((addr & 0x3FFFF) >> 4) | ((unsigned long long)(128 >> 4) << 16)
                            | ((unsigned long long)(256 >> 4) << 32);
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
    asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, 1, 0;\\n"
                 "wgmma.mma_async.sync.aligned.m64n8k{K}.{d}.{a}.{a} {{{dl}}}, {{{al}}}, %{nd + na}, p, 1, 1{tnsp};\\n}}\\n"
                 : {outs} : {ins}, "l"(desc) : "memory");
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
    for (int i = 0; i < {nd}; i++) dout[(tile * 128 + t) * {nd} + i] = {conv_out}(d[i]);
}}
"""


def a_coords(K, bits):
    """(128 threads, values) -> (row, k) of A for the register A fragment of m64nNkK."""
    nval = 4 * 32 // bits
    out = np.zeros((128, nval, 2), np.int64)
    for t in range(128):
        w, lane = divmod(t, 32)
        g, q = lane >> 2, lane & 3
        for v in range(nval):
            if bits == 16:  # m16n8k16 A: a0..a7
                row = g + 8 * ((v >> 1) & 1)
                col = 2 * q + (v & 1) + 8 * (v >> 2)
            elif bits == 8:  # m16n8k32 A: a0..a15
                row = g + 8 * ((v >> 2) & 1)
                col = 4 * q + (v & 3) + 16 * (v >> 3)
            else:  # tf32 m16n8k8 A: a0..a3
                row = g + 8 * (v & 1)
                col = q + 4 * (v >> 1)
            out[t, v] = (16 * w + row, col)
    return out


def d_coords(nd):
    out = np.zeros((128, 4, 2), np.int64)
    for t in range(128):
        w, lane = divmod(t, 32)
        g, q = lane >> 2, lane & 3
        for i in range(4):
            out[t, i] = (16 * w + g + 8 * (i >> 1), 2 * q + (i & 1))
    return out


def b_image(B, bits):
    """(K, 8) bit patterns -> 256-byte K-major no-swizzle image (LBO 128 between K blocks)."""
    K = B.shape[0]
    img = np.zeros(256, np.uint8)
    nb = bits // 8
    for k in range(K):
        for n in range(8):
            byte = k * nb
            off = (byte // 16) * 128 + n * 16 + byte % 16
            for j in range(nb):
                img[off + j] = (int(B[k, n]) >> (8 * j)) & 0xFF
    return img


def run(gpu, rng, per_class=16, float_classes=None):
    """Every form of FORMS on the sanity class plus the input classes of ``inputs.py`` (or
    ``float_classes``)."""
    out = {}
    for d, a, K, bits, na, nd in FORMS:
        sp = spelling(d, a, K)
        classes = ("sanity",) + (float_classes or I.FLOAT_CLASSES + (("tf32raw",) if a == "tf32" else ()))
        As, Bs, Cs = [], [], []
        for cl in classes:
            if cl == "sanity":
                A = I.from_float(rng.integers(-3, 4, (per_class, 64, K)).astype(np.float64), a)
                B = I.from_float(rng.integers(-3, 4, (per_class, K, 8)).astype(np.float64), a)
                C = I.from_float(rng.integers(-8, 9, (per_class, 64, 8)).astype(np.float64), d)
            elif cl == "tf32raw":
                A = I.from_float(rng.standard_normal((per_class, 64, K)), "f32")
                B = I.from_float(rng.standard_normal((per_class, K, 8)), "f32")
                C = I.from_float(rng.standard_normal((per_class, 64, 8)), "f32")
            else:
                A, B, C = I.float_operands(cl, rng, a, d, per_class, 64, 8, K)
            As.append(A), Bs.append(B), Cs.append(C)
        A, B, C = np.concatenate(As), np.concatenate(Bs), np.concatenate(Cs)
        T = A.shape[0]
        ac = a_coords(K, bits)
        a_vals = A[:, ac[..., 0], ac[..., 1]]  # (T, 128, nval)
        a_regs = I.pack_slots(a_vals, bits, na)
        dc = d_coords(nd)
        c_vals = C[:, dc[..., 0], dc[..., 1]]
        c_regs = I.pack_slots(c_vals, 32 if d == "f32" else 16, nd)
        bimg = np.stack([b_image(B[t], bits) for t in range(T)])
        d_regs = np.zeros((T, 128, nd), np.uint32)
        (d_regs,) = gpu.run(kname(d, a, K), T, [a_regs.ravel(), c_regs.ravel(), bimg.ravel(), d_regs.ravel()], [3],
                            threads=128)
        d_regs = d_regs.reshape(T, 128, nd)
        # sanity: exact small-integer arithmetic
        s = np.arange(per_class)
        fv = {"f16": np.float16, "f32": np.float32}
        if d == "f32":
            dv = d_regs[s].view(np.float32)
        else:
            dv = d_regs[s].view(np.float16).reshape(per_class, 128, 4)
        av = A[s].astype({8: np.uint8, 16: np.uint16, 32: np.uint32}[bits])
        import ml_dtypes
        vt = {"f16": np.float16, "bf16": ml_dtypes.bfloat16, "tf32": np.float32, "e4m3": ml_dtypes.float8_e4m3fn,
              "e5m2": ml_dtypes.float8_e5m2}[a]
        Af = av.view(vt).astype(np.float64)
        Bf = B[s].astype(av.dtype).view(vt).astype(np.float64)
        Cf = C[s].astype({"f32": np.uint32, "f16": np.uint16}[d]).view(fv[d]).astype(np.float64)
        exact = Af @ Bf + Cf
        want = exact[:, dc[..., 0], dc[..., 1]]
        bad = int(np.sum(dv.astype(np.float64) != want))
        print(f"{sp:48s} tiles {T:4d}  sanity mismatches {bad}", flush=True)
        out[sp + ".a_regs"] = a_regs
        out[sp + ".b"] = B.astype(np.uint32)
        out[sp + ".c_regs"] = c_regs
        out[sp + ".d_regs"] = d_regs
        out[sp + ".class"] = np.repeat(np.arange(len(classes)), per_class).astype(np.int8)
        out[sp + ".classes"] = np.array(classes)
        out[sp + ".sanity_mismatches"] = np.array(bad)
    return out


def source():
    return "\n".join(["#include <cuda_fp16.h>"] + [kernel(*f) for f in FORMS])


class Gpu:
    def __init__(self, build: Path):
        import subprocess

        import cupy as cp

        self.cp = cp
        src = build / "wgmma.cu"
        src.write_text(source())
        cubin = build / "wgmma.cubin"
        subprocess.run(["nvcc", "-cubin", "-gencode", "arch=compute_90a,code=sm_90a", "-o", str(cubin), str(src)],
                       check=True)
        self.mod = cp.RawModule(path=str(cubin))

    def run(self, name, nblocks, args, outs, threads=128):
        cp = self.cp
        dev = [cp.asarray(x) for x in args]
        self.mod.get_function(name)((nblocks,), (threads,), tuple(dev))
        cp.cuda.runtime.deviceSynchronize()
        return [cp.asnumpy(dev[i]) for i in outs]


class DryGpu:
    def run(self, name, nblocks, args, outs, threads=128):
        return [np.zeros_like(args[i]) for i in outs]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    gpu = DryGpu() if args.dry_run else Gpu(Path("/tmp"))
    t = time.time()
    data = run(gpu, np.random.default_rng(20261122))
    np.savez_compressed(out / "wgmma_sm90.npz", **data)
    print(f"done in {time.time() - t:.1f}s; {(out / 'wgmma_sm90.npz').stat().st_size / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
