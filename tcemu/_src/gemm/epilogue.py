"""The GEMM's epilogue: what a kernel does to the float32 accumulator after the mainloop and the
split-K reduction, before it stores D, in the order and precision :class:`Epilogue` states.

With the accumulator ``acc`` (float32), in this order, each step one IEEE binary32 operation
rounded to nearest even (:mod:`~tcemu._src.numerics.fp32`, in integers: the same bits on every
backend):

1. the input scales (fp8 GEMMs): ``acc * (scale_a * scale_b)`` (``scales="product"``, cuBLASLt's
   per-tensor form), ``(acc * scale_a) * scale_b`` (``"sequential"``) or ``(acc * scale_b) *
   scale_a`` (``"sequential_ba"``, cuBLASLt's row-wise form); a scale is a scalar
   (per tensor) or a vector (row-wise: ``scale_a`` (..., M, 1), ``scale_b`` (1, N)). Block
   scales along K (``scale_block``) are not applied here but in the mainloop, to each block's
   partial sum (:mod:`~tcemu._src.gemm.kscales`);
2. ``alpha``: ``t * alpha``;
3. ``beta * c`` added (``c="accumulator"``);
4. ``bias`` added, broadcast along the rows as ``nn.Linear``'s (``bias="accumulator"``);
5. rounded once to the output type (RNE; fp8 outputs saturate to the largest finite value, as
   PTX's ``cvt.rn.satfinite`` to fp8 does, which is the only rounding to fp8 the ISA has);
6. where ``c="output"`` or ``bias="output"``: the rounded result widened, ``beta * c`` then
   ``bias`` added in float32, and rounded to the output type again (a separate kernel, or an
   epilogue working in the output type).

Serial split-K (``KSchedule(reduction="serial")``, CUTLASS's serial split-K, cuBLASLt's
``INPLACE`` scheme) runs this epilogue once per slice, in order, on the slice's own partial
(:func:`apply_serial`): the first slice adds ``beta * c`` and the bias, every later slice the D
the slice before it stored (its source is D), each storing D in the running total's type.

A step whose operand is absent is skipped (``alpha = 1`` and ``beta = 1`` multiply exactly).

    >>> import jax.numpy as jnp
    >>> from tcemu._src.gemm.epilogue import Epilogue, apply
    >>> from tcemu._src import formats
    >>> acc = jnp.float32([[1.0 + 2.0**-9]])   # rounds to 1 in bf16 (7 fraction bits)...
    >>> bias = jnp.float32([3 * 2.0**-10])     # ...and 1 + 3 * 2**-10 too; their sum does not
    >>> [float(formats.from_bits(apply(acc, "bf16", Epilogue(bias=w), bias=bias), "bf16")[0, 0])
    ...  for w in ("accumulator", "output")]
    [1.0078125, 1.0]
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from tcemu._src import formats as fm
from tcemu._src.numerics import fp32
from tcemu._src.numerics.cvt import convert
from tcemu._src.numerics.model import choice_field, int_field, replace_fields
from tcemu._src.numerics import rounding
from tcemu._src.quant.elements import widen

PLACES = ("accumulator", "output")
SCALE_ORDERS = ("product", "sequential", "sequential_ba")
OUT_TYPES = ("f32", "f16", "bf16", "e4m3", "e5m2")


@jax.tree_util.register_static  # a static argument of jit / vmap, hashed into the cache key
@dataclasses.dataclass(frozen=True)
class Epilogue:
    """Where and in what precision a GEMM kernel applies its epilogue (hashable, validated).

    Attributes:
      c: where ``beta * c`` is added: "accumulator" (to the float32 accumulator, then one rounding
        to the output type) or "output" (to the result already rounded to the output type, then
        rounded again).
      bias: where the bias is added, the same choices.
      scales: "product" (``acc * (scale_a * scale_b)``), "sequential" (``(acc * scale_a) * scale_b``)
        or "sequential_ba" (``(acc * scale_b) * scale_a``).
      saturate: f16/bf16 outputs saturate to the largest finite value instead of overflowing to
        infinity (``cvt...satfinite``); fp8 outputs always saturate.
      scale_block: 0 (``scale_a`` and ``scale_b`` per tensor or row, applied to the accumulator
        as above), or the K elements of one block scale (DeepSeek-V3's and cuBLASLt's 1x128 and
        128x128 fp8 scales: 128): ``scale_a`` (..., M, K / block) and ``scale_b`` (..., K / block,
        N); each promotion group's partial sum enters the float32 accumulator by one FFMA,
        ``fma(p, scale_a * scale_b, acc)`` ("product") or ``fma(p * scale_a, scale_b, acc)``
        ("sequential"; "sequential_ba": ``fma(p * scale_b, scale_a, acc)``). Needs a K schedule
        with promotion groups inside the blocks.

    >>> Epilogue(bias="output").bias
    'output'
    """

    c: str = "accumulator"
    bias: str = "accumulator"
    scales: str = "product"
    saturate: bool = False
    scale_block: int = 0

    def __post_init__(self):
        choice_field(self, "c", PLACES)
        choice_field(self, "bias", PLACES)
        choice_field(self, "scales", SCALE_ORDERS)
        if not isinstance(self.saturate, bool):
            raise TypeError(f"Epilogue.saturate must be True or False, got {self.saturate!r}")
        int_field(self, "scale_block", 0, None, "; 0: scales per tensor or row")

    def replace(self, **changes) -> "Epilogue":
        """A copy with ``changes`` applied (validated)."""
        return replace_fields(self, changes)


def to_float32(d_bits, fmt):
    """D bits of the accumulator format ``fmt`` -> float32 values."""
    return widen(d_bits, fmt)


def tensor_scaled(out, scale_a, scale_b):
    """``out`` times the reciprocals of two per-tensor encode scales (NVFP4), each product rounded
    to nearest even in integers (a reciprocal of a clamped scale is subnormal, which XLA's CPU
    float arithmetic would flush)."""
    inv = fp32.mul(fp32.bits(rounding.divide(1, scale_a)), fp32.bits(rounding.divide(1, scale_b)))
    return fp32.values(fp32.mul(fp32.bits(out), inv))


def _round(t, out: str, saturate: bool):
    """float32 bits -> bits of ``out`` (uint32), RNE; fp8 always saturating."""
    fmt = fm.FORMATS[out]
    if out == "f32":
        return t
    sat = saturate or out in ("e4m3", "e5m2")
    return convert(t, fm.F32, fmt, "rne", overflow="saturate" if sat else "ieee")


def _add_terms(t, beta, c, bias, places, where):
    """``t + beta * c`` then ``+ bias``, each where its place is ``where``."""
    if c is not None and places[0] == where:
        t = fp32.add(t, fp32.mul(fp32.bits(beta), fp32.bits(c)) if beta is not None else fp32.bits(c))
    if bias is not None and places[1] == where:
        t = fp32.add(t, fp32.bits(bias))
    return t


def apply(acc, out: str, epi: Epilogue, *, alpha=None, beta=None, c=None, bias=None, scale_a=None, scale_b=None):
    """The epilogue on float32 accumulator values ``acc`` (..., M, N): bit patterns (uint32) of
    the output type ``out``. Every operand is float32 (or absent: ``None``) and broadcasts
    against ``acc``."""
    t = fp32.bits(acc)
    if scale_a is not None or scale_b is not None:
        sa, sb = (fp32.bits(s) if s is not None else None for s in (scale_a, scale_b))
        if epi.scales == "product" and sa is not None and sb is not None:
            t = fp32.mul(t, fp32.mul(sa, sb))
        else:
            for s in ((sb, sa) if epi.scales == "sequential_ba" else (sa, sb)):
                t = t if s is None else fp32.mul(t, s)
    if alpha is not None:
        t = fp32.mul(t, fp32.bits(alpha))
    places = (epi.c, epi.bias)
    t = _round(_add_terms(t, beta, c, bias, places, "accumulator"), out, epi.saturate)
    late = (c is not None and epi.c == "output") or (bias is not None and epi.bias == "output")
    if late:
        t = _round(_add_terms(fp32.bits(widen(t, fm.FORMATS[out])), beta, c, bias, places, "output"), out, epi.saturate)
    return t


def apply_serial(parts, out: str, partials: str, epi: Epilogue, *, alpha=None, beta=None, c=None, bias=None,
                 scale_a=None, scale_b=None):
    """Serial split-K's epilogue on the slices' float32 partials ``parts`` (S, ..., M, N): slice 0
    runs :func:`apply` with every operand placed at "accumulator" and stores D rounded to
    ``partials``; slice s > 0 runs it on its partial with the stored D as ``c`` (``beta`` 1, no
    bias; ``alpha`` and the scales apply to every slice, as CUTLASS's serial split-K keeps alpha
    and sets beta to 1 after the first slice); then D rounded to ``out``, with the operands placed
    at "output" added as :func:`apply` adds them. Bit patterns (uint32) of ``out``."""
    scales = dict(alpha=alpha, scale_a=scale_a, scale_b=scale_b)
    inner = Epilogue(scales=epi.scales, saturate=epi.saturate)
    first = dict(beta=beta, c=c if epi.c == "accumulator" else None, bias=bias if epi.bias == "accumulator" else None)
    fmt = fm.FORMATS[partials]

    def slice_step(s, t):
        return apply(parts[s], partials, inner, c=widen(t, fmt), **scales)
    t = jax.lax.fori_loop(1, parts.shape[0], slice_step, apply(parts[0], partials, inner, **first, **scales))
    late = dict(beta=beta, c=c if epi.c == "output" else None, bias=bias if epi.bias == "output" else None)
    return apply(widen(t, fmt), out, epi, **late)


@jax.custom_jvp
def ste_out(x, q):
    """``q`` (the exact epilogue, any float dtype) with the gradient of ``x`` (its float32
    expression), cast to ``q``'s dtype."""
    return q


@ste_out.defjvp
def _ste_out_jvp(primals, tangents):
    return primals[1], tangents[0].astype(primals[1].dtype)


def _expression(acc, ops: dict):
    """The epilogue in plain float32 arithmetic: its value is not used, its derivatives are."""
    t = acc
    for name in ("scale_a", "scale_b", "alpha"):
        if ops.get(name) is not None:
            t = t * ops[name]
    if ops.get("c") is not None:
        t = t + (ops["c"] if ops.get("beta") is None else ops["beta"] * ops["c"])
    if ops.get("bias") is not None:
        t = t + ops["bias"]
    return t


@functools.partial(jax.jit, static_argnames=("out", "epi"))
def finish(acc, ops: dict, out: str, epi: Epilogue):
    """The GEMM's result of the output type ``out`` from float32 accumulator values ``acc``
    (..., M, N) and the epilogue operands ``ops`` (``alpha``, ``beta``, ``c``, ``bias``,
    ``scale_a``, ``scale_b``: float32 arrays broadcasting against ``acc``, or absent):
    :func:`apply`'s bits, differentiable as the float32 expression (straight through the
    roundings)."""
    ops = {k: v.astype(jnp.float32) for k, v in ops.items() if v is not None}
    exact = fm.from_bits(apply(acc, out, epi, **ops), out)
    return ste_out(_expression(acc, ops), exact)


@functools.partial(jax.jit, static_argnames=("out", "partials", "epi"))
def finish_serial(parts, ops: dict, out: str, partials: str, epi: Epilogue):
    """:func:`finish` for serial split-K: the slices' float32 partials ``parts`` (S, ..., M, N)
    through :func:`apply_serial`, differentiable as the float32 expression of their sum."""
    ops = {k: v.astype(jnp.float32) for k, v in ops.items() if v is not None}
    exact = fm.from_bits(apply_serial(parts, out, partials, epi, **ops), out)
    return ste_out(_expression(parts.sum(0), ops), exact)
