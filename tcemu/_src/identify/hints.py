"""What identify tries first: the kernel family a library runs at a shape, and what
:func:`tcemu.library_config` answers there from cuBLAS's records or a rule.

    >>> import numpy as np
    >>> from tcemu._src.identify.hints import hints
    >>> [c.schedule.slices for c in hints("torch.mm", "H100", (None, 160, 160), 12288, "bf16", "bf16", "bf16")]
    [5, 1]
"""
from __future__ import annotations

import numpy as np

from tcemu._src.gemm import GemmConfig
from tcemu._src.library import LIBRARIES, cublas_family


def prefer(library, K: int, N: int, at: str, bt: str):
    """The kernel family a library runs first, from the shape: cuBLAS (torch.mm, torch.bmm) on
    16-bit inputs :func:`~tcemu._src.library.cublas_family`. nvjet kernels are
    Hopper ``wgmma`` kernels: k16 numerics, never the k8 of CUTLASS 2's s1688 kernels. XLA
    (jnp.dot) splits K itself, into equal slices of 16 bytes, also around its cuBLAS calls. No
    preference for torch._scaled_mm."""
    if library is None:
        return None
    if not isinstance(library, str) or library not in LIBRARIES:
        err = ValueError if isinstance(library, str) else TypeError
        raise err(f"identify: library must be None or one of {', '.join(LIBRARIES)}, got {library!r}")
    if library in ("torch.mm", "torch.bmm") and at in ("f16", "bf16") and bt in ("f16", "bf16"):
        return cublas_family(K, N)
    return "xla" if library == "jnp.dot" else None


# the library_config calls identify tries for each library (its records and rules): the library
# under each flag setting, and torch.mm with split-K off (torch.matmul's preset, allow_splitk=False)
_HINT_CALLS = {"torch.mm": (("torch.mm", {"reduced_precision_reduction": True}),
                            ("torch.mm", {"reduced_precision_reduction": False}),
                            ("torch.matmul", {"allow_splitk": False})),
               "torch.bmm": (("torch.bmm", {"reduced_precision_reduction": True}),
                             ("torch.bmm", {"reduced_precision_reduction": False})),
               "torch._scaled_mm": (("torch._scaled_mm", {"use_fast_accum": False}),
                                    ("torch._scaled_mm", {"use_fast_accum": True})),
               "jnp.dot": (("jnp.dot", {"xla_autotune": False}),)}


def whole_shape(shape, a, b):
    """(batch or None, M, N) of the whole GEMM: ``shape`` ((M, N) or (batch, M, N), checked) or
    the operands'."""
    if shape is None:
        batch = int(np.prod(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]))) if max(a.ndim, b.ndim) > 2 else None
        return batch, a.shape[-2], b.shape[-1]
    if not isinstance(shape, tuple) or len(shape) not in (2, 3) or not all(
            isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v > 0 for v in shape):
        raise ValueError(f"identify: shape must be None or the whole GEMM's (M, N) or (batch, M, N), positive "
                         f"integers, got {shape!r}")
    *batch, M, N = (int(v) for v in shape)
    if M < a.shape[-2] or N < b.shape[-1]:
        raise ValueError(f"identify: shape={shape!r} is smaller than the operands' {a.shape[-2]} rows of a and "
                         f"{b.shape[-1]} columns of b")
    return (batch[0] if batch else None), M, N


def hints(library, arch, shape, K, at, bt, ot, hlo=None) -> list[GemmConfig]:
    """What ``library_config`` answers for this case from cuBLAS's records, a rule or (jnp.dot,
    ``hlo`` given) the compiled module (not a nearest-shape guess), under each of the library's
    flag settings (torch.mm: split-K off too): the configurations identify tries first. None where ``library_config`` has no
    answer (another GPU, type)."""
    from tcemu._src.library_layers import library_config

    if library is None:
        return []
    batch, M, N = shape
    calls = ((("jnp.dot", {"hlo": hlo}),) if hlo is not None and library == "jnp.dot" else ()) + _HINT_CALLS[library]
    out = []
    for lib, flags in calls:
        try:
            cfg, source = library_config(lib, arch=arch, M=M, N=N, K=K, a=at, b=bt, out=ot, batch=batch,
                                         with_source=True, **flags)
        except (ValueError, TypeError):
            continue
        if source in ("recorded", "rule", "compiled") and cfg not in out:
            out.append(cfg)
    return out
