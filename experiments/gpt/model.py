"""A small GPT in Flax nnx, written as ordinary model code (it knows nothing of tcemu).

Token and learned position embeddings, ``layers`` pre-LayerNorm blocks (causal multi-head
self-attention with q/k/v/output projections as ``nnx.Linear``; a 4x GELU MLP), a final
LayerNorm and an untied output head. The blocks run in a Python loop; with ``scan_layers`` they are
stacked and run by ``nnx.scan`` instead, as large JAX models do (one compiled block whatever the
depth).

    >>> import jax.numpy as jnp
    >>> from flax import nnx
    >>> m = GPT(SIZES["tiny"], rngs=nnx.Rngs(0))
    >>> m(jnp.zeros((2, 16), jnp.int32)).shape
    (2, 16, 256)
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx


@dataclasses.dataclass(frozen=True)
class GPTConfig:
    vocab: int = 256
    context: int = 128
    d_model: int = 128
    heads: int = 4
    layers: int = 4
    mlp_ratio: int = 4
    scan_layers: bool = False

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads


# Every GEMM dimension a multiple of 32 (K of the block-scaled MXFP8/NVFP4 instructions), forward
# and backward (the weight gradients contract over batch x context tokens).
SIZES = {"tiny": GPTConfig(context=64, d_model=64, heads=2, layers=2),
         "small": GPTConfig(context=128, d_model=128, heads=4, layers=2)}

_embed_init = nnx.initializers.normal(0.02)
F32 = {"param_dtype": jnp.float32}  # a float32 model with jax_enable_x64 on too


class Attention(nnx.Module):
    def __init__(self, cfg: GPTConfig, rngs: nnx.Rngs):
        self.cfg = cfg
        d = cfg.d_model
        self.query = nnx.Linear(d, d, rngs=rngs, **F32)
        self.key = nnx.Linear(d, d, rngs=rngs, **F32)
        self.value = nnx.Linear(d, d, rngs=rngs, **F32)
        self.out = nnx.Linear(d, d, rngs=rngs, **F32)

    def __call__(self, x):
        b, t, _ = x.shape
        split = lambda y: y.reshape(b, t, self.cfg.heads, self.cfg.head_dim)  # noqa: E731
        q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(self.cfg.head_dim).astype(x.dtype)
        causal = jnp.tril(jnp.ones((t, t), bool))
        scores = jnp.where(causal, scores, jnp.finfo(scores.dtype).min)
        probs = jax.nn.softmax(scores, axis=-1)
        y = jnp.einsum("bhqk,bkhd->bqhd", probs, v)
        return self.out(y.reshape(b, t, -1))


class Block(nnx.Module):
    def __init__(self, cfg: GPTConfig, rngs: nnx.Rngs):
        d = cfg.d_model
        self.ln1 = nnx.LayerNorm(d, rngs=rngs, **F32)
        self.attn = Attention(cfg, rngs)
        self.ln2 = nnx.LayerNorm(d, rngs=rngs, **F32)
        self.fc = nnx.Linear(d, cfg.mlp_ratio * d, rngs=rngs, **F32)
        self.proj = nnx.Linear(cfg.mlp_ratio * d, d, rngs=rngs, **F32)

    def __call__(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.proj(jax.nn.gelu(self.fc(self.ln2(x))))


class GPT(nnx.Module):
    def __init__(self, cfg: GPTConfig, rngs: nnx.Rngs):
        self.cfg = cfg
        self.tokens = nnx.Embed(cfg.vocab, cfg.d_model, embedding_init=_embed_init, rngs=rngs, **F32)
        self.positions = nnx.Param(_embed_init(rngs.params(), (cfg.context, cfg.d_model), jnp.float32))

        @nnx.split_rngs(splits=cfg.layers)
        @nnx.vmap(in_axes=(0,), out_axes=0)
        def stack(rngs):
            return Block(cfg, rngs)

        if cfg.scan_layers:
            self.blocks = stack(rngs)  # parameters with a leading layer axis
        else:
            self.blocks = nnx.List([Block(cfg, rngs) for _ in range(cfg.layers)])
        self.ln_f = nnx.LayerNorm(cfg.d_model, rngs=rngs, **F32)
        self.head = nnx.Linear(cfg.d_model, cfg.vocab, rngs=rngs, **F32)

    def __call__(self, tokens):
        x = self.tokens(tokens) + self.positions[: tokens.shape[1]]

        @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
        def layer(x, block):
            return block(x)

        if self.cfg.scan_layers:
            x = layer(x, self.blocks)
        else:
            for block in self.blocks:
                x = block(x)
        return self.head(self.ln_f(x))


def parameter_count(model: nnx.Module) -> int:
    return sum(int(x.size) for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
