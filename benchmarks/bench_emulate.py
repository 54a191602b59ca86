"""The cost of ``tcemu.emulate`` against the same model written by hand with ``tcemu.dot_general``:
one training step of a small Flax nnx MLP (Adam), jitted, on the same data, same run.

    python benchmarks/bench_emulate.py [--batch 64] [--width 256] [--depth 3] [--rounds 3]

Rows: the native step (float32 GEMMs), the hand-written emulated step (``nnx.Linear(...,
dot_general=functools.partial(tcemu.dot_general, config=...))``) and ``tcemu.emulate(train_step,
config)`` on the native model; compile time (first call) and the best / median time of a step.
Both emulated steps compute the same bits (checked); emulate's interpreter runs at trace time
only, so their compiled steps should take the same time, within noise: the script also compares
the two compiled programs (each instruction's opcode and result shape, names and source lines
left out). Rounds are interleaved.
"""
from __future__ import annotations

import argparse
import collections
import functools
import re
import time

import jax
import jax.numpy as jnp
import optax
from flax import nnx

import tcemu
from common import device_name, table, timeit


class Mlp(nnx.Module):
    def __init__(self, width: int, depth: int, rngs, dot=jax.lax.dot_general):
        self.layers = nnx.List([nnx.Linear(width, width, rngs=rngs, dot_general=dot) for _ in range(depth)])

    def __call__(self, x):
        for layer in self.layers:
            x = jax.nn.relu(layer(x))
        return x


def train_step(model, opt, x, y):
    def loss(model):
        return ((model(x) - y) ** 2).mean()

    value, grads = nnx.value_and_grad(loss)(model)
    opt.update(model, grads)
    return value


def compiled_ops(step, model, opt, x, y) -> collections.Counter:
    """(result shape, opcode) of every instruction of ``step``'s compiled program, counted."""
    graph, state = nnx.split((model, opt))

    def pure(state, x, y):
        model, opt = nnx.merge(graph, state)
        return step(model, opt, x, y), nnx.state((model, opt))

    text = jax.jit(pure).lower(state, x, y).compile().as_text()
    return collections.Counter(re.findall(r"= (\S+) ([\w-]+)\(", text))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--depth", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    cfg = tcemu.GemmConfig(arch="H100", instruction="m16n8k16.f32.bf16.bf16.f32")
    x = jax.random.normal(jax.random.key(1), (args.batch, args.width))
    y = jax.random.normal(jax.random.key(2), (args.batch, args.width))
    dots = {"native": jax.lax.dot_general, "tcemu by hand": functools.partial(tcemu.dot_general, config=cfg),
            "tcemu.emulate": jax.lax.dot_general}
    steps, models = {}, {}
    for name, dot in dots.items():
        model = Mlp(args.width, args.depth, nnx.Rngs(0), dot)
        models[name] = (model, nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param))
        steps[name] = nnx.jit(tcemu.emulate(train_step, cfg) if name == "tcemu.emulate" else train_step)
    compile_s, times = {}, {name: [] for name in dots}
    for name, step in steps.items():
        t = time.perf_counter()
        jax.block_until_ready(step(*models[name], x, y))
        compile_s[name] = time.perf_counter() - t
    same = all(bool(jnp.array_equal(a, b)) for a, b in zip(jax.tree.leaves(nnx.state(models["tcemu by hand"][0])),
                                                           jax.tree.leaves(nnx.state(models["tcemu.emulate"][0]))))
    for _ in range(args.rounds):
        for name, step in steps.items():
            times[name].append(timeit(step, *models[name], x, y, repeats=5, warmup=1))
    best = {name: min(t[0] for t in ts) for name, ts in times.items()}
    median = {name: sorted(t[1] for t in ts)[len(ts) // 2] for name, ts in times.items()}
    rows = [[name, f"{compile_s[name]:.2f}", f"{best[name] * 1e3:.2f}", f"{median[name] * 1e3:.2f}",
             f"{median[name] / median['tcemu by hand']:.2f}"] for name in dots]
    print(f"{device_name()}: one Adam step of a {args.depth}-layer MLP, width {args.width}, batch {args.batch}, "
          f"{cfg.arch} {cfg.instruction}")
    print(table(rows, ["step", "first call s", "best ms", "median ms", "/ by hand"]))
    print(f"emulate and by hand give the same parameters after the first step: {same}")
    ops = {name: compiled_ops(fn, *models[name], x, y)
           for name, fn in [("tcemu by hand", train_step), ("tcemu.emulate", tcemu.emulate(train_step, cfg))]}
    print(f"compiled programs: by hand {sum(ops['tcemu by hand'].values())} instructions, emulate "
          f"{sum(ops['tcemu.emulate'].values())}; the same opcodes and shapes: "
          f"{ops['tcemu by hand'] == ops['tcemu.emulate']}")


if __name__ == "__main__":
    main()
