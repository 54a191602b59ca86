"""Emulated GEMMs of any size from one instruction's numerics, differentiable, with a
``jax.lax.dot_general``-compatible entry point for Flax/Optax models.

    >>> import jax.numpy as jnp, tcemu
    >>> a = jnp.ones((37, 100)); b = jnp.ones((100, 19))
    >>> y = tcemu.matmul(a, b, arch="H100", instruction="m16n8k16.f32.bf16.bf16.f32")
    >>> float(y[0, 0])
    100.0

The GEMM is tiled by the instruction's (m, n, k) (padding with zeros); each output tile runs the
K loop in the order ``GemmConfig.k_order``:

* ``"sequential"``: one instruction per k-tile, D of one step is C of the next (a CUTLASS-style
  mainloop), starting from +0.
* ``"split_k"``: K cut into ``split_k`` contiguous slices, each sequential from +0, then the
  slices' results added in order with float32 RNE additions (the reduction kernel).
* ``"promotion"``: every ``promotion_interval`` elements of K the tensor-core accumulator (started
  at +0) is added into a float32 accumulator with an RNE addition (DeepSeek-V3's FP8 recipe,
  interval 128).
* ``"pairwise"``: every k-tile's instruction starts from +0; the partial results are summed
  pairwise with float32 RNE additions (adjacent pairs, then pairs of pairs; a non-power-of-two
  count leaves the odd subtrees to be added from the largest down).

Memory stays bounded: the products of one step exist only inside fused loops, and the output is
processed in row blocks, so a 4096^3 GEMM needs O(M N) memory, never O(M N K).
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from tcemu._src import formats as fm
from tcemu._src import native, sharding
from tcemu._src.arch import resolve
from tcemu._src.isa.parse import Mma, Unsupported, parse
from tcemu._src.numerics import engine
from tcemu._src.numerics import mma as mma_numerics
from tcemu._src.numerics import rounding
from tcemu._src.numerics.model import BlockFMA, choice_field, int_field, replace_fields
from tcemu._src.numerics.presets import check_model
from tcemu._src.schedule import SHUFFLE_LANES, KSchedule

K_ORDERS = ("sequential", "split_k", "promotion", "pairwise")
QUANTIZE_FORMATS = ("f16", "bf16", "tf32", "e4m3", "e5m2", "e3m2", "e2m3", "e2m1")
_MX = ("e3m2", "e2m3", "e2m1")  # OCP MX fp6/fp4: no NaN, no infinity
QUANTIZE_MODES = ("rne", "stochastic")


@dataclasses.dataclass(frozen=True)
class GemmConfig:
    """How an emulated GEMM computes (hashable; pass as ``config=``).

    Attributes:
      arch: architecture whose numerics preset is used ("H100", "sm_80", ...).
      instruction: the MMA instruction: a full PTX spelling (wmma/mma.sync/wgmma) or the mma.sync
        short form "m16n8k16.f32.bf16.bf16.f32" (shape.dtype.atype.btype.ctype).
      k_order: "sequential", "split_k", "promotion" or "pairwise" (see the module docstring).
      split_k: number of K slices for "split_k".
      promotion_interval: K elements accumulated in the tensor core between promotions.
      schedule: a :class:`tcemu.KSchedule` describing the kernel's K schedule completely (k-tile,
        residue, slices, promotion, reduction); when given it replaces ``k_order``,
        ``split_k`` and ``promotion_interval``.
      model: a :class:`tcemu.BlockFMA` or :class:`tcemu.ArchNumerics` replacing the preset's numerics.
      quantize: how inputs are rounded to the instruction's format: "rne" or "stochastic"
        (needs ``key=``).
      grad_lhs, grad_rhs: configs of the backward GEMMs dA = dY B^T and dB = A^T dY; ``None``
        computes them exactly in float32.
    """

    arch: str = "H100"
    instruction: str = "m16n8k16.f32.bf16.bf16.f32"
    k_order: str = "sequential"
    split_k: int = 4
    promotion_interval: int = 128
    schedule: KSchedule | None = None
    model: BlockFMA | None = None
    quantize: str = "rne"
    grad_lhs: "GemmConfig | None" = None
    grad_rhs: "GemmConfig | None" = None

    def __post_init__(self):
        arch = resolve(self.arch)
        if not isinstance(self.instruction, str):
            raise TypeError(f"GemmConfig.instruction must be a PTX spelling or a short form such as "
                            f"'m16n8k16.f32.bf16.bf16.f32' (str), got {self.instruction!r}")
        choice_field(self, "k_order", K_ORDERS)
        choice_field(self, "quantize", QUANTIZE_MODES)
        int_field(self, "split_k", 1, None)
        int_field(self, "promotion_interval", 1, None)
        check_model(self.model, "GemmConfig")
        if self.schedule is not None and not isinstance(self.schedule, KSchedule):
            raise TypeError(f"GemmConfig.schedule must be a tcemu.KSchedule or None, got {self.schedule!r}")
        for name in ("grad_lhs", "grad_rhs"):
            v = getattr(self, name)
            if v is not None and not isinstance(v, GemmConfig):
                raise TypeError(f"GemmConfig.{name} must be a tcemu.GemmConfig or None (exact float32), got {v!r}")
        ins = self.ins
        if ins.family in ("int", "b1", "f64"):
            raise ValueError(f"{ins.spelling!r}: GEMM emulation takes floating-point instructions "
                             "(f16, bf16, tf32, e4m3/e5m2, kind::f8f6f4)")
        if ins.scale_vec is not None and self.quantize != "rne":
            raise ValueError(f"{ins.spelling!r}: block-scaled GEMMs quantise with the MX/NVFP4 recipes "
                             "(round to nearest even); quantize='stochastic' is not available for them")
        if ins.ctype != ins.dtype:
            raise ValueError(f"{ins.spelling!r}: chaining needs C and D of the same type")
        if self.schedule is None and self.promotion_interval % ins.k:
            raise ValueError(f"promotion_interval={self.promotion_interval} must be a multiple of the "
                             f"instruction's k={ins.k}")
        if self.schedule is not None:
            self.schedule.check(ins.k, f"GemmConfig.schedule with {ins.spelling!r}")
        mma_numerics.check_arch(ins, arch)
        mma_numerics.resolve_model(ins, self.model, arch)  # the preset or model= has numerics for it

    @property
    def ins(self) -> Mma:
        return _instruction(self.instruction)

    @property
    def k_schedule(self) -> KSchedule:
        """The K schedule this config runs: ``schedule``, or the one ``k_order`` names."""
        if self.schedule is not None:
            return self.schedule
        return {"sequential": KSchedule(), "split_k": KSchedule(slices=self.split_k),
                "promotion": KSchedule(promotion=self.promotion_interval),
                "pairwise": KSchedule(slices=0, reduction="pairwise")}[self.k_order]

    def replace(self, **changes) -> "GemmConfig":
        return replace_fields(self, changes)


@functools.lru_cache(maxsize=None)
def _instruction(spelling: str) -> Mma:
    s = spelling.strip()
    if not s.startswith(("wmma.", "mma.", "wgmma.")):
        parts = s.split(".")
        if len(parts) != 5:
            raise ValueError(f"instruction {spelling!r}: give a PTX spelling or shape.dtype.atype.btype.ctype, "
                             "e.g. 'm16n8k16.f32.bf16.bf16.f32'")
        s = f"mma.sync.aligned.{parts[0]}.row.col.{'.'.join(parts[1:])}"
    try:
        ins = parse(s)
    except ValueError as e:
        raise ValueError(f"instruction {spelling!r}: {e}") from None
    if not isinstance(ins, Mma):
        raise ValueError(f"instruction {spelling!r} is not an MMA")
    return ins


# ---------------------------------------------------------------------------------------------
# quantisation


def quantize(x, etype: str, mode: str = "rne", key=None):
    """Round values to the element format ``etype`` ("f16", "bf16", "tf32", "e4m3", "e5m2", and
    the OCP MX fp6/fp4 "e3m2", "e2m3", "e2m1"); the result holds the quantised values in float32
    (exact; NaN as 0x7FFFFFFF, or the canonical tf32 NaN 0x7FFFE000). Inputs are converted to
    float32 first, so the bits do not depend on ``jax_enable_x64``.

    ``mode="rne"``: JAX's own round-to-nearest-even conversion (``astype``; tf32:
    ``jax.lax.reduce_precision`` to 10 fraction bits); e4m3 has no infinity, so its overflows
    (above 464) and infinities become NaN. fp6/fp4 have neither: overflows and infinities
    saturate to the largest finite value and NaN becomes -0, as ml_dtypes converts them (JAX
    cannot hold fp6 arrays, so those are rounded in integers). ``mode="stochastic"`` (needs
    ``key``): rounds up with probability equal to the discarded fraction.

    >>> import tcemu
    >>> tcemu.quantize([0.2, 2.5, 3.5, 100.0], "e2m1").tolist()
    [0.0, 2.0, 4.0, 6.0]
    """
    if not isinstance(etype, str) or etype not in QUANTIZE_FORMATS:
        raise ValueError(f"quantize: unknown format {etype!r}; valid: {', '.join(QUANTIZE_FORMATS)}")
    if not isinstance(mode, str) or mode not in QUANTIZE_MODES:
        raise ValueError(f"quantize: mode must be one of {', '.join(QUANTIZE_MODES)}, got {mode!r}")
    return _code_values(_quantize_codes(_real(x, "quantize", "x"), etype, mode, key), etype)


def _quantize_codes(x, etype: str, mode: str = "rne", key=None):
    """:func:`quantize`'s result as the element format's bit patterns (uint32; tf32 as float32
    patterns), from one conversion (arguments already checked)."""
    x = jnp.asarray(x).astype(jnp.float32)
    fmt = fm.FORMATS[etype]
    if etype in _MX:
        return _quantize_mx_element(x, fmt, mode, key)
    if mode == "rne":
        if etype == "tf32":
            # float32 NaNs whose payload lies below the tf32 fraction would read as inf: canonical NaN
            q = jax.lax.reduce_precision(x, exponent_bits=8, mantissa_bits=10)
            return jax.lax.bitcast_convert_type(jnp.where(jnp.isnan(x), _f32(fm.TF32.canonical_nan), q), jnp.uint32)
        return fm.to_bits(x.astype(fm.VALUE_DTYPES[etype]), etype)
    if mma_numerics.check_key(key, "quantize") is None:
        raise ValueError("quantize: mode='stochastic' needs key=jax.random.key(...)")
    bits = jax.lax.bitcast_convert_type(x, jnp.uint32)
    q = engine.convert(bits, fm.F32, fmt, "stochastic", overflow="inf", rand=jax.random.bits(key, x.shape, jnp.uint32))
    if not fmt.has_inf:  # engine.convert maps infinities to S.1111.000 (256), e4m3's NaN is S.1111.111
        q = jnp.where(jnp.isinf(x), jnp.uint32(fmt.canonical_nan), q)
    return q


def _code_values(codes, etype: str):
    """Element bit patterns -> their exact values in float32 (widened in integers: under jit, XLA
    on GPUs drops a float convert pair such as f32 -> bf16 -> f32)."""
    if etype == "tf32":
        return jax.lax.bitcast_convert_type(codes, jnp.float32)
    return _widen(codes, fm.FORMATS[etype])


def _quantize_mx_element(x, fmt, mode, key):
    """fp6/fp4 rounding in integers (bit patterns): saturating, infinities to the largest finite
    value, NaN to -0."""
    rand = None
    if mode == "stochastic":
        if mma_numerics.check_key(key, "quantize") is None:
            raise ValueError("quantize: mode='stochastic' needs key=jax.random.key(...)")
        rand = jax.random.bits(key, x.shape, jnp.uint32)
    bits = jax.lax.bitcast_convert_type(x, jnp.uint32)
    d = fm.decode(bits, fm.F32)
    q = engine.convert(bits, fm.F32, fmt, mode, overflow="saturate", rand=rand)
    top = jnp.uint32(((fmt.emax + fmt.bias) << fmt.fraction_bits) | fmt.max_fraction)
    q = jnp.where(d.is_inf, jnp.where(d.sign != 0, jnp.uint32(fmt.sign_bit), 0) | top, q)
    return jnp.where(d.is_nan, jnp.uint32(fmt.sign_bit), q)


def _f32(bits: int):
    return jax.lax.bitcast_convert_type(jnp.uint32(bits), jnp.float32)


def _real(x, where: str, name: str):
    """``x`` as a JAX array of a real (bool, integer or floating-point) dtype."""
    try:
        x = jnp.asarray(x)
    except (TypeError, ValueError) as e:
        raise TypeError(f"{where}: {name} must be a real numeric array, got {type(x).__name__}") from e
    if not (jnp.issubdtype(x.dtype, jnp.floating) or jnp.issubdtype(x.dtype, jnp.integer) or x.dtype == jnp.bool_):
        raise TypeError(f"{where}: {name} must be a real numeric array, got dtype {x.dtype}")
    return x


@jax.custom_jvp
def _ste(x, q):
    """Straight-through estimator: the value of ``q`` exactly (also inf, NaN and -0, which
    ``x - stop_gradient(x) + stop_gradient(q)`` turns into NaN or +0), the gradient of ``x``."""
    return q


@_ste.defjvp
def _ste_jvp(primals, tangents):
    return primals[1], tangents[0]


def _bits(x, etype):
    """float32 container of exactly representable values -> element bit patterns (uint32)."""
    if etype in _MX:  # exact: the values are representable
        return engine.encode(x, fm.FORMATS[etype])
    if etype == "tf32":
        return jax.lax.bitcast_convert_type(jnp.asarray(x, jnp.float32), jnp.uint32)
    return fm.to_bits(jnp.asarray(x).astype(fm.VALUE_DTYPES[etype]), etype)


# ---------------------------------------------------------------------------------------------
# the emulated GEMM on bit patterns


def _tiles(x, r, c):
    """(R, C) -> (R/r, C/c, r, c)."""
    R, C = x.shape
    return x.reshape(R // r, r, C // c, c).transpose(0, 2, 1, 3)


_DEFER_MAX_BLOCKS = 4


def _lay_k(x, plan, axis, unit: int = 1):
    """``x`` with its K axis laid out as the plan's instructions read it (zeros where they pad);
    ``unit``: elements of K per entry of ``x`` (scale blocks), which every run must keep whole."""
    pieces = []
    for a, b in plan.runs():
        if a < 0:
            shape = list(x.shape)
            shape[axis] = b // unit
            pieces.append(jnp.zeros(shape, x.dtype))
        else:
            pieces.append(jax.lax.slice_in_dim(x, a // unit, b // unit, axis=axis))
    return pieces[0] if len(pieces) == 1 else jnp.concatenate(pieces, axis=axis)


def _step_table(plan):
    """(S, G, g) flat instruction indices per slice and promotion group (-1: padding) and whether
    each runs; G = 1 without promotion."""
    S, T, g = plan.slices, plan.steps, plan.group or plan.steps
    G = -(-T // g)
    flat = np.arange(S * T, dtype=np.int32).reshape(S, T)
    tbl = np.full((S, G * g), -1, np.int32)
    tbl[:, :T] = flat
    ok = (tbl >= 0) & np.concatenate([plan.valid, np.zeros((S, G * g - T), bool)], axis=1)
    return tbl.reshape(S, G, g), ok.reshape(S, G, g)


def _check_block_aligned(plan, blk: int, where: str):
    """Block-scaled GEMMs: every run of the K layout starts a scale block in the source and in
    the laid-out K (so each instruction reads whole blocks)."""
    pos = 0
    for a, b in plan.runs():
        length = b if a < 0 else b - a
        if pos % blk or (a >= 0 and a % blk):
            raise Unsupported(f"{where}: this K schedule cuts K across scale blocks of {blk}; block-scaled "
                              "GEMMs take schedules whose k-tiles and slices start at multiples of the block")
        pos += length


def gemm_bits(a_bits, b_bits, cfg: GemmConfig, key=None, scales=None):
    """Emulated (M, K) @ (K, N) on bit patterns of the instruction's input types, following
    ``cfg.k_schedule``; block-scaled instructions take ``scales`` = (A's (M, K / block), B's
    (K / block, N)) scale codes.

    Returns (D bits (M, N), format of D): the accumulator format when one chain of instructions
    makes D, float32 when partial results are added (slices, promotion).
    """
    ins = cfg.ins
    model = mma_numerics.resolve_model(ins, cfg.model, resolve(cfg.arch))
    plan = cfg.k_schedule.plan(a_bits.shape[1], ins.k)
    if scales is not None:
        _check_block_aligned(plan, ins.scale_block, repr(ins.spelling))
    if _native_ok(ins, model):
        try:
            return _native_gemm(a_bits, b_bits, ins, model, plan, scales)
        except _TooLarge:
            pass
    return _xla_gemm(a_bits, b_bits, cfg, ins, model, plan, key, scales)


def _native_ok(ins: Mma, model) -> bool:
    """Whether a compiled kernel (tcemu/_src/native: blockfma.cc on the CPU, blockfma_gpu.cu on
    CUDA GPUs) runs this GEMM: f32 accumulation and a model it covers."""
    if ins.dtype != "f32" or model.stochastic:
        return False
    return native.use(model, fm.FORMATS[ins.atype], fm.FORMATS[ins.btype], ins.k, "f32", gemm=True)


def _partials(x, sched: KSchedule):
    """Float32 partial sums as the schedule stores them between slices (f16/bf16: RNE and back)."""
    if sched.partials == "f32":
        return x
    low = fm.FORMATS[sched.partials]
    return engine.convert(engine.convert(x, fm.F32, low, "rne"), low, fm.F32)


def _combine(chain, plan, acc, G: int, shape):
    """D from the accumulator bits of the plan's chains (``chain(c)``: (M, N) bits of chain
    c = slice * G + group): promotion groups added into float32 in order, then the slices'
    partials reduced as the schedule says. Sequential reductions hold O(M N) at a time."""
    sched = plan.schedule

    def f32_add(x, y):
        return engine.add(x, y, fm.F32, "rne")

    def one_slice(s):
        if not plan.group:
            return chain(s * G)
        first = f32_add(jnp.zeros(shape, jnp.uint32), _f32_bits(chain(s * G), acc))
        return jax.lax.fori_loop(1, G, lambda j, t: f32_add(t, _f32_bits(chain(s * G + j), acc)), first)

    if plan.slices == 1:
        return one_slice(0)

    def partial(s):
        x = one_slice(s)
        return _partials(x if plan.group else _f32_bits(x, acc), sched)

    if sched.reduction == "sequential":
        return jax.lax.fori_loop(1, plan.slices, lambda s, t: f32_add(t, partial(s)), partial(0))
    return _reduce(jax.lax.map(partial, jnp.arange(plan.slices)), sched, f32_add)


def _scale_unit(plan, k: int, block: int, group: int | None) -> int:
    """Elements of the laid-out K per scale entry the kernels read: ``block`` where the
    instructions (``k``), the plan's runs and zero fills and the grouped model's groups
    (``group``) keep scale blocks whole, else 1."""
    group = group or block
    runs = plan.runs()
    whole = (k % block == 0 and (block % group == 0 or group % block == 0)
             and all(b % block == 0 and (a < 0 or a % block == 0) for a, b in runs))
    return block if whole else 1


def _native_gemm(a_bits, b_bits, ins: Mma, model, plan, scales):
    """The GEMM on the compiled kernel: every chain of the plan (slices, promotion groups) at
    once, or, when their results would take more than ``_NATIVE_CHAIN_BYTES``, one chain at a
    time; then :func:`_combine`."""
    afmt, bfmt = fm.FORMATS[ins.atype], fm.FORMATS[ins.btype]
    A, B = _lay_k(jnp.asarray(a_bits), plan, 1), _lay_k(jnp.asarray(b_bits), plan, 0)
    a_exp = b_exp = nan = None
    S, T, k = plan.slices, plan.steps, ins.k
    unit = 1  # elements of the laid-out K per scale entry
    if scales is not None:  # per element of the laid-out K (zeros where the plan pads), or per block
        blk = ins.scale_block
        if native._cpu():  # the GPU kernel's exponents per block have not run on a GPU
            unit = _scale_unit(plan, k, blk, model.scale_group)
        sa = fm.decode_scale(_lay_k(jnp.repeat(scales[0], blk // unit, axis=1), plan, 1, unit), ins.stype)
        sb = fm.decode_scale(_lay_k(jnp.repeat(scales[1], blk // unit, axis=0), plan, 0, unit), ins.stype)
        a_exp, b_exp = sa.exp, sb.exp  # ue8m0 exponents added to the elements' (kind::mxf8f6f4)
        nan = jnp.any(sa.is_nan, axis=1)[:, None] | jnp.any(sb.is_nan, axis=0)[None, :]
    # chains: every slice's promotion groups of g instructions (the last one padded), each running
    # its valid instructions
    g = plan.group or T
    G = -(-T // g)

    def groups(x, axis, unit=1):  # (.., S*T*k / unit, ..) -> (.., S*G*g*k / unit, ..)
        shape = x.shape[:axis] + (S, T * k // unit) + x.shape[axis + 1:]
        pad = [(0, 0)] * (x.ndim + 1)
        pad[axis + 1] = (0, (G * g - T) * k // unit)
        return jnp.pad(x.reshape(shape), pad).reshape(x.shape[:axis] + (S * G * g * k // unit,) + x.shape[axis + 1:])

    A, B = groups(A, 1), groups(B, 0)
    a_exp = None if a_exp is None else groups(a_exp, 1, unit)
    b_exp = None if b_exp is None else groups(b_exp, 0, unit)
    runs = plan.valid.sum(axis=1)[:, None] - g * np.arange(G)[None, :]
    lens = (np.clip(runs, 0, g) * k).reshape(-1)
    if model.scale_group is not None:  # grouped fp4: one scale per group of sg elements
        sg = model.scale_group
        per = lambda x, ax: (jnp.repeat(x, unit // sg, axis=ax) if unit >= sg  # noqa: E731
                             else jax.lax.slice_in_dim(x, 0, None, sg // unit, axis=ax))
        sa = fm.Scale(*(per(groups(x, 1, unit), 1) for x in sa))
        sb = fm.Scale(*(per(groups(x, 0, unit), 0) for x in sb))

    def run(c0, n, lens):  # chains c0 .. c0 + n - 1
        ck = g * k
        cut = lambda x, ax, w=1: jax.lax.dynamic_slice_in_dim(x, c0 * ck // w, n * ck // w, axis=ax)  # noqa: E731
        if model.scale_group is not None:
            return native.grouped_chains(cut(A, 1), cut(B, 0), fm.Scale(*(cut(x, 1, sg) for x in sa)),
                                         fm.Scale(*(cut(x, 0, sg) for x in sb)), model, k=k, chain_k=ck, lens=lens)
        return native.chains(cut(A, 1), cut(B, 0), afmt, bfmt, model, k=k, chain_k=ck, lens=lens,
                             a_exp=None if a_exp is None else cut(a_exp, 1, unit),
                             b_exp=None if b_exp is None else cut(b_exp, 0, unit), scale_block=unit if unit > 1 else 0)

    acc = fm.FORMATS[ins.dtype]
    M, N = a_bits.shape[0], b_bits.shape[1]
    if native._gpu() and not native.gpu_fits(A.shape[1], M, N):
        raise _TooLarge
    if S * G * M * N * 4 > _NATIVE_CHAIN_BYTES and plan.reduces:  # one chain at a time, memory O(M N)
        if plan.slices > 1 and plan.schedule.reduction != "sequential":
            raise _TooLarge
        lens_j = jnp.asarray(lens)
        out = _combine(lambda c: run(c, 1, lens_j[c][None])[0], plan, acc, G, (M, N))
    else:
        ch = run(0, S * G, lens)
        out = _combine(lambda c: ch[c], plan, acc, G, (M, N))
    if nan is not None:
        out = jnp.where(nan, jnp.uint32(fm.F32.canonical_nan), out)
    return out, fm.F32 if plan.reduces else acc


# all chains of a GEMM at once up to this many bytes of chain results; beyond, one at a time
_NATIVE_CHAIN_BYTES = 1 << 28


class _TooLarge(Exception):
    """Many pairwise-reduced slices of a large GEMM (the kernel path would hold them all), or K * M
    or K * N beyond the GPU kernel's 32-bit offsets."""


def _xla_gemm(a_bits, b_bits, cfg: GemmConfig, ins: Mma, model, plan, key, scales):
    """:func:`gemm_bits` in pure JAX (any backend, every model): tiles of the instruction's
    (m, n), the K loop a scan over instructions, row blocks by ``lax.map``."""
    m, n, k = ins.m, ins.n, ins.k
    M, N = a_bits.shape[0], b_bits.shape[1]
    sched = plan.schedule
    Mp, Np = -(-M // m) * m, -(-N // n) * n
    A = _tiles(_lay_k(jnp.pad(a_bits, ((0, Mp - M), (0, 0))), plan, 1), m, k)  # (Mt, S*T, m, k)
    B = _tiles(_lay_k(jnp.pad(b_bits, ((0, 0), (0, Np - N))), plan, 0), k, n)  # (S*T, Nt, k, n)
    Mt, Kt, Nt = Mp // m, A.shape[1], Np // n
    SA = SB = None
    if scales is not None:  # laid out like the elements, one code per block of each instruction
        blk = ins.scale_block
        sa = jnp.repeat(scales[0], blk, axis=1)
        sb = jnp.repeat(scales[1], blk, axis=0)
        SA = _tiles(_lay_k(jnp.pad(sa, ((0, Mp - M), (0, 0))), plan, 1), m, k)[..., ::blk]  # (Mt, Kt, m, S)
        SB = _tiles(_lay_k(jnp.pad(sb, ((0, 0), (0, Np - N))), plan, 0), k, n)[:, :, ::blk, :]  # (Kt, Nt, S, n)
    tbl, ok = _step_table(plan)
    masked = not ok.all()
    acc = fm.FORMATS[ins.dtype]
    # rows of tiles per block: about chunk_terms() products per step; with many slices, their
    # partials are alive at once
    mc = max(1, mma_numerics.chunk_terms() // max(1, Nt * m * n * k))
    if plan.slices > 4:
        mc = max(1, mc // plan.slices)
    mc = min(mc, Mt)
    nblocks = -(-Mt // mc)
    A = jnp.pad(A, ((0, nblocks * mc - Mt), (0, 0), (0, 0), (0, 0))).reshape(nblocks, mc, Kt, m, k)
    if SA is not None:
        SA = jnp.pad(SA, ((0, nblocks * mc - Mt), (0, 0), (0, 0), (0, 0))).reshape(nblocks, mc, Kt, m, -1)
    zero = jnp.zeros((mc, Nt, m, n), jnp.uint32)
    if model.stochastic and key is None:
        raise ValueError("this model rounds stochastically: pass key=jax.random.key(...)")

    def to_f32(bits):
        return _f32_bits(bits, acc)

    def f32_add(x, y):
        return engine.add(x, y, fm.F32, "rne")

    def block(blk, Ar, SAr, unroll=1):
        def step(d, x):
            kt, run = x
            kt = jnp.maximum(kt, 0)
            a = jax.lax.dynamic_index_in_dim(Ar, kt, axis=1, keepdims=False)[:, None]  # (mc, 1, m, k)
            b = jax.lax.dynamic_index_in_dim(B, kt, axis=0, keepdims=False)[None]  # (1, Nt, k, n)
            kk = None if key is None else jax.random.fold_in(jax.random.fold_in(key, blk), kt)
            sc = {}
            if SAr is not None:
                sc = dict(scale_a=jax.lax.dynamic_index_in_dim(SAr, kt, axis=1, keepdims=False)[:, None],
                          scale_b=jax.lax.dynamic_index_in_dim(SB, kt, axis=0, keepdims=False)[None])
            out = mma_numerics.mma_bits(ins, a, b, d, model, arch=cfg.arch, key=kk, **sc)
            return (jnp.where(run, out, d) if masked else out), None

        def chain(kts, runs):  # instructions kts from +0
            return jax.lax.scan(step, zero, (kts, runs), unroll=unroll)[0]

        def one_slice(kts, runs):  # (G, g): chains, promoted into float32 from +0 when G groups
            if not plan.group:
                return chain(kts[0], runs[0])
            return jax.lax.scan(lambda t, x: (f32_add(t, to_f32(chain(*x))), None), zero, (kts, runs))[0]

        tj, oj = jnp.asarray(tbl), jnp.asarray(ok)
        if plan.slices == 1:
            return one_slice(tj[0], oj[0])
        parts = jax.vmap(one_slice)(tj, oj)
        parts = _partials(parts if plan.group else to_f32(parts), sched)
        return _reduce(parts, sched, f32_add)

    out_fmt = fm.F32 if plan.reduces else acc

    # Without the branches XLA fuses all blocks of an instruction into one loop; beyond a few
    # blocks per instruction (models with tiny blocks) that fusion takes minutes to compile.
    defer = -(-k // model.block_size) <= _DEFER_MAX_BLOCKS

    def exact_or_fast(blk, Ar, SAr=None):
        """The block without per-instruction special-value branches (engine.deferred_specials);
        computed again exactly only if that gives a NaN (a NaN/inf operand, an overflow, or an
        exact zero after a -0 accumulator): same bits, a third less time on GPUs."""
        if not defer:
            return block(blk, Ar, SAr)
        with engine.deferred_specials():
            fast = block(blk, Ar, SAr, unroll=4 if engine.unroll_terms() else 1)
        return jax.lax.cond(jnp.any(fm.decode(fast, out_fmt).is_nan), lambda: block(blk, Ar, SAr), lambda: fast)

    xs = (jnp.arange(nblocks), A) + (() if SA is None else (SA,))
    out = jax.lax.map(lambda x: exact_or_fast(*x), xs)  # (nblocks, mc, Nt, m, n)
    out = out.reshape(nblocks * mc, Nt, m, n)[:Mt].transpose(0, 2, 1, 3).reshape(Mp, Np)[:M, :N]
    return out, out_fmt


def _reduce(parts, sched: KSchedule, add):
    """The slices' partials (S, ...) combined as ``sched.reduction`` says."""
    if sched.reduction == "sequential":
        return _fold(parts, add)
    if sched.reduction == "shuffle":
        return _shuffle(parts, add)
    T = sched.reduce_threads
    if T == 1:
        return _pairwise(parts, add)
    S, L = parts.shape[0], sched.reduce_lanes or T
    P = max(T, 1 << (S - 1).bit_length())  # Triton's power-of-two block, padded with +0
    x = jnp.concatenate([parts, jnp.zeros((P - S,) + parts.shape[1:], parts.dtype)])
    x = jax.vmap(lambda y: _pairwise(y, add), in_axes=1)(x.reshape((P // T, T) + parts.shape[1:]))  # (T, ...)
    x = _butterfly(x.reshape((T // L, L) + parts.shape[1:]), 1, add)  # the lanes of each warp
    return _butterfly(x, 0, add)  # then the warps


def _butterfly(x, axis: int, add):
    """``x`` summed over a power-of-two ``axis``: element i adds element i + h, h = n/2, ..., 1."""
    while x.shape[axis] > 1:
        h = x.shape[axis] // 2
        x = add(jax.lax.slice_in_dim(x, 0, h, axis=axis), jax.lax.slice_in_dim(x, h, 2 * h, axis=axis))
    return jnp.squeeze(x, axis)


def _shuffle(parts, add):
    """XLA's reduction emitter: lane j of 32 adds partials j, j + 32, ... in order onto +0, then
    lane j adds lane j + h for h = 16, 8, 4, 2, 1."""
    S, W = parts.shape[0], SHUFFLE_LANES
    rounds = -(-S // W)
    padded = jnp.concatenate([parts, jnp.zeros((rounds * W - S,) + parts.shape[1:], parts.dtype)])
    lanes = _fold(jnp.concatenate([jnp.zeros((1, W) + parts.shape[1:], parts.dtype),
                                   padded.reshape((rounds, W) + parts.shape[1:])]), add)
    return _butterfly(lanes, 0, add)


def _fold(parts, add):
    """Left fold of a stacked array with ``add``: ((p0 + p1) + p2) + ..."""
    return jax.lax.scan(lambda t, x: (add(t, x), None), parts[0], parts[1:])[0]


def _pairwise(parts, add):
    """Pairwise (tree) sum over the leading axis: adjacent pairs, then pairs of pairs; an odd
    element waits for the next level."""
    while parts.shape[0] > 1:
        n = parts.shape[0]
        s = add(parts[0:n - 1:2], parts[1:n:2])
        parts = jnp.concatenate([s, parts[n - 1:]]) if n % 2 else s
    return parts[0]


# ---------------------------------------------------------------------------------------------
# batches of GEMMs, partitioned over devices


def _out_format(cfg: GemmConfig, K: int) -> fm.FloatFormat:
    """The format :func:`gemm_bits` returns D in, for this K."""
    return fm.F32 if cfg.k_schedule.plan(K, cfg.ins.k).reduces else fm.FORMATS[cfg.ins.dtype]


def _local_batch(a, b, cfg, keys, scales):
    """(B, M, K) @ (B, K, N) on one device: one :func:`gemm_bits` per batch element."""
    if a.shape[0] == 1:
        key = None if keys is None else keys[0]
        sc = None if scales is None else (scales[0][0], scales[1][0])
        return gemm_bits(a[0], b[0], cfg, key, sc)[0][None]
    xs = (a, b, keys) + (() if scales is None else tuple(scales))
    return jax.lax.map(lambda x: gemm_bits(x[0], x[1], cfg, x[2], None if scales is None else x[3:])[0], xs)


def batched_gemm_bits(a_bits, b_bits, cfg: GemmConfig, keys=None, scales=None):
    """:func:`gemm_bits` over a batch: ``a_bits`` (B, M, K), ``b_bits`` (B, K, N), ``keys`` one PRNG
    key per GEMM or None, ``scales`` (A's (B, M, K / block), B's (B, K / block, N)). Returns (D
    bits (B, M, N), format of D).

    With several devices the GEMMs are partitioned as their inputs are sharded (over B, M and N;
    K is gathered): a GEMM's bits depend on its K schedule only, so every device computes its
    outputs exactly as one device would. Stochastic rounding (``keys``) draws its bits per
    instruction tile and stays on one device."""
    fmt = _out_format(cfg, a_bits.shape[-1])
    if keys is not None or jax.device_count() == 1:
        return _local_batch(a_bits, b_bits, cfg, keys, scales), fmt
    return _partitioned(cfg, scales is not None)(a_bits, b_bits, *(scales or ())), fmt


@functools.lru_cache(maxsize=64)
def _partitioned(cfg: GemmConfig, scaled: bool):
    """The batched GEMM as a custom-partitioned op (:func:`sharding.partitioned`): outputs sharded
    over (B, M, N) as the operands' B, M (A) and N (B) axes are; K and the scale blocks replicated.
    A vmap of it is one batch of batches."""
    from jax.sharding import NamedSharding, PartitionSpec as P

    def local(a, b, *s):
        return _local_batch(a, b, cfg, None, s or None)

    def axes(shapes):
        """Mesh axes of (B, M, N): from the operands; a mesh axis that shards K (which each device
        needs whole) is moved to M, or else N, so that the devices still split the work."""
        sa, sb = (tuple(x.sharding.spec) + (None,) * 3 for x in shapes[:2])
        bat = sa[0] if sa[0] is not None else sb[0]
        m = sa[1] if sa[1] != bat else None
        n = sb[2] if sb[2] not in (bat, m) else None
        k = sa[2] if sa[2] is not None else sb[1]
        if k is not None and k not in (bat, m, n):
            if m is None:
                m = k
            elif n is None:
                n = k
        return bat, m, n

    def shardings(mesh, arg_shapes):
        bat, m, n = axes(arg_shapes)
        args = [NamedSharding(mesh, P(bat, m, None)), NamedSharding(mesh, P(bat, None, n))]
        if scaled:
            args += [NamedSharding(mesh, P(bat, m, None)), NamedSharding(mesh, P(bat, None, n))]
        return NamedSharding(mesh, P(bat, m, n)), tuple(args)

    rule = "b m k, b k n" + (", b m s, b s n" if scaled else "") + " -> b m n"
    return sharding.partitioned(local, rule, ("k",) + (("s",) if scaled else ()), shardings)


# ---------------------------------------------------------------------------------------------
# differentiable value API


def _f32_bits(bits, fmt):
    """Accumulator bits -> float32 bits; f16 widened exactly in integers (NaN -> 0x7FFFFFFF as
    cvt.f32.f16 gives it, on every backend)."""
    return bits if fmt is fm.F32 else engine.convert(bits, fmt, fm.F32)


def _widen(D, fmt):
    """D bits -> float32 values."""
    return jax.lax.bitcast_convert_type(_f32_bits(D, fmt), jnp.float32)


def _emulated(a, b, cfg: GemmConfig, key):
    """Forward: a (..., M, K) @ b (K, N) or (..., K, N), inputs already quantised (float32)."""
    ins = cfg.ins
    A = _bits(a, ins.atype)
    Bb = _bits(b, ins.btype)
    if b.ndim == 2:  # one weight matrix: fold every batch row into M
        lead = a.shape[:-1]
        D, fmt = batched_gemm_bits(A.reshape(1, -1, a.shape[-1]), Bb[None], cfg, None if key is None else key[None])
        return _widen(D[0], fmt).reshape(lead + (b.shape[1],))
    batch = jnp.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    A = jnp.broadcast_to(A, batch + A.shape[-2:]).reshape((-1,) + A.shape[-2:])
    Bb = jnp.broadcast_to(Bb, batch + Bb.shape[-2:]).reshape((-1,) + Bb.shape[-2:])
    D, fmt = batched_gemm_bits(A, Bb, cfg, None if key is None else jax.random.split(key, A.shape[0]))
    return _widen(D, fmt).reshape(batch + D.shape[-2:])


def _emulated_block(a, b, cfg: GemmConfig):
    """Forward of a block-scaled GEMM on float32 inputs (..., M, K) @ (..., K, N) or (K, N):
    quantised by the MX / NVFP4 recipe of the instruction's scale type (blockscale.py), the
    emulated GEMM on the codes, the NVFP4 tensor scales applied to the float32 result as a GEMM
    epilogue does (``D * (1 / s_a * 1 / s_b)``). Returns (result, dequantised a, dequantised b)."""
    from tcemu._src.blockscale import block_quantize

    ins = cfg.ins
    blk = ins.scale_block
    if a.shape[-1] % blk:
        raise ValueError(f"{ins.spelling!r}: block-scaled GEMMs need K a multiple of the scale block {blk}, "
                         f"got K={a.shape[-1]}")
    qa = block_quantize(a, ins.atype, ins.stype, block=blk)
    qb = block_quantize(jnp.swapaxes(b, -1, -2), ins.btype, ins.stype, block=blk)
    A, SA = qa.element_codes, qa.scale_codes
    Bc, SB = jnp.swapaxes(qb.element_codes, -1, -2), jnp.swapaxes(qb.scale_codes, -1, -2)
    if b.ndim == 2:
        lead = a.shape[:-1]
        D, fmt = batched_gemm_bits(A.reshape(1, -1, a.shape[-1]), Bc[None], cfg, None,
                                   (SA.reshape(1, -1, SA.shape[-1]), SB[None]))
        out = _widen(D[0], fmt).reshape(lead + (b.shape[1],))
    else:
        batch = jnp.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        flat = [jnp.broadcast_to(x, batch + x.shape[-2:]).reshape((-1,) + x.shape[-2:]) for x in (A, Bc, SA, SB)]
        D, fmt = batched_gemm_bits(flat[0], flat[1], cfg, None, (flat[2], flat[3]))
        out = _widen(D, fmt).reshape(batch + D.shape[-2:])
    alpha = rounding.divide(1, qa.tensor_scale) * rounding.divide(1, qb.tensor_scale)
    deq_b = jnp.swapaxes(qb.dequantize(blk), -1, -2)
    return out * alpha, qa.dequantize(blk), deq_b


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _mm_block(a, b, cfg):
    return _emulated_block(a, b, cfg)[0]


def _mm_block_fwd(a, b, cfg):
    out, da, db = _emulated_block(a, b, cfg)
    return out, (da, db)


def _mm_block_bwd(cfg, res, g):  # straight through the quantisation: the dequantised operands
    return _mm_bwd(cfg, res, g)[:2]


_mm_block.defvjp(_mm_block_fwd, _mm_block_bwd)


def _grad_matmul(x, y, cfg):
    """One backward GEMM: exact float32 (cfg None) or emulated with its own config."""
    if cfg is None:
        return jnp.matmul(x, y, precision=jax.lax.Precision.HIGHEST, preferred_element_type=jnp.float32)
    ins = cfg.ins
    if ins.scale_vec is not None:
        return _emulated_block(x, y, cfg)[0]
    return _emulated(quantize(x, ins.atype), quantize(y, ins.btype), cfg, None)


def _unbroadcast(g, shape):
    """Sum a gradient over the axes broadcasting added (matmul batch axes)."""
    while g.ndim > len(shape):
        g = g.sum(0)
    for i, (gs, s) in enumerate(zip(g.shape, shape)):
        if s == 1 and gs != 1:
            g = g.sum(i, keepdims=True)
    return g


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _mm(a, b, cfg, key):
    return _emulated(a, b, cfg, key)


def _mm_fwd(a, b, cfg, key):
    return _emulated(a, b, cfg, key), (a, b)


def _mm_bwd(cfg, res, g):
    a, b = res
    g = g.astype(jnp.float32)
    da = _grad_matmul(g, jnp.swapaxes(b, -1, -2), cfg.grad_lhs)
    if b.ndim == 2:
        db = _grad_matmul(a.reshape(-1, a.shape[-1]).T, g.reshape(-1, g.shape[-1]), cfg.grad_rhs)
    else:
        db = _unbroadcast(_grad_matmul(jnp.swapaxes(a, -1, -2), g, cfg.grad_rhs), b.shape)
    return _unbroadcast(da, a.shape), db, None


_mm.defvjp(_mm_fwd, _mm_bwd)


def _config(config, changes: dict, where: str) -> GemmConfig:
    """``config`` (a GemmConfig, default ``GemmConfig()``) with ``changes`` applied."""
    if config is not None and not isinstance(config, GemmConfig):
        raise TypeError(f"{where}: config must be a tcemu.GemmConfig or None, got {type(config).__name__}; "
                        "build one with tcemu.GemmConfig(arch=..., instruction=..., ...)")
    cfg = config if config is not None else GemmConfig()
    return cfg.replace(**changes) if changes else cfg


def matmul(a, b, *, config: GemmConfig | None = None, key=None, **kwargs):
    """``a @ b`` for (..., M, K) and (..., K, N) (or (K, N)) with a tensor core's exact numerics.

    ``config`` (a :class:`GemmConfig`) or its fields as keywords (``arch=``, ``instruction=``,
    ``k_order=``, ...). Inputs are rounded to the instruction's formats (straight-through
    gradient); the result is float32 (float16 for f16-accumulating instructions, widened).
    Differentiable: the backward GEMMs follow ``config.grad_lhs`` / ``config.grad_rhs``.
    ``key``: PRNG key for stochastic quantisation or rounding. With K = 0 the result is +0 (the
    accumulator's initial value), with M = 0 or N = 0 an empty array, as ``jnp.matmul`` gives.
    """
    cfg = _config(config, kwargs, "matmul")
    key = mma_numerics.check_key(key, "matmul")
    a = _real(a, "matmul", "a")
    b = _real(b, "matmul", "b")
    if a.ndim < 2 or b.ndim < 2 or a.shape[-1] != b.shape[-2]:
        raise ValueError(f"matmul needs (..., M, K) @ (..., K, N), got {a.shape} and {b.shape}")
    batch = a.shape[:-2]
    if b.ndim > 2:
        try:
            batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        except ValueError:
            raise ValueError(f"matmul: the batch axes of a {a.shape} and b {b.shape} do not broadcast "
                             f"({a.shape[:-2]} vs {b.shape[:-2]})") from None
    if cfg.quantize == "stochastic" and key is None:
        raise ValueError("quantize='stochastic' needs key=jax.random.key(...)")
    out_shape = tuple(batch) + (a.shape[-2], b.shape[-1])
    if a.shape[-1] == 0 or 0 in out_shape:  # no products: D = +0, the chain's first C
        return jnp.zeros(out_shape, jnp.float32)
    return _matmul(a, b, key, cfg)


@functools.partial(jax.jit, static_argnames=("cfg",))
def _matmul(a, b, key, cfg: GemmConfig):
    """:func:`matmul` on checked operands, compiled once per config and shapes: called eagerly,
    a GEMM is one XLA program, not one dispatch (and one compile per new shape) per operation."""
    ins = cfg.ins
    if ins.scale_vec is not None:
        return _mm_block(a.astype(jnp.float32), b.astype(jnp.float32), cfg)
    ka = kb = None
    if cfg.quantize == "stochastic":
        key, ka, kb = jax.random.split(key, 3)
    af, bf = a.astype(jnp.float32), b.astype(jnp.float32)
    qa = _ste(af, quantize(af, ins.atype, cfg.quantize, ka))
    qb = _ste(bf, quantize(bf, ins.btype, cfg.quantize, kb))
    return _mm(qa, qb, cfg, key)


def _dimension_numbers(dimension_numbers, lhs, rhs):
    """Checked ((lhs_contracting, rhs_contracting), (lhs_batch, rhs_batch)) as tuples of ints,
    with the rules of :func:`jax.lax.dot_general`."""
    form = "((lhs_contracting, rhs_contracting), (lhs_batch, rhs_batch))"
    try:
        (lc, rc), (lb, rb) = dimension_numbers
        dims = [tuple(d) for d in (lc, rc, lb, rb)]
    except (TypeError, ValueError):
        raise TypeError(f"dot_general: dimension_numbers must be {form} (sequences of ints), "
                        f"got {dimension_numbers!r}") from None
    names = ("lhs_contracting", "rhs_contracting", "lhs_batch", "rhs_batch")
    for name, d, x in zip(names, dims, (lhs, rhs, lhs, rhs)):
        if any(not isinstance(i, (int, np.integer)) or isinstance(i, (bool, np.bool_)) for i in d):
            raise TypeError(f"dot_general: dimension_numbers {name} must be ints, got {d}")
        if any(not 0 <= i < x.ndim for i in d):
            raise ValueError(f"dot_general: dimension_numbers {name} {d} out of range for an operand of rank "
                             f"{x.ndim} (valid: 0..{x.ndim - 1}; negative dimensions are not accepted, as in "
                             "jax.lax.dot_general)")
    lc, rc, lb, rb = (tuple(int(i) for i in d) for d in dims)
    for side, c, bt in (("lhs", lc, lb), ("rhs", rc, rb)):
        if len(set(c + bt)) != len(c + bt):
            raise ValueError(f"dot_general: dimension_numbers {side} contracting {c} and batch {bt} dimensions "
                             "must be distinct")
    for what, ld, rd in (("contracting", lc, rc), ("batch", lb, rb)):
        if len(ld) != len(rd):
            raise ValueError(f"dot_general: dimension_numbers give {len(ld)} lhs and {len(rd)} rhs {what} dimensions")
        ls, rs = tuple(lhs.shape[i] for i in ld), tuple(rhs.shape[i] for i in rd)
        if ls != rs:
            raise ValueError(f"dot_general: dimension_numbers {what} dimensions {ld} of lhs {lhs.shape} and {rd} of "
                             f"rhs {rhs.shape} have sizes {ls} and {rs}")
    return lc, rc, lb, rb


def dot_general(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None, *,
                out_sharding=None, config: GemmConfig | None = None, key=None):
    """Drop-in for :func:`jax.lax.dot_general` computing with :func:`matmul`'s emulated numerics.

    Use ``functools.partial(tcemu.dot_general, config=tcemu.GemmConfig(...))`` as the
    ``dot_general`` of ``flax.nnx.Linear`` / ``flax.linen.Dense``. ``precision`` is ignored (the
    config decides); ``preferred_element_type`` sets the output dtype (default: the promoted
    input dtype, as in JAX).
    """
    cfg = _config(config, {}, "dot_general")
    lhs = _real(lhs, "dot_general", "lhs")
    rhs = _real(rhs, "dot_general", "rhs")
    lc, rc, lb, rb = _dimension_numbers(dimension_numbers, lhs, rhs)
    try:
        dtype = jnp.dtype(preferred_element_type or jnp.result_type(lhs.dtype, rhs.dtype))
    except TypeError:
        raise TypeError(f"dot_general: preferred_element_type must be a dtype such as jnp.float32, "
                        f"got {preferred_element_type!r}") from None
    lf = [i for i in range(lhs.ndim) if i not in lc and i not in lb]
    rf = [i for i in range(rhs.ndim) if i not in rc and i not in rb]
    ls, rs = lhs.shape, rhs.shape
    size = lambda shape, idx: int(np.prod([shape[i] for i in idx], dtype=np.int64))  # noqa: E731
    L = jnp.transpose(lhs, lb + tuple(lf) + lc).reshape(size(ls, lb), size(ls, lf), size(ls, lc))
    R = jnp.transpose(rhs, rb + rc + tuple(rf)).reshape(size(rs, rb), size(rs, rc), size(rs, rf))
    out = matmul(L if lb else L[0], R if rb else R[0], config=cfg, key=key)
    out = out.reshape(tuple(ls[i] for i in lb) + tuple(ls[i] for i in lf) + tuple(rs[i] for i in rf))
    out = out.astype(dtype)
    if out_sharding is not None:
        out = jax.lax.with_sharding_constraint(out, out_sharding)
    return out


def einsum(subscripts, *operands, config: GemmConfig | None = None, key=None, **kwargs):
    """:func:`jax.numpy.einsum` whose contractions run through :func:`dot_general`. Subscripts
    that do not fit the operands raise a ValueError naming ``subscripts``."""
    cfg = _config(config, {}, "einsum")
    dg = functools.partial(dot_general, config=cfg, key=mma_numerics.check_key(key, "einsum"))
    if not isinstance(subscripts, str):
        raise TypeError(f"einsum: subscripts must be a string such as 'ij,jk->ik', got {type(subscripts).__name__}")
    operands = [_real(x, "einsum", f"operand {i}") for i, x in enumerate(operands)]
    try:  # jnp.einsum's own checks of the subscripts against the operands, before any contraction
        jax.eval_shape(lambda *xs: jnp.einsum(subscripts, *xs, **kwargs), *operands)
    except (ValueError, TypeError, IndexError) as e:
        raise ValueError(f"einsum: subscripts {subscripts!r} do not fit operands of shapes "
                         f"{[x.shape for x in operands]}: {e}") from None
    return jnp.einsum(subscripts, *operands, _dot_general=dg, **kwargs)
