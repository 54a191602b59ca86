"""Sparse MMA with a 2:4 (1:2 for tf32, 4:8 in pairs for 4-bit) structured A: ``mma.sp`` and
``mma.sp::ordered_metadata`` (PTX ISA 9.7.14.6) of sm_80 / sm_89 / sm_90.

The A operand is compressed (16 x K/2: the kept elements of every row in order); the metadata
says where in its group of K each one sits. Numerics (measured on an H100,
``tests/data/mma_sp_sm90.npz``): the kept products are the operands of a dense MMA of K/2 (the
B row of each kept element gathered), run with the architecture's dense numerics for that family
and K/2 -- not the dense MMA of K on the decompressed A. The B rows no metadata selects are never
read: an inf or NaN there does not reach D.

    >>> from tcemu._src.isa.sparse import parse_mma_sp
    >>> ins = parse_mma_sp("mma.sp::ordered_metadata.sync.aligned.m16n8k32.row.col.f32.f16.f16.f32")
    >>> ins.k, ins.ordered, ins.group, ins.kept
    (32, True, 4, 2)
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from tcemu._src.formats import ELEMENT_BITS
from tcemu._src.isa.fragments import fragment_to_matrix, matrix_to_fragment
from tcemu._src.isa.instructions import Mma
from tcemu._src.isa.mma_regs import MmaRegs, _from_numeric, _to_numeric
from tcemu._src.isa.parse_mma import WGMMA_INT_N, WGMMA_K
from tcemu._src.isa.qualifiers import Quals, check_sync, mnk, split
from tcemu._src.isa.registers import read_regs, register_index, register_indices, write_regs
from tcemu._src.layouts import sparse as L
from tcemu._src.layouts.fragment import Fragment
from tcemu._src.layouts.mma import MMA
from tcemu._src.numerics import mma as mma_numerics

# PTX ISA 9.7.14.6.3: shapes per type family
SPARSE_FORMS = {"f16": ("m16n8k16", "m16n8k32"), "bf16": ("m16n8k16", "m16n8k32"),
                "tf32": ("m16n8k8", "m16n8k16"), "fp8": ("m16n8k64",),
                "int8": ("m16n8k32", "m16n8k64"), "int4": ("m16n8k64", "m16n8k128")}
VARIANTS = ("sp", "sp::ordered_metadata")
_TYPES = ("f16", "bf16", "tf32", "f32", "e4m3", "e5m2", "s8", "u8", "s4", "u4", "s32")


@dataclasses.dataclass(frozen=True)
class SparseMma(Mma):
    """An ``mma.sp`` (``kind == "mma.sp"``) or ``wgmma.mma_async.sp`` (``kind == "wgmma"``)
    instruction; ``ordered``: ``::ordered_metadata``."""

    ordered: bool = False

    @property
    def bits(self) -> int:
        return ELEMENT_BITS[self.atype]

    @property
    def group(self) -> int:
        """Elements of a row of A per metadata group: 4 (2:4), 2 (tf32 1:2), 8 (4-bit 4:8)."""
        return {32: 2, 4: 8}.get(self.bits, 4)

    @property
    def kept(self) -> int:
        return self.group // 2

    @property
    def rbits(self) -> int:
        return L.row_bits(self.k, self.bits)

    @property
    def selectors(self) -> tuple[int, ...]:
        return L.SELECTORS[self.rbits]

    def dense_equivalent(self) -> Mma:
        """The dense MMA whose numerics the kept products take: K/2 products a row (a ``wgmma``'s
        for ``wgmma.mma_async.sp``)."""
        return Mma(self.spelling, self.kind, f"m1n{self.n}k{self.k // 2}", 1, self.n, self.k // 2, self.dtype,
                   self.atype, self.btype, self.ctype, satfinite=self.satfinite)


def parse_mma_sp(spelling: str) -> SparseMma:
    s, toks = split(spelling, "mma")
    if not toks or toks[0] not in VARIANTS:
        raise ValueError(f"{spelling!r}: a sparse MMA starts mma.sp or mma.sp::ordered_metadata")
    shapes = tuple(sorted({x for v in SPARSE_FORMS.values() for x in v}))
    q = Quals(s, toks[1:], {"sync": ("sync",), "aligned": ("aligned",), "layout": ("row", "col"),
                            "shape": shapes, "sat": ("satfinite",), "type": _TYPES}, True)
    check_sync(s, q)
    shape = q.one(s, "shape")
    if q.found["layout"] != ["row", "col"]:
        raise ValueError(f"{spelling!r}: mma.sp needs .row.col")
    types = q.found["type"]
    if len(types) != 4:
        raise ValueError(f"{spelling!r}: mma.sp needs four types .dtype.atype.btype.ctype, got {types}")
    d, a, b, c = types
    fam = _family(a, b, d, c)
    if fam is None:
        raise ValueError(f"{spelling!r}: .{'.'.join(types)} is not a valid mma.sp type combination; valid: "
                         ".f16.f16.f16.f16, .f32.f16.f16.f32, .f32.bf16.bf16.f32, .f32.tf32.tf32.f32, "
                         ".f32.{e4m3,e5m2}.{e4m3,e5m2}.f32, .s32.{s8,u8}.{s8,u8}.s32, .s32.{s4,u4}.{s4,u4}.s32")
    if shape not in SPARSE_FORMS[fam]:
        raise ValueError(f"{spelling!r}: .{shape} is not valid for {fam} mma.sp; valid: "
                         f"{', '.join('.' + v for v in SPARSE_FORMS[fam])}")
    sat = bool(q.found["sat"])
    if sat and fam not in ("int8", "int4"):
        raise ValueError(f"{spelling!r}: .satfinite is only valid for integer mma.sp")
    m, n, k = mnk(shape)
    return SparseMma(s, "mma.sp", shape, m, n, k, d, a, b, c, "row", "col", sat, ordered=toks[0] != "sp")


def parse_wgmma_sp(spelling: str) -> SparseMma:
    """``wgmma.mma_async.sp.sync.aligned.m64nNkK[.satfinite].dtype.atype.btype`` (sm_90a): the
    dense wgmma's types and N, twice its K (f16/bf16 32, tf32 16, e4m3/e5m2/s8/u8 64)."""
    s, toks = split(spelling, "wgmma.mma_async")
    if not toks or toks[0] != "sp":
        raise ValueError(f"{spelling!r}: a sparse wgmma starts wgmma.mma_async.sp")
    shapes = [t for t in toks[1:] if t.startswith("m64n")]
    q = Quals(s, [t for t in toks[1:] if t not in shapes],
              {"sync": ("sync",), "aligned": ("aligned",), "sat": ("satfinite",), "type": _TYPES})
    check_sync(s, q)
    if len(shapes) != 1:
        raise ValueError(f"{spelling!r}: wgmma.mma_async.sp needs one .m64nNkK shape")
    m, n, k = mnk(shapes[0])
    types = q.found["type"]
    if len(types) != 3:
        raise ValueError(f"{spelling!r}: wgmma.mma_async.sp needs .dtype.atype.btype")
    d, a, b = types
    fam = _family(a, b, d, d, wgmma=True)
    if fam not in ("f16", "bf16", "tf32", "fp8", "int8"):
        raise ValueError(f"{spelling!r}: .{d}.{a}.{b} is not a valid wgmma.mma_async.sp type combination; valid: "
                         ".f16.f16.f16, .f32.f16.f16, .f32.bf16.bf16, .f32.tf32.tf32, .f16/.f32 with e4m3/e5m2 "
                         "(any mix), .s32 with s8/u8 (any mix); no .b1")
    want_k = 2 * WGMMA_K[a]
    valid_n = WGMMA_INT_N if fam == "int8" else tuple(range(8, 257, 8))
    if k != want_k or n not in valid_n:
        raise ValueError(f"{spelling!r}: .m64n{n}k{k} is not a wgmma.mma_async.sp shape for .{a} (K = {want_k}, N = "
                         + ("8, 16, 24 or a multiple of 16 up to 256)" if fam == "int8" else "8..256 step 8)"))
    sat = bool(q.found["sat"])
    if sat and fam != "int8":
        raise ValueError(f"{spelling!r}: .satfinite is valid only with .s8/.u8 inputs")
    return SparseMma(s, "wgmma", shapes[0], m, n, k, d, a, b, d, satfinite=sat)


def _family(a, b, d, c, wgmma=False):
    if a in ("e4m3", "e5m2") and b in ("e4m3", "e5m2"):
        return "fp8" if d == c == "f32" or (d == c == "f16" and wgmma) else None
    if {a, b} <= {"s8", "u8"}:
        return "int8" if d == c == "s32" else None
    if {a, b} <= {"s4", "u4"}:
        return "int4" if d == c == "s32" else None
    if a == b == "f16":
        return "f16" if d == c and d in ("f16", "f32") else None
    if a == b and a in ("bf16", "tf32"):
        return a if d == c == "f32" else None
    return None


def positions(ins: SparseMma, metadata):
    """Dense columns (..., 16, K/2) of the compressed elements from value-level metadata (the
    column of each kept element inside its group)."""
    j = jnp.arange(ins.k // 2, dtype=jnp.int32)
    return (j // ins.kept) * ins.group + jnp.asarray(metadata).astype(jnp.int32)


def sign_bit(etype: str):
    """The sign bit of an element's bits (tf32: bit 31 of its float32 container)."""
    return jnp.uint32(1 << (31 if etype == "tf32" else ELEMENT_BITS[etype] - 1))


def sparse_mma_bits(ins: SparseMma, a, b, c, pos, model, *, arch, key=None, neg_b=False):
    """``D = sum_j A[r, j] B[pos[r, j], :] + C`` on encoded operands (``numerics.mma`` encodings):
    A (..., 16, K/2), B (..., K, N), C (..., 16, N), ``pos`` (..., 16, K/2), or for tf32 the
    halves of B each element reads (..., 16, K/2, 2) (:func:`tcemu._src.layouts.sparse.tf32_halves`).
    The kept products run as the dense MMA of K/2 (:meth:`SparseMma.dense_equivalent`), one per row
    of A; ``neg_b`` negates the B values read (``imm-scale-b`` = -1)."""
    eq = ins.dense_equivalent()
    if ins.bits == 32:  # tf32 B values are assembled from 16-bit halves (L.tf32_halves)
        units = pos if pos.ndim == a.ndim + 1 else jnp.stack([2 * pos, 2 * pos + 1], -1)
        halves = jnp.stack([b & 0xFFFF, b >> 16], -2).reshape(b.shape[:-2] + (-1, b.shape[-1]))
        lo, hi = (jnp.take_along_axis(halves[..., None, :, :], units[..., :, :, i, None], axis=-2) for i in (0, 1))
        bg = lo | (hi << 16)
    else:
        bg = jnp.take_along_axis(b[..., None, :, :], pos[..., :, :, None], axis=-2)  # (..., 16, K/2, N)
    bg = bg ^ sign_bit(ins.btype) if neg_b else bg
    d = mma_numerics.mma_bits_batched(eq, a[..., :, None, :], bg, c[..., :, None, :], model, arch=arch, key=key)
    return d[..., 0, :]


def sparse_fragments(ins: SparseMma):
    """(A, B, C, D) fragments: the compressed A is the dense m16n8k(K/2) A."""
    bits = ins.bits
    cb = ELEMENT_BITS[ins.ctype]
    fr = []
    for name, (lb, vb), rows, cols, b in (
            ("a", MMA[L.a_key(ins.k, bits)], 16, ins.k // 2, bits), ("b", L.b_layout(ins.k, bits), ins.k, 8, bits),
            ("c", MMA[("m16n8", "c", cb)], 16, 8, cb), ("d", MMA[("m16n8", "c", ELEMENT_BITS[ins.dtype])], 16, 8,
                                                         ELEMENT_BITS[ins.dtype])):
        nregs = (rows * cols * b) // (32 * 32)
        fr.append(Fragment(rows, cols, b, nregs, lb, vb, f"PTX ISA sparse mma {name} (compressed A)"))
    return tuple(fr)


def metadata_lanes(ins: SparseMma, selector: int) -> np.ndarray:
    """int32 (M, R, 2): the (lane, bit) of the metadata registers holding bit ``p`` of row ``r``'s
    metadata string (:func:`tcemu._src.layouts.sparse.metadata_table`); a warpgroup
    (``wgmma.mma_async.sp``, measured on an H200 and an H100) repeats the ``mma.sp`` table in
    each warp, rows ``16 w .. 16 w + 15`` in warp ``w``."""
    tab = L.metadata_table(ins.rbits, selector, L.unit_bits(ins.bits))
    warps = ins.m // 16
    return np.concatenate([tab + np.array([32 * w, 0], np.int32) for w in range(warps)]).astype(np.int32)


def register_positions(ins: SparseMma, e_words, selector: int):
    """Dense columns (M, K/2) from the (lanes,) metadata registers read with ``selector`` (tf32:
    the halves of B, (M, K/2, 2))."""
    tab = metadata_lanes(ins, selector)
    bit = (jnp.take(e_words, jnp.asarray(tab[..., 0])) >> jnp.asarray(tab[..., 1], jnp.uint32)) & 1
    idx = bit[:, 0::2] | (bit[:, 1::2] << 1)
    if ins.bits == 32:
        return L.tf32_halves(idx, xp=jnp)
    return L.dense_positions(idx, ins.bits, xp=jnp)


def sparse_metadata(spelling, metadata, selector: int = 0):
    """The metadata registers of ``mma.sp`` / ``wgmma.mma_async.sp`` holding value-level metadata.

    ``metadata`` (..., M, K/2) gives each kept element's column inside its group (what
    :func:`sparsify` returns); the result is uint32 (..., lanes): one register a lane (32 for
    ``mma.sp``, 128 for a warpgroup), laid out as the sparsity selector ``selector`` reads them,
    the lanes it does not read 0. The operand ``e`` / ``sp_meta`` at register level.

    >>> import numpy as np, tcemu
    >>> sp = "wgmma.mma_async.sp.sync.aligned.m64n8k32.f32.f16.f16"
    >>> meta = np.tile([0, 1, 2, 3], (64, 4))            # chunks (0, 1) and (2, 3)
    >>> e = tcemu.sparse_metadata(sp, meta, selector=1)
    >>> e.shape, hex(int(e[2])), hex(int(e[0]))          # lanes 2 and 3 of each quad (selector 1)
    ((128,), '0xe4e4e4e4', '0x0')
    """
    ins = spelling if isinstance(spelling, SparseMma) else _parse_sparse(spelling)
    if register_index(selector) is None or register_index(selector) not in ins.selectors:
        raise ValueError(f"sparse_metadata: selector must be one of {', '.join(map(str, ins.selectors))} for "
                         f"{ins.spelling}, got {selector!r}")
    md = np.asarray(metadata)
    if not np.issubdtype(md.dtype, np.integer) or md.ndim < 2 or md.shape[-2:] != (ins.m, ins.k // 2):
        raise ValueError(f"sparse_metadata: metadata must be an integer array (..., {ins.m}, {ins.k // 2}), got "
                         f"{md.dtype} {md.shape}")
    check_metadata(ins, md, "sparse_metadata")
    md = md.astype(np.uint64)
    if ins.bits == 32:  # a tf32 element fills its chunk: (0, 1) at column 0, (2, 3) at column 1
        idx = np.stack([2 * md, 2 * md + 1], -1).reshape(md.shape[:-1] + (-1,))
    elif ins.bits == 4:  # a pair of 4-bit elements is one unit
        idx = md[..., 0::2] // 2
    else:
        idx = md
    tab = metadata_lanes(ins, int(selector))
    lanes = 32 * ((ins.m + 15) // 16)
    out = np.zeros(md.shape[:-2] + (lanes,), np.uint64)
    bits = np.stack([idx & 1, idx >> 1], -1).reshape(idx.shape[:-1] + (-1,))  # (..., M, R)
    for r in range(tab.shape[0]):
        for p in range(tab.shape[1]):
            out[..., tab[r, p, 0]] |= bits[..., r, p] << np.uint64(tab[r, p, 1])
    return out.astype(np.uint32)


def _parse_sparse(spelling):
    if isinstance(spelling, str) and spelling.strip().startswith("wgmma"):
        return parse_wgmma_sp(spelling)
    return parse_mma_sp(spelling)


class MmaSpRegs(MmaRegs):
    """``f(regs, *, d, a, b, c, e, f=0, key=None) -> regs`` for ``mma.sp``: ``e`` the metadata
    register, ``f`` the sparsity selector (an immediate: 0..3, 0..1 or 0 by shape and type)."""

    def __init__(self, ins: SparseMma, arch, model=None):
        super().__init__(ins, arch, sparse_fragments(ins), model)
        self._impl = jax.jit(self._sparse, static_argnames=("d", "a", "b", "c", "e", "f"))

    def _sparse(self, regs, key, d, a, b, c, e, f):
        ins = self.ins
        A = _to_numeric(fragment_to_matrix(read_regs(regs, a), self.fa), ins.atype)
        B = _to_numeric(fragment_to_matrix(read_regs(regs, b), self.fb), ins.btype)
        C = _to_numeric(fragment_to_matrix(read_regs(regs, c), self.fc), ins.ctype)
        pos = register_positions(ins, regs[:, e], f)
        D = sparse_mma_bits(ins, A, B, C, pos, self.model, arch=self.arch, key=key)
        return write_regs(regs, d, matrix_to_fragment(_from_numeric(D, ins.dtype), self.fd))

    def __call__(self, regs, *, d, a, b, c, e, f=0, key=None):
        regs, key, args = self._checked(regs, key, d, a, b, c)
        if register_index(e) is None:
            raise TypeError(f"{self.spelling}: e= (the metadata register) must be one integer register index, "
                            f"got {e!r}")
        (e_,) = register_indices(self.spelling, "e", [e], 1, regs.shape[1])
        fv = register_index(f)
        if fv is None or fv not in self.ins.selectors:
            raise ValueError(f"{self.spelling}: f (the sparsity selector) must be one of "
                             f"{', '.join(map(str, self.ins.selectors))} for this shape and type, got {f!r}")
        return self._impl(regs, key, e=e_, f=fv, **args)


def check_metadata(ins: SparseMma, metadata, what: str) -> None:
    """Concrete value-level metadata: integers in range, distinct in each group (increasing for
    ``::ordered_metadata``); 4-bit: in pairs ``(2u, 2u + 1)``."""
    if isinstance(metadata, jax.core.Tracer):
        return
    md = np.asarray(metadata).astype(np.int64)
    g, kept = ins.group, ins.kept
    if md.size and (md.min() < 0 or md.max() >= g):
        raise ValueError(f"{what}: metadata holds {md.min() if md.min() < 0 else md.max()}; each kept "
                         f"element's column inside its group of {g} must be 0..{g - 1}")
    grp = md.reshape(md.shape[:-1] + (-1, kept))
    starts, need = grp, "increasing (::ordered_metadata)" if ins.ordered else "distinct"
    bad = np.zeros(grp.shape[:-1], bool)
    if ins.bits == 4:  # kept in pairs: (2u, 2u + 1), (2v, 2v + 1)
        starts = grp[..., 0::2]
        bad |= np.any((starts % 2 != 0) | (grp[..., 1::2] != starts + 1), axis=-1)
        need += " pairs (2u, 2u + 1)"
    if ins.ordered:
        bad |= np.any(np.diff(starts, axis=-1) <= 0, axis=-1)
    else:
        srt = np.sort(starts, axis=-1)
        bad |= np.any(srt[..., 1:] == srt[..., :-1], axis=-1)
    where = np.argwhere(bad)
    if len(where):
        *batch, r, gi = where[0]
        at = f" (batch index {tuple(int(x) for x in batch)})" if batch else ""
        raise ValueError(f"{what}: metadata row {r}, group {gi}{at} is {grp[tuple(where[0])].tolist()}; "
                         f"the columns kept in a group must be {need}")


def sparsify(dense, spelling: str):
    """Compress a structured-sparse A for ``mma.sp``: ``(compressed, metadata)``.

    ``dense`` (..., M, K) holds at most 2 nonzeros in every group of 4 columns (1 in 2 for tf32;
    for s4/u4, 2 nonzero pairs of columns ``(2u, 2u + 1)`` in every 8). ``compressed`` (..., M,
    K/2) keeps, per group, its nonzeros in column order (padded with the group's first zero
    columns where it has fewer); ``metadata`` (..., M, K/2, int8) gives each kept element's
    column inside its group: the ``a`` and ``metadata=`` of :func:`tcemu.mma`. A group with too
    many nonzeros raises a ValueError naming its row and columns.

    >>> import numpy as np, tcemu
    >>> sp = "mma.sp::ordered_metadata.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"
    >>> a = np.zeros((16, 16), np.float16); a[:, 1] = 1; a[:, 3] = 2; a[:, 4] = 3   # 2:4 sparse
    >>> comp, meta = tcemu.sparsify(a, sp)
    >>> comp[0, :4].tolist(), meta[0, :4].tolist()
    ([1.0, 2.0, 3.0, 0.0], [1, 3, 0, 1])
    >>> b = np.ones((16, 8), np.float16); c = np.zeros((16, 8), np.float32)
    >>> float(tcemu.mma(sp, comp, b, c, metadata=meta, arch="H100")[0, 0])    # 1 + 2 + 3
    6.0
    >>> a[2, 8:12] = 1
    >>> tcemu.sparsify(a, sp)
    Traceback (most recent call last):
    ...
    ValueError: sparsify: row 2, group 2 (columns 8..11) has 4 nonzeros; mma.sp .f16 keeps at most 2 in every 4 columns
    """
    ins = spelling if isinstance(spelling, SparseMma) else _parse_sparse(spelling)
    if isinstance(dense, jax.core.Tracer):
        raise TypeError("sparsify: dense must be a concrete array (it picks columns from the values), not traced")
    x = np.asarray(dense)
    g = ins.group
    if x.ndim < 2 or x.shape[-1] % g:
        raise ValueError(f"sparsify: dense must be (..., M, K) with K a multiple of {g} for mma.sp .{ins.atype}, "
                         f"got shape {x.shape}")
    pair = 2 if ins.bits == 4 else 1  # 4-bit: units are pairs of columns
    nz = (x != 0).reshape(x.shape[:-1] + (-1, g // pair, pair)).any(-1)  # (..., M, groups, units)
    units = g // pair
    count = nz.sum(-1)
    over = np.argwhere(count > units // 2)
    if len(over):
        *batch, r, gi = (int(v) for v in over[0])
        at = f" (batch index {tuple(batch)})" if batch else ""
        what = "nonzero pairs" if pair == 2 else "nonzeros"
        raise ValueError(f"sparsify: row {r}, group {gi} (columns {gi * g}..{gi * g + g - 1}){at} has "
                         f"{int(count[tuple(over[0])])} {what}; mma.sp .{ins.atype} keeps at most {units // 2} "
                         f"{'pairs ' if pair == 2 else ''}in every {g} columns")
    u = np.arange(units)
    keep = np.sort(np.argsort(np.where(nz, u, u + units), axis=-1, kind="stable")[..., :units // 2], axis=-1)
    cols = (keep[..., :, None] * pair + np.arange(pair)).reshape(keep.shape[:-1] + (-1,))  # (..., M, groups, kept)
    meta = cols.reshape(x.shape[:-1] + (-1,))
    absolute = cols + (np.arange(cols.shape[-2]) * g)[:, None]
    comp = np.take_along_axis(x, absolute.reshape(meta.shape), axis=-1)
    return comp, meta.astype(np.int8)
