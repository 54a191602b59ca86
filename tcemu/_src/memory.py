"""Byte-addressed memory: a 1-D ``uint8`` array. Elements are little-endian; sub-byte element
``i`` of a row sits at bit ``i * bits`` (element 0 in the least significant bits of its byte).

Matrices are stored as PTX's Matrix Storage for WMMA describes: ``.row`` puts row ``r`` at
element offset ``r * stride``, ``.col`` puts column ``c`` at ``c * stride``.

Out-of-range addresses: the public helpers raise ``IndexError`` when addresses are concrete.
Inside ``jax.jit`` with a traced address nothing can be raised: loads then read zeros and stores
drop every byte whose address is negative or past the end of ``mem`` (never a wrap or clamp).
Addresses are computed exactly as long as ``p``, ``stride`` and every offset fit in 32 bits
(PTX shared-memory addresses are 32-bit); a byte whose address needs more counts as outside.

    >>> import numpy as np, tcemu
    >>> mem = tcemu.memory(64)
    >>> mem = tcemu.put_matrix(mem, np.arange(4, dtype=np.float16).reshape(2, 2), p=16)
    >>> tcemu.get_matrix(mem, (2, 2), "f16", p=16).tolist()
    [[0.0, 1.0], [2.0, 3.0]]
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from tcemu._src import formats as fm
from tcemu._src.formats import ELEMENT_BITS
from tcemu._src.checks import concrete_int, is_integer_value, scalar_int  # noqa: F401 (the instructions' too)
from tcemu._src.numerics.fma64 import require_x64

_U32 = jnp.uint32
_I32 = jnp.int32
_IMAX = 2 ** 31 - 1
MAX_BYTES = _IMAX  # addresses are int32; the index one past the end must be representable
LAYOUTS = ("row", "col")


# ---------------------------------------------------------------------------------------------
# argument checks shared by the memory helpers and the instructions


def check_layout(layout, where: str, name: str = "layout") -> str:
    if not isinstance(layout, str):
        raise TypeError(f"{where}: {name} must be 'row' or 'col', got {layout!r} ({type(layout).__name__})")
    if layout not in LAYOUTS:
        raise ValueError(f"{where}: {name} must be 'row' or 'col', got {layout!r}")
    return layout


def check_mem(mem, where: str):
    """``mem`` as a 1-D ``uint8`` JAX array, or a clear error naming it."""
    if not isinstance(mem, (jax.Array, np.ndarray)):
        raise TypeError(f"{where}: mem must be a 1-D uint8 array (tcemu.memory), got {type(mem).__name__}")
    if mem.dtype != np.uint8:
        raise TypeError(f"{where}: mem must be a 1-D uint8 array (tcemu.memory), got dtype {mem.dtype}")
    if mem.ndim != 1:
        raise ValueError(f"{where}: mem must be a 1-D uint8 array (use jax.vmap for many warps), "
                         f"got shape {tuple(mem.shape)}")
    if not 1 <= mem.shape[0] <= MAX_BYTES:
        raise ValueError(f"{where}: mem must have 1 to {MAX_BYTES} bytes, got {mem.shape[0]}")
    return jnp.asarray(mem)


def check_range(mem, p, nbytes, what):
    """IndexError when the concrete bytes ``[p, p + nbytes)`` are not all inside ``mem``."""
    p_ = concrete_int(p)
    if p_ is not None and (p_ < 0 or p_ + nbytes > mem.shape[-1]):
        raise IndexError(f"{what}: p={p_}: bytes [{p_}, {p_ + nbytes}) are outside the memory of "
                         f"{mem.shape[-1]} bytes")


# ---------------------------------------------------------------------------------------------
# addressing


def lead_inner(rows_idx, cols_idx, layout: str):
    """(lead, inner) indices of (row, col): ``.row`` leads with rows, ``.col`` with columns."""
    return (rows_idx, cols_idx) if layout == "row" else (cols_idx, rows_idx)


def extent_bytes(rows, cols, bits, layout, stride):
    """Bytes from the first byte of a stored matrix to one past its last byte."""
    lead, inner = (rows, cols) if layout == "row" else (cols, rows)
    return ((lead - 1) * stride * bits + inner * bits + 7) // 8


def _int32(x):
    """(int32 value, outside) of an integer scalar/array; ``outside`` marks values beyond int32."""
    if isinstance(x, (int, np.integer)):
        inside = -2 ** 31 <= int(x) <= _IMAX
        return jnp.int32(x if inside else 0), not inside
    x = jnp.asarray(x)
    if x.dtype.itemsize < 4 or x.dtype == jnp.int32:
        return x.astype(_I32), False
    outside = x > _IMAX if jnp.issubdtype(x.dtype, jnp.unsignedinteger) else (x < -2 ** 31) | (x > _IMAX)
    return jnp.where(outside, 0, x).astype(_I32), outside


def byte_addresses(size, p, lead, inner, stride, bits):
    """int32 byte addresses of stored elements; every address outside ``[0, size)`` is ``size``.

    Element ``(lead, inner)`` (static integer arrays) lies at element offset
    ``lead * stride + inner`` from byte address ``p`` (``p``: scalar, or an array broadcasting
    against ``lead``). Returns ``(addresses, bitpos)``: for ``bits >= 8`` addresses has a trailing
    axis of the element's ``bits // 8`` bytes (little-endian) and ``bitpos`` is None; for sub-byte
    elements one address per element and the element's bit position in its byte.
    """
    lead = np.asarray(lead, np.int64)
    inner = np.asarray(inner, np.int64)
    p32, far = _int32(p)
    s32, s_far = _int32(stride)
    nb = max(bits // 8, 1)
    # |lead * stride| <= limit keeps every offset, in bytes or elements, inside int32
    limit = ((_IMAX // nb - inner - nb) // np.maximum(lead, 1)).astype(np.int32)
    far = far | (s_far | (s32 > limit) | (s32 < -limit)) & (lead != 0)
    e = jnp.asarray(lead, _I32) * s32 + jnp.asarray(inner, _I32)  # element offsets
    if bits < 8:
        per = 8 // bits
        off, bitpos = e // per, (e % per) * bits
    else:
        e, far = e[..., None], jnp.asarray(far)[..., None]
        off, bitpos = e * nb + jnp.arange(nb, dtype=_I32), None
        p32 = p32[..., None] if p32.ndim else p32
    addr = p32 + off
    overflow = jnp.where(p32 >= 0, off > _IMAX - p32, off < -2 ** 31 - p32)
    outside = far | overflow | (addr < 0) | (addr >= size)
    return jnp.where(outside, size, addr), bitpos


def read(mem, p, lead, inner, stride, bits: int):
    """Read elements at (lead, inner) (see :func:`byte_addresses`); bytes outside ``mem`` read 0.

    Returns uint32 values (``bits <= 32``) or a (lo, hi) pair of uint32 words (``bits == 64``).
    """
    addr, bitpos = byte_addresses(mem.shape[0], p, lead, inner, stride, bits)
    byte = jnp.take(mem, addr, mode="fill", fill_value=0).astype(_U32)
    if bits < 8:
        return (byte >> bitpos.astype(_U32)) & _U32((1 << bits) - 1)
    words = [byte[..., 4 * w:4 * w + 4] for w in range(max(bits // 32, 1))]
    words = [jnp.sum(b << (8 * jnp.arange(b.shape[-1], dtype=_U32)), -1, dtype=_U32) for b in words]
    return tuple(words) if bits == 64 else words[0]


def write(mem, p, lead, inner, stride, values, bits: int):
    """Write elements (uint32 values, or a (lo, hi) pair for 64-bit) at (lead, inner); bytes
    outside ``mem`` are dropped."""
    size = mem.shape[0]
    addr, bitpos = byte_addresses(size, p, lead, inner, stride, bits)
    if bits < 8:
        bitmem = jnp.unpackbits(mem, bitorder="little").reshape(size, 8)
        v = jnp.asarray(values, _U32)
        for t in range(bits):
            bitmem = bitmem.at[addr, bitpos + t].set(((v >> t) & 1).astype(jnp.uint8), mode="drop")
        return jnp.packbits(bitmem.reshape(-1), bitorder="little")
    words = values if bits == 64 else (values,)
    data = jnp.stack([(jnp.asarray(w, _U32)[..., None] >> (8 * jnp.arange(min(bits, 32) // 8, dtype=_U32)))
                      for w in words], -2).reshape(addr.shape).astype(jnp.uint8)
    return mem.at[addr.ravel()].set(data.ravel(), mode="drop")


# ---------------------------------------------------------------------------------------------
# public helpers


def memory(nbytes: int):
    """Zeroed memory of ``nbytes`` bytes (``uint8``).

    >>> import tcemu
    >>> mem = tcemu.memory(8)
    >>> mem.shape, mem.dtype, int(mem.sum())
    ((8,), dtype('uint8'), 0)
    """
    if not is_integer_value(nbytes):
        raise TypeError(f"memory: nbytes must be an integer, got {nbytes!r} ({type(nbytes).__name__})")
    if not 1 <= nbytes <= MAX_BYTES:
        raise ValueError(f"memory: nbytes must be in 1..{MAX_BYTES}, got {nbytes}")
    return jnp.zeros((int(nbytes),), jnp.uint8)


_DTYPE_ETYPE = {
    np.dtype(np.float16): "f16", np.dtype(jnp.bfloat16): "bf16", np.dtype(np.float32): "f32",
    np.dtype(np.float64): "f64", np.dtype(ml_dtypes.float8_e4m3fn): "e4m3",
    np.dtype(ml_dtypes.float8_e5m2): "e5m2", np.dtype(np.int8): "s8", np.dtype(np.uint8): "u8",
    np.dtype(np.int32): "s32",
}
_INT_RANGE = {"s8": (-128, 127), "u8": (0, 255), "s4": (-8, 7), "u4": (0, 15), "b1": (0, 1),
              "s32": (-2 ** 31, _IMAX)}


def _etype_bits(etype, where):
    if not isinstance(etype, str):
        raise TypeError(f"{where}: etype must be a string such as 'f16', got {etype!r} ({type(etype).__name__})")
    if etype not in ELEMENT_BITS:
        raise ValueError(f"{where}: unknown etype {etype!r}; valid: {', '.join(ELEMENT_BITS)}")
    return ELEMENT_BITS[etype]


def _concrete(x):
    try:
        return np.asarray(x)
    except (jax.errors.ConcretizationTypeError, jax.errors.TracerArrayConversionError):
        return None


def _matrix_args(mem, shape, etype, p, layout, stride, where):
    """Shared checks of put_matrix/get_matrix; returns (mem, bits, p, stride)."""
    mem = check_mem(mem, where)
    bits = _etype_bits(etype, where)
    check_layout(layout, where)
    p = scalar_int(p, "p", where)
    rows, cols = shape
    inner = cols if layout == "row" else rows
    if stride is None:
        stride = inner
    stride = scalar_int(stride, "stride", where)
    if isinstance(stride, int) and stride < inner:
        raise ValueError(f"{where}: stride={stride} is shorter than a {'row' if layout == 'row' else 'column'} "
                         f"of {inner} elements; the minimum stride is {inner} ({layout} layout)")
    if isinstance(stride, int):
        check_range(mem, p, extent_bytes(rows, cols, bits, layout, stride), where)
    else:
        check_range(mem, p, extent_bytes(1 if layout == "row" else rows, 1 if layout == "col" else cols,
                                         bits, layout, 0), where)
    if bits == 64:
        require_x64(f"{where}: etype 'f64' values")
    return mem, bits, p, stride


def put_matrix(mem, x, *, p: int = 0, layout: str = "row", stride: int | None = None,
               etype: str | None = None):
    """Store a 2-D array ``x`` into ``mem`` at byte address ``p`` (returns the new memory).

    ``etype`` defaults from ``x.dtype`` (float16 -> f16, bfloat16 -> bf16, float32 -> f32,
    float64 -> f64, float8_e4m3fn -> e4m3, float8_e5m2 -> e5m2, int8 -> s8, uint8 -> u8,
    int32 -> s32); give it for tf32 (float32 data), s4/u4 (integer values) and b1 (0/1 or bool).
    Floating-point data must already have the dtype of ``etype`` (nothing is converted); integer
    data may have any integer dtype and must fit ``etype`` (checked when concrete; traced values
    are stored modulo ``2**bits``). ``stride`` (elements, default: a row for ``.row``, a column
    for ``.col``) may not be shorter than a row (column).

    >>> import numpy as np, tcemu
    >>> x = np.array([[1, 2], [3, 4]], np.int8)
    >>> tcemu.put_matrix(tcemu.memory(8), x, layout="col").tolist()   # column-major s8 bytes
    [1, 3, 2, 4, 0, 0, 0, 0]
    >>> tcemu.put_matrix(tcemu.memory(4), np.array([[1.0]], np.float16), p=2).tolist()
    [0, 0, 0, 60]
    """
    where = "put_matrix"
    if not hasattr(x, "dtype"):
        try:
            x = np.asarray(x)
        except (TypeError, ValueError):
            raise TypeError(f"{where}: x must be a 2-D array, got {type(x).__name__}") from None
    if x.ndim != 2 or 0 in x.shape:
        raise ValueError(f"{where}: x must be a non-empty 2-D array, got shape {tuple(x.shape)}")
    dt = np.dtype(x.dtype)
    if etype is None:
        if dt not in _DTYPE_ETYPE:
            raise TypeError(f"{where}: cannot infer the element type of dtype {dt}; pass etype= "
                            f"(dtypes with a default: {', '.join(sorted(d.name for d in _DTYPE_ETYPE))})")
        etype = _DTYPE_ETYPE[dt]
        if etype == "f64":
            require_x64(f"{where}: float64 data (etype 'f64', inferred from x.dtype)")
    mem, bits, p, stride = _matrix_args(mem, x.shape, etype, p, layout, stride, where)
    if etype in _INT_RANGE:
        if not (np.issubdtype(dt, np.integer) or (etype == "b1" and dt == np.bool_)):
            raise TypeError(f"{where}: x has dtype {dt}, but etype {etype!r} needs integer data")
        cx = _concrete(x)
        lo, hi = _INT_RANGE[etype]
        if cx is not None and cx.size and (cx.min() < lo or cx.max() > hi):
            raise ValueError(f"{where}: values of x must lie in [{lo}, {hi}] for etype {etype!r}, "
                             f"got [{cx.min()}, {cx.max()}]")
        if cx is not None:
            x = cx.astype(np.int32)
        v = jnp.asarray(x).astype(_I32).astype(_U32) & _U32((1 << bits) - 1 if bits < 32 else 0xFFFFFFFF)
    else:
        want = np.dtype(fm.VALUE_DTYPES[etype])
        if dt != want:
            raise TypeError(f"{where}: x has dtype {dt}, but etype {etype!r} stores {want.name} data; "
                            f"convert it first (e.g. x.astype({want.name}))")
        if bits == 64:
            u = jax.lax.bitcast_convert_type(jnp.asarray(x), jnp.uint32)
            v = (u[..., 0], u[..., 1])
        else:
            v = fm.to_bits(x, etype)
    return _writer(tuple(x.shape), layout, bits, _static(stride))(mem, _arg(p), _arg(stride), v)


def get_matrix(mem, shape, etype: str, *, p: int = 0, layout: str = "row", stride: int | None = None):
    """Read a ``shape`` matrix of element type ``etype`` from ``mem`` (inverse of put_matrix).

    >>> import numpy as np, tcemu
    >>> mem = tcemu.put_matrix(tcemu.memory(8), np.array([[1, 2], [3, 4]], np.int8), layout="col")
    >>> tcemu.get_matrix(mem, (2, 2), "s8", layout="col").tolist()
    [[1, 2], [3, 4]]
    >>> tcemu.get_matrix(mem, (2, 2), "s8").tolist()           # the same bytes read as .row
    [[1, 3], [2, 4]]
    """
    where = "get_matrix"
    if not (isinstance(shape, (tuple, list)) and len(shape) == 2):
        raise ValueError(f"{where}: shape must be (rows, cols), got {shape!r}")
    if not all(is_integer_value(n) for n in shape):
        raise TypeError(f"{where}: shape must hold two integers, got {shape!r}")
    rows, cols = (int(n) for n in shape)
    if rows < 1 or cols < 1:
        raise ValueError(f"{where}: shape must be positive, got {shape!r}")
    mem, bits, p, stride = _matrix_args(mem, (rows, cols), etype, p, layout, stride, where)
    return _reader((rows, cols), layout, bits, _static(stride), etype)(mem, _arg(p), _arg(stride))


def _arg(x):
    """A checked concrete address or stride as an int32 argument (traced ones pass as they are)."""
    return np.int32(x) if isinstance(x, int) else x


def _static(stride):
    """A concrete stride (compiled in), or None for a traced one (passed as an argument)."""
    return stride if isinstance(stride, int) else None


# put_matrix's write and get_matrix's read, compiled once per shape (eager calls would otherwise
# compile every primitive)
@functools.lru_cache(maxsize=None)
def _indices(shape, layout):
    r, c = np.meshgrid(np.arange(shape[0]), np.arange(shape[1]), indexing="ij")
    return lead_inner(r, c, layout)


@functools.lru_cache(maxsize=None)
def _writer(shape, layout, bits, static):
    lead, inner = _indices(shape, layout)
    return jax.jit(lambda mem, p, s, v: write(mem, p, lead, inner, s if static is None else static, v, bits))


@functools.lru_cache(maxsize=None)
def _reader(shape, layout, bits, static, etype):
    lead, inner = _indices(shape, layout)
    return jax.jit(lambda mem, p, s: _typed(read(mem, p, lead, inner, s if static is None else static, bits), bits, etype))


def _typed(v, bits, etype):
    """get_matrix's values from the read words."""
    if bits == 64:
        return jax.lax.bitcast_convert_type(jnp.stack(v, -1), jnp.float64)
    if etype in ("s8", "s4"):
        return ((v.astype(jnp.int32) << (32 - bits)) >> (32 - bits)).astype(jnp.int8)
    if etype in ("u8", "u4", "b1"):
        return v.astype(jnp.uint8)
    if etype == "s32":
        return v.astype(jnp.int32)
    return fm.from_bits(v, etype)
