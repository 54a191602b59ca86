"""A GEMM kernel's K schedule as data: which K elements each MMA instruction sees, which
instructions chain into one accumulator, and how the partial accumulators are combined.

The vocabulary is CUTLASS's: a mainloop walks K in *k-tiles* of ``k_tile`` elements (several
instructions each), the partial k-tile (the *residue*) comes first or last; *split-K* cuts K into
slices computed independently from +0 and reduced afterwards (in float32, or stored in the output
type first: cuBLAS's reduced-precision reduction); *promotion* adds the tensor-core accumulator
into a float32 accumulator every ``promotion`` elements (cuBLAS fp8 without fast accumulation).

    >>> import tcemu
    >>> s = tcemu.KSchedule(k_tile=64, residue="first")   # a CUTLASS 2 mainloop
    >>> [(int(a), int(b)) for a, b in s.plan(K=100, k=16).instruction_ranges()[0]]
    [(0, 16), (16, 32), (32, 36), (36, 52), (52, 68), (68, 84), (84, 100)]

Bits depend on these K boundaries only, never on how M and N are cut into tiles.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import numpy as np

from tcemu._src.numerics.model import choice_field, int_field, replace_fields

RESIDUES = ("last", "first")
REDUCTIONS = ("sequential", "pairwise", "shuffle", "serial")
SHUFFLE_LANES = 32
SLICE_PADS = ("end", "start")
PARTIALS = ("f32", "f16", "bf16")
MAX_SIZE = 2**31  # K, k and the schedule's sizes: JAX indexes with int32


@jax.tree_util.register_static  # a static argument of jit / vmap, hashed into the cache key
@dataclasses.dataclass(frozen=True)
class KSchedule:
    """How a GEMM walks K (hashable; ``GemmConfig(schedule=...)``).

    Attributes:
      k_tile: elements of K per mainloop iteration, a multiple of the instruction's k (0: the
        instruction's k). Matters only for where a partial tile falls.
      residue: "last" (K padded with zeros at the end of each slice) or "first" (the partial
        k-tile is the first iteration of each slice, CUTLASS's residue-first mainloops).
      slices: split-K slices (1: none), or 0 for one slice per k-tile.
      slice_align: slices are ``ceil(K / slices)`` rounded up to a multiple of this many
        elements (0: ``k_tile``; 1: equal slices, as XLA's split-K); the last slices may be
        shorter or empty. Each slice starts its own k-tiles and instructions.
      slice_pad: where K is padded to the slices' total: "end" (the last slices are short) or
        "start" (zeros before the first element, so the first slice is short and every
        slice boundary moves: XLA's split-K pads K low to a multiple of the slice count).
      promotion: elements of K (a multiple of ``k_tile``) accumulated in the tensor core before
        the accumulator is added into a float32 total that starts at +0 (0: no promotion).
      reduction: how slice partials combine in float32: "sequential" (((p0 + p1) + p2) + ...),
        "pairwise" (adjacent pairs, then pairs of pairs: a Triton reduction, see
        ``reduce_threads``), or "shuffle" (XLA's GPU reduction emitter: 32 lanes, lane j adds
        partials j, j + 32, ... in order onto +0, then lane j adds lane j + h for h = 16, 8, 4,
        2, 1, a warp shuffle-down tree), or "serial" (CUTLASS's serial split-K, cuBLASLt's
        ``INPLACE`` scheme: slice s adds its float32 partial onto the running total, which is
        stored in the ``partials`` type after every slice, t = round(round(p0) + p1) ...).
      reduce_threads, reduce_lanes: a Triton reduction spread over threads (pairwise only;
        powers of two, lanes dividing threads; 1 and 0: one thread): the partials, padded with
        +0 to a power of two, are dealt round-robin to T = ``reduce_threads`` threads (thread t
        holds partials t, t + T, ...), each adds its own pairwise; thread t = w * L + l (L =
        ``reduce_lanes`` lanes per warp, 0: all) adds lane l + h of its warp for h = L/2, ...,
        1, then warp w adds warp w + h for h = T/(2L), ..., 1 (butterflies of the warps' shuffle
        and shared-memory steps).
      partials: type the slice partials are stored in before they are added ("f32", or "f16" /
        "bf16": rounded to nearest even first, as cuBLAS's reduced-precision split-K does;
        "serial": the type of the running total).

    >>> import jax.numpy as jnp, tcemu
    >>> s = tcemu.KSchedule(k_tile=32, slices=4, reduction="pairwise")
    >>> s.describe()
    'k-tile 32, residue last, 4 slices, pairwise reduction of f32 partials'
    >>> a = jnp.ones((1, 256), jnp.float32); b = jnp.ones((256, 1), jnp.float32)
    >>> float(tcemu.matmul(a, b, arch="H100", schedule=s)[0, 0])
    256.0
    """

    k_tile: int = 0
    residue: str = "last"
    slices: int = 1
    slice_align: int = 0
    slice_pad: str = "end"
    promotion: int = 0
    reduction: str = "sequential"
    partials: str = "f32"
    reduce_threads: int = 1
    reduce_lanes: int = 0

    def __post_init__(self):
        int_field(self, "k_tile", 0, None)
        choice_field(self, "residue", RESIDUES)
        int_field(self, "slices", 0, None, "; 0: one slice per k-tile")
        int_field(self, "slice_align", 0, None)
        choice_field(self, "slice_pad", SLICE_PADS)
        int_field(self, "promotion", 0, None)
        choice_field(self, "reduction", REDUCTIONS)
        choice_field(self, "partials", PARTIALS)
        int_field(self, "reduce_threads", 1, None)
        int_field(self, "reduce_lanes", 0, None, "; 0: all threads")
        T, L = self.reduce_threads, self.reduce_lanes or self.reduce_threads
        if T & (T - 1) or L & (L - 1) or T % L:
            raise ValueError(f"KSchedule.reduce_threads={T} and reduce_lanes={self.reduce_lanes} must be powers of "
                             "two, the lanes dividing the threads")
        if T > 1 and self.reduction != "pairwise":
            raise ValueError(f"KSchedule.reduce_threads={T} needs reduction='pairwise' (a Triton reduction), "
                             f"got {self.reduction!r}")
        if self.promotion and self.k_tile and self.promotion % self.k_tile:
            raise ValueError(f"KSchedule.promotion={self.promotion} must be a multiple of k_tile={self.k_tile}")

    def replace(self, **changes) -> "KSchedule":
        return replace_fields(self, changes)

    def check(self, k: int, where: str = "KSchedule"):
        """Raise unless this schedule fits an instruction of depth ``k``."""
        for name in ("k_tile", "promotion"):
            v = getattr(self, name)
            if v % k:
                raise ValueError(f"{where}: {name}={v} must be a multiple of the instruction's k={k}")

    def plan(self, K: int, k: int) -> "Plan":
        """The instructions of a GEMM of depth ``K`` with instructions of depth ``k``."""
        for name, v, lo in (("K", K, 0), ("k", k, 1)):
            if not isinstance(v, (int, np.integer)) or isinstance(v, (bool, np.bool_)) or not lo <= v < MAX_SIZE:
                raise ValueError(f"KSchedule.plan: {name} must be an integer >= {lo} and below 2**31 (JAX indexes K "
                                 f"with int32), got {v!r}")
        for name in ("k_tile", "slice_align", "promotion"):
            if getattr(self, name) >= MAX_SIZE:
                raise ValueError(f"KSchedule.plan: {name}={getattr(self, name)} must be below 2**31 (JAX indexes K "
                                 "with int32)")
        self.check(k)
        return _plan(self, int(K), int(k))

    def equivalent(self, other: "KSchedule", K: int, k: int) -> bool:
        """Whether ``other`` gives the same bits as this schedule at depth ``K`` with instructions of
        depth ``k`` for every input: the same instructions on the same elements, promotion groups,
        and (with slices) the same partial type and reduction order.

        >>> KSchedule(k_tile=64, residue="first").equivalent(KSchedule(), 1024, 16)
        True
        """
        if not isinstance(other, KSchedule):
            raise TypeError(f"KSchedule.equivalent: other must be a tcemu.KSchedule, got {other!r} "
                            f"({type(other).__name__})")
        a, b = self.plan(K, k), other.plan(K, k)
        if a.index.shape != b.index.shape or not ((a.index == b.index).all() and (a.valid == b.valid).all()
                                                  and a.group == b.group):
            return False
        if a.slices == 1:
            return True
        tree = (self.reduction, self.reduce_threads, self.reduce_lanes or self.reduce_threads)
        return self.partials == other.partials and tree == (other.reduction, other.reduce_threads,
                                                            other.reduce_lanes or other.reduce_threads)

    def describe(self) -> str:
        """One line naming the schedule."""
        parts = [f"k-tile {self.k_tile}, residue {self.residue}" if self.k_tile else
                 f"one instruction per k-tile, residue {self.residue}"]
        if self.slices != 1:
            parts.append("one slice per k-tile" if self.slices == 0 else f"{self.slices} slices"
                         + (f" aligned to {self.slice_align}" if self.slice_align else "")
                         + (", K padded at the start" if self.slice_pad == "start" else ""))
        if self.promotion:
            parts.append(f"promotion every {self.promotion}")
        if self.slices != 1:
            parts.append(f"{self.reduction} reduction of {self.partials} partials"
                         + (f" over {self.reduce_threads} threads, {self.reduce_lanes or self.reduce_threads} per warp"
                            if self.reduce_threads > 1 else ""))
        return ", ".join(parts)


@dataclasses.dataclass(frozen=True, eq=False)
class Plan:
    """A schedule laid out for one K: ``index`` (S, T, k) the K element each instruction lane reads
    (-1: a zero), ``valid`` (S, T) whether an instruction runs (False: slice padding, skipped),
    ``group`` instructions per promotion (0: none)."""

    index: np.ndarray
    valid: np.ndarray
    group: int
    schedule: KSchedule

    @property
    def slices(self) -> int:
        return self.index.shape[0]

    @property
    def steps(self) -> int:
        return self.index.shape[1]

    @property
    def reduces(self) -> bool:
        """Whether the result is a float32 sum of partials (else the accumulator itself)."""
        return self.slices > 1 or self.group > 0

    def instruction_ranges(self):
        """Per slice, the (first, last + 1) K element of each valid instruction."""
        out = []
        for s in range(self.slices):
            rows = [self.index[s, t][self.index[s, t] >= 0] for t in range(self.steps) if self.valid[s, t]]
            out.append([(r.min(), r.max() + 1) for r in rows])
        return out

    def runs(self):
        """The laid-out K axis as runs: (start, stop) of source columns, or (-1, length) of zeros."""
        flat = self.index.reshape(-1)
        out, i = [], 0
        while i < flat.size:
            j = i + 1
            if flat[i] < 0:
                while j < flat.size and flat[j] < 0:
                    j += 1
                out.append((-1, j - i))
            else:
                while j < flat.size and flat[j] == flat[j - 1] + 1:
                    j += 1
                out.append((int(flat[i]), int(flat[j - 1]) + 1))
            i = j
        return out


@functools.lru_cache(maxsize=512)
def _plan(s: KSchedule, K: int, k: int) -> Plan:
    kt = s.k_tile or k
    if s.slices == 0:
        bounds = [(a, min(K, a + kt)) for a in range(0, K, kt)] or [(0, 0)]
    else:
        align = s.slice_align or kt
        n = min(s.slices, max(1, -(-K // align)))  # never more slices than aligned units
        size = -(-(-(-K // n)) // align) * align
        if s.slice_pad == "start":  # zeros before element 0 fill the first slice
            lead = n * size - K
            bounds = [(i * size - lead, (i + 1) * size - lead) for i in range(n)]
        else:
            bounds = [(min(K, i * size), min(K, (i + 1) * size)) for i in range(n)]
    slices = []
    for a, b in bounds:
        n = b - a
        tiles = [kt] * (n // kt)
        if n % kt:
            tiles = [n % kt] + tiles if s.residue == "first" else tiles + [n % kt]
        instrs, pos = [], a
        for w in tiles:
            for j in range(0, w, k):
                lanes = np.arange(pos + j, pos + j + k)
                lanes = np.where((lanes < pos + w) & (lanes >= 0), lanes, -1)
                if (lanes >= 0).any():
                    instrs.append(lanes)
            pos += w
        slices.append(instrs)
    T = max(1, max(len(x) for x in slices))
    index = np.full((len(slices), T, k), -1, np.int32)
    valid = np.zeros((len(slices), T), bool)
    for i, instrs in enumerate(slices):
        for t, lanes in enumerate(instrs):
            index[i, t], valid[i, t] = lanes, True
    return Plan(index, valid, s.promotion // k, s)
