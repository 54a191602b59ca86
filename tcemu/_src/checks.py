"""Argument checks shared by every layer: integers known at trace time, scalar integer
arguments, real numeric arrays. Each raises a TypeError naming the function and the argument.

    >>> from tcemu._src.checks import is_integer_value, concrete_int
    >>> is_integer_value(3), is_integer_value(True), concrete_int(7)
    (True, False, 7)
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


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


def is_integer_value(x) -> bool:
    """A Python/NumPy integer (not a bool)."""
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def scalar_int(x, name: str, where: str):
    """Check an integer scalar argument (``p``, ``stride``): a Python or NumPy integer, or a 0-d
    integer array, possibly traced. Returns an ``int`` when concrete, else the traced array."""
    if is_integer_value(x):
        return int(x)
    if isinstance(x, (jax.Array, np.ndarray, np.generic)):
        dt = np.dtype(x.dtype)
        if not np.issubdtype(dt, np.integer):
            got = f"{x!r}" if isinstance(x, np.generic) else "an array"
            raise TypeError(f"{where}: {name} must be an integer, got {got} of dtype {dt}")
        if np.ndim(x) != 0:
            raise TypeError(f"{where}: {name} must be a scalar integer, got shape {np.shape(x)} "
                            "(use jax.vmap for one value per warp)")
        v = concrete_int(x)
        return x if v is None else v
    raise TypeError(f"{where}: {name} must be an integer, got {x!r} ({type(x).__name__})")


def real_array(x, where: str, name: str):
    """``x`` as a JAX array of a real (bool, integer or floating-point) dtype; a TypeError naming
    ``where`` and ``name`` otherwise. 64-bit integers with ``jax_enable_x64`` off become float32
    (rounded once, by numpy) instead of wrapping through int32 as ``jnp.asarray`` would."""
    if not isinstance(x, jax.Array) and not jax.config.jax_enable_x64:
        try:
            a = np.asarray(x) if isinstance(x, (np.ndarray, np.generic, int, list, tuple)) else None
        except (TypeError, ValueError):  # ragged: jnp.asarray's error below
            a = None
        if a is not None and a.dtype.kind in "iu" and a.dtype.itemsize == 8:
            x = a.astype(np.float32)
    try:
        x = jnp.asarray(x)
    except (TypeError, ValueError) as e:
        raise TypeError(f"{where}: {name} must be a real numeric array, got {type(x).__name__}") from e
    if not (jnp.issubdtype(x.dtype, jnp.floating) or jnp.issubdtype(x.dtype, jnp.integer) or x.dtype == jnp.bool_):
        raise TypeError(f"{where}: {name} must be a real numeric array, got dtype {x.dtype}")
    return x


def check_key(key, where: str):
    """``key`` if it is one PRNG key (``jax.random.key(...)``, or a legacy uint32[2]
    ``jax.random.PRNGKey(...)``) or None; a TypeError/ValueError naming ``key`` otherwise."""
    if key is None:
        return None
    dtype = getattr(key, "dtype", None)
    use = "use key=jax.random.key(seed)"
    if dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        if jnp.shape(key) != ():
            raise ValueError(f"{where}: key must be one PRNG key, got an array of keys of shape {jnp.shape(key)}; {use}")
        return key
    if dtype == np.uint32:
        try:
            shape = jax.random.wrap_key_data(key).shape
        except (TypeError, ValueError):
            shape = None
        if shape != ():
            raise ValueError(f"{where}: key of dtype uint32 and shape {jnp.shape(key)} is not one legacy PRNG key; {use}")
        return key
    got = f"{type(key).__name__}" + (f" of dtype {dtype}" if dtype is not None else "")
    raise TypeError(f"{where}: key must be a PRNG key, got {got}; {use}")
