"""Byte-addressed memory: a 1-D ``uint8`` array. Elements are little-endian; sub-byte element
``i`` of a row sits at bit ``i * bits`` (element 0 in the least significant bits of its byte).

Matrices are stored as PTX's Matrix Storage for WMMA describes: ``.row`` puts row ``r`` at
element offset ``r * stride``, ``.col`` puts column ``c`` at ``c * stride``.

Out-of-range addresses: the public helpers raise ``IndexError`` when addresses are concrete.
Inside ``jax.jit`` with a traced address nothing can be raised: loads then read zeros and stores
drop the bytes that fall outside ``mem`` (never a silent wrap or clamp).

    >>> import numpy as np, tcemu
    >>> mem = tcemu.memory(64)
    >>> mem = tcemu.put_matrix(mem, np.arange(4, dtype=np.float16).reshape(2, 2), p=16)
    >>> tcemu.get_matrix(mem, (2, 2), "f16", p=16).tolist()
    [[0.0, 1.0], [2.0, 3.0]]
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from tcemu._src import formats as fm

_U32 = jnp.uint32


def concrete_int(x):
    """``int(x)`` when ``x`` is known at trace time, else ``None``."""
    if x is None:
        return None
    if isinstance(x, (int, np.integer)):
        return int(x)
    try:
        return int(np.asarray(x).item())
    except (jax.errors.ConcretizationTypeError, jax.errors.TracerIntegerConversionError, TypeError):
        return None


def element_offsets(rows_idx, cols_idx, layout: str, stride):
    """Element offsets (in elements) of (row, col) index arrays for ``.row``/``.col`` storage."""
    if layout == "row":
        return rows_idx * stride + cols_idx
    return cols_idx * stride + rows_idx


def read(mem, p, offs, bits: int):
    """Read elements at element offsets ``offs`` from byte address ``p``.

    Returns uint32 values (``bits <= 32``) or a (lo, hi) pair of uint32 words (``bits == 64``).
    """
    p = jnp.asarray(p, jnp.int32)
    offs = jnp.asarray(offs, jnp.int32)
    take = lambda i: jnp.take(mem, i, mode="fill", fill_value=0).astype(_U32)  # noqa: E731
    if bits < 8:
        per = 8 // bits
        byte = take(p + offs // per)
        return (byte >> ((offs % per) * bits).astype(_U32)) & _U32((1 << bits) - 1)
    nb = bits // 8
    base = p + offs * nb

    def word(first, n):
        w = jnp.zeros(offs.shape, _U32)
        for j in range(n):
            w = w | (take(base + first + j) << (8 * j))
        return w

    if bits == 64:
        return word(0, 4), word(4, 4)
    return word(0, nb)


def write(mem, p, offs, values, bits: int):
    """Write elements (uint32 values, or a (lo, hi) pair for 64-bit) at element offsets ``offs``.
    Sub-byte writes are not needed by any instruction and are not supported."""
    if bits < 8:
        raise NotImplementedError("sub-byte stores")
    p = jnp.asarray(p, jnp.int32)
    offs = jnp.asarray(offs, jnp.int32)
    nb = bits // 8
    words = values if bits == 64 else (values,)
    idx, data = [], []
    for w_i, w in enumerate(words):
        for j in range(min(nb, 4)):
            idx.append(p + offs * nb + 4 * w_i + j)
            data.append(((jnp.asarray(w, _U32) >> (8 * j)) & 0xFF).astype(jnp.uint8))
    return mem.at[jnp.stack(idx)].set(jnp.stack(data), mode="drop")


def extent_bytes(rows, cols, bits, layout, stride):
    """Bytes from the first byte of a stored matrix to one past its last byte."""
    lead, inner = (rows, cols) if layout == "row" else (cols, rows)
    return ((lead - 1) * stride * bits + inner * bits + 7) // 8


def check_range(mem, p, nbytes, what):
    p_ = concrete_int(p)
    if p_ is not None and (p_ < 0 or p_ + nbytes > mem.shape[-1]):
        raise IndexError(f"{what}: bytes [{p_}, {p_ + nbytes}) are outside the memory of {mem.shape[-1]} bytes")


# ---------------------------------------------------------------------------------------------
# public helpers


def memory(nbytes: int):
    """Zeroed memory of ``nbytes`` bytes (``uint8``)."""
    return jnp.zeros((int(nbytes),), jnp.uint8)


_DTYPE_ETYPE = {
    np.dtype(np.float16): "f16", np.dtype(jnp.bfloat16): "bf16", np.dtype(np.float32): "f32",
    np.dtype(np.float64): "f64", np.dtype(np.int8): "s8", np.dtype(np.uint8): "u8",
    np.dtype(np.int32): "s32",
}


def _etype_bits(etype):
    from tcemu._src.isa.parse import ELEMENT_BITS

    if etype not in ELEMENT_BITS:
        raise ValueError(f"unknown element type {etype!r}; valid: {', '.join(ELEMENT_BITS)}")
    return ELEMENT_BITS[etype]


def put_matrix(mem, x, *, p: int = 0, layout: str = "row", stride: int | None = None,
               etype: str | None = None):
    """Store a 2-D array ``x`` into ``mem`` at byte address ``p`` (returns the new memory).

    ``etype`` defaults from ``x.dtype`` (float16 -> f16, bfloat16 -> bf16, float32 -> f32, ...);
    give it for tf32 (float32 data), e4m3/e5m2, s4/u4 (int values) and b1 (0/1 values).
    """
    x = jnp.asarray(x)
    if x.ndim != 2:
        raise ValueError(f"put_matrix takes a 2-D array, got shape {x.shape}")
    if etype is None:
        try:
            etype = _DTYPE_ETYPE[np.dtype(x.dtype)]
        except KeyError:
            raise ValueError(f"cannot infer the element type of dtype {x.dtype}; pass etype=") from None
    bits = _etype_bits(etype)
    if layout not in ("row", "col"):
        raise ValueError(f"layout must be 'row' or 'col', got {layout!r}")
    rows, cols = x.shape
    stride = (cols if layout == "row" else rows) if stride is None else stride
    check_range(mem, p, extent_bytes(rows, cols, bits, layout, stride), "put_matrix")
    r, c = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
    offs = element_offsets(r, c, layout, stride)
    if etype in ("s8", "u8", "s4", "u4", "b1", "s32"):
        v = x.astype(jnp.int32).astype(_U32) & _U32((1 << bits) - 1 if bits < 32 else 0xFFFFFFFF)
    elif bits == 64:
        u = jax.lax.bitcast_convert_type(x.astype(jnp.float64), jnp.uint32)
        v = (u[..., 0], u[..., 1])
    else:
        v = fm.to_bits(x, etype)
    if bits < 8:
        per = 8 // bits
        bitpos = (np.asarray(offs) % per) * bits
        byte = p + np.asarray(offs) // per
        # combine all sub-byte elements of a byte: clear their bits, then OR them in
        flat_b = byte.ravel()
        clear = jnp.zeros(mem.shape, _U32).at[flat_b].add(_U32((1 << bits) - 1) << bitpos.ravel().astype(np.uint32))
        setv = jnp.zeros(mem.shape, _U32).at[flat_b].add((v.ravel() << bitpos.ravel().astype(np.uint32)))
        return ((mem.astype(_U32) & ~clear) | setv).astype(jnp.uint8)
    return write(mem, p, offs, v, bits)


def get_matrix(mem, shape, etype: str, *, p: int = 0, layout: str = "row", stride: int | None = None):
    """Read a ``shape`` matrix of element type ``etype`` from ``mem`` (inverse of put_matrix)."""
    rows, cols = shape
    bits = _etype_bits(etype)
    stride = (cols if layout == "row" else rows) if stride is None else stride
    check_range(mem, p, extent_bytes(rows, cols, bits, layout, stride), "get_matrix")
    r, c = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
    v = read(mem, p, element_offsets(r, c, layout, stride), bits)
    if bits == 64:
        return jax.lax.bitcast_convert_type(jnp.stack(v, -1), jnp.float64)
    if etype in ("s8", "s4"):
        return ((v.astype(jnp.int32) << (32 - bits)) >> (32 - bits)).astype(jnp.int8)
    if etype in ("u8", "u4", "b1"):
        return v.astype(jnp.uint8)
    if etype == "s32":
        return v.astype(jnp.int32)
    return fm.from_bits(v, etype)
