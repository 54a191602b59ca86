"""``wgmma.mma_async`` (sm_90a) at register level: a warpgroup's registers and shared memory read
through 64-bit matrix descriptors.

Contracts (public)::

    wgmma.mma_async: f(regs, smem, *, d, b_desc, a=None, a_desc=None, scale_d=1, imm_scale_a=1,
                       imm_scale_b=1, tnsp_a=0, tnsp_b=0, key=None) -> regs
    wgmma.fence / commit_group: f(regs) -> regs;  wgmma.wait_group: f(regs, n) -> regs

``regs`` is the warpgroup's ``(128, nregs)`` uint32 register file (``tcemu.regfile(nregs,
lanes=128)``; lane ``32 w + l`` is lane ``l`` of warp ``w``), ``smem`` a 1-D uint8 array standing
for shared memory, indexed by shared-window address. A comes from the registers ``a`` (4 of them)
or from the descriptor ``a_desc``; B from ``b_desc``. Descriptors are 64-bit integers
(:func:`wgmma_descriptor`) and must be concrete: they fix the layout, which is checked against
``smem`` when the instruction is called. The layouts are :mod:`tcemu._src.layouts.wgmma`.
``scale_d`` (0 or 1, may be traced) drops C; ``imm_scale_a``/``imm_scale_b`` (1 or -1) negate A/B
(floating-point types); ``tnsp_a``/``tnsp_b`` (0 or 1, 16-bit types) read the operand MN-major.
The ordering instructions do nothing to the values: tcemu runs each wgmma to completion.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from tcemu._src import formats as fm
from tcemu._src import memory as memmod
from tcemu._src.checks import check_key
from tcemu._src.formats import ELEMENT_BITS
from tcemu._src.isa.fragments import fragment_to_matrix, matrix_to_fragment
from tcemu._src.isa.instructions import Mma, WgmmaSync
from tcemu._src.isa.mma_regs import _from_numeric, _to_numeric
from tcemu._src.isa.parse_mma import WGMMA_K as _K
from tcemu._src.isa.registers import Instruction, check_regs, read_regs, register_index, register_indices, write_regs
from tcemu._src.layouts import wgmma as L
from tcemu._src.layouts.fragment import Fragment
from tcemu._src.numerics import mma as mma_numerics

_U32 = jnp.uint32
_FIELD_MAX = (1 << 14) * 16  # start, LBO and SBO: 14 bits of (bytes >> 4)


@dataclasses.dataclass(frozen=True)
class WgmmaDescriptor:
    """The fields of a wgmma shared-memory matrix descriptor (PTX ISA "Matrix Descriptor Format").

    ``start``, ``lbo`` (leading dimension byte offset) and ``sbo`` (stride dimension byte offset)
    are byte counts, multiples of 16 below 2**18; ``swizzle`` is "none", "32B", "64B" or "128B";
    ``base_offset`` (0..7) is the row phase of a swizzle pattern that does not start at the start
    address. :meth:`encode` gives the 64-bit descriptor, :meth:`decode` reads one.

    >>> import tcemu
    >>> d = tcemu.WgmmaDescriptor(start=1024, lbo=16, sbo=1024, swizzle="128B")
    >>> hex(d.encode())
    '0x4000004000010040'
    >>> tcemu.WgmmaDescriptor.decode(d.encode()) == d
    True
    """

    start: int
    lbo: int
    sbo: int
    swizzle: str = "none"
    base_offset: int = 0

    def __post_init__(self):
        for name in ("start", "lbo", "sbo"):
            v = getattr(self, name)
            if not memmod.is_integer_value(v):
                raise TypeError(f"WgmmaDescriptor: {name} must be an integer byte count, got {v!r}")
            if v % 16 or not 0 <= v < _FIELD_MAX:
                raise ValueError(f"WgmmaDescriptor: {name} must be a multiple of 16 in 0..{_FIELD_MAX - 16} "
                                 f"(the descriptor keeps bytes >> 4 in 14 bits), got {v}")
            object.__setattr__(self, name, int(v))
        if self.swizzle not in L.SWIZZLES:
            raise ValueError(f"WgmmaDescriptor: swizzle must be one of {', '.join(map(repr, L.SWIZZLES))}, "
                             f"got {self.swizzle!r}")
        if not memmod.is_integer_value(self.base_offset) or not 0 <= self.base_offset <= 7:
            raise ValueError(f"WgmmaDescriptor: base_offset must be an integer 0..7, got {self.base_offset!r}")
        object.__setattr__(self, "base_offset", int(self.base_offset))

    def encode(self) -> int:
        """The 64-bit descriptor as a Python int."""
        vals = {"start": self.start >> 4, "lbo": self.lbo >> 4, "sbo": self.sbo >> 4,
                "base_offset": self.base_offset, "swizzle": L.SWIZZLES.index(self.swizzle)}
        return sum(vals[name] << first for name, first, _, _ in L.DESCRIPTOR_FIELDS)

    @classmethod
    def decode(cls, desc) -> "WgmmaDescriptor":
        """The fields of a 64-bit descriptor (a Python or NumPy integer); bits outside the fields
        must be zero."""
        if isinstance(desc, WgmmaDescriptor):
            return desc
        if not memmod.is_integer_value(desc):
            raise TypeError(f"a wgmma descriptor must be a concrete integer (64 bits) or a tcemu.WgmmaDescriptor, "
                            f"got {type(desc).__name__}: descriptors fix the layout, so they cannot be traced")
        v = int(desc)
        if not 0 <= v < 1 << 64:
            raise ValueError(f"a wgmma descriptor is a 64-bit unsigned integer, got {v}")
        used = sum(((1 << w) - 1) << first for _, first, w, _ in L.DESCRIPTOR_FIELDS)
        if v & ~used:
            raise ValueError(f"wgmma descriptor {v:#018x}: bits {v & ~used:#018x} lie outside its fields "
                             "(start 0-13, LBO 16-29, SBO 32-45, base offset 49-51, swizzle 62-63) and must be 0")
        f = {name: ((v >> first) & ((1 << w) - 1)) * unit for name, first, w, unit in L.DESCRIPTOR_FIELDS}
        return cls(f["start"], f["lbo"], f["sbo"], L.SWIZZLES[f["swizzle"]], f["base_offset"])

    def addresses(self, rows: int, k: int, bits: int, mn_major: bool) -> np.ndarray:
        """int64 (rows, k): the shared-memory byte address of the first byte of element (r, k)."""
        off = L.smem_offsets(rows, k, bits, mn_major, self.swizzle, self.lbo, self.sbo)
        return L.swizzle_address(self.start + off, self.swizzle, self.base_offset)

    def put(self, smem, x, etype: str, *, operand: str, tnsp: int = 0, sparse: bool = False):
        """``smem`` with the wgmma operand ``x`` written where this descriptor reads it: A
        (64, K) or B (K, N), typed (float16, bfloat16, float32 for tf32, float8, int8/uint8; b1:
        0/1 integers); ``tnsp=1``: MN-major (16-bit types); ``sparse=True``: an operand of
        ``wgmma.mma_async.sp`` (B has twice the K; the compressed A is the dense A). What a TMA
        load with this swizzle leaves in shared memory.

        >>> import numpy as np, tcemu
        >>> desc = tcemu.WgmmaDescriptor(start=0, lbo=16, sbo=1024, swizzle="128B")
        >>> b = np.arange(16 * 64).reshape(16, 64).astype(np.float16)
        >>> smem = desc.put(tcemu.memory(8192), b, "f16", operand="b")
        >>> bool((desc.get(smem, "f16", operand="b", n=64) == b).all())
        True
        """
        rows, k, bits, addr = self._operand(operand, etype, tnsp, smem, sparse, shape=jnp.shape(x))
        xb = jnp.asarray(fm.to_bits(x, etype)).astype(_U32)
        xb = (xb.T if operand == "b" else xb) & _U32((1 << bits) - 1 if bits < 32 else 0xFFFFFFFF)
        if bits == 1:  # eight elements a byte, element 0 in the least significant bit
            xb = jnp.sum(xb.reshape(rows, k // 8, 8) << jnp.arange(8, dtype=_U32), -1, dtype=_U32)
            return smem.at[addr[:, ::8]].set(xb.astype(jnp.uint8))
        nb = bits // 8
        data = (xb[..., None] >> (8 * jnp.arange(nb, dtype=_U32))).astype(jnp.uint8)
        return smem.at[addr[..., None] + np.arange(nb)].set(data)

    def get(self, smem, etype: str, *, operand: str, n: int | None = None, tnsp: int = 0, sparse: bool = False):
        """The operand this descriptor reads from ``smem``, typed: A (64, K) or B (K, ``n``)."""
        rows, k, bits, addr = self._operand(operand, etype, tnsp, smem, sparse, n=n)
        vals = _gather(smem, jnp.asarray(addr, jnp.int32), bits, k)
        vals = vals.T if operand == "b" else vals
        return vals.astype(jnp.uint8) if bits == 1 else fm.from_bits(vals, etype)

    def _operand(self, operand, etype, tnsp, smem, sparse, shape=None, n=None):
        """(rows, K, element bits, checked addresses) of operand "a" or "b" given as an array of
        ``shape`` (put) or read with ``n`` columns (get, B)."""
        where = f"WgmmaDescriptor({self.start}, {self.lbo}, {self.sbo}, {self.swizzle!r}, {self.base_offset})"
        if operand not in ("a", "b"):
            raise ValueError(f"{where}: operand must be 'a' or 'b', got {operand!r}")
        if etype not in _K:
            raise ValueError(f"{where}: etype must be one of {', '.join(_K)}, got {etype!r}")
        if tnsp not in (0, 1) or (tnsp and etype not in ("f16", "bf16")):
            raise ValueError(f"{where}: tnsp must be 0, or 1 with f16/bf16 (MN-major), got {tnsp!r}")
        if sparse not in (False, True) or (sparse and etype == "b1"):
            raise ValueError(f"{where}: sparse must be False, or True for the types of wgmma.mma_async.sp (not b1), "
                             f"got {sparse!r}")
        k = _K[etype] * (2 if sparse and operand == "b" else 1)
        if shape is not None:
            n = shape[1] if len(shape) == 2 and operand == "b" else n
            want = (64, k) if operand == "a" else (k, n)
            if tuple(shape) != want:
                raise ValueError(f"{where}: operand {operand} of .{etype} must have shape (64, {k}) (A) or "
                                 f"({k}, N) (B), got {tuple(shape)}")
        if operand == "b" and not (memmod.is_integer_value(n) and n > 0 and n % 8 == 0):
            raise ValueError(f"{where}: B needs N, a positive multiple of 8, got {n!r}")
        smem = memmod.check_mem(smem, where)
        rows = 64 if operand == "a" else int(n)
        bits = ELEMENT_BITS[etype]
        addr = self.addresses(rows, k, bits, bool(tnsp))
        if addr.max() + max(bits // 8, 1) > smem.shape[0]:
            raise IndexError(f"{where}: operand {operand} reaches byte {addr.max() + max(bits // 8, 1) - 1}, outside "
                             f"the shared memory of {smem.shape[0]} bytes")
        return rows, k, bits, addr


def wgmma_descriptor(start: int, lbo: int, sbo: int, swizzle: str = "none", base_offset: int = 0) -> int:
    """The 64-bit ``wgmma`` matrix descriptor of these fields (see :class:`WgmmaDescriptor`).

    >>> import tcemu
    >>> hex(tcemu.wgmma_descriptor(start=0, lbo=128, sbo=256))    # K-major, no swizzle
    '0x1000080000'
    """
    return WgmmaDescriptor(start, lbo, sbo, swizzle, base_offset).encode()


def wgmma_fragments(ins: Mma):
    """(A register fragment, D fragment) of a wgmma: warp w holds rows 16 w .. 16 w + 15."""
    bits = ELEMENT_BITS[ins.atype]
    fa = Fragment(64, ins.k, bits, 4, *L.a_fragment_bases(bits), "PTX ISA wgmma register fragments")
    dbits = ELEMENT_BITS[ins.dtype]
    fd = Fragment(64, ins.n, dbits, ins.n * dbits // 64, *L.d_fragment_bases(ins.n),
                  "PTX ISA wgmma register fragments (CuTe CLayout_64xN)")
    return fa, fd


def _gather(smem, addr, bits: int, k: int):
    """Element bits (uint32) at the byte addresses ``addr`` (rows, k); bytes outside read 0."""
    if bits == 1:
        byte = jnp.take(smem, addr, mode="fill", fill_value=0).astype(_U32)
        return (byte >> jnp.asarray(np.arange(k, dtype=np.uint32) % 8)) & _U32(1)
    nb = bits // 8
    byte = jnp.take(smem, addr[..., None] + jnp.arange(nb, dtype=jnp.int32), mode="fill", fill_value=0)
    return jnp.sum(byte.astype(_U32) << (8 * jnp.arange(nb, dtype=_U32)), -1, dtype=_U32)


def _binary_flag(spelling, name, v, valid):
    iv = register_index(v)
    if iv is None or iv not in valid:
        raise ValueError(f"{spelling}: {name} must be {' or '.join(map(str, valid))}, got {v!r}")
    return iv


class WgmmaRegs(Instruction):
    """``f(regs, smem, *, d, b_desc, a=None, a_desc=None, scale_d=1, imm_scale_a=1, imm_scale_b=1,
    tnsp_a=0, tnsp_b=0, key=None) -> regs`` (see the module docstring)."""

    def __init__(self, ins: Mma, arch, model=None, ka=None):
        super().__init__(ins, arch)
        self.ka, self.kb = ka or ins.k, ins.k  # K of A (the compressed A of a sparse wgmma: K/2) and of B
        self.fa, self.fd = wgmma_fragments(dataclasses.replace(ins, k=self.ka))
        self.model = None if ins.family in ("int", "b1") else mma_numerics.resolve_model(ins, model, arch)
        self._impl = jax.jit(self._mma, static_argnames=("d", "a", "neg", "e", "sel"))

    def _mma(self, regs, smem, a_addr, b_addr, scale_d, key, d, a, neg, e=None, sel=0):
        A, B, C = self._operands(regs, smem, a_addr, b_addr, scale_d, d, a, neg)
        D = jax.lax.optimization_barrier(self._product(regs, A, B, C, key, e, sel, neg))
        return write_regs(regs, d, matrix_to_fragment(_from_numeric(D, self.ins.dtype), self.fd))

    def _product(self, regs, A, B, C, key, e, sel, neg):
        ins = self.ins
        if key is None:
            return mma_numerics.mma_bits_vmappable(ins, self.model, self.arch)(A, B, C)
        return mma_numerics.mma_bits(ins, A, B, C, self.model, arch=self.arch, key=key, over_devices=True)

    def _operands(self, regs, smem, a_addr, b_addr, scale_d, d, a, neg):
        """A (64, K of A), B (K, N) and C (64, N) in the encodings of the numerics."""
        ins, abits = self.ins, ELEMENT_BITS[self.ins.atype]
        if a is None:
            A = _gather(smem, a_addr, abits, self.ka)
        else:
            A = fragment_to_matrix(read_regs(regs, a), self.fa)
        B = _gather(smem, b_addr, ELEMENT_BITS[ins.btype], self.kb).T
        signs = [_U32(1 << (31 if t == "tf32" else ELEMENT_BITS[t] - 1)) for t in (ins.atype, ins.btype)]
        A = A ^ signs[0] if neg[0] else A
        B = B ^ signs[1] if neg[1] else B
        C = _to_numeric(fragment_to_matrix(read_regs(regs, d), self.fd), ins.ctype)
        C = jnp.where(scale_d != 0, C, jnp.zeros_like(C))
        # operands and result materialised once: XLA's fusions around the numerics otherwise cost
        # more than the numerics (CPU, m64n256k16 for 256 warpgroups: 25 ms without, 17 ms with)
        return jax.lax.optimization_barrier((_to_numeric(A, ins.atype), _to_numeric(B, ins.btype), C))

    def _addresses(self, desc, name, rows, k, bits, mn_major, size):
        """The checked int32 (rows, k) byte addresses an operand's descriptor reads."""
        dd = WgmmaDescriptor.decode(desc)
        addr = dd.addresses(rows, k, bits, mn_major)
        last = int(addr.max()) + max(bits // 8, 1)
        if last > size:
            raise IndexError(f"{self.spelling}: {name} {dd} reads bytes up to {last - 1}, outside the shared "
                             f"memory of {size} bytes")
        return jnp.asarray(addr, jnp.int32)

    def _flags(self, imm_scale_a, imm_scale_b, tnsp_a, tnsp_b, a_from_desc):
        sp, ins = self.spelling, self.ins
        floats = ins.family not in ("int", "b1")
        neg = tuple(_binary_flag(sp, n, v, (1, -1) if floats else (1,)) == -1
                    for n, v in (("imm_scale_a", imm_scale_a), ("imm_scale_b", imm_scale_b)))
        t16 = ins.atype in ("f16", "bf16")
        ta = _binary_flag(sp, "tnsp_a", tnsp_a, (0, 1) if t16 and a_from_desc else (0,))
        tb = _binary_flag(sp, "tnsp_b", tnsp_b, (0, 1) if t16 else (0,))
        return neg, bool(ta), bool(tb)

    def __call__(self, regs, smem, *, d, b_desc, a=None, a_desc=None, scale_d=1, imm_scale_a=1, imm_scale_b=1,
                 tnsp_a=0, tnsp_b=0, key=None):
        return self._call(regs, smem, d, b_desc, a, a_desc, scale_d, imm_scale_a, imm_scale_b, tnsp_a, tnsp_b, key)

    def _call(self, regs, smem, d, b_desc, a, a_desc, scale_d, imm_scale_a, imm_scale_b, tnsp_a, tnsp_b, key,
              **sparse):
        """Check the operands and run; ``sparse``: the static ``e`` and ``sel`` of a sparse wgmma."""
        sp, ins = self.spelling, self.ins
        regs = check_regs(sp, regs, lanes=128)
        smem = memmod.check_mem(smem, sp)
        key = check_key(key, sp)
        if (a is None) == (a_desc is None):
            raise ValueError(f"{sp}: pass A either in registers (a=[4 register indices]) or from shared memory "
                             "(a_desc=descriptor), not both or neither")
        neg, ta, tb = self._flags(imm_scale_a, imm_scale_b, tnsp_a, tnsp_b, a_desc is not None)
        d = register_indices(sp, "d", d, self.fd.nregs, regs.shape[1])
        a = None if a is None else register_indices(sp, "a", a, 4, regs.shape[1])
        size = smem.shape[0]
        bits = ELEMENT_BITS[ins.atype]
        a_addr = None if a_desc is None else self._addresses(a_desc, "a_desc", 64, self.ka, bits, ta, size)
        b_addr = self._addresses(b_desc, "b_desc", ins.n, self.kb, ELEMENT_BITS[ins.btype], tb, size)
        scale_d = int(scale_d) if isinstance(scale_d, (bool, np.bool_)) else scale_d
        sd = register_index(scale_d)
        if sd is None and not isinstance(scale_d, jax.Array) or sd not in (None, 0, 1):
            raise ValueError(f"{sp}: scale_d must be 0 or 1 (or a traced integer/bool scalar), got {scale_d!r}")
        return self._impl(regs, smem, a_addr, b_addr, jnp.asarray(scale_d).astype(jnp.int32), key, d=d, a=a, neg=neg,
                          **sparse)


class WgmmaSyncRegs(Instruction):
    """``wgmma.fence`` / ``commit_group``: ``f(regs) -> regs``; ``wait_group``: ``f(regs, n) -> regs``.
    tcemu completes every ``wgmma.mma_async`` when it is called, so these order nothing."""

    def __init__(self, ins: WgmmaSync, arch):
        super().__init__(ins, arch)

    def __call__(self, regs, n=None):
        regs = check_regs(self.spelling, regs, lanes=128)
        if self.ins.op == "wait_group":
            if register_index(n) is None or register_index(n) < 0:
                raise ValueError(f"{self.spelling}: n (the number of pending groups allowed) must be an "
                                 f"integer >= 0, got {n!r}")
        elif n is not None:
            raise TypeError(f"{self.spelling}: takes no operand (n is for wgmma.wait_group)")
        return regs
