"""wmma.load / wmma.store.d / wmma.mma as pure, jit-compiled functions over a warp's registers.

A warp's registers are a ``uint32`` array ``regs`` of shape ``(32, nregs)`` (lane x register);
memory is a 1-D ``uint8`` array. Contracts (public)::

    load:  f(regs, mem, *, dst, p, stride=None) -> regs
    store: f(mem, regs, *, src, p, stride=None) -> mem
    mma:   f(regs, *, d, a, b, c) -> regs

``dst``/``src``/``a``/``b``/``c``/``d`` are register indices in fragment order (PTX ``{x0, ...}``);
a ``.f64`` element takes two consecutive registers, low word first. ``p`` (byte address) and
``stride`` (elements) may be traced. Concrete values are checked against the PTX alignment rules
("Matrix Storage for WMMA") and against the size of ``mem``; traced values cannot be checked:
misaligned addresses are then used as given, and out-of-range bytes read as zero / are dropped.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from tcemu._src import memory as memmod
from tcemu._src.arch import Arch
from tcemu._src.numerics.mma import check_key
from tcemu._src.isa import wmma_spec as S
from tcemu._src.isa.parse import ELEMENT_BITS, Mma, Unsupported, WmmaLoad, WmmaStore
from tcemu._src.layouts.fragment import Fragment
from tcemu._src.layouts import wmma as wmma_layouts
from tcemu._src.numerics import mma as mma_numerics

_U32 = jnp.uint32


def wmma_fragment(arch: Arch, shape: str, matrix: str, etype: str, layout: str) -> Fragment:
    """The measured (sm_75+) or published (sm_70) fragment of one wmma operand."""
    mat = "c" if matrix == "d" else matrix
    rows, cols = S.matrix_dims(shape, mat)
    nregs = S.FRAGMENT_REGS[(shape, mat, etype)]
    if arch.sm < 75:
        key = (shape, mat, etype, layout)
        if key not in wmma_layouts.SM70:
            raise ValueError(f"no Volta (sm_70) wmma layout for {shape} {mat} .{etype}")
        lb, vb = wmma_layouts.SM70[key]
        src = "sm_70 (published: PTX m8n8k4 + Raihan et al. 2019, checked against ptxas 12.4)"
    else:
        lb, vb = wmma_layouts.SM75[(shape, mat, etype)]
        src = "sm_75+ (measured on H200)"
    return Fragment(rows, cols, S.ELEMENT_BITS[etype], nregs, lb, vb, src)


# ---------------------------------------------------------------------------------------------
# fragments <-> matrices


def _first_holders(frag: Fragment):
    """For every element (row, col): the first (lane, value) holding it."""
    flat = (frag.coords[..., 0] * frag.cols + frag.coords[..., 1]).ravel()
    _, first = np.unique(flat, return_index=True)
    lane, v = np.divmod(first, frag.nvalues)
    return lane.reshape(frag.rows, frag.cols), v.reshape(frag.rows, frag.cols)


def fragment_to_matrix(words, frag: Fragment):
    """(32, nregs) uint32 fragment registers -> (rows, cols) element bits (uint32, or (lo, hi))."""
    lane, v = _first_holders(frag)
    if frag.bits == 64:
        return words[lane, 2 * v], words[lane, 2 * v + 1]
    reg, slot = np.divmod(v, frag.per_reg)
    val = words[lane, reg] >> (slot * frag.bits).astype(np.uint32)
    return val & _U32((1 << frag.bits) - 1) if frag.bits < 32 else val


def matrix_to_fragment(vals, frag: Fragment):
    """(rows, cols) element bits (uint32, or (lo, hi) for 64-bit) -> (32, nregs) registers."""
    r, c = frag.coords[..., 0], frag.coords[..., 1]
    if frag.bits == 64:
        return pack_values((vals[0][r, c], vals[1][r, c]), frag)
    return pack_values(vals[r, c], frag)


def pack_values(vals, frag: Fragment):
    """(32, nvalues) element bits (or a (lo, hi) pair for 64-bit) -> (32, nregs) registers."""
    if frag.bits == 64:
        return jnp.stack(vals, -1).reshape(32, frag.nregs)
    per = frag.per_reg
    v = vals.reshape(32, frag.nregs, per).astype(_U32)
    if frag.bits < 32:
        v = v & _U32((1 << frag.bits) - 1)
    shifts = jnp.asarray(np.arange(per, dtype=np.uint32) * frag.bits)
    return jnp.sum(v << shifts, axis=-1, dtype=_U32)  # disjoint bit fields: sum == or


def unpack_values(words, frag: Fragment):
    """(32, nregs) registers -> (32, nvalues) element bits (or a (lo, hi) pair for 64-bit)."""
    if frag.bits == 64:
        w = words.reshape(32, frag.nvalues, 2)
        return w[..., 0], w[..., 1]
    shifts = jnp.asarray(np.arange(frag.per_reg, dtype=np.uint32) * frag.bits)
    v = words[:, :, None] >> shifts
    return (v & _U32((1 << frag.bits) - 1) if frag.bits < 32 else v).reshape(32, frag.nvalues)


# ---------------------------------------------------------------------------------------------
# validation helpers


def _register_index(i):
    """``i`` as an int if it is a concrete integer (Python, NumPy or 0-d array), else None."""
    if memmod.is_integer_value(i):
        return int(i)
    if isinstance(i, (jax.Array, np.ndarray)) and i.ndim == 0 and np.issubdtype(i.dtype, np.integer):
        return memmod.concrete_int(i)
    return None


def register_indices(spelling, name, idx, n, nregs):
    """Validated register indices (a tuple of ints) of a fragment of ``n`` registers out of ``nregs``."""
    if isinstance(idx, (str, bytes)) or not hasattr(idx, "__iter__"):
        raise TypeError(f"{spelling}: {name}= must be a sequence of integer register indices, got {idx!r}")
    t = []
    for i in idx:
        v = _register_index(i)
        if v is None:
            raise TypeError(f"{spelling}: {name}= must hold concrete integer register indices, "
                            f"got {i!r} ({type(i).__name__})")
        t.append(v)
    if len(t) != n:
        raise ValueError(f"{spelling}: {name}= needs {n} registers for this fragment, got {len(t)}")
    bad = [i for i in t if not 0 <= i < nregs]
    if bad:
        raise ValueError(f"{spelling}: {name}= registers {bad} out of range 0..{nregs - 1}")
    if len(set(t)) != len(t):
        raise ValueError(f"{spelling}: {name}= names a register twice: {tuple(t)}")
    return tuple(t)


def check_regs(spelling, regs):
    """``regs`` as a (32, nregs) uint32 JAX array, or a clear error naming it."""
    if not isinstance(regs, (jax.Array, np.ndarray)):
        raise TypeError(f"{spelling}: regs must be a (32, nregs) uint32 array (tcemu.regfile), "
                        f"got {type(regs).__name__}")
    if regs.dtype != np.uint32:
        raise TypeError(f"{spelling}: regs must be uint32 (tcemu.regfile), got dtype {regs.dtype}")
    if regs.ndim != 2 or regs.shape[0] != 32 or regs.shape[1] < 1:
        raise ValueError(f"{spelling}: regs must have shape (32, nregs) (use jax.vmap for many warps), "
                         f"got {tuple(regs.shape)}")
    return jnp.asarray(regs)


class Instruction:
    def __init__(self, ins, arch: Arch):
        self.ins = ins
        self.arch = arch
        self.spelling = ins.spelling

    def __repr__(self):
        return f"<tcemu {self.spelling} arch={self.arch}>"


class _WmmaMemoryOp(Instruction):
    """Shared part of wmma.load and wmma.store: fragment, addresses, PTX alignment rules."""

    def __init__(self, ins, arch):
        super().__init__(ins, arch)
        for t, need in ((ins.etype, S.MIN_SM_FOR_TYPE[ins.etype]), (ins.shape, S.MIN_SM_FOR_SHAPE.get(ins.shape, 70))):
            if arch.sm < need:
                raise ValueError(f"{ins.spelling!r}: .{t} wmma requires sm_{need} or newer, not {arch}")
        self.fragment = wmma_fragment(arch, ins.shape, ins.matrix, ins.etype, ins.layout)
        self.bits = ELEMENT_BITS[ins.etype]
        self.default_stride = S.default_stride(ins.shape, ins.matrix, ins.layout)
        # PTX: rows (.row) / columns (.col) start at a multiple of the fragment size. For f16
        # m32n8k16 B.row and m8n32k16 A.col the (4x replicated) fragment is 32 bytes but the default
        # stride is 16 bytes, so the rule is read as: a multiple of min(fragment, default row).
        self.alignment = min(S.fragment_bytes(ins.shape, ins.matrix, ins.etype),
                             self.default_stride * self.bits // 8)
        self.nregs = self.fragment.nregs

    def _check_address(self, mem, p, stride):
        """Types, stride >= default, alignment (Matrix Storage for WMMA) and the memory's bounds.
        Returns (p, stride), concrete ints where known."""
        sp = self.spelling
        fb = self.alignment
        p = memmod.scalar_int(p, "p", sp)
        stride = self.default_stride if stride is None else memmod.scalar_int(stride, "stride", sp)
        if isinstance(p, int) and p < 0:
            raise IndexError(f"{sp}: p={p} is a negative address")
        if isinstance(p, int) and p % fb:
            raise ValueError(f"{sp}: p={p} must be a multiple of {fb} bytes (row alignment of this fragment)")
        rows, cols = self.fragment.rows, self.fragment.cols
        if isinstance(stride, int):
            if stride < self.default_stride:
                raise ValueError(f"{sp}: stride={stride} is below the default {self.default_stride} "
                                 "(the minimum; smaller is undefined in PTX)")
            if (stride * self.bits) % (8 * fb):
                raise ValueError(f"{sp}: stride={stride} elements ({stride * self.bits / 8:g} bytes) must be a "
                                 f"multiple of {fb} bytes (row alignment of this fragment)")
            memmod.check_range(mem, p, memmod.extent_bytes(rows, cols, self.bits, self.ins.layout, stride), sp)
        else:  # traced stride: at least the first row (column) is read
            first = (1, cols) if self.ins.layout == "row" else (rows, 1)
            memmod.check_range(mem, p, memmod.extent_bytes(*first, self.bits, self.ins.layout, 0), sp)
        return p, stride

    def _lead_inner(self):
        r, c = self.fragment.coords[..., 0], self.fragment.coords[..., 1]
        return memmod.lead_inner(r, c, self.ins.layout)


class WmmaLoad_(_WmmaMemoryOp):
    """``f(regs, mem, *, dst, p, stride=None) -> regs``."""

    def __init__(self, ins: WmmaLoad, arch):
        super().__init__(ins, arch)
        self._impl = jax.jit(self._load, static_argnames=("dst",))

    def _load(self, regs, mem, p, stride, dst):
        vals = memmod.read(mem, p, *self._lead_inner(), stride, self.bits)
        return regs.at[:, list(dst)].set(pack_values(vals, self.fragment))

    def __call__(self, regs, mem, *, dst, p, stride=None):
        regs = check_regs(self.spelling, regs)
        mem = memmod.check_mem(mem, self.spelling)
        dst = register_indices(self.spelling, "dst", dst, self.nregs, regs.shape[1])
        p, stride = self._check_address(mem, p, stride)
        return self._impl(regs, mem, p, stride, dst=dst)


class WmmaStore_(_WmmaMemoryOp):
    """``f(mem, regs, *, src, p, stride=None) -> mem``."""

    def __init__(self, ins: WmmaStore, arch):
        super().__init__(ins, arch)
        self._impl = jax.jit(self._store, static_argnames=("src",))

    def _store(self, mem, regs, p, stride, src):
        vals = unpack_values(regs[:, list(src)], self.fragment)
        return memmod.write(mem, p, *self._lead_inner(), stride, vals, self.bits)

    def __call__(self, mem, regs, *, src, p, stride=None):
        regs = check_regs(self.spelling, regs)
        mem = memmod.check_mem(mem, self.spelling)
        src = register_indices(self.spelling, "src", src, self.nregs, regs.shape[1])
        p, stride = self._check_address(mem, p, stride)
        return self._impl(mem, regs, p, stride, src=src)


# ---------------------------------------------------------------------------------------------
# register-level MMA (wmma.mma; mma.sync shares it through its own fragments)


def _to_numeric(bits, etype, packed=False):
    """Element bits -> the encoding of ``numerics.mma.mma_bits`` for integer/f64 types, and the
    codes of fp6/fp4 elements: PTX places an e2m1 in bits 5:2 of its 8-bit container and an
    e3m2/e2m3 in bits 5:0 (the padding bits are not read); packed e2m1 is the whole nibble."""
    if etype == "e2m1":
        return bits & 0xF if packed else (bits >> 2) & 0xF
    if etype in ("e3m2", "e2m3"):
        return bits & 0x3F
    if etype == "f64":
        lo, hi = bits
        return lo.astype(jnp.uint64) | (hi.astype(jnp.uint64) << 32)
    if etype in ("s8", "s4"):
        w = ELEMENT_BITS[etype]
        return (bits.astype(jnp.int32) << (32 - w)) >> (32 - w)
    if etype in ("u8", "u4", "b1", "s32"):
        return bits.astype(jnp.int32) if etype != "s32" else jax.lax.bitcast_convert_type(bits, jnp.int32)
    return bits


def _from_numeric(vals, etype):
    if etype == "f64":
        v = vals.astype(jnp.uint64)
        return (v & 0xFFFFFFFF).astype(_U32), (v >> 32).astype(_U32)
    if etype == "s32":
        return jax.lax.bitcast_convert_type(vals.astype(jnp.int32), _U32)
    return vals.astype(_U32)


class MmaRegs(Instruction):
    """``f(regs, *, d, a, b, c, key=None) -> regs`` for an MMA with fragments ``fa``, ``fb``, ``fc``,
    ``fd``; ``key`` is a PRNG key for models with stochastic rounding."""

    def __init__(self, ins: Mma, arch, fragments, model=None):
        super().__init__(ins, arch)
        mma_numerics.check_arch(ins, arch)
        self.fa, self.fb, self.fc, self.fd = fragments
        if ins.family not in ("int", "b1", "f64"):
            self.model = mma_numerics.resolve_model(ins, model, arch)
        else:
            self.model = None
        self._impl = jax.jit(self._mma, static_argnames=("d", "a", "b", "c"))

    def _mma(self, regs, key, d, a, b, c, scales=None):
        ins = self.ins
        packed = self.fa.bits == 4 and ins.atype == "e2m1"
        A = _to_numeric(fragment_to_matrix(regs[:, list(a)], self.fa), ins.atype, packed)
        B = _to_numeric(fragment_to_matrix(regs[:, list(b)], self.fb), ins.btype, packed)
        C = _to_numeric(fragment_to_matrix(regs[:, list(c)], self.fc), ins.ctype)
        if self.fa.rows == 4 * ins.m:  # m8n8k4 .f16: four independent quad-pair MMAs, stacked
            A = A.reshape(4, ins.m, ins.k)
            B = jnp.moveaxis(B.reshape(ins.k, 4, ins.n), 1, 0)
            C = C.reshape(4, ins.m, ins.n)
        sa, sb = scales if scales is not None else (None, None)
        D = mma_numerics.mma_bits(ins, A, B, C, self.model, arch=self.arch, key=key, scale_a=sa, scale_b=sb,
                                  over_devices=True)
        D = D.reshape(self.fd.rows, self.fd.cols)
        return regs.at[:, list(d)].set(matrix_to_fragment(_from_numeric(D, ins.dtype), self.fd))

    def _checked(self, regs, key, d, a, b, c):
        """(regs, key, fragment register indices) validated."""
        regs = check_regs(self.spelling, regs)
        key = check_key(key, self.spelling)
        given = {"d": d, "a": a, "b": b, "c": c}
        frags = {"d": self.fd, "a": self.fa, "b": self.fb, "c": self.fc}
        return regs, key, {n: register_indices(self.spelling, n, given[n], frags[n].nregs, regs.shape[1]) for n in given}

    def __call__(self, regs, *, d, a, b, c, key=None):
        regs, key, args = self._checked(regs, key, d, a, b, c)
        if self.ins.family == "f64":
            from tcemu._src.numerics.fma64 import require_x64

            require_x64(f"{self.spelling!r}")
        return self._impl(regs, key, **args)


# Block-scale selectors of mma.sync (PTX ISA "Warp-level matrix multiply with block scaling",
# Table 37): valid byte-id per scale_vec; thread-id-a picks a lane pair of each quad, thread-id-b a lane.
_BYTE_IDS = {1: (0, 1, 2, 3), 2: (0, 2), 4: (0,)}


class MmaBlockScaleRegs(MmaRegs):
    """``f(regs, *, d, a, b, c, scale_a, scale_b, byte_id_a=0, thread_id_a=0, byte_id_b=0,
    thread_id_b=0)`` for ``mma.sync ... .block_scale`` (sm_120): ``scale_a``/``scale_b`` are the
    registers of ``scale-a-data``/``scale-b-data``, the selectors the immediates of
    ``{byte-id-a, thread-id-a}`` and ``{byte-id-b, thread-id-b}``.

    Which lanes supply the scales (PTX ISA text, and the layout CUTLASS ``SM120_16x8x*_TN_VS``
    ``SFALayout``/``SFBLayout`` and MMA-Sim's kernels use): row ``r`` of A takes lane
    ``4 (r % 8) + 2 thread-id-a + r // 8``, column ``n`` of B lane ``4 n + thread-id-b``; scale
    ``j`` (the K block ``j``) is byte ``byte-id + j`` of that lane's register, byte 0 the least
    significant.
    """

    def __init__(self, ins: Mma, arch, fragments, model=None):
        super().__init__(ins, arch, fragments, model)
        self._impl = jax.jit(self._scaled, static_argnames=("d", "a", "b", "c", "sel"))

    def _scaled(self, regs, key, d, a, b, c, sel):
        sa, sb, bida, tida, bidb, tidb = sel
        S = self.ins.scale_vec
        j = jnp.arange(S, dtype=_U32)
        r = jnp.arange(16)
        wa = regs[4 * (r % 8) + 2 * tida + r // 8, sa]
        wb = regs[4 * jnp.arange(8) + tidb, sb]
        scale_a = (wa[:, None] >> (8 * (bida + j))[None, :]) & 0xFF  # (16, S)
        scale_b = (wb[None, :] >> (8 * (bidb + j))[:, None]) & 0xFF  # (S, 8)
        return self._mma(regs, key, d, a, b, c, scales=(scale_a, scale_b))

    def __call__(self, regs, *, d, a, b, c, scale_a, scale_b, byte_id_a=0, thread_id_a=0, byte_id_b=0,
                 thread_id_b=0, key=None):
        regs, key, args = self._checked(regs, key, d, a, b, c)
        regs_s = [register_indices(self.spelling, n, [v] if _register_index(v) is not None else v, 1, regs.shape[1])[0]
                  for n, v in (("scale_a", scale_a), ("scale_b", scale_b))]
        S = self.ins.scale_vec
        sels = []
        for name, v, valid in (("byte_id_a", byte_id_a, _BYTE_IDS[S]), ("thread_id_a", thread_id_a, (0, 1)),
                               ("byte_id_b", byte_id_b, _BYTE_IDS[S]), ("thread_id_b", thread_id_b, (0, 1, 2, 3))):
            iv = _register_index(v)
            if iv is None or iv not in valid:
                raise ValueError(f"{self.spelling}: {name} must be one of {', '.join(map(str, valid))} with "
                                 f".scale_vec::{S}X, got {v!r}")
            sels.append(iv)
        return self._impl(regs, key, sel=(regs_s[0], regs_s[1], *sels), **args)


@functools.lru_cache(maxsize=None)
def mma_sync_fragments(ins: Mma):
    """PTX-specified mma.sync fragments (A, B, C, D) of ``ins``."""
    from tcemu._src.layouts.mma import MMA, QUAD_PAIR

    bits = ELEMENT_BITS
    if ins.shape == "m8n8k4" and ins.atype == "f16":
        mk = lambda key, rows, cols, b, nregs: Fragment(rows, cols, b, nregs, *QUAD_PAIR[key],  # noqa: E731
                                                        "PTX ISA mma.m8n8k4 .f16 (4 quad-pair MMAs)")
        return (mk(("a", ins.alayout), 32, 4, 16, 2), mk(("b", ins.blayout), 4, 32, 16, 2),
                mk(("c", ins.ctype), 32, 8, bits[ins.ctype], 4 if ins.ctype == "f16" else 8),
                mk(("c", ins.dtype), 32, 8, bits[ins.dtype], 4 if ins.dtype == "f16" else 8))
    cshape = f"m{ins.m}n{ins.n}"
    if ins.family == "mxf4":  # packed e2m1: two per byte, the s4 layout of m16n8k64
        bits = {**bits, "e2m1": 4}
    out = []
    for mat, et, key in (("a", ins.atype, (ins.shape, "a", bits[ins.atype])),
                         ("b", ins.btype, (ins.shape, "b", bits[ins.btype])),
                         ("c", ins.ctype, (cshape, "c", bits[ins.ctype])),
                         ("c", ins.dtype, (cshape, "c", bits[ins.dtype]))):
        if key not in MMA:
            raise Unsupported(f"{ins.spelling!r}: no register-level layout for {key} yet "
                                      "(mma.sync .m8n8k4 .f16 and f64 .m16n8kK are value level only)")
        lb, vb = MMA[key]
        rows, cols = {"a": (ins.m, ins.k), "b": (ins.k, ins.n), "c": (ins.m, ins.n)}[mat]
        nvals = 1 << len(vb)
        nregs = nvals * bits[et] // 32 if bits[et] <= 32 else 2 * nvals
        out.append(Fragment(rows, cols, bits[et], nregs, lb, vb, "PTX ISA mma.sync fragments"))
    return tuple(out)


@functools.lru_cache(maxsize=None)
def wmma_mma_fragments(arch: Arch, ins: Mma):
    return (wmma_fragment(arch, ins.shape, "a", ins.atype, ins.alayout),
            wmma_fragment(arch, ins.shape, "b", ins.btype, ins.blayout),
            wmma_fragment(arch, ins.shape, "c", ins.ctype, "row"),
            wmma_fragment(arch, ins.shape, "c", ins.dtype, "row"))
