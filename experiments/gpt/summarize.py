"""Summarise the GPT runs: a markdown table of the result JSONs and a PNG of the loss curves.

    python experiments/gpt/summarize.py [--results experiments/gpt/results] [--png PATH] [--readme PATH]

``--readme`` replaces the text between the ``<!-- results:begin -->`` and ``<!-- results:end -->``
markers of that file with the table.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ORDER = ("exact", "h100-bf16", "h100-fp8", "h100-fp8-promoted", "v100-fp16", "rtx50-mxfp8", "rtx50-nvfp4")
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"


def load(results) -> dict:
    """The result JSONs of a folder by policy name, in the policies' order."""
    found = {p.stem: json.loads(p.read_text()) for p in sorted(Path(results).glob("*.json"))}
    rank = {name: i for i, name in enumerate(ORDER)}
    return dict(sorted(found.items(), key=lambda kv: (rank.get(kv[0], len(ORDER)), kv[0])))


def table(runs: dict) -> str:
    """Markdown: one row per policy, and a line naming the machine, versions and corpus."""
    if not runs:
        return "No results yet: run `python experiments/gpt/train.py --policy all --size small`."
    rows = ["| policy | final train loss | final val loss | ms/step | native ms/step (float32) | ratio | compile s |",
            "|---|---|---|---|---|---|---|"]
    for name, r in runs.items():
        native = r["native"]["highest"]["ms_per_step"]
        rows.append(f"| {name} | {r['final_train_loss']:.4f} | {r['final_val_loss']:.4f} | {r['ms_per_step']:.1f} | "
                    f"{native:.1f} | {r['ms_per_step'] / native:.1f}x | {r['compile_s']:.1f} |")
    r = next(iter(runs.values()))
    env, corpus, st = r["environment"], r["corpus"], r["settings"]
    wall = sum(x["wall_s"] for x in runs.values())
    rows.append("")
    rows.append(f"{env['device']}, jax {env['jax']}, flax {env['flax']}, tcemu {env['tcemu']}; corpus: Python "
                f"{corpus['python']}'s standard library, {corpus['files']['train']} + {corpus['files']['validation']} "
                f"files, {corpus['bytes']['train']:,} + {corpus['bytes']['validation']:,} bytes (train + validation); "
                f"{st['steps']} steps of {st['batch']} x {r['model']['context']} tokens, loss scale "
                f"{st['loss_scale']:g}; {wall:.0f} s of training (policies' wall time, compilation included).")
    return "\n".join(rows)


def smooth(ys, n=10):
    out, acc = [], []
    for y in ys:
        acc = (acc + [y])[-n:]
        out.append(sum(acc) / len(acc))
    return out


def plot(runs: dict, path):
    """Training loss (moving average of 10 steps), its difference to ``exact``, and the float32
    validation loss, against the step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, dx, bx) = plt.subplots(1, 3, figsize=(16, 4.5))
    base = smooth(runs["exact"]["train_loss"]) if "exact" in runs else None
    for name, r in runs.items():
        style = "-" if name in ("exact", "h100-bf16", "v100-fp16") else "--"
        curve = smooth(r["train_loss"])
        ax.plot(range(1, len(curve) + 1), curve, style, label=name, lw=1.2)
        if base is not None and len(base) == len(curve):
            dx.plot(range(1, len(curve) + 1), [c - b for c, b in zip(curve, base)], style, label=name, lw=1.2)
        steps, vals = zip(*r["val_loss"])
        bx.plot(steps, vals, style + "o", label=name, ms=3, lw=1.2)
    ax.set_title("training loss (emulated numerics; mean of 10 steps)")
    dx.set_title("training loss minus exact's (mean of 10 steps)")
    bx.set_title("validation loss (trained weights, float32)")
    for a in (ax, dx, bx):
        a.set_xlabel("step")
        a.grid(alpha=0.3)
    ax.set_ylabel("cross-entropy (nats / byte)")
    low = min(min(smooth(r["train_loss"])) for r in runs.values())
    ax.set_ylim(low - 0.05, low + 1.5)
    tail = [v for r in runs.values() for _, v in r["val_loss"][len(r["val_loss"]) // 2:]]
    if tail:
        bx.set_ylim(min(tail) - 0.05, max(tail) + 0.1)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def fill_readme(path, text: str):
    """Put ``text`` between the result markers of ``path``."""
    doc = Path(path).read_text()
    if BEGIN not in doc or END not in doc:
        raise SystemExit(f"{path}: no {BEGIN} ... {END} markers")
    head, rest = doc.split(BEGIN, 1)
    Path(path).write_text(head + BEGIN + "\n" + text + "\n" + END + rest.split(END, 1)[1])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", default=str(HERE / "results"))
    ap.add_argument("--png", default=None, help="default: RESULTS/loss_curves.png")
    ap.add_argument("--readme", default=None, help="fill this file's results table")
    args = ap.parse_args(argv)
    runs = load(args.results)
    text = table(runs)
    print(text)
    if runs:
        print(f"plot: {plot(runs, args.png or Path(args.results) / 'loss_curves.png')}")
    if args.readme:
        fill_readme(args.readme, text)


if __name__ == "__main__":
    sys.exit(main())
