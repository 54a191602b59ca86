"""Bit-level floating-point formats: decode IEEE-style bit patterns into integer fields and back.

Everything here is 32-bit integer arithmetic on ``uint32``/``int32`` arrays, so it needs no
``jax_enable_x64``, gives the same bits with it on, and identical bits on every backend. Formats wider than 32 bits
(float64) live in :mod:`tcemu._src.numerics.fma64`.

Example::

    >>> import jax.numpy as jnp
    >>> from tcemu._src import formats
    >>> d = formats.decode(jnp.uint32(0x3C00), formats.F16)     # 1.0 in binary16
    >>> int(d.exp), int(d.sig)
    (0, 1024)
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import ml_dtypes


@dataclasses.dataclass(frozen=True)
class FloatFormat:
    """A binary floating-point format stored in the low ``storage_bits`` of a uint32.

    ``shift`` places the format inside its storage (tf32 lives in the top 19 bits of a float32).
    ``has_inf=False`` marks the OCP "fn" formats (e4m3: only S.1111.111 is NaN, no infinities);
    ``has_nan=False`` as well marks the OCP MX fp6/fp4 elements, whose every code is finite.
    """

    name: str
    exponent_bits: int
    fraction_bits: int
    storage_bits: int
    has_inf: bool = True
    shift: int = 0
    nan: int | None = None  # NaN pattern returned by the hardware, if not the canonical one
    has_nan: bool = True
    fnuz: bool = False  # AMD "fnuz" fp8: bias one higher, 0x80 (-0) is the only NaN, no infinities

    @property
    def bias(self) -> int:
        return (1 << (self.exponent_bits - 1)) - 1 + self.fnuz

    @property
    def emin(self) -> int:
        return 1 - self.bias

    @property
    def emax(self) -> int:
        top = (1 << self.exponent_bits) - 1
        return (top - 1 if self.has_inf else top) - self.bias

    @property
    def bits(self) -> int:
        """Bits of one element: sign, exponent and fraction."""
        return 1 + self.exponent_bits + self.fraction_bits

    @property
    def max_fraction(self) -> int:
        """Fraction field of the largest finite value."""
        m = (1 << self.fraction_bits) - 1
        return m if self.has_inf or not self.has_nan or self.fnuz else m - 1

    @property
    def canonical_nan(self) -> int:
        """Positive NaN with every fraction bit set (what NVIDIA tensor cores return)."""
        if self.nan is not None:
            return self.nan
        e = (1 << self.exponent_bits) - 1
        return ((e << self.fraction_bits) | ((1 << self.fraction_bits) - 1)) << self.shift

    def inf_bits(self, sign):
        e = (1 << self.exponent_bits) - 1
        body = (e << self.fraction_bits) << self.shift
        return jnp.where(jnp.asarray(sign).astype(bool), jnp.uint32(body | self.sign_bit), jnp.uint32(body))

    @property
    def sign_bit(self) -> int:
        return 1 << (self.exponent_bits + self.fraction_bits + self.shift)


F16 = FloatFormat("f16", 5, 10, 16)
BF16 = FloatFormat("bf16", 8, 7, 16)
TF32 = FloatFormat("tf32", 8, 10, 32, shift=13)
F32 = FloatFormat("f32", 8, 23, 32)
E4M3 = FloatFormat("e4m3", 4, 3, 8, has_inf=False)
E5M2 = FloatFormat("e5m2", 5, 2, 8)
# AMD CDNA3 fp8 ("fp8" and "bf8" in the MFMA spellings; ml_dtypes float8_e4m3fnuz / float8_e5m2fnuz)
E4M3FNUZ = FloatFormat("e4m3fnuz", 4, 3, 8, has_inf=False, nan=0x80, fnuz=True)
E5M2FNUZ = FloatFormat("e5m2fnuz", 5, 2, 8, has_inf=False, nan=0x80, fnuz=True)
# OCP MX v1.0 element formats (fp6 and fp4): no infinities and no NaN.
E3M2 = FloatFormat("e3m2", 3, 2, 8, has_inf=False, has_nan=False)
E2M3 = FloatFormat("e2m3", 2, 3, 8, has_inf=False, has_nan=False)
E2M1 = FloatFormat("e2m1", 2, 1, 8, has_inf=False, has_nan=False)

FORMATS = {f.name: f for f in (F16, BF16, TF32, F32, E4M3, E5M2, E3M2, E2M3, E2M1, E4M3FNUZ, E5M2FNUZ)}
# Element types of the Blackwell ``.kind::f8f6f4`` MMAs; fp6/fp4 values are carried as their codes.
F8F6F4_TYPES = ("e4m3", "e5m2", "e3m2", "e2m3", "e2m1")
# Block-scale factor types: ue8m0 (a power of two 2**(code - 127), 0xFF NaN) and ue4m3 (e4m3
# with the sign bit ignored, 0x7F NaN).
SCALE_TYPES = ("ue8m0", "ue4m3")

# JAX / NumPy dtype of the values of each PTX element type (tf32 values are float32 arrays).
# register bits of each PTX element type; fp8/fp6/fp4 of .kind::f8f6f4 sit in 8-bit containers
# (packed fp4 of .kind::mxf4* is 4 bits)
ELEMENT_BITS = {"f16": 16, "bf16": 16, "tf32": 32, "f32": 32, "f64": 64, "s8": 8, "u8": 8, "s4": 4, "u4": 4, "b1": 1,
                "s32": 32, "e4m3": 8, "e5m2": 8, "e3m2": 8, "e2m3": 8, "e2m1": 8, "e4m3fnuz": 8, "e5m2fnuz": 8}
VALUE_DTYPES = {
    "f16": jnp.float16, "bf16": jnp.bfloat16, "tf32": jnp.float32, "f32": jnp.float32,
    "f64": jnp.float64, "e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2,
    "e4m3fnuz": ml_dtypes.float8_e4m3fnuz, "e5m2fnuz": ml_dtypes.float8_e5m2fnuz,
    "e3m2": ml_dtypes.float6_e3m2fn, "e2m3": ml_dtypes.float6_e2m3fn, "e2m1": ml_dtypes.float4_e2m1fn,
    "ue8m0": ml_dtypes.float8_e8m0fnu, "ue4m3": ml_dtypes.float8_e4m3fn,
    "s8": jnp.int8, "u8": jnp.uint8, "s4": jnp.int8, "u4": jnp.uint8, "b1": jnp.uint8,
    "s32": jnp.int32,
}


class Decoded(NamedTuple):
    """Integer fields of a float: value = (-1)**sign * sig * 2**(exp - fraction_bits).

    ``exp`` is the unbiased exponent, ``emin`` for subnormals and zero; ``sig`` includes the hidden
    bit (0 for zero and subnormals).
    """

    sign: jnp.ndarray  # int32 0/1
    exp: jnp.ndarray  # int32
    sig: jnp.ndarray  # int32
    is_nan: jnp.ndarray  # bool
    is_inf: jnp.ndarray  # bool


def decode(bits, fmt: FloatFormat, *, flush_subnormals: bool = False) -> Decoded:
    """Split bit patterns (any unsigned/signed integer dtype) into :class:`Decoded` fields."""
    u = jnp.asarray(bits).astype(jnp.uint32) >> fmt.shift
    fb, eb = fmt.fraction_bits, fmt.exponent_bits
    frac = (u & ((1 << fb) - 1)).astype(jnp.int32)
    efield = ((u >> fb) & ((1 << eb) - 1)).astype(jnp.int32)
    sign = ((u >> (fb + eb)) & 1).astype(jnp.int32)
    top = (1 << eb) - 1
    if not fmt.has_nan:
        is_nan = is_inf = jnp.zeros(u.shape, bool)
    elif fmt.fnuz:
        is_nan = (sign != 0) & (efield == 0) & (frac == 0)
        is_inf = jnp.zeros_like(is_nan)
    elif fmt.has_inf:
        special = efield == top
        is_nan = special & (frac != 0)
        is_inf = special & (frac == 0)
    else:
        is_nan = (efield == top) & (frac == (1 << fb) - 1)
        is_inf = jnp.zeros_like(is_nan)
    normal = efield != 0
    if flush_subnormals:
        frac = jnp.where(normal, frac, 0)
    sig = jnp.where(normal, frac | (1 << fb), frac)
    exp = jnp.where(normal, efield - fmt.bias, fmt.emin)
    return Decoded(sign, exp, sig, is_nan, is_inf)


class Scale(NamedTuple):
    """A block-scale factor: value = sig * 2**(exp - 3) (3 fraction bits; ue8m0 has sig 8)."""

    sig: jnp.ndarray  # int32, 0 for a zero ue4m3
    exp: jnp.ndarray  # int32
    is_nan: jnp.ndarray  # bool


def decode_scale(codes, stype: str) -> Scale:
    """Decode ue8m0 / ue4m3 scale codes (uint8 values in any integer dtype)."""
    u = jnp.asarray(codes).astype(jnp.uint32) & 0xFF
    if stype == "ue8m0":
        return Scale(jnp.full(u.shape, 8, jnp.int32), u.astype(jnp.int32) - 127, u == 0xFF)
    d = decode(u & 0x7F, E4M3)
    return Scale(d.sig, d.exp, d.is_nan)


def to_bits(x, etype: str):
    """Bit patterns (uint32) of a typed JAX/NumPy array of PTX element type ``etype``."""
    x = jnp.asarray(x)
    if etype in ("s32", "s8", "u8", "s4", "u4", "b1"):
        return x
    storage = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32}[x.dtype.itemsize]
    return jax.lax.bitcast_convert_type(x, storage).astype(jnp.uint32)


def from_bits(bits, etype: str):
    """Typed array of PTX element type ``etype`` from uint32 bit patterns."""
    dt = jnp.dtype(VALUE_DTYPES[etype])
    storage = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32}[dt.itemsize]
    return jax.lax.bitcast_convert_type(jnp.asarray(bits).astype(storage), dt)
