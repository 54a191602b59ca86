"""Train a small MLP under emulated tensor-core GEMMs and compare the loss curves.

    python experiments/train_mlp.py [--steps 300] [--out experiments/results]

Data: a synthetic 10-class problem with 2048 non-negative input features (think pixel or count
data), labelled by a random teacher network; the student is 2048 -> 64 -> 10 with ReLU, trained
with Adam by Optax. Its first layer contracts over K = 2048, long enough for accumulation
numerics to matter. Every forward GEMM runs through ``tcemu.dot_general``; the backward GEMMs are
exact float32. Configurations: exact float32, H100 bf16 (wgmma), H100 fp8 e4m3 (wgmma) without and
with promotion every 128 (DeepSeek-V3), V100 fp16 (wmma), and Blackwell block scaling: MXFP8 (e4m3
with a ue8m0 scale per 32 elements, OCP MX) and NVFP4 (e2m1 with a ue4m3 scale per 16 and a
float32 tensor scale) through sm_120 ``mma.sync`` block-scaled kinds. Writes a PNG of the loss
curves and a CSV of the final numbers, and prints the command that reproduces them.
"""
from __future__ import annotations

import argparse
import csv
import functools
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

import tcemu

CONFIGS = {
    "fp32 (exact)": None,
    "H100 bf16": tcemu.GemmConfig(arch="H100", instruction="wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16"),
    "H100 fp8": tcemu.GemmConfig(arch="H100", instruction="wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3"),
    "H100 fp8 + promotion": tcemu.GemmConfig(arch="H100", instruction="wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3",
                                             k_order="promotion", promotion_interval=128),
    "V100 fp16": tcemu.GemmConfig(arch="V100", instruction="wmma.mma.sync.aligned.row.col.m16n16k16.f32.f32"),
    # Blackwell block scaling (numerics of MMA-Sim's RTX Blackwell model; tcgen05 on a B200 shares them)
    "RTX 50 MXFP8": tcemu.GemmConfig(arch="RTX5090", instruction="mma.sync.aligned.m16n8k32.row.col.kind::mxf8f6f4"
                                     ".block_scale.scale_vec::1X.f32.e4m3.e4m3.f32.ue8m0"),
    "RTX 50 NVFP4": tcemu.GemmConfig(arch="RTX5090", instruction="mma.sync.aligned.m16n8k64.row.col.kind::mxf4nvf4"
                                     ".block_scale.scale_vec::4X.f32.e2m1.e2m1.f32.ue4m3"),
}


def dataset(n=4096, d=2048, classes=10, seed=0):
    rng = np.random.default_rng(seed)
    x = np.abs(rng.standard_normal((n, d))).astype(np.float32) * (rng.random((n, d)) < 0.5)
    w1 = rng.standard_normal((d, 32)) / np.sqrt(d)
    w2 = rng.standard_normal((32, classes))
    y = np.argmax(np.tanh((x - x.mean(0)) @ w1 * 4) @ w2, axis=1)
    return jnp.asarray(x), jnp.asarray(y)


def train(config, steps, x, y, batch=256, seed=0, log_every=10):
    dot = jax.lax.dot_general if config is None else functools.partial(tcemu.dot_general, config=config)
    rngs = nnx.Rngs(seed)
    model = nnx.Sequential(nnx.Linear(x.shape[1], 64, dot_general=dot, rngs=rngs), jax.nn.relu,
                           nnx.Linear(64, 10, dot_general=dot, rngs=rngs))
    opt = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)

    def loss_fn(m, xb, yb):
        return optax.softmax_cross_entropy_with_integer_labels(m(xb), yb).mean()

    @nnx.jit
    def step(m, opt, xb, yb):
        loss, grads = nnx.value_and_grad(loss_fn)(m, xb, yb)
        opt.update(m, grads)
        return loss

    n = x.shape[0]
    curve = []
    for s in range(steps):
        i = (s * batch) % (n - batch)
        loss = step(model, opt, x[i:i + batch], y[i:i + batch])
        if s % log_every == 0 or s == steps - 1:
            curve.append((s, float(loss)))
    acc = float(nnx.jit(lambda m, x, y: jnp.mean(jnp.argmax(m(x), -1) == y))(model, x, y))
    return curve, acc


def run(steps=300, out=None, configs=None, log_every=10):
    x, y = dataset()
    results = {}
    for name in configs or CONFIGS:
        t = time.time()
        curve, acc = train(CONFIGS[name], steps, x, y, log_every=log_every)
        results[name] = {"curve": curve, "accuracy": acc, "seconds": time.time() - t}
        print(f"{name:22s} final loss {curve[-1][1]:.4f}  accuracy {acc:.3f}  ({time.time() - t:.0f} s)", flush=True)
    if out is not None:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        plot(results, out / "train_mlp.png")
        with open(out / "train_mlp.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["config", "final_loss", "accuracy", "seconds"])
            for k, v in results.items():
                w.writerow([k, f"{v['curve'][-1][1]:.6f}", f"{v['accuracy']:.4f}", f"{v['seconds']:.1f}"])
    return results


def plot(results, path=None):
    from tcemu._src.draw import _plt

    plt = _plt()

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [2, 1]})
    for name, r in results.items():
        s, l = zip(*r["curve"])
        ax.plot(s, l, label=name)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.set_yscale("log")
    ax.legend()
    names = list(results)
    accs = [results[n]["accuracy"] for n in names]
    bx.barh(names, accs)
    for i, a in enumerate(accs):
        bx.text(a, i, f" {a:.3f}", va="center")
    bx.set_xlabel("final accuracy (training set)")
    bx.set_xlim(max(0.0, min(accs) - 0.1), 1.0)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=110)
    return fig


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = ap.parse_args(argv)
    run(args.steps, args.out)
    print(f"reproduce: python experiments/train_mlp.py --steps {args.steps} --out {args.out}")


if __name__ == "__main__":
    sys.exit(main())
