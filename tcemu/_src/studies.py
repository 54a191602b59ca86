"""Accumulation error as a dot product grows: one chained MMA per configuration, checkpointed.

    >>> import tcemu
    >>> r = tcemu.error_vs_k("bf16", "H100", ks=(16, 256, 4096))
    >>> [f"{e:.1e}" for e in r.max_rel]
    ['9.4e-08', '5.1e-07', '1.2e-05']

A long dot product on a GPU is a chain of MMA instructions along K (each instruction's D is the
next one's C), which is what every GEMM kernel does per output tile. :func:`error_vs_k` runs that
chain once up to the largest K and records the result after every instruction, so the whole curve
costs one K_max-long run; errors are relative to float64 on the same (quantised) inputs.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from tcemu._src.quant.elements import quantize
from tcemu._src.isa.parse import Mma, parse
from tcemu._src.numerics import engine

DTYPES = {"f16": np.float16, "bf16": ml_dtypes.bfloat16, "tf32": np.float32,
          "e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2,
          "e3m2": ml_dtypes.float6_e3m2fn, "e2m3": ml_dtypes.float6_e2m3fn, "e2m1": ml_dtypes.float4_e2m1fn,
          "e4m3fnuz": ml_dtypes.float8_e4m3fnuz, "e5m2fnuz": ml_dtypes.float8_e5m2fnuz}
_CODES = ("e3m2", "e2m3", "e2m1")  # passed to tcemu.mma as uint8 codes (JAX holds no fp6 arrays)
DISTRIBUTIONS = ("uniform", "normal")
# (input format, GPU preset, promotion interval or None): the comparison the demo and
# experiments/published_findings.py draw
GPU_CONFIGS = (("f16", "V100", None), ("f16", "A100", None), ("f16", "H100", None),
               ("bf16", "A100", None), ("bf16", "H100", None), ("tf32", "A100", None), ("tf32", "H100", None),
               ("e4m3", "L40S", None), ("e4m3", "H100", None), ("e4m3", "H100", 128), ("e4m3", "B200", None))


def config_label(fmt: str, arch, promotion_interval: int | None = None) -> str:
    """"H100 e4m3 + promotion/128": the name of one entry of :data:`GPU_CONFIGS` in tables and plots."""
    return f"{arch} {fmt}" + ("" if promotion_interval is None else f" + promotion/{promotion_interval}")


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def check_int(name: str, v, lo: int) -> int:
    """``v`` as an int, or a TypeError (not an integer) / ValueError (below ``lo``) naming ``name``."""
    if not _is_int(v):
        raise TypeError(f"{name} must be an integer >= {lo}, got {v!r} ({type(v).__name__})")
    if v < lo:
        raise ValueError(f"{name} must be an integer >= {lo}, got {v}")
    return int(v)


def check_choice(name: str, v, choices) -> str:
    """``v`` if it is one of the strings ``choices``, else an error naming ``name`` and the choices."""
    if not isinstance(v, str) or v not in choices:
        err = ValueError if isinstance(v, str) else TypeError
        raise err(f"{name} must be one of {', '.join(map(repr, choices))}, got {v!r}")
    return v


def _check_ks(ks) -> list[int]:
    """Dot-product lengths: a non-empty iterable of positive integers, sorted without repeats."""
    if isinstance(ks, (str, bytes)) or not hasattr(ks, "__iter__"):
        raise TypeError(f"ks must be a sequence of positive integers (dot-product lengths), got {ks!r}")
    ks = [check_int(f"ks[{i}]", k, 1) for i, k in enumerate(ks)]
    if not ks:
        raise ValueError("ks is empty; give at least one dot-product length")
    return sorted(set(ks))


def default_instruction(arch, fmt: str) -> str:
    """The MMA a GEMM on ``arch`` uses for inputs of ``fmt`` (f32 accumulation)."""
    from tcemu._src.arch import resolve

    a = resolve(arch)
    sm = a.sm
    check_choice("fmt", fmt, tuple(DTYPES))
    if a.amd or fmt.endswith("fnuz"):
        return _default_mfma(a, fmt)
    if fmt == "f16":
        if sm < 75:
            return "wmma.mma.sync.aligned.row.col.m16n16k16.f32.f32"
        return "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32" if sm < 80 else \
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"
    if fmt == "bf16":
        return "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"
    if fmt in _CODES:
        if sm != 120:
            raise ValueError(f"fmt={fmt!r}: fp6/fp4 MMAs with a default instruction are sm_120's mma.sync "
                             f"kind::f8f6f4 (arch='RTX5090'), not {resolve(arch)}")
        return f"mma.sync.aligned.m16n8k32.row.col.kind::f8f6f4.f32.{fmt}.{fmt}.f32"
    if fmt == "tf32":
        return "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32"
    if sm == 90:  # e4m3, e5m2: Hopper FP8 GEMMs (cuBLAS, DeepGEMM) run wgmma
        return f"wgmma.mma_async.sync.aligned.m64n8k32.f32.{fmt}.{fmt}"
    return f"mma.sync.aligned.m16n8k32.row.col.f32.{fmt}.{fmt}.f32"


# AMD: the single-block 32x32 MFMA of each input format (the one hipBLASLt's MI300 GEMMs mostly use)
_MFMA = {"gfx942": {"f16": "v_mfma_f32_32x32x8_f16", "bf16": "v_mfma_f32_32x32x8_bf16", "tf32": "v_mfma_f32_32x32x4_xf32",
                    "e4m3fnuz": "v_mfma_f32_32x32x16_fp8_fp8", "e5m2fnuz": "v_mfma_f32_32x32x16_bf8_bf8"},
         "gfx90a": {"f16": "v_mfma_f32_32x32x8f16", "bf16": "v_mfma_f32_32x32x8bf16_1k"},
         "gfx908": {"f16": "v_mfma_f32_32x32x8f16", "bf16": "v_mfma_f32_32x32x4bf16"}}


def mfma_formats(arch) -> tuple[str, ...]:
    """The input formats an AMD target has a default MFMA for.

    >>> mfma_formats("MI300X")
    ('f16', 'bf16', 'tf32', 'e4m3fnuz', 'e5m2fnuz')
    """
    from tcemu._src.arch import resolve

    return tuple(_MFMA.get(resolve(arch).name, {}))


def _default_mfma(a, fmt: str) -> str:
    table = _MFMA.get(a.name, {})
    if fmt not in table:
        raise ValueError(f"fmt={fmt!r}: {a} has no MFMA for it; valid: {', '.join(table)}"
                         if a.amd else f"fmt={fmt!r}: the fnuz fp8 formats are AMD's (arch='MI300X'), not {a}'s")
    return table[fmt]


@dataclasses.dataclass(frozen=True)
class ErrorCurve:
    """Relative errors against float64 of ``outputs`` dot products at each length ``k``.

    >>> import tcemu
    >>> c = tcemu.error_vs_k("f16", "A100", ks=(16, 64, 256), outputs=128)
    >>> c.label, c.instruction, c.k
    ('A100 f16', 'mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32', (16, 64, 256))
    >>> [f"{e:.1e}" for e in c.max_rel], [f"{e:.1e}" for e in c.mean_rel]
    (['1.8e-07', '6.6e-07', '2.7e-06'], ['7.8e-08', '4.6e-07', '2.4e-06'])
    """

    label: str
    fmt: str
    instruction: str
    k: tuple[int, ...]
    max_rel: tuple[float, ...]
    mean_rel: tuple[float, ...]

    def __post_init__(self):
        for name in ("label", "instruction"):
            if not isinstance(getattr(self, name), str):
                raise TypeError(f"ErrorCurve.{name} must be a str, got {getattr(self, name)!r}")
        check_choice("ErrorCurve.fmt", self.fmt, tuple(DTYPES))
        if isinstance(self.k, (str, bytes)) or not hasattr(self.k, "__iter__"):
            raise TypeError(f"ErrorCurve.k must be a sequence of positive integers, got {self.k!r}")
        k = tuple(check_int(f"ErrorCurve.k[{i}]", v, 1) for i, v in enumerate(self.k))
        if any(x >= y for x, y in zip(k, k[1:])):
            raise ValueError(f"ErrorCurve.k must be increasing, got {k}")
        object.__setattr__(self, "k", k)
        for name in ("max_rel", "mean_rel"):
            v = getattr(self, name)
            if isinstance(v, (str, bytes)) or not hasattr(v, "__iter__"):
                raise TypeError(f"ErrorCurve.{name} must be a sequence of floats, one per k, got {v!r}")
            v = tuple(v)
            if len(v) != len(k):
                raise ValueError(f"ErrorCurve.{name} must have one error per k ({len(k)}), got {len(v)}")
            for i, x in enumerate(v):
                if not isinstance(x, (int, float, np.integer, np.floating)) or isinstance(x, (bool, np.bool_)):
                    raise TypeError(f"ErrorCurve.{name}[{i}] must be a float, got {x!r} ({type(x).__name__})")
                if x < 0:
                    raise ValueError(f"ErrorCurve.{name}[{i}] must be >= 0 (a relative error), got {x}")
            object.__setattr__(self, name, tuple(float(x) for x in v))


def sample(fmt: str, shape, dist: str = "uniform", seed: int = 0) -> np.ndarray:
    """Random inputs exactly representable in ``fmt`` (as a typed array; tf32 as float32)."""
    check_choice("fmt", fmt, tuple(DTYPES))
    check_choice("dist", dist, DISTRIBUTIONS)
    rng = np.random.default_rng(check_int("seed", seed, 0))
    x = rng.random(shape) if dist == "uniform" else rng.standard_normal(shape)
    x = x.astype(np.float32)
    if fmt == "tf32":
        return np.asarray(quantize(x, "tf32"))
    return x.astype(DTYPES[fmt])


def error_vs_k(fmt: str = "f16", arch="H100", ks=tuple(2 ** i for i in range(4, 15)), *, instruction=None,
               model=None, outputs: int = 512, dist: str = "uniform", seed: int = 0,
               promotion_interval: int | None = None, label: str | None = None) -> ErrorCurve:
    """Error of ``outputs`` (a positive int) emulated dot products of each length in ``ks``
    against float64: the max and mean relative error over them.

    ``ks``: positive multiples of the instruction's K; lengths below K are skipped (so one list
    serves instructions of K = 8, 16 and 32). ``instruction`` (f32 D, inputs of ``fmt``) defaults
    to :func:`default_instruction`; ``model`` (a :class:`tcemu.BlockFMA` or
    :class:`tcemu.ArchNumerics`) replaces the preset. ``dist``: "uniform" (U[0,1)) or "normal".
    ``promotion_interval`` (a multiple of the instruction's K): every that many products the
    chain's partial sum is added into a float32 total with one RNE addition and the chain
    restarts from zero (DeepSeek-V3's fix for Hopper FP8 accumulation).

    fp6/fp4 (``fmt`` "e3m2", "e2m3", "e2m1") run sm_120's ``kind::f8f6f4``; a block-scaled
    ``instruction`` (``kind::mxf8f6f4``, ``mxf4``, ``mxf4nvf4``) gets random block scales near 1
    (ue8m0 2**-1 .. 2**1, ue4m3 1 .. 1.875), which the float64 reference includes.

    >>> import tcemu
    >>> [f"{e:.1e}" for e in tcemu.error_vs_k("e4m3", "H100", ks=(128, 4096), outputs=64).max_rel]
    ['9.1e-04', '6.8e-02']
    >>> [f"{e:.1e}" for e in tcemu.error_vs_k("e4m3", "H100", ks=(128, 4096), outputs=64,
    ...                                       promotion_interval=128).max_rel]
    ['9.1e-04', '5.6e-04']
    """
    from tcemu._src.arch import resolve
    from tcemu._src.numerics.presets import check_model

    check_choice("fmt", fmt, tuple(DTYPES))
    arch_ = resolve(arch)
    ks = _check_ks(ks)
    outputs = check_int("outputs", outputs, 1)
    check_choice("dist", dist, DISTRIBUTIONS)
    seed = check_int("seed", seed, 0)
    if label is not None and not isinstance(label, str):
        raise TypeError(f"label must be a str or None, got {label!r}")
    check_model(model, "error_vs_k")
    if instruction is not None and not isinstance(instruction, str):
        raise TypeError(f"instruction must be an MMA spelling (str) or None, got {instruction!r}")
    sp = default_instruction(arch_, fmt) if instruction is None else instruction
    ins = _curve_instruction(sp, fmt, arch_, model)
    ks, g = _chain_lengths(ins, ks, promotion_interval)
    steps = ks[-1] // ins.k
    tiles = -(-outputs // (ins.m * ins.n))  # whole tiles; the statistics use the first ``outputs`` results
    a = sample(fmt, (tiles, ins.m, ks[-1]), dist, seed)
    b = sample(fmt, (tiles, ks[-1], ins.n), dist, seed + 1)
    sa, sb = _block_scales(ins, tiles, steps, seed + 2)
    got = _run_chain(sp, arch, model, ins, g, fmt, a, b, sa, sb)  # (steps, T, m, n)
    ref = _reference(ins, a, b, sa, sb)
    mx, mn = zip(*(_rel_errors(got[k // ins.k - 1], ref[k // ins.k - 1], outputs) for k in ks))
    name = label or config_label(fmt, arch, promotion_interval)
    return ErrorCurve(name, fmt, sp, tuple(ks), mx, mn)


def _curve_instruction(sp: str, fmt: str, arch, model) -> Mma:
    """The parsed MMA of :func:`error_vs_k`: inputs of ``fmt``, f32 D, available on ``arch``
    with a numerics model (the preset or ``model``)."""
    from tcemu._src.isa.targets import check_arch
    from tcemu._src.numerics.mma import resolve_model

    if sp.strip().startswith("v_mfma"):  # AMD: parsed for its target
        from tcemu._src.isa.mfma import parse_mfma

        ins = parse_mfma(sp, arch)
    else:
        ins = parse(sp)
    if not isinstance(ins, Mma) and getattr(ins, "kind", None) != "mfma":
        raise ValueError(f"instruction must be an MMA spelling, got {sp!r}")
    if ins.atype != fmt or ins.btype != fmt:
        raise ValueError(f"{sp!r} takes {ins.atype}/{ins.btype} inputs, not fmt={fmt!r}")
    if ins.dtype != "f32":
        raise ValueError(f"error_vs_k needs an instruction with f32 D, got {sp!r}")
    check_arch(ins, arch)
    resolve_model(ins, model, arch)  # the preset or model=, or an error naming model=
    return ins


def _chain_lengths(ins: Mma, ks: list[int], promotion_interval: int | None):
    """The lengths of ``ks`` an ``ins`` chain reaches (multiples of its K; shorter ones dropped)
    and the promotion interval in instructions (None without promotion)."""
    odd = [k for k in ks if k >= ins.k and k % ins.k]
    if odd:
        raise ValueError(f"ks must be multiples of the instruction's K = {ins.k}, got {odd}")
    ks = [k for k in ks if k >= ins.k]
    if not ks:
        raise ValueError(f"every length in ks is below the instruction's K = {ins.k}")
    if promotion_interval is None:
        return ks, None
    promotion_interval = check_int("promotion_interval", promotion_interval, 1)
    if promotion_interval % ins.k:
        raise ValueError(f"promotion_interval must be a positive multiple of K = {ins.k}, got {promotion_interval}")
    return ks, promotion_interval // ins.k


def _block_scales(ins: Mma, tiles: int, steps: int, seed: int):
    """Random scale codes near 1 of A (tiles, M, steps * S) and B (tiles, steps * S, N): ue8m0
    2**-1 .. 2**1, ue4m3 1 .. 1.875 (drawn for every instruction; unscaled ones ignore them)."""
    S = ins.scale_vec or 1
    lo, hi = (126, 129) if ins.stype == "ue8m0" else (0x38, 0x40)
    rng = np.random.default_rng(seed)
    return tuple(rng.integers(lo, hi, shape).astype(np.uint8)
                 for shape in ((tiles, ins.m, steps * S), (tiles, steps * S, ins.n)))


def _scale_values(codes, stype: str):
    """Float64 values of ue8m0 or ue4m3 scale codes."""
    if stype == "ue8m0":
        return 2.0 ** (codes.astype(np.float64) - 127)
    return codes.view(ml_dtypes.float8_e4m3fn).astype(np.float64)


def _run_chain(sp: str, arch, model, ins: Mma, g: int | None, fmt: str, a, b, sa, sb):
    """D after every instruction of the chain (steps, tiles, M, N) as float64: ``a`` (tiles, M,
    K_max) and ``b`` (tiles, K_max, N) cut into instructions along K, each D the next C; with
    promotion every ``g`` instructions the partial sum joins a float32 total (one RNE addition)."""
    from tcemu._src.api import mma

    tiles, steps, S = a.shape[0], a.shape[2] // ins.k, ins.scale_vec or 1
    enc = (lambda x: x.view(np.uint8)) if fmt in _CODES else (lambda x: x)  # noqa: E731
    a_s = jnp.asarray(enc(a).reshape(tiles, ins.m, steps, ins.k).transpose(2, 0, 1, 3))  # (steps, T, m, k)
    b_s = jnp.asarray(enc(b).reshape(tiles, steps, ins.k, ins.n).transpose(1, 0, 2, 3))
    sa_s = jnp.asarray(sa.reshape(tiles, ins.m, steps, S).transpose(2, 0, 1, 3))
    sb_s = jnp.asarray(sb.reshape(tiles, steps, S, ins.n).transpose(1, 0, 2, 3))

    def f32_add(x, y):
        bits = engine.add(jax.lax.bitcast_convert_type(x, jnp.uint32), jax.lax.bitcast_convert_type(y, jnp.uint32))
        return jax.lax.bitcast_convert_type(bits, jnp.float32)

    @jax.jit
    def run(a_s, b_s, sa_s, sb_s):
        zero = jnp.zeros((tiles, ins.m, ins.n), jnp.float32)

        def step(carry, x):
            d, total, i = carry
            sc = dict(scale_a=x[2], scale_b=x[3]) if ins.scale_vec else {}
            d = mma(sp, x[0], x[1], d, arch=arch, model=model, **sc)
            if g is None:
                return (d, total, i + 1), d
            out = f32_add(total, d)
            done = (i + 1) % g == 0
            return (jnp.where(done, zero, d), jnp.where(done, out, total), i + 1), out

        return jax.lax.scan(step, (zero, zero, jnp.int32(0)), (a_s, b_s, sa_s, sb_s))[1]

    return np.asarray(run(a_s, b_s, sa_s, sb_s), np.float64)


def _reference(ins: Mma, a, b, sa, sb):
    """Float64 partial dot products after every instruction (steps, tiles, M, N), scales included."""
    tiles, steps = a.shape[0], a.shape[2] // ins.k
    av, bv = a.astype(np.float64), b.astype(np.float64)
    if ins.scale_vec:
        blk = ins.scale_block
        av = av * np.repeat(_scale_values(sa, ins.stype), blk, axis=2)
        bv = bv * np.repeat(_scale_values(sb, ins.stype), blk, axis=1)
    parts = np.einsum("tmsk,tskn->stmn", av.reshape(tiles, ins.m, steps, ins.k), bv.reshape(tiles, steps, ins.k, ins.n))
    return np.cumsum(parts, axis=0)


def _rel_errors(got, ref, outputs: int):
    """(max, mean) relative error of the first ``outputs`` results ``got`` against float64 ``ref``."""
    rel = (np.abs(got - ref) / np.maximum(np.abs(ref), np.finfo(np.float64).tiny)).reshape(-1)[:outputs]
    return float(rel.max()), float(rel.mean())


def fp32_chain_error(fmt: str = "f16", ks=tuple(2 ** i for i in range(4, 15)), *, outputs: int = 512,
                     dist: str = "uniform", seed: int = 0) -> ErrorCurve:
    """``outputs`` dot products of each length in ``ks`` (as :func:`error_vs_k`) summed one product
    at a time in float32 with round-to-nearest (an FMA chain on CUDA cores; products of these
    formats are exact in float32)."""
    check_choice("fmt", fmt, tuple(DTYPES))
    ks = _check_ks(ks)
    outputs = check_int("outputs", outputs, 1)
    rows = max(1, int(np.sqrt(outputs)))
    cols = -(-outputs // rows)
    a = sample(fmt, (rows, ks[-1]), dist, seed).astype(np.float32)
    b = sample(fmt, (ks[-1], cols), dist, seed + 1).astype(np.float32)
    prods = a[:, :, None] * b[None, :, :]  # exact
    acc = np.cumsum(prods, axis=1, dtype=np.float32)  # sequential float32 additions
    ref = np.cumsum(prods.astype(np.float64), axis=1)
    # the first ``outputs`` of the rows x cols dot products
    mx, mn = zip(*(_rel_errors(acc[:, k - 1].astype(np.float64), ref[:, k - 1], outputs) for k in ks))
    return ErrorCurve(f"fp32 FMA chain ({fmt})", fmt, "fma.rn.f32", tuple(ks), mx, mn)


def curves_table(curves, ks=(16, 64, 256, 1024, 4096, 16384), width: int = 34) -> list[str]:
    """Lines of a text table: each curve's max relative error at the lengths ``ks`` it has ("-"
    where it has none; lengths no curve has are left out)."""
    shown = [k for k in ks if any(k in c.k for c in curves)]
    lines = [f"{'max relative error':{width}s}" + "".join(f"{'K=' + str(k):>9s}" for k in shown)]
    for c in curves:
        v = dict(zip(c.k, c.max_rel))
        lines.append(f"{c.label:{width}s}" + "".join(f"{v[k]:9.1e}" if k in v else f"{'-':>9s}" for k in shown))
    return lines


def write_csv(curves, path) -> None:
    """One row per (curve, length): label, format, instruction, k, max_rel, mean_rel."""
    with open(path, "w") as f:
        f.write("label,format,instruction,k,max_rel,mean_rel\n")
        for c in curves:
            for k, mx, mn in zip(c.k, c.max_rel, c.mean_rel):
                f.write(f"{c.label},{c.fmt},{c.instruction},{k},{mx:.6e},{mn:.6e}\n")
