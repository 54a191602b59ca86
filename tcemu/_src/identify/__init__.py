"""Find the GEMM configuration (instruction numerics and K schedule) that reproduces a GPU's
output bit for bit.

    >>> import numpy as np, ml_dtypes, tcemu
    >>> rng = np.random.default_rng(0)
    >>> a = rng.standard_normal((32, 300)).astype(np.float16)
    >>> b = rng.standard_normal((300, 16)).astype(np.float16)
    >>> truth = tcemu.GemmConfig(arch="H100", instruction="m16n8k16.f32.f16.f16.f32",
    ...                          schedule=tcemu.KSchedule(k_tile=64, residue="first"))
    >>> d = np.asarray(tcemu.matmul(a, b, config=truth))        # what "the GPU" returned
    >>> tcemu.identify(a, b, d, arch="H100").schedule.describe()
    'k-tile 64, residue first'
"""
from __future__ import annotations

import functools
import time
import warnings

import ml_dtypes
import numpy as np

from tcemu._src.arch import resolve
from tcemu._src.gemm import GemmConfig, KSchedule
from tcemu._src.gemm.config import instruction as parse_instruction
from tcemu._src.gemm.schedule import REDUCTIONS
from tcemu._src.identify.arguments import check_candidates, check_operands, check_seconds
from tcemu._src.identify.hints import hints as _hints, prefer as _prefer, whole_shape as _shape
from tcemu._src.identify.sample import (BLOCK, Sample, block_scaled, epilogue_operands,
                                        epilogues_to_try)
from tcemu._src.isa.targets import check_arch
from tcemu._src.library import cutlass_slice_alignment, slice_alignment

_NUMPY = {"f16": np.float16, "bf16": ml_dtypes.bfloat16}
SLICE_COUNTS = tuple(range(2, 33)) + (40, 48, 56, 64, 96, 128)
FAMILIES = ("nvjet", "cutlass", "xla")  # the split-K forms schedules() can put first


def triton_trees(S: int):
    """(threads, lanes per warp) of a Triton reduction over S partials: up to 4 warps of 32."""
    P = 1 << (S - 1).bit_length()
    return [(T, L) for T in (2, 4, 8, 16, 32, 64, 128) if T <= P for L in (1, 2, 4, 8, 16, 32)
            if L <= T and T // L <= 4]


class NoMatch(ValueError):
    """No candidate reproduces the output; ``closest`` lists (match fraction, GemmConfig).

    >>> import numpy as np, tcemu
    >>> a = np.ones((16, 16), np.float16); b = np.ones((16, 8), np.float16)
    >>> try:
    ...     tcemu.identify(a, b, np.zeros((16, 8), np.float32), arch="H100",
    ...                    instruction="m16n8k16.f32.f16.f16.f32", candidates=[tcemu.KSchedule()])
    ... except tcemu.NoMatch as e:
    ...     fraction, cfg = e.closest[0]
    ...     print(fraction, cfg.schedule.describe())
    0.0 one instruction per k-tile, residue last
    """

    def __init__(self, message, closest):
        super().__init__(message)
        self.closest = closest


def instructions(arch: str, a: str, b: str) -> list[str]:
    """The instructions whose numerics a kernel on ``arch`` may use for inputs ``a`` x ``b``
    (the forms whose numerics differ: k16 and k8 HMMA; for fp8 wgmma, mma.sync, and the f16 HMMA
    on inputs widened to f16 exactly, as XLA's Triton GEMMs with 16-element k-tiles run them),
    without those ``arch`` lacks (:func:`~tcemu._src.isa.targets.check_arch`) or has no numerics for.

    >>> instructions("A100", "f16", "f16"), instructions("V100", "f16", "f16")
    (['m16n8k16.f32.f16.f16.f32', 'm16n8k8.f32.f16.f16.f32'], [])
    """
    return _usable(arch, a, b)[0]


def _usable(arch, a: str, b: str):
    """(the instructions of :func:`instructions`, why each other one is left out)."""
    if a in ("f16", "bf16"):
        forms = [f"m16n8k16.f32.{a}.{b}.f32", f"m16n8k8.f32.{a}.{b}.f32"]
    else:
        forms = [f"wgmma.mma_async.sync.aligned.m64n8k32.f32.{a}.{b}", f"m16n8k32.f32.{a}.{b}.f32",
                 "m16n8k16.f32.f16.f16.f32"]
    out, why = [], {}
    for f in forms:
        try:
            check_arch(parse_instruction(f), arch)
            GemmConfig(arch=arch, instruction=f)
        except ValueError as e:
            why[f] = str(e)
            continue
        out.append(f)
    return out, why


def schedules(K: int, k: int, a: str, b: str, out: str, prefer: str | None = None):
    """Candidate K schedules for instructions of depth ``k``, in stages, most common first.

    Stage 0: one chain (residue last, or first with k-tiles of 64, 128, 32, 256 or k), for fp8
    also promoted every 128. Stage 1, for every slice count S (2, 3, 4, ...), the libraries'
    split-K forms: slices aligned to 64-element k-tiles added in order (cuBLAS nvjet); slices
    rounded up to 16 bytes of the narrower input with the residue first in 32..128-element
    k-tiles (CUTLASS 2; also serial split-K in the output type); such slices with k-tiles of
    16..256 and the residue last in each slice, added pairwise, by a shuffle tree or in order (XLA's Triton split-K pads K to a multiple of
    S * 16 bytes). Stage 2, per S, the rest: other k-tiles, residues, alignments, padding at the
    start, partials in the output type. ``prefer`` ("nvjet", "cutlass" or "xla"): that family's forms,
    for every S, come before the rest of stage 1 (stage 0.5), and for "cutlass" the one chain
    with the residue first before the one with the residue last. Yields (stage, KSchedule); the
    search tries stage by stage, every instruction within a stage."""
    if prefer is not None and prefer not in FAMILIES:
        names = ", ".join(map(repr, FAMILIES[:-1])) + f" or {FAMILIES[-1]!r}"
        raise ValueError(f"schedules: prefer must be None, {names}, got {prefer!r}")
    tiles = [t for t in (64, 128, 32, 256) if t % k == 0]
    chains = [KSchedule()] + [KSchedule(k_tile=t, residue="first") for t in tiles + [k]]
    if prefer == "cutlass":  # CUTLASS 2 mainloops run the partial k-tile first
        chains = chains[1:] + chains[:1]
    promo = [0, 128] if a in ("e4m3", "e5m2") else [0]
    for p in promo:
        for s in chains:
            if p % (s.k_tile or k) == 0:
                yield 0, s.replace(promotion=p)
    partials = ["f32"] + ([out] if out in ("f16", "bf16") else [])
    common = tiles[0] if tiles else k
    xla = slice_alignment(a, b)  # elements in 16 bytes
    every_tile = sorted(set([k] + tiles + [t for t in (16, 32) if t % k == 0]))
    counts = [S for S in SLICE_COUNTS if S <= 2 or S * k <= 2 * K]

    def nvjet(S):  # cuBLAS nvjet: slices aligned to the k-tiles
        return [KSchedule(k_tile=common, slices=S, promotion=p) for p in promo]

    cut = cutlass_slice_alignment(K, a, b)

    def cutlass(S):  # CUTLASS 2: residue first, its slice alignment; serial split-K in the output type
        return [KSchedule(k_tile=t, residue="first", slices=S, slice_align=cut, partials=part)
                for t in tiles[:3] for part in partials] + \
            [KSchedule(k_tile=t, residue="first", slices=S, slice_align=cut, partials=part, reduction="serial")
             for t in tiles[:3] for part in partials[1:]]

    def triton(S):  # XLA's split-K: equal slices of 16 bytes, its reductions of the partials
        return [sc for t in every_tile
                for sc in [KSchedule(k_tile=t, slices=S, slice_align=xla, reduction=red)
                           for red in ("pairwise", "shuffle", "sequential")]
                + [KSchedule(k_tile=t, slices=S, slice_align=xla, reduction="pairwise", reduce_threads=T,
                             reduce_lanes=L) for T, L in triton_trees(S)]]

    if prefer is not None:
        family = dict(zip(FAMILIES, (nvjet, cutlass, triton)))[prefer]
        for i, S in enumerate(counts):
            for sc in family(S):
                yield 0.5 + i / 1000, sc
    for i, S in enumerate(counts):
        for sc in nvjet(S) + cutlass(S) + triton(S):
            yield 1 + i / 1000, sc
        for p in promo:
            for t in (x for x in every_tile if not p % x):
                for res in ("last", "first"):
                    for align in dict.fromkeys((0, 1, xla, 128, 256)):
                        for pad in ("end", "start"):
                            for part in partials:
                                for red in REDUCTIONS:
                                    yield 2 + i / 1000, KSchedule(k_tile=t, residue=res, slices=S, slice_align=align,
                                                                  slice_pad=pad, promotion=p, partials=part,
                                                                  reduction=red)


@functools.lru_cache(maxsize=64)
def _signature(s: KSchedule, K: int, k: int):
    plan = s.plan(K, k)
    return plan.index.tobytes(), plan.index.shape, plan.valid.tobytes(), plan.group, \
        (s.reduction, s.reduce_threads, s.reduce_lanes) if plan.slices > 2 or s.reduction == "serial" else "", \
        s.partials if plan.slices > 1 else ""


def identify(a, b, d, *, arch: str, rows: int = 32, cols: int = 64, instruction: str | None = None,
             candidates=None, library: str | None = None, max_seconds: float = 600.0, c=None, bias=None,
             alpha=None, beta=None, scale_a=None, scale_b=None, epilogues=None, shape=None, hlo=None) -> GemmConfig:
    """A :class:`GemmConfig` with which ``tcemu.matmul(a, b, config=cfg).astype(d.dtype)``
    equals ``d`` bit for bit.

    ``a`` (..., M, K) and ``b`` (..., K, N) in the input type (float16, bfloat16,
    float8_e4m3fn, float8_e5m2; numpy or JAX), ``d`` (..., M, N) the GPU's output (float32,
    float16 or bfloat16). The search uses up to ``rows`` rows and ``cols`` columns (spread over
    the matrix); candidates are tried most common first (:func:`schedules`) for each instruction
    of :func:`instructions` (or ``instruction``), or the given ``candidates`` (KSchedules). On
    the CPU backend candidates are checked through the CPU kernel's chains (no compile per
    candidate) and the one returned is confirmed through ``matmul``. 16-bit outputs carry less
    evidence: more rows separate schedules that differ in a few outputs (a fit is confirmed on up
    to 8 times as many of the rows and columns passed before it is returned), and ``library`` (one of
    :data:`tcemu.library_config`'s: "torch.mm", "torch.bmm", "torch._scaled_mm", "jnp.dot")
    tries first what :func:`tcemu.library_config` answers from cuBLAS's records or a rule under
    each of the library's flags (the bare GEMM's configuration, with each epilogue), then the kernel
    family it runs at the shape (cuBLAS: CUTLASS 2 forms where K or N is not a multiple of 8,
    nvjet forms otherwise; XLA: its split-K forms). ``shape``: the whole GEMM's ``(M, N)`` or
    ``(batch, M, N)`` where ``a``, ``b`` and ``d`` are crops of it (cuBLAS's choice depends on
    it); ``hlo`` (jnp.dot): the compiled module, its kernel tried first. Raises :class:`NoMatch`
    (a ValueError) listing the closest candidates when none matches.

    A layer with an epilogue: give its operands (``c``, ``bias``, ``alpha``, ``beta``, ``scale_a``
    (a scalar or (M, 1)), ``scale_b`` (a scalar or (1, N)), as :func:`tcemu.matmul` takes them) and
    ``d`` is matched by ``matmul(a, b, c=c, bias=bias, ..., out_type=d.dtype, config=cfg)``, trying
    for each schedule the :class:`tcemu.Epilogue` objects in ``epilogues`` (default: every place,
    "accumulator" or "output", of ``c`` and of ``bias``, and every order of two scales). Block
    scales along K (DeepSeek-V3's 1x128 / 128x128 fp8 recipe): ``scale_a`` (M, ceil(K / 128)) and
    ``scale_b`` (ceil(K / 128), N); then the schedules tried are those promoting inside the blocks,
    with ``Epilogue(scale_block=128)`` in each order.

    >>> import numpy as np, tcemu
    >>> rng = np.random.default_rng(0)
    >>> a = rng.standard_normal((16, 40)).astype(np.float16); b = rng.standard_normal((40, 8)).astype(np.float16)
    >>> ins, truth = "m16n8k16.f32.f16.f16.f32", tcemu.KSchedule(k_tile=32, residue="first")
    >>> d = np.asarray(tcemu.matmul(a, b, arch="H100", instruction=ins, schedule=truth))
    >>> cfg = tcemu.identify(a, b, d, arch="H100", instruction=ins, candidates=[tcemu.KSchedule(), truth])
    >>> cfg.schedule == truth, cfg.schedule.describe()
    (True, 'k-tile 32, residue first')
    """
    a, b, d = np.asarray(a), np.asarray(b), np.asarray(d)
    at, bt, ot = check_operands(a, b, d, arch, rows, cols)
    max_seconds, candidates = check_seconds(max_seconds), check_candidates(candidates)
    K, whole = a.shape[-1], _shape(shape, a, b)
    prefer = _prefer(library, K, whole[2], at, bt)
    ins_list = _instructions(arch, at, bt, instruction)
    ops = epilogue_operands(d, dict(c=c, bias=bias, alpha=alpha, beta=beta, scale_a=scale_a, scale_b=scale_b), K)
    sample = Sample(a, b, d, rows, cols, ops)
    more = Sample(a, b, d, CONFIRM * rows, CONFIRM * cols, ops)  # what else the user passed, to confirm a fit
    more = more if more.D.size > sample.D.size else None
    block = block_scaled(ops)
    epis = epilogues_to_try(epilogues, c is not None, bias is not None, scale_a is not None and scale_b is not None,
                            block)
    ks = {ins: GemmConfig(arch=arch, instruction=ins).ins.k for ins in ins_list}
    fast = {ins: sample.evaluators(GemmConfig(arch=arch, instruction=ins)) for ins in ins_list}
    if candidates is not None:
        todo = [(ins, sc) for sc in candidates for ins in ins_list]
    else:
        hints = _hint_pairs(library, arch, whole, K, (at, bt, ot, hlo), instruction, ks, fast, sample)
        todo = hints + _staged(ins_list, ks, fast, K, (at, bt, ot), prefer)
    found, scores = _search(todo, ks, fast, (sample, more), epis, block, arch, K, max_seconds)
    if found is not None:
        if candidates is None and hlo is None:  # the compiled module says what ran
            _warn_if_ambiguous(found, hints, ks, fast, (sample, more), K)
        return found
    scores.sort(key=lambda x: -x[0])
    lines = "; ".join(f"{f:.1%}: {c.instruction}, {c.schedule.describe()}" for f, c in scores[:5])
    raise NoMatch(f"identify: none of {len(scores)} candidate configurations reproduces d "
                  f"({at} x {bt} -> {ot}, K = {K}, {arch}); closest: {lines}", scores[:5])


def _search(todo, ks, fast, samples, epis, block: bool, arch: str, K: int, max_seconds: float):
    """(the first configuration of ``todo`` x ``epis`` that reproduces the sample, confirmed on
    the larger one where there is one, or None; the (share reproduced, config) of each tried)."""
    sample, more = samples
    t0, tried, scores = time.time(), set(), []
    for ins, sc in todo:
        k = ks[ins]
        try:
            sc.check(k)
        except ValueError:
            continue
        sig = (ins, _signature(sc, K, k))
        if sig in tried or (block and (not sc.promotion or BLOCK % sc.promotion)):
            continue  # block scales along K: promotion groups inside the blocks
        tried.add(sig)
        for epi in epis:
            cfg = GemmConfig(arch=arch, instruction=ins, schedule=sc, epilogue=epi)
            ok = sample.evaluate(fast[ins], cfg, sample.probe)
            if ok.all():
                ok = sample.evaluate(fast[ins], cfg, np.ones_like(sample.probe))
            if ok.all() and more is not None:  # several schedules can fit the rows searched
                ok = more.evaluate(None, cfg, np.ones(len(more.D), bool))
            scores.append((float(ok.mean()), cfg))
            if ok.all():
                return cfg, scores
        if time.time() - t0 > max_seconds:
            break
    return None, scores


# a fit on the rows and columns searched is confirmed on up to this many times as many of those passed
CONFIRM = 8


class AmbiguousFit(UserWarning):
    """identify's answer is one of several configurations the library runs (its records and rules
    under each of its flags, :func:`~tcemu._src.identify.hints.hints`) that reproduce every row
    and column passed; ``alternatives`` lists the others. Rows the answer and an alternative give
    differently would decide: pass more rows of ``a`` and ``d``.

    >>> import tcemu
    >>> w = tcemu.AmbiguousFit("identify: ...", alternatives=[])
    >>> isinstance(w, UserWarning), w.alternatives
    (True, [])
    """

    def __init__(self, message, alternatives):
        super().__init__(message)
        self.alternatives = alternatives


def _warn_if_ambiguous(found, hints, ks, fast, samples, K: int) -> None:
    """Warn (:class:`AmbiguousFit`) where another of the library's configurations, with ``found``'s
    epilogue, reproduces all the rows searched and those it was confirmed on too."""
    sample, more = samples
    seen, others = {(found.instruction, _signature(found.schedule, K, ks[found.instruction]))}, []
    for ins, sc in hints:
        sig = (ins, _signature(sc, K, ks[ins]))
        if sig in seen:
            continue
        seen.add(sig)
        try:
            sc.check(ks[ins])
            cfg = GemmConfig(arch=found.arch, instruction=ins, schedule=sc, epilogue=found.epilogue)
        except ValueError:  # not with this epilogue (block scales: promotion inside the blocks)
            continue
        if sample.evaluate(fast[ins], cfg, np.ones_like(sample.probe)).all() and (
                more is None or more.evaluate(None, cfg, np.ones(len(more.D), bool)).all()):
            others.append(cfg)
    if others:
        rows = len((more or sample).D)
        listed = "; ".join(f"{c.instruction}, {c.schedule.describe()}" for c in others)
        warnings.warn(AmbiguousFit(f"identify: the {rows} rows of d searched fit {len(others) + 1} of the library's "
                                   f"configurations: {found.instruction}, {found.schedule.describe()} (returned); "
                                   f"{listed}. Rows where they differ would decide: pass more rows of a and d",
                                   others), stacklevel=3)


def _hint_pairs(library, arch, whole, K, types, instruction, ks, fast, sample):
    """(instruction, schedule) of :func:`~tcemu._src.identify.hints.hints` (``instruction`` only,
    if given); their instructions join ``ks`` and ``fast``."""
    out = [(h.instruction, h.schedule) for h in _hints(library, arch, whole, K, *types)
           if instruction is None or h.instruction == instruction]
    for ins, _ in out:
        if ins not in ks:
            cfg0 = GemmConfig(arch=arch, instruction=ins)
            ks[ins], fast[ins] = cfg0.ins.k, sample.evaluators(cfg0)
    return out


def _staged(ins_list, ks, fast, K, types, prefer):
    """(instruction, schedule) stage by stage, every instruction within a stage; instructions the
    chain evaluator covers first (the others cost a compile per candidate)."""
    first = {ins: None if prefer == "nvjet" and ks[ins] == 8 else prefer for ins in ins_list}  # nvjet: k16 only
    staged = [(st, i, ins, sc) for i, ins in enumerate(ins_list)
              for st, sc in schedules(K, ks[ins], *types, first[ins])]
    return [(ins, sc) for st, i, ins, sc in sorted(staged, key=lambda x: (fast[x[2]] is None, x[0], x[1]))]


def _instructions(arch, at: str, bt: str, given) -> list[str]:
    """The instructions identify tries: ``given`` (checked against ``arch``), or those of
    :func:`instructions`; a ValueError naming what ``arch`` lacks when none is left."""
    if given is not None:
        if not isinstance(given, str):
            raise TypeError(f"identify: instruction must be None or a PTX spelling or mma.sync short form such as "
                            f"'m16n8k16.f32.bf16.bf16.f32' (str), got {given!r}")
        try:
            GemmConfig(arch=arch, instruction=given)
        except ValueError as e:
            raise ValueError(f"identify: instruction={given!r} on {arch}: {e}") from None
        return [given]
    found, why = _usable(arch, at, bt)
    if not found:
        raise ValueError(f"identify: {resolve(arch)} has none of the instructions for {at} x {bt} inputs that "
                         f"identify tries: " + "; ".join(why.values()))
    return found
