"""Train a small byte-level GPT on the Python standard library's sources under emulated
tensor-core numerics, one policy after another, and write a JSON file per policy.

    python experiments/gpt/train.py --policy all --size small --out experiments/gpt/results
    python experiments/gpt/train.py --policy h100-fp8 --steps 50 --size tiny --out /tmp/gpt

The model (``model.py``) is ordinary Flax nnx code; a policy wraps the loss function with
``tcemu.emulate(loss_fn, config)``, so every ``dot_general`` of the forward pass runs through
``tcemu.dot_general`` with that config, and the two backward GEMMs of each run with the same config
(``grad_lhs`` / ``grad_rhs``). ``exact`` is native JAX at float32 (``highest``) precision. Every
policy starts from the same initial weights and sees the same batches. Each JSON holds the loss
curves, the time per step (median after the first steps; compile time apart), the native time
per step of the same model measured in the same process, the corpus, the device and versions.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import platform
import sys
import time
from pathlib import Path

import jax
import numpy as np
import optax
from flax import nnx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import data  # noqa: E402
import model as gpt  # noqa: E402

import tcemu  # noqa: E402

H100_FP8 = "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3"
CONFIGS = {
    "exact": None,
    "h100-bf16": tcemu.GemmConfig(arch="H100", instruction="wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16"),
    "h100-fp8": tcemu.GemmConfig(arch="H100", instruction=H100_FP8),
    "h100-fp8-promoted": tcemu.GemmConfig(arch="H100", instruction=H100_FP8, k_order="promotion",
                                          promotion_interval=128),
    "v100-fp16": tcemu.GemmConfig(arch="V100", instruction="m8n8k4.f32.f16.f16.f32"),
    "rtx50-mxfp8": tcemu.GemmConfig(arch="RTX5090", instruction="mma.sync.aligned.m16n8k32.row.col.kind::mxf8f6f4"
                                    ".block_scale.scale_vec::1X.f32.e4m3.e4m3.f32.ue8m0"),
    "rtx50-nvfp4": tcemu.GemmConfig(arch="RTX5090", instruction="mma.sync.aligned.m16n8k64.row.col.kind::mxf4nvf4"
                                    ".block_scale.scale_vec::4X.f32.e2m1.e2m1.f32.ue4m3"),
}
POLICIES = tuple(CONFIGS)
# batch and evaluation per model size; steps is the default of --steps
RUNS = {"tiny": {"batch": 8, "eval_batches": 2, "steps": 20, "lr": 3e-3},
        "small": {"batch": 32, "eval_batches": 8, "steps": 200, "lr": 2e-3}}
SKIP = 5  # steps left out of the median time per step (compilation, warm-up)
NATIVE_STEPS = 25


def policy_config(name: str):
    """The GemmConfig of a policy, its backward GEMMs on the same instruction (None: native)."""
    cfg = CONFIGS[name]
    return None if cfg is None else cfg.replace(grad_lhs=cfg, grad_rhs=cfg)


def loss_fn(model, inputs, targets):
    logits = model(inputs)
    return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()


def train_step(model, optimizer, batch, loss=loss_fn, loss_scale=1.0):
    """One AdamW step. ``loss_scale`` multiplies the loss before differentiation and divides the
    gradients after (static loss scaling, as in fp16 mixed-precision training)."""
    inputs, targets = batch
    scaled = lambda m: loss(m, inputs, targets) * loss_scale  # noqa: E731
    value, grads = nnx.value_and_grad(scaled)(model)
    optimizer.update(model, jax.tree.map(lambda g: g / loss_scale, grads))
    return value / loss_scale


def make_optimizer(model, steps: int, lr: float):
    schedule = optax.warmup_cosine_decay_schedule(0.0, lr, max(1, min(50, steps // 10)), max(steps, 2), lr / 10)
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule, weight_decay=0.1))
    return nnx.Optimizer(model, tx, wrt=nnx.Param)


def loss_for(name: str):
    """The loss function a policy trains: native, or wrapped by tcemu.emulate."""
    cfg = policy_config(name)
    return loss_fn if cfg is None else tcemu.emulate(loss_fn, cfg)


def precision(name: str):
    """``exact`` traces under float32 matmul precision; "default" is JAX's default (TF32 on GPUs)."""
    return contextlib.nullcontext() if name not in ("exact", "highest") else jax.default_matmul_precision("highest")


def batches(corpus, split: str, n: int, batch: int, context: int, seed: int):
    sample = corpus.sampler(split, batch, context, seed)
    xs, ys = zip(*(sample() for _ in range(n)))
    return np.stack(xs), np.stack(ys)


def emulate_summary(loss, model, inputs, targets) -> dict | None:
    """What ``report`` says of the loss function's GEMMs: counts per status, and the table."""
    if not hasattr(loss, "report"):
        return None
    rows = loss.report(model, inputs, targets)
    counts = {}
    for row in rows:
        counts[row.status] = counts.get(row.status, 0) + 1
    return {"forward_gemms": len(rows), "status": counts, "report": str(rows)}


@nnx.jit
def validation_loss(model, inputs, targets):
    """Validation loss of the trained weights in float32 (one compilation for every policy)."""
    return loss_fn(model, inputs, targets)


@dataclasses.dataclass(frozen=True)
class Settings:
    """One run's settings (every policy of a run shares them)."""

    size: str = "tiny"
    steps: int = 5
    seed: int = 0
    batch: int = 8
    eval_every: int = 1
    loss_scale: float = 1.0
    lr: float = 3e-3
    scan_layers: bool = False

    @property
    def model(self) -> gpt.GPTConfig:
        return dataclasses.replace(gpt.SIZES[self.size], scan_layers=self.scan_layers)

    @classmethod
    def make(cls, size="tiny", steps=None, seed=0, batch=None, eval_every=None, loss_scale=None, scan_layers=False):
        """The defaults of ``size`` (RUNS) with the given overrides; the loss scale defaults to the
        tokens per batch (a power of two: the mean loss's gradients as large as a token's)."""
        run = RUNS[size]
        steps = steps or run["steps"]
        batch = batch or run["batch"]
        return cls(size, steps, seed, batch, eval_every or max(1, steps // 10),
                   float(loss_scale or batch * gpt.SIZES[size].context), run["lr"], scan_layers)


def train(name: str, settings: Settings, corpus, log=print) -> dict:
    """Train one policy (or native "highest" / "default") from the seed's initial weights on the
    seed's batches; the loss curves and timings."""
    st, cfg = settings, settings.model
    loss = loss_for(name) if name in CONFIGS else loss_fn
    xs, ys = batches(corpus, "train", st.steps, st.batch, cfg.context, st.seed)
    vx, vy = (v.reshape(-1, cfg.context) for v in
              batches(corpus, "validation", RUNS[st.size]["eval_batches"], st.batch, cfg.context, st.seed + 1))
    model = gpt.GPT(cfg, rngs=nnx.Rngs(st.seed))
    optimizer = make_optimizer(model, st.steps, st.lr)
    step = nnx.jit(lambda m, o, b: train_step(m, o, b, loss, st.loss_scale))

    def evaluate():
        with jax.default_matmul_precision("highest"):
            return float(validation_loss(model, vx, vy))

    train_curve, val_curve, times = [], [], []
    summary = emulate_summary(loss, model, xs[0], ys[0]) if name in CONFIGS else None
    val_curve.append((0, evaluate()))
    for s in range(st.steps):
        with precision(name):
            t0 = time.perf_counter()
            train_curve.append(float(step(model, optimizer, (xs[s], ys[s]))))
            times.append(time.perf_counter() - t0)
        if (s + 1) % st.eval_every == 0 or s + 1 == st.steps:
            val_curve.append((s + 1, evaluate()))
        if (s + 1) % 50 == 0 and log:
            log(f"  {name} step {s + 1}: train {train_curve[-1]:.4f}  val {val_curve[-1][1]:.4f}  "
                f"{1e3 * np.median(times[min(SKIP, len(times) - 1):]):.1f} ms/step")
    ms = 1e3 * float(np.median(times[min(SKIP, len(times) - 1):]))
    return {"policy": name, "train_loss": train_curve, "val_loss": val_curve,
            "final_train_loss": float(np.mean(train_curve[-min(20, st.steps):])), "final_val_loss": val_curve[-1][1],
            "ms_per_step": ms, "compile_s": times[0] - ms / 1e3, "emulate": summary,
            "parameters": gpt.parameter_count(model)}


def native_timing(settings: Settings, corpus) -> dict:
    """Native ms/step of the same model in this process: float32 ("highest") and JAX's default
    matmul precision (TF32 on GPUs)."""
    st = dataclasses.replace(settings, steps=NATIVE_STEPS, eval_every=NATIVE_STEPS)
    out = {}
    for mode in ("highest", "default"):
        r = train(mode, st, corpus, log=None)
        out[mode] = {"ms_per_step": r["ms_per_step"], "compile_s": r["compile_s"], "steps": NATIVE_STEPS}
    return out


def environment() -> dict:
    dev = jax.devices()[0]
    return {"device": getattr(dev, "device_kind", str(dev)), "backend": jax.default_backend(),
            "jax": jax.__version__, "tcemu": tcemu.__version__, "python": platform.python_version(),
            "flax": __import__("flax").__version__, "optax": optax.__version__}


def describe(name: str) -> dict:
    cfg = policy_config(name)
    if cfg is None:
        return {"native": "float32 GEMMs, jax.default_matmul_precision('highest')"}
    return {"arch": cfg.arch, "instruction": cfg.instruction, "k_schedule": cfg.k_schedule.describe(),
            "backward": "grad_lhs and grad_rhs: the same config"}



def run(policies, settings: Settings, out, command: str = "", log=print) -> dict:
    """Train each policy in turn; write ``out/<policy>.json`` and return the results."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    corpus = data.load()
    env = environment()
    log(f"{env['device']} ({env['backend']}), jax {env['jax']}, tcemu {env['tcemu']}; corpus: Python "
        f"{corpus.describe()['python']}, {corpus.describe()['bytes']} bytes")
    native = native_timing(settings, corpus)
    log(f"native: {native['highest']['ms_per_step']:.1f} ms/step (float32), "
        f"{native['default']['ms_per_step']:.1f} ms/step (default precision)")
    results = {}
    for name in policies:
        log(f"compiling {name} ...")
        t = time.perf_counter()
        r = train(name, settings, corpus, log=log)
        r.update(settings=dataclasses.asdict(settings), model=dataclasses.asdict(settings.model),
                 config=describe(name), native=native, corpus=corpus.describe(), environment=env,
                 wall_s=time.perf_counter() - t, command=command)
        (out / f"{name}.json").write_text(json.dumps(r, indent=1))
        log(f"{name}: train {r['final_train_loss']:.4f}  val {r['final_val_loss']:.4f}  {r['ms_per_step']:.1f} ms/step "
            f"({r['ms_per_step'] / native['highest']['ms_per_step']:.1f}x native)  compile {r['compile_s']:.1f} s  "
            f"total {r['wall_s']:.0f} s")
        results[name] = r
    return results


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policy", default="all", choices=POLICIES + ("all",))
    ap.add_argument("--size", default="small", choices=tuple(RUNS))
    ap.add_argument("--steps", type=int, default=None,
                    help=f"default: {RUNS['small']['steps']} (small), {RUNS['tiny']['steps']} (tiny)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch", type=int, default=None,
                    help=f"sequences per step (default {RUNS['small']['batch']} small, {RUNS['tiny']['batch']} tiny)")
    ap.add_argument("--eval-every", type=int, default=None, help="validation every N steps (default steps / 10)")
    ap.add_argument("--loss-scale", type=float, default=None, help="static loss scale (default: tokens per batch)")
    ap.add_argument("--scan-layers", action="store_true", help="run the blocks by nnx.scan (one compiled block)")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    args = ap.parse_args(argv)
    for flag in ("steps", "batch", "eval_every", "loss_scale"):
        v = getattr(args, flag)
        if v is not None and v <= 0:
            ap.error(f"--{flag.replace('_', '-')} must be positive, got {v}")
    settings = Settings.make(args.size, args.steps, args.seed, args.batch, args.eval_every, args.loss_scale,
                             args.scan_layers)
    command = " ".join(["python experiments/gpt/train.py"] + list(sys.argv[1:] if argv is None else argv))
    t = time.perf_counter()
    run(POLICIES if args.policy == "all" else (args.policy,), settings, args.out, command,
        log=lambda s: print(s, flush=True))
    print(f"done in {time.perf_counter() - t:.0f} s; reproduce: {command}", flush=True)


if __name__ == "__main__":
    main()
